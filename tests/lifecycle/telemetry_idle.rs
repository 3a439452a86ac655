//! The telemetry thread makes no wake-ups while no communicator is live (cores pinned for
//! training must see no jitter from an idle plugin), and resumes its ticks at the next `init`.
//! A process of its own: no other test's communicators may be live meanwhile.

use std::time::{Duration, Instant};

use nccl_profiler_otel::telemetry;

use crate::support::emulator::Plugin;
use crate::support::process;

/// Passes after `wait`, once the count stopped moving for a tick or two.
fn passes_after(wait: Duration) -> u64 {
    std::thread::sleep(wait);
    telemetry::passes()
}

#[test]
fn the_telemetry_thread_sleeps_while_no_communicator_is_live() {
    let _serial = crate::SERIAL.lock();
    if !process::own_process(
        module_path!(),
        "the_telemetry_thread_sleeps_while_no_communicator_is_live",
    ) {
        return;
    }
    // SAFETY: set before the first `init` reads the environment; no other thread runs yet.
    unsafe { std::env::set_var("NCCL_PROFILER_OTEL_EXPORTER", "none") };
    let plugin = Plugin::in_process();
    let (comm, _) = plugin.init(Some("idle"), 0x1D1E, 1, 2, 0);
    // Live: a pass every tick (10 ms).
    let live = passes_after(Duration::from_millis(50));
    let more = passes_after(Duration::from_millis(200));
    assert!(more >= live + 5, "{live} → {more} passes in 200 ms while live");
    plugin.finalize(comm.context);
    // The last finalize's flush is served, then the thread parks: no pass at all.
    let parked = passes_after(Duration::from_millis(50));
    let t0 = Instant::now();
    let later = passes_after(Duration::from_millis(500));
    assert_eq!(
        later,
        parked,
        "no wake-up in {:?} without a live communicator",
        t0.elapsed()
    );
    // The next `init` wakes it.
    let (again, _) = plugin.init(Some("idle"), 0x1D1F, 1, 2, 0);
    let resumed = passes_after(Duration::from_millis(200));
    assert!(resumed >= parked + 5, "{parked} → {resumed} passes after init");
    plugin.finalize(again.context);
}

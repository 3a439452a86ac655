//! The telemetry thread makes no wake-ups while no communicator is live (cores pinned for
//! training must see no jitter from an idle plugin), and resumes its ticks at the next `init`.
//! The shipped library, `dlopen`ed; its thread's wake-ups are what the kernel counts for it (its
//! context switches). A process of its own: no other test's communicators may be live meanwhile.

use std::time::{Duration, Instant};

use crate::support::emulator::Plugin;
use crate::support::process;

/// The telemetry thread's name as the kernel keeps it (15 bytes of `nccl-otel-telemetry`).
const THREAD: &str = "nccl-otel-telem";

/// Context switches so far of the plugin's telemetry thread: each wake-up from its sleep is one,
/// and a parked thread makes none.
fn switches() -> u64 {
    let tasks = std::fs::read_dir("/proc/self/task").expect("task");
    let task = tasks
        .filter_map(Result::ok)
        .find(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == THREAD))
        .expect("the telemetry thread runs");
    let status = std::fs::read_to_string(task.path().join("status")).expect("status");
    status
        .lines()
        .filter(|l| l.starts_with("voluntary_ctxt_switches:") || l.starts_with("nonvoluntary_ctxt_switches:"))
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<u64>().ok())
        .sum()
}

/// Switches after `wait`.
fn switches_after(wait: Duration) -> u64 {
    std::thread::sleep(wait);
    switches()
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
    let plugin = Plugin::load_shipped();
    let (comm, _) = plugin.init(Some("idle"), 0x1D1E, 1, 2, 0);
    // Live: a pass every tick (10 ms).
    let live = switches_after(Duration::from_millis(50));
    let more = switches_after(Duration::from_millis(200));
    assert!(more >= live + 5, "{live} → {more} wake-ups in 200 ms while live");
    plugin.finalize(comm.context);
    // The last finalize's flush is served, then the thread parks: no wake-up at all.
    let parked = switches_after(Duration::from_millis(50));
    let t0 = Instant::now();
    let later = switches_after(Duration::from_millis(500));
    assert_eq!(
        later,
        parked,
        "no wake-up in {:?} without a live communicator",
        t0.elapsed()
    );
    // The next `init` wakes it.
    let (again, _) = plugin.init(Some("idle"), 0x1D1F, 1, 2, 0);
    let resumed = switches_after(Duration::from_millis(200));
    assert!(resumed >= parked + 5, "{parked} → {resumed} wake-ups after init");
    plugin.finalize(again.context);
}

//! libFuzzer target: bytes → an NCCL callback stream through the real exported `ncclProfiler_v1`
//! … `_v7` table the first byte picks (decoder and checks in `../stream.rs`, shared with `tests/fuzz_callbacks.rs`).
//!
//! One thread and no telemetry thread, so a run is reproducible: the input's `Poll` ops drive the
//! consumer (close, seal, process, recycle windows) at chosen instants. Each input inits five
//! communicators, runs its ops, finalizes whatever is live and checks the exact account of every
//! callback; any panic aborts (libfuzzer-sys's panic hook), so a panic the plugin's guard would
//! have caught is a finding too. The number of callbacks executed is printed at exit.
#![no_main]

#[path = "../stream.rs"]
mod stream;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use libfuzzer_sys::fuzz_target;

static CALLBACKS: AtomicU64 = AtomicU64::new(0);
static INPUTS: AtomicU64 = AtomicU64::new(0);

extern "C" fn report() {
    eprintln!(
        "callbacks executed: {} in {} inputs",
        CALLBACKS.load(Relaxed),
        INPUTS.load(Relaxed)
    );
}

fn setup() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        // SAFETY: runs once, before the first `init` reads the environment; single-threaded.
        unsafe {
            std::env::set_var("NCCL_PROFILER_OTEL_TELEMETRY_ENABLE", "0");
            std::env::set_var("NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC", "0.05");
            std::env::set_var("NCCL_PROFILER_OTEL_WINDOW_CAPACITY", "1024");
            std::env::set_var("NCCL_PROFILER_OTEL_WINDOW_COUNT_TRIGGER", "64");
            // The streams' clock jumps by up to an hour: no hang WARN per jump.
            std::env::set_var("NCCL_PROFILER_OTEL_HANG_THRESHOLD_SEC", "86400");
        }
        // SAFETY: `report` is a plain `extern "C" fn()` that only reads atomics and writes stderr.
        unsafe { libc::atexit(report) };
    });
}

fuzz_target!(|data: &[u8]| {
    setup();
    let run = stream::Run::new(5, stream::Abi::pick(data.first().copied().unwrap_or(0)));
    run.prelude();
    run.execute(data);
    run.finish();
    let b = run.balance();
    CALLBACKS.fetch_add(run.callbacks(), Relaxed);
    INPUTS.fetch_add(1, Relaxed);
    assert_eq!(b.counters.panics, 0, "a callback panicked: {b:?}");
    assert_eq!(
        b.accounted, b.callbacks,
        "every callback has exactly one outcome: {b:#?}"
    );
});

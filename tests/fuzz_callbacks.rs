//! Property-test fuzzer: arbitrary callback streams through one of the real exported
//! `ncclProfiler_v1` … `_v7` tables (each case picks one), from two or three threads at once, while the telemetry thread closes, processes and
//! recycles windows every 10 ms.
//!
//! Each thread decodes its own random byte string into ops (`tests/fuzz/stream.rs`, shared with the
//! cargo-fuzz target): `init` / `finalize` of five communicators (two pairs share a hash), starts of
//! every event type and of unknown ones, states known and unknown, stops, with NULL, stale,
//! repeated, forged and foreign (other pid) handles and contexts, NULL state args, descriptors full
//! of garbage where NCCL leaves them uninitialised, and well-formed operations with irregularities.
//! Invariants: no crash or hang (a watchdog aborts after 60 s), every callback returns
//! `ncclSuccess`, `*eHandle` is always written, no panic is caught, and every callback is accounted
//! for exactly (recorded and delivered, declined, dropped or counted invalid; see `stream.rs`).
//!
//! Windows are small (1024 slots, count trigger 64, interval 10 ms) so full windows, late records
//! and the grace period are reached. Export is off (`NCCL_PROFILER_OTEL_EXPORTER=none`) unless
//! `FUZZ_EXPORT=file`: then every summary is recorded into the OpenTelemetry SDK and every 10 ms
//! interval is collected and serialised to OTLP-JSON into /dev/null, with the same invariants (a
//! panic on the telemetry or exporter thread counts in the `panics` every case asserts to be 0).
//! With the default, cumulative temporality every export carries every series seen so far (up to
//! the cardinality limit), so a case costs more the more came before: export mode runs 128 cases
//! by default (≈ 46 s on the 2-core CI machine; 384 take ≈ 285 s). Add
//! `OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=delta` for the delta path (128 cases ≈ 5 s).
//! `PROPTEST_CASES` overrides the number of cases (default 384, 128 with export);
//! `FUZZ_VERBOSE=1` prints each case's account.

#[path = "fuzz/stream.rs"]
mod stream;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use stream::{Abi, Balance, Run};

/// Tests in this binary read process-wide counters: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Configures the plugin through the environment, once, before any test reads the environment
/// (`setenv` races with every `getenv`). A parking_lot mutex rather than a `OnceLock`, so that
/// ThreadSanitizer sees the ordering.
fn setup() {
    static DONE: Mutex<bool> = Mutex::new(false);
    let mut done = DONE.lock();
    if !*done {
        // SAFETY: every test calls this first; no other thread reads the environment meanwhile.
        unsafe {
            std::env::set_var("NCCL_PROFILER_OTEL_TELEMETRY_ENABLE", "1");
            std::env::set_var("NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC", "0.01");
            std::env::set_var("NCCL_PROFILER_OTEL_WINDOW_CAPACITY", "1024");
            std::env::set_var("NCCL_PROFILER_OTEL_WINDOW_COUNT_TRIGGER", "64");
            // The streams' clock jumps by up to an hour: no hang WARN per jump.
            std::env::set_var("NCCL_PROFILER_OTEL_HANG_THRESHOLD_SEC", "86400");
            // Export off by default; FUZZ_EXPORT=file records and serialises every summary
            // (written to /dev/null).
            let export = std::env::var("FUZZ_EXPORT").unwrap_or_else(|_| "none".into());
            std::env::set_var("NCCL_PROFILER_OTEL_EXPORTER", export);
            std::env::set_var("NCCL_PROFILER_OTEL_EXPORT_FILE", "/dev/null");
        }
        stream::install_sink();
        *done = true;
    }
}

/// Aborts the process if `f` does not return within `limit` (a hang in a callback).
fn within<T>(limit: Duration, f: impl FnOnce() -> T) -> T {
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let watchdog = s.spawn(|| {
            let deadline = Instant::now() + limit;
            while !done.load(Ordering::Acquire) {
                if Instant::now() > deadline {
                    eprintln!("fuzz_callbacks: a run did not finish within {limit:?}: hang");
                    std::process::abort();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let out = f();
        done.store(true, Ordering::Release);
        let _ = watchdog.join();
        out
    })
}

/// Runs one byte string per thread concurrently, finalizes everything, returns the account.
fn run(threads: &[Vec<u8>]) -> (Balance, u64) {
    let _serial = SERIAL.lock();
    within(Duration::from_secs(60), || {
        // NCCL uses one table per process: each case picks one by its first byte.
        let run = Run::new(
            5,
            Abi::pick(threads.first().and_then(|t| t.first()).copied().unwrap_or(0)),
        );
        run.prelude();
        std::thread::scope(|s| {
            let workers: Vec<_> = threads
                .iter()
                .map(|bytes| {
                    let run = &run;
                    s.spawn(move || run.execute(bytes))
                })
                .collect();
            // Joined explicitly (pthread_join), not by the scope's end: ThreadSanitizer sees that.
            for w in workers {
                if let Err(panic) = w.join() {
                    std::panic::resume_unwind(panic);
                }
            }
        });
        run.finish();
        (run.settle(Duration::from_secs(10)), run.callbacks())
    })
}

fn check(b: &Balance) -> Result<(), TestCaseError> {
    prop_assert_eq!(
        b.counters.panics,
        0,
        "a callback panicked (caught by the guard): {:?}",
        b
    );
    prop_assert_eq!(
        b.accounted,
        b.callbacks,
        "every callback has exactly one outcome: {:#?}",
        b
    );
    Ok(())
}

/// `PROPTEST_CASES`, else 384, or 128 with export on (see the module docs for why).
fn cases() -> u32 {
    let exporting = std::env::var("FUZZ_EXPORT").is_ok_and(|e| e != "none");
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if exporting { 128 } else { 384 })
}

#[test]
fn arbitrary_callback_streams_keep_every_invariant() {
    setup(); // before proptest reads PROPTEST_* from the environment
    let config = ProptestConfig {
        cases: cases(),
        max_shrink_iters: 200,
        // The seeds of past failures, replayed first.
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/proptest-regressions/fuzz_callbacks.txt"
        )))),
        ..ProptestConfig::default()
    };
    let threads = prop::collection::vec(prop::collection::vec(any::<u8>(), 0..4096), 2..=3);
    let result = proptest::test_runner::TestRunner::new(config).run(&threads, |threads| {
        let (balance, _) = run(&threads);
        if std::env::var_os("FUZZ_VERBOSE").is_some() {
            eprintln!("{balance:?}");
        }
        check(&balance)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// A fixed, busy stream (mostly well-formed operations on all five communicators, with
/// finalize/init churn in the middle) so every run exercises full windows and slot reuse, whatever
/// the random cases draw.
#[test]
fn busy_stream_with_churn_balances() {
    setup();
    let script = |entry: u8, flags: u16| -> Vec<u8> {
        let f = flags.to_le_bytes();
        vec![255, entry, f[0], f[1], 3, 5, 2, 0x40, 0, 3, 1, 2, 3, 4]
    };
    let mut threads = vec![Vec::new(), Vec::new(), Vec::new()];
    for (t, bytes) in threads.iter_mut().enumerate() {
        for e in 0..5u8 {
            bytes.extend([0, e, 1, 0, 2, 4, 0]); // init every entry (no-op when live)
        }
        for i in 0..400u16 {
            let e = (i as u8).wrapping_add(t as u8) % 5;
            bytes.extend(script(e, i.wrapping_mul(0x9E37)));
            if i % 50 == 49 {
                bytes.extend([8, e << 4]); // finalize entry e (Live selector)...
                bytes.extend([0, e, 1, 0, 2, 4, 0]); // ...and init it again on a recycled slot
            }
            if i % 7 == 0 {
                bytes.extend([160, 1 | (i as u8) << 3]); // stop of a random pooled handle
            }
        }
    }
    let (balance, callbacks) = run(&threads);
    assert!(callbacks > 50_000, "{callbacks} callbacks");
    // Whether windows overflow depends on the producers outrunning the telemetry thread, which
    // a sanitizer's instrumentation of both does not guarantee; the account must balance anyway.
    if std::env::var_os("SANITIZER").is_none() {
        assert!(balance.drops > 0, "small windows overflow: {balance:?}");
    }
    check(&balance).unwrap();
}

//! A collector that refuses, closes, answers 500/503 or hangs never harms the job: every NCCL
//! callback stays fast, the last `finalize` returns within the export timeout plus a margin,
//! pending exports stay bounded (the oldest dropped and counted), failures are counted, logged at
//! most once per interval, and exported once the collector is healthy again. A forked child is
//! inert, and a process that exits without `finalize` flushes its last data at exit, within the
//! timeout even when the collector hangs.

mod emulator;
mod export_support;
mod otlp_receiver;

use std::process::Command;
use std::time::{Duration, Instant};

use emulator::{H, Plugin, ty};
use export_support as sx;
use nccl_profiler_otel::export;
use otlp_receiver::{Fault, Receiver, find, points};

const TIMEOUT_MS: u64 = 300;
const QUEUE: u64 = 2;
/// What a last `finalize` (or the exit flush) may take: the timeout, the flush margin, slack for
/// a loaded 2-core machine.
const FLUSH_BOUND: Duration = Duration::from_millis(TIMEOUT_MS + 250 + 400);
/// What any other callback may take (it never waits for export; this only absorbs preemption).
const CALLBACK_BOUND: Duration = Duration::from_millis(50);
/// Environment variable telling a re-executed test binary which child scenario to run.
const CHILD: &str = "EXPORT_FAULTS_CHILD";

fn env(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC", "0.2".into()),
        ("NCCL_PROFILER_OTEL_WINDOW_CAPACITY", "4096".into()),
        ("NCCL_PROFILER_OTEL_WINDOW_COUNT_TRIGGER", "2048".into()),
        ("NCCL_PROFILER_LINEAR_REGRESSION_MODE", "MIN".into()),
        ("NCCL_PROFILER_OTEL_TELEMETRY_BATCH_TIMEOUT_MS", TIMEOUT_MS.to_string()),
        ("NCCL_PROFILER_OTEL_EXPORT_QUEUE", QUEUE.to_string()),
        ("NCCL_PROFILER_OTEL_TELEMETRY_ENDPOINT", endpoint.into()),
    ]
}

/// Collectives with proxy ops and steps (no transfer time) for `secs`; returns the slowest
/// callback.
fn burst(p: &Plugin, c: &emulator::Comm, secs: f64) -> Duration {
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut slowest = Duration::ZERO;
    let mut timed = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        slowest = slowest.max(t.elapsed());
    };
    let mut seq = 0;
    while Instant::now() < end {
        let mut coll = H::NULL;
        timed(&mut || coll = p.coll(c, H::NULL, "AllReduce", "RING", "LL128", "ncclBfloat16", 4096, 1, seq));
        timed(&mut || p.stop(coll));
        let mut op = H::NULL;
        timed(&mut || op = p.proxy_op(c.context, coll, emulator::pid(), c.rank, 1, 0, 2, true));
        for s in 0..2 {
            let mut step = H::NULL;
            timed(&mut || step = p.proxy_step(c.context, op, c.rank, s));
            timed(&mut || p.state(step, ty::SEND_WAIT, 8192 << s));
            timed(&mut || p.stop(step));
        }
        timed(&mut || p.stop(op));
        seq += 1;
        if seq % 64 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    slowest
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    done()
}

/// Lines the plugin logged about export since `from`.
fn export_log_lines(from: usize) -> Vec<String> {
    emulator::logger::lines()
        .into_iter()
        .skip(from)
        .map(|l| l.text)
        .filter(|t| t.contains("metrics export to"))
        .collect()
}

#[test]
fn faulty_collector_never_harms_the_job() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let rx = Receiver::start();
    // SAFETY: the other tests of this binary only spawn processes and never read the environment
    // through the plugin; this is the first thing this test does.
    unsafe {
        for (k, v) in env(&rx.endpoint()) {
            std::env::set_var(k, v);
        }
    }
    let p = Plugin::in_process();
    // Keeps the logger set and makes the other communicators' finalize not the last one.
    let (keeper, _) = p.init(Some("keeper"), 0xEEEE_0001, 1, 2, 0);

    // Healthy.
    let (a, truth) = sx::workload(&p, 0xFA17_0001, "healthy");
    p.finalize(a.context);
    assert!(
        rx.wait_for(Duration::from_secs(3), |r| sx::complete(r, &truth)),
        "healthy export"
    );

    // Each fault: callbacks stay fast, failures are counted, at most one log line per interval.
    let (c, _) = p.init(Some("burst"), 0xB005_7001, 1, 4, 0);
    let log_from = emulator::logger::lines().len();
    let faults_start = Instant::now();
    for fault in [
        Fault::Refuse,
        Fault::Close,
        Fault::Status(500),
        Fault::Status(503),
        Fault::Hang,
    ] {
        rx.set_fault(fault);
        let before = export::stats().failures;
        let slowest = burst(&p, &c, 0.6);
        assert!(slowest < CALLBACK_BOUND, "{fault:?}: a callback took {slowest:?}");
        assert!(
            wait_until(Duration::from_secs(3), || export::stats().failures > before),
            "{fault:?}: no failure counted"
        );
    }
    let lines = export_log_lines(log_from);
    let intervals = faults_start.elapsed().as_secs_f64() / 0.2;
    assert!(!lines.is_empty(), "export failures were not logged");
    assert!(
        lines.len() as f64 <= intervals + 1.0,
        "{} lines in {intervals} intervals",
        lines.len()
    );
    assert!(
        emulator::logger::warnings()
            .iter()
            .any(|w| w.contains("metrics export to"))
    );

    // Still hanging: requests pile up, but the queue and memory stay bounded.
    let rss = rss_kib();
    let slowest = burst(&p, &c, 1.5);
    assert!(slowest < CALLBACK_BOUND, "hang: a callback took {slowest:?}");
    let stats = export::stats();
    assert!(stats.queued <= QUEUE, "{stats:?}");
    assert!(
        stats.dropped > 0,
        "a hung collector must make the queue drop: {stats:?}"
    );
    assert_eq!(stats.windows_dropped, 0);
    let grown = rss_kib().saturating_sub(rss);
    assert!(grown < 64 * 1024, "RSS grew by {grown} KiB while the collector hung");

    // The last finalize returns within its bound while the collector hangs.
    p.finalize(c.context);
    let t = Instant::now();
    p.finalize(keeper.context);
    let took = t.elapsed();
    assert!(took < FLUSH_BOUND, "last finalize with a hung collector took {took:?}");
    // While exports fail, a program that creates and destroys its only communicator in a loop
    // does not wait for the collector at all.
    let t = Instant::now();
    for i in 0..10 {
        let (c, _) = p.init(Some("loop"), 0x100B_0000 + i, 1, 2, 0);
        let coll = p.coll(&c, H::NULL, "Broadcast", "RING", "SIMPLE", "ncclInt8", 64, 1, 0);
        p.stop(coll);
        p.finalize(c.context);
    }
    assert!(t.elapsed() < FLUSH_BOUND, "10 last finalizes took {:?}", t.elapsed());

    // Healthy again: data flows, including the failure and drop counts.
    rx.set_fault(Fault::Healthy);
    let failures = export::stats().failures;
    let (b, truth_b) = sx::workload(&p, 0xFA17_0002, "recovered");
    p.finalize(b.context);
    assert!(
        rx.wait_for(Duration::from_secs(5), |r| sx::complete(r, &truth_b)),
        "no export after recovery"
    );
    let reqs = rx.requests();
    sx::check(&reqs, &truth_b);
    sx::check(&reqs, &truth);
    let exported = |name: &str| find(&reqs, name).map_or(0.0, |m| points(m)[0].value);
    assert!(exported("nccl.profiler.export.failures") >= failures as f64 - 1.0);
    assert!(exported("nccl.profiler.export.dropped") >= 1.0);

    // A forked child is inert: init declines, finalize and exit return at once.
    let (live, _) = p.init(Some("parent"), 0xF0_0001, 1, 2, 0);
    // SAFETY: the child only calls the plugin (which checks the pid first) and exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let (child, _) = p.init(Some("child"), 0xF0_0002, 1, 2, 0);
        p.finalize(live.context);
        let code = if child.context.is_null() { 0 } else { 3 };
        // SAFETY: ends the child; runs the atexit handlers, ours included.
        unsafe { libc::exit(code) };
    }
    let started = Instant::now();
    let mut status = 0;
    let exited = wait_until(Duration::from_secs(5), || {
        // SAFETY: `pid` is our child; WNOHANG never blocks.
        unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) == pid }
    });
    assert!(exited, "forked child did not exit");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status:#x}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    p.finalize(live.context);
}

/// Runs this binary again as `scenario`, with the export environment for `endpoint`; returns
/// its exit status and wall time.
fn run_child(scenario: &str, endpoint: &str) -> (std::process::ExitStatus, Duration) {
    let exe = std::env::current_exe().unwrap();
    let started = Instant::now();
    let status = Command::new(exe)
        .args([
            "--exact",
            "child_exits_without_finalize",
            "--ignored",
            "--test-threads=1",
        ])
        .env(CHILD, scenario)
        .envs(env(endpoint))
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    (status, started.elapsed())
}

#[test]
fn exit_without_finalize_flushes() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let rx = Receiver::start();
    let (status, took) = run_child("exit", &rx.endpoint());
    assert!(status.success(), "{status}");
    let truth = sx::Truth {
        hash: 0xE417_0001,
        name: "exiting",
        rank: 0,
    };
    assert!(
        rx.wait_for(Duration::from_secs(1), |r| sx::complete(r, &truth)),
        "data of a process that exited without finalize did not arrive"
    );
    sx::check(&rx.requests(), &truth);
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn exit_with_a_hung_collector_is_bounded() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let rx = Receiver::start();
    rx.set_fault(Fault::Hang);
    let (status, took) = run_child("exit", &rx.endpoint());
    assert!(status.success(), "{status}");
    // Process start and the workload (~30 ms) plus at most the flush bound; the receiver would
    // hang for a minute.
    assert!(took < Duration::from_secs(3) + FLUSH_BOUND, "exit took {took:?}");
    assert!(rx.attempts() >= 1, "the exit flush did not try");
}

/// The child side of the two exit tests: a workload, no finalize, return (the process exits).
#[test]
#[ignore = "run by the exit tests in a child process"]
fn child_exits_without_finalize() {
    if std::env::var(CHILD).as_deref() != Ok("exit") {
        return;
    }
    let p = Plugin::in_process();
    let _ = sx::workload(&p, 0xE417_0001, "exiting");
}

//! A collector that refuses, closes, answers 500/503 or hangs never harms the job: every NCCL
//! callback stays fast, the last `finalize` returns within the export timeout plus a margin,
//! pending exports stay bounded (the oldest dropped and counted), failures are counted, logged at
//! most once per interval, and exported once the collector is healthy again. A forked child is
//! inert, and a process that exits without `finalize` flushes its last data at exit, within the
//! timeout even when the collector hangs.
//!
//! Exit and fork run in child processes (this binary again, [`CHILD`] naming the scenario), each
//! watched by [`reap`]: a child still running after [`HANG`] is backtraced with gdb, killed, and
//! fails its test. Scenarios: `exit()` from a proxy thread in the middle of its stream while other
//! threads call into several communicators and create and finalize others; `exit()` while the
//! last `finalize` waits for a hung collector; `finalize` from an atexit handler that runs after
//! the plugin's exit flush; 40 forks while callbacks, windows and export are busy.

use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::support::emulator::{H, Plugin, ty};
use crate::support::export as sx;
use crate::support::otlp_receiver::{Fault, Receiver, find, points};
use crate::support::{emulator, otlp_receiver, process};
use nccl_profiler_otel::export;

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
    .into_iter()
    .chain(sx::DETAILED.map(|(k, v)| (k, v.to_owned())))
    .collect()
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
    let Some(_serial) = sx::own_process(module_path!(), "faulty_collector_never_harms_the_job") else {
        return;
    };
    let rx = Receiver::start();
    // SAFETY: this process runs this test alone; this is the first thing it does.
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
    // The HTTP client's cause, not only the exporter's "network error".
    assert!(lines.iter().any(|l| l.contains("Connection refused")), "{lines:?}");
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

    // Still hanging: requests pile up, but the queue and memory stay bounded. One export per
    // timeout (0.3 s) against one request per interval (0.2 s) fills the queue in about 1.2 s,
    // later when the telemetry thread's ticks slip on the busy cores: burst until it drops.
    let rss = emulator::rss() >> 10;
    let hang_start = Instant::now();
    while export::stats().dropped == 0 && hang_start.elapsed() < Duration::from_secs(6) {
        let slowest = burst(&p, &c, 0.5);
        assert!(slowest < CALLBACK_BOUND, "hang: a callback took {slowest:?}");
    }
    let stats = export::stats();
    assert!(stats.queued <= QUEUE, "{stats:?}");
    assert!(
        stats.dropped > 0,
        "a hung collector must make the queue drop: {stats:?}"
    );
    assert_eq!(stats.windows_dropped, 0);
    let grown = (emulator::rss() >> 10).saturating_sub(rss);
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
    let (status, took) = reap(pid, Duration::from_secs(10)).unwrap_or_else(|e| panic!("forked child: {e}"));
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "forked child {}",
        describe(status)
    );
    assert!(took < Duration::from_secs(2), "forked child took {took:?}");
    p.finalize(live.context);
}

// ---------------------------------------------------------------------------------------------
// Child processes: process exit and fork, each scenario in a fresh process (its own
// configuration, its own telemetry thread), bounded by a watchdog in the test.

/// Exit code of a child scenario that calls `exit()` itself (libtest's own are 0 and 101).
const EXITED: i32 = 42;
/// Exit code of a child whose NCCL-like thread panicked (an emulator check failed).
const PANICKED: i32 = 43;
/// Exit code of a child whose forked grandchild hung, crashed or took too long.
const FORK_FAILED: i32 = 44;
/// A child process still running after this is hung: it is backtraced with gdb, killed, and its
/// test fails.
const HANG: Duration = Duration::from_secs(60);
/// From an `exit()` call to the process being gone when one flush may wait for a hung collector:
/// the flush bound plus slack for a loaded 2-core machine.
const EXIT_BOUND: Duration = Duration::from_millis(TIMEOUT_MS + 250 + 400 + 2000);
/// Export timeout of the child scenarios with a healthy collector: a flush must not miss its
/// deadline only because a loaded 2-core machine ran the telemetry and exporter threads late.
const HEALTHY_TIMEOUT_MS: u64 = 5000;
/// [`EXIT_BOUND`] for that timeout.
const HEALTHY_EXIT_BOUND: Duration = Duration::from_millis(HEALTHY_TIMEOUT_MS + 250 + 400 + 2000);
/// Printed by a child just before it calls `exit()`, followed by the wall clock in ns.
const EXIT_MARK: &str = "exit() called at unix ns ";
/// Communicators of the child scenarios (the chaos threads' hashes are these plus 1..=8).
const BEFORE: u64 = 0xE417_1000;
const LAST_WORDS: u64 = 0xE417_2000;
const AFTER: u64 = 0xE417_3000;
const CHAOS: u64 = 0xE417_4000;
/// How long the NCCL-like threads run before the scenario's `exit()`.
const STREAM: Duration = Duration::from_millis(600);
/// When set, a file path: the exit-mid-stream child streams on until that file exists (its
/// parent creates it once the collector saw an export: the exporter is then inside one), at most
/// [`GO_WAIT`].
const GO_FILE: &str = "FAULTS_EXIT_AFTER";
const GO_WAIT: Duration = Duration::from_secs(20);
/// Forks of the fork scenario, and how long each forked grandchild may take: it makes a few
/// callbacks and exits (a lock held at fork time would make it wait forever).
const FORKS: u32 = 40;
const FORKED_BOUND: Duration = Duration::from_secs(2);

/// How a child process ended.
struct ChildRun {
    /// `waitpid` status.
    status: libc::c_int,
    /// From spawn to reaped.
    took: Duration,
    /// From the child's `exit()` call to reaped, when it printed [`EXIT_MARK`].
    exit_took: Option<Duration>,
    stderr: String,
}

impl ChildRun {
    fn assert_exited(&self, code: i32) {
        assert!(
            libc::WIFEXITED(self.status) && libc::WEXITSTATUS(self.status) == code,
            "child {} (want exit code {code}); its stderr:\n{}",
            describe(self.status),
            self.stderr
        );
    }

    fn exit_took(&self) -> Duration {
        self.exit_took
            .unwrap_or_else(|| panic!("the child did not report its exit() call:\n{}", self.stderr))
    }
}

fn describe(status: libc::c_int) -> String {
    if libc::WIFEXITED(status) {
        format!("exited with {}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        format!("was killed by signal {}", libc::WTERMSIG(status))
    } else {
        format!("ended with wait status {status:#x}")
    }
}

fn unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

/// Waits up to `limit` for our child `pid`; returns its wait status and how long it took, or
/// (after a gdb backtrace of every thread) kills it and returns the backtrace.
fn reap(pid: libc::pid_t, limit: Duration) -> Result<(libc::c_int, Duration), String> {
    let started = Instant::now();
    let mut status = 0;
    while started.elapsed() < limit {
        // SAFETY: `pid` is a child of this process; WNOHANG never blocks.
        match unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } {
            r if r == pid => return Ok((status, started.elapsed())),
            0 => std::thread::sleep(Duration::from_millis(5)),
            _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            _ => return Err(format!("waitpid({pid}): {}", std::io::Error::last_os_error())),
        }
    }
    let trace = Command::new("timeout")
        .args([
            "120",
            "gdb",
            "-p",
            &pid.to_string(),
            "-batch",
            "-nx",
            "-ex",
            "thread apply all bt 40",
        ])
        .stdin(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
        .unwrap_or_else(|e| format!("(no backtrace: {e})"));
    // SAFETY: `pid` is our child and has not been reaped, so the pid is still its own.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, &mut status, 0);
    }
    Err(format!(
        "pid {pid} still running after {limit:?}; its threads:\n{trace}"
    ))
}

/// Runs this binary again as child `scenario` with the export environment for `endpoint` (and
/// `extra` over it); fails the test if it hangs.
fn run_child(scenario: &str, endpoint: &str, extra: &[(&str, String)]) -> ChildRun {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let err_path = std::env::temp_dir().join(format!(
        "export_faults.{}.{scenario}.{}.stderr",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed)
    ));
    let err = std::fs::File::create(&err_path).unwrap();
    #[allow(clippy::zombie_processes)] // `reap` waits for it by pid (and kills it if it hangs)
    let child = process::child(module_path!(), "child_scenario", CHILD, scenario)
        .envs(env(endpoint))
        .envs(extra.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .unwrap();
    let reaped = reap(child.id() as libc::pid_t, HANG);
    let ended = unix_ns();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let _ = std::fs::remove_file(&err_path);
    let (status, took) = reaped.unwrap_or_else(|e| panic!("child {scenario}: {e}\nits stderr:\n{stderr}"));
    let exit_took = stderr
        .lines()
        .find_map(|l| l.strip_prefix(EXIT_MARK)?.trim().parse::<u128>().ok())
        .map(|at| Duration::from_nanos(ended.saturating_sub(at) as u64));
    eprintln!(
        "child {scenario}: {}, {took:?} in all, exit() to reaped {exit_took:?}",
        describe(status)
    );
    ChildRun {
        status,
        took,
        exit_took,
        stderr,
    }
}

#[test]
fn exit_without_finalize_flushes() {
    let Some(_serial) = sx::serial() else {
        return;
    };
    let rx = Receiver::start();
    let run = run_child("exit", &rx.endpoint(), &[]);
    run.assert_exited(0);
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
    assert!(run.took < Duration::from_secs(10), "{:?}", run.took);
}

#[test]
fn exit_with_a_hung_collector_is_bounded() {
    let Some(_serial) = sx::serial() else {
        return;
    };
    let rx = Receiver::start();
    rx.set_fault(Fault::Hang);
    let run = run_child("exit", &rx.endpoint(), &[]);
    run.assert_exited(0);
    // Process start and the workload (~30 ms) plus at most the flush bound; the receiver would
    // hang for a minute.
    assert!(
        run.took < Duration::from_secs(3) + FLUSH_BOUND,
        "exit took {:?}",
        run.took
    );
    assert!(rx.attempts() >= 1, "the exit flush did not try");
}

/// A hung collector costs one wait at shutdown in all: the last `finalize` waits (the collector
/// looked healthy), its request fails at the timeout, and the exit flush then does not wait again.
#[test]
fn finalize_then_exit_with_a_hung_collector_waits_once() {
    let Some(_serial) = sx::serial() else {
        return;
    };
    let rx = Receiver::start();
    rx.set_fault(Fault::Hang);
    let timeout: u64 = 3000;
    let extra = [("NCCL_PROFILER_OTEL_TELEMETRY_BATCH_TIMEOUT_MS", timeout.to_string())];
    let run = run_child("finalize-then-exit", &rx.endpoint(), &extra);
    run.assert_exited(0);
    // One wait of at most the timeout and the flush margin, plus slack; two would be 6.5 s.
    let once = Duration::from_millis(timeout + 250 + 400 + 2000);
    assert!(run.exit_took() < once, "shutdown took {:?}", run.exit_took());
}

/// A generous timeout (see [`HEALTHY_TIMEOUT_MS`]) and queue: a flush's request is not dropped
/// for newer interval requests while a loaded machine runs the exporter late (see
/// `exit_flush_waits_for_a_slow_but_healthy_collector`).
fn healthy_env() -> Vec<(&'static str, String)> {
    vec![
        (
            "NCCL_PROFILER_OTEL_TELEMETRY_BATCH_TIMEOUT_MS",
            HEALTHY_TIMEOUT_MS.to_string(),
        ),
        ("NCCL_PROFILER_OTEL_EXPORT_QUEUE", "64".to_string()),
    ]
}

/// Asserts that everything the scripted workload on `t` recorded arrived, exactly: counts and
/// bytes, not the transfer times (the chaos threads and a loaded machine stretch those).
fn assert_arrived(reqs: &[otlp_receiver::ExportMetricsServiceRequest], t: &sx::Truth) {
    assert!(
        sx::complete(reqs, t),
        "{}: link bytes, sends or the AllGather missing",
        t.name
    );
    let recorded = sx::total(reqs, "nccl.profiler.events.recorded", &t.comm()).0;
    assert_eq!(recorded, sx::records() as f64, "{}: records", t.name);
    assert_eq!(
        sx::total(reqs, "nccl.coll.bytes", &t.allreduce()).1,
        sx::COLLS,
        "{}",
        t.name
    );
    let unfinished = sx::total(reqs, "nccl.profiler.events.unfinished", &t.comm()).0;
    assert_eq!(unfinished, 0.0, "{}: unfinished", t.name);
}

/// Asserts what the last-words thread recorded just before its `exit()` (one AllReduce; its proxy
/// op and step never stopped) arrived: only the exit flush can have exported it.
fn assert_last_words(reqs: &[otlp_receiver::ExportMetricsServiceRequest]) {
    let last = sx::Truth {
        hash: LAST_WORDS,
        name: "last-words",
        rank: 0,
    };
    assert_eq!(
        sx::total(reqs, "nccl.coll.bytes", &last.allreduce()),
        (4096.0, 1),
        "the collective recorded just before exit()"
    );
    let unfinished = sx::total(reqs, "nccl.profiler.events.unfinished", &last.comm()).0;
    assert!(unfinished >= 1.0, "the open proxy op and step: {unfinished} unfinished");
}

#[test]
fn exit_from_a_callback_thread_flushes() {
    let Some(_serial) = sx::serial() else {
        return;
    };
    let rx = Receiver::start();
    let run = run_child("exit-mid-stream", &rx.endpoint(), &healthy_env());
    run.assert_exited(EXITED);
    let exit_took = run.exit_took();
    assert!(exit_took < HEALTHY_EXIT_BOUND, "exit() took {exit_took:?}");
    let before = sx::Truth {
        hash: BEFORE,
        name: "before-exit",
        rank: 0,
    };
    assert!(
        rx.wait_for(Duration::from_secs(5), |r| sx::complete(r, &before)),
        "data recorded before exit() did not arrive"
    );
    let reqs = rx.requests();
    assert_arrived(&reqs, &before);
    assert_last_words(&reqs);
}

#[test]
fn exit_from_a_callback_thread_with_a_hung_collector_is_bounded() {
    let Some(_serial) = sx::serial() else {
        return;
    };
    let rx = Receiver::start();
    rx.set_fault(Fault::Hang);
    // exit() comes once the exporter is blocked in an interval export (on a loaded machine the
    // first one may start after the child's usual stream).
    let go = std::env::temp_dir().join(format!("export_faults.{}.go", std::process::id()));
    let _ = std::fs::remove_file(&go);
    let ran = AtomicBool::new(false);
    let run = std::thread::scope(|s| {
        s.spawn(|| {
            while rx.attempts() == 0 && !ran.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(5));
            }
            std::fs::write(&go, b"").unwrap();
        });
        let go_env = [(GO_FILE, go.display().to_string())];
        let run = run_child("exit-mid-stream", &rx.endpoint(), &go_env);
        ran.store(true, Ordering::Relaxed);
        run
    });
    let _ = std::fs::remove_file(&go);
    run.assert_exited(EXITED);
    let exit_took = run.exit_took();
    assert!(
        exit_took < EXIT_BOUND,
        "exit() with a hung collector took {exit_took:?}"
    );
    assert!(rx.attempts() >= 1, "{} export attempts", rx.attempts());
}

#[test]
fn exit_while_the_last_finalize_waits_for_a_hung_collector_is_bounded() {
    let Some(_serial) = sx::serial() else {
        return;
    };
    let rx = Receiver::start();
    rx.set_fault(Fault::Hang);
    // No interval export before the last finalize: the collector still counts as healthy, so
    // that finalize waits for its export.
    let long_interval = [("NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC", "30".to_string())];
    let run = run_child("exit-during-last-finalize", &rx.endpoint(), &long_interval);
    run.assert_exited(EXITED);
    let exit_took = run.exit_took();
    assert!(exit_took < EXIT_BOUND, "exit() took {exit_took:?}");
    assert!(rx.attempts() >= 1, "the last finalize did not export");
}

#[test]
fn finalize_from_a_later_atexit_handler_works_after_the_exit_flush() {
    let Some(_serial) = sx::serial() else {
        return;
    };
    let rx = Receiver::start();
    let run = run_child("exit-then-late-finalize", &rx.endpoint(), &healthy_env());
    run.assert_exited(EXITED);
    let exit_took = run.exit_took();
    assert!(exit_took < 2 * HEALTHY_EXIT_BOUND, "exit() took {exit_took:?}");
    let before = sx::Truth {
        hash: BEFORE,
        name: "before-exit",
        rank: 0,
    };
    let after = sx::Truth {
        hash: AFTER,
        name: "after-exit-flush",
        rank: 0,
    };
    assert!(
        rx.wait_for(Duration::from_secs(5), |r| sx::complete(r, &before)
            && sx::complete(r, &after)),
        "data recorded before exit() or in the later atexit handler did not arrive"
    );
    let reqs = rx.requests();
    assert_arrived(&reqs, &before);
    assert_arrived(&reqs, &after);

    // The same with a hung collector: the exit flush and the late last finalize each wait at
    // most one flush bound.
    let rx = Receiver::start();
    rx.set_fault(Fault::Hang);
    let run = run_child("exit-then-late-finalize", &rx.endpoint(), &[]);
    run.assert_exited(EXITED);
    let exit_took = run.exit_took();
    assert!(
        exit_took < EXIT_BOUND + FLUSH_BOUND,
        "exit() with a hung collector took {exit_took:?}"
    );
}

/// Windows closing every 256 records and an export every 50 ms: the telemetry and exporter
/// threads are busy at every fork.
fn fork_env(timeout_ms: u64) -> Vec<(&'static str, String)> {
    vec![
        ("NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC", "0.05".into()),
        ("NCCL_PROFILER_OTEL_WINDOW_COUNT_TRIGGER", "256".into()),
        ("NCCL_PROFILER_OTEL_EXPORT_QUEUE", "64".into()),
        ("NCCL_PROFILER_OTEL_TELEMETRY_BATCH_TIMEOUT_MS", timeout_ms.to_string()),
    ]
}

#[test]
fn fork_while_callbacks_and_export_run_leaves_the_child_inert() {
    let Some(_serial) = sx::serial() else {
        return;
    };
    let rx = Receiver::start();
    let run = run_child("fork-busy", &rx.endpoint(), &fork_env(HEALTHY_TIMEOUT_MS));
    run.assert_exited(0);
    assert!(
        run.stderr.contains(&format!("{FORKS} forked children inert")),
        "{}",
        run.stderr
    );
    // The parent went on: what it recorded after the forks was exported by its last finalize.
    let after = sx::Truth {
        hash: AFTER,
        name: "after-forks",
        rank: 0,
    };
    assert!(
        rx.wait_for(Duration::from_secs(5), |r| sx::complete(r, &after)),
        "the parent's data after the forks did not arrive"
    );
    assert_arrived(&rx.requests(), &after);
}

#[test]
fn fork_while_the_exporter_hangs_leaves_the_child_inert() {
    let Some(_serial) = sx::serial() else {
        return;
    };
    let rx = Receiver::start();
    rx.set_fault(Fault::Hang);
    let run = run_child("fork-busy", &rx.endpoint(), &fork_env(TIMEOUT_MS));
    run.assert_exited(0);
    assert!(
        run.stderr.contains(&format!("{FORKS} forked children inert")),
        "{}",
        run.stderr
    );
    assert!(rx.attempts() >= 1);
}

/// The child side of every test above that spawns one: runs the scenario named by [`CHILD`].
#[test]
#[ignore = "run by the other tests in a child process"]
fn child_scenario() {
    let Ok(scenario) = std::env::var(CHILD) else {
        return;
    };
    match scenario.as_str() {
        // A workload, no finalize, return (the process exits).
        "exit" => {
            let p = Plugin::in_process();
            let _ = sx::workload(&p, 0xE417_0001, "exiting");
        }
        "exit-mid-stream" => child_exit_mid_stream(),
        "exit-during-last-finalize" => child_exit_during_last_finalize(),
        "exit-then-late-finalize" => child_exit_then_late_finalize(),
        // A workload, the last finalize (marked as the start of shutdown), return.
        "finalize-then-exit" => {
            let p = Plugin::in_process();
            let (c, _) = sx::workload(&p, 0xE417_0002, "leaving");
            eprintln!("{EXIT_MARK}{}", unix_ns());
            p.finalize(c.context);
        }
        "fork-busy" => child_fork_busy(),
        other => panic!("unknown child scenario {other}"),
    }
}

/// Tells the NCCL-like threads of a child to return.
static STOP: AtomicBool = AtomicBool::new(false);
/// A ProxyOp handle the proxy thread has started and not stopped yet (0 between ops).
static IN_FLIGHT: AtomicU64 = AtomicU64::new(0);

/// The built library, loaded like NCCL loads it, for the rest of the process.
fn built() -> &'static Plugin {
    Box::leak(Box::new(Plugin::load_built().unwrap()))
}

/// Ends the process with `exit(code)` from this thread, whatever the others are doing.
fn exit_now(code: i32) -> ! {
    eprintln!("{EXIT_MARK}{}", unix_ns());
    // SAFETY: `exit` may be called from any thread; it runs this thread's TLS destructors and
    // the atexit handlers (the plugin's exit flush among them) while the other threads go on.
    unsafe { libc::exit(code) }
}

/// Spawns an NCCL-like thread; a panic in it (a failed emulator check) ends the process with
/// [`PANICKED`], so it cannot go unnoticed behind an `exit()`.
fn nccl_thread(name: &str, body: impl FnOnce() + Send + 'static) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).is_err() {
                // SAFETY: ends the process at once, without atexit handlers.
                unsafe { libc::_exit(PANICKED) };
            }
        })
        .unwrap()
}

fn chaos_comms(p: &Plugin, n: u64) -> Vec<emulator::Comm> {
    (1..=n)
        .map(|i| p.init(Some("chaos"), CHAOS + i, 1, sx::NRANKS, 0).0)
        .collect()
}

/// One collective as NCCL's user thread makes it: Group, Coll, Group stop, Coll stop.
fn app_iteration(p: &Plugin, c: &emulator::Comm, seq: u64) {
    let group = p.group(c);
    let coll = p.coll(c, group, "AllReduce", "RING", "LL128", "ncclBfloat16", 4096, 2, seq);
    p.stop(group);
    p.stop(coll);
    let send = p.p2p(c, H::NULL, "Send", "ncclInt8", 512, 1);
    p.stop(send);
}

/// One collective's proxy work: Coll, ProxyOp (published in [`IN_FLIGHT`] while open), InProgress,
/// two send steps with their states.
fn proxy_iteration(p: &Plugin, c: &emulator::Comm, seq: u64) {
    let coll = p.coll(c, H::NULL, "AllReduce", "RING", "SIMPLE", "ncclFloat32", 1024, 1, seq);
    p.stop(coll);
    let op = p.proxy_op(c.context, coll, emulator::pid(), c.rank, 1, (seq % 2) as u8, 2, true);
    IN_FLIGHT.store(op.0 as u64, Ordering::Relaxed);
    p.state(op, ty::OP_IN_PROGRESS, 0);
    for s in 0..2 {
        let step = p.proxy_step(c.context, op, c.rank, s);
        p.state(step, ty::SEND_GPU_WAIT, 0);
        p.state(step, ty::SEND_WAIT, 8192 << s);
        p.stop(step);
    }
    IN_FLIGHT.store(0, Ordering::Relaxed);
    p.stop(op);
}

/// Runs `iteration` over `comms` until `until` or [`STOP`], pausing 1 ms every 16 rounds so that
/// a 2-core machine keeps time for the telemetry and exporter threads.
fn stream(p: &Plugin, comms: &[emulator::Comm], until: Option<Instant>, iteration: fn(&Plugin, &emulator::Comm, u64)) {
    let mut seq = 0;
    while !STOP.load(Ordering::Relaxed) && until.is_none_or(|u| Instant::now() < u) {
        for c in comms {
            iteration(p, c, seq);
        }
        seq += 1;
        if seq % 16 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Communicators created, used and destroyed in a loop (four hashes, so the exported series stay
/// few), as a job that builds sub-communicators does.
fn churn(p: &Plugin) {
    let mut i = 0u64;
    while !STOP.load(Ordering::Relaxed) {
        let (c, _) = p.init(Some("churn"), CHAOS + 8 - i % 4, 1, sx::NRANKS, 0);
        for seq in 0..8 {
            app_iteration(p, &c, seq);
            proxy_iteration(p, &c, seq);
        }
        p.finalize(c.context);
        i += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Spawns an application thread and a proxy thread over `comms`, and with `churn` a thread that
/// creates and finalizes communicators of its own.
fn chaos(p: &'static Plugin, comms: &[emulator::Comm], with_churn: bool) -> Vec<std::thread::JoinHandle<()>> {
    let (a, b) = (comms.to_vec(), comms.to_vec());
    let mut threads = vec![
        nccl_thread("app", move || stream(p, &a, None, app_iteration)),
        nccl_thread("proxy", move || stream(p, &b, None, proxy_iteration)),
    ];
    if with_churn {
        threads.push(nccl_thread("churn", move || churn(p)));
    }
    threads
}

/// A proxy thread in the middle of its stream calls `exit()`, right after a ProxyStep's SendWait
/// whose stop never comes, while an application thread and a proxy thread keep calling into three
/// communicators and a third thread creates and finalizes communicators.
fn child_exit_mid_stream() {
    let p = built();
    let _ = sx::workload(p, BEFORE, "before-exit");
    let comms = chaos_comms(p, 3);
    let threads = chaos(p, &comms, true);
    let exiter = nccl_thread("proxy-exit", move || {
        stream(p, &comms, Some(Instant::now() + STREAM), proxy_iteration);
        if let Some(go) = std::env::var_os(GO_FILE) {
            let until = Instant::now() + GO_WAIT;
            let go = std::path::Path::new(&go);
            while !go.exists() && Instant::now() < until {
                stream(
                    p,
                    &comms,
                    Some(Instant::now() + Duration::from_millis(20)),
                    proxy_iteration,
                );
            }
        }
        // Last words on a fresh communicator (its window is too young for an interval export):
        // a collective, then its proxy op and a step left open.
        let (c, _) = p.init(Some("last-words"), LAST_WORDS, 1, sx::NRANKS, 0);
        let coll = p.coll(&c, H::NULL, "AllReduce", "RING", "SIMPLE", "ncclFloat32", 1024, 1, 0);
        p.stop(coll);
        let op = p.proxy_op(c.context, coll, emulator::pid(), 0, 1, 0, 2, true);
        let step = p.proxy_step(c.context, op, 0, 0);
        p.state(step, ty::SEND_WAIT, 1 << 20);
        exit_now(EXITED)
    });
    let _ = exiter.join();
    threads.into_iter().for_each(|t| drop(t.join()));
}

/// A thread finalizes every communicator, the last one waiting for its export to a hung
/// collector; 50 ms into that wait the application's main thread calls `exit()`, while the
/// application and proxy threads keep calling into the finalized communicators.
fn child_exit_during_last_finalize() {
    static LAST_FINALIZE: AtomicBool = AtomicBool::new(false);
    let p = built();
    let (before, _) = sx::workload(p, BEFORE, "before-exit");
    let comms = chaos_comms(p, 2);
    let _threads = chaos(p, &comms, false);
    std::thread::sleep(Duration::from_millis(200));
    let _finalizer = nccl_thread("finalize", move || {
        let before = before; // the whole `Comm` (it is `Send`), not its raw context field
        comms.iter().for_each(|c| p.finalize(c.context));
        LAST_FINALIZE.store(true, Ordering::Relaxed);
        p.finalize(before.context);
    });
    while !LAST_FINALIZE.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(50));
    exit_now(EXITED)
}

/// What [`late_finalize`] finalizes.
static LATE: OnceLock<(&'static Plugin, Vec<emulator::Comm>)> = OnceLock::new();

/// An atexit handler registered before the plugin's, so it runs after the plugin's exit flush,
/// as a framework that destroys its communicators at interpreter shutdown: finalizes every
/// communicator while the NCCL-like threads still call into them, then creates one more, records
/// a workload and finalizes it (the last `finalize`, which flushes).
extern "C" fn late_finalize() {
    let body = || {
        let (p, comms) = LATE.get().expect("set before exit()");
        comms.iter().for_each(|c| p.finalize(c.context));
        let (after, _) = sx::workload(p, AFTER, "after-exit-flush");
        p.finalize(after.context);
    };
    if std::panic::catch_unwind(body).is_err() {
        // SAFETY: ends the process at once (we are inside exit() already).
        unsafe { libc::_exit(PANICKED) };
    }
}

fn child_exit_then_late_finalize() {
    // SAFETY: `late_finalize` is an `extern "C" fn()` that never unwinds; registered before the
    // first `init` registers the plugin's exit flush, it runs after it.
    assert_eq!(unsafe { libc::atexit(late_finalize) }, 0);
    let p = built();
    let (before, _) = sx::workload(p, BEFORE, "before-exit");
    let comms = chaos_comms(p, 2);
    let _threads = chaos(p, &comms, false);
    let mut all = comms.clone();
    all.push(before);
    assert!(LATE.set((p, all)).is_ok());
    std::thread::sleep(STREAM);
    exit_now(EXITED)
}

/// Forks [`FORKS`] times while an application, a proxy and a churn thread call into the plugin
/// and the telemetry thread closes windows and exports every 50 ms; each forked child must find
/// the plugin inert and exit within [`FORKED_BOUND`]. Then the parent records a workload and
/// finalizes everything (its last `finalize` flushes).
fn child_fork_busy() {
    let p = built();
    let comms = chaos_comms(p, 3);
    let threads = chaos(p, &comms, true);
    // A forked child must not call `cstr` (its mutex may be held at fork time): intern first.
    let strings = ["AllReduce", "RING", "SIMPLE", "ncclFloat32"].map(emulator::cstr);
    std::thread::sleep(Duration::from_millis(100));
    for i in 0..FORKS {
        // SAFETY: the forked child runs only `forked_child` (plugin calls, which must be inert
        // there, with descriptors built from strings interned above) and leaves with exit().
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            forked_child(p, &comms, strings);
        }
        assert!(pid > 0, "fork: {}", std::io::Error::last_os_error());
        let failure = match reap(pid, FORKED_BOUND + Duration::from_secs(10)) {
            Ok((status, _)) if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) => {
                Some(format!("forked child {i} {}", describe(status)))
            }
            Ok((_, took)) if took > FORKED_BOUND => Some(format!("forked child {i} took {took:?}")),
            Ok(_) => None,
            Err(e) => Some(format!("forked child {i}: {e}")),
        };
        if let Some(failure) = failure {
            eprintln!("{failure}");
            // SAFETY: ends this process at once with the failure code.
            unsafe { libc::_exit(FORK_FAILED) };
        }
        std::thread::sleep(Duration::from_millis(5 + u64::from(i * 7 % 25)));
    }
    eprintln!("{FORKS} forked children inert");
    let (after, _) = sx::workload(p, AFTER, "after-forks");
    STOP.store(true, Ordering::Relaxed);
    threads.into_iter().for_each(|t| t.join().unwrap());
    comms.iter().for_each(|c| p.finalize(c.context));
    p.finalize(after.context);
}

/// The forked child: `init` must decline (NULL context); callbacks on the parent's communicators
/// and on the op the parent had in flight, `finalize` and `exit()` must return at once.
fn forked_child(p: &Plugin, comms: &[emulator::Comm], s: [*const std::ffi::c_char; 4]) -> ! {
    let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let (c, _) = p.init(Some("forked"), 0xF0_0003, 1, 2, 0);
        if !c.context.is_null() {
            return 3;
        }
        let op = H(IN_FLIGHT.load(Ordering::Relaxed) as *mut std::ffi::c_void);
        p.state(op, ty::OP_IN_PROGRESS, 0);
        let step = p.proxy_step(comms[0].context, op, 0, 7);
        p.state(step, ty::SEND_WAIT, 4096);
        p.stop(step);
        p.stop(op);
        for c in comms {
            let mut d = emulator::plugin::coll_descr(c.rank, H::NULL, s[0], s[1], s[2], s[3], 1024, 1, 0);
            let coll = p.start(c.context, &mut d);
            p.stop(coll);
            p.finalize(c.context);
        }
        0
    }))
    .unwrap_or(4);
    // SAFETY: ends the forked child; runs its atexit handlers, the plugin's (inert) among them.
    unsafe { libc::exit(code) }
}

/// A TCP proxy to `upstream` that holds every answer for `delay`: a slow but healthy collector.
/// Returns its endpoint.
fn slow_proxy(upstream: &str, delay: Duration) -> String {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    let upstream = upstream.trim_start_matches("http://").to_owned();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(&upstream) else {
                continue;
            };
            let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || std::io::copy(&mut c_in, &mut s_out));
            let (mut s_in, mut c_out) = (server, client);
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 16];
                while let Ok(n @ 1..) = s_in.read(&mut buf) {
                    std::thread::sleep(delay);
                    if c_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    endpoint
}

/// A collector slower than `queue × interval`: the telemetry thread goes on queuing interval
/// requests while the exit flush waits, so the flush's own request is dropped from the full queue.
/// The flush must then wait for a later request (which carries the same cumulative data) instead
/// of returning as if the dropped one had been exported.
#[test]
fn exit_flush_waits_for_a_slow_but_healthy_collector() {
    let Some(_serial) = sx::serial() else {
        return;
    };
    let rx = Receiver::start();
    // Every answer 400 ms late, within the 1 s timeout: slow, never failing.
    let slow = slow_proxy(&rx.endpoint(), Duration::from_millis(400));
    let extra = [
        ("NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC", "0.05".to_string()),
        ("NCCL_PROFILER_OTEL_EXPORT_QUEUE", "1".to_string()),
        ("NCCL_PROFILER_OTEL_TELEMETRY_BATCH_TIMEOUT_MS", "1000".to_string()),
    ];
    let run = run_child("exit-mid-stream", &slow, &extra);
    run.assert_exited(EXITED);
    assert!(
        run.exit_took() < EXIT_BOUND + Duration::from_secs(1),
        "{:?}",
        run.exit_took()
    );
    assert!(
        rx.wait_for(Duration::from_secs(3), |r| sx::complete(
            r,
            &sx::Truth {
                hash: BEFORE,
                name: "before-exit",
                rank: 0
            }
        )),
        "data recorded before exit() did not arrive"
    );
    assert_last_words(&rx.requests());
}

//! The drop-free ceiling: the highest callback rate one process can sustain without losing a
//! record, with export on (OTLP-JSON lines to `/dev/null`, the file exporter) and, as the
//! baseline of the same run, with `NCCL_PROFILER_OTEL_EXPORTER=none`.
//!
//! Two communicators, each driven by one thread, issue 1 MiB ring AllReduces on 16 ranks over
//! 2 nodes as NCCL's callbacks make them: per collective a Coll start and stop and, on each of
//! 8 channels, a send ProxyOp with 8 steps (start, SendGPUWait, SendWait, stop) and a receive
//! ProxyOp (start, InProgress, stop) with 8 steps (start and stop, declined): 426 callbacks,
//! 234 of them recorded. Each thread paces itself to half the target rate, sleeping when ahead.
//! The rate climbs a ladder, one second per rung, until records are dropped (`full`, `late`,
//! `unpublished`, or window summaries dropped) or the threads cannot reach the rate; the ceiling
//! is the last rung without a drop. Every configuration variable is the default but the
//! exporter. Each exporter runs in a child process (the configuration is read once per process).
//! Each rung also reports the process's resident memory after it, above what it was with the
//! communicators idle, per communicator: what a sustained burst keeps resident (windows, the
//! tables of open operations, the export pipeline's share).
//!
//! Then overload (a third child, file exporter): the consumer throttled to [`THROTTLE_NS`] per
//! record (`consumer::set_throttle`), the in-flight driver of `tests/overload` (4 communicators, one
//! thread each, collectives with 4 in flight per communicator); the ceiling in collectives/s is
//! the throttled consumer's records/s over the records a collective leaves at level 0, and 1×,
//! 3× and 10× it run for
//! [`LOAD`] each: the share of operations timed, the weighted timed mean's error against the
//! driver's mean over all operations, the shed levels seen, the peak resident memory per
//! communicator and the telemetry thread's CPU seconds per 1,000 collectives, with each figure's
//! ratio to the 1× row.

#[path = "../tests/support"]
mod support {
    pub mod emulator;
}
// The bench asserts nothing: the flag of what is asserted is not read.
#[allow(dead_code)]
#[path = "../tests/overload/drive.rs"]
mod drive;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nccl_profiler_otel::comm;
use nccl_profiler_otel::telemetry::{self, consumer};
use support::emulator::{self, Comm, H, Plugin, pid, ty};

/// Rungs of the ladder, million callbacks per second.
const LADDER: [f64; 13] = [1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0, 20.0, 24.0, 28.0, 32.0];
/// Time per rung, and the pause after it for the telemetry thread to catch up.
const RUNG: Duration = Duration::from_secs(1);
const PAUSE: Duration = Duration::from_millis(400);
/// Communicators, one driving thread each.
const COMMS: usize = 2;
const CHANNELS: u8 = 8;
const STEPS: i32 = 8;
/// Callbacks per collective (see the module docs).
const PER_COLL: u64 = 2 + CHANNELS as u64 * (2 + 3 + STEPS as u64 * (4 + 2));

/// The overload part's consumer throttle, nanoseconds per record.
const THROTTLE_NS: u64 = 2_000;
/// Time per load, and the communicators (one thread each).
const LOAD: Duration = Duration::from_secs(2);
const OVERLOAD_COMMS: usize = 4;

fn main() {
    if std::env::var_os("BURST_OVERLOAD").is_some() {
        overload();
        return;
    }
    if let Ok(exporter) = std::env::var("BURST_EXPORTER") {
        child(&exporter);
        return;
    }
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo bench -- --list`: nothing criterion-style to list
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "burst: load average before: {}",
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    let mut ceilings = Vec::new();
    for exporter in ["none", "file"] {
        let out = Command::new(std::env::current_exe().expect("current exe"))
            .env("BURST_EXPORTER", exporter)
            .output()
            .expect("run the child");
        let text = String::from_utf8_lossy(&out.stdout);
        print!("{text}");
        assert!(
            out.status.success(),
            "child failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ceiling: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("ceiling "))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .expect("a ceiling line");
        ceilings.push(ceiling);
    }
    println!(
        "burst: drop-free ceiling {:.0} M callbacks/s with export on, {:.0} M/s without export ({:.2} of it)",
        ceilings[1],
        ceilings[0],
        ceilings[1] / ceilings[0]
    );
    let out = Command::new(std::env::current_exe().expect("current exe"))
        .env("BURST_OVERLOAD", "1")
        .output()
        .expect("run the overload child");
    print!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success(),
        "overload child failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One load's figures.
#[derive(Clone, Copy, Debug, Default)]
struct Row {
    colls: u64,
    /// Operations counted (recorded or not).
    counted: u64,
    timed: f64,
    error: f64,
    levels: (u8, u8),
    resident: f64,
    cpu: f64,
}

/// The overload part, in this (child) process.
fn overload() {
    // SAFETY: before any other thread exists and before the plugin reads its configuration.
    unsafe {
        std::env::set_var("NCCL_PROFILER_OTEL_EXPORTER", "file");
        std::env::set_var("NCCL_PROFILER_OTEL_EXPORT_FILE", "/dev/null");
    }
    let capture = Arc::new(drive::Capture::default());
    telemetry::add_sink(capture.clone());
    let plugin = Plugin::in_process();
    // Keeps the telemetry thread and NCCL's logger between the loads' communicators.
    let (keeper, _) = plugin.init(Some("keeper"), 0xB1_0000, 2, 16, 7);
    // The records a collective leaves at level 0 (a short, slow, unthrottled run) give the
    // ceiling: the throttled consumer's records/s over them.
    let comms = overload_comms(&plugin, 0xB2_0000);
    let shape = drive::run(
        &plugin,
        &comms[..1],
        1,
        drive::Load::paced(200.0, Duration::from_millis(100)),
    );
    comms.iter().for_each(|c| plugin.finalize(c.context));
    let records = capture.seen(0xB2_0000).records;
    let per_coll = records as f64 / shape[0].issued.max(1) as f64;
    let ceiling = 1e9 / THROTTLE_NS as f64 / per_coll;
    consumer::set_throttle(THROTTLE_NS);
    println!(
        "overload: consumer throttled to {THROTTLE_NS} ns a record, {per_coll:.0} records a collective: ceiling {ceiling:.0} collectives/s"
    );
    let mut rows: Vec<(f64, Row)> = Vec::new();
    for (i, factor) in [1.0, 3.0, 10.0].into_iter().enumerate() {
        let row = overload_load(&plugin, &capture, 0xB3_0000 + 0x100 * i as u64, factor * ceiling);
        rows.push((factor, row));
    }
    let base = rows[0].1;
    println!(
        "  load  collectives  counted  timed          mean error  levels  MiB/comm       telemetry CPU s/1,000 colls"
    );
    for (factor, r) in &rows {
        println!(
            "  {factor:3.0}×  {:11}  {:7}  {:5.1} % ({:4.2})  {:+6.1} %    {}–{}    {:5.2} ({:4.2})   {:.4} ({:4.2})",
            r.colls,
            r.counted,
            100.0 * r.timed,
            r.timed / base.timed,
            100.0 * r.error,
            r.levels.0,
            r.levels.1,
            r.resident,
            r.resident / base.resident,
            r.cpu,
            r.cpu / base.cpu
        );
    }
    consumer::set_throttle(0);
    plugin.finalize(keeper.context);
}

fn overload_comms(p: &Plugin, base: u64) -> Vec<Comm> {
    (0..OVERLOAD_COMMS)
        .map(|i| p.init(Some("overload"), base + i as u64, 2, 16, 7).0)
        .collect()
}

/// One load: fresh communicators at `rate` collectives/s for [`LOAD`], their windows processed.
fn overload_load(p: &Plugin, capture: &drive::Capture, base: u64, rate: f64) -> Row {
    let comms = overload_comms(p, base);
    let idle = emulator::rss();
    let cpu = thread_cpu("nccl-otel-tele");
    // Resets the peak resident memory (VmHWM) to the current one.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let mut levels = (u8::MAX, 0);
    let tallies = std::thread::scope(|s| {
        let load = drive::Load::paced(rate / OVERLOAD_COMMS as f64, LOAD);
        let comms = &comms;
        let run = s.spawn(move || drive::run(p, comms, OVERLOAD_COMMS, load));
        while !run.is_finished() {
            let ours = |c: &consumer::Slot| {
                c.comm.is_live() && (base..base + OVERLOAD_COMMS as u64).contains(&c.comm.learned_hash())
            };
            let seen = consumer::all().filter(ours).map(|c| c.shed_level());
            levels = seen.fold(levels, |(lo, hi), l| (lo.min(l), hi.max(l)));
            std::thread::sleep(Duration::from_millis(10));
        }
        run.join().expect("drivers")
    });
    std::thread::sleep(PAUSE);
    comms.iter().for_each(|c| p.finalize(c.context));
    let cpu = thread_cpu("nccl-otel-tele") - cpu;
    let resident = emulator::peak_rss().saturating_sub(idle) as f64 / OVERLOAD_COMMS as f64 / (1 << 20) as f64;
    let seen: Vec<drive::Seen> = (base..base + OVERLOAD_COMMS as u64).map(|h| capture.seen(h)).collect();
    let counted = seen.iter().map(|s| s.recorded + s.counted).sum();
    let timed: u64 = seen.iter().map(|s| s.timed).sum();
    let weight: f64 = seen.iter().map(|s| s.weight).sum();
    let weighted: f64 = seen.iter().map(|s| s.weighted).sum();
    let colls: u64 = tallies.iter().map(|t| t.issued).sum();
    let truth = tallies.iter().map(|t| t.mean() * t.issued as f64).sum::<f64>() / colls.max(1) as f64;
    Row {
        colls,
        counted,
        timed: timed as f64 / colls.max(1) as f64,
        error: weighted / weight.max(f64::MIN_POSITIVE) / truth - 1.0,
        levels,
        resident,
        cpu: cpu / colls.max(1) as f64 * 1000.0,
    }
}

/// CPU seconds (user + system) of the threads whose name starts with `name`.
fn thread_cpu(name: &str) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut ticks = 0u64;
    for t in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim().starts_with(name) {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            let fields: Vec<&str> = stat
                .rsplit_once(')')
                .map_or("", |(_, r)| r)
                .split_whitespace()
                .collect();
            ticks += [11, 12]
                .iter()
                .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
                .sum::<u64>();
        }
    }
    ticks as f64 / hz
}

/// One exporter's ladder, in this (child) process.
fn child(exporter: &str) {
    // SAFETY: before any other thread exists and before the plugin reads its configuration.
    unsafe {
        std::env::set_var("NCCL_PROFILER_OTEL_EXPORTER", exporter);
        std::env::set_var("NCCL_PROFILER_OTEL_EXPORT_FILE", "/dev/null");
    }
    let plugin = Plugin::in_process();
    let comms: Vec<Comm> = (0..COMMS)
        .map(|i| plugin.init(Some("burst"), 0xB0_0000 + i as u64, 2, 16, 7).0)
        .collect();
    let idle = emulator::rss();
    let mut ceiling = 0.0;
    for &rate in &LADDER {
        let before = drops();
        let start = Instant::now();
        let done: u64 = std::thread::scope(|s| {
            let threads: Vec<_> = comms
                .iter()
                .map(|c| {
                    let plugin = &plugin;
                    s.spawn(move || drive(plugin, c, rate * 1e6 / COMMS as f64))
                })
                .collect();
            threads.into_iter().map(|t| t.join().expect("driver")).sum()
        });
        let achieved = done as f64 / start.elapsed().as_secs_f64() / 1e6;
        let resident = emulator::rss().saturating_sub(idle) as f64 / COMMS as f64 / (1 << 20) as f64;
        std::thread::sleep(PAUSE);
        let dropped = drops() - before;
        println!(
            "  export {exporter:4}: target {rate:4.0} M/s, achieved {achieved:5.1} M/s, {dropped} records dropped, {resident:5.2} MiB resident per communicator"
        );
        if dropped > 0 {
            break;
        }
        if achieved < 0.9 * rate {
            println!("  (the driving threads cannot go faster here)");
            break;
        }
        ceiling = rate;
    }
    println!("ceiling {ceiling} M callbacks/s (export {exporter})");
    for c in &comms {
        plugin.finalize(c.context);
    }
}

/// Records lost so far: per-communicator drops and window summaries dropped.
fn drops() -> u64 {
    let comms: u64 = comm::all()
        .map(|c| {
            let d = c.drop_counts();
            d.full + d.late + d.unpublished
        })
        .sum();
    comms + telemetry::inbox::windows_dropped()
}

/// Collectives at `rate` callbacks/s for [`RUNG`]; returns the callbacks made.
fn drive(p: &Plugin, c: &Comm, rate: f64) -> u64 {
    let start = Instant::now();
    let (ctx, me) = (c.context, pid());
    let mut done = 0u64;
    let mut seq = 0u64;
    while start.elapsed() < RUNG {
        let coll = p.coll(
            c,
            H::NULL,
            "AllReduce",
            "RING",
            "SIMPLE",
            "ncclFloat32",
            1 << 18,
            CHANNELS,
            seq,
        );
        for ch in 0..CHANNELS {
            let send = p.proxy_op(ctx, coll, me, c.rank, c.rank + 1, ch, STEPS, true);
            let recv = p.proxy_op(ctx, coll, me, c.rank, c.rank - 1, ch, STEPS, false);
            p.state(recv, ty::OP_IN_PROGRESS, 0);
            for step in 0..STEPS {
                let s = p.proxy_step(ctx, send, c.rank, step);
                p.state(s, ty::SEND_GPU_WAIT, 0);
                p.state(s, ty::SEND_WAIT, 16 << 10);
                p.stop(s);
                let r = p.proxy_step(ctx, recv, c.rank, step);
                p.stop(r);
            }
            p.stop(send);
            p.stop(recv);
        }
        p.stop(coll);
        seq += 1;
        done += PER_COLL;
        let due = Duration::from_secs_f64(done as f64 / rate);
        if let Some(ahead) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(ahead);
        }
    }
    done
}

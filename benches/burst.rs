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

#[path = "../tests/support/emulator/mod.rs"]
mod emulator;

use std::process::Command;
use std::time::{Duration, Instant};

use emulator::{Comm, H, Plugin, pid, ty};
use nccl_profiler_otel::{comm, telemetry};

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

fn main() {
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

//! Resident memory per communicator, measured (RSS from `/proc/self/statm`), not computed:
//! idle after `init`, with one full window lane (100,000 records, the default capacity), with a
//! tenth of that, and after `finalize`, for 1, 16 and 64 communicators. The baseline is the
//! process's RSS before the communicators, measured in the same run; the ratio compares what a
//! communicator holds resident with the bytes of the records it buffers.
//!
//! `harness = false`: prints a table. `cargo bench --bench memory` runs it all; under
//! `cargo test --benches` it runs one communicator only.

#[path = "../tests/support/emulator/mod.rs"]
mod emulator;

use emulator::{H, Plugin, pid, rss, ty};
use nccl_profiler_otel::buffer::arena::Slot;
use nccl_profiler_otel::comm;
use nccl_profiler_otel::config::Config;
use nccl_profiler_otel::record::Record;
use nccl_profiler_otel::record::compact::Compact;
use nccl_profiler_otel::record::handle::LANES;

/// Records `n` records into the current window of `c`: a collective, a ProxyOp and send steps
/// of three records each (start, SendWait, stop).
fn fill(p: &Plugin, c: &emulator::Comm, n: u64) -> u64 {
    let coll = p.coll(c, H::NULL, "AllReduce", "RING", "SIMPLE", "ncclFloat32", 1 << 20, 1, 0);
    p.stop(coll);
    let op = p.proxy_op(c.context, coll, pid(), c.rank, 1, 0, 1 << 20, true);
    let mut records = 3;
    let mut k = 0;
    while records + 3 <= n {
        let s = p.proxy_step(c.context, op, c.rank, k);
        p.state(s, ty::SEND_WAIT, 1 << 19);
        p.stop(s);
        records += 3;
        k += 1;
    }
    records
}

fn mib(b: f64) -> String {
    format!("{:.2} MiB", b / (1 << 20) as f64)
}

fn kib(b: f64) -> String {
    format!("{:.0} KiB", b / 1024.0)
}

fn main() {
    // SAFETY: set before the first `init` reads the environment; single-threaded here.
    unsafe {
        std::env::set_var("NCCL_PROFILER_OTEL_TELEMETRY_ENABLE", "0");
        std::env::set_var("NCCL_PROFILER_OTEL_EXPORTER", "none");
    }
    let full_run = std::env::args().any(|a| a == "--bench");
    let counts: &[usize] = if full_run { &[1, 16, 64] } else { &[1] };
    let p = Plugin::in_process();
    // Load the configuration, the clock and the registry before the baseline.
    let (warm, _) = p.init(Some("warm-up"), 0x3E3_0000, 1, 2, 0);
    p.finalize(warm.context);
    let capacity = u64::from(Config::global().capacity);
    // `fill` writes proxy-lane records: packed slots.
    let slot = std::mem::size_of::<Slot<Compact>>() as u64;
    let full_slot = std::mem::size_of::<Slot<Record>>() as u64;
    println!(
        "memory: resident set per communicator (RSS deltas from /proc/self/statm); window capacity {capacity} records per lane"
    );
    println!(
        "{:>6} {:>14} {:>18} {:>12} {:>18} {:>12} {:>16}",
        "comms", "idle", "10 % of a window", "ratio", "one full window", "ratio", "after finalize"
    );
    let mut hash = 0x3E3_1000u64;
    for &n in counts {
        let base = rss();
        let comms: Vec<_> = (0..n)
            .map(|_| {
                hash += 1;
                p.init(Some("mem"), hash, 2, 2, 0).0
            })
            .collect();
        let idle = (rss() - base) as f64 / n as f64;
        let tenth: u64 = comms.iter().map(|c| fill(&p, c, capacity / 10)).sum();
        let at_tenth = (rss().saturating_sub(base)) as f64 / n as f64;
        let full: u64 = comms.iter().map(|c| fill(&p, c, capacity - capacity / 10)).sum();
        let at_full = (rss().saturating_sub(base)) as f64 / n as f64;
        for c in &comms {
            let drops = comm::all()
                .find(|x| x.is_live() && x.learned_hash() == c.hash)
                .map(|x| x.drop_counts().full)
                .unwrap_or(0);
            assert_eq!(drops, 0, "the window held every record");
        }
        let buffered_tenth = tenth as f64 / n as f64 * slot as f64;
        let buffered_full = (tenth + full) as f64 / n as f64 * slot as f64;
        for c in &comms {
            p.finalize(c.context);
        }
        let after = (rss().saturating_sub(base)) as f64 / n as f64;
        println!(
            "{:>6} {:>14} {:>18} {:>11.2}x {:>18} {:>11.2}x {:>16}",
            n,
            kib(idle),
            mib(at_tenth),
            at_tenth / buffered_tenth,
            mib(at_full),
            at_full / buffered_full,
            kib(after)
        );
    }
    println!(
        "(ratio = resident bytes / bytes of the records buffered at {slot} B per proxy-lane slot; the configured capacity alone would be {} per communicator: 4 windows × {LANES} lanes × {capacity} slots of {full_slot} B (application lane) or {slot} B)",
        mib((4 * capacity * (full_slot + (LANES as u64 - 1) * slot)) as f64)
    );
}

//! Cost of one callback through the exported `ncclProfiler_v7` table (every version's callbacks
//! are the same generic bodies), against a table of empty callbacks with the same signatures, in
//! the same run.
//!
//! - `single/{start,state,stop}`: one kind of callback on one thread: ProxyStep start (under a
//!   live ProxyOp), SendWait state, ProxyStep stop; `single/step`: a whole send step (start,
//!   SendGPUWait, SendPeerWait, SendWait, stop), per callback; `single/kernel`: a kernel
//!   channel's three callbacks; `single/coll`: a whole collective's 522 callbacks (a ring
//!   AllReduce on 8 channels with 8 steps each, its receive ops and kernel channels): the
//!   plugin's time per operation against the empty table's.
//! - `two_threads`: a user thread (Coll start/stop) and a proxy thread (ProxyOp and its steps)
//!   on one communicator at once, each timing its own callbacks, against the same callbacks made
//!   by one thread (`plugin_one_thread`) and the empty table; per unit of 24 callbacks.
//!
//! Criterion reports mean and median per callback. After it, a tail measurement times single
//! callbacks with `rdtsc` (fenced) and prints median and p99 of plugin and baseline and what the
//! plugin adds (`cargo bench --bench hot_path`; a quick pass under `cargo test --benches`).
//!
//! The plugin's telemetry thread is off: between timed batches (of at most 8,000 callbacks, so a
//! window never fills) the bench drives the consumer itself, untimed, as the telemetry thread
//! would, so windows rotate, get processed and are reused with their pages resident.

#[path = "../tests/support/emulator/mod.rs"]
mod emulator;
#[path = "support/table.rs"]
mod table;

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use emulator::{H, pid, ty};
use nccl_profiler_otel::bindings::ncclProfilerEventDescr_v7_t;
use nccl_profiler_otel::clock;
use table::{Bench, Table, kernel_descr, step_descr};

/// Callbacks per timed batch.
const BATCH: u64 = 2000;

/// What one batch times.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Start,
    State,
    Stop,
    Step,
    /// A kernel channel: start, KernelChStop, stop (what KernelCh in the mask adds per channel).
    Kernel,
    /// A whole collective, as NCCL 2.31 makes its callbacks for a ring AllReduce on 8 channels
    /// ([`collective`]): the plugin's time per operation against the empty table's.
    Collective,
}

impl Kind {
    const ALL: [Kind; 6] = [
        Kind::Start,
        Kind::State,
        Kind::Stop,
        Kind::Step,
        Kind::Kernel,
        Kind::Collective,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::Start => "start",
            Kind::State => "state",
            Kind::Stop => "stop",
            Kind::Step => "step",
            Kind::Kernel => "kernel",
            Kind::Collective => "coll",
        }
    }

    /// Callbacks per unit.
    fn callbacks(self) -> u64 {
        match self {
            Kind::Step => 5,
            Kind::Kernel => 3,
            Kind::Collective => COLLECTIVE_CALLBACKS,
            _ => 1,
        }
    }
}

/// One kernel channel's three callbacks.
#[inline(always)]
fn kernel_channel(t: &Table, d: &mut ncclProfilerEventDescr_v7_t) {
    let h = t.start(d);
    t.state(h, ty::KERNEL_CH_STOP, 2_000_000);
    t.stop(h);
}

/// Channels, and send steps per channel, of [`collective`].
const CHANNELS: u8 = 8;
const STEPS: i32 = 8;
/// Callbacks of [`collective`]: Coll start and stop; per channel a send op (start, InProgress,
/// stop) with its steps (start, SendGPUWait, SendPeerWait, SendWait, stop), a receive op (start,
/// InProgress, stop) with its steps (start and stop, declined) and a kernel channel (3).
const COLLECTIVE_CALLBACKS: u64 = 2 + CHANNELS as u64 * (3 + 5 * STEPS as u64 + 3 + 2 * STEPS as u64 + 3);

/// One collective's callbacks as NCCL makes them (one thread here; in NCCL the proxy and
/// profiler threads make most of them).
fn collective(t: &Table, d: &mut ncclProfilerEventDescr_v7_t, ops: &mut [ncclProfilerEventDescr_v7_t; 2]) {
    let coll = t.start(d);
    for ch in 0..CHANNELS {
        for (op, d) in ops.iter_mut().enumerate() {
            d.parentObj = coll;
            d.__bindgen_anon_1.proxyOp.channelId = ch;
            let h = t.start(d);
            t.state(h, ty::OP_IN_PROGRESS, 0);
            for step in 0..STEPS {
                let s = t.start(&mut step_descr(h, step));
                if op == 0 {
                    t.state(s, ty::SEND_GPU_WAIT, 0);
                    t.state(s, ty::SEND_PEER_WAIT, 0);
                    t.state(s, ty::SEND_WAIT, 1 << 17);
                }
                t.stop(s);
            }
            t.stop(h);
        }
        kernel_channel(t, &mut kernel_descr(coll, ch));
    }
    t.stop(coll);
}

/// The send and receive op descriptors of [`collective`].
fn op_descrs() -> [ncclProfilerEventDescr_v7_t; 2] {
    [true, false].map(|send| emulator::plugin::proxy_op_descr(H::NULL, pid(), 0, 1, 0, STEPS, 1 << 17, send))
}

/// Runs `n` units of `kind` on `t`, timing only the callbacks being measured.
fn run(t: &Table, kind: Kind, n: u64) -> Duration {
    match kind {
        Kind::Start => {
            let mut descrs: Vec<_> = (0..n).map(|i| step_descr(t.op, i as i32)).collect();
            let t0 = Instant::now();
            for d in &mut descrs {
                black_box(t.start(d));
            }
            t0.elapsed()
        }
        Kind::State | Kind::Stop => {
            let handles: Vec<_> = (0..n).map(|i| t.start(&mut step_descr(t.op, i as i32))).collect();
            let t0 = Instant::now();
            for &h in &handles {
                if kind == Kind::State {
                    t.state(h, ty::SEND_WAIT, 1 << 20);
                } else {
                    t.stop(h);
                }
            }
            t0.elapsed()
        }
        Kind::Step => {
            let t0 = Instant::now();
            for i in 0..n {
                let h = t.start(&mut step_descr(t.op, i as i32));
                t.state(h, ty::SEND_GPU_WAIT, 0);
                t.state(h, ty::SEND_PEER_WAIT, 0);
                t.state(h, ty::SEND_WAIT, 1 << 20);
                t.stop(h);
            }
            t0.elapsed()
        }
        Kind::Kernel => {
            let mut descrs: Vec<_> = (0..n).map(|i| kernel_descr(t.coll, i as u8)).collect();
            let t0 = Instant::now();
            for d in &mut descrs {
                kernel_channel(t, d);
            }
            t0.elapsed()
        }
        Kind::Collective => {
            let mut descrs: Vec<_> = (0..n).map(table::allreduce_descr).collect();
            let mut ops = op_descrs();
            let t0 = Instant::now();
            for d in &mut descrs {
                collective(t, d, &mut ops);
            }
            t0.elapsed()
        }
    }
}

/// `iters` units in batches, the consumer between them; the timed total.
fn timed(b: &mut Bench, plugin: bool, kind: Kind, iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(BATCH / kind.callbacks());
        let t = if plugin { b.plugin_table() } else { b.empty_table() };
        total += run(&t, kind, n);
        if plugin {
            b.consume();
        }
        left -= n;
    }
    total
}

fn single_thread(c: &mut Criterion) {
    let mut b = Bench::new(0xBE7C_0001);
    let mut g = c.benchmark_group("hot_path/single");
    for kind in Kind::ALL {
        g.throughput(criterion::Throughput::Elements(kind.callbacks()));
        g.bench_function(format!("{}/empty", kind.name()), |bn| {
            bn.iter_custom(|iters| timed(&mut b, false, kind, iters))
        });
        g.bench_function(format!("{}/plugin", kind.name()), |bn| {
            bn.iter_custom(|iters| timed(&mut b, true, kind, iters))
        });
    }
    g.finish();
    tails(&mut b);
}

/// A user thread (Coll start + stop) and a proxy thread (ProxyOp start, 4 steps of 5 callbacks,
/// ProxyOp stop) at once, the sum of both threads' timed callbacks; against the same callbacks
/// made by one thread (`plugin_one_thread`: what sharing the communicator between two threads
/// costs) and the empty table.
fn two_threads(c: &mut Criterion) {
    let mut b = Bench::new(0xBE7C_0002);
    let mut g = c.benchmark_group("hot_path/two_threads");
    // One unit: 2 user callbacks + 22 proxy callbacks.
    g.throughput(criterion::Throughput::Elements(24));
    for (name, plugin, threads) in [("empty", false, 2), ("plugin", true, 2), ("plugin_one_thread", true, 1)] {
        g.bench_function(name, |bn| {
            bn.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let n = left.min(BATCH / 24);
                    let t = if plugin { b.plugin_table() } else { b.empty_table() };
                    total += if threads == 2 {
                        pair(&t, n)
                    } else {
                        user(&t, n, None) + proxy(&t, n, None)
                    };
                    if plugin {
                        b.consume();
                    }
                    left -= n;
                }
                total
            })
        });
    }
    g.finish();
}

/// `n` units on two threads; the sum of their timed work.
fn pair(t: &Table, n: u64) -> Duration {
    let go = Barrier::new(2);
    std::thread::scope(|s| {
        let u = s.spawn(|| user(t, n, Some(&go)));
        let p = s.spawn(|| proxy(t, n, Some(&go)));
        u.join().expect("user") + p.join().expect("proxy")
    })
}

/// The user thread's part of `n` units (Coll start, stop), timed after `go`.
fn user(t: &Table, n: u64, go: Option<&Barrier>) -> Duration {
    let mut descrs: Vec<_> = (0..n).map(table::allreduce_descr).collect();
    go.map(Barrier::wait);
    let t0 = Instant::now();
    for d in &mut descrs {
        let h = t.start(d);
        t.stop(h);
    }
    t0.elapsed()
}

/// The proxy thread's part of `n` units (a ProxyOp of 4 send steps), timed after `go`.
fn proxy(t: &Table, n: u64, go: Option<&Barrier>) -> Duration {
    let mut op = emulator::plugin::proxy_op_descr(H(t.op), pid(), 0, 1, 0, 4, 1 << 20, true);
    go.map(Barrier::wait);
    let t0 = Instant::now();
    for _ in 0..n {
        let h = t.start(&mut op);
        t.state(h, ty::OP_IN_PROGRESS, 0);
        for k in 0..4 {
            let st = t.start(&mut step_descr(h, k));
            t.state(st, ty::SEND_GPU_WAIT, 0);
            t.state(st, ty::SEND_PEER_WAIT, 0);
            t.state(st, ty::SEND_WAIT, 1 << 20);
            t.stop(st);
        }
        t.stop(h);
    }
    t0.elapsed()
}

/// rdtsc, fenced so the timed call cannot move across it.
#[inline(always)]
fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: lfence/rdtsc have no preconditions on x86_64.
    unsafe {
        std::arch::x86_64::_mm_lfence();
        let t = std::arch::x86_64::_rdtsc();
        std::arch::x86_64::_mm_lfence();
        t
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        T0.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// Nanoseconds per `ticks()` unit.
fn ns_per_tick() -> f64 {
    let (t0, i0) = (ticks(), Instant::now());
    std::thread::sleep(Duration::from_millis(200));
    i0.elapsed().as_nanos() as f64 / (ticks() - t0) as f64
}

/// Times single callbacks of `kind` (the Step kind: each of its 5 callbacks; the Kernel kind: its
/// three together); samples in ticks.
fn sample(t: &Table, kind: Kind, n: u64, out: &mut Vec<u64>) {
    let handles: Vec<_> = if matches!(kind, Kind::State | Kind::Stop) {
        (0..n).map(|i| t.start(&mut step_descr(t.op, i as i32))).collect()
    } else {
        Vec::new()
    };
    let mut descrs: Vec<_> = (0..n).map(|i| step_descr(t.op, i as i32)).collect();
    for i in 0..n as usize {
        match kind {
            Kind::Start => {
                let a = ticks();
                black_box(t.start(&mut descrs[i]));
                out.push(ticks() - a);
            }
            Kind::State => {
                let a = ticks();
                t.state(handles[i], ty::SEND_WAIT, 1 << 20);
                out.push(ticks() - a);
            }
            Kind::Stop => {
                let a = ticks();
                t.stop(handles[i]);
                out.push(ticks() - a);
            }
            Kind::Step => {
                let a = ticks();
                let h = t.start(&mut descrs[i]);
                let b = ticks();
                t.state(h, ty::SEND_GPU_WAIT, 0);
                let c = ticks();
                t.state(h, ty::SEND_WAIT, 1 << 20);
                let d = ticks();
                t.stop(h);
                let e = ticks();
                out.extend([b - a, c - b, d - c, e - d]);
            }
            Kind::Kernel => {
                let mut d = kernel_descr(t.coll, i as u8);
                let a = ticks();
                kernel_channel(t, &mut d);
                out.push(ticks() - a);
            }
            Kind::Collective => {
                let (mut d, mut ops) = (table::allreduce_descr(i as u64), op_descrs());
                let a = ticks();
                collective(t, &mut d, &mut ops);
                out.push(ticks() - a);
            }
        }
    }
}

fn percentile(v: &mut [u64], p: f64) -> u64 {
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p) as usize]
}

/// Median and p99 of single callbacks, plugin against the empty table; printed.
fn tails(b: &mut Bench) {
    let full = std::env::args().any(|a| a == "--bench");
    let samples = if full { 200_000 } else { 2_000 };
    let ns = ns_per_tick();
    // The timer's own cost: an empty pair of fenced reads.
    let mut overhead: Vec<u64> = (0..100_000)
        .map(|_| {
            let a = ticks();
            ticks() - a
        })
        .collect();
    let timer = percentile(&mut overhead, 0.5) as f64 * ns;
    println!();
    println!(
        "hot_path tails: single callbacks timed with fenced rdtsc ({timer:.1} ns timer cost subtracted), {samples} each (whole collectives: {})",
        samples / 100
    );
    println!(
        "{:<8} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
        "callback", "empty p50", "plugin p50", "added p50", "empty p99", "plugin p99", "added p99"
    );
    for kind in Kind::ALL {
        let mut row = [(0.0, 0.0); 2];
        let want = if kind == Kind::Collective {
            samples / 100
        } else {
            samples
        };
        for (i, plugin) in [false, true].into_iter().enumerate() {
            let mut v = Vec::with_capacity(want);
            while v.len() < want {
                let t = if plugin { b.plugin_table() } else { b.empty_table() };
                sample(&t, kind, BATCH / kind.callbacks(), &mut v);
                if plugin {
                    b.consume();
                }
            }
            let p50 = percentile(&mut v, 0.5) as f64 * ns - timer;
            let p99 = percentile(&mut v, 0.99) as f64 * ns - timer;
            row[i] = (p50, p99);
        }
        println!(
            "{:<8} {:>9.1} ns {:>9.1} ns {:>9.1} ns {:>9.1} ns {:>9.1} ns {:>9.1} ns",
            kind.name(),
            row[0].0,
            row[1].0,
            row[1].0 - row[0].0,
            row[0].1,
            row[1].1,
            row[1].1 - row[0].1
        );
    }
    // The plugin reads the clock once per callback: its cost alone.
    clock::init();
    let mut v: Vec<u64> = (0..100_000)
        .map(|_| {
            let a = ticks();
            black_box(clock::now());
            ticks() - a
        })
        .collect();
    println!(
        "clock::now() alone: p50 {:.1} ns, p99 {:.1} ns",
        percentile(&mut v, 0.5) as f64 * ns - timer,
        percentile(&mut v, 0.99) as f64 * ns - timer
    );
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50)
}

criterion_group! {
    name = benches;
    config = config();
    targets = single_thread, two_threads
}
criterion_main!(benches);

//! The driver: per thread, collectives in the burst shape on one or more communicators (round
//! robin), several in flight on each, paced to a rate, with the truth of every collective.
//!
//! A collective: a Coll start (AllReduce, ring, Simple, float32, its size from a seeded sequence,
//! 64 KiB – 4 MiB) and, once [`IN_FLIGHT`] later collectives of its communicator have started,
//! its work: on each of [`CHANNELS`] channels a send ProxyOp with [`STEPS`] steps (start,
//! SendGPUWait, SendWait, stop) and a receive ProxyOp (start, InProgress, [`STEPS`] steps: start,
//! RecvGPUWait, stop), its service (a [`SERVICE`] wait, then a spin proportional to its size),
//! the op stops, then the Coll stop. Truth: the driver's `Instant` just before the Coll start
//! call and just before its last op stop call. Also what the plugin reported of them
//! ([`Capture`], [`Seen`]), which the tests and the burst bench read.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nccl_profiler_otel::aggregate::WindowSummary;
use nccl_profiler_otel::telemetry;

use crate::support::emulator::{Comm, H, Plugin, descr, pid, spin, ty};

/// Channels of a collective.
pub const CHANNELS: u8 = 8;
/// Steps of each ProxyOp.
pub const STEPS: i32 = 8;
/// Function, algorithm, protocol and datatype of every collective.
const COLL: (&str, &str, &str, &str) = ("AllReduce", "RING", "SIMPLE", "ncclFloat32");
/// Collectives of a communicator started ahead of the one being worked on.
pub const IN_FLIGHT: usize = 4;
/// The network wait in each collective's service.
const SERVICE: Duration = Duration::from_micros(50);

/// How a run drives.
#[derive(Clone, Copy, Debug)]
pub struct Load {
    /// Collectives per second, per driving thread (0: as fast as it goes).
    pub rate: f64,
    /// How long.
    pub time: Duration,
    /// Every Coll start has sequence number 0, as CUDA graph replays of one capture have.
    pub frozen_seq: bool,
    /// Each collective's size is its index's own (`64 KiB + 4 × index`), so that the plugin's
    /// samples of two runs can be matched; else from the seeded sequence.
    pub unique_sizes: bool,
    /// A ProxyCtrl event (start, state, stop) per collective, as a mask with every bit set
    /// (NCCL's RAS overwrites it so) makes NCCL send.
    pub proxy_ctrl: bool,
}

impl Load {
    /// `rate` collectives/s per thread for `time`.
    pub fn paced(rate: f64, time: Duration) -> Load {
        Load {
            rate,
            time,
            frozen_seq: false,
            unique_sizes: false,
            proxy_ctrl: false,
        }
    }
}

/// What one communicator was driven through.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Collectives issued.
    pub issued: u64,
    /// Their true durations (Coll start → last op stop), seconds, with their byte counts.
    pub truth: Vec<(u64, f64)>,
}

impl Tally {
    /// The mean true duration, seconds.
    pub fn mean(&self) -> f64 {
        self.truth.iter().map(|t| t.1).sum::<f64>() / self.truth.len().max(1) as f64
    }
}

/// A collective started and not yet worked on.
struct Open {
    coll: H,
    start: Instant,
    bytes: u64,
}

/// Drives `comms` from `threads` threads (comm `i` on thread `i % threads`) under `load`;
/// returns each communicator's tally.
pub fn run(p: &Plugin, comms: &[Comm], threads: usize, load: Load) -> Vec<Tally> {
    let mut tallies: Vec<Tally> = vec![Tally::default(); comms.len()];
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let mine: Vec<(usize, Comm)> = comms.iter().copied().enumerate().skip(t).step_by(threads).collect();
                s.spawn(move || drive(p, &mine, load, t as u64))
            })
            .collect();
        for h in handles {
            for (i, tally) in h.join().expect("driver thread") {
                tallies[i] = tally;
            }
        }
    });
    tallies
}

/// One thread's communicators, round robin.
fn drive(p: &Plugin, comms: &[(usize, Comm)], load: Load, seed: u64) -> Vec<(usize, Tally)> {
    let mut open: Vec<VecDeque<Open>> = comms.iter().map(|_| VecDeque::new()).collect();
    let mut tallies: Vec<Tally> = comms.iter().map(|_| Tally::default()).collect();
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ seed;
    let start = Instant::now();
    let mut started = 0u64;
    while start.elapsed() < load.time {
        let k = started as usize % comms.len();
        let c = &comms[k].1;
        let index = tallies[k].issued;
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let bytes = if load.unique_sizes {
            (64 << 10) + 4 * index
        } else {
            (64 << 10) << ((x >> 33) % 7)
        };
        let seq = if load.frozen_seq { 0 } else { index };
        let t0 = Instant::now();
        let (func, algo, proto, dtype) = COLL;
        let coll = p.coll(
            c,
            H::NULL,
            func,
            algo,
            proto,
            dtype,
            (bytes / 4) as usize,
            CHANNELS,
            seq,
        );
        open[k].push_back(Open { coll, start: t0, bytes });
        tallies[k].issued += 1;
        if open[k].len() > IN_FLIGHT {
            let o = open[k].pop_front().expect("an open collective");
            work(p, c, o, load.proxy_ctrl, &mut tallies[k]);
        }
        started += 1;
        if load.rate > 0.0 {
            let due = Duration::from_secs_f64(started as f64 / load.rate);
            if let Some(ahead) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(ahead);
            }
        }
    }
    for (k, q) in open.iter_mut().enumerate() {
        while let Some(o) = q.pop_front() {
            work(p, &comms[k].1, o, load.proxy_ctrl, &mut tallies[k]);
        }
    }
    comms.iter().map(|c| c.0).zip(tallies).collect()
}

/// A collective's network work, its truth, its stop.
fn work(p: &Plugin, c: &Comm, o: Open, proxy_ctrl: bool, tally: &mut Tally) {
    let (ctx, me) = (c.context, pid());
    if proxy_ctrl {
        let ctrl = p.start(ctx, &mut descr(ty::PROXY_CTRL, H::NULL, c.rank));
        p.stop(ctrl);
    }
    let step_bytes = o.bytes / (u64::from(CHANNELS) * STEPS as u64);
    let mut last = None;
    for ch in 0..CHANNELS {
        let send = p.proxy_op(ctx, o.coll, me, c.rank, c.rank + 1, ch, STEPS, true);
        let recv = p.proxy_op(ctx, o.coll, me, c.rank, c.rank - 1, ch, STEPS, false);
        p.state(recv, ty::OP_IN_PROGRESS, 0);
        for step in 0..STEPS {
            let s = p.proxy_step(ctx, send, c.rank, step);
            p.state(s, ty::SEND_GPU_WAIT, 0);
            p.state(s, ty::SEND_WAIT, step_bytes);
            p.stop(s);
            let r = p.proxy_step(ctx, recv, c.rank, step);
            p.state(r, ty::RECV_GPU_WAIT, step_bytes);
            p.stop(r);
        }
        if ch + 1 == CHANNELS {
            // The collective's service, inside its time: a wait on the network, then 0.5–32 µs
            // of work by size. The wait, not the callbacks, makes most of a collective's time,
            // as in NCCL, so that the plugin's own cost of recording an operation (in a debug
            // build several times the shipped one) does not make the timed ones the slower ones.
            std::thread::sleep(SERVICE);
            spin(Duration::from_nanos(o.bytes / 128));
        }
        p.stop(send);
        if ch + 1 == CHANNELS {
            last = Some(Instant::now());
        }
        p.stop(recv);
    }
    p.stop(o.coll);
    let end = last.expect("at least one channel");
    tally.truth.push((o.bytes, end.duration_since(o.start).as_secs_f64()));
}

/// What the plugin made of each communicator and rank (until [`Capture::stop`]), folded as each
/// window arrives: keeping the summaries would grow with the run and count as the plugin's memory.
pub struct Capture(Mutex<Option<HashMap<(u64, i32), Seen>>>);

impl Default for Capture {
    fn default() -> Self {
        Capture(Mutex::new(Some(HashMap::new())))
    }
}

impl telemetry::Sink for Capture {
    fn window(&self, w: &WindowSummary) {
        let mut kept = self.0.lock().expect("capture");
        let Some(kept) = kept.as_mut() else { return };
        let s = kept.entry((w.comm.hash, w.comm.rank)).or_default();
        s.records += w.stats.records;
        s.counted += w.counted.iter().map(|c| c.ops).sum::<u64>();
        for o in w.colls.iter().flat_map(|g| &g.ops) {
            s.recorded += 1;
            let weight = o.sample.weight();
            if let (Some(d), true) = (o.duration, weight > 0) {
                s.timed += 1;
                s.weight += f64::from(weight);
                s.weighted += f64::from(weight) * d;
                s.samples.push(o.bytes);
            }
        }
    }
}

impl Capture {
    /// Drops what it kept and keeps nothing more.
    pub fn stop(&self) {
        *self.0.lock().expect("capture") = None;
    }

    /// Waits for the telemetry pass running now to end (at most 0.5 s: with no communicator live
    /// the thread sleeps after it): it hands the windows it processed to the sinks after
    /// releasing their communicator, so a `finalize` can return before a window processed just
    /// before it reaches the capture.
    fn settle() {
        let (pass, start) = (telemetry::passes(), Instant::now());
        while telemetry::passes() == pass && start.elapsed() < Duration::from_millis(500) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// What the plugin made of the communicator with `hash`.
    pub fn seen(&self, hash: u64) -> Seen {
        self.seen_rank(hash, None)
    }

    /// What the plugin made of the communicator with `hash`, of rank `rank` only when given.
    pub fn seen_rank(&self, hash: u64, rank: Option<i32>) -> Seen {
        Capture::settle();
        let mut s = Seen::default();
        let kept = self.0.lock().expect("capture");
        let mine = |((h, r), _): &(&(u64, i32), &Seen)| *h == hash && rank.is_none_or(|rank| *r == rank);
        for (_, w) in kept.iter().flatten().filter(mine) {
            s.records += w.records;
            s.recorded += w.recorded;
            s.counted += w.counted;
            s.timed += w.timed;
            s.weight += w.weight;
            s.weighted += w.weighted;
            s.samples.extend_from_slice(&w.samples);
        }
        s
    }
}

/// A communicator's operations as the plugin reported them.
#[derive(Debug, Default)]
pub struct Seen {
    /// Records its windows held.
    pub records: u64,
    /// Operations with a record.
    pub recorded: u64,
    /// Operations counted without one.
    pub counted: u64,
    /// Operations timed with a weight.
    pub timed: u64,
    /// Σ weight, Σ weight × duration over them.
    pub weight: f64,
    pub weighted: f64,
    /// The sizes of the timed operations.
    pub samples: Vec<u64>,
}

impl Seen {
    /// The weighted mean duration of the timed operations, seconds.
    pub fn mean(&self) -> f64 {
        self.weighted / self.weight.max(f64::MIN_POSITIVE)
    }
}

//! What the emulator knows independently of the plugin: the configured links, and its own
//! clock readings around every callback that matters.
//!
//! Times are taken with `Instant::now()` right before the callback whose timestamp the plugin
//! uses (Coll start, SendWait, step stop, ProxyOp stop), so the plugin's figure and the
//! emulator's differ by the cost of one call, tens of nanoseconds.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::net::Link;
use super::workload::Func;

/// One Coll or P2p task on one emulated rank.
#[derive(Clone, Debug)]
pub struct CollTruth {
    /// Communicator name and hash.
    pub comm: String,
    pub hash: u64,
    /// Rank in the communicator (the plugin's `CommMeta::rank`) and in the world.
    pub rank: i32,
    pub world_rank: usize,
    /// The iteration of the workload that issued it.
    pub iteration: usize,
    pub func: Func,
    /// `seqNumber` (per communicator and function) for collectives; the peer for P2p.
    pub seq: u64,
    pub peer: Option<i32>,
    /// `count` and datatype as in the descriptor; `bytes` = count × datatype size.
    pub count: u64,
    pub dtype: &'static str,
    pub bytes: u64,
    /// Ranks in the communicator.
    pub nranks: i32,
    /// Right before the Coll/P2p `startEvent`.
    pub start: Instant,
    /// How long that `startEvent` call took: the plugin read its clock somewhere inside, so
    /// this bounds how far its start can be from `start`.
    pub start_call: Duration,
    /// Right before the last `stopEvent` of a local network ProxyOp of this task, send or
    /// receive (PXN ops excluded: another process reports them). `None` without such ops.
    pub last_op_stop: Option<Instant>,
    /// How long that `stopEvent` call took (as `start_call` for the start).
    pub stop_call: Duration,
    /// When the last of its proxy or kernel activity ended (receives included).
    pub end: Option<Instant>,
    /// Earliest KernelCh start and latest KernelCh stop, GPU nanoseconds, when KernelCh ran.
    pub gpu: Option<(u64, u64)>,
    /// Send steps (network transfers) under its local ProxyOps.
    pub send_steps: u64,
    /// It had a send op reported as another process's (PXN), started with a handle.
    pub pxn: bool,
    /// The call's `userProfilerTag` (0: untagged).
    pub tag: u64,
    /// Run by the copy engines: CeColl events only.
    pub ce: bool,
    /// Run by a symmetric-memory kernel ([`super::Call::symmetric`]).
    pub sym: bool,
    /// Made during a CUDA graph capture ([`super::Options::captured`]).
    pub captured: bool,
}

impl CollTruth {
    /// Host time: start → last local network ProxyOp stop of either direction. `None` without
    /// network ops.
    pub fn duration(&self) -> Option<Duration> {
        self.last_op_stop.map(|stop| stop.saturating_duration_since(self.start))
    }

    /// GPU time: earliest KernelCh start → latest KernelCh stop, from the pTimers given.
    pub fn gpu_duration(&self) -> Option<Duration> {
        self.gpu.map(|(a, b)| Duration::from_nanos(b.saturating_sub(a)))
    }

    /// nccl-tests' "size": the whole buffer. The descriptor's count is per rank for AllGather
    /// (its send count, converted to bytes) and ReduceScatter (its receive count).
    pub fn test_size(&self) -> u64 {
        match self.func {
            Func::AllGather | Func::ReduceScatter => self.bytes * self.nranks as u64,
            _ => self.bytes,
        }
    }

    /// Start → end of all its activity, receives included.
    pub fn full_duration(&self) -> Option<Duration> {
        self.end.map(|e| e.saturating_duration_since(self.start))
    }
}

/// Transfers from one emulated rank to one peer over one communicator (the plugin's
/// `LinkGroup` of that rank's communicator).
#[derive(Clone, Debug)]
pub struct LinkTruth {
    pub comm: String,
    pub hash: u64,
    /// Sending and receiving rank in the communicator, as ProxyOps report them.
    pub rank: i32,
    pub peer: i32,
    /// The same in world ranks (the network's link).
    pub src: usize,
    pub dst: usize,
    /// The configured link.
    pub configured: Link,
    /// Every transfer with the times the emulator took around it.
    pub steps: Vec<StepTruth>,
    /// Transfers whose emulation the host disturbed (the thread ran late by more than
    /// [`DISTURBED`]): their time is longer than the model says.
    pub disturbed: u64,
    /// Total time the emulator's calls came later than the model (sum over transfers).
    pub late: Duration,
    /// The largest lateness of one transfer: a host stall longer than the plugin's telemetry
    /// interval can make the plugin give up on an event (counted as unfinished or late).
    pub max_late: Duration,
    /// SendWait → stop of every other transfer of the same process (world rank `src`): every
    /// other link, communicator and peer. Filled when the run's report is complete.
    pub others: Vec<(Instant, Instant)>,
}

/// Lateness past which a transfer counts as disturbed.
pub const DISTURBED: Duration = Duration::from_micros(5);

/// One send step as the emulator timed it.
#[derive(Clone, Copy, Debug)]
pub struct StepTruth {
    pub bytes: u64,
    /// Right before the SendWait call (v1–v3: SendTransmitted).
    pub sent: Instant,
    /// When the modelled wire took the step's bytes, and when it was done with them.
    pub wire: (Instant, Instant),
    /// Its SendWait → stop on an idle wire: `latency + bytes / bandwidth`, jitter included.
    pub idle: Duration,
    /// Right before the stop call (v1–v3: SendDone).
    pub stop: Instant,
    /// Its op was reported as another process's (PXN, spec 4.3).
    pub pxn: bool,
}

impl StepTruth {
    /// How long it waited for the wire (the NIC's earlier transfers) after its SendWait.
    pub fn queue_wait(&self) -> Duration {
        self.wire.0.saturating_duration_since(self.sent)
    }
}

impl LinkTruth {
    pub fn transfers(&self) -> u64 {
        self.steps.len() as u64
    }

    pub fn bytes(&self) -> u64 {
        self.steps.iter().map(|s| s.bytes).sum()
    }

    /// Every transfer as (bytes, SendWait → stop seconds).
    pub fn samples(&self) -> Vec<(u64, f64)> {
        self.steps
            .iter()
            .map(|s| (s.bytes, (s.stop - s.sent).as_secs_f64()))
            .collect()
    }

    /// (latency s, bandwidth B/s) from the emulator's own timings, by the plugin's documented
    /// definitions (`docs/metrics.md`, "Links"; `AVG`), computed here independently.
    pub fn measured(&self) -> Option<(f64, f64)> {
        queue_figures(&self.steps, &self.others, false)
    }

    /// The same in `MIN` mode: the idle transfers' latency from each size's 10th percentile
    /// (nearest rank, at least the second fastest).
    pub fn measured_min(&self) -> Option<(f64, f64)> {
        queue_figures(&self.steps, &self.others, true)
    }

    /// Its transfers the plugin's definition takes as idle: they opened a busy period of the
    /// link, and no other transfer of the process was in flight at their SendWait.
    pub fn idle_steps(&self) -> Vec<StepTruth> {
        idle_steps(&self.steps, &self.others)
    }

    /// The wire's own rate: bytes over the time the model had them on the wire.
    pub fn wire_rate(&self) -> f64 {
        let secs: f64 = self.steps.iter().map(|s| (s.wire.1 - s.wire.0).as_secs_f64()).sum();
        self.bytes() as f64 / secs
    }

    /// The mean time from the wire being done with a step to its stop, over the steps that did
    /// not wait for the wire: the modelled latency, plus however late the emulator made those
    /// stop calls (a queued step's stop is as late as the queue makes the emulator).
    pub fn latency(&self) -> f64 {
        let unqueued: Vec<f64> = self
            .steps
            .iter()
            .filter(|s| s.wire.0 <= s.sent)
            .map(|s| s.stop.saturating_duration_since(s.wire.1).as_secs_f64())
            .collect();
        unqueued.iter().sum::<f64>() / unqueued.len().max(1) as f64
    }

    /// Bytes over the time at least one transfer was in flight (SendWait → stop).
    pub fn busy_throughput(&self) -> f64 {
        let mut spans: Vec<(Instant, Instant)> = self.steps.iter().map(|s| (s.sent, s.stop)).collect();
        spans.sort_by_key(|s| s.0);
        let mut busy = Duration::ZERO;
        let mut open: Option<(Instant, Instant)> = None;
        for (a, b) in spans {
            open = match open {
                Some((x, y)) if a < y => Some((x, y.max(b))),
                Some((x, y)) => {
                    busy += y - x;
                    Some((a, b))
                }
                None => Some((a, b)),
            };
        }
        busy += open.map_or(Duration::ZERO, |(x, y)| y - x);
        self.bytes() as f64 / busy.as_secs_f64()
    }
}

/// The link figures by the plugin's definitions, from the emulator's clock: a transfer that found
/// every earlier transfer of the link completed (opening a busy period) and none of `others` (the
/// process's other transfers) in flight is idle; those
/// handed over more than the 5th percentile of the times of the transfers opening a busy period
/// before the latest earlier completion queued behind a busy wire, and the gap between the link's
/// observations of completions (those less than 10 µs apart are one) is their wire time when no
/// other transfer of the process completed in or near it (clean).
/// Bandwidth from at least 4 clean ones, else the idle fit; latency the idle transfers' mean excess
/// over that rate (with `min`: the mean over sizes of each size's low percentile's excess), else
/// the fit's intercept.
pub fn queue_figures(steps: &[StepTruth], others: &[(Instant, Instant)], min: bool) -> Option<(f64, f64)> {
    let mut by_sent: Vec<&StepTruth> = steps.iter().collect();
    by_sent.sort_by_key(|s| (s.sent, s.stop));
    let before = latest_before(&by_sent);
    let secs = |d: Duration| d.as_secs_f64();
    let idle: Vec<(u64, f64)> = idle_steps(steps, others)
        .iter()
        .map(|s| (s.bytes, secs(s.stop - s.sent)))
        .collect();
    // The 5th percentile of the opening transfers' times (nearest rank), as documented.
    let mut times: Vec<f64> = by_sent
        .iter()
        .zip(&before)
        .filter(|(s, b)| b.is_none_or(|b| s.sent >= b))
        .map(|(s, _)| secs(s.stop - s.sent))
        .collect();
    times.sort_by(f64::total_cmp);
    let bound = times
        .get((times.len() as f64 * 0.05) as usize)
        .copied()
        .unwrap_or(f64::INFINITY);
    // Completions less than SAME_PASS apart are one observation of the proxy's. A gap runs from
    // the link's previous observation to the next one made of queued transfers (one that holds a
    // transfer not certain to have queued is no gap), and is clean when no other transfer of the
    // process completed within SAME_PASS of it.
    const SAME_PASS: Duration = Duration::from_micros(10);
    let mut other_stops: Vec<Instant> = others.iter().map(|o| o.1).collect();
    other_stops.sort_unstable();
    let clean = |after: Instant, stop: Instant| {
        let (from, to) = (after.checked_sub(SAME_PASS).unwrap_or(after), stop + SAME_PASS);
        other_stops
            .get(other_stops.partition_point(|&x| x < from))
            .is_none_or(|&x| x > to)
    };
    let mut gaps: Vec<(Instant, Instant, u64)> = Vec::new();
    let mut in_gap = false;
    for (s, b) in by_sent.iter().zip(&before) {
        let Some(b) = *b else {
            in_gap = false;
            continue;
        };
        let queued = b.saturating_duration_since(s.sent).as_secs_f64() > bound && s.stop > b;
        match (s.stop >= b && s.stop - b < SAME_PASS, queued) {
            (true, true) if in_gap => {
                let g = gaps.last_mut().expect("a gap");
                (g.1, g.2) = (s.stop, g.2 + s.bytes);
            }
            (true, _) => {
                if in_gap {
                    gaps.pop();
                }
                in_gap = false;
            }
            (false, true) => {
                gaps.push((b, s.stop, s.bytes));
                in_gap = true;
            }
            (false, false) => in_gap = false,
        }
    }
    let clean_gaps: Vec<(u64, f64)> = gaps
        .iter()
        .filter(|g| clean(g.0, g.1))
        .map(|&(after, stop, bytes)| (bytes, secs(stop - after)))
        .collect();
    let rate = (clean_gaps.len() >= 4)
        .then(|| clean_gaps.iter().map(|q| q.0 as f64).sum::<f64>() / clean_gaps.iter().map(|q| q.1).sum::<f64>());
    let idle_fit = fit(&idle);
    let bandwidth = rate.or(idle_fit.map(|f| f.1))?;
    let latency = match rate {
        Some(bw) if min => {
            let mut by_size: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
            idle.iter().for_each(|&(b, t)| by_size.entry(b).or_default().push(t));
            let excess: Vec<f64> = by_size
                .iter_mut()
                .map(|(&b, ts)| {
                    ts.sort_by(f64::total_cmp);
                    let rank = ((ts.len() as f64 * 0.1) as usize).max(usize::from(ts.len() >= 2));
                    ts[rank] - b as f64 / bw
                })
                .collect();
            (!excess.is_empty()).then(|| excess.iter().sum::<f64>() / excess.len() as f64)
        }
        Some(bw) => {
            let excess: f64 = idle.iter().map(|&(b, t)| t - b as f64 / bw).sum();
            (!idle.is_empty()).then(|| excess / idle.len() as f64)
        }
        None => idle_fit.map(|f| f.0),
    }
    .filter(|&l| l > 0.0)?;
    Some((latency, bandwidth))
}

/// The latest completion among the transfers handed over before each one (sorted by SendWait).
fn latest_before(by_sent: &[&StepTruth]) -> Vec<Option<Instant>> {
    by_sent
        .iter()
        .scan(None::<Instant>, |latest, s| {
            let prior = *latest;
            *latest = Some(prior.map_or(s.stop, |l| l.max(s.stop)));
            Some(prior)
        })
        .collect()
}

/// The transfers of `steps` that opened a busy period of the link with none of `others` in
/// flight (one handed over at the same instant counts as in flight).
pub fn idle_steps(steps: &[StepTruth], others: &[(Instant, Instant)]) -> Vec<StepTruth> {
    let mut by_sent: Vec<&StepTruth> = steps.iter().collect();
    by_sent.sort_by_key(|s| (s.sent, s.stop));
    let before = latest_before(&by_sent);
    let opens: Vec<bool> = by_sent
        .iter()
        .zip(&before)
        .map(|(s, b)| b.is_none_or(|b| s.sent >= b))
        .collect();
    let mut others = others.to_vec();
    others.sort_unstable();
    // The latest end among the others starting before each index.
    let ends: Vec<Instant> = others
        .iter()
        .scan(None::<Instant>, |m, &(_, b)| {
            *m = Some(m.map_or(b, |m| m.max(b)));
            *m
        })
        .collect();
    let company = |s: &StepTruth| {
        let n = others.partition_point(|&(a, _)| a <= s.sent);
        n > 0 && ends[n - 1] > s.sent
    };
    by_sent
        .iter()
        .zip(opens)
        .filter(|&(s, opens)| opens && !company(s))
        .map(|(s, _)| **s)
        .collect()
}

/// Everything between two world ranks, over all communicators.
#[derive(Clone, Debug)]
pub struct WorldLink {
    pub src: usize,
    pub dst: usize,
    pub configured: Link,
    /// Transfers over every communicator.
    pub transfers: u64,
    pub disturbed: u64,
}

/// What one [`super::Workload::run`] did.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Wall time from the first `init` to the last `finalize`.
    pub elapsed: Duration,
    /// Every Coll/P2p task, by (comm, rank, start).
    pub collectives: Vec<CollTruth>,
    /// Per (comm, rank, peer) with network sends.
    pub links: Vec<LinkTruth>,
    /// Plugin callbacks made.
    pub callbacks: u64,
    /// Network send steps emulated, and how many of them the host disturbed.
    pub steps: u64,
    pub disturbed: u64,
    /// The largest lateness of one transfer (see [`LinkTruth::max_late`]).
    pub max_late: Duration,
    /// GPU durations (ns) of the kernel phases delivered under accepted KernelCh (NCCL 2.31+),
    /// by phase: initial sync, compute, final sync.
    pub phases: [Vec<u64>; 3],
}

impl Report {
    /// The link of communicator `hash` from `rank` to `peer` (communicator ranks).
    pub fn link(&self, hash: u64, rank: i32, peer: i32) -> Option<&LinkTruth> {
        self.links
            .iter()
            .find(|l| l.hash == hash && l.rank == rank && l.peer == peer)
    }

    /// Links by world rank pair, merged over communicators, sorted by (src, dst).
    pub fn world_links(&self) -> Vec<WorldLink> {
        let mut m: BTreeMap<(usize, usize), WorldLink> = BTreeMap::new();
        for l in &self.links {
            let w = m.entry((l.src, l.dst)).or_insert_with(|| WorldLink {
                src: l.src,
                dst: l.dst,
                configured: l.configured,
                transfers: 0,
                disturbed: 0,
            });
            w.transfers += l.transfers();
            w.disturbed += l.disturbed;
        }
        m.into_values().collect()
    }

    /// Fraction of send steps the host disturbed.
    pub fn disturbed_fraction(&self) -> f64 {
        self.disturbed as f64 / self.steps.max(1) as f64
    }

    pub(crate) fn sort(&mut self) {
        self.collectives.sort_by_key(|c| (c.hash, c.rank, c.start));
        self.links.sort_by_key(|l| (l.hash, l.rank, l.peer));
        let spans = |l: &LinkTruth| l.steps.iter().map(|s| (s.sent, s.stop)).collect::<Vec<_>>();
        let all: Vec<(usize, Vec<(Instant, Instant)>)> = self.links.iter().map(|l| (l.src, spans(l))).collect();
        for (i, l) in self.links.iter_mut().enumerate() {
            l.others = all
                .iter()
                .enumerate()
                .filter(|&(j, (src, _))| j != i && *src == l.src)
                .flat_map(|(_, (_, s))| s.iter().copied())
                .collect();
        }
    }
}

/// Ordinary least squares of seconds on bytes: (latency = intercept, bandwidth = 1 / slope).
/// The emulator's own fit, independent of the plugin's.
pub fn fit(samples: &[(u64, f64)]) -> Option<(f64, f64)> {
    let n = samples.len() as f64;
    if samples.len() < 2 {
        return None;
    }
    let mx = samples.iter().map(|s| s.0 as f64).sum::<f64>() / n;
    let my = samples.iter().map(|s| s.1).sum::<f64>() / n;
    let (mut sxx, mut sxy) = (0.0, 0.0);
    for &(x, y) in samples {
        let dx = x as f64 - mx;
        sxx += dx * dx;
        sxy += dx * (y - my);
    }
    let slope = sxy / sxx;
    (sxx > 0.0 && slope > 0.0).then(|| (my - slope * mx, 1.0 / slope))
}

//! Soak with faults (issue 5, item 4): the built plugin, loaded like NCCL loads it, takes a
//! sustained high event rate from several communicators while its OTLP/HTTP collector cycles
//! healthy → hung → healthy → down → healthy … (the run always ends healthy).
//!
//! Per communicator an application thread (Group, Coll or P2p start and stop, as a blocking NCCL
//! call makes them) hands each operation to its proxy thread (send ProxyOps with InProgress and
//! ProxySteps with GPUWait, PeerWait, SendWait and stop; receive ProxyOps and steps, which the
//! plugin declines), paced to `SOAK_RATE` callbacks per second in total. A random eighth of all
//! callbacks is timed into per-phase histograms. "Hung" answers nothing (the export timeout
//! fires, the queue fills and drops); "down" closes the listening socket (connections refused).
//!
//! Checked at the end, from the emulator's own counts and the self-telemetry the plugin exports:
//! - callbacks: p50, p99, p99.9 of the hung and down phases stay within a ratio of the healthy
//!   phases of the same run, and no callback takes [`GROSS`] plus the worst scheduling stall a
//!   canary thread saw in its phase (the machine's own noise) or more;
//! - memory: RSS after the first cycle (warm-up) stays within [`RSS_BOUND`] of the warm-up's peak;
//! - no window wedges: every communicator's `windows.processed` grows across every phase, and no
//!   record is dropped for lack of room while the collector is faulty;
//! - every drop is counted: each callback the plugin records is recorded or dropped (exactly),
//!   each declined one is counted declined, nothing is rejected; export requests made = requests
//!   received + `export.failures` + `export.dropped` (within the interval timing's tolerance), and
//!   requests received = `export.sent` (less those in flight at the last collection);
//! - exports resume: a request with fresh data arrives within [`RESUME_BOUND`] of each healthy
//!   phase that follows a fault.
//!
//! `SOAK_SECONDS` (default 90) sets the length, phases scale with it. Run by `.ci/soak.sh` in
//! release; ignored by a plain `cargo test`. The per-phase table goes to stdout (`--nocapture`).

#[path = "support"]
mod support {
    pub mod emulator;
    pub mod otlp_receiver;
}

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver as Queue, SyncSender, sync_channel};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::emulator::plugin::{coll_descr, p2p_descr};
use support::emulator::{Comm, H, Plugin, pid, rss, ty};
use support::otlp_receiver::{ExportMetricsServiceRequest, Fault, Receiver, metric, metrics, points};

/// Export interval, seconds (`NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC`).
const INTERVAL: f64 = 0.25;
/// Export timeout, milliseconds (`NCCL_PROFILER_OTEL_TELEMETRY_BATCH_TIMEOUT_MS`).
const TIMEOUT_MS: u64 = 400;
/// Export requests that may wait (`NCCL_PROFILER_OTEL_EXPORT_QUEUE`).
const QUEUE: u64 = 4;
/// Record slots per window: four windows hold ~2 s of one communicator's records at the default
/// rate, so a telemetry thread stalled for longer than that would show as `full` drops.
const CAPACITY: u64 = 65536;
/// Communicators, each with an application and a proxy thread.
const COMMS: usize = 4;
/// Ranks per communicator (the emulated process is rank `i` of communicator `i`).
const NRANKS: i32 = 8;
/// Callbacks per second over all communicators, unless `SOAK_RATE` says otherwise.
const DEFAULT_RATE: u64 = 1_000_000;
/// One callback in this many is timed.
const SAMPLE_ONE_IN: u64 = 8;
/// No callback may take this long (beyond the canary's worst stall in its phase), whatever the
/// collector does: well under the export timeout, so a callback waiting for export would show.
const GROSS: Duration = Duration::from_millis(100);
/// Allowed growth of the peak RSS after the warm-up cycle over the warm-up's peak.
const RSS_BOUND: u64 = 16 << 20;
/// Longest wait for fresh data after the collector comes back: an interval, a hung request's
/// timeout, the queued stale requests, and slack for a loaded machine.
const RESUME_BOUND: Duration = Duration::from_millis(3000);
/// Allowed latency ratios of a faulty phase kind to the healthy phases: p50, p99, p99.9.
const RATIOS: [f64; 3] = [1.5, 2.0, 3.0];

/// What the collector does during a phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Healthy,
    Hung,
    Down,
}

impl Kind {
    fn fault(self) -> Fault {
        match self {
            Kind::Healthy => Fault::Healthy,
            Kind::Hung => Fault::Hang,
            Kind::Down => Fault::Refuse,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Kind::Healthy => "healthy",
            Kind::Hung => "hung",
            Kind::Down => "down",
        }
    }
}

/// The phases of a run of `secs` seconds: 4k + 1 phases (healthy, hung, healthy, down, …,
/// healthy) of 4 to 15 s each; the first cycle (4 phases) is the warm-up.
fn schedule(secs: f64) -> (Vec<Kind>, Duration) {
    let target = (secs / 9.0).clamp(4.0, 15.0);
    let cycles = ((secs / target - 1.0) / 4.0).round().max(1.0) as usize;
    let n = 4 * cycles + 1;
    let kinds = (0..n)
        .map(|i| match i % 4 {
            1 => Kind::Hung,
            3 => Kind::Down,
            _ => Kind::Healthy,
        })
        .collect();
    (kinds, Duration::from_secs_f64(secs / n as f64))
}

/// Environment variable `name` as a number, else `default`.
fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Nanoseconds since the Unix epoch (the clock of OTLP timestamps).
fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

// ---------------------------------------------------------------------------------------------
// Latency histograms and the per-thread probe.

/// Linear below 16 ns, then 16 sub-buckets per power of two (≤ 6.25 % error), up to 2^63 ns.
const BUCKETS: usize = 61 * 16;

fn bucket(ns: u64) -> usize {
    if ns < 16 {
        return ns as usize;
    }
    let e = 63 - ns.leading_zeros() as usize;
    (e - 3) * 16 + ((ns >> (e - 4)) & 15) as usize
}

/// Smallest value of bucket `b`.
fn bucket_low(b: usize) -> u64 {
    if b < 16 {
        return b as u64;
    }
    (16 + b as u64 % 16) << (b / 16 - 1)
}

/// Largest value of bucket `b`.
fn bucket_high(b: usize) -> u64 {
    if b + 1 >= BUCKETS {
        return u64::MAX;
    }
    bucket_low(b + 1) - 1
}

/// Callback latencies of one phase.
#[derive(Clone)]
struct Hist {
    counts: Vec<u64>,
    n: u64,
    max: u64,
}

impl Hist {
    fn new() -> Hist {
        Hist {
            counts: vec![0; BUCKETS],
            n: 0,
            max: 0,
        }
    }

    fn record(&mut self, ns: u64) {
        self.counts[bucket(ns).min(BUCKETS - 1)] += 1;
        self.n += 1;
        self.max = self.max.max(ns);
    }

    fn merge(&mut self, o: &Hist) {
        self.counts.iter_mut().zip(&o.counts).for_each(|(a, b)| *a += b);
        self.n += o.n;
        self.max = self.max.max(o.max);
    }

    /// The `q` quantile (bucket upper bound, at most the maximum); 0 when empty.
    fn quantile(&self, q: f64) -> u64 {
        let rank = ((q * self.n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return bucket_high(b).min(self.max);
            }
        }
        0
    }
}

/// Callbacks the emulator made, by the outcome the plugin's rules give them (known from the
/// event kind and the handles the plugin returned).
#[derive(Clone, Copy, Default, Debug)]
struct Outcomes {
    /// Stored in a window (starts of Coll, send P2p, send ProxyOp, ProxyStep under a handle;
    /// SendWait; stops): recorded or dropped.
    record: u64,
    /// Group starts, receive P2p and ProxyOps, ProxySteps without a parent handle.
    declined: u64,
    /// States the plugin ignores without a counter (InProgress, GPUWait, PeerWait) and Group stops.
    ignored: u64,
}

/// One thread's measurements: per phase the callbacks made and the timed ones' latencies.
struct Probe<'a> {
    phase: &'a AtomicUsize,
    rng: u64,
    /// Callbacks made, in all phases and per phase.
    total: u64,
    calls: Vec<u64>,
    hists: Vec<Hist>,
    outcomes: Outcomes,
}

impl<'a> Probe<'a> {
    fn new(phase: &'a AtomicUsize, phases: usize, seed: u64) -> Probe<'a> {
        Probe {
            phase,
            rng: seed | 1,
            total: 0,
            calls: vec![0; phases],
            hists: vec![Hist::new(); phases],
            outcomes: Outcomes::default(),
        }
    }

    /// Makes one callback, timing it with probability 1 / [`SAMPLE_ONE_IN`].
    #[inline]
    fn call<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let phase = self.phase.load(Ordering::Relaxed);
        self.calls[phase] += 1;
        self.total += 1;
        // xorshift64: cheap, and decorrelated from the callback sequence's period.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        if self.rng % SAMPLE_ONE_IN != 0 {
            return f();
        }
        let t = Instant::now();
        let r = f();
        self.hists[phase].record(t.elapsed().as_nanos() as u64);
        r
    }

    fn random(&mut self, n: u64) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % n
    }
}

// ---------------------------------------------------------------------------------------------
// The NCCL-like driver.

/// One operation handed from the application thread to the proxy thread.
struct Task {
    /// The Coll or send P2p handle (already stopped; NULL if the plugin dropped it).
    root: H,
    send_peer: i32,
    recv_peer: i32,
    channels: u8,
    steps: u32,
    step_bytes: u64,
}

/// What every driver thread shares.
struct Shared {
    phase: AtomicUsize,
    stop: AtomicBool,
    phases: usize,
    /// Callbacks per second per communicator.
    rate: f64,
}

/// Operation sizes in bytes (distinct step sizes give the link regression something to fit).
const SIZES: [u64; 4] = [64 << 10, 256 << 10, 1 << 20, 4 << 20];
const COLLS: [&std::ffi::CStr; 3] = [c"AllReduce", c"AllGather", c"ReduceScatter"];

/// The application thread of communicator `i`: three collectives and one Send/Recv group in
/// four, each handed to the proxy; paced so that this communicator's callbacks (its own and its
/// proxy's, `calls`) follow the rate.
fn app<'a>(p: &Plugin, c: Comm, tx: SyncSender<Task>, shared: &'a Shared, calls: &AtomicU64, i: usize) -> Probe<'a> {
    let mut probe = Probe::new(
        &shared.phase,
        shared.phases,
        0x9E37_79B9_7F4A_7C15 ^ (i as u64 + 1) << 32,
    );
    let start = Instant::now();
    let (succ, pred) = ((c.rank + 1) % NRANKS, (c.rank + NRANKS - 1) % NRANKS);
    let mut seq = [0u64; COLLS.len()];
    let mut k = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        let before = probe.total;
        let bytes = SIZES[probe.random(SIZES.len() as u64) as usize];
        let steps = 2 + probe.random(5) as u32;
        let group = probe.call(|| p.group(&c));
        probe.outcomes.declined += 1;
        let (root, channels) = if k % 4 == 3 {
            let mut send = p2p_descr(
                c.rank,
                group,
                c"Send".as_ptr(),
                c"ncclFloat32".as_ptr(),
                (bytes / 4) as usize,
                succ,
                1,
            );
            let mut recv = p2p_descr(
                c.rank,
                group,
                c"Recv".as_ptr(),
                c"ncclFloat32".as_ptr(),
                (bytes / 4) as usize,
                pred,
                1,
            );
            let s = probe.call(|| p.start(c.context, &mut send));
            let r = probe.call(|| p.start(c.context, &mut recv));
            probe.outcomes.record += 1;
            probe.outcomes.declined += 1;
            for h in [s, r] {
                if !h.is_null() {
                    probe.call(|| p.stop(h));
                    probe.outcomes.record += 1;
                }
            }
            (s, 1)
        } else {
            let f = probe.random(COLLS.len() as u64) as usize;
            let mut d = coll_descr(
                c.rank,
                group,
                COLLS[f].as_ptr(),
                c"RING".as_ptr(),
                c"SIMPLE".as_ptr(),
                c"ncclFloat32".as_ptr(),
                (bytes / 4) as usize,
                2,
                seq[f],
            );
            seq[f] += 1;
            let h = probe.call(|| p.start(c.context, &mut d));
            probe.outcomes.record += 1;
            if !h.is_null() {
                probe.call(|| p.stop(h));
                probe.outcomes.record += 1;
            }
            (h, 2)
        };
        let task = Task {
            root,
            send_peer: succ,
            recv_peer: pred,
            channels,
            steps,
            step_bytes: bytes / u64::from(channels) / u64::from(steps),
        };
        if !group.is_null() {
            probe.call(|| p.stop(group));
            probe.outcomes.ignored += 1;
        }
        calls.fetch_add(probe.total - before, Ordering::Relaxed);
        if tx.send(task).is_err() {
            break;
        }
        k += 1;
        if k % 16 == 0 {
            let due = start + Duration::from_secs_f64(calls.load(Ordering::Relaxed) as f64 / shared.rate);
            if let Some(ahead) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(ahead);
            }
        }
    }
    probe
}

/// The proxy thread of a communicator: per task and channel a send ProxyOp (InProgress, steps
/// with GPUWait, PeerWait, SendWait, stop) and a receive ProxyOp with its steps, as NCCL's proxy
/// progresses them (states and stops only for handles the plugin returned).
fn proxy<'a>(p: &Plugin, c: Comm, rx: Queue<Task>, shared: &'a Shared, calls: &AtomicU64, i: usize) -> Probe<'a> {
    let mut probe = Probe::new(
        &shared.phase,
        shared.phases,
        0xD1B5_4A32_D192_ED03 ^ (i as u64 + 1) << 40,
    );
    let me = pid();
    let mut handles = [H::NULL; 8];
    for t in rx {
        let before = probe.total;
        let n = t.steps as usize;
        for ch in 0..t.channels {
            let op = probe.call(|| p.proxy_op(c.context, t.root, me, c.rank, t.send_peer, ch, n as i32, true));
            probe.outcomes.record += 1;
            if !op.is_null() {
                probe.call(|| p.state(op, ty::OP_IN_PROGRESS, 0));
                probe.outcomes.ignored += 1;
            }
            for (s, h) in handles.iter_mut().enumerate().take(n) {
                *h = probe.call(|| p.proxy_step(c.context, op, c.rank, s as i32));
                if op.is_null() {
                    probe.outcomes.declined += 1;
                } else {
                    probe.outcomes.record += 1;
                }
            }
            for &h in handles.iter().take(n).filter(|h| !h.is_null()) {
                probe.call(|| p.state(h, ty::SEND_GPU_WAIT, 0));
                probe.call(|| p.state(h, ty::SEND_PEER_WAIT, 0));
                probe.call(|| p.state(h, ty::SEND_WAIT, t.step_bytes));
                // GPUWait is ignored; a step's first PeerWait is recorded.
                probe.outcomes.ignored += 1;
                probe.outcomes.record += 2;
            }
            for &h in handles.iter().take(n).filter(|h| !h.is_null()) {
                probe.call(|| p.stop(h));
                probe.outcomes.record += 1;
            }
            if !op.is_null() {
                probe.call(|| p.stop(op));
                probe.outcomes.record += 1;
            }
            // A receive op is recorded under our collective (declined without one); its steps
            // never are.
            let recv = probe.call(|| p.proxy_op(c.context, t.root, me, c.rank, t.recv_peer, ch, n as i32, false));
            if t.root.is_null() {
                probe.outcomes.declined += 1;
                assert!(recv.is_null(), "a receive ProxyOp without a collective got a handle");
            } else {
                probe.outcomes.record += 1;
            }
            if !recv.is_null() {
                probe.call(|| p.state(recv, ty::OP_IN_PROGRESS, 0));
                probe.outcomes.record += 1;
            }
            for s in 0..n {
                let h = probe.call(|| p.proxy_step(c.context, recv, c.rank, s as i32));
                probe.outcomes.declined += 1;
                assert!(h.is_null(), "a receive step got a handle");
            }
            if !recv.is_null() {
                probe.call(|| p.stop(recv));
                probe.outcomes.record += 1;
            }
        }
        calls.fetch_add(probe.total - before, Ordering::Relaxed);
    }
    probe
}

// ---------------------------------------------------------------------------------------------
// What the collector received.

/// The plugin's self-telemetry in one request (cumulative totals, summed over communicators).
#[derive(Clone, Debug, Default)]
struct Totals {
    recorded: u64,
    /// `events.dropped` by reason.
    dropped: BTreeMap<String, u64>,
    rejected: u64,
    declined: u64,
    windows: u64,
    /// `windows.processed` by communicator hash.
    windows_by_comm: BTreeMap<String, u64>,
    windows_forced: u64,
    windows_dropped: u64,
    unfinished: u64,
    orphaned: u64,
    panics: u64,
    failures: u64,
    export_dropped: u64,
    sent: u64,
    overflow: u64,
}

impl Totals {
    fn drops(&self) -> u64 {
        self.dropped.values().sum()
    }
}

/// One received request, reduced to what the checks need (requests are not kept: memory).
#[derive(Clone, Debug)]
struct Snap {
    /// Collection time (the data points' `time_unix_nano`).
    collected: u64,
    totals: Totals,
}

fn snap(req: &ExportMetricsServiceRequest) -> Snap {
    let mut t = Totals::default();
    let mut collected = 0;
    for m in metrics(std::slice::from_ref(req)) {
        if let Some(metric::Data::Sum(s)) = &m.data {
            collected = s.data_points.iter().map(|p| p.time_unix_nano).fold(collected, u64::max);
        }
        for p in points(m) {
            let v = p.value as u64;
            match m.name.as_str() {
                "nccl.profiler.events.recorded" => t.recorded += v,
                "nccl.profiler.events.dropped" => {
                    *t.dropped.entry(p.attrs["nccl.reason"].clone()).or_default() += v;
                }
                "nccl.profiler.events.rejected" => t.rejected += v,
                "nccl.profiler.events.declined" => t.declined += v,
                "nccl.profiler.events.unfinished" => t.unfinished += v,
                "nccl.profiler.events.orphaned" => t.orphaned += v,
                "nccl.profiler.windows.processed" => {
                    t.windows += v;
                    *t.windows_by_comm.entry(p.attrs["nccl.comm.hash"].clone()).or_default() += v;
                }
                "nccl.profiler.windows.forced" => t.windows_forced += v,
                "nccl.profiler.windows.dropped" => t.windows_dropped += v,
                "nccl.profiler.panics" => t.panics += v,
                "nccl.profiler.export.failures" => t.failures += v,
                "nccl.profiler.export.dropped" => t.export_dropped += v,
                "nccl.profiler.export.sent" => t.sent += v,
                "nccl.profiler.cardinality.overflow" => t.overflow += v,
                _ => {}
            }
        }
    }
    Snap { collected, totals: t }
}

/// One phase as it ran.
struct Phase {
    kind: Kind,
    start: Instant,
    start_ns: u64,
    end_ns: u64,
    secs: f64,
    /// Requests that arrived during the phase.
    received: u64,
    rss_max: u64,
    /// Healthy after a fault: time from the phase start to the first request with fresh data.
    resume: Option<Duration>,
}

/// Requests received so far, reduced; the phase they arrive in is credited.
fn harvest(rx: &Receiver, snaps: &mut Vec<Snap>, phase: Option<&mut Phase>) {
    let now = Instant::now();
    let new: Vec<Snap> = rx.take().iter().map(snap).collect();
    if let Some(ph) = phase {
        ph.received += new.len() as u64;
        if ph.kind == Kind::Healthy && ph.resume.is_none() {
            let before = snaps.iter().map(|s| s.totals.recorded).max().unwrap_or(0);
            if new
                .iter()
                .any(|s| s.collected >= ph.start_ns && s.totals.recorded > before)
            {
                ph.resume = Some(now - ph.start);
            }
        }
    }
    snaps.extend(new);
}

/// The snapshots bounding what a phase changed. Healthy: the first and the last collected
/// within it. Faulty (nothing arrives then): the last collected before it and the first after.
fn bracket<'s>(snaps: &'s [Snap], ph: &Phase) -> Option<(&'s Snap, &'s Snap)> {
    let (t, u) = (ph.start_ns, ph.end_ns);
    if ph.kind == Kind::Healthy {
        let mut inside = snaps.iter().filter(|s| (t..=u).contains(&s.collected));
        let first = inside.next()?;
        Some((first, inside.next_back().unwrap_or(first)))
    } else {
        let a = snaps.iter().filter(|s| s.collected <= t).max_by_key(|s| s.collected)?;
        let b = snaps.iter().filter(|s| s.collected >= u).min_by_key(|s| s.collected)?;
        Some((a, b))
    }
}

/// Sleeps 1 ms at a time until `stop`; returns per phase the worst oversleep: how long the
/// machine kept a ready thread from running (the noise the callback latencies also see).
fn canary(shared: &Shared) -> Vec<Duration> {
    let mut worst = vec![Duration::ZERO; shared.phases];
    while !shared.stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        std::thread::sleep(Duration::from_millis(1));
        let late = t.elapsed().saturating_sub(Duration::from_millis(1));
        let w = &mut worst[shared.phase.load(Ordering::Relaxed)];
        *w = (*w).max(late);
    }
    worst
}

/// CPU seconds this process's live threads have used, by thread name (numbered driver threads
/// together).
fn thread_cpu() -> BTreeMap<String, f64> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut out = BTreeMap::new();
    for task in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close].trim_end_matches(|c: char| c.is_ascii_digit() || c == '-');
        // After the name: state, then utime and stime are the 12th and 13th fields.
        let fields: Vec<f64> = stat[close + 1..]
            .split_whitespace()
            .skip(11)
            .take(2)
            .filter_map(|v| v.parse().ok())
            .collect();
        *out.entry(name.to_owned()).or_default() += fields.iter().sum::<f64>() / hz;
    }
    out
}

/// Collects failed checks, so that one run reports all of them.
#[derive(Default)]
struct Checks(Vec<String>);

impl Checks {
    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            let what = what();
            println!("FAILED: {what}");
            self.0.push(what);
        }
    }
}

// ---------------------------------------------------------------------------------------------

#[test]
#[ignore = "soak: run by .ci/soak.sh (release, SOAK_SECONDS, default 90)"]
fn soak_with_a_faulty_collector() {
    let secs: f64 = env_or("SOAK_SECONDS", 90.0);
    let rate: u64 = env_or("SOAK_RATE", DEFAULT_RATE);
    let (kinds, phase_len) = schedule(secs);
    let rx = Receiver::start();
    let vars = [
        ("NCCL_PROFILER_OTEL_TELEMETRY_ENDPOINT", rx.endpoint()),
        ("NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC", INTERVAL.to_string()),
        ("NCCL_PROFILER_OTEL_TELEMETRY_BATCH_TIMEOUT_MS", TIMEOUT_MS.to_string()),
        ("NCCL_PROFILER_OTEL_EXPORT_QUEUE", QUEUE.to_string()),
        ("NCCL_PROFILER_OTEL_WINDOW_CAPACITY", CAPACITY.to_string()),
    ];
    for (k, v) in &vars {
        // SAFETY: the only test of this binary that runs here; no other thread reads the
        // environment (the receiver's does not, and the plugin is not loaded yet).
        unsafe { std::env::set_var(k, v) };
    }
    let plugin = Plugin::load_built().expect("the built plugin");
    let comms: Vec<Comm> = (0..COMMS)
        .map(|i| {
            let name = format!("soak{i}");
            let (c, mask) = plugin.init(Some(&name), 0x50A4_0000_0000 + i as u64, 2, NRANKS, i as i32);
            assert!(!c.context.is_null(), "init gave no context");
            assert_eq!(
                mask, 0x105e,
                "default activation mask and CeColl (NCCL 2.30.7: KernelCh always on)"
            );
            c
        })
        .collect();
    let shared = Shared {
        phase: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        phases: kinds.len(),
        rate: rate as f64 / COMMS as f64,
    };
    let counters: Vec<AtomicU64> = (0..COMMS).map(|_| AtomicU64::new(0)).collect();
    println!(
        "soak: {secs} s, {} phases of {:.1} s, {COMMS} communicators, target {rate} callbacks/s, interval {INTERVAL} s, \
         timeout {TIMEOUT_MS} ms, queue {QUEUE}, window capacity {CAPACITY}",
        kinds.len(),
        phase_len.as_secs_f64()
    );

    // The run: drivers and the canary in the background, phases switched and requests and RSS
    // sampled here.
    let mut snaps: Vec<Snap> = Vec::new();
    let mut phases: Vec<Phase> = Vec::new();
    let mut rss_samples: Vec<(usize, u64)> = Vec::new();
    let mut cpu = BTreeMap::new();
    let run_start = Instant::now();
    let (probes, stalls) = std::thread::scope(|s| {
        let mut threads = Vec::new();
        for (i, &c) in comms.iter().enumerate() {
            let (tx, queue) = sync_channel::<Task>(256);
            let (p, sh, n) = (&plugin, &shared, &counters[i]);
            let app = std::thread::Builder::new()
                .name(format!("soak-app-{i}"))
                .spawn_scoped(s, move || app(p, c, tx, sh, n, i));
            let proxy = std::thread::Builder::new()
                .name(format!("soak-proxy-{i}"))
                .spawn_scoped(s, move || proxy(p, c, queue, sh, n, i));
            threads.extend([app.expect("spawn"), proxy.expect("spawn")]);
        }
        let canary = s.spawn(|| canary(&shared));
        for (i, &kind) in kinds.iter().enumerate() {
            rx.set_fault(kind.fault());
            let start = Instant::now();
            shared.phase.store(i, Ordering::Relaxed);
            phases.push(Phase {
                kind,
                start,
                start_ns: wall_ns(),
                end_ns: 0,
                secs: 0.0,
                received: 0,
                rss_max: 0,
                resume: None,
            });
            let ph = phases.last_mut().expect("a phase");
            let mut next_rss = start;
            while start.elapsed() < phase_len {
                std::thread::sleep(Duration::from_millis(50));
                harvest(&rx, &mut snaps, Some(&mut *ph));
                if Instant::now() >= next_rss {
                    let r = rss();
                    rss_samples.push((i, r));
                    ph.rss_max = ph.rss_max.max(r);
                    next_rss += Duration::from_millis(250);
                }
            }
            ph.end_ns = wall_ns();
            ph.secs = start.elapsed().as_secs_f64();
        }
        cpu = thread_cpu();
        shared.stop.store(true, Ordering::Relaxed);
        let probes: Vec<Probe<'_>> = threads.into_iter().map(|t| t.join().expect("driver thread")).collect();
        (probes, canary.join().expect("canary thread"))
    });
    let run_secs = run_start.elapsed().as_secs_f64();

    // Finalize, then wait for a request collected after the last finalize: the final totals.
    for c in &comms {
        plugin.finalize(c.context);
    }
    let finalized = wall_ns();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !snaps.iter().any(|s| s.collected >= finalized) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        harvest(&rx, &mut snaps, None);
    }
    plugin.close();
    snaps.sort_by_key(|s| s.collected);
    let last = snaps.last().expect("no request arrived").clone();
    assert!(
        last.collected >= finalized,
        "no request collected after the last finalize"
    );
    let total = &last.totals;

    // Per-phase latencies and callbacks, merged over threads; what the emulator emitted.
    let mut hists = vec![Hist::new(); phases.len()];
    let mut calls = vec![0u64; phases.len()];
    let mut emitted = Outcomes::default();
    for p in &probes {
        for (i, h) in p.hists.iter().enumerate() {
            hists[i].merge(h);
            calls[i] += p.calls[i];
        }
        emitted.record += p.outcomes.record;
        emitted.declined += p.outcomes.declined;
        emitted.ignored += p.outcomes.ignored;
    }
    let all_calls: u64 = calls.iter().sum();
    let deltas: Vec<Option<(&Totals, &Totals)>> = phases
        .iter()
        .map(|ph| bracket(&snaps, ph).map(|(a, b)| (&a.totals, &b.totals)))
        .collect();
    let full = |t: &Totals| t.dropped.get("full").copied().unwrap_or(0);

    // The table.
    println!(
        "\n{:>3} {:<7} {:>5} {:>10} {:>5} {:>5} {:>5} {:>6} {:>9} {:>6} {:>7} {:>7} {:>5} {:>5} {:>5} {:>6} {:>6}",
        "#",
        "phase",
        "s",
        "callbacks",
        "M/s",
        "p50",
        "p99",
        "p99.9",
        "max ns",
        "stall",
        "RSS MiB",
        "windows",
        "recv",
        "fail",
        "qdrop",
        "evdrop",
        "resume"
    );
    for (i, ph) in phases.iter().enumerate() {
        let h = &hists[i];
        let d = |f: fn(&Totals) -> u64| deltas[i].map_or("?".to_owned(), |(a, b)| (f(b) - f(a)).to_string());
        println!(
            "{:>3} {:<7} {:>5.1} {:>10} {:>5.2} {:>5} {:>5} {:>6} {:>9} {:>6.1} {:>7.1} {:>7} {:>5} {:>5} {:>5} {:>6} {:>6}",
            i,
            ph.kind.name(),
            ph.secs,
            calls[i],
            calls[i] as f64 / ph.secs / 1e6,
            h.quantile(0.5),
            h.quantile(0.99),
            h.quantile(0.999),
            h.max,
            stalls[i].as_secs_f64() * 1e3,
            ph.rss_max as f64 / (1 << 20) as f64,
            d(|t| t.windows),
            ph.received,
            d(|t| t.failures),
            d(|t| t.export_dropped),
            d(Totals::drops),
            ph.resume.map_or("-".to_owned(), |r| format!("{:.2}s", r.as_secs_f64())),
        );
    }
    println!(
        "\np50…max: callback latency in ns (one callback in {SAMPLE_ONE_IN} timed); stall: the canary's worst 1 ms \
         oversleep in ms (machine noise); windows, fail (export.failures), qdrop (export.dropped), evdrop \
         (events.dropped): change from the first to the last request collected within a healthy phase, from the \
         last before to the first after a faulty one; recv: requests arrived; resume: phase start to the first \
         request with fresh data"
    );
    println!(
        "totals: {all_calls} callbacks in {run_secs:.1} s ({:.2} M/s), {} timed; emitted: {} recordable, {} declined, \
         {} ignored; plugin: {} recorded, dropped {:?}, {} declined, {} rejected, {} panics; windows {} processed, \
         {} forced, {} dropped; {} unfinished, {} orphaned; export: {} requests received, {} failures, {} dropped; \
         overflow {}",
        all_calls as f64 / run_secs / 1e6,
        hists.iter().map(|h| h.n).sum::<u64>(),
        emitted.record,
        emitted.declined,
        emitted.ignored,
        total.recorded,
        total.dropped,
        total.declined,
        total.rejected,
        total.panics,
        total.windows,
        total.windows_forced,
        total.windows_dropped,
        total.unfinished,
        total.orphaned,
        snaps.len(),
        total.failures,
        total.export_dropped,
        total.overflow,
    );
    let cpu: Vec<String> = cpu
        .iter()
        .filter(|(_, secs)| **secs >= 0.05)
        .map(|(name, secs)| format!("{name} {secs:.1} s ({:.1} %)", 100.0 * secs / run_secs))
        .collect();
    println!("CPU time by thread (share of one core): {}", cpu.join(", "));
    let mut checks = Checks::default();

    // Callback latency: each faulty kind's phases pooled against the healthy phases after the
    // first (warm-up); no callback slower than the gross bound plus the machine's own stalls.
    let pooled = |kind: Kind| {
        let mut h = Hist::new();
        (1..phases.len())
            .filter(|&i| phases[i].kind == kind)
            .for_each(|i| h.merge(&hists[i]));
        h
    };
    let healthy = pooled(Kind::Healthy);
    let qs = [0.5, 0.99, 0.999];
    for kind in [Kind::Hung, Kind::Down] {
        let h = pooled(kind);
        let ratios: Vec<f64> = qs
            .iter()
            .map(|&q| h.quantile(q) as f64 / healthy.quantile(q).max(1) as f64)
            .collect();
        println!(
            "latency {} / healthy: p50 {:.2}, p99 {:.2}, p99.9 {:.2} (allowed {RATIOS:?})",
            kind.name(),
            ratios[0],
            ratios[1],
            ratios[2]
        );
        for ((r, allowed), q) in ratios.iter().zip(RATIOS).zip(qs) {
            checks.check(*r <= allowed, || {
                format!(
                    "{} phases: latency quantile {q} is {r:.2}x the healthy one",
                    kind.name()
                )
            });
        }
    }
    for (i, h) in hists.iter().enumerate() {
        checks.check(h.n > 1000, || format!("phase {i}: only {} callbacks timed", h.n));
        let bound = GROSS + stalls[i];
        checks.check(Duration::from_nanos(h.max) < bound, || {
            format!(
                "phase {i} ({}): a callback took {} ns (bound {bound:?})",
                phases[i].kind.name(),
                h.max
            )
        });
    }

    // Memory: flat after the warm-up cycle.
    let peak = |warm: bool| {
        rss_samples
            .iter()
            .filter(|(i, _)| (*i < 4) == warm)
            .map(|(_, r)| *r)
            .max()
            .unwrap_or(0)
    };
    let (warm, after) = (peak(true), peak(false));
    println!(
        "RSS: warm-up peak {:.1} MiB, later peak {:.1} MiB (allowed +{} MiB)",
        warm as f64 / (1 << 20) as f64,
        after as f64 / (1 << 20) as f64,
        RSS_BOUND >> 20
    );
    checks.check(after <= warm + RSS_BOUND, || {
        format!("RSS grew from {warm} to {after} bytes after the warm-up")
    });

    // No wedged window: every communicator's windows advance in every phase, and no record is
    // dropped for lack of room while the collector is faulty.
    let min_windows = (phase_len.as_secs_f64() / INTERVAL / 4.0) as u64;
    for (i, ph) in phases.iter().enumerate() {
        let Some((a, b)) = deltas[i] else {
            checks.check(false, || format!("phase {i}: no requests bound it"));
            continue;
        };
        checks.check(b.windows_by_comm.len() == COMMS, || {
            format!("phase {i}: windows of {} communicators", b.windows_by_comm.len())
        });
        for (hash, &w) in &b.windows_by_comm {
            let moved = w - a.windows_by_comm.get(hash).copied().unwrap_or(0);
            checks.check(moved >= min_windows, || {
                format!("phase {i}: communicator {hash} processed {moved} windows (< {min_windows})")
            });
        }
        if ph.kind != Kind::Healthy {
            let dropped = full(b) - full(a);
            checks.check(dropped == 0, || {
                format!(
                    "phase {i} ({}): {dropped} records dropped for lack of room",
                    ph.kind.name()
                )
            });
        }
    }

    // Every drop is counted: each recordable callback recorded or dropped, each declined one
    // counted (exact: the totals were collected after the last finalize).
    checks.check(total.windows_dropped == 0, || {
        format!(
            "{} window summaries dropped: their records are in no counter",
            total.windows_dropped
        )
    });
    checks.check(emitted.record == total.recorded + total.drops(), || {
        format!(
            "{} recordable callbacks, {} recorded + {:?} dropped",
            emitted.record, total.recorded, total.dropped
        )
    });
    checks.check(emitted.declined == total.declined, || {
        format!("{} declined callbacks, {} counted", emitted.declined, total.declined)
    });
    checks.check((total.rejected, total.panics, total.overflow) == (0, 0, 0), || {
        format!(
            "rejected {}, panics {}, overflow {}",
            total.rejected, total.panics, total.overflow
        )
    });

    // Export requests: one per interval plus the last finalize's; each received, failed or
    // dropped. The period is the mean gap between consecutive healthy collections (the
    // telemetry thread's 10 ms tick rounds the interval up); QUEUE + 1 requests may still wait or
    // be in flight when the totals were collected.
    let gaps: Vec<u64> = snaps
        .windows(2)
        .map(|w| w[1].collected.saturating_sub(w[0].collected))
        .filter(|&g| g > 0 && g < 2 * (INTERVAL * 1e9) as u64)
        .collect();
    let period = gaps.iter().sum::<u64>() as f64 / 1e9 / gaps.len().max(1) as f64;
    let made = (last.collected - phases[0].start_ns) as f64 / 1e9 / period;
    let accounted = (snaps.len() as u64 + total.failures + total.export_dropped) as f64;
    println!(
        "export requests: ~{made:.0} made (period {period:.3} s), {accounted} accounted for ({} received, {} failed, {} \
         dropped)",
        snaps.len(),
        total.failures,
        total.export_dropped
    );
    checks.check(
        accounted >= made * 0.97 - (QUEUE + 2) as f64 && accounted <= made * 1.03 + 2.0,
        || format!("export requests: ~{made:.0} made, {accounted} received, failed or dropped"),
    );
    // Requests the plugin counts as accepted (`export.sent`) are the ones the collector kept: the
    // last request's count covers every earlier one, less those still in flight or queued when it
    // was collected.
    let received = snaps.len() as u64;
    println!(
        "export requests: {received} received, {} counted sent before the last",
        total.sent
    );
    checks.check(total.sent < received && total.sent + QUEUE + 2 >= received, || {
        format!(
            "{received} requests received, but the last one counts {} sent before it",
            total.sent
        )
    });
    checks.check(total.export_dropped > 0, || {
        "a hung collector never made the queue drop".to_owned()
    });

    // Faults are counted, and exports resume after each.
    for (i, ph) in phases.iter().enumerate() {
        if let (Kind::Hung | Kind::Down, Some((a, b))) = (ph.kind, deltas[i]) {
            let failed = b.failures + b.export_dropped - a.failures - a.export_dropped;
            let least = (ph.secs / period * 0.5) as u64;
            checks.check(failed >= least, || {
                format!(
                    "phase {i} ({}): {failed} failed or dropped requests (< {least})",
                    ph.kind.name()
                )
            });
        }
        if i > 0 && ph.kind == Kind::Healthy {
            checks.check(ph.resume.is_some_and(|r| r <= RESUME_BOUND), || {
                format!(
                    "phase {i}: exports resumed after {:?} (bound {RESUME_BOUND:?})",
                    ph.resume
                )
            });
        }
    }
    assert!(
        checks.0.is_empty(),
        "{} checks failed:\n{}",
        checks.0.len(),
        checks.0.join("\n")
    );
}

#[test]
fn latency_buckets_cover_every_value_once() {
    for b in 0..BUCKETS - 1 {
        assert_eq!(bucket(bucket_low(b)), b);
        assert_eq!(bucket(bucket_high(b)), b);
        assert_eq!(bucket_high(b) + 1, bucket_low(b + 1));
    }
    assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    let mut h = Hist::new();
    (1..=1000).for_each(|ns| h.record(ns));
    let p50 = h.quantile(0.5);
    assert!((500..=500 + 500 / 16).contains(&p50), "{p50}");
    assert_eq!(h.quantile(1.0), 1000);
}

//! Shared by the export tests (`tests/export/`): a scripted workload driven through the real exported table,
//! its ground truth, and the checks of what a receiver decoded against it.
//!
//! The workload on one communicator (rank 0 of 4):
//! - `COLLS` AllReduce (RING, SIMPLE, ncclFloat32, 1024 elements = 4096 B), each with one send
//!   ProxyOp to peer 1 on channel `i % 2` and one step of each size in `COLL_STEPS`;
//! - `P2PS` sends to peer 2 (ncclFloat64, 256 elements = 2048 B), each with one ProxyOp on channel 2
//!   and one step of each size in `P2P_STEPS`, and one kernel channel of `P2P_GPU_NS`;
//! - one AllGather (TREE, LL, ncclInt8, 512 B per rank: 2 KiB in nccl-tests' terms) without
//!   proxy ops (no transfers, no host time), with one kernel channel of `GATHER_GPU_NS`;
//! - one stop with a stale handle.
//!
//! Every step's SendWait → stop time is spun to `LATENCY + bytes / BANDWIDTH`; the workload times
//! each step itself ([`disturbed`]), so a link whose transfers the host stretched is not held to
//! the spun model.
//!
//! Also [`run_child`], the workload of a child process (`super::process::child`), and [`SERIAL`]:
//! the export tests run one at a time.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::emulator::{self, H, Plugin, ty};
use super::otlp_receiver::{self as rx, ExportMetricsServiceRequest, Point};
use super::process;
use parking_lot::{Mutex, MutexGuard};

/// Taken by every export test: the callback and flush bounds assume that no other test's threads
/// or child processes share the machine's (two) cores.
pub static SERIAL: Mutex<()> = Mutex::new(());

/// The start of an export test: [`SERIAL`] taken; `None` in a child process of another test
/// (`process::child`), where the test does nothing.
pub fn serial() -> Option<MutexGuard<'static, ()>> {
    (!process::is_child()).then(|| SERIAL.lock())
}

/// The start of an export test that configures the in-process plugin (read once per process):
/// [`serial`], then test `name` of `module` runs in a process of its own. `Some` in that process,
/// which runs the test's body; `None` in the process that waited for it.
pub fn own_process(module: &str, name: &str) -> Option<MutexGuard<'static, ()>> {
    let serial = serial()?;
    process::own_process(module, name).then_some(serial)
}

pub const COLLS: u64 = 12;
pub const P2PS: u64 = 4;
pub const COLL_STEPS: [u64; 3] = [64 << 10, 256 << 10, 1 << 20];
pub const P2P_STEPS: [u64; 2] = [128 << 10, 512 << 10];
pub const LATENCY: f64 = 20e-6;
pub const BANDWIDTH: f64 = 2e9;
pub const NRANKS: i32 = 4;
pub const P2P_GPU_NS: u64 = 20_000;
pub const GATHER_GPU_NS: u64 = 50_000;

/// The communicator the workload ran on.
#[derive(Clone, Debug)]
pub struct Truth {
    pub hash: u64,
    pub name: &'static str,
    pub rank: i32,
}

/// What [`check`] and the golden export read beyond the defaults: classic histograms (the
/// catalogue's buckets) and every family (the channel and transfer ones too). In [`base_env`],
/// and in the environment of the export tests' child processes.
pub const DETAILED: [(&str, &str); 2] = [
    (
        "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION",
        "explicit_bucket_histogram",
    ),
    ("NCCL_PROFILER_OTEL_DETAIL", "full"),
];

/// Sets the environment every export test shares (call once, before the first `init`): the
/// launcher's and the user's identity variables removed (a machine that runs the tests under
/// Slurm, torchrun or in a pod would rename the service the tests expect), [`DETAILED`], then
/// `extra`.
///
/// # Safety
/// No other thread may read or write the environment meanwhile.
pub unsafe fn base_env(extra: &[(&str, &str)]) {
    use nccl_profiler_otel::config::vars::{IN_KUBERNETES, LAUNCHER, otel};
    let identity = LAUNCHER.iter().map(|v| v.name);
    for k in identity.chain([IN_KUBERNETES, otel::RESOURCE_ATTRIBUTES, otel::SERVICE_NAME]) {
        // SAFETY: the caller guarantees no concurrent environment access.
        unsafe { std::env::remove_var(k) };
    }
    let defaults = [
        ("NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC", "0.2"),
        ("NCCL_PROFILER_OTEL_WINDOW_CAPACITY", "4096"),
        ("NCCL_PROFILER_OTEL_WINDOW_COUNT_TRIGGER", "2048"),
        ("NCCL_PROFILER_LINEAR_REGRESSION_MODE", "MIN"),
    ];
    for (k, v) in defaults.iter().chain(&DETAILED).chain(extra) {
        // SAFETY: the caller guarantees no concurrent environment access.
        unsafe { std::env::set_var(k, v) };
    }
}

fn transfer(bytes: u64) -> Duration {
    Duration::from_secs_f64(LATENCY + bytes as f64 / BANDWIDTH)
}

/// How much longer than spun a step may take, by the workload's own clock (its callbacks
/// included), before it counts as stretched by the host.
const STRETCH: Duration = Duration::from_micros(25);

/// How much longer than spun each step of the workloads run in this process took, by link
/// (communicator hash, peer) and size.
static EXCESS: Mutex<BTreeMap<(u64, i32, u64), Vec<Duration>>> = Mutex::new(BTreeMap::new());

/// Whether this process ran the workload of `hash` and the host stretched the steps to `peer`
/// that the fit rests on: for some size, its second fastest step (the low percentile `MIN` mode
/// fits) took [`STRETCH`] longer than spun. Then the link's figures reflect the host, not the
/// spun model. `false` when another process ran the workload.
pub fn disturbed(hash: u64, peer: i32) -> bool {
    EXCESS
        .lock()
        .iter()
        .filter(|((h, p, _), _)| (*h, *p) == (hash, peer))
        .any(|(_, excess)| {
            let mut sorted = excess.clone();
            sorted.sort_unstable();
            sorted.get(1).or(sorted.first()).is_some_and(|&e| e > STRETCH)
        })
}

/// One send step, timed by the workload ([`disturbed`]).
fn timed_step(p: &Plugin, c: &emulator::Comm, (hash, peer): (u64, i32), op: H, step: usize, bytes: u64, waits: u32) {
    let t0 = Instant::now();
    p.send_step(c.context, op, 0, step as i32, bytes, waits, transfer(bytes));
    let excess = t0.elapsed().saturating_sub(transfer(bytes));
    EXCESS.lock().entry((hash, peer, bytes)).or_default().push(excess);
}

/// Runs the scripted workload on a new communicator; does not finalize it.
pub fn workload(p: &Plugin, hash: u64, name: &'static str) -> (emulator::Comm, Truth) {
    let (c, mask) = p.init(Some(name), hash, 1, NRANKS, 0);
    assert!(!c.context.is_null(), "init gave no context");
    assert_ne!(mask, 0);
    for i in 0..COLLS {
        let coll = p.coll(&c, H::NULL, "AllReduce", "RING", "SIMPLE", "ncclFloat32", 1024, 2, i);
        p.stop(coll);
        let op = p.proxy_op(
            c.context,
            coll,
            emulator::pid(),
            0,
            1,
            (i % 2) as u8,
            COLL_STEPS.len() as i32,
            true,
        );
        p.state(op, ty::OP_IN_PROGRESS, 0);
        for (s, &bytes) in COLL_STEPS.iter().enumerate() {
            timed_step(p, &c, (hash, 1), op, s, bytes, 1);
        }
        p.stop(op);
    }
    for _ in 0..P2PS {
        let send = p.p2p(&c, H::NULL, "Send", "ncclFloat64", 256, 2);
        p.stop(send);
        let op = p.proxy_op(c.context, send, emulator::pid(), 0, 2, 2, P2P_STEPS.len() as i32, true);
        for (s, &bytes) in P2P_STEPS.iter().enumerate() {
            timed_step(p, &c, (hash, 2), op, s, bytes, 0);
        }
        p.stop(op);
        kernel_channel(p, &c, send, 2_000_000, P2P_GPU_NS);
    }
    let gather = p.coll(&c, H::NULL, "AllGather", "TREE", "LL", "ncclInt8", 512, 1, 0);
    p.stop(gather);
    kernel_channel(p, &c, gather, 1_000_000, GATHER_GPU_NS);
    p.stop(H(0x4242 as *mut _));
    let truth = Truth { hash, name, rank: 0 };
    (c, truth)
}

/// One kernel channel of `parent` on channel 0 that ran `ns` on the GPU from `gpu_start`.
fn kernel_channel(p: &Plugin, c: &emulator::Comm, parent: H, gpu_start: u64, ns: u64) {
    let k = p.kernel_ch(c.context, parent, 0, gpu_start);
    p.state(k, ty::KERNEL_CH_STOP, gpu_start + ns);
    p.stop(k);
}

/// Records the workload's callbacks store: per Coll/P2p start + stop, per ProxyOp start + stop,
/// per step start + SendWait + stop (and its first PeerWait: collective steps have one), per
/// kernel channel start + KernelChStop + stop (GPUWait and a send op's InProgress are not
/// recorded).
pub fn records() -> u64 {
    let coll = 4 + 4 * COLL_STEPS.len() as u64;
    let p2p = 4 + 3 * P2P_STEPS.len() as u64 + 3;
    COLLS * coll + P2PS * p2p + 2 + 3
}

impl Truth {
    pub fn hash_attr(&self) -> String {
        format!("{:#x}", self.hash)
    }

    /// The communicator's attributes.
    pub fn comm(&self) -> BTreeMap<String, String> {
        [
            ("nccl.comm.hash", self.hash_attr()),
            ("nccl.comm.name", self.name.to_owned()),
            ("nccl.rank", self.rank.to_string()),
            ("nccl.nranks", NRANKS.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    fn with(&self, extra: &[(&str, &str)]) -> BTreeMap<String, String> {
        let mut m = self.comm();
        m.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        m
    }

    pub fn allreduce(&self) -> BTreeMap<String, String> {
        self.with(&[
            ("nccl.func", "AllReduce"),
            ("nccl.algo", "RING"),
            ("nccl.proto", "SIMPLE"),
            ("nccl.datatype", "ncclFloat32"),
            ("nccl.size_class", "4KiB"),
        ])
    }

    pub fn allgather(&self) -> BTreeMap<String, String> {
        self.with(&[
            ("nccl.func", "AllGather"),
            ("nccl.algo", "TREE"),
            ("nccl.proto", "LL"),
            ("nccl.datatype", "ncclInt8"),
            ("nccl.size_class", "2KiB"),
        ])
    }

    pub fn send(&self) -> BTreeMap<String, String> {
        self.with(&[
            ("nccl.func", "Send"),
            ("nccl.peer", "2"),
            ("nccl.datatype", "ncclFloat64"),
            ("nccl.size_class", "2KiB"),
        ])
    }

    pub fn link(&self, peer: i32) -> BTreeMap<String, String> {
        let peer = peer.to_string();
        self.with(&[("nccl.peer", peer.as_str())])
    }

    pub fn channel(&self, channel: u8) -> BTreeMap<String, String> {
        let channel = channel.to_string();
        self.with(&[("nccl.channel", channel.as_str())])
    }
}

/// Sums the points of `name` whose attributes are exactly `attrs`, over `reqs` when the metric
/// is delta, or takes the latest when cumulative: (value or histogram sum, histogram count).
pub fn total(reqs: &[ExportMetricsServiceRequest], name: &str, attrs: &BTreeMap<String, String>) -> (f64, u64) {
    let mut value = 0.0;
    let mut count = 0;
    let mut delta = false;
    let mut latest = None;
    for m in rx::metrics(reqs).into_iter().filter(|m| m.name == name) {
        delta = rx::kind(m).contains("temporality=1");
        for p in rx::points(m).into_iter().filter(|p| &p.attrs == attrs) {
            value += p.value;
            count += p.count;
            latest = Some((p.value, p.count));
        }
    }
    if delta {
        (value, count)
    } else {
        latest.unwrap_or((0.0, 0))
    }
}

/// The latest point of `name` with exactly `attrs`.
pub fn latest(reqs: &[ExportMetricsServiceRequest], name: &str, attrs: &BTreeMap<String, String>) -> Option<Point> {
    rx::metrics(reqs)
        .into_iter()
        .rev()
        .filter(|m| m.name == name)
        .find_map(|m| rx::points(m).into_iter().find(|p| &p.attrs == attrs))
}

/// The body of a child-process test started by `super::process::child`: when `var` is `case`, drives
/// [`workload`] (`hash`, `name`) through the in-process plugin, finalizes it and returns `true`;
/// in any other process (the parent's own run of the test) does nothing and returns `false`.
pub fn run_child(var: &str, case: &str, hash: u64, name: &'static str) -> bool {
    if std::env::var(var).as_deref() != Ok(case) {
        return false;
    }
    let p = Plugin::in_process();
    let (c, _) = workload(&p, hash, name);
    p.finalize(c.context);
    true
}

/// Every request `receiver` saw was OTLP/HTTP protobuf posted to `/v1/metrics`.
pub fn assert_protobuf_to_v1_metrics(receiver: &rx::Receiver) {
    let seen = receiver.seen();
    assert!(
        seen.iter()
            .all(|(ct, path)| ct == "application/x-protobuf" && path == "/v1/metrics"),
        "{seen:?}"
    );
}

/// Runs the workload on a new communicator and finalizes it (the process's last one: its data is
/// exported before `finalize` returns); asserts that everything arrived at `rx` and matches the
/// truth, and returns what arrived.
pub fn finalized_workload(
    p: &Plugin,
    rx: &rx::Receiver,
    hash: u64,
    name: &'static str,
) -> (Vec<ExportMetricsServiceRequest>, Truth) {
    let (c, truth) = workload(p, hash, name);
    p.finalize(c.context);
    let reqs = rx.requests();
    assert!(
        complete(&reqs, &truth),
        "the last finalize returned before its data arrived"
    );
    check(&reqs, &truth);
    (reqs, truth)
}

/// Whether everything the workload on `t` produced has arrived (link bytes complete).
pub fn complete(reqs: &[ExportMetricsServiceRequest], t: &Truth) -> bool {
    let want = (COLLS * COLL_STEPS.iter().sum::<u64>()) as f64;
    total(reqs, "nccl.link.bytes", &t.link(1)).0 == want
        && total(reqs, "nccl.p2p.bytes", &t.send()).1 == P2PS
        && total(reqs, "nccl.coll.bytes", &t.allgather()).1 == 1
}

/// Asserts every metric of the workload on `t` against its ground truth.
pub fn check(reqs: &[ExportMetricsServiceRequest], t: &Truth) {
    let close = |got: f64, want: f64, what: &str| {
        assert!(
            (got - want).abs() <= 1e-9 * want.abs().max(1.0),
            "{what}: got {got}, want {want}"
        );
    };
    let coll_bytes_per_op = 4096.0;
    let coll_step_bytes: u64 = COLL_STEPS.iter().sum();
    let p2p_step_bytes: u64 = P2P_STEPS.iter().sum();
    let ar = t.allreduce();

    // Collectives.
    let (sum, count) = total(reqs, "nccl.coll.bytes", &ar);
    assert_eq!(count, COLLS, "AllReduce count");
    close(sum, COLLS as f64 * coll_bytes_per_op, "AllReduce bytes");
    let (sum, count) = total(reqs, "nccl.coll.transfers", &ar);
    assert_eq!(count, COLLS);
    close(sum, (COLLS * COLL_STEPS.len() as u64) as f64, "AllReduce transfers");
    let (sum, count) = total(reqs, "nccl.coll.transfer.size", &ar);
    assert_eq!(count, COLLS * COLL_STEPS.len() as u64);
    close(sum, (COLLS * coll_step_bytes) as f64, "AllReduce transfer bytes");
    let (sum, count) = total(reqs, "nccl.coll.transfer.duration", &ar);
    assert_eq!(count, COLLS * COLL_STEPS.len() as u64);
    let ideal: f64 = COLL_STEPS.iter().map(|&b| LATENCY + b as f64 / BANDWIDTH).sum::<f64>() * COLLS as f64;
    assert!(
        sum >= ideal && sum < ideal * 3.0 + 0.05,
        "transfer time {sum} vs spun {ideal}"
    );
    let (sum, count) = total(reqs, "nccl.coll.duration", &ar);
    assert_eq!(count, COLLS, "every AllReduce has a duration");
    assert!(
        sum >= ideal && sum < 5.0,
        "AllReduce durations {sum} vs transfers {ideal}"
    );
    // No per-operation host bandwidth: the host's busBw is the ratio of the sums below.
    assert!(
        ["nccl.coll.algbw", "nccl.coll.busbw"]
            .iter()
            .all(|m| total(reqs, m, &ar).1 == 0)
    );
    // The latency split: service + queue wait = latency, per operation and so in sum; the summed
    // service times and bus bytes (2(n−1)/n × size) of the served ones, whose ratio is busBw.
    let (latency, _) = total(reqs, "nccl.coll.duration", &ar);
    let (service, served) = total(reqs, "nccl.coll.service.duration", &ar);
    let (queue, waited) = total(reqs, "nccl.coll.queue.duration", &ar);
    assert!(
        served > 0 && served == waited,
        "{served} service times, {waited} queue waits"
    );
    let totals = t.with(&[("nccl.func", "AllReduce"), ("nccl.size_class", "4KiB")]);
    let missing: f64 = ["no_completion", "predecessor_unknown", "out_of_order"]
        .iter()
        .map(|r| {
            let mut attrs = totals.clone();
            attrs.insert("nccl.reason".to_owned(), (*r).to_owned());
            total(reqs, "nccl.coll.service.missing", &attrs).0
        })
        .sum();
    assert_eq!(served + missing as u64, COLLS, "every AllReduce served or counted");
    if served == COLLS {
        assert!(
            (service + queue - latency).abs() <= 1e-9,
            "service + queue wait = latency"
        );
    }
    // A function's and size class's summed times and bus bytes on `clock`.
    let sums = |func: &str, class: &str, clock: &str| {
        let totals = t.with(&[("nccl.func", func), ("nccl.size_class", class)]);
        let sum = |what: &str| total(reqs, &format!("nccl.coll.{clock}.{what}"), &totals).0;
        (sum("time"), sum("bus_bytes"))
    };
    let (secs, bus) = sums("AllReduce", "4KiB", "service");
    close(secs, service, "summed service times");
    close(bus, 1.5 * coll_bytes_per_op * served as f64, "AllReduce bus bytes");
    assert!(
        latest(reqs, "nccl.coll.kernel.duration", &ar).is_none(),
        "no KernelCh, no GPU time"
    );
    let ag = t.allgather();
    let (sum, count) = total(reqs, "nccl.coll.bytes", &ag);
    assert_eq!((sum, count), (2048.0, 1), "AllGather: 512 B per rank × 4 ranks");
    assert_eq!(total(reqs, "nccl.coll.transfers", &ag), (0.0, 1));
    assert!(
        latest(reqs, "nccl.coll.duration", &ag).is_none(),
        "no proxy op, no host time"
    );
    // GPU time from the kernel channel's pTimers, and bandwidths from it: busBw = algBw × 3/4.
    let gpu = GATHER_GPU_NS as f64 * 1e-9;
    let (sum, count) = total(reqs, "nccl.coll.kernel.duration", &ag);
    assert_eq!(count, 1);
    close(sum, gpu, "AllGather GPU time");
    close(
        total(reqs, "nccl.coll.kernel.algbw", &ag).0,
        2048.0 / gpu,
        "AllGather GPU algBw",
    );
    close(
        total(reqs, "nccl.coll.kernel.busbw", &ag).0,
        0.75 * 2048.0 / gpu,
        "AllGather GPU busBw",
    );
    let (secs, bus) = sums("AllGather", "2KiB", "kernel");
    close(secs, gpu, "AllGather summed GPU time");
    close(bus, 0.75 * 2048.0, "AllGather GPU bus bytes");

    // P2P.
    let send = t.send();
    assert_eq!(total(reqs, "nccl.p2p.bytes", &send), (P2PS as f64 * 2048.0, P2PS));
    assert_eq!(
        total(reqs, "nccl.p2p.transfers", &send),
        ((P2PS * P2P_STEPS.len() as u64) as f64, P2PS)
    );
    let (sum, count) = total(reqs, "nccl.p2p.transfer.size", &send);
    assert_eq!(
        (sum, count),
        ((P2PS * p2p_step_bytes) as f64, P2PS * P2P_STEPS.len() as u64)
    );
    assert_eq!(total(reqs, "nccl.p2p.duration", &send).1, P2PS);
    let (sum, count) = total(reqs, "nccl.p2p.kernel.duration", &send);
    assert_eq!(count, P2PS);
    close(sum, P2PS as f64 * P2P_GPU_NS as f64 * 1e-9, "P2P GPU time");
    assert!(
        ["nccl.p2p.algbw", "nccl.p2p.busbw"]
            .iter()
            .all(|m| total(reqs, m, &send).1 == 0)
    );
    let (alg, bus) = (
        total(reqs, "nccl.p2p.kernel.algbw", &send),
        total(reqs, "nccl.p2p.kernel.busbw", &send),
    );
    close(
        alg.0,
        P2PS as f64 * 2048.0 / (P2P_GPU_NS as f64 * 1e-9),
        "P2P GPU algBw",
    );
    close(bus.0, alg.0, "P2P GPU busBw = algBw");
    assert_eq!(
        total(reqs, "nccl.p2p.transfer.duration", &send).1,
        P2PS * P2P_STEPS.len() as u64
    );

    // Links: bytes exactly; the fit from spun times (MIN mode), within the machine's noise.
    close(
        total(reqs, "nccl.link.bytes", &t.link(1)).0,
        (COLLS * coll_step_bytes) as f64,
        "link 0→1 bytes",
    );
    close(
        total(reqs, "nccl.link.bytes", &t.link(2)).0,
        (P2PS * p2p_step_bytes) as f64,
        "link 0→2 bytes",
    );
    for (peer, transfers) in [(1, COLLS * 3), (2, P2PS * 2)] {
        let attrs = t.link(peer);
        let samples = latest(reqs, "nccl.link.samples", &attrs).expect("link samples").value;
        assert!(
            samples >= 1.0 && samples <= transfers as f64,
            "samples {samples} of {transfers}"
        );
        let Some(bw) = latest(reqs, "nccl.link.bandwidth", &attrs) else {
            assert_eq!(
                peer, 2,
                "the AllReduce link has three sizes per interval: it must have a fit"
            );
            continue;
        };
        if disturbed(t.hash, peer) {
            eprintln!("link 0→{peer}: the host stretched its transfers; its fit is not compared with the spun model");
            continue;
        }
        assert!(
            (bw.value / BANDWIDTH - 1.0).abs() < 0.3,
            "link 0→{peer} bandwidth {} vs {BANDWIDTH}",
            bw.value
        );
        let lat = latest(reqs, "nccl.link.latency", &attrs).expect("latency").value;
        assert!((0.0..300e-6).contains(&lat), "link 0→{peer} latency {lat}");
        let r2 = latest(reqs, "nccl.link.r2", &attrs).expect("r2").value;
        assert!((0.0..=1.0).contains(&r2) && r2 > 0.5, "r2 {r2}");
    }

    // Channels: 0 and 1 carry the AllReduce steps, 2 the sends.
    for (channel, transfers, bytes) in [
        (0u8, COLLS / 2 * 3, COLLS / 2 * coll_step_bytes),
        (1, COLLS / 2 * 3, COLLS / 2 * coll_step_bytes),
        (2, P2PS * 2, P2PS * p2p_step_bytes),
    ] {
        assert_eq!(
            total(reqs, "nccl.channel.transfer.size", &t.channel(channel)),
            (bytes as f64, transfers),
            "channel {channel}"
        );
        assert_eq!(
            total(reqs, "nccl.channel.transfer.duration", &t.channel(channel)).1,
            transfers
        );
    }
    assert!(latest(reqs, "nccl.channel.latency", &t.channel(0)).is_some());

    // Self-telemetry of the communicator.
    close(
        total(reqs, "nccl.profiler.events.recorded", &t.comm()).0,
        records() as f64,
        "records",
    );
    assert!(total(reqs, "nccl.profiler.windows.processed", &t.comm()).0 >= 1.0);
    assert_eq!(total(reqs, "nccl.profiler.events.unfinished", &t.comm()).0, 0.0);
    assert_eq!(total(reqs, "nccl.profiler.events.orphaned", &t.comm()).0, 0.0);
    for reason in ["full", "late", "unpublished"] {
        let mut attrs = t.comm();
        attrs.insert("nccl.reason".into(), reason.into());
        assert_eq!(
            total(reqs, "nccl.profiler.events.dropped", &attrs).0,
            0.0,
            "dropped {reason}"
        );
    }
    let stale: BTreeMap<String, String> = [("nccl.reason".to_owned(), "stale".to_owned())].into();
    assert!(
        total(reqs, "nccl.profiler.events.rejected", &stale).0 >= 1.0,
        "the stale stop"
    );
}

/// Every `(name, instrument, unit, attribute keys)` of the catalogue table in docs/metrics.md.
pub fn catalogue() -> Vec<(String, String, String, Vec<String>)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md");
    let text = std::fs::read_to_string(path).expect("docs/metrics.md");
    text.lines()
        .filter(|l| l.starts_with("| `nccl."))
        .map(|l| l.split('|').map(str::trim).collect::<Vec<&str>>())
        .filter(|cells| cells.len() == 6 && ["Counter", "Histogram", "Gauge"].contains(&cells[2]))
        .map(|cells| {
            let unquote = |s: &str| s.trim_matches('`').to_owned();
            let keys = cells[4]
                .split(',')
                .map(|k| unquote(k.trim()))
                .filter(|k| !k.is_empty() && k != "—")
                .collect();
            (unquote(cells[1]), cells[2].to_owned(), unquote(cells[3]), keys)
        })
        .collect()
}

/// Documented attribute-key groups, expanded (`comm` is the four communicator attributes).
pub fn expand(keys: &[String]) -> Vec<String> {
    keys.iter()
        .flat_map(|k| match k.as_str() {
            "comm" => vec![
                "nccl.comm.hash".to_owned(),
                "nccl.comm.name".to_owned(),
                "nccl.rank".to_owned(),
                "nccl.nranks".to_owned(),
            ],
            _ => vec![k.clone()],
        })
        .collect()
}

/// Catalogued metrics that only some workloads give: overflow and a link without latency, a bad
/// variable, kernel phases (NCCL 2.31), more distinct user tags than the bound, progress.
/// The progress family is exported for live communicators only, initial syncs need NCCL 2.31
/// (tests/signals.rs exports them all).
const ONLY_SOMETIMES: [&str; 15] = [
    "nccl.coll.service.missing",
    "nccl.profiler.config.problems",
    "nccl.profiler.cardinality.overflow",
    "nccl.link.latency.missing",
    "nccl.kernel.phase.duration",
    "nccl.profiler.user_tag.overflow",
    "nccl.progress.in_flight",
    "nccl.progress.oldest.age",
    "nccl.progress.oldest.idle",
    "nccl.progress.oldest.seq",
    "nccl.progress.oldest.bytes",
    "nccl.progress.completed.seq",
    "nccl.progress.hang.stuck",
    "nccl.progress.hang.episodes",
    "nccl.progress.sync_wait",
];

/// Asserts every exported metric is in the catalogue with the same unit, instrument and
/// attribute keys (the overflow series excepted), and every catalogued metric was exported
/// ([`ONLY_SOMETIMES`] excepted).
pub fn check_catalogue(reqs: &[ExportMetricsServiceRequest]) {
    check_documented(reqs);
    let exported = rx::metrics(reqs);
    for (name, ..) in &catalogue() {
        if !ONLY_SOMETIMES.contains(&name.as_str()) {
            assert!(
                exported.iter().any(|m| &m.name == name),
                "{name} is documented but was not exported"
            );
        }
    }
}

/// Asserts every exported metric is in the catalogue with the same unit, instrument and
/// attribute keys (the overflow series excepted).
pub fn check_documented(reqs: &[ExportMetricsServiceRequest]) {
    let doc = catalogue();
    assert!(doc.len() >= 30, "catalogue parsed: {} rows", doc.len());
    let exported = rx::metrics(reqs);
    for m in &exported {
        let (_, instrument, unit, keys) = doc
            .iter()
            .find(|(n, ..)| *n == m.name)
            .unwrap_or_else(|| panic!("{} is exported but not in docs/metrics.md", m.name));
        assert_eq!(&m.unit, unit, "unit of {}", m.name);
        let kind = rx::kind(m);
        let expected = match instrument.as_str() {
            "Counter" => "sum(monotonic=true",
            "Histogram" if kind.starts_with("exponential_histogram") => "exponential_histogram",
            "Histogram" => "histogram",
            "Gauge" => "gauge",
            other => panic!("unknown instrument {other} for {}", m.name),
        };
        assert!(kind.starts_with(expected), "{}: {kind} is not a {instrument}", m.name);
        let keys = expand(keys);
        for p in rx::points(m) {
            if p.attrs.contains_key("otel.metric.overflow") {
                continue;
            }
            let got: Vec<&String> = p.attrs.keys().collect();
            let mut want: Vec<&String> = keys.iter().filter(|k| p.attrs.contains_key(*k)).collect();
            want.sort();
            assert_eq!(
                got, want,
                "{}: attributes {:?} not documented ({keys:?})",
                m.name, p.attrs
            );
            // A reason only where there is one; a tag only on tagged operations; graph capture
            // only where NCCL tells (2.28+); a peer only for a wait on one; a launcher rank only
            // where the launcher gives one, a GPU only where the CUDA driver tells.
            let optional = [
                "nccl.reason",
                "nccl.user_tag",
                "nccl.graph_captured",
                "job.rank",
                "gpu.uuid",
                "gpu.pci_bus_id",
            ];
            let local = m.name == "nccl.progress.hang.stuck";
            let required: Vec<&String> = keys
                .iter()
                .filter(|k| !(optional.contains(&k.as_str()) || local && *k == "nccl.peer"))
                .collect();
            if !m.name.starts_with("nccl.profiler.") {
                assert!(
                    required.iter().all(|k| p.attrs.contains_key(*k)),
                    "{}: {:?}",
                    m.name,
                    p.attrs
                );
            }
        }
    }
}

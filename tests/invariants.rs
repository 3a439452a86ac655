//! Physics and the emulator's record over random scenarios: every exported figure of a run is
//! checked against what the emulator itself did and against what a wire allows, on scenarios
//! drawn from a seed ([`Scenario::draw`]): the NCCL release (so the profiler ABI), ranks and
//! nodes (one rank emulated, as one process per GPU runs it; its peers modelled), channels, steps in flight, collectives in flight, the proxy's pass (completions seen
//! in batches), hypervisor pauses, link latencies and rates with one slow link, a NIC per
//! process or a wire per link, message sizes, collectives, P2P and AlltoAll.
//!
//! The invariants ([`check`]), at `NCCL_PROFILER_OTEL_DETAIL=full`, one interval per run:
//! - counts and bytes exact: collectives and P2P sends per function (`nccl.*.bytes`), every
//!   link's bytes and transfers (`nccl.link.bytes`, `nccl.link.samples`);
//! - a link's bandwidth at most its wire's rate × 1.05, its throughput at most the wire's × 1.05;
//!   its latency, when there is one, between 0.9× and 3× the wire's plus the proxy's pass;
//! - the host's busBw (summed bus bytes over summed service time) within 5 % of the record's;
//! - GPU time (`nccl.coll.kernel.time`) within 2 % of the emulator's kernel record.
//!
//! Each case runs in a process of its own (the release is process-wide, as NCCL's). A failing
//! case prints its seed: `INVARIANT_SEED=<seed> INVARIANT_CASES=1 cargo test --test invariants`
//! runs it alone, and [`REGRESSIONS`] keeps it. After the regressions, `INVARIANT_CASES` seeds
//! (8 by default) from `INVARIANT_SEED` (1 by default, so that a run is reproducible): a longer
//! run, or another seed, explores further.

#[path = "support"]
mod support {
    pub mod emulator;
    pub mod otlp_receiver;
    pub mod process;
    pub mod shipped;
}

use std::collections::BTreeMap;
use std::time::Duration;

use nccl_profiler_otel::aggregate::bandwidth::bus_factor;
use nccl_profiler_otel::record::Func as PluginFunc;
use support::emulator::host::Rng;
use support::emulator::release::{self, Release};
use support::emulator::{Call, CommSpec, Func, Link, Network, Pauses, Plugin, Report, Workload};
use support::otlp_receiver::{self as rx, ExportMetricsServiceRequest, Receiver};
use support::process;

/// Seeds that once failed, run first every time.
const REGRESSIONS: &[u64] = &[];

/// The child's variable: the seed of its case.
const CASE: &str = "INVARIANT_CASE";

/// A scenario, all of it drawn from one seed.
#[derive(Clone, Debug)]
struct Scenario {
    seed: u64,
    release: Release,
    workload: Workload,
}

impl Scenario {
    fn draw(seed: u64) -> Scenario {
        let mut rng = Rng::new(seed, 0x1A7A);
        let mut pick = |n: usize| (rng.next_u64() % n as u64) as usize;
        let release = Release::ONE_PER_ABI[pick(Release::ONE_PER_ABI.len())];
        let ranks = 2 + pick(5);
        let per_node = if pick(3) == 0 { 2 } else { 1 };
        let latency = 5.0 + pick(46) as f64;
        let gbps = 3.0 + pick(23) as f64;
        let (slow_src, slow_factor) = (pick(ranks), [2.0, 4.0][pick(2)]);
        let net = Network::new(ranks, per_node, Link::new_us(latency, gbps))
            .slow_link(slow_src, (slow_src + 1) % ranks, slow_factor)
            .with_seed(seed);
        let size = |pick: &mut dyn FnMut(usize) -> usize| 64u64 << (10 + pick(9));
        let mut calls = Vec::new();
        for _ in 0..2 + pick(4) {
            let bytes = size(&mut pick);
            calls.push(match pick(5) {
                0 => Call::all_gather(bytes),
                1 => Call::reduce_scatter(bytes),
                2 => Call::send_recv(1 + pick(ranks - 1), bytes),
                3 => Call::all_to_all(bytes / 4),
                _ => Call::all_reduce(bytes),
            });
        }
        let channels = 1 + pick(4) as u8;
        let iterations = 2 + pick(3);
        let (in_flight, depth) = (1 + pick(8), 1 + pick(12));
        // The proxy's pass up to the wire's latency: a latency is then read within 3× the wire's.
        let pass = Duration::from_secs_f64(latency * 1e-6 * pick(101) as f64 / 100.0);
        let (nic_fifo, pauses) = (pick(4) != 0, pick(2) == 0);
        // One rank per process, as NCCL runs (one GPU, its NIC): the others are modelled.
        let rank = pick(ranks) as i32;
        let workload = Workload::new(net)
            .comm(
                CommSpec::new("invariant", 0..ranks)
                    .channels(channels)
                    .calls(calls)
                    .emulate([rank]),
            )
            .iterations(iterations)
            .options(|o| {
                o.max_in_flight = in_flight;
                o.depth = depth;
                o.pass = pass;
                o.nic_fifo = nic_fifo;
                o.pauses = pauses.then_some(Pauses::HYPERVISOR);
            });
        Scenario {
            seed,
            release,
            workload,
        }
    }
}

#[test]
#[ignore = "issue 38 is open: 11 seeds in 48 read a link's bandwidth 1.06-1.61x its wire when \
            few gaps have ends the proxy saw late by different amounts; run with --ignored"]
fn figures_hold_physics_and_the_record() {
    let cases: u64 = std::env::var("INVARIANT_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let first: u64 = std::env::var("INVARIANT_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let seeds: Vec<u64> = REGRESSIONS.iter().copied().chain(first..first + cases).collect();
    let mut failed = Vec::new();
    for seed in seeds {
        let out = process::child(module_path!(), "case", CASE, &seed.to_string())
            .output()
            .expect("the case's process");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let verdict: Vec<&str> = stdout.lines().filter(|l| l.starts_with("invariant")).collect();
        eprintln!("seed {seed}: {}", verdict.join("; "));
        if !out.status.success() {
            eprintln!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
            failed.push(seed);
        }
    }
    assert!(
        failed.is_empty(),
        "invariants broken on seeds {failed:?}: rerun one with INVARIANT_SEED=<seed> INVARIANT_CASES=1, keep it in REGRESSIONS"
    );
}

/// One case, in a process of its own ([`figures_hold_physics_and_the_record`]).
#[test]
#[ignore = "a case of figures_hold_physics_and_the_record"]
fn case() {
    let Some(seed) = process::case(CASE) else { return };
    let sc = Scenario::draw(seed.parse().expect("a seed"));
    release::set(sc.release);
    let receiver = Receiver::start();
    for (k, v) in [
        ("NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC", "3600"),
        ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta"),
        ("NCCL_PROFILER_OTEL_TELEMETRY_ENDPOINT", receiver.endpoint().as_str()),
        ("NCCL_PROFILER_OTEL_DETAIL", "full"),
        ("NCCL_PROFILE_EVENT_MASK", "0x5e"),
        ("NCCL_PROFILER_OTEL_KERNEL_CH_EVERY", "1"),
        ("NCCL_ALLGATHERV_ENABLE", "0"),
    ] {
        // SAFETY: before the plugin's first `init`, on this process's only test thread.
        unsafe { std::env::set_var(k, v) };
    }
    println!("invariant scenario {sc:?}");
    let plugin = Plugin::load_shipped();
    let report = sc.workload.run(&plugin);
    let legacy = plugin.driving().legacy();
    plugin.close();
    let exported = receiver.take();
    let mut broken = check(&sc, legacy, &report, &exported);
    if !legacy {
        // v1–v3 do not tell a communicator's size: no bus factor.
        broken.extend(bus_bandwidth(&report, &exported));
    }
    for b in &broken {
        println!("invariant broken: {b}");
    }
    println!("invariant checks: {} broken", broken.len());
    assert!(
        broken.is_empty(),
        "seed {}: {} invariants broken",
        sc.seed,
        broken.len()
    );
}

/// Sums of `name`'s points per attribute set (values; histograms: (count, sum)).
struct Points(Vec<rx::Point>);

impl Points {
    fn of(exported: &[ExportMetricsServiceRequest], name: &str) -> Points {
        Points(
            rx::metrics(exported)
                .into_iter()
                .filter(|m| m.name == name)
                .flat_map(rx::points)
                .collect(),
        )
    }

    /// (count, value) summed over the points whose attributes have every `(key, value)`.
    fn sum(&self, with: &[(&str, String)]) -> (u64, f64) {
        let matching = self
            .0
            .iter()
            .filter(|p| with.iter().all(|(k, v)| p.attrs.get(*k) == Some(v)));
        matching.fold((0, 0.0), |(n, s), p| (n + p.count, s + p.value))
    }

    /// The one value of the point with these attributes, if exported.
    fn value(&self, with: &[(&str, String)]) -> Option<f64> {
        let mut matching = self
            .0
            .iter()
            .filter(|p| with.iter().all(|(k, v)| p.attrs.get(*k) == Some(v)));
        matching.next().map(|p| p.value)
    }
}

/// An operation kind of a communicator: (hash, rank, function, peer of a send).
type OpKey = (u64, i32, &'static str, Option<i32>);

/// Every invariant the run breaks, described.
fn check(sc: &Scenario, legacy: bool, report: &Report, exported: &[ExportMetricsServiceRequest]) -> Vec<String> {
    let mut broken = Vec::new();
    let lost: f64 = ["nccl.profiler.events.dropped", "nccl.profiler.events.unfinished"]
        .iter()
        .map(|m| Points::of(exported, m).sum(&[]).1)
        .sum();
    if lost > 0.0 {
        broken.push(format!("{lost} events lost: nothing else can be exact"));
        return broken;
    }
    let comm = |hash: u64, rank: i32| {
        vec![
            ("nccl.comm.hash", format!("{hash:#x}")),
            ("nccl.rank", rank.to_string()),
        ]
    };
    // Operations: (count, nccl-tests bytes), collectives and sends.
    let mut ops: BTreeMap<OpKey, (u64, u64)> = BTreeMap::new();
    for t in report.collectives.iter().filter(|t| t.func != Func::Recv) {
        let e = ops.entry((t.hash, t.rank, t.func.name(), t.peer)).or_default();
        (e.0, e.1) = (e.0 + 1, e.1 + t.test_size());
    }
    let (coll_bytes, p2p_bytes) = (
        Points::of(exported, "nccl.coll.bytes"),
        Points::of(exported, "nccl.p2p.bytes"),
    );
    for (&(hash, rank, func, peer), &(mut count, mut bytes)) in &ops {
        if legacy && ["AllGather", "ReduceScatter"].contains(&func) {
            // v1–v3 give no communicator size, which their nccl-tests size needs: no bytes.
            (count, bytes) = (0, 0);
        }
        let mut with = comm(hash, rank);
        with.push(("nccl.func", func.to_owned()));
        let got = match peer {
            Some(p) => {
                with.push(("nccl.peer", p.to_string()));
                p2p_bytes.sum(&with)
            }
            None => coll_bytes.sum(&with),
        };
        if got != (count, bytes as f64) {
            broken.push(format!(
                "{func} of rank {rank} (peer {peer:?}): {got:?} exported, {count} of {bytes} B made"
            ));
        }
    }
    // Links.
    let metric = |name: &str| Points::of(exported, name);
    let (bytes, samples, bandwidth, throughput, latency) = (
        metric("nccl.link.bytes"),
        metric("nccl.link.samples"),
        metric("nccl.link.bandwidth"),
        metric("nccl.link.throughput"),
        metric("nccl.link.latency"),
    );
    for l in &report.links {
        let mut with = comm(l.hash, l.rank);
        with.push(("nccl.peer", l.peer.to_string()));
        let name = format!("link {} → {} ({:?})", l.src, l.dst, l.configured);
        let (made, sent) = (l.bytes() as f64, l.transfers() as f64);
        if bytes.sum(&with).1 != made || samples.value(&with) != Some(sent) {
            broken.push(format!(
                "{name}: {:?} B in {:?} transfers exported, {made} in {sent} made",
                bytes.sum(&with).1,
                samples.value(&with)
            ));
        }
        let wire = l.configured.bandwidth;
        for (what, v) in [
            ("bandwidth", bandwidth.value(&with)),
            ("throughput", throughput.value(&with)),
        ] {
            if v.is_some_and(|v| v > wire * 1.05) {
                broken.push(format!(
                    "{name}: {what} {:.3} GB/s above the wire's {:.3} (emulator's own figures {:?}, {} of {} transfers disturbed)",
                    v.unwrap() / 1e9,
                    wire / 1e9,
                    l.measured(),
                    l.disturbed,
                    l.transfers()
                ));
            }
        }
        let wire_latency = l.configured.latency.as_secs_f64();
        let allowed = (
            0.9 * wire_latency,
            3.0 * wire_latency + sc.workload.options.pass.as_secs_f64(),
        );
        if let Some(v) = latency.value(&with).filter(|v| *v < allowed.0 || *v > allowed.1) {
            broken.push(format!(
                "{name}: latency {:.1} µs outside {:.1?} µs",
                v * 1e6,
                (allowed.0 * 1e6, allowed.1 * 1e6)
            ));
        }
    }
    broken
}

/// The host's busBw per (communicator, rank, function) against the record's: the bus bytes over
/// the service times of its collectives (each from the later of its enqueue and the last
/// completion of everything enqueued before it on the communicator, P2P sends and receives
/// included, to its own completion); and the GPU time against the kernel record.
fn bus_bandwidth(report: &Report, exported: &[ExportMetricsServiceRequest]) -> Vec<String> {
    let mut broken = Vec::new();
    // Every operation of a communicator, P2P included: each one's completion frees it.
    let mut queues: BTreeMap<(u64, i32), Vec<&support::emulator::CollTruth>> = BTreeMap::new();
    for t in &report.collectives {
        queues.entry((t.hash, t.rank)).or_default().push(t);
    }
    let (bus_bytes, service, kernel) = (
        Points::of(exported, "nccl.coll.service.bus_bytes"),
        Points::of(exported, "nccl.coll.service.time"),
        Points::of(exported, "nccl.coll.kernel.time"),
    );
    for ((hash, rank), mut tasks) in queues {
        tasks.sort_by_key(|t| t.start);
        // The plugin declines P2P receives, so a collective enqueued behind a group's receive
        // is served from the group's last send (docs/metrics.md, "Service time"): its busBw is
        // checked on communicators without receives only.
        let receives = tasks.iter().any(|t| t.func == Func::Recv);
        // function → (bus bytes, service seconds, GPU seconds)
        let mut record: BTreeMap<&str, (f64, f64, f64)> = BTreeMap::new();
        let mut free: Option<std::time::Instant> = None;
        for t in tasks {
            let gpu = t.gpu_duration().map_or(0.0, |d| d.as_secs_f64());
            // Done when its last proxy op stopped, or (intra-node) its kernel.
            let Some(end) = t.last_op_stop.or(t.end) else { continue };
            let from = free.map_or(t.start, |f| f.max(t.start));
            free = Some(free.map_or(end, |f| f.max(end)));
            if t.peer.is_some() {
                continue;
            }
            let factor = bus_factor(PluginFunc::from_bytes(t.func.name().as_bytes()), t.nranks).unwrap_or(0.0);
            let e = record.entry(t.func.name()).or_default();
            e.0 += t.test_size() as f64 * factor;
            e.1 += end.saturating_duration_since(from).as_secs_f64();
            e.2 += gpu;
        }
        for (func, (bus, secs, gpu)) in record {
            let with = [
                ("nccl.comm.hash", format!("{hash:#x}")),
                ("nccl.rank", rank.to_string()),
                ("nccl.func", func.to_owned()),
            ];
            let (got_bus, got_secs) = (bus_bytes.sum(&with).1, service.sum(&with).1);
            let (want, got) = (bus / secs, got_bus / got_secs);
            if bus > 0.0 && !receives && !(got / want - 1.0).abs().le(&0.05) {
                broken.push(format!(
                    "{func} of rank {rank}: busBw {:.3} GB/s, the record's {:.3} (bus bytes {got_bus} vs {bus}, service {got_secs:.6} s vs {secs:.6})",
                    got / 1e9,
                    want / 1e9
                ));
            }
            let got_gpu = kernel.sum(&with).1;
            if gpu > 0.0 && !(got_gpu / gpu - 1.0).abs().le(&0.02) {
                broken.push(format!(
                    "{func} of rank {rank}: GPU time {got_gpu:.6} s, the record's {gpu:.6}"
                ));
            }
        }
    }
    broken
}

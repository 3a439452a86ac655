//! Hang, straggler and slow-link signals against the emulator (NCCL 2.31.2, KernelCh always on),
//! through the `file` exporter, on three-rank rings (ring r → r+1), one communicator per
//! scenario:
//! - (d) healthy, under host noise (a preempted proxy thread every few steps, jitter, a busy
//!   core): no hang episode, no waits to speak of;
//! - (a) rank 1 stops posting in the middle of one AllReduce for a while: within the threshold
//!   plus two intervals every rank's export names the stuck operation and what it waits for
//!   (rank 0, which sends to 1: a peer not ready to receive; rank 2, which receives from 1: data
//!   from 1; rank 1 itself: nothing posted), each logs one WARN and counts one episode, and the
//!   stuck series drop to 0 once the ring moves again;
//! - (b) rank 2 enters every collective 20 ms (then 50 ms) late: its sender (rank 1) reports that
//!   long a wait for peer 2, and both its neighbours that long an initial sync, within 10 % of
//!   the delays the emulator imposed; rank 2 itself waits least;
//! - (c) the link 1 → 2 is 4 times slower than the others.
//!
//! Then the exports of each scenario become Prometheus series (`support::prom`) and `promtool test
//! rules` checks `docs/prometheus/nccl-rules.yml` on them: the alerts fire for (a)–(c) with the
//! right labels, the culprit's host among them (joined from `nccl.comm.member`, also when the
//! culprit's member series ended over 5 minutes before; without member series they still fire,
//! naming the culprit's rank only), and stay silent for (d). Without `promtool` that part is
//! skipped with a message, unless `REQUIRE_PROMTOOL` is set (CI), when it fails. `nccl_report`'s
//! culprits (`report`) on the same exports must be the ones the alerts fire on, and the rules
//! files must say what the culprit vocabulary says (`vocabulary`).
//!
//! The same scenarios run once more, in a process of their own, with exponential histograms: a
//! Prometheus with native histograms, fed by remote write, must pass the same server checks with
//! the native-histogram variants of the rules and dashboard, which a third test keeps equal to
//! what `support::prom::native` makes of the classic files.

#[path = "../support"]
mod support {
    pub mod emulator;
    pub mod export;
    pub mod otlp_receiver;
    pub mod process;
    pub mod prom;
    // `nccl_report`'s culprits, which reach the vocabulary and the reader as `super::…`.
    pub use nccl_profiler_otel::culprit;
    #[allow(dead_code)]
    #[path = "../../examples/nccl_report/src/verdict.rs"]
    pub mod verdict;
}

mod end_of_job;
mod hangs;
mod prometheus;
mod report;
mod vocabulary;

use nccl_profiler_otel::config::otel::HISTOGRAM_AGGREGATION;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use prometheus::Histograms;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use support::emulator::release::{self, Release};
use support::emulator::{Call, CommSpec, Late, Link, Network, Plugin, Report, Stall, Workload, logger};
use support::export as sx;
use support::otlp_receiver::{ExportMetricsServiceRequest, metrics, points};
use support::process;

const INTERVAL: f64 = 0.25;
const THRESHOLD: f64 = 1.0;
/// promtool's step per export.
const STEP_SECS: u64 = 5;
const RULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/prometheus/nccl-rules.yml");
/// The scenarios' process: its job (`service.namespace/service.name`), and the host, node and
/// launcher rank its member series name, which the alerts name their culprits by.
const JOB: &str = "signals/nccl";
const HOST: &str = "signals-host";
const NODE: &str = "signals-node";
const JOB_RANK: &str = "7";

fn ring(name: &str, hash: u64, bytes: u64, iterations: usize, net: Network) -> Workload {
    let comm = CommSpec::new(name, 0..3)
        .channels(2)
        .with_hash(hash)
        .calls([Call::all_reduce(bytes)]);
    Workload::new(net).comm(comm).iterations(iterations).options(|o| {
        o.preempt_every = 5;
        o.peer_waits = 4;
    })
}

fn net(gbytes_per_s: f64) -> Network {
    Network::new(3, 1, Link::new_us(30.0, gbytes_per_s)).with_jitter(0.05)
}

/// One scenario's communicator and when it ran.
struct Scenario {
    name: &'static str,
    hash: u64,
    from: SystemTime,
}

fn decode(text: &str) -> Vec<ExportMetricsServiceRequest> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Every point of `name` of communicator `hash`, rank `rank`: (time, attributes, value, count).
fn series(reqs: &[ExportMetricsServiceRequest], name: &str, hash: u64, rank: i32) -> Points {
    let (hash, rank) = (format!("{hash:#x}"), rank.to_string());
    metrics(reqs)
        .into_iter()
        .filter(|m| m.name == name)
        .flat_map(points)
        .filter(|p| p.attrs["nccl.comm.hash"] == hash && p.attrs["nccl.rank"] == rank)
        .map(|p| (UNIX_EPOCH + Duration::from_nanos(p.time), p.attrs, p.value, p.count))
        .collect()
}

/// Points of one series: (time, attributes, value, count).
type Points = Vec<(SystemTime, BTreeMap<String, String>, f64, u64)>;

/// The `hang.stuck` points of `rank` of communicator `hash`, which name only `wait` and `peer`
/// (`nccl.wait`, `nccl.peer`), and when they first did above 0.
fn stuck_on(
    reqs: &[ExportMetricsServiceRequest],
    hash: u64,
    rank: i32,
    (wait, peer): (&str, Option<&str>),
) -> (SystemTime, Points) {
    let stuck = series(reqs, "nccl.progress.hang.stuck", hash, rank);
    let named = |a: &BTreeMap<String, String>| a["nccl.wait"] == wait && a.get("nccl.peer").map(String::as_str) == peer;
    let first = stuck
        .iter()
        .find(|(_, a, v, _)| *v > 0.0 && named(a))
        .unwrap_or_else(|| panic!("{hash:#x} rank {rank} never named {wait} {peer:?}: {stuck:?}"))
        .0;
    assert!(
        stuck.iter().all(|(_, a, ..)| named(a)),
        "{hash:#x} rank {rank} also named something else: {stuck:?}"
    );
    (first, stuck)
}

fn episodes(reqs: &[ExportMetricsServiceRequest], hash: u64, rank: i32) -> f64 {
    series(reqs, "nccl.progress.hang.episodes", hash, rank)
        .last()
        .map_or(0.0, |p| p.2)
}

/// Mean of the latest (cumulative) histogram `name` of a rank, over the points `keep` accepts.
fn mean(
    reqs: &[ExportMetricsServiceRequest],
    name: &str,
    hash: u64,
    rank: i32,
    keep: impl Fn(&BTreeMap<String, String>) -> bool,
) -> Option<f64> {
    let last = series(reqs, name, hash, rank).into_iter().rev().find(|p| keep(&p.1))?;
    (last.3 > 0).then(|| last.2 / last.3 as f64)
}

fn hang_warnings(hash: u64, rank: i32) -> usize {
    let (comm, rank) = (format!("hang: communicator {hash:#x} "), format!(" rank {rank}/3: "));
    logger::warnings()
        .iter()
        .filter(|w| w.contains(&comm) && w.contains(&rank))
        .count()
}

/// Whether two points' times are of one export (a tenth of an interval apart at most).
fn same_export(a: SystemTime, b: SystemTime) -> bool {
    let d = a.duration_since(b).or_else(|_| b.duration_since(a)).unwrap_or_default();
    d.as_secs_f64() < INTERVAL / 10.0
}

fn average(d: &[Duration]) -> f64 {
    d.iter().map(Duration::as_secs_f64).sum::<f64>() / d.len() as f64
}

/// Points the plugin's `file` exporter into `dir` (created), with this export interval and hang
/// threshold (seconds) and the variables `extra`; returns the file this process writes.
///
/// # Safety
/// Before the process's first `init`, with no other thread reading the environment.
unsafe fn export_to(dir: &Path, interval: f64, threshold: f64, extra: &[(&str, &str)]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let pattern = dir.join("out-%p.jsonl");
    let (interval, threshold) = (interval.to_string(), threshold.to_string());
    let vars = [
        ("NCCL_PROFILER_OTEL_EXPORTER", "file"),
        ("NCCL_PROFILER_OTEL_EXPORT_FILE", pattern.to_str().unwrap()),
        ("NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC", interval.as_str()),
        ("NCCL_PROFILER_OTEL_HANG_THRESHOLD_SEC", threshold.as_str()),
        ("NCCL_PROFILER_OTEL_WINDOW_CAPACITY", "100000"),
        ("NCCL_PROFILER_OTEL_WINDOW_COUNT_TRIGGER", "50000"),
    ];
    let vars: Vec<(&str, &str)> = vars.iter().chain(extra).copied().collect();
    // SAFETY: the caller's promise.
    unsafe { sx::base_env(&vars) };
    dir.join(format!("out-{}.jsonl", std::process::id()))
}

/// One emulated job at a time in this binary (the hang cases' child processes included): their
/// timings need the two cores.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// [`SERIAL`], held.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the scenarios exported, and what they imposed.
struct Run {
    reqs: Vec<ExportMetricsServiceRequest>,
    scenarios: Vec<Scenario>,
    /// The late scenarios' communicators and delays.
    lates: Vec<(u64, Late)>,
    healthy: u64,
    stalled: u64,
    slow: u64,
    /// When rank 1 of the stall stopped posting.
    began: SystemTime,
}

/// Runs every scenario, one after the other, on the plugin of this process exporting into `dir`
/// (removed afterwards) with the variables `extra` too, and reads what it exported.
///
/// # Safety
/// As [`export_to`].
unsafe fn run(dir: &Path, extra: &[(&str, &str)]) -> Run {
    let resource = format!("service.namespace=signals,host.name={HOST},job.node_name={NODE},job.rank={JOB_RANK}");
    let vars = [
        ("NCCL_PROFILER_OTEL_KERNEL_CH_EVERY", "1"),
        ("OTEL_RESOURCE_ATTRIBUTES", &resource),
    ];
    let vars: Vec<(&str, &str)> = vars.iter().chain(extra).copied().collect();
    // SAFETY: the caller's promise.
    let path = unsafe { export_to(dir, INTERVAL, THRESHOLD, &vars) };
    release::set(Release::V2_31_2);
    let p = Plugin::in_process();
    let mut scenarios = Vec::new();
    let mut start = |name: &'static str, hash: u64| {
        scenarios.push(Scenario {
            name,
            hash,
            from: SystemTime::now(),
        });
        hash
    };

    // (d) Healthy, under host noise: a core kept busy meanwhile.
    let healthy = start("(d) healthy", 0x4EA1_7001);
    let busy = AtomicBool::new(true);
    let report: Report = std::thread::scope(|s| {
        s.spawn(|| {
            while busy.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        let r = ring("healthy", healthy, 6 << 20, 400, net(1.0)).run(&p);
        busy.store(false, Ordering::Relaxed);
        r
    });
    assert!(
        report.elapsed > Duration::from_secs_f64(8.0 * INTERVAL),
        "{:?}",
        report.elapsed
    );

    // (a) Rank 1 stops posting after 3 steps of its third AllReduce, for the threshold plus
    // four intervals.
    let stalled = start("(a) stall", 0x5 << 40 | 0x7A11);
    let hold = Duration::from_secs_f64(THRESHOLD + 4.0 * INTERVAL);
    let stall = Stall::new(1, 2, 3, hold);
    let report = ring("stall", stalled, 6 << 20, 4, net(1.0))
        .options(|o| o.stall = Some(stall.clone()))
        .run(&p);
    let (_, began) = stall.began().expect("rank 1 stopped posting");
    assert!(report.elapsed >= hold, "{:?}", report.elapsed);

    // (b) Rank 2 enters every AllReduce late, by 20 ms and by 50 ms.
    let mut lates = Vec::new();
    for (name, hash, delay, iterations) in [
        ("(b) late 20 ms", 0x1A7E_0020, 20, 100),
        ("(b) late 50 ms", 0x1A7E_0050, 50, 45),
    ] {
        start(name, hash);
        let late = Late::new(2, Duration::from_millis(delay));
        let comm = format!("late{delay}");
        ring(&comm, hash, 1 << 20, iterations, net(1.0))
            .options(|o| o.late = Some(late.clone()))
            .run(&p);
        lates.push((hash, late));
    }

    // (c) The link 1 → 2 is 4 times slower.
    let slow = start("(c) slow link", 0x5104_0102);
    ring("slowlink", slow, 1 << 20, 800, net(1.0).slow_link(1, 2, 4.0)).run(&p);

    let reqs = decode(&std::fs::read_to_string(&path).unwrap());
    p.close();
    let _ = std::fs::remove_dir_all(dir);
    Run {
        reqs,
        scenarios,
        lates,
        healthy,
        stalled,
        slow,
        began,
    }
}

#[test]
fn hangs_stragglers_and_slow_links_are_named_and_alerted_on() {
    let _serial = serial();
    let dir = std::env::temp_dir().join(format!("nccl-otel-signals-{}", std::process::id()));
    // Classic histograms whatever the default: the promtool tests and the classic files read buckets.
    let explicit = [(HISTOGRAM_AGGREGATION, "explicit_bucket_histogram")];
    // SAFETY: the only test of this binary that runs in this process, before its first `init`.
    let run = unsafe { run(&dir, &explicit) };
    let (reqs, scenarios, lates) = (run.reqs, run.scenarios, run.lates);
    let (healthy, stalled, slow, began) = (run.healthy, run.stalled, run.slow, run.began);
    sx::check_documented(&reqs);

    // (d): nothing.
    for rank in 0..3 {
        assert_eq!(episodes(&reqs, healthy, rank), 0.0, "healthy rank {rank}");
        assert_eq!(hang_warnings(healthy, rank), 0, "{:?}", logger::warnings());
        let stuck = series(&reqs, "nccl.progress.hang.stuck", healthy, rank);
        assert!(stuck.is_empty(), "healthy rank {rank}: {stuck:?}");
        let wait = mean(&reqs, "nccl.progress.peer_wait", healthy, rank, |_| true).unwrap();
        assert!(
            wait < 1e-3,
            "healthy rank {rank} waited {wait} s for its peer on average"
        );
    }

    // (a): every rank names the right peer and kind within the threshold plus two intervals.
    let deadline = began + Duration::from_secs_f64(THRESHOLD + 2.0 * INTERVAL);
    let expected = [(0, "peer", Some("1")), (2, "recv", Some("1")), (1, "proxy", None)];
    for (rank, wait, peer) in expected {
        let (first, stuck) = stuck_on(&reqs, stalled, rank, (wait, peer));
        let after = first.duration_since(began).unwrap_or_default();
        eprintln!("(a) rank {rank}: {wait} {peer:?} exported {after:?} after the stall began");
        assert!(
            first <= deadline,
            "rank {rank}: detected {after:?} after the stall began"
        );
        assert!(
            stuck.iter().any(|(t, _, v, _)| *v == 0.0 && *t > first),
            "rank {rank}: the stuck series did not return to 0: {stuck:?}"
        );
        assert_eq!(episodes(&reqs, stalled, rank), 1.0, "rank {rank}");
        assert_eq!(hang_warnings(stalled, rank), 1, "{:?}", logger::warnings());
        let oldest = series(&reqs, "nccl.progress.oldest.seq", stalled, rank);
        assert!(
            oldest
                .iter()
                .any(|(t, a, v, _)| same_export(*t, first) && *v == 2.0 && a["nccl.func"] == "AllReduce"),
            "rank {rank}: the stuck AllReduce is seqNumber 2: {oldest:?}"
        );
        let completed = series(&reqs, "nccl.progress.completed.seq", stalled, rank);
        assert!(
            completed.iter().any(|(t, _, v, _)| same_export(*t, first) && *v == 1.0),
            "rank {rank}: seqNumber 1 completed last: {completed:?}"
        );
    }

    // (b): the late rank's peers wait what it imposed; it waits least.
    for (hash, late) in &lates {
        let imposed = average(&late.imposed());
        let peer2 = |a: &BTreeMap<String, String>| a["nccl.peer"] == "2";
        let waits = [
            (
                "rank 1's wait for peer 2",
                mean(&reqs, "nccl.progress.peer_wait", *hash, 1, peer2),
            ),
            (
                "rank 1's initial sync",
                mean(&reqs, "nccl.progress.sync_wait", *hash, 1, |_| true),
            ),
            (
                "rank 0's initial sync",
                mean(&reqs, "nccl.progress.sync_wait", *hash, 0, |_| true),
            ),
        ];
        for (what, wait) in waits {
            let wait = wait.unwrap_or_else(|| panic!("{what}: none"));
            eprintln!("(b) {imposed:.4} s imposed: {what} {wait:.4} s");
            assert!(
                (wait - imposed).abs() <= 0.1 * imposed,
                "{what}: {wait} s, imposed {imposed} s"
            );
        }
        let own = mean(&reqs, "nccl.progress.sync_wait", *hash, 2, |_| true).unwrap();
        assert!(own < 0.1 * imposed, "the late rank's own initial sync: {own} s");
        for (rank, peer) in [(0, "1"), (2, "0")] {
            let other = mean(&reqs, "nccl.progress.peer_wait", *hash, rank, |a| {
                a["nccl.peer"] == peer
            })
            .unwrap();
            assert!(other < 0.1 * imposed, "rank {rank}'s wait for peer {peer}: {other} s");
        }
    }

    prometheus::promtool(&reqs, &scenarios, &lates, stalled);
    prometheus::server(&reqs, &scenarios, &lates, stalled, slow, Histograms::Classic);
}

/// The same scenarios exported as exponential histograms and written into a Prometheus with
/// native histograms by remote write: the native rules and dashboard pass the classic ones'
/// server checks (`prometheus::server`), and `nccl_report` names each scenario's culprit from
/// the exponential histograms. In a process of its own (its histogram setting); skipped
/// like the classic checks without Prometheus.
#[test]
fn native_histograms_serve_the_native_rules_and_dashboard() {
    let _serial = serial();
    let name = "native_histograms_serve_the_native_rules_and_dashboard";
    if !prometheus::have_prometheus() || !process::own_process(module_path!(), name) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("nccl-otel-signals-native-{}", std::process::id()));
    let exponential = [(HISTOGRAM_AGGREGATION, "base2_exponential_bucket_histogram")];
    // SAFETY: this test alone runs in this process, before its first `init`.
    let run = unsafe { run(&dir, &exponential) };
    let exported = |exponential: bool| {
        metrics(&run.reqs).iter().any(|m| match m.data {
            Some(Data::ExponentialHistogram(_)) => exponential,
            Some(Data::Histogram(_)) => !exponential,
            _ => false,
        })
    };
    assert!(exported(true) && !exported(false), "histograms not all exponential");
    report::names_each_culprit(&run);
    let (stalled, slow) = (run.stalled, run.slow);
    prometheus::server(&run.reqs, &run.scenarios, &run.lates, stalled, slow, Histograms::Native);
}

/// docs/prometheus/nccl-rules-native.yml and docs/grafana/nccl-dashboard-native.json are what
/// `support::prom::native` makes of the classic files (`BLESS=1` rewrites them), and promtool
/// accepts the rules.
#[test]
fn native_variants_are_the_classic_files_rewritten() {
    use support::prom::native;
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let histograms = prometheus::histograms();
    let rules = native::rules(&read(RULES), &histograms).unwrap_or_else(|e| panic!("{RULES}: {e}"));
    let path = support::prom::dashboard::PATH;
    let dashboard = native::dashboard(&read(path), &histograms).unwrap_or_else(|e| panic!("{path}: {e}"));
    let rules = native::check_or_bless(native::RULES, &rules);
    let dashboard = native::check_or_bless(native::DASHBOARD, &dashboard);
    assert!(rules.is_ok() && dashboard.is_ok(), "{rules:?} {dashboard:?}");
    prometheus::check_rules(native::RULES);
}

/// docs/prometheus.md lists every metric of docs/metrics.md's catalogue with the names Prometheus
/// gives its series (the translation of `support::prom`), and nothing else.
#[test]
fn prometheus_md_lists_every_translated_name() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/prometheus.md");
    let doc = std::fs::read_to_string(path).expect("docs/prometheus.md");
    let rows: Vec<String> = sx::catalogue()
        .iter()
        .map(|(name, instrument, unit, _)| {
            let series: Vec<String> = support::prom::series_names(name, instrument, unit)
                .iter()
                .map(|s| format!("`{s}`"))
                .collect();
            format!("| `{name}` | {instrument} | {} |", series.join(", "))
        })
        .collect();
    let listed: Vec<&str> = doc.lines().filter(|l| l.starts_with("| `nccl.")).collect();
    assert!(
        listed == rows.iter().map(String::as_str).collect::<Vec<_>>(),
        "docs/prometheus.md must list exactly these rows, in this order:\n{}",
        rows.join("\n")
    );
}

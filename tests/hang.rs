//! Hang detection against the emulator (issue scenarios (a) and (d)), through the `file`
//! exporter: a three-rank ring where rank 1 stops posting in the middle of one AllReduce for
//! a while. Within the threshold plus two intervals of the stall, every rank's export names the
//! stuck operation and what it waits for: rank 0 (which sends to 1) a peer that is not ready to
//! receive, rank 2 (which receives from 1) data from 1, rank 1 itself nothing posted; each
//! logs one WARN and counts one episode, and the stuck series drop to 0 once the ring moves
//! again. Before that, a healthy run of the same ring under host noise (a preempted proxy
//! thread every few steps, jitter, a busy core) has no episode at all.

mod emulator;
mod export_support;
mod otlp_receiver;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use emulator::{Call, CommSpec, Link, Network, Plugin, Report, Stall, Workload, logger};
use export_support as sx;
use otlp_receiver::{ExportMetricsServiceRequest, metrics, points};

const INTERVAL: f64 = 0.25;
const THRESHOLD: f64 = 1.0;

fn ring(name: &str, hash: u64, iterations: usize, stall: Option<Stall>) -> Workload {
    let net = Network::new(3, 1, Link::new_us(30.0, 1.0)).with_jitter(0.05);
    let comm = CommSpec::new(name, 0..3)
        .channels(2)
        .with_hash(hash)
        .calls([Call::all_reduce(6 << 20)]);
    Workload::new(net).comm(comm).iterations(iterations).options(|o| {
        o.preempt_every = 5;
        o.peer_waits = 4;
        o.stall = stall;
    })
}

fn decode(text: &str) -> Vec<ExportMetricsServiceRequest> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Every point of `name` of communicator `hash`, rank `rank`: (time, attributes, value).
fn series(
    reqs: &[ExportMetricsServiceRequest],
    name: &str,
    hash: u64,
    rank: i32,
) -> Vec<(SystemTime, BTreeMap<String, String>, f64)> {
    let (hash, rank) = (format!("{hash:#x}"), rank.to_string());
    metrics(reqs)
        .into_iter()
        .filter(|m| m.name == name)
        .flat_map(points)
        .filter(|p| p.attrs["nccl.comm.hash"] == hash && p.attrs["nccl.rank"] == rank)
        .map(|p| (UNIX_EPOCH + Duration::from_nanos(p.time), p.attrs, p.value))
        .collect()
}

fn episodes(reqs: &[ExportMetricsServiceRequest], hash: u64, rank: i32) -> f64 {
    series(reqs, "nccl.progress.hang.episodes", hash, rank)
        .last()
        .map_or(0.0, |p| p.2)
}

/// Whether two points' times are of one export (a tenth of an interval apart at most).
fn same_export(a: SystemTime, b: SystemTime) -> bool {
    let d = a.duration_since(b).or_else(|_| b.duration_since(a)).unwrap_or_default();
    d.as_secs_f64() < INTERVAL / 10.0
}

fn hang_warnings(hash: u64, rank: i32) -> usize {
    let (comm, rank) = (format!("hang: communicator {hash:#x} "), format!(" rank {rank}/3: "));
    logger::warnings()
        .iter()
        .filter(|w| w.contains(&comm) && w.contains(&rank))
        .count()
}

#[test]
fn a_rank_that_stops_posting_is_named_by_its_peers_and_a_healthy_ring_is_not() {
    let dir = std::env::temp_dir().join(format!("nccl-otel-hang-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pattern = dir.join("out-%p.jsonl");
    let (interval, threshold) = (INTERVAL.to_string(), THRESHOLD.to_string());
    // SAFETY: the only test of this binary, before its first `init`.
    unsafe {
        sx::base_env(&[
            ("NCCL_PROFILER_OTEL_EXPORTER", "file"),
            ("NCCL_PROFILER_OTEL_EXPORT_FILE", pattern.to_str().unwrap()),
            ("NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC", interval.as_str()),
            ("NCCL_PROFILER_OTEL_HANG_THRESHOLD_SEC", threshold.as_str()),
            ("NCCL_PROFILER_OTEL_WINDOW_CAPACITY", "100000"),
            ("NCCL_PROFILER_OTEL_WINDOW_COUNT_TRIGGER", "50000"),
        ]);
    }
    let p = Plugin::in_process();

    // (d) Healthy, under host noise: a core kept busy meanwhile.
    let (healthy_hash, stall_hash) = (0x4EA1_7001, 0x5 << 40 | 0x7A11);
    let busy = AtomicBool::new(true);
    let healthy: Report = std::thread::scope(|s| {
        s.spawn(|| {
            while busy.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        let r = ring("healthy", healthy_hash, 400, None).run(&p);
        busy.store(false, Ordering::Relaxed);
        r
    });
    assert!(
        healthy.elapsed > Duration::from_secs_f64(2.0 * INTERVAL),
        "{:?}",
        healthy.elapsed
    );

    // (a) Rank 1 stops posting after 3 steps of its third AllReduce, for the threshold plus
    // four intervals.
    let hold = Duration::from_secs_f64(THRESHOLD + 4.0 * INTERVAL);
    let stall = Stall::new(1, 2, 3, hold);
    let report = ring("stall", stall_hash, 4, Some(stall.clone())).run(&p);
    let (_, began) = stall.began().expect("rank 1 stopped posting");
    assert!(report.elapsed >= hold, "{:?}", report.elapsed);

    let path = dir.join(format!("out-{}.jsonl", std::process::id()));
    let reqs = decode(&std::fs::read_to_string(&path).unwrap());
    sx::check_documented(&reqs);

    for rank in 0..3 {
        assert_eq!(episodes(&reqs, healthy_hash, rank), 0.0, "healthy rank {rank}");
        assert_eq!(hang_warnings(healthy_hash, rank), 0, "{:?}", logger::warnings());
        let stuck = series(&reqs, "nccl.progress.hang.stuck", healthy_hash, rank);
        assert!(stuck.is_empty(), "healthy rank {rank}: {stuck:?}");
    }

    let deadline = began + Duration::from_secs_f64(THRESHOLD + 2.0 * INTERVAL);
    let expected = [(0, "peer", Some("1")), (2, "recv", Some("1")), (1, "proxy", None)];
    for (rank, wait, peer) in expected {
        let stuck = series(&reqs, "nccl.progress.hang.stuck", stall_hash, rank);
        let named =
            |a: &BTreeMap<String, String>| a["nccl.wait"] == wait && a.get("nccl.peer").map(String::as_str) == peer;
        let first = stuck
            .iter()
            .find(|(_, a, v)| *v > 0.0 && named(a))
            .unwrap_or_else(|| panic!("rank {rank} never named {wait} {peer:?}: {stuck:?}"));
        let after = first.0.duration_since(began).unwrap_or_default();
        eprintln!("rank {rank}: {wait} {peer:?} exported {after:?} after the stall began");
        assert!(
            first.0 <= deadline,
            "rank {rank}: detected {after:?} after the stall began"
        );
        assert!(
            stuck.iter().all(|(_, a, _)| named(a)),
            "rank {rank} also named something else: {stuck:?}"
        );
        assert!(
            stuck.iter().any(|(t, _, v)| *v == 0.0 && *t > first.0),
            "rank {rank}: the stuck series did not return to 0: {stuck:?}"
        );
        assert_eq!(episodes(&reqs, stall_hash, rank), 1.0, "rank {rank}");
        assert_eq!(hang_warnings(stall_hash, rank), 1, "{:?}", logger::warnings());
        let oldest = series(&reqs, "nccl.progress.oldest.seq", stall_hash, rank);
        assert!(
            oldest
                .iter()
                .any(|(t, a, v)| same_export(*t, first.0) && *v == 2.0 && a["nccl.func"] == "AllReduce"),
            "rank {rank}: the stuck AllReduce is seqNumber 2: {oldest:?}"
        );
        let completed = series(&reqs, "nccl.progress.completed.seq", stall_hash, rank);
        assert!(
            completed.iter().any(|(t, _, v)| same_export(*t, first.0) && *v == 1.0),
            "rank {rank}: seqNumber 1 completed last: {completed:?}"
        );
    }
    p.close();
}

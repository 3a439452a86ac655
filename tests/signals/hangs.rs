//! Hang attribution against the emulator's own truth of who is stuck, on three-rank rings (ring
//! r → r+1). Each case runs in a child process of its own (one NCCL release, exporter file and
//! threshold per process); the parent reads its output, where NCCL 2.23–2.26 (no logger) get
//! the plugin's WARN lines:
//! - (e) rank 1's GPU stops while the data of its receives arrived (NCCL 2.30.7): rank 1 reports
//!   `gpu` with no peer (NcclRankHung), rank 2, which receives from it, `recv` from 1; nobody
//!   else reports itself stuck;
//! - (f) rank 1 stops posting its receives on NCCL 2.23.4, 2.25.1 and 2.26.6, where the rank
//!   sending to it sees SendRemFifoWait repeats: rank 0 reports `peer` 1, rank 2 `recv` 1 (from its
//!   receive op's RecvPosted and RecvReceived), rank 1 `unknown` (these releases have no step
//!   events the plugin uses), each under the communicator hash and rank learned from the
//!   collective before, in the exported series and the log line. The P2P receives the plugin declines come back from 2.23–2.25 as
//!   `stopEvent(NULL)` (a Send/Recv on another communicator): not rejected inputs (`events.rejected{nccl.reason=null_arg}` stays 0),
//!   while a NULL stop through a table whose NCCL never sends one still counts;
//! - (g) two AllReduces longer than the threshold and than a window's grace period: no hang, no
//!   record lost as late (the window waits for the stops of its operations while they progress).

use std::path::Path;
use std::time::{Duration, SystemTime};

use nccl_profiler_otel::ffi;
use nccl_profiler_otel::stats::STATS;

use super::support::emulator::release::{self, Release};
use super::support::emulator::{Call, CommSpec, GpuStall, Link, Network, Plugin, Stall, Workload, logger};
use super::support::otlp_receiver::{ExportMetricsServiceRequest, metrics, points};
use super::support::process;
use super::{decode, episodes, series};

/// Which case a child runs: `gpu` or a release.
const CASE: &str = "NCCL_TEST_HANG_CASE";
const INTERVAL: f64 = 0.1;
const THRESHOLD: f64 = 0.5;
const HASH: u64 = 0x4A46_0001;

/// Runs case `case` in a child process and returns what it wrote (stdout and stderr), one job of
/// this binary at a time.
fn parent(case: &str) -> String {
    let _serial = super::serial();
    let out = process::child(module_path!(), "child", CASE, case).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    eprintln!("{text}");
    assert!(out.status.success(), "case {case}: {}", out.status);
    assert!(text.contains("test result: ok. 1 passed"), "case {case} did not run");
    text
}

#[test]
fn a_gpu_that_stops_consuming_names_itself() {
    parent("gpu");
}

#[test]
fn a_peer_that_never_posts_is_named_on_2_23() {
    legacy("2.23.4");
}

#[test]
fn a_peer_that_never_posts_is_named_on_2_25() {
    legacy("2.25.1");
}

#[test]
fn a_peer_that_never_posts_is_named_on_2_26() {
    legacy("2.26.6");
}

/// (g) A collective longer than the hang threshold and than a window's grace period (one interval)
/// keeps progressing: no hang, and its window waits for its stops (none lost as late).
#[test]
fn a_long_collective_that_progresses_is_no_hang() {
    parent("long");
}

/// Case (f) on `release`: its hang lines (stderr) name the peer, all under the learned identity.
fn legacy(release: &str) {
    let text = parent(release);
    for (rank, what) in [
        (0, "peer 1 not ready to receive"),
        (1, "unknown"),
        (2, "waiting for data from peer 1"),
    ] {
        let line = format!("hang: communicator {HASH:#x} '' rank {rank}: AllReduce seq 1");
        let lines: Vec<&str> = text.lines().filter(|l| l.contains(&line)).collect();
        assert_eq!(
            lines.len(),
            1,
            "NCCL {release}, rank {rank}: one line {line:?}: {lines:?}"
        );
        assert!(lines[0].contains(what), "NCCL {release}, rank {rank}: {}", lines[0]);
    }
}

/// One case, in the child process only.
#[test]
#[ignore]
fn child() {
    let Some(case) = process::case(CASE) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("nccl-otel-hangs-{}", std::process::id()));
    // SAFETY: this process's only test, before its first `init`.
    let path = unsafe { super::export_to(&dir, INTERVAL, THRESHOLD, &[]) };
    if case == "long" {
        return long(&dir, &path);
    }
    let gpu = case == "gpu";
    release::set(if gpu {
        Release::V2_30_7
    } else {
        Release::parse(&case).unwrap()
    });
    let p = Plugin::in_process();
    // The second AllReduce (seqNumber 1) stops after 3 steps of each op, for the threshold plus
    // six intervals. Another communicator's Send/Recv has receives the plugin declines (on the
    // stalled one it would complete after the AllReduce it follows, which NCCL's stream forbids).
    let hold = Duration::from_secs_f64(THRESHOLD + 6.0 * INTERVAL);
    let ring = CommSpec::new("hang", 0..3)
        .channels(2)
        .with_hash(HASH)
        .call(Call::all_reduce(6 << 20));
    let p2p = CommSpec::new("p2p", 0..3).call(Call::send_recv(1, 64 << 10));
    let net = Network::new(3, 1, Link::new_us(30.0, 1.0));
    let workload = Workload::new(net).comm(ring).comm(p2p).iterations(2);
    let (stuck, began) = if gpu {
        let stall = GpuStall::new(1, 1, 3, hold);
        workload.options(|o| o.gpu_stall = Some(stall.clone())).run(&p);
        (stall.0.rank, stall.began().expect("rank 1's GPU stopped").1)
    } else {
        let stall = Stall::new(1, 1, 3, hold);
        workload.options(|o| o.stall = Some(stall.clone())).run(&p);
        (stall.rank, stall.began().expect("rank 1 stopped posting").1)
    };
    assert_eq!(stuck, 1);
    let reqs = decode(&std::fs::read_to_string(&path).unwrap());
    let _ = std::fs::remove_dir_all(&dir);

    // Who names whom: (rank, nccl.wait, nccl.peer), named while the stall lasts (how soon is
    // the main test's).
    // NCCL 2.23–2.26 have no step events the plugin uses: rank 1 itself reports `unknown`.
    let expected: &[(i32, &str, Option<&str>)] = if gpu {
        &[(1, "gpu", None), (2, "recv", Some("1"))]
    } else {
        &[(0, "peer", Some("1")), (1, "unknown", None), (2, "recv", Some("1"))]
    };
    let deadline = began + hold;
    for &(rank, wait, peer) in expected {
        let (first, _) = super::stuck_on(&reqs, HASH, rank, (wait, peer));
        let after = first.duration_since(began).unwrap_or_default();
        eprintln!("{case}: rank {rank}: {wait} {peer:?} exported {after:?} after the stall began");
        assert!(
            first < deadline,
            "{case}: rank {rank} named it {after:?} after the stall began"
        );
        assert_eq!(episodes(&reqs, HASH, rank), 1.0, "{case}: rank {rank}");
    }
    // Only the stuck rank says it is stuck itself (the waits NcclRankHung reads).
    for rank in [0, 2] {
        let own = series(&reqs, "nccl.progress.hang.stuck", HASH, rank);
        assert!(
            own.iter()
                .all(|(_, a, ..)| !matches!(a["nccl.wait"].as_str(), "gpu" | "proxy")),
            "{case}: rank {rank} reports itself stuck: {own:?}"
        );
    }
    // Nothing was counted under an identity the plugin had not learned.
    assert!(
        series(&reqs, "nccl.progress.hang.episodes", 0, -1).is_empty(),
        "{case}: episodes under hash 0x0, rank -1"
    );
    if gpu {
        let lines: Vec<String> = logger::warnings()
            .into_iter()
            .filter(|w| w.contains(&format!("hang: communicator {HASH:#x} 'hang' rank 1/3: ")))
            .collect();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("waiting for the local GPU"), "{}", lines[0]);
    }

    // NULL stops: none rejected here; through a v1–v2 table one is declined, through v3 rejected.
    assert_eq!(rejected_null(&reqs), 0.0, "{case}: stopEvent(NULL) counted as rejected");
    if !gpu {
        let (null, declined) = (STATS.null_args.get(), STATS.declined.get());
        let stop = |f: Option<unsafe extern "C" fn(*mut std::ffi::c_void) -> _>| {
            // SAFETY: a NULL handle, as NCCL passes it.
            unsafe { f.unwrap()(std::ptr::null_mut()) };
        };
        stop(ffi::ncclProfiler_v2.get().stopEvent);
        assert_eq!((STATS.null_args.get(), STATS.declined.get()), (null, declined + 1));
        stop(ffi::ncclProfiler_v3.get().stopEvent);
        assert_eq!((STATS.null_args.get(), STATS.declined.get()), (null + 1, declined + 1));
    }
    p.close();
}

/// Case (g), in the child: two AllReduces of about 1.4 s each on 1 GB/s links (the emulator
/// measures them), at an interval of 0.1 s and a threshold of 0.5 s.
fn long(dir: &Path, path: &Path) {
    release::set(Release::V2_31_2);
    let p = Plugin::in_process();
    let ring = CommSpec::new("long", 0..3)
        .with_hash(HASH)
        .call(Call::all_reduce(1 << 30));
    let report = Workload::new(Network::new(3, 1, Link::new_us(30.0, 1.0)))
        .comm(ring)
        .iterations(2)
        .run(&p);
    p.close();
    let reqs = decode(&std::fs::read_to_string(path).unwrap());
    let _ = std::fs::remove_dir_all(dir);
    let threshold = Duration::from_secs_f64(THRESHOLD);
    for c in &report.collectives {
        let took = c.last_op_stop.expect("stopped").duration_since(c.start);
        assert!(
            took > 2 * threshold,
            "rank {} seq {}: {took:?} is no long collective",
            c.rank,
            c.seq
        );
    }
    for rank in 0..3 {
        assert_eq!(
            episodes(&reqs, HASH, rank),
            0.0,
            "rank {rank}: {:?}",
            logger::warnings()
        );
        let late: f64 = series(&reqs, "nccl.profiler.events.dropped", HASH, rank)
            .iter()
            .filter(|(_, a, ..)| a["nccl.reason"] == "late")
            .map(|p| p.2)
            .fold(0.0, f64::max);
        assert_eq!(late, 0.0, "rank {rank}: records lost as late");
    }
}

/// The last value of `nccl.profiler.events.rejected{nccl.reason=null_arg}`.
fn rejected_null(reqs: &[ExportMetricsServiceRequest]) -> f64 {
    let all: Vec<(SystemTime, f64)> = metrics(reqs)
        .into_iter()
        .filter(|m| m.name == "nccl.profiler.events.rejected")
        .flat_map(points)
        .filter(|p| p.attrs.get("nccl.reason").map(String::as_str) == Some("null_arg"))
        .map(|p| (SystemTime::UNIX_EPOCH + Duration::from_nanos(p.time), p.value))
        .collect();
    assert!(!all.is_empty(), "no events.rejected series");
    all.into_iter().max_by_key(|p| p.0).map_or(0.0, |p| p.1)
}

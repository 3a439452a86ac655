//! Every scenario the emulator knows, through the plugin linked into this test and through the
//! built `.so` loaded like NCCL loads it: several communicators, intra-node communicators without
//! ProxyOps, KernelCh with GPU timers, ProxyCtrl bursts, NetPlugin events, CollNet ProxyOps that
//! are never stopped, restarted receive steps, PXN ops from a foreign pid, AllReduce, AllGather,
//! ReduceScatter, Broadcast, Send/Recv and AlltoAll at mixed sizes; then `finalize` and
//! `dlclose`. The mask asks for every event type a v4 plugin can receive, so the plugin also
//! sees the types it declines.
//!
//! Zero crashes: the process survives, every callback returns `ncclSuccess` and writes
//! `*eHandle` (checked by the emulator on each call), the in-process plugin caught no panic, and
//! what it recorded adds up with what the emulator did.

#[path = "support"]
mod support {
    pub mod emulator;
}

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use nccl_profiler_otel::aggregate::WindowSummary;
use nccl_profiler_otel::stats::STATS;
use nccl_profiler_otel::telemetry::{self, Sink};
use parking_lot::{Mutex, MutexGuard};
use support::emulator::release::Release;
use support::emulator::{
    self, Call, CommSpec, Link, LoadError, Network, Plugin, Report, Version, Workload, logger, mask,
};

#[derive(Default)]
struct Capture(Mutex<Vec<WindowSummary>>);

impl Sink for Capture {
    fn window(&self, summary: &WindowSummary) {
        self.0.lock().push(summary.clone());
    }
}

fn setup() -> (MutexGuard<'static, ()>, &'static Arc<Capture>) {
    static SETUP: OnceLock<(Arc<Capture>, Mutex<()>)> = OnceLock::new();
    let (capture, serial) = SETUP.get_or_init(|| {
        // A window's grace period is one interval: under a sanitizer (5-15x slower, on a loaded
        // machine) a preempted proxy thread may exceed 50 ms and its late steps are then counted,
        // not recorded, which the exact comparisons below do not allow.
        let interval = if std::env::var_os("SANITIZER").is_some() {
            "0.5"
        } else {
            "0.05"
        };
        // SAFETY: runs once, before the first `init` (of either plugin copy) reads the environment.
        unsafe {
            std::env::set_var("NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC", interval);
            std::env::set_var("NCCL_PROFILE_EVENT_MASK", format!("{:#x}", mask::ALL_V4));
            std::env::set_var("NCCL_PROFILER_OTEL_EXPORTER", "none");
        }
        let capture = Arc::new(Capture::default());
        telemetry::add_sink(capture.clone());
        (capture, Mutex::new(()))
    });
    (serial.lock(), capture)
}

/// Two nodes of four ranks: a world communicator over both (network ring hops 3 → 4, a slow
/// link, and 7 → 0; PXN on its last channel), a node-local one (no ProxyOps), a cross-node
/// pipeline pair, and a CollNet group whose ProxyOps are never stopped.
fn everything(iterations: usize) -> Workload {
    let net = Network::new(8, 4, Link::new_us(40.0, 10.0))
        .slow_link(3, 4, 3.0)
        .with_jitter(0.03);
    let sizes = [4u64 << 10, 64 << 10, 1 << 20];
    let mut world_calls = Vec::new();
    for &b in &sizes {
        world_calls.extend([
            Call::all_reduce(b),
            Call::all_gather(b / 8),
            Call::reduce_scatter(b / 8),
            Call::broadcast(b, 5),
        ]);
    }
    world_calls.push(Call::all_to_all(16 << 10));
    world_calls.push(Call::all_reduce(16 << 20)); // several chunks per step slot
    let world = CommSpec::new("world", 0..8).channels(2).calls(world_calls);
    let node = CommSpec::new("node1", 4..8)
        .channels(2)
        .calls([Call::all_reduce(2 << 20), Call::all_gather(256 << 10)]);
    let pipe = CommSpec::new("pipe", [2, 6]).calls([Call::send_recv(1, 512 << 10), Call::send_recv(1, 0)]);
    let collnet = CommSpec::new("collnet", [0, 4]).calls([Call::all_reduce(1 << 20).collnet()]);
    let solo = CommSpec::new("solo", [1]).calls([Call::all_reduce(1 << 20)]); // 1 rank: no events
    Workload::new(net)
        .comm(world)
        .comm(node)
        .comm(pipe)
        .comm(collnet)
        .comm(solo)
        .iterations(iterations)
        .options(|o| {
            o.chunk_bytes = 512 << 10;
            o.pxn = true;
            o.restart_recv = true;
            o.net_plugin = true;
            o.peer_waits = 3;
        })
}

/// Summaries for the communicators of `report`, once `complete` says they are all there, or once
/// five seconds pass without a new one (`finalize` delivers its last windows itself, but ones the
/// telemetry thread processed just before may still be on their way, slowly under a sanitizer).
fn summaries_until(
    capture: &Capture,
    report: &Report,
    complete: impl Fn(&[WindowSummary]) -> bool,
) -> Vec<WindowSummary> {
    const QUIET: Duration = Duration::from_secs(5);
    let hashes: BTreeSet<u64> = report.collectives.iter().map(|c| c.hash).collect();
    let mut last_new = Instant::now();
    let mut mine = Vec::new();
    loop {
        std::thread::sleep(telemetry::TICK);
        {
            let mut all = capture.0.lock();
            let (m, rest): (Vec<_>, Vec<_>) = all.drain(..).partition(|w| hashes.contains(&w.comm.hash));
            *all = rest;
            if !m.is_empty() {
                last_new = Instant::now();
            }
            mine.extend(m);
        }
        if complete(&mine) || last_new.elapsed() > QUIET {
            return mine;
        }
    }
}

/// Summaries for the communicators of `report`, once every transfer it made is accounted for.
fn summaries(capture: &Capture, report: &Report) -> Vec<WindowSummary> {
    summaries_until(capture, report, |w| {
        w.iter().flat_map(|w| &w.links).map(|l| l.transfers).sum::<u64>() >= report.steps
    })
}

#[test]
fn every_scenario_in_process() {
    let (_serial, capture) = setup();
    let plugin = Plugin::in_process();
    let panics = STATS.panics.get();
    let unmatched = STATS.foreign_unmatched.get();
    let report = everything(2).run(&plugin);
    assert_eq!(STATS.panics.get(), panics, "no panic caught in any callback");
    assert!(report.callbacks > 5_000, "{} callbacks", report.callbacks);
    // v1–v3 (NCCL 2.23–2.26): another process's PXN ops cannot be attributed (its contexts
    // carry no hash) and are counted instead; no GPU times.
    let legacy = plugin.driving().legacy();
    let counted = |s: &&emulator::truth::StepTruth| !(legacy && s.pxn);
    let windows = summaries_until(capture, &report, |w| {
        let own = report.links.iter().flat_map(|l| &l.steps).filter(counted).count() as u64;
        w.iter().flat_map(|w| &w.links).map(|l| l.transfers).sum::<u64>() >= own
    });

    // Per communicator, every network transfer the emulator made was recorded, under the rank
    // that sent it (PXN ops too: they may land under another local rank of the same hash).
    let mut emulated: HashMap<(u64, i32, i32), u64> = HashMap::new();
    for l in &report.links {
        *emulated.entry((l.hash, l.rank, l.peer)).or_default() += l.steps.iter().filter(counted).count() as u64;
    }
    emulated.retain(|_, n| *n > 0);
    let mut recorded: HashMap<(u64, i32, i32), u64> = HashMap::new();
    for w in &windows {
        for l in &w.links {
            *recorded.entry((w.comm.hash, l.rank, l.peer)).or_default() += l.transfers;
        }
    }
    let keys: BTreeSet<_> = recorded.keys().chain(emulated.keys()).collect();
    let differ: Vec<_> = keys
        .into_iter()
        .filter(|k| recorded.get(k) != emulated.get(k))
        .map(|k| (k, recorded.get(k), emulated.get(k)))
        .collect();
    assert!(
        differ.is_empty(),
        "transfers per (comm, rank, peer): recorded vs emulated {differ:?}"
    );
    assert!(report.steps > 1000, "{} network transfers", report.steps);

    // Nothing the emulator did leaves the plugin with orphans or open events: receive steps
    // (restarted ones included) are declined, CollNet ops never progress so nothing waits for
    // them, PXN ops have no parent to miss.
    for w in &windows {
        assert_eq!(
            (w.stats.orphans, w.stats.unfinished),
            (0, 0),
            "{}: {:?}",
            w.comm.name,
            w.stats
        );
    }

    // And the bytes add up per link.
    let mut emulated_bytes: HashMap<(u64, i32, i32), u64> = HashMap::new();
    for l in &report.links {
        let bytes: u64 = l.steps.iter().filter(counted).map(|s| s.bytes).sum();
        *emulated_bytes.entry((l.hash, l.rank, l.peer)).or_default() += bytes;
    }
    emulated_bytes.retain(|_, b| *b > 0);
    let mut recorded_bytes: HashMap<(u64, i32, i32), u64> = HashMap::new();
    for w in &windows {
        for l in &w.links {
            *recorded_bytes.entry((w.comm.hash, l.rank, l.peer)).or_default() += l.bytes;
        }
    }
    assert_eq!(recorded_bytes, emulated_bytes, "bytes per (comm, rank, peer)");

    // Node-local collectives have no ProxyOps: no host time, and a GPU time from the kernel
    // channels' pTimers, which the emulator knows exactly (v1–v3: no time at all).
    let node: Vec<_> = report.collectives.iter().filter(|c| c.comm == "node1").collect();
    assert_eq!(node.len(), 4 * 2 * 2);
    for t in node {
        let want = t.gpu.map(|(a, b)| (b - a) as f64 / 1e9);
        assert_eq!(want.is_none(), legacy, "KernelCh ran from v4 on");
        let found = windows
            .iter()
            .filter(|w| (w.comm.hash, w.comm.rank) == (t.hash, t.rank))
            .flat_map(|w| &w.colls)
            .filter(|g| g.key.func.as_str() == t.func.name())
            .flat_map(|g| &g.ops)
            .any(|o| o.duration.is_none() && o.gpu.map(|d| (d - want.unwrap_or(d)).abs() < 1e-9) == want.map(|_| true));
        assert!(found, "GPU duration {want:?} s of {t:?}");
    }

    // Broadcast emits Coll events; a 1-rank communicator emits nothing.
    // Collectives whose PXN send op another process (here: the same one) ran, counted there
    // (v1–v3: the ops are counted as unmatched instead).
    let pxn = report.collectives.iter().filter(|c| c.pxn).count() as u64;
    assert!(pxn > 0);
    let pxn_ops = report.links.iter().flat_map(|l| &l.steps).filter(|s| s.pxn).count();
    if legacy {
        assert_eq!(windows.iter().map(|w| w.stats.pxn_collectives).sum::<u64>(), 0);
        assert!(STATS.foreign_unmatched.get() > unmatched && pxn_ops > 0);
    } else {
        assert_eq!(windows.iter().map(|w| w.stats.pxn_collectives).sum::<u64>(), pxn);
    }
    assert!(report.collectives.iter().any(|c| c.func == emulator::Func::Broadcast));
    assert!(!report.collectives.iter().any(|c| c.comm == "solo"));
    assert!(windows.iter().all(|w| w.comm.name != "solo"));
    assert!(logger::warnings().is_empty(), "{:?}", logger::warnings());
}

/// What NCCL emits only at the API level: a Broadcast on the AllGatherV path (2.29+, unless
/// `NCCL_ALLGATHERV_ENABLE=0`) and a symmetric-kernel collective on 2.29–2.30 have only GroupApi
/// and CollApi, a copy-engine collective (2.29+) CeColl; the plugin counts and sizes them from
/// those through v5+ (CE: as CE from v6, as an unclaimed API call through the 2.29–2.30 v5 adapter) and sees nothing of them through the v4 adapter. Before 2.29 all
/// run as ordinary collectives; from 2.31 a symmetric kernel emits a Coll.
#[test]
fn api_level_collectives_are_counted_where_the_table_can_see_them() {
    let (_serial, capture) = setup();
    let plugin = Plugin::in_process();
    let (release, abi) = (plugin.release(), plugin.driving());
    let net = Network::new(4, 2, Link::new_us(20.0, 10.0));
    let calls = [
        Call::broadcast(1 << 20, 0),
        Call::all_gather(256 << 10).copy_engine(),
        Call::all_reduce(64 << 10),
        Call::all_reduce(128 << 10).symmetric(),
    ];
    let api_only_symmetric = release.copy_engine() && !release.profiler_thread();
    let report = Workload::new(net)
        .comm(CommSpec::new("api-level", 0..4).channels(2).calls(calls))
        .iterations(2)
        .run(&plugin);
    let visible = |c: &emulator::CollTruth| match c.func {
        emulator::Func::Broadcast if release.allgatherv_broadcast() => abi >= Version::V5,
        // Through the v5 adapter of 2.29–2.30 a CE collective is an API call nothing claims.
        emulator::Func::AllGather if c.ce => abi >= Version::V6 || (abi == Version::V5 && api_only_symmetric),
        _ if c.sym && api_only_symmetric => abi >= Version::V5,
        _ => true,
    };
    let mut want: BTreeMap<(&str, bool), (usize, u64)> = BTreeMap::new();
    for c in report.collectives.iter().filter(|c| visible(c)) {
        let e = want.entry((c.func.name(), c.ce && abi >= Version::V6)).or_default();
        // v1–v3 do not tell the communicator's size: an AllGather's nccl-tests size is unknown.
        let size_unknown = abi.legacy() && c.func == emulator::Func::AllGather;
        (e.0, e.1) = (e.0 + 1, e.1 + if size_unknown { 0 } else { c.bytes });
    }
    let total: usize = want.values().map(|v| v.0).sum();
    let count = |w: &[WindowSummary]| w.iter().flat_map(|w| &w.colls).map(|g| g.ops.len()).sum::<usize>();
    let windows = summaries_until(capture, &report, |w| count(w) >= total);
    let mut got: BTreeMap<(&str, bool), (usize, u64)> = BTreeMap::new();
    for g in windows.iter().flat_map(|w| &w.colls) {
        let e = got
            .entry((g.key.func.as_str(), g.key.algo.as_str() == "CE"))
            .or_default();
        // The Coll of an AllGather reports the per-rank part; its nccl-tests size is × nranks.
        let per_rank: u64 = g
            .ops
            .iter()
            .map(|o| {
                if g.key.func.as_str() == "AllGather" {
                    o.bytes / 4
                } else {
                    o.bytes
                }
            })
            .sum();
        (e.0, e.1) = (e.0 + g.ops.len(), e.1 + per_rank);
        let api_only = (g.key.func.as_str() == "Broadcast" && release.allgatherv_broadcast())
            || (g.key.algo.as_str() == "Unknown" && api_only_symmetric);
        if g.key.algo.as_str() == "CE" || api_only {
            assert!(
                g.ops.iter().all(|o| o.duration.is_none() && o.gpu.is_none()),
                "no time is given: {g:?}"
            );
        }
    }
    assert_eq!(
        got, want,
        "operations and bytes by (function, copy engine) on NCCL {release} through {abi}"
    );
}

/// `graphCaptured` of the API events (2.28+) reaches the figures of the calls' collectives and
/// sends as `graph`: through the v5+ tables; absent (`None`) where NCCL does not say (before
/// 2.28, or through the v4 adapter).
#[test]
fn graph_capture_is_told_from_the_api_events() {
    let (_serial, capture) = setup();
    let plugin = Plugin::in_process();
    let told = plugin.release().api_events() && plugin.driving() >= Version::V5;
    for captured in [false, true] {
        let net = Network::new(4, 2, Link::new_us(20.0, 10.0));
        let calls = [Call::all_reduce(64 << 10), Call::all_to_all(16 << 10)];
        let report = Workload::new(net)
            .comm(CommSpec::new("graph", 0..4).channels(2).calls(calls))
            .options(|o| o.captured = captured)
            .run(&plugin);
        let sends = report
            .collectives
            .iter()
            .filter(|c| c.func != emulator::Func::Recv)
            .count();
        let ops = |w: &[WindowSummary]| {
            let colls = w.iter().flat_map(|w| &w.colls).map(|g| g.ops.len());
            colls
                .chain(w.iter().flat_map(|w| &w.p2ps).map(|g| g.ops.len()))
                .sum::<usize>()
        };
        let windows = summaries_until(capture, &report, |w| ops(w) >= sends);
        assert_eq!(ops(&windows), sends);
        let want = told.then_some(captured);
        let colls = windows.iter().flat_map(|w| &w.colls).map(|g| g.key.graph);
        let p2ps = windows.iter().flat_map(|w| &w.p2ps).map(|g| g.graph);
        assert!(
            colls.chain(p2ps).all(|g| g == want),
            "graph {want:?} on NCCL {} through {}",
            plugin.release(),
            plugin.driving()
        );
    }
}

#[test]
fn the_mask_decides_what_nccl_starts() {
    let (_serial, capture) = setup();
    let plugin = Plugin::in_process();
    let net = Network::new(2, 1, Link::new_us(20.0, 10.0));
    // Coll only: no proxy events at all, so no transfers reach the plugin.
    let report = Workload::new(net)
        .comm(CommSpec::new("coll-only", 0..2).calls([Call::all_reduce(256 << 10)]))
        .iterations(2)
        .options(|o| o.mask = Some(mask::COLL))
        .run(&plugin);
    assert!(report.steps > 0, "the network still carried the data");
    let colls = |w: &[WindowSummary]| w.iter().flat_map(|w| &w.colls).map(|g| g.ops.len()).sum::<usize>();
    let windows = summaries_until(capture, &report, |w| colls(w) >= 4);
    assert!(windows.iter().all(|w| w.links.is_empty()));
    assert_eq!(colls(&windows), 4, "2 ranks × 2 iterations");
}

#[test]
fn every_scenario_through_the_built_library() {
    let (_serial, _) = setup();
    let path = emulator::built_library().expect("cargo test builds the cdylib");
    let plugin = Plugin::load(&path).expect("dlopen");
    if std::env::var_os("EMU_PROFILER_ABI").is_none() {
        assert_eq!(
            plugin.found(),
            plugin.release().lookup_order(),
            "every table is exported"
        );
    }
    assert_eq!(
        Some(&plugin.driving()),
        plugin.found().first(),
        "NCCL takes the newest table it knows"
    );
    assert_eq!(plugin.name(), "otel");
    let report = everything(1).run(&plugin);
    assert!(
        report.callbacks > 3_000 && report.steps > 500,
        "{} callbacks, {} steps",
        report.callbacks,
        report.steps
    );
    // NCCL 2.23–2.26 pass no logger: the line goes to stderr under NCCL_DEBUG=INFO.
    let chose = format!("NCCL {} chose profiler ABI {}", plugin.release(), plugin.driving());
    assert!(
        plugin.driving().legacy() || logger::lines().iter().any(|l| l.text.contains(&chose)),
        "the init log line names the ABI version: {chose}"
    );
    // init → finalize → init on the same library, then dlclose.
    let again = everything(1).run(&plugin);
    assert!(again.steps > 500);
    plugin.close();
    let plugin = Plugin::load(&path).expect("dlopen after dlclose");
    assert!(everything(1).run(&plugin).steps > 500);
    plugin.close();
}

#[test]
fn versions_are_looked_up_like_nccl() {
    let path = emulator::built_library().expect("cargo test builds the cdylib");
    for v in Version::ALL {
        match Plugin::load_version(&path, v) {
            Ok(p) => {
                assert!(
                    !v.legacy() || v == emulator::release::current().newest_abi(),
                    "{v} loaded"
                );
                assert_eq!((p.found(), p.driving()), (&[v][..], v));
                p.close();
            }
            // v1–v3 through a newer release's adapter: never NCCL's choice for this plugin.
            Err(e @ LoadError::Unsupported { .. }) => {
                assert!(v.legacy() && e.to_string().contains("through its adapter"), "{e}")
            }
            Err(e) => panic!("{e}"),
        }
    }
    // Each release looks up its own tables, newest first (spec 5, 7.6).
    assert_eq!(Release::parse("2.31.2"), Some(Release::V2_31_2));
    assert_eq!(Release::parse("2.31"), None);
    assert_eq!(Release::V2_27_7.to_string(), "2.27.7");
    let newest: Vec<Version> = Release::ONE_PER_ABI.iter().map(|r| r.newest_abi()).collect();
    assert_eq!(newest, Version::ALL);
    assert_eq!(Release::V2_25_1.lookup_order(), [Version::V2, Version::V1]);
    assert!(matches!(
        Plugin::load(std::path::Path::new("/nonexistent/libnccl-profiler-otel.so")),
        Err(LoadError::Open(_))
    ));
}

#[test]
fn the_training_preset_runs_with_progress() {
    let (_serial, capture) = setup();
    let plugin = Plugin::in_process();
    let net = Network::new(4, 1, Link::new_us(50.0, 10.0)).slow_link(1, 2, 4.0);
    let seen = std::sync::atomic::AtomicUsize::new(0);
    let report = Workload::training(net, 2).run_with_progress(&plugin, &|done, total| {
        assert!(done <= total && total == 4 * 2);
        seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    });
    assert_eq!(seen.into_inner(), 8, "one call per rank and iteration");
    let links = report.world_links();
    assert_eq!(links.len(), 12, "the AlltoAll touches every pair");
    let slow = links.iter().find(|l| (l.src, l.dst) == (1, 2)).expect("1 → 2");
    assert!(slow.configured.bandwidth < 3e9);
    let pp = report.collectives.iter().find(|c| c.comm == "pp").expect("pp ran").hash;
    assert!(summaries(capture, &report).iter().any(|w| w.comm.hash == pp));
}

//! NCCL 2.31's ABI v7 through the plugin's v7 table, driven as 2.31.2 drives it (KernelCh and
//! KernelPhase from the profiler thread): the application's tags group collectives and P2P sends
//! exactly as the emulator issued them, kernel phase durations equal the emulator's pTimers, and
//! both reach the OTLP export (`nccl.user_tag`, `nccl.kernel.phase.duration`), decoded with the
//! official types from the `file` exporter's lines.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::emulator::release::{self, Release};
use crate::support::emulator::{Call, CommSpec, Func, Link, Network, Plugin, Proto, Version, Workload, mask};
use crate::support::otlp_receiver::{ExportMetricsServiceRequest, metrics, points};
use nccl_profiler_otel::aggregate::WindowSummary;
use nccl_profiler_otel::telemetry::{self, Sink};
use parking_lot::Mutex;

#[derive(Default)]
struct Capture(Mutex<Vec<WindowSummary>>);

impl Sink for Capture {
    fn window(&self, summary: &WindowSummary) {
        self.0.lock().push(summary.clone());
    }
}

#[test]
fn user_tags_and_kernel_phases_match_the_emulator() {
    release::set(Release::V2_31_2);
    let file = std::env::temp_dir().join(format!("nccl-otel-abi-v7-{}.jsonl", std::process::id()));
    // SAFETY: the only test of this binary that runs the plugin (`layout` reads no environment),
    // before the first `init` reads the environment.
    unsafe {
        std::env::set_var("NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC", "0.05");
        std::env::set_var("NCCL_PROFILER_OTEL_KERNEL_CH_EVERY", "1");
        std::env::set_var("NCCL_PROFILER_OTEL_EXPORTER", "file");
        std::env::set_var("NCCL_PROFILER_OTEL_EXPORT_FILE", &file);
        // Every family: the catalogue check expects the channel and transfer ones too.
        std::env::set_var("NCCL_PROFILER_OTEL_DETAIL", "full");
    }
    let capture = Arc::new(Capture::default());
    telemetry::add_sink(capture.clone());
    let plugin = Plugin::in_process();
    assert_eq!(plugin.driving(), Version::V7);

    // Two nodes of two ranks: every channel of the ring waits for a peer across the network.
    let net = Network::new(4, 2, Link::new_us(20.0, 10.0));
    let calls = [
        Call::all_reduce(1 << 20).tagged(1),
        Call::all_reduce(1 << 20).tagged(2),
        Call::all_reduce(1 << 20),
        Call::all_reduce(256 << 10).proto(Proto::Ll128).tagged(1 << 63 | 9),
        Call::all_gather(128 << 10).tagged(1),
        Call::all_to_all(64 << 10).tagged(3),
        Call::send_recv(1, 64 << 10),
    ];
    let report = Workload::new(net)
        .comm(CommSpec::new("tagged", 0..4).channels(2).calls(calls))
        .iterations(2)
        .run(&plugin);
    assert_ne!(
        plugin.mask() & mask::KERNEL_PHASE,
        0,
        "KernelPhase comes with KernelCh on 2.31"
    );

    // What the emulator issued: operations per (function, tag); receives are not recorded.
    let mut issued: BTreeMap<(&str, u64), usize> = BTreeMap::new();
    for c in report.collectives.iter().filter(|c| c.func != Func::Recv) {
        *issued.entry((c.func.name(), c.tag)).or_default() += 1;
    }
    let want: usize = issued.values().sum();
    let mut recorded: BTreeMap<(&str, u64), usize> = BTreeMap::new();
    let mut phases: [Vec<u64>; 3] = Default::default();
    let deadline = Instant::now() + Duration::from_secs(10);
    while recorded.values().sum::<usize>() < want && Instant::now() < deadline {
        std::thread::sleep(telemetry::TICK);
        for s in capture.0.lock().drain(..) {
            for g in &s.colls {
                *recorded.entry((g.key.func.as_str(), g.key.tag)).or_default() += g.ops.len();
            }
            for g in &s.p2ps {
                *recorded.entry(("Send", g.tag)).or_default() += g.ops.len();
            }
            for (all, secs) in phases.iter_mut().zip(&s.phases) {
                all.extend(secs.iter().map(|s| (s * 1e9).round() as u64));
            }
        }
    }
    assert_eq!(recorded, issued, "operations by function and tag");
    assert!(issued.contains_key(&("AlltoAll", 3)) || issued.contains_key(&("Send", 3)));

    // Every phase the profiler thread delivered under an accepted KernelCh, to the nanosecond.
    let mut truth = report.phases.clone();
    for (name, (got, want)) in ["initial_sync", "compute", "final_sync"]
        .iter()
        .zip(phases.iter_mut().zip(truth.iter_mut()))
    {
        got.sort_unstable();
        want.sort_unstable();
        assert!(!want.is_empty(), "{name}: the emulator delivered none");
        assert_eq!(got, want, "{name} durations (ns)");
    }
    // LL128 has no closing barrier: fewer final syncs than compute phases.
    assert!(truth[2].len() < truth[1].len());

    // The export: every tagged operation's figures carry its tag, the phases their histogram.
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let _ = std::fs::remove_file(&file);
    let reqs: Vec<ExportMetricsServiceRequest> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    crate::support::export::check_catalogue(&reqs);
    let mut exported: BTreeMap<(String, String), u64> = BTreeMap::new();
    for name in ["nccl.coll.bytes", "nccl.p2p.bytes"] {
        // Cumulative: the last export of a histogram holds every series.
        let last = metrics(&reqs).into_iter().rfind(|m| m.name == name).expect(name);
        for p in points(last) {
            let tag = p.attrs.get("nccl.user_tag").cloned().unwrap_or_default();
            *exported.entry((p.attrs["nccl.func"].clone(), tag)).or_default() += p.count;
        }
    }
    let tag_name = |tag: u64| match tag {
        0 => String::new(),
        t if t >> 63 != 0 => format!("reserved:{t:#x}"),
        t => t.to_string(),
    };
    let want: BTreeMap<(String, String), u64> = issued
        .iter()
        .map(|(&(func, tag), &n)| ((func.to_owned(), tag_name(tag)), n as u64))
        .collect();
    assert_eq!(exported, want, "exported operations by function and nccl.user_tag");
    let last = metrics(&reqs)
        .into_iter()
        .rfind(|m| m.name == "nccl.kernel.phase.duration")
        .expect("phases exported");
    let mut per_phase: BTreeMap<String, u64> = BTreeMap::new();
    for p in points(last) {
        *per_phase.entry(p.attrs["nccl.phase"].clone()).or_default() += p.count;
    }
    let want: BTreeMap<String, u64> = ["initial_sync", "compute", "final_sync"]
        .iter()
        .zip(&truth)
        .map(|(name, t)| (name.to_string(), t.len() as u64))
        .collect();
    assert_eq!(per_phase, want, "exported phase durations");
}

//! Golden export: the scripted workload of `support::export` through the shipped library
//! (`support::shipped`, loaded with `dlopen` as NCCL loads it), exported over OTLP/HTTP to an in-test receiver, decoded with the official OTLP types and
//! compared line by line with `tests/golden/export.txt` (recorded before the module layout
//! changed, so a pure move cannot change what users receive).
//!
//! Compared exactly: metric names, units, kinds, descriptions, attribute sets, counter values,
//! histogram counts, and the sums and bucket counts of every non-duration histogram. Values the
//! host's timing decides (durations, fitted gauges, windows and requests per run) and the host's
//! name are shown as `~` and checked instead against the workload's truth within the export tests' tolerances
//! (`support::export::check`).
//!
//! `GOLDEN_UPDATE=1 cargo test --test export golden::` rewrites the file.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use crate::support::emulator::Plugin;
use crate::support::export as sx;
use crate::support::otlp_receiver::{ExportMetricsServiceRequest, Receiver, find, kind, metrics, points, resource};

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/export.txt");

/// Metrics whose values depend on how the host scheduled the run (windows closed, requests sent,
/// fits of spun timings): their points are listed, their values are not compared.
const TIMING: [&str; 4] = [
    "nccl.profiler.windows.processed",
    "nccl.profiler.windows.forced",
    "nccl.profiler.export.sent",
    "nccl.link.samples",
];

/// Point attributes whose values name the machine the test runs on: shown as `~`.
const MACHINE: [&str; 2] = ["host.name", "job.node_name"];

/// Whether a metric's values are durations or fits of them.
fn timed(name: &str, unit: &str) -> bool {
    TIMING.contains(&name) || matches!(unit, "s" | "By/s") || name.ends_with(".r2")
}

/// The canonical text of the latest totals (cumulative temporality) of every metric.
fn canonical(reqs: &[ExportMetricsServiceRequest]) -> String {
    let mut out = String::new();
    let keys: Vec<String> = resource(reqs).into_keys().collect();
    let _ = writeln!(out, "resource keys: {}", keys.join(","));
    let names: BTreeSet<&str> = metrics(reqs).into_iter().map(|m| m.name.as_str()).collect();
    for name in names {
        let m = find(reqs, name).expect("seen above");
        let _ = writeln!(out, "{name} [{}] {} \"{}\"", m.unit, kind(m), m.description);
        let mut lines: Vec<String> = points(m)
            .into_iter()
            .map(|p| {
                let attrs: Vec<String> = p
                    .attrs
                    .iter()
                    .map(|(k, v)| {
                        if MACHINE.contains(&k.as_str()) {
                            format!("{k}=~")
                        } else {
                            format!("{k}={v}")
                        }
                    })
                    .collect();
                let timed = timed(name, &m.unit);
                let value = match (p.buckets.is_empty(), timed) {
                    (true, true) => "value=~".to_owned(),
                    (true, false) => format!("value={}", p.value),
                    (false, true) => format!("count={} sum=~ bounds={}", p.count, p.bounds.len()),
                    (false, false) => format!(
                        "count={} sum={} bounds={} buckets={:?}",
                        p.count,
                        p.value,
                        p.bounds.len(),
                        p.buckets
                    ),
                };
                format!("  {{{}}} {value}", attrs.join(","))
            })
            .collect();
        lines.sort();
        lines.iter().for_each(|l| {
            let _ = writeln!(out, "{l}");
        });
    }
    out
}

#[test]
fn scripted_workload_exports_what_was_recorded() {
    let Some(_serial) = sx::own_process(module_path!(), "scripted_workload_exports_what_was_recorded") else {
        return;
    };
    let rx = Receiver::start();
    let endpoint = rx.endpoint();
    // SAFETY: this process runs this test alone (`own_process`); nothing else touches the environment.
    unsafe { sx::base_env(&[("NCCL_PROFILER_OTEL_TELEMETRY_ENDPOINT", endpoint.as_str())]) };
    let p = Plugin::load_shipped();
    let (reqs, _) = sx::finalized_workload(&p, &rx, 0x601D_0001, "golden");

    let got = canonical(&reqs);
    if std::env::var_os("GOLDEN_UPDATE").is_some() {
        std::fs::create_dir_all(std::path::Path::new(GOLDEN).parent().unwrap()).unwrap();
        std::fs::write(GOLDEN, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(GOLDEN).expect("tests/golden/export.txt (GOLDEN_UPDATE=1 records it)");
    let (got_lines, want_lines): (Vec<&str>, Vec<&str>) = (got.lines().collect(), want.lines().collect());
    let missing: Vec<&&str> = want_lines.iter().filter(|l| !got_lines.contains(l)).collect();
    let extra: Vec<&&str> = got_lines.iter().filter(|l| !want_lines.contains(l)).collect();
    assert!(
        missing.is_empty() && extra.is_empty() && got_lines.len() == want_lines.len(),
        "export differs from tests/golden/export.txt\nmissing:\n{missing:#?}\nunexpected:\n{extra:#?}"
    );
}

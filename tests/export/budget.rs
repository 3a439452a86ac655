//! The series budget: one rank of `support/scale.rs`'s job (the workload `docs/scale.md`
//! measures) makes at most [`BUDGET`] Prometheus series at the defaults, translated as
//! Prometheus' OTLP receiver does (`support/prom`: a classic histogram point is a series per
//! bucket plus `_sum` and `_count`; an exponential one is one native histogram series); and
//! `NCCL_PROFILER_OTEL_DETAIL=full` restores the channel and per-transfer families.

use std::collections::BTreeSet;

use crate::support::otlp_receiver::{self as rx, ExportMetricsServiceRequest, Receiver, metric};
use crate::support::{export as sx, process, prom, scale};

/// Prometheus series one rank may make at the defaults.
const BUDGET: usize = 500;
/// Tells the child which detail level it runs.
const CHILD: &str = "NCCL_TEST_BUDGET";
/// Iterations of the workload: every operation runs, in every communicator (the series do not
/// grow with more).
const ITERATIONS: usize = 40;

/// The Prometheus series of `reqs` (every series that any of them carries): the translation's,
/// plus one per attribute set of an exponential histogram the translation has no series of.
fn series(reqs: &[ExportMetricsServiceRequest]) -> usize {
    let translated = prom::series(reqs, |_| true);
    let names: BTreeSet<&str> = translated
        .keys()
        .map(|k| &k[..k.find('{').unwrap_or(k.len())])
        .collect();
    let mut native = BTreeSet::new();
    for m in rx::metrics(reqs)
        .into_iter()
        .filter(|m| !names.contains(prom::name(m).as_str()))
    {
        if let Some(metric::Data::ExponentialHistogram(h)) = &m.data {
            native.extend(h.data_points.iter().map(|p| (&m.name, rx::attrs(&p.attributes))));
        }
    }
    translated.len() + native.len()
}

/// The metric names of `reqs` that only `DETAIL=full` exports.
fn detail_only(reqs: &[ExportMetricsServiceRequest]) -> BTreeSet<String> {
    let detail = ["nccl.channel.", "nccl.coll.transfer", "nccl.p2p.transfer"];
    rx::metrics(reqs)
        .into_iter()
        .filter(|m| detail.iter().any(|p| m.name.starts_with(p)))
        .map(|m| m.name.clone())
        .collect()
}

/// The exports of one rank of the workload at `detail` (every other setting the default but the
/// interval).
fn export(detail: &str) -> Vec<ExportMetricsServiceRequest> {
    let rx = Receiver::start();
    let mut child = process::child(module_path!(), "budget_child", CHILD, detail);
    // Not the settings other tests of this process set (`support::export::base_env`).
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("NCCL_PROF") || k.starts_with("OTEL_")) {
        child.env_remove(k);
    }
    let out = child
        .env("NCCL_PROFILER_OTEL_TELEMETRY_ENDPOINT", rx.endpoint())
        .env("NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC", "0.5")
        .env("NCCL_PROFILER_OTEL_DETAIL", detail)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    rx.requests()
}

#[test]
fn defaults_keep_a_rank_within_the_series_budget() {
    let Some(_serial) = sx::serial() else {
        return;
    };
    let basic = export("basic");
    let (n, left_out) = (series(&basic), detail_only(&basic));
    println!("series per rank at the defaults: {n}");
    assert!(n <= BUDGET, "{n} series at the defaults, over {BUDGET}");
    assert!(left_out.is_empty(), "exported at basic: {left_out:?}");
    // This workload's links have one transfer size each: throughput and queue wait, no fit.
    for kept in [
        "nccl.coll.duration",
        "nccl.p2p.duration",
        "nccl.link.bytes",
        "nccl.link.throughput",
    ] {
        assert!(rx::find(&basic, kept).is_some(), "{kept} missing");
    }

    let full = export("full");
    let restored = detail_only(&full);
    println!("series per rank at detail=full: {}", series(&full));
    for family in ["nccl.channel.", "nccl.coll.transfer", "nccl.p2p.transfer"] {
        assert!(
            restored.iter().any(|m| m.starts_with(family)),
            "{family}* not restored: {restored:?}"
        );
    }
}

#[test]
#[ignore = "run by defaults_keep_a_rank_within_the_series_budget in a child process"]
fn budget_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    scale::set_release();
    let plugin = crate::support::emulator::Plugin::in_process();
    scale::run(&plugin, ITERATIONS);
    plugin.close();
}

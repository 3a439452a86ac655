//! Prometheus series from exported OTLP requests, for `promtool test rules`.
//!
//! Prometheus 2.42 (Debian's, the one CI installs) has no OTLP receiver, so the series are made by
//! the documented OTLP → Prometheus translation that its later OTLP receiver and the Collector's
//! Prometheus exporters apply (OpenTelemetry specification, "Prometheus and OpenMetrics
//! Compatibility", as Prometheus' `otlptranslator` implements it): dots become underscores in metric
//! and label names; the unit is appended unless the name already has it as a word (`s` →
//! `_seconds`, `By` → `_bytes`, `By/s` → `_bytes_per_second`, `1` → `_ratio` on gauges, `{…}`
//! dropped): `nccl.link.bytes` stays `nccl_link_bytes`; monotonic sums get `_total`; histograms
//! become `_bucket{le}` (cumulative), `_sum` and `_count`; `service.namespace/service.name` (or
//! `service.name` alone) becomes the `job` label and `service.instance.id` the `instance` label.
//! Each export request is one step: of the test's interval for `promtool test rules`, at its
//! collection time in OpenMetrics for a real server (`server`). Exponential histograms become
//! native histograms only on the way to a server by remote write (`remote_write`), for the
//! native-histogram variants of the rules and dashboard (`native`).

// The test harness's (the `testing` feature): `nccl_report` includes only the translation.
#[cfg(feature = "testing")]
pub mod dashboard;
#[cfg(feature = "testing")]
pub mod native;
#[cfg(feature = "testing")]
pub mod remote_write;
#[cfg(feature = "testing")]
pub mod server;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::metrics::v1::{Metric, metric, number_data_point};

use super::otlp_receiver as rx;

/// A series' samples, one per step (`None`: no sample then).
pub type Series = BTreeMap<String, Vec<Option<f64>>>;

/// The Prometheus name of an OTLP metric (without `_total`, `_bucket`, … suffixes).
pub fn name(m: &Metric) -> String {
    translated(&m.name, &m.unit, matches!(m.data, Some(metric::Data::Gauge(_))))
}

/// The Prometheus name of metric `name` with `unit` (a gauge's or not), without the `_total`,
/// `_bucket`, … suffixes.
pub fn translated(name: &str, unit: &str, gauge: bool) -> String {
    let mut words: Vec<&str> = name
        .split(|c: char| !c.is_ascii_alphanumeric() && c != ':')
        .filter(|w| !w.is_empty())
        .collect();
    let (main, per) = match unit {
        "s" => (Some("seconds"), None),
        "By" => (Some("bytes"), None),
        "By/s" => (Some("bytes"), Some("per_second")),
        _ => (None, None),
    };
    words.extend(main.filter(|m| !words.contains(m)));
    words.extend(per);
    if unit == "1" && gauge {
        words.retain(|w| *w != "ratio");
        words.push("ratio");
    }
    words.join("_")
}

/// The series Prometheus makes of metric `name`, an `instrument` (`Counter`, `Histogram` or
/// `Gauge`, as docs/metrics.md names them) with `unit`.
pub fn series_names(name: &str, instrument: &str, unit: &str) -> Vec<String> {
    let base = translated(name, unit, instrument == "Gauge");
    match instrument {
        "Counter" => vec![format!("{base}_total")],
        "Histogram" => ["bucket", "sum", "count"]
            .iter()
            .map(|s| format!("{base}_{s}"))
            .collect(),
        _ => vec![base],
    }
}

/// The value of attribute `key`, as a string.
pub fn attr(attrs: &[KeyValue], key: &str) -> Option<String> {
    rx::attrs(attrs).remove(key)
}

/// When a request was collected (its first point's time).
pub fn collected(req: &ExportMetricsServiceRequest) -> SystemTime {
    let t = rx::metrics(std::slice::from_ref(req))
        .into_iter()
        .flat_map(rx::points)
        .map(|p| p.time)
        .find(|&t| t > 0)
        .unwrap_or(0);
    UNIX_EPOCH + Duration::from_nanos(t)
}

/// The labels of a point: its attributes, and `job` (`service.namespace/service.name`) and
/// `instance` from the resource's.
pub fn labels(resource: &[KeyValue], attrs: &[KeyValue], extra: Option<(&str, String)>) -> BTreeMap<String, String> {
    let mut l: BTreeMap<String, String> = rx::attrs(attrs)
        .into_iter()
        .map(|(k, v)| (k.replace('.', "_"), v))
        .collect();
    let name = attr(resource, "service.name").unwrap_or_default();
    let job = match attr(resource, "service.namespace") {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name,
    };
    l.insert("job".into(), job);
    if let Some(instance) = attr(resource, "service.instance.id") {
        l.insert("instance".into(), instance);
    }
    if let Some((k, v)) = extra {
        l.insert(k.into(), v);
    }
    l
}

/// `name{k="v",…}` in promtool's series syntax.
pub fn selector(name: &str, labels: &BTreeMap<String, String>) -> String {
    let inner: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    format!("{name}{{{}}}", inner.join(","))
}

/// Every sample of the points `keep` accepts (by attributes), one step per request.
pub fn series(reqs: &[ExportMetricsServiceRequest], keep: impl Fn(&[KeyValue]) -> bool) -> Series {
    let mut out = Series::new();
    let steps = reqs.len();
    samples(reqs, keep, |step, name, labels, v| {
        out.entry(selector(name, &labels)).or_insert_with(|| vec![None; steps])[step] = Some(v);
    });
    out
}

/// Calls `put` with every float sample of the points `keep` accepts (by attributes): the index
/// of its request, its series' name and labels, and its value. Exponential histograms have none
/// (`remote_write` makes them native histograms).
pub fn samples(
    reqs: &[ExportMetricsServiceRequest],
    keep: impl Fn(&[KeyValue]) -> bool,
    mut put: impl FnMut(usize, &str, BTreeMap<String, String>, f64),
) {
    for (step, req) in reqs.iter().enumerate() {
        for rm in &req.resource_metrics {
            let resource = rm.resource.as_ref().map_or(&[][..], |r| &r.attributes[..]);
            for m in rm.scope_metrics.iter().flat_map(|s| &s.metrics) {
                let base = name(m);
                let numbers = match &m.data {
                    Some(metric::Data::Gauge(g)) => Some((base.clone(), &g.data_points)),
                    Some(metric::Data::Sum(s)) => Some((format!("{base}_total"), &s.data_points)),
                    _ => None,
                };
                for (name, p) in numbers.iter().flat_map(|(n, ps)| ps.iter().map(move |p| (n, p))) {
                    if keep(&p.attributes) {
                        put(step, name, labels(resource, &p.attributes, None), number(p.value));
                    }
                }
                let Some(metric::Data::Histogram(h)) = &m.data else {
                    continue;
                };
                for p in h.data_points.iter().filter(|p| keep(&p.attributes)) {
                    let l = labels(resource, &p.attributes, None);
                    put(step, &format!("{base}_count"), l.clone(), p.count as f64);
                    put(step, &format!("{base}_sum"), l, p.sum.unwrap_or(0.0));
                    let mut cumulative = 0;
                    let bounds = p.explicit_bounds.iter().map(|b| b.to_string()).chain(["+Inf".into()]);
                    for (le, n) in bounds.zip(&p.bucket_counts) {
                        cumulative += n;
                        let l = labels(resource, &p.attributes, Some(("le", le)));
                        put(step, &format!("{base}_bucket"), l, cumulative as f64);
                    }
                }
            }
        }
    }
}

/// The requests' samples in the OpenMetrics text format, each at its request's collection time,
/// for `promtool tsdb create-blocks-from openmetrics`. No metadata: every family is `unknown`
/// typed, which keeps the translated names (`_total`, `_bucket`, …) as they are.
pub fn openmetrics(reqs: &[ExportMetricsServiceRequest]) -> String {
    let times: Vec<f64> = reqs
        .iter()
        .map(|r| {
            collected(r)
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64()
        })
        .collect();
    let mut out = String::new();
    for (key, values) in series(reqs, |_| true) {
        for (v, t) in values.iter().zip(&times) {
            if let Some(v) = v {
                let _ = writeln!(out, "{key} {v} {t:.3}");
            }
        }
    }
    out + "# EOF\n"
}

fn number(v: Option<number_data_point::Value>) -> f64 {
    match v {
        Some(number_data_point::Value::AsDouble(d)) => d,
        Some(number_data_point::Value::AsInt(i)) => i as f64,
        None => f64::NAN,
    }
}

/// One alert a test expects: its name, the step it is evaluated at, and the label sets (beyond
/// `alertname`) and summaries of the alerts that must fire then (empty: none).
pub struct Expect {
    pub alert: &'static str,
    pub step: usize,
    pub fired: Vec<(BTreeMap<String, String>, String)>,
}

/// One promtool test case: the series of a scenario and what its alerts must do.
pub fn test_case(out: &mut String, name: &str, interval_secs: u64, series: &Series, expect: &[Expect]) {
    let _ = writeln!(
        out,
        "  - name: {name:?}\n    interval: {interval_secs}s\n    input_series:"
    );
    for (key, values) in series {
        let v: Vec<String> = values
            .iter()
            .map(|v| v.map_or("_".to_owned(), |v| format!("{v}")))
            .collect();
        let _ = writeln!(out, "      - series: '{key}'\n        values: '{}'", v.join(" "));
    }
    let _ = writeln!(out, "    alert_rule_test:");
    for e in expect {
        let _ = writeln!(
            out,
            "      - eval_time: {}s\n        alertname: {}\n        exp_alerts:",
            e.step as u64 * interval_secs,
            e.alert
        );
        if e.fired.is_empty() {
            let _ = writeln!(out, "          []");
        }
        for (labels, summary) in &e.fired {
            let _ = writeln!(out, "          - exp_labels:");
            for (k, v) in labels {
                let _ = writeln!(out, "              {k}: {v:?}");
            }
            let _ = writeln!(out, "            exp_annotations:\n              summary: {summary:?}");
        }
    }
}

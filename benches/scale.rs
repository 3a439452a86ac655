//! What one rank exports, for docs/scale.md: bytes per interval (the OTLP protobuf body, raw and
//! gzipped as the exporter sends it) and the Prometheus series it makes, at the defaults and with
//! the volume switches, projected to a 1,024- and a 16,384-rank job.
//!
//! One process emulates rank 0 of `support/scale.rs`'s job (every setting the default but the
//! switches and a 1 s interval). The figures are those of the largest export (with cumulative
//! temporality every export carries every series; the last ones carry them all). Each variant
//! runs in a child process (the configuration is read once per process).

#[path = "../tests/support"]
mod support {
    pub mod emulator;
    pub mod otlp_receiver;
    pub mod scale;
}

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::Command;
use std::time::Duration;

use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use prost::Message as _;
use support::emulator::Plugin;
use support::otlp_receiver::{self, ExportMetricsServiceRequest, Receiver};
use support::scale;

const ITERATIONS: usize = 40;
/// The default telemetry interval, for the projections.
const INTERVAL_SECS: f64 = 5.0;

/// (name, NCCL_PROFILER_OTEL_DETAIL, NCCL_PROFILER_OTEL_DROP_METRICS, histogram aggregation).
const VARIANTS: [(&str, &str, &str, &str); 5] = [
    ("default", "basic", "none", EXPONENTIAL),
    ("detail=full", "full", "none", EXPONENTIAL),
    ("classic", "basic", "none", CLASSIC),
    ("detail=full, classic", "full", "none", CLASSIC),
    ("detail=full, drop channel", "full", "channel", EXPONENTIAL),
];
/// The histogram aggregations (`OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION`).
const EXPONENTIAL: &str = "base2_exponential_bucket_histogram";
const CLASSIC: &str = "explicit_bucket_histogram";

fn main() {
    if let Ok(variant) = std::env::var("SCALE_VARIANT") {
        child(variant.parse().expect("variant index"));
        return;
    }
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo bench -- --list`: nothing criterion-style to list
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "scale: load average {}",
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    println!(
        "\n| variant | series per rank | data points | raw bytes / interval | gzip bytes / interval \
         | 1,024 ranks: series | 1,024 ranks: gzip into the collector | 16,384 ranks: series \
         | 16,384 ranks: gzip into the collector |\n|---|---|---|---|---|---|---|---|---|"
    );
    let mut by_family: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (i, (variant, ..)) in VARIANTS.iter().enumerate() {
        let out = Command::new(std::env::current_exe().expect("current exe"))
            .env("SCALE_VARIANT", i.to_string())
            .output()
            .expect("run the child");
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().find_map(|l| l.strip_prefix("SCALE "));
        let Some(line) = line else {
            panic!(
                "variant {variant}: no figures\n{text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        for family in text.lines().filter_map(|l| l.strip_prefix("FAMILY ")) {
            let f: Vec<&str> = family.split_whitespace().collect();
            by_family
                .entry(f[0].to_owned())
                .or_insert_with(|| vec!["0 (0)".into(); VARIANTS.len()])[i] = format!("{} ({})", f[1], f[2]);
        }
        let f: Vec<f64> = line.split_whitespace().map(|v| v.parse().unwrap()).collect();
        let (series, points, raw, gzip) = (f[0], f[1], f[2], f[3]);
        let rate = |ranks: f64| gzip * ranks / INTERVAL_SECS / 1e6;
        println!(
            "| {} | {series} | {points} | {} | {} | {:.2} M | {:.1} MB/s | {:.1} M | {:.0} MB/s |",
            variant,
            kb(raw),
            kb(gzip),
            series * 1024.0 / 1e6,
            rate(1024.0),
            series * 16384.0 / 1e6,
            rate(16384.0),
        );
    }
    println!(
        "\nSeries (data points) per rank by family:\n\n| family | {} |",
        VARIANTS.map(|v| v.0).join(" | ")
    );
    println!("|---|{}", "---|".repeat(VARIANTS.len()));
    for (family, cells) in by_family {
        println!("| `{family}` | {} |", cells.join(" | "));
    }
}

fn kb(bytes: f64) -> String {
    format!("{:.1} kB", bytes / 1e3)
}

/// One variant: rank 0's view of the workload, exported to an in-process collector.
fn child(variant: usize) {
    let (_, detail, drop, histograms) = VARIANTS[variant];
    let receiver = Receiver::start();
    // SAFETY: set before any other thread of this process exists and before the plugin reads
    // its configuration.
    unsafe {
        std::env::set_var("NCCL_PROFILER_OTEL_TELEMETRY_ENDPOINT", receiver.endpoint());
        std::env::set_var("NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC", "1");
        std::env::set_var("NCCL_PROFILER_OTEL_DETAIL", detail);
        std::env::set_var("NCCL_PROFILER_OTEL_DROP_METRICS", drop);
        std::env::set_var("OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION", histograms);
    }
    scale::set_release();
    let plugin = Plugin::in_process();
    // The exports of the run (which finalizes the communicators), then of two more intervals.
    scale::run(&plugin, ITERATIONS);
    std::thread::sleep(Duration::from_millis(2500));
    let reqs = receiver.requests();
    let largest = scale::largest(&reqs);
    let raw = largest.encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&raw).expect("gzip");
    let gzip = gz.finish().expect("gzip").len();
    let families = count(largest);
    let (series, points) = families.values().fold((0, 0), |(s, p), f| (s + f.0, p + f.1));
    println!("SCALE {series} {points} {} {gzip}", raw.len());
    for (family, (series, points)) in families {
        println!("FAMILY {family} {series} {points}");
    }
    plugin.close();
}

/// Per metric family (`nccl.coll`, `nccl.link`, …): the Prometheus series (a classic histogram
/// is a series per bucket, plus `_sum` and `_count`; an exponential one a single native
/// histogram) and the OTLP data points of a request.
fn count(req: &ExportMetricsServiceRequest) -> BTreeMap<String, (usize, usize)> {
    let mut families = BTreeMap::new();
    for m in otlp_receiver::metrics(std::slice::from_ref(req)) {
        let (n, per) = match &m.data {
            Some(Data::Gauge(g)) => (g.data_points.len(), g.data_points.len()),
            Some(Data::Sum(s)) => (s.data_points.len(), s.data_points.len()),
            Some(Data::Histogram(h)) => {
                let per: usize = h.data_points.iter().map(|p| p.bucket_counts.len() + 2).sum();
                (h.data_points.len(), per)
            }
            Some(Data::ExponentialHistogram(h)) => (h.data_points.len(), h.data_points.len()),
            _ => (0, 0),
        };
        let family = m.name.splitn(3, '.').take(2).collect::<Vec<_>>().join(".");
        let f: &mut (usize, usize) = families.entry(family).or_default();
        f.0 += per;
        f.1 += n;
    }
    families
}

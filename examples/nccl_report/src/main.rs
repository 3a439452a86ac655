//! `nccl_report`: the demo's report from the plugin's file exporter, with no collector.
//!
//! ```sh
//! cargo run --release -p nccl-report -- nccl-otel-*.jsonl             # files, directories, `-`
//! cargo run --release -p nccl-report -- runs/ --openmetrics job.om    # also OpenMetrics
//! ```
//!
//! Reads OTLP-JSON lines (one `ExportMetricsServiceRequest` per line, as
//! `NCCL_PROFILER_OTEL_EXPORTER=file` or `stdout` writes them; gzip-compressed files too) of one
//! or many ranks, and prints: per function and size, counts, latency, service time and bus
//! bandwidth (host and GPU); the link matrix and the slowest links with their hosts; hangs, and
//! the culprits the alerts name (the rules' mapping and thresholds, over the run). Lines that are
//! not such requests are counted, skipped and reported. `--openmetrics FILE` writes every sample
//! in the OpenMetrics text format, named as Prometheus names the OTLP metrics, for
//! `promtool tsdb create-blocks-from openmetrics`;
//! exponential histograms (the plugin's default) as classic ones with power-of-two buckets, since
//! OpenMetrics text has no native histograms.
//! Expects cumulative temporality (the plugin's default); delta sums and histograms are added
//! up. Single-threaded.

#[path = "../../../tests/support/otlp_receiver.rs"]
mod otlp_receiver;
// The tests' OTLP → Prometheus translation (its promtool test-case writer goes unused here;
// the promtool server and Grafana helpers are compiled out without the `testing` feature).
#[allow(dead_code)]
#[path = "../../../tests/support/prom/mod.rs"]
mod prom;
#[path = "../../training_demo/src/report.rs"]
mod report;
// The plugin's culprit vocabulary (wait kinds, the alerts' mapping and thresholds); what only
// applies to the rules' moments (`LIVE_INTERVALS`, `SLOW_NOW`, `for:`) goes unused over a run.
#[allow(dead_code)]
#[path = "../../../src/culprit.rs"]
mod culprit;

mod classic;
mod culprits;
mod input;
mod verdict;

use std::collections::BTreeSet;
use std::io::Write as _;
use std::process::ExitCode;

use otlp_receiver::ExportMetricsServiceRequest as Request;

const USAGE: &str = "usage: nccl_report [--openmetrics FILE] PATH...\n\
    PATH: a file of OTLP-JSON lines (NCCL_PROFILER_OTEL_EXPORTER=file; gzip too),\n\
    a directory (its files), or - (standard input)";

/// Requests written per call of the translator: it holds a series' samples for every request
/// of the call, so a long run is written in pieces.
const CHUNK: usize = 512;

fn main() -> ExitCode {
    let mut paths = Vec::new();
    let mut openmetrics = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            "--openmetrics" => match args.next() {
                Some(file) => openmetrics = Some(file),
                None => return usage("--openmetrics needs a file"),
            },
            flag if flag.starts_with("--") => return usage(&format!("unknown option {flag}")),
            _ => paths.push(arg),
        }
    }
    if paths.is_empty() {
        return usage("no input");
    }
    let mut read = input::Input::default();
    for path in &paths {
        read.path(path);
    }
    if read.requests.is_empty() {
        eprintln!("nccl_report: no export request read");
        return ExitCode::FAILURE;
    }
    let mut requests = read.requests;
    requests.sort_by_key(prom::collected);
    summary(&requests, read.files, read.bad);
    report::print_collectives(&requests);
    let cells = report::link_cells(&requests);
    let ranks = cells.keys().map(|&(s, d)| s.max(d) + 1).max().unwrap_or(0);
    report::print_links(&cells, ranks, None);
    culprits::print_slowest_links(&requests);
    culprits::print_hangs(&requests);
    culprits::print_culprits(&requests);
    if let Some(path) = openmetrics {
        match write_openmetrics(&path, &mut requests) {
            Ok(samples) => println!(
                "\n{samples} samples in {path}; backfill them with\n\
                 promtool tsdb create-blocks-from openmetrics {path} DATA_DIR"
            ),
            Err(e) => {
                eprintln!("nccl_report: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if read.unreadable > 0 {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn usage(problem: &str) -> ExitCode {
    eprintln!("nccl_report: {problem}\n{USAGE}");
    ExitCode::FAILURE
}

/// The resource attributes of a request's first resource: one process's identity.
fn resource(request: &Request) -> Vec<(String, String)> {
    otlp_receiver::resource(std::slice::from_ref(request))
        .into_iter()
        .collect()
}

/// What was read: requests, processes, hosts, time covered.
fn summary(requests: &[Request], files: usize, bad: usize) {
    let processes: BTreeSet<_> = requests.iter().map(resource).collect();
    let hosts: BTreeSet<_> = processes
        .iter()
        .filter_map(|r| r.iter().find(|(k, _)| k == "host.name").map(|(_, v)| v))
        .collect();
    let span = match (requests.first(), requests.last()) {
        (Some(a), Some(b)) => prom::collected(b)
            .duration_since(prom::collected(a))
            .unwrap_or_default()
            .as_secs_f64(),
        _ => 0.0,
    };
    let skipped = if bad > 0 {
        format!("; {bad} bad lines skipped")
    } else {
        String::new()
    };
    culprits::say(format!(
        "nccl_report: {} export requests over {span:.0} s from {files} files\n\
         processes: {}, hosts: {}{skipped}",
        requests.len(),
        processes.len(),
        hosts.len()
    ));
    println!();
}

/// Writes every sample of `requests` to `path` in the OpenMetrics text format, one process at a
/// time (so that each series' samples come in time order); returns how many. Reorders
/// `requests` by process, and makes their exponential histograms classic ([`classic`]).
fn write_openmetrics(path: &str, requests: &mut [Request]) -> Result<usize, String> {
    classic::classic(requests);
    requests.sort_by_cached_key(resource);
    let failed = |e: std::io::Error| format!("cannot write {path}: {e}");
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).map_err(failed)?);
    let mut samples = 0;
    for process in requests.chunk_by(|a, b| resource(a) == resource(b)) {
        for chunk in process.chunks(CHUNK) {
            let text = prom::openmetrics(chunk);
            let body = text.strip_suffix("# EOF\n").unwrap_or(&text);
            samples += body.lines().count();
            out.write_all(body.as_bytes()).map_err(failed)?;
        }
    }
    out.write_all(b"# EOF\n").and_then(|()| out.flush()).map_err(failed)?;
    Ok(samples)
}

//! End of job on the Prometheus path: once a process stops exporting (finalize and exit, or
//! SIGKILL), no alert of `docs/prometheus/nccl-rules.yml` about its series stays firing longer
//! than two export intervals plus one evaluation interval. Three processes of one job (children
//! of this test, one emulated three-rank ring each): a late rank 2 (`NcclStraggler`) and a slow
//! link 1 → 2 (`NcclSlowLink`), both finalized and exited (their last exports say so: interval
//! 0), and rank 1 stopped in the middle of an AllReduce (`NcclRankHung`), killed
//! with SIGKILL while its ranks report the hang. Then:
//! - `promtool test rules` on each process's series, one step of [`STEP_SECS`] per export (the
//!   interval gauge read as that step): the finalized processes' alerts fire at their last live
//!   export and are gone at the first export after `finalize`; the killed process's fire at its
//!   last export and one step later, and are gone two steps after it (2 intervals, within 2
//!   intervals + 1 evaluation);
//! - a real Prometheus over all the exports, backfilled at their times: each alert's query (its
//!   recording rules inlined) names the culprit at its process's last live export (the killed
//!   one's: also one interval later), returns nothing from the export after `finalize` on, or
//!   from two intervals after the killed process's last export on (measured in steps of 10 ms),
//!   nor minutes later, within Prometheus' 5-minute lookback.
//!
//! Also the helpers the other signal tests use to keep their processes live for the rules.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, SystemTime};

use super::support::emulator::release::{self, Release};
use super::support::emulator::{Late, Plugin, Stall};
use opentelemetry_proto::tonic::metrics::v1::number_data_point;

use super::support::otlp_receiver::{ExportMetricsServiceRequest, metric, metrics, points};
use super::support::process;
use super::support::prom::server::Server;
use super::support::prom::{self, Series};
use super::{RULES, STEP_SECS, decode, net, ring};

/// Which process a child is (`late`, `slow` or `stall`), and the directory it exports into.
const CASE: &str = "NCCL_TEST_END_OF_JOB_CASE";
const DIR: &str = "NCCL_TEST_END_OF_JOB_DIR";
const INTERVAL: f64 = 0.25;
const THRESHOLD: f64 = 0.5;
const HOST: &str = "eoj-host";
/// Exports naming the hang before the stalled process is killed.
const STUCK_EXPORTS: usize = 3;
/// The plugin's export interval gauge, and its Prometheus series.
const INTERVAL_METRIC: &str = "nccl.profiler.export.interval";
const INTERVAL_SERIES: &str = "nccl_profiler_export_interval_seconds";

/// The interval gauge's series of `reqs` for `promtool test rules`, where each export is one
/// step of `step_secs`: its value is that step, so that the rules' freshness test (two
/// intervals) counts in steps; the exports without a live communicator too (the scenarios of
/// one process count as live from its first export to its last).
pub fn interval_series(reqs: &[ExportMetricsServiceRequest], step_secs: u64) -> Series {
    let mut series = exported_intervals(reqs);
    series
        .values_mut()
        .flatten()
        .flatten()
        .for_each(|v| *v = step_secs as f64);
    series
}

/// The interval gauge's series of `reqs` as exported (0: no live communicator).
fn exported_intervals(reqs: &[ExportMetricsServiceRequest]) -> Series {
    let mut series = prom::series(reqs, <[_]>::is_empty);
    series.retain(|k, _| k.starts_with(&format!("{INTERVAL_SERIES}{{")));
    series
}

/// The requests with every interval gauge at an hour: a server that evaluates the rules at its
/// own clock, after the exports ended, still counts their processes as live.
pub fn held_live(reqs: &[ExportMetricsServiceRequest]) -> Vec<ExportMetricsServiceRequest> {
    let mut reqs = reqs.to_vec();
    let gauges = reqs
        .iter_mut()
        .flat_map(|r| &mut r.resource_metrics)
        .flat_map(|r| &mut r.scope_metrics)
        .flat_map(|s| &mut s.metrics)
        .filter(|m| m.name == INTERVAL_METRIC);
    for m in gauges {
        if let Some(metric::Data::Gauge(g)) = &mut m.data {
            for p in &mut g.data_points {
                p.value = Some(number_data_point::Value::AsDouble(3600.0));
            }
        }
    }
    reqs
}

/// A child killed when dropped (a failing test leaves no stalled process behind).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The complete requests in a child's export file so far.
fn exported(path: &Path) -> Vec<ExportMetricsServiceRequest> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    decode(complete)
}

/// Whether a request has a `hang.stuck` point above 0.
fn stuck(req: &ExportMetricsServiceRequest) -> bool {
    metrics(std::slice::from_ref(req))
        .into_iter()
        .filter(|m| m.name == "nccl.progress.hang.stuck")
        .flat_map(points)
        .any(|p| p.value > 0.0)
}

/// Runs process `case` exporting into `dir` and returns its requests: to its exit, or, for
/// `stall`, until [`STUCK_EXPORTS`] of them name the hang, when it is killed (SIGKILL).
fn run(case: &str, dir: &Path) -> Vec<ExportMetricsServiceRequest> {
    let mut cmd = process::child(module_path!(), "child", CASE, case);
    let mut child = Killed(cmd.env(DIR, dir).spawn().unwrap());
    let path = dir.join(format!("out-{}.jsonl", child.0.id()));
    if case != "stall" {
        let status = child.0.wait().unwrap();
        assert!(status.success(), "{case}: {status}");
        return exported(&path);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while exported(&path).iter().filter(|r| stuck(r)).count() < STUCK_EXPORTS {
        assert!(std::time::Instant::now() < deadline, "stall: no hang exported in 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(child);
    let reqs = exported(&path);
    assert!(reqs.last().is_some_and(stuck), "stall: killed after the hang ended");
    reqs
}

/// One process, in the child only: its ring, then `finalize` and exit (`stall`: held until
/// killed).
#[test]
#[ignore]
fn child() {
    let Some(case) = process::case(CASE) else {
        return;
    };
    let dir = PathBuf::from(std::env::var_os(DIR).unwrap());
    let resource = format!("service.namespace=eoj,host.name={HOST},job.node_name={HOST}");
    // SAFETY: this process's only test, before its first `init`.
    unsafe { super::export_to(&dir, INTERVAL, THRESHOLD, &[("OTEL_RESOURCE_ATTRIBUTES", &resource)]) };
    release::set(Release::V2_31_2);
    let p = Plugin::in_process();
    match case.as_str() {
        "late" => {
            let late = Late::new(2, Duration::from_millis(20));
            ring("late", 0xE0_1A7E, 1 << 20, 100, net(1.0))
                .options(|o| o.late = Some(late.clone()))
                .run(&p);
        }
        "slow" => {
            ring("slow", 0xE0_5104, 1 << 20, 800, net(1.0).slow_link(1, 2, 4.0)).run(&p);
        }
        _ => {
            let stall = Stall::new(1, 2, 3, Duration::from_secs(60));
            ring("stall", 0xE0_57A1, 6 << 20, 4, net(1.0))
                .options(|o| o.stall = Some(stall.clone()))
                .run(&p);
        }
    }
    p.close();
}

/// The alerts each process raises: (alert, culprit rank).
const ALERTS: [(&str, &[(&str, &str)]); 3] = [
    ("late", &[("NcclStraggler", "2")]),
    ("slow", &[("NcclSlowLink", "1")]),
    ("stall", &[("NcclRankHung", "1")]),
];

/// The series the rules read, of one process.
fn rule_inputs(reqs: &[ExportMetricsServiceRequest]) -> Series {
    let read = [
        "nccl_progress_hang_stuck_seconds{",
        "nccl_progress_peer_wait_seconds_bucket{",
        "nccl_progress_peer_wait_seconds_sum{",
        "nccl_coll_service_time_seconds_total{",
        "nccl_link_throughput_bytes_per_second{",
        "nccl_comm_member{",
    ];
    let mut series = prom::series(reqs, |a| prom::attr(a, "nccl.comm.hash").is_some());
    series.retain(|k, _| read.iter().any(|r| k.starts_with(r)));
    let mut intervals = exported_intervals(reqs);
    for v in intervals.values_mut().flatten().flatten().filter(|v| **v > 0.0) {
        *v = STEP_SECS as f64;
    }
    series.extend(intervals);
    series
}

/// The index of the last export of `reqs` whose interval gauge says live (above 0), and of the
/// first after it that says ended (0), if any.
fn live_until(reqs: &[ExportMetricsServiceRequest]) -> (usize, Option<usize>) {
    let values: Vec<Option<f64>> = exported_intervals(reqs)
        .into_values()
        .next()
        .expect("an interval series");
    let live = values
        .iter()
        .rposition(|v| v.is_some_and(|v| v > 0.0))
        .expect("a live export");
    (live, (live + 1..values.len()).find(|&i| values[i] == Some(0.0)))
}

/// `promtool test rules`: a finalized process's alerts fire at its last live export and are gone
/// at the one after `finalize` (and two steps after its last export); a killed process's fire
/// at its last export `L` and at `L + 1` (one interval: still live), and are gone at `L + 2` (two
/// intervals: within two intervals and one evaluation).
fn promtool(processes: &[(&str, Vec<ExportMetricsServiceRequest>)]) {
    use std::fmt::Write as _;
    let mut yaml = format!("rule_files:\n  - {RULES}\nevaluation_interval: {STEP_SECS}s\ntests:\n");
    for ((case, reqs), (_, alerts)) in processes.iter().zip(ALERTS) {
        prom::test_case(&mut yaml, case, STEP_SECS, &rule_inputs(reqs), &[]);
        let _ = writeln!(yaml, "    promql_expr_test:");
        let last = reqs.len() - 1;
        let steps = match live_until(reqs) {
            (live, Some(ended)) => vec![(live, true), (ended, false), (last + 2, false)],
            _ => vec![(last, true), (last + 1, true), (last + 2, false)],
        };
        for (alert, rank) in alerts {
            for &(step, firing) in &steps {
                let _ = writeln!(
                    yaml,
                    "      - expr: 'count by (alertname, culprit_rank, culprit_host) \
                     (ALERTS{{alertstate=\"firing\", alertname=\"{alert}\"}})'\n        eval_time: {}s\n        exp_samples:",
                    step as u64 * STEP_SECS
                );
                if firing {
                    let labels = format!("{{alertname=\"{alert}\", culprit_host=\"{HOST}\", culprit_rank=\"{rank}\"}}");
                    let _ = writeln!(yaml, "          - labels: '{labels}'\n            value: 1");
                } else {
                    let _ = writeln!(yaml, "          []");
                }
            }
        }
    }
    let file = std::env::temp_dir().join(format!("nccl-otel-end-of-job-{}.yml", std::process::id()));
    std::fs::write(&file, &yaml).unwrap();
    let test = std::process::Command::new("promtool")
        .args(["test", "rules"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        test.status.success(),
        "promtool test rules {}:\n{}{}",
        file.display(),
        String::from_utf8_lossy(&test.stdout),
        String::from_utf8_lossy(&test.stderr)
    );
    let _ = std::fs::remove_file(&file);
    eprintln!(
        "promtool: every alert resolved at the export after finalize; after SIGKILL, firing {STEP_SECS} s after the last export, resolved {} s after it (interval and evaluation {STEP_SECS} s)",
        2 * STEP_SECS
    );
}

/// The query of rule `name` of the server's `rules`, with the recording rules it reads inlined
/// (the server records them from its own start only, after the backfilled samples): a range over
/// a recorded series becomes a subquery at a step of [`SUBQUERY_STEP`].
pub fn inlined(rules: &[(String, String, String, String)], name: &str) -> String {
    let records: Vec<&(String, String, String, String)> = rules.iter().filter(|r| r.0.starts_with("nccl:")).collect();
    let mut query = rules.iter().find(|r| r.0 == name).expect(name).1.clone();
    while let Some(record) = records.iter().find(|r| query.contains(r.0.as_str())) {
        let mut out = String::new();
        let mut rest = query.as_str();
        while let Some(i) = rest.find(record.0.as_str()) {
            out.push_str(&rest[..i]);
            out.push_str(&format!("({})", record.1));
            rest = &rest[i + record.0.len()..];
            if let Some(range) = rest.strip_prefix('[') {
                let end = range.find(']').expect("a range's end");
                out.push_str(&format!("[{}:{SUBQUERY_STEP}]", &range[..end]));
                rest = &range[end + 1..];
            }
        }
        out.push_str(rest);
        query = out;
    }
    query
}

/// The step of [`inlined`]'s subqueries: the exports' interval in these tests.
const SUBQUERY_STEP: &str = "250ms";

/// A real Prometheus over all processes' exports: each alert's query names its culprit one
/// interval after its process's last export, and nothing from two intervals after it on.
fn server(processes: &[(&str, Vec<ExportMetricsServiceRequest>)]) {
    let all: Vec<ExportMetricsServiceRequest> = processes.iter().flat_map(|(_, r)| r.clone()).collect();
    let server = Server::start(&prom::openmetrics(&all), Path::new(RULES)).unwrap_or_else(|e| panic!("{e}"));
    let rules = super::prometheus::eventually(|| match server.rules()? {
        rules if rules.is_empty() => Err("no rules loaded".to_owned()),
        rules => Ok(rules),
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
    let at = |t: SystemTime, secs: f64| t + Duration::from_secs_f64(secs);
    for ((case, reqs), (_, alerts)) in processes.iter().zip(ALERTS) {
        let (live, ended) = live_until(reqs);
        let (live, ended) = (prom::collected(&reqs[live]), ended.map(|e| prom::collected(&reqs[e])));
        let end = prom::collected(reqs.last().unwrap());
        for (alert, rank) in alerts {
            let query = &inlined(&rules, alert);
            let named = |t: SystemTime| {
                let rows = server.query(query, Some(t)).unwrap_or_else(|e| panic!("{alert}: {e}"));
                let culprit = rows.iter().any(|r| {
                    r.0.get("culprit_rank").map(String::as_str) == Some(*rank)
                        && r.0.get("culprit_host").map(String::as_str) == Some(HOST)
                });
                (culprit, rows)
            };
            let (before, rows) = named(live);
            assert!(before, "{case}: {alert} at the last live export: {rows:?}");
            // The first 10 ms step after the last live export where the query is empty.
            let resolved = (1..)
                .map(|k| f64::from(k) * 0.01)
                .find(|&secs| named(at(live, secs)).1.is_empty() || secs > 10.0 * INTERVAL)
                .unwrap();
            let bound = match ended {
                Some(ended) => {
                    let (_, rows) = named(ended);
                    assert!(
                        rows.is_empty(),
                        "{case}: {alert} at the export after finalize: {rows:?}"
                    );
                    let after = ended.duration_since(live).unwrap_or_default().as_secs_f64();
                    eprintln!(
                        "prometheus: {case}: {alert} resolves {resolved:.2} s after the last live export, \
                         at the export after finalize ({after:.3} s after it)"
                    );
                    after + 0.01
                }
                None => {
                    let (before, rows) = named(at(live, INTERVAL));
                    assert!(before, "{case}: {alert} one interval after the last export: {rows:?}");
                    assert!(
                        resolved > INTERVAL,
                        "{case}: {alert} resolved {resolved} s after the last export"
                    );
                    eprintln!(
                        "prometheus: {case}: {alert} resolves {resolved:.2} s after the last export (SIGKILL; interval {INTERVAL} s)"
                    );
                    2.0 * INTERVAL + 0.01
                }
            };
            assert!(
                resolved <= bound + 0.001,
                "{case}: {alert} resolved {resolved} s after the last live export, bound {bound} s"
            );
            for later in [1.0, 60.0, 240.0] {
                let (_, rows) = named(at(end, later));
                assert!(
                    rows.is_empty(),
                    "{case}: {alert} {later} s after the last export: {rows:?}"
                );
            }
        }
    }
}

#[test]
fn alerts_resolve_within_two_intervals_of_the_last_export() {
    let _serial = super::serial();
    let dir = std::env::temp_dir().join(format!("nccl-otel-end-of-job-{}", std::process::id()));
    let processes: Vec<(&str, Vec<ExportMetricsServiceRequest>)> =
        ALERTS.iter().map(|(case, _)| (*case, run(case, &dir))).collect();
    let _ = std::fs::remove_dir_all(&dir);
    for (case, reqs) in &processes {
        eprintln!("{case}: {} exports", reqs.len());
    }
    if !super::prometheus::have_prometheus() {
        return;
    }
    promtool(&processes);
    server(&processes);
}

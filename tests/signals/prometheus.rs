//! The signals' Prometheus side: `promtool test rules` on each scenario's series, then a real
//! Prometheus server over all the scenarios' exports (backfilled as OpenMetrics), which evaluates
//! the rules itself and answers every query of the Grafana dashboard. The same server checks run
//! on exports with exponential histograms, written by remote write into a Prometheus with native
//! histograms, against the native variants of the rules and dashboard (`support::prom::native`;
//! promtool 2.42 cannot feed native histograms to `promtool test rules`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use nccl_profiler_otel::culprit::Alert;

use crate::support::emulator::Late;
use crate::support::export as sx;
use crate::support::otlp_receiver::{ExportMetricsServiceRequest, metrics, points};
pub use crate::support::prom::server::have_prometheus;
use crate::support::prom::server::{Row, Server};
use crate::support::prom::{self, Expect, dashboard, native, remote_write};
use crate::{HOST, JOB, JOB_RANK, NODE, RULES, STEP_SECS, Scenario};

/// How the plugin exported its histograms, and so which rules and dashboard a server check loads
/// and how the server gets the samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Histograms {
    /// Explicit buckets: `_bucket`, `_sum` and `_count` series, backfilled as OpenMetrics; the
    /// classic rules and dashboard.
    Classic,
    /// Base-2 exponential: native histograms, by remote write; the native rules and dashboard.
    Native,
}

impl Histograms {
    fn rules(self) -> &'static str {
        match self {
            Histograms::Classic => RULES,
            Histograms::Native => native::RULES,
        }
    }

    fn dashboard(self) -> &'static str {
        match self {
            Histograms::Classic => dashboard::PATH,
            Histograms::Native => native::DASHBOARD,
        }
    }

    /// A query of this check, written for classic histograms, for these.
    fn query(self, classic: &str) -> String {
        match self {
            Histograms::Classic => classic.to_owned(),
            Histograms::Native => native::rewrite(classic, &histograms()).unwrap_or_else(|e| panic!("{classic}: {e}")),
        }
    }

    /// A Prometheus with the requests' samples and these rules.
    fn server(self, reqs: &[ExportMetricsServiceRequest]) -> Result<Server, String> {
        let rules = Path::new(self.rules());
        match self {
            Histograms::Classic => Server::start(&prom::openmetrics(reqs), rules),
            Histograms::Native => {
                let server = Server::remote_write(rules)?;
                server
                    .write(&remote_write::request(reqs))
                    .map_err(|e| format!("{e}\nprometheus log:\n{}", server.log()))?;
                Ok(server)
            }
        }
    }

    /// Every Prometheus name the plugin's series can have: the translated series of
    /// docs/metrics.md's catalogue (a native histogram's under its name alone) and their labels.
    fn known_names(self) -> BTreeSet<String> {
        let mut known = BTreeSet::new();
        for (name, instrument, unit, keys) in sx::catalogue() {
            if self == Histograms::Native && instrument == "Histogram" {
                known.insert(prom::translated(&name, &unit, false));
            } else {
                known.extend(prom::series_names(&name, &instrument, &unit));
            }
            known.extend(sx::expand(&keys).iter().map(|k| k.replace('.', "_")));
        }
        known
    }
}

/// The Prometheus names of the catalogue's histograms, without suffix.
pub fn histograms() -> Vec<String> {
    sx::catalogue()
        .iter()
        .filter(|(_, instrument, ..)| instrument == "Histogram")
        .map(|(name, _, unit, _)| prom::translated(name, unit, false))
        .collect()
}

/// The plugin's `service.instance.id`, the `instance` label of its series.
fn instance(reqs: &[ExportMetricsServiceRequest]) -> String {
    let resource = reqs[0].resource_metrics[0].resource.as_ref().expect("a resource");
    prom::attr(&resource.attributes, "service.instance.id").expect("service.instance.id")
}

/// Every alert of the rules.
fn alerts() -> [&'static str; Alert::ALL.len()] {
    Alert::ALL.map(Alert::name)
}

/// The labels that name an alert's culprit, rank `rank` of the scenarios' process.
fn culprit(rank: &str) -> [(&'static str, &str); 4] {
    [
        ("culprit_rank", rank),
        ("culprit_host", HOST),
        ("culprit_node", NODE),
        ("culprit_job_rank", JOB_RANK),
    ]
}

/// The Prometheus rules on each scenario's series (for the stall also without its member series:
/// the hang alerts still fire, naming the culprit's rank only), and `nccl_report`'s culprits on
/// the same exports: the culprits the alerts fire on (`crate::report`).
pub fn promtool(reqs: &[ExportMetricsServiceRequest], scenarios: &[Scenario], lates: &[(u64, Late)], stalled: u64) {
    let instance = instance(reqs);
    let mut yaml = format!("rule_files:\n  - {RULES}\nevaluation_interval: {STEP_SECS}s\ntests:\n");
    for (i, s) in scenarios.iter().enumerate() {
        let own = own(reqs, scenarios, i);
        let hash = format!("{:#x}", s.hash);
        let mut series = prom::series(&own, |attrs| {
            prom::attr(attrs, "nccl.comm.hash").as_deref() == Some(hash.as_str())
        });
        series.extend(crate::end_of_job::interval_series(&own, STEP_SECS));
        let last = own.len().saturating_sub(1);
        let comm = |extra: &[(&str, &str)]| {
            let name = series
                .keys()
                .find_map(|k| k.split("nccl_comm_name=\"").nth(1)?.split('"').next())
                .unwrap_or_default()
                .to_owned();
            let mut l: BTreeMap<String, String> = [
                ("job", JOB.to_owned()),
                ("nccl_comm_hash", hash.clone()),
                ("nccl_comm_name", name),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
            l.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
            l
        };
        let none = |alert, step| Expect {
            alert,
            step,
            fired: Vec::new(),
        };
        let all_silent = |step| alerts().into_iter().map(move |a| none(a, step));
        let expect: Vec<Expect> = match s.hash {
            h if h == stalled => {
                // The first export with a rank's stuck series.
                let step = own
                    .iter()
                    .position(|r| {
                        let stuck = series_at(r, "nccl.progress.hang.stuck");
                        stuck > 0.0
                    })
                    .expect("an export during the stall");
                // One alert, on the culprit: rank 1, hung where it stopped posting; its
                // neighbours waiting on it are victims, not alerted on.
                let mut l = comm(&[("severity", "critical"), ("culprit_rank", "1"), ("nccl_where", "proxy")]);
                // Without member series: the same alert, naming the culprit's rank only.
                let mut lone = series.clone();
                lone.retain(|k, _| !k.starts_with("nccl_comm_member{"));
                let fired = |l: &BTreeMap<String, String>, at: &str, step: usize| {
                    let summary = format!("Rank 1 of communicator stall ({hash}) is hung (proxy){at}");
                    let victims = ["NcclLinkHung", "NcclRankAbsent"].map(|alert| none(alert, step));
                    let mut e = vec![Expect {
                        alert: "NcclRankHung",
                        step,
                        fired: vec![(l.clone(), summary)],
                    }];
                    e.extend(victims);
                    e
                };
                let unjoined = fired(&l, "", step);
                prom::test_case(&mut yaml, "(a) stall, no member series", STEP_SECS, &lone, &unjoined);
                l.extend(own_labels(&culprit("1")));
                let at = format!(" on host {HOST} (node {NODE})");
                // A killed culprit: rank 1's member series ends more than Prometheus' 5-minute
                // lookback before the hang (every other series starts `GAP` steps later); the
                // alert still names its host.
                const GAP: usize = 300 / STEP_SECS as usize + 1;
                let killed: prom::Series = series
                    .iter()
                    .map(|(k, v)| {
                        let mut shifted = vec![None; GAP];
                        if k.starts_with("nccl_comm_member{") && k.contains("nccl_rank=\"1\"") {
                            shifted[0] = v.iter().flatten().next().copied();
                            shifted.resize(GAP + v.len(), None);
                        } else {
                            shifted.extend(v.iter().copied());
                        }
                        (k.clone(), shifted)
                    })
                    .collect();
                let gone = fired(&l, &at, step + GAP);
                prom::test_case(
                    &mut yaml,
                    "(a) stall, the culprit's member series gone",
                    STEP_SECS,
                    &killed,
                    &gone,
                );
                let mut e = fired(&l, &at, step);
                e.push(none("NcclStraggler", step));
                e
            }
            h if lates.iter().any(|(l, _)| *l == h) => {
                let mut l = comm(&[("severity", "warning"), ("nccl_peer", "2")]);
                l.extend(own_labels(&culprit("2")));
                let name = l["nccl_comm_name"].clone();
                let summary = format!("Straggler rank 2 on host {HOST} in job {JOB}, communicator {name}");
                vec![
                    Expect {
                        alert: "NcclStraggler",
                        step: last,
                        fired: vec![(l, summary)],
                    },
                    none("NcclRankHung", last),
                    none("NcclSlowLink", last),
                ]
            }
            0x5104_0102 => {
                let mut l = comm(&[
                    ("severity", "warning"),
                    ("nccl_rank", "1"),
                    ("nccl_peer", "2"),
                    ("nccl_nranks", "3"),
                    ("instance", &instance),
                    ("peer_host", HOST),
                    ("peer_node", NODE),
                ]);
                l.extend(own_labels(&culprit("1")));
                let summary = format!("Slow link 1 -> 2 ({HOST} -> {HOST}) on communicator slowlink");
                vec![
                    Expect {
                        alert: "NcclSlowLink",
                        step: last,
                        fired: vec![(l, summary)],
                    },
                    none("NcclStraggler", last),
                    none("NcclRankHung", last),
                ]
            }
            _ => all_silent(last / 2).chain(all_silent(last)).collect(),
        };
        crate::report::names_what_the_alerts_name(s.name, &hash, &own, &expect);
        eprintln!("{}: {} exports, {} series", s.name, own.len(), series.len());
        prom::test_case(&mut yaml, s.name, STEP_SECS, &series, &expect);
    }
    let file = std::env::temp_dir().join(format!("nccl-otel-rules-test-{}.yml", std::process::id()));
    std::fs::write(&file, &yaml).unwrap();
    if !check_rules(RULES) {
        eprintln!("the rules were not tested (test input: {})", file.display());
        return;
    }
    let test = std::process::Command::new("promtool")
        .args(["test", "rules"])
        .arg(&file)
        .output()
        .unwrap();
    // On failure, the input series the rules read: the file is gone with CI's machine.
    let inputs = || {
        let used = [
            "- name: ",
            "nccl_link_throughput",
            "peer_wait_seconds_bucket",
            "peer_wait_seconds_sum",
            "coll_service_time_seconds_total",
            "hang_stuck",
        ];
        let lines: Vec<&str> = yaml.lines().collect();
        let shown = lines
            .iter()
            .enumerate()
            .filter(|(_, l)| used.iter().any(|u| l.contains(u)));
        shown
            .flat_map(|(i, l)| {
                [
                    *l,
                    lines
                        .get(i + 1)
                        .filter(|n| n.contains("values:"))
                        .copied()
                        .unwrap_or(""),
                ]
            })
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        test.status.success(),
        "promtool test rules {}:\n{}{}\ninput series the rules read:\n{}",
        file.display(),
        String::from_utf8_lossy(&test.stdout),
        String::from_utf8_lossy(&test.stderr),
        inputs()
    );
    let _ = std::fs::remove_file(&file);
}

/// The requests collected while scenario `i` ran.
pub fn own(reqs: &[ExportMetricsServiceRequest], scenarios: &[Scenario], i: usize) -> Vec<ExportMetricsServiceRequest> {
    let (from, to) = (scenarios[i].from, scenarios.get(i + 1).map(|n| n.from));
    reqs.iter()
        .filter(|r| prom::collected(r) >= from && to.is_none_or(|to| prom::collected(r) < to))
        .cloned()
        .collect()
}

/// `promtool check rules` on `path`, which must pass; `false` without promtool (which fails
/// under `REQUIRE_PROMTOOL`).
pub fn check_rules(path: &str) -> bool {
    let Ok(check) = std::process::Command::new("promtool")
        .args(["check", "rules", path])
        .output()
    else {
        assert!(
            std::env::var_os("REQUIRE_PROMTOOL").is_none(),
            "promtool not found (apt-get install prometheus)"
        );
        eprintln!("promtool not found: {path} was not checked");
        return false;
    };
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stdout));
    true
}

/// Labels as owned strings.
fn own_labels(labels: &[(&str, &str)]) -> Vec<(String, String)> {
    labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

/// Whether `req` has a point of communicator `hash` (`0x…`).
fn has_comm(req: &ExportMetricsServiceRequest, hash: &str) -> bool {
    metrics(std::slice::from_ref(req))
        .into_iter()
        .flat_map(points)
        .any(|p| p.attrs.get("nccl.comm.hash").is_some_and(|h| h == hash))
}

/// The largest value of gauge `name` in one request.
fn series_at(req: &ExportMetricsServiceRequest, name: &str) -> f64 {
    metrics(std::slice::from_ref(req))
        .into_iter()
        .filter(|m| m.name == name)
        .flat_map(points)
        .map(|p| p.value)
        .fold(0.0, f64::max)
}

/// Polls `check` every 200 ms until it holds or 30 s pass; the last answer either way.
pub(super) fn eventually<T>(mut check: impl FnMut() -> Result<T, String>) -> Result<T, String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let r = check();
        if r.is_ok() || std::time::Instant::now() > deadline {
            return r;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

fn has(row: &Row, labels: &[(&str, &str)]) -> bool {
    labelled(&row.0, labels)
}

/// Whether `set` has each of `labels` (name, value).
fn labelled(set: &BTreeMap<String, String>, labels: &[(&str, &str)]) -> bool {
    labels.iter().all(|(k, v)| set.get(*k).map(String::as_str) == Some(*v))
}

/// The row of the smallest (`-1.0`) or largest (`1.0`) value.
fn extreme(rows: &[Row], sign: f64) -> Option<&Row> {
    rows.iter().max_by(|a, b| (sign * a.1).total_cmp(&(sign * b.1)))
}

/// All scenarios' exports on a real Prometheus (backfilled, or by remote write for native
/// histograms), the rules of `histograms` evaluated by the server (every rule healthy; the
/// straggler and slow-link alerts pending on their scenarios, nothing on the healthy one; the hang
/// alerts' queries name peer 1 and rank 1 at the stall), and every query of its Grafana dashboard
/// answered with the series each panel should show.
pub fn server(
    reqs: &[ExportMetricsServiceRequest],
    scenarios: &[Scenario],
    lates: &[(u64, Late)],
    stalled: u64,
    slow: u64,
    histograms: Histograms,
) {
    if !have_prometheus() {
        return;
    }
    let server = histograms
        .server(&crate::end_of_job::held_live(reqs))
        .unwrap_or_else(|e| panic!("{e}"));
    let fail = |what: String| -> ! { panic!("{what}\nprometheus log:\n{}", server.log()) };
    let hex = |h: u64| format!("{h:#x}");
    let (slow, stalled, healthy) = (hex(slow), hex(stalled), hex(scenarios[0].hash));

    // The rules, evaluated by the server from its start over the backfilled samples.
    let rules = eventually(|| {
        let rules = server.rules()?;
        let pending: Vec<_> = rules.iter().filter(|r| r.2 != "ok").collect();
        if pending.is_empty() {
            Ok(rules)
        } else {
            Err(format!("rules not (yet) healthy: {pending:?}"))
        }
    })
    .unwrap_or_else(|e| fail(e));
    // Each alert's query, its recording rules inlined (the server records them from its start
    // only), at the last export of each scenario: (alert, communicator, peer, culprit rank), each
    // naming the culprit's host; nothing on the healthy communicator.
    let last_export = |hash: &str| {
        reqs.iter()
            .rev()
            .find(|r| has_comm(r, hash))
            .map(prom::collected)
            .unwrap_or_else(|| fail(format!("no export of {hash}")))
    };
    let mut wanted: Vec<(&str, String, &str, &str)> = lates
        .iter()
        .map(|(h, _)| ("NcclStraggler", hex(*h), "2", "2"))
        .collect();
    wanted.push(("NcclSlowLink", slow.clone(), "2", "1"));
    for (alert, hash, peer, rank) in &wanted {
        let rows = server
            .query(&crate::end_of_job::inlined(&rules, alert), Some(last_export(hash)))
            .unwrap_or_else(|e| fail(e));
        assert!(
            rows.iter()
                .any(|r| has(r, &[("nccl_comm_hash", hash), ("nccl_peer", peer)]) && has(r, &culprit(rank))),
            "{alert} at the last export of {hash}: {rows:?}"
        );
    }
    for alert in alerts() {
        let rows = server
            .query(&crate::end_of_job::inlined(&rules, alert), Some(last_export(&healthy)))
            .unwrap_or_else(|e| fail(e));
        let quiet: Vec<_> = rows
            .iter()
            .filter(|r| has(r, &[("nccl_comm_hash", &healthy)]))
            .collect();
        assert!(quiet.is_empty(), "{alert} on the healthy communicator: {quiet:?}");
    }
    eprintln!(
        "prometheus ({histograms:?} histograms): {} rules healthy, every alert named its culprit",
        rules.len(),
    );

    // The hang alerts' queries at the stall's first export with a stuck series, with the
    // recording rules they read inlined (the server records them from its start only).
    let stuck_at = reqs
        .iter()
        .filter(|r| series_at(r, "nccl.progress.hang.stuck") > 0.0)
        .map(prom::collected)
        .next()
        .expect("an export during the stall");
    let query = crate::end_of_job::inlined(&rules, "NcclRankHung");
    let rows = server.query(&query, Some(stuck_at)).unwrap_or_else(|e| fail(e));
    assert!(
        rows.iter()
            .any(|r| has(r, &[("nccl_comm_hash", &stalled), ("nccl_where", "proxy")]) && has(r, &culprit("1"))),
        "NcclRankHung at the stall: {rows:?}"
    );
    for alert in ["NcclLinkHung", "NcclRankAbsent"] {
        let rows = server
            .query(&crate::end_of_job::inlined(&rules, alert), Some(stuck_at))
            .unwrap_or_else(|e| fail(e));
        assert!(rows.is_empty(), "{alert} at the stall (victims): {rows:?}");
    }

    // The recording rules' series (each group evaluates on its own schedule: samples written
    // after the server started are in the next evaluation of each).
    for (record, hash) in [
        ("nccl:coll_duration:mean5m", &healthy),
        ("nccl:coll_busbw:rate5m", &slow),
        ("nccl:coll_kernel_busbw:rate5m", &healthy),
    ] {
        eventually(
            || match server.query(&format!("{record}{{nccl_comm_hash=\"{hash}\"}}"), None)? {
                rows if rows.is_empty() => Err(format!("{record} of {hash}: no series")),
                rows => Ok(rows),
            },
        )
        .unwrap_or_else(|e| fail(e));
    }

    // The dashboard: every panel's queries, with the links' communicator the slow-link one, on the
    // scenarios' host; on another host, none has data (every query filters by host).
    let known = histograms.known_names();
    let vars = |host| {
        [
            ("$__rate_interval", "1m"),
            ("$job", JOB),
            ("$host", host),
            ("$comm", slow.as_str()),
        ]
    };
    let path = histograms.dashboard();
    let panels = |host| dashboard::panels(path, &vars(host)).unwrap_or_else(|e| panic!("{path}: {e}"));
    for panel in panels("elsewhere") {
        for q in &panel.queries {
            let rows = server
                .query(q, None)
                .unwrap_or_else(|e| fail(format!("{}: {q}: {e}", panel.title)));
            assert!(
                rows.is_empty(),
                "{}: data from another host: {q}: {rows:?}",
                panel.title
            );
        }
    }
    for panel in panels(NODE) {
        let mut rows = Vec::new();
        for q in &panel.queries {
            let unknown: Vec<&str> = names(q).into_iter().filter(|n| !known.contains(*n)).collect();
            assert!(unknown.is_empty(), "{}: unknown names {unknown:?} in {q}", panel.title);
            rows.extend(
                server
                    .query(q, None)
                    .unwrap_or_else(|e| fail(format!("{}: {q}: {e}", panel.title))),
            );
        }
        eprintln!("dashboard: {}: {} series", panel.title, rows.len());
        if panel.title.starts_with("Operations per second") {
            once_per_collective(&server, &rows, histograms);
        }
        let expected = expect(&panel.title, &rows, &slow, &stalled, lates);
        assert!(
            expected.is_ok(),
            "dashboard panel {:?}: {}\n{rows:?}",
            panel.title,
            expected.unwrap_err()
        );
    }
}

/// The dashboard's AllReduces per second count each collective once: a third of what the three
/// ranks of each ring complete together.
fn once_per_collective(server: &Server, rows: &[Row], histograms: Histograms) {
    let query = format!("sum(rate(nccl_coll_duration_seconds_count{{job=\"{JOB}\", nccl_func=\"AllReduce\"}}[1m]))");
    let all: f64 = server
        .query(&histograms.query(&query), None)
        .unwrap_or_default()
        .iter()
        .map(|r| r.1)
        .sum();
    let shown: f64 = rows
        .iter()
        .filter(|r| r.0.get("nccl_func").is_some_and(|f| f == "AllReduce"))
        .map(|r| r.1)
        .sum();
    assert!(
        all > 0.0 && (shown * 3.0 - all).abs() <= 0.1 * all,
        "AllReduces per second: the dashboard shows {shown}, the ranks completed {all}"
    );
}

/// What a dashboard panel must show on the scenarios' data, by its title.
fn expect(title: &str, rows: &[Row], slow: &str, stalled: &str, lates: &[(u64, Late)]) -> Result<(), String> {
    let nonempty = || {
        if rows.is_empty() {
            Err("no series".to_owned())
        } else {
            Ok(())
        }
    };
    let link = |min: &Row| has(min, &[("nccl_rank", "1"), ("nccl_peer", "2")]);
    // Per-rank panels name each rank's host.
    let hosted = || rows.iter().all(|r| has(r, &[("job_node_name", NODE)]));
    let all_ranks_of = |hash: &str| {
        (0..3).all(|r| {
            rows.iter()
                .any(|row| has(row, &[("nccl_comm_hash", hash), ("nccl_rank", &r.to_string())]))
        })
    };
    let ok = |holds: bool, what: &str| if holds { Ok(()) } else { Err(what.to_owned()) };
    match title {
        t if t.starts_with("Time in collectives per rank") => ok(
            all_ranks_of(slow) && hosted() && rows.iter().all(|r| r.1 > 0.0 && r.1 <= 1.5),
            "every rank of the slow-link ring, with its host, in service part of the time",
        ),
        t if t.starts_with("Bus bandwidth per rank") => ok(
            all_ranks_of(slow) && hosted() && rows.iter().all(|r| r.1 > 0.0),
            "every rank of the slow-link ring, with its host",
        ),
        t if t.starts_with("Collective latency")
            || t.starts_with("Mean collective")
            || t.starts_with("Bus bandwidth")
            || t.starts_with("Operations per second") =>
        {
            ok(
                rows.iter()
                    .any(|r| r.0.get("nccl_func").is_some_and(|f| f == "AllReduce") && r.1 > 0.0),
                "no AllReduce",
            )
        }
        t if t.starts_with("Link wire bandwidth, sender") => ok(
            rows.len() == 3 && extreme(rows, -1.0).is_some_and(link),
            "3 links, 1 -> 2 the slowest",
        ),
        // One size: a link's latency needs the wire rate of 4 clean gaps, which a short run with
        // 5 % jitter and preempted callbacks may not give it (the missing panel counts it).
        t if t.starts_with("Link latency, sender") => ok((1..=3).contains(&rows.len()), "up to 3 links"),
        t if t.starts_with("Link queue wait, sender") => ok(rows.len() == 3, "3 links"),
        t if t.starts_with("Link latency (wire) and queue wait") => ok(
            (4..=6).contains(&rows.len()),
            "3 links' queue wait and up to 3 latencies",
        ),
        // Links of the healthy ring (one size, few clean queued transfers) and of the stall.
        t if t.starts_with("Link latency missing") => ok(
            !rows.is_empty()
                && rows.iter().all(|r| {
                    ["no_idle_transfer", "one_size", "no_fit", "shed"].contains(&r.0["nccl_reason"].as_str())
                        && r.1 >= 0.0
                }),
            "intervals without latency, by a known reason",
        ),
        t if t.starts_with("Slowest links") => ok(
            extreme(rows, -1.0).is_some_and(|r| link(r) && r.0["nccl_comm_hash"] == slow && r.1 < 0.5) && hosted(),
            "link 1 -> 2 of the slow-link communicator first, below half the median, with the sending host",
        ),
        t if t.starts_with("Link wire bandwidth and") || t.starts_with("Bytes sent per link") => nonempty(),
        t if t.starts_with("Stuck operations") => ok(
            rows.iter().any(|r| r.0["nccl_comm_hash"] == stalled) && hosted(),
            "the stall's communicator, with the reporting ranks' host",
        ),
        t if t.starts_with("Hang episodes") => ok(
            all_ranks_of(stalled) && hosted() && rows.iter().all(|r| r.0["nccl_comm_hash"] != stalled || r.1 == 1.0),
            "one episode on each rank of the stall, with its host",
        ),
        t if t.starts_with("Straggler") => {
            let lates: Vec<String> = lates.iter().map(|(h, _)| format!("{h:#x}")).collect();
            ok(
                hosted()
                    && extreme(rows, 1.0)
                        .is_some_and(|r| lates.contains(&r.0["nccl_comm_hash"]) && r.0["nccl_peer"] == "2"),
                "rank 2 of a late communicator, with its host, waited for the longest",
            )
        }
        t if t.starts_with("Initial sync") => ok(
            lates.iter().all(|(h, _)| all_ranks_of(&format!("{h:#x}"))) && hosted(),
            "every rank of the late communicators, with its host",
        ),
        // Every drop reason is exported from the start (at 0); the stall's late records count.
        t if t.starts_with("Events lost") => ok(
            rows.iter()
                .any(|r| r.0.get("nccl_reason").is_some_and(|k| k == "late") && r.1 > 0.0),
            "the stall's late records",
        ),
        // No overflow, invalid GPU interval or panic in these runs: no data, or zeros.
        t if t.starts_with("Overflows") => ok(rows.iter().all(|r| r.1 == 0.0), "none"),
        t if t.starts_with("Oldest operation")
            || t.starts_with("Operations in flight")
            || t.starts_with("Events recorded")
            || t.starts_with("Windows")
            || t.starts_with("Export requests")
            || t.starts_with("KernelCh") =>
        {
            nonempty()
        }
        _ => Err("no expectation for this panel in tests/signals/prometheus.rs".to_owned()),
    }
}

/// The `nccl_…` names a query reads (metrics and labels; recording rules are `nccl:…`).
fn names(query: &str) -> Vec<&str> {
    query
        .split(|c: char| !c.is_ascii_alphanumeric() && c != '_' && c != ':')
        .filter(|w| w.starts_with("nccl_"))
        .collect()
}

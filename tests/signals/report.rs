//! `nccl_report`'s culprits (`examples/nccl_report/src/verdict.rs`, which this binary includes) on
//! the exports the promtool test feeds the rules, scenario by scenario: the report names exactly
//! the culprits the alerts fire on (by alert, culprit rank, a link's receiving rank and where a
//! rank hangs), and nothing on the healthy ring. With exponential histograms (the native run,
//! which has no promtool test), it names each scenario's culprit.

use std::collections::BTreeSet;

use nccl_profiler_otel::culprit::Alert;

use crate::support::otlp_receiver::ExportMetricsServiceRequest;
use crate::support::prom::Expect;
use crate::support::verdict;
use crate::{Run, prometheus};

/// (alert, culprit rank, a link's receiving rank, where a rank hangs).
type Named = BTreeSet<(String, String, Option<String>, Option<String>)>;

fn link(alert: &str) -> bool {
    [Alert::LinkHung, Alert::SlowLink].iter().any(|a| a.name() == alert)
}

/// What the alerts of `expect` fire on.
fn alerted(expect: &[Expect]) -> Named {
    let mut out = Named::new();
    for e in expect {
        for (labels, _) in &e.fired {
            let peer = labels.get("nccl_peer").filter(|_| link(e.alert)).cloned();
            out.insert((
                e.alert.to_owned(),
                labels["culprit_rank"].clone(),
                peer,
                labels.get("nccl_where").cloned(),
            ));
        }
    }
    out
}

/// The culprits the report names on `own` for communicator `hash` (host culprits included).
fn named(own: &[ExportMetricsServiceRequest], hash: &str) -> (Named, Vec<verdict::Culprit>) {
    let culprits = verdict::culprits(own);
    let named = culprits
        .iter()
        .filter(|c| c.hash == hash || c.hash.is_empty())
        .map(|c| {
            let name = c.alert.name();
            let peer = c.peer.clone().filter(|_| link(name));
            (
                name.to_owned(),
                c.rank.clone(),
                peer,
                c.wait.map(|w| w.as_str().to_owned()),
            )
        })
        .collect();
    (named, culprits)
}

/// Checks that the report names on `own`, for communicator `hash`, what `expect` alerts on.
pub fn names_what_the_alerts_name(scenario: &str, hash: &str, own: &[ExportMetricsServiceRequest], expect: &[Expect]) {
    let (named, culprits) = named(own, hash);
    let alerted = alerted(expect);
    eprintln!("{scenario}: the alerts and nccl_report name {named:?}");
    assert_eq!(named, alerted, "{scenario}: nccl_report named {culprits:?}");
}

/// Checks that the report names each scenario's culprit of `run`: rank 1 of the stall hung at
/// its proxy, rank 2 of the late rings a straggler, the link 1 → 2 slow, nothing on the healthy
/// ring.
pub fn names_each_culprit(run: &Run) {
    let one = |alert: Alert, rank: &str, peer: Option<&str>, wait: Option<&str>| {
        Named::from([(
            alert.name().to_owned(),
            rank.to_owned(),
            peer.map(str::to_owned),
            wait.map(str::to_owned),
        )])
    };
    for (i, s) in run.scenarios.iter().enumerate() {
        let expected = match s.hash {
            h if h == run.stalled => one(Alert::RankHung, "1", None, Some("proxy")),
            h if h == run.slow => one(Alert::SlowLink, "1", Some("2"), None),
            h if run.lates.iter().any(|(l, _)| *l == h) => one(Alert::Straggler, "2", None, None),
            _ => Named::new(),
        };
        let (named, culprits) = named(
            &prometheus::own(&run.reqs, &run.scenarios, i),
            &format!("{:#x}", s.hash),
        );
        eprintln!("{}: nccl_report names {named:?}", s.name);
        assert_eq!(named, expected, "{}: nccl_report named {culprits:?}", s.name);
    }
}

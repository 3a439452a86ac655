//! Scoring a case's alerts against its injected fault, as the issue defines it: an incident is
//! the injected fault, its window from injection to removal plus two export intervals; an alert
//! naming the right culprit and kind in that window is a true positive, every other culprit alert
//! (victims included, and any alert of a healthy run or before the injection) a false positive;
//! the detection latency runs from the injection to the first correct firing.

use std::fmt;
use std::time::{Duration, Instant};

use nccl_profiler_otel::culprit::{Alert, Wait};

use super::live::Firing;
use super::{Fault, HOSTS, PER_HOST, Where, comm_hash};

/// The export interval the plugin uses by default.
pub const INTERVAL: Duration = Duration::from_secs(5);

/// What an alert names (world ranks, host indices).
#[derive(Clone, Debug, PartialEq)]
pub enum Named {
    HungRank {
        rank: usize,
        at: String,
    },
    HungLink {
        src: usize,
        dst: usize,
    },
    Absent {
        rank: usize,
    },
    SlowRank {
        rank: usize,
    },
    SlowLink {
        src: usize,
        dst: usize,
    },
    SlowHost {
        host: usize,
    },
    /// An alert this scoring does not know, or a culprit outside the job.
    Other(String),
}

impl fmt::Display for Named {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Named::HungRank { rank, at } => write!(f, "rank {rank} hung ({at})"),
            Named::HungLink { src, dst } => write!(f, "link {src} -> {dst} hung"),
            Named::Absent { rank } => write!(f, "rank {rank} absent"),
            Named::SlowRank { rank } => write!(f, "rank {rank} slow"),
            Named::SlowLink { src, dst } => write!(f, "link {src} -> {dst} slow"),
            Named::SlowHost { host } => write!(f, "host {host} slow"),
            Named::Other(s) => write!(f, "{s}"),
        }
    }
}

impl Fault {
    /// What a correct alert names; `None` for a healthy run.
    pub fn culprit(&self) -> Option<Named> {
        Some(match *self {
            Fault::None | Fault::Checkpoint { .. } | Fault::Preempted | Fault::LongCollectives => return None,
            Fault::SlowLink { src, dst, .. } | Fault::Flapping { src, dst } => Named::SlowLink { src, dst },
            Fault::SlowNic { host, .. } => Named::SlowHost { host },
            Fault::Straggler { rank, .. } => Named::SlowRank { rank },
            Fault::Hung { rank, at } => Named::HungRank {
                rank,
                at: match at {
                    Where::Proxy => Wait::Proxy,
                    Where::Gpu => Wait::Gpu,
                    Where::Network => Wait::Network,
                }
                .as_str()
                .to_owned(),
            },
            Fault::Absent { rank } => Named::Absent { rank },
        })
    }
}

/// What alert `f` of job `job` names.
pub fn named(f: &Firing, job: u64) -> Named {
    let other = || Named::Other(format!("{} {:?}", f.label("alertname"), f.labels));
    let alert = Alert::ALL.into_iter().find(|a| a.name() == f.label("alertname"));
    // The rail communicator's local rank, from its hash; its rank is the host.
    let Some(local) = (0..PER_HOST).find(|&l| format!("{:#x}", comm_hash(job, l)) == f.label("nccl_comm_hash")) else {
        return match (alert, f.label("culprit_host").strip_prefix("host")) {
            (Some(Alert::SlowHost), Some(h)) => h.parse().map_or_else(|_| other(), |host| Named::SlowHost { host }),
            _ => other(),
        };
    };
    let world = |label: &str| {
        f.label(label)
            .parse::<usize>()
            .ok()
            .filter(|&h| h < HOSTS)
            .map(|h| h * PER_HOST + local)
    };
    let (rank, peer) = (world("culprit_rank"), world("nccl_peer"));
    match (alert, rank, peer) {
        (Some(Alert::RankHung), Some(rank), _) => Named::HungRank {
            rank,
            at: f.label("nccl_where").to_owned(),
        },
        (Some(Alert::LinkHung), Some(src), Some(dst)) => Named::HungLink { src, dst },
        (Some(Alert::RankAbsent), Some(rank), _) => Named::Absent { rank },
        (Some(Alert::Straggler), Some(rank), _) => Named::SlowRank { rank },
        (Some(Alert::SlowLink), Some(src), Some(dst)) => Named::SlowLink { src, dst },
        _ => other(),
    }
}

/// One case's outcome.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// From the injection to the first correct firing, if any.
    pub latency: Option<Duration>,
    /// Culprit alerts that were not correct: what they named, and when after the injection they
    /// first fired (negative: before it, in the healthy warm-up).
    pub false_positives: Vec<(Named, f64)>,
    /// Healthy time the case ran: its warm-up, or all of it for a healthy run.
    pub healthy: Duration,
}

/// Scores the alerts `firing` of job `job` against `fault`, injected at `at`, removed at `end`.
pub fn score(fault: &Fault, job: u64, firing: &[Firing], at: Instant, end: Instant, started: Instant) -> Outcome {
    let want = fault.culprit();
    let window = end + 2 * INTERVAL;
    let mut latency = None;
    let mut false_positives = Vec::new();
    for f in firing {
        let n = named(f, job);
        let after = if f.first >= at {
            (f.first - at).as_secs_f64()
        } else {
            -(at - f.first).as_secs_f64()
        };
        let correct = want.as_ref() == Some(&n) && f.first >= at && f.first <= window;
        if correct {
            let l = f.first - at;
            latency = Some(latency.map_or(l, |x: Duration| x.min(l)));
        } else if !false_positives.iter().any(|(m, _)| *m == n) {
            false_positives.push((n, after));
        }
    }
    let healthy = if want.is_some() {
        at.saturating_duration_since(started)
    } else {
        window.saturating_duration_since(started)
    };
    Outcome {
        latency,
        false_positives,
        healthy,
    }
}

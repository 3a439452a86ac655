//! What the collector received: each request reduced to the plugin's self-telemetry totals, and
//! the phases of the run those requests are credited to.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::Kind;
use crate::support::otlp_receiver::{ExportMetricsServiceRequest, Receiver, metric, metrics, points};

/// The plugin's self-telemetry in one request (cumulative totals, summed over communicators).
#[derive(Clone, Debug, Default)]
pub struct Totals {
    pub recorded: u64,
    /// `events.dropped` by reason.
    pub dropped: BTreeMap<String, u64>,
    /// `events.shed`, every reason: records not made because the consumer fell behind.
    pub shed: u64,
    pub rejected: u64,
    pub declined: u64,
    pub windows: u64,
    /// `windows.processed` by communicator hash.
    pub windows_by_comm: BTreeMap<String, u64>,
    pub windows_forced: u64,
    pub windows_dropped: u64,
    pub unfinished: u64,
    pub orphaned: u64,
    pub panics: u64,
    pub failures: u64,
    pub export_dropped: u64,
    pub sent: u64,
    pub overflow: u64,
}

impl Totals {
    pub fn drops(&self) -> u64 {
        self.dropped.values().sum()
    }
}

/// One received request, reduced to what the checks need (requests are not kept: memory).
#[derive(Clone, Debug)]
pub struct Snap {
    /// Collection time (the data points' `time_unix_nano`).
    pub collected: u64,
    pub totals: Totals,
}

pub fn snap(req: &ExportMetricsServiceRequest) -> Snap {
    let mut t = Totals::default();
    let mut collected = 0;
    for m in metrics(std::slice::from_ref(req)) {
        if let Some(metric::Data::Sum(s)) = &m.data {
            collected = s.data_points.iter().map(|p| p.time_unix_nano).fold(collected, u64::max);
        }
        for p in points(m) {
            let v = p.value as u64;
            match m.name.as_str() {
                "nccl.profiler.events.recorded" => t.recorded += v,
                "nccl.profiler.events.dropped" => {
                    *t.dropped.entry(p.attrs["nccl.reason"].clone()).or_default() += v;
                }
                "nccl.profiler.events.shed" => t.shed += v,
                "nccl.profiler.events.rejected" => t.rejected += v,
                "nccl.profiler.events.declined" => t.declined += v,
                "nccl.profiler.events.unfinished" => t.unfinished += v,
                "nccl.profiler.events.orphaned" => t.orphaned += v,
                "nccl.profiler.windows.processed" => {
                    t.windows += v;
                    *t.windows_by_comm.entry(p.attrs["nccl.comm.hash"].clone()).or_default() += v;
                }
                "nccl.profiler.windows.forced" => t.windows_forced += v,
                "nccl.profiler.windows.dropped" => t.windows_dropped += v,
                "nccl.profiler.panics" => t.panics += v,
                "nccl.profiler.export.failures" => t.failures += v,
                "nccl.profiler.export.dropped" => t.export_dropped += v,
                "nccl.profiler.export.sent" => t.sent += v,
                "nccl.profiler.cardinality.overflow" => t.overflow += v,
                _ => {}
            }
        }
    }
    Snap { collected, totals: t }
}

/// One phase as it ran.
pub struct Phase {
    pub kind: Kind,
    pub start: Instant,
    pub start_ns: u64,
    pub end_ns: u64,
    pub secs: f64,
    /// Requests that arrived during the phase.
    pub received: u64,
    pub rss_max: u64,
    /// Healthy after a fault: time from the phase start to the first request with fresh data.
    pub resume: Option<Duration>,
}

/// Requests received so far, reduced; the phase they arrive in is credited.
pub fn harvest(rx: &Receiver, snaps: &mut Vec<Snap>, phase: Option<&mut Phase>) {
    let now = Instant::now();
    let new: Vec<Snap> = rx.take().iter().map(snap).collect();
    if let Some(ph) = phase {
        ph.received += new.len() as u64;
        if ph.kind == Kind::Healthy && ph.resume.is_none() {
            let before = snaps.iter().map(|s| s.totals.recorded).max().unwrap_or(0);
            if new
                .iter()
                .any(|s| s.collected >= ph.start_ns && s.totals.recorded > before)
            {
                ph.resume = Some(now - ph.start);
            }
        }
    }
    snaps.extend(new);
}

/// The snapshots bounding what a phase changed. Healthy: the first and the last collected
/// within it. Faulty (nothing arrives then): the last collected before it and the first after.
pub fn bracket<'s>(snaps: &'s [Snap], ph: &Phase) -> Option<(&'s Snap, &'s Snap)> {
    let (t, u) = (ph.start_ns, ph.end_ns);
    if ph.kind == Kind::Healthy {
        let mut inside = snaps.iter().filter(|s| (t..=u).contains(&s.collected));
        let first = inside.next()?;
        Some((first, inside.next_back().unwrap_or(first)))
    } else {
        let a = snaps.iter().filter(|s| s.collected <= t).max_by_key(|s| s.collected)?;
        let b = snaps.iter().filter(|s| s.collected >= u).min_by_key(|s| s.collected)?;
        Some((a, b))
    }
}

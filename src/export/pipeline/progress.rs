//! The progress family (`nccl.progress.*`, `docs/metrics.md`): every interval, each live
//! communicator's operations in flight, its oldest one, the last completed sequence numbers and
//! the current hang episode, read from the communicator ([`crate::telemetry::CommState::progress`])
//! whether or not NCCL made progress; and, from each window summary, how long its operations
//! waited for their peers (the straggler histograms). Called on: the telemetry thread.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashSet};

use opentelemetry::{Key, KeyValue};

use super::super::catalogue::keys;
use super::super::limiter::Family;
use super::super::weighted::record_n;
use super::{Pipeline, comm_attrs};
use crate::aggregate::{CommProgress, OpSample};
use crate::record::Func;
use crate::telemetry::report::CommReport;

/// The stuck series the last interval reported.
#[derive(Default)]
pub(super) struct Progress {
    /// The stuck series of the last interval: one that ends is reported once more, at 0.
    stuck_seen: HashSet<Vec<KeyValue>>,
    stuck_now: HashSet<Vec<KeyValue>>,
}

impl Pipeline {
    /// Records one communicator slot's progress: its episodes, and its gauges while it is live.
    pub(super) fn progress(&mut self, report: &CommReport) {
        let (c, new) = (&report.state, report.episodes);
        let p: &CommProgress = &c.progress;
        let base = comm_attrs(&c.meta);
        if new > 0 || c.live {
            let attrs = self.attrs_or_overflow(Family::Progress, base.clone(), 1);
            self.inst.progress.episodes.add(new, &attrs);
        }
        if !c.live {
            return;
        }
        let attrs = self.attrs_or_overflow(Family::Progress, base.clone(), 1);
        self.inst.progress.in_flight.record(p.in_flight as f64, &attrs);
        let with = |k: Key, v: &'static str| {
            let mut attrs = base.clone();
            attrs.push(KeyValue::new(k, v));
            attrs
        };
        if let Some(o) = p.oldest {
            let attrs = self.attrs_or_overflow(Family::Progress, with(keys::FUNC, o.func.as_str()), 4);
            let g = &self.inst.progress;
            g.oldest_age.record(o.age.as_secs_f64(), &attrs);
            g.oldest_idle.record(o.idle.as_secs_f64(), &attrs);
            g.oldest_bytes.record(o.bytes as f64, &attrs);
            if let Some(seq) = o.seq {
                g.oldest_seq.record(seq as f64, &attrs);
            }
        }
        for (func, seq) in &p.completed {
            let attrs = self.attrs_or_overflow(Family::Progress, with(keys::FUNC, func.as_str()), 1);
            self.inst.progress.completed_seq.record(*seq as f64, &attrs);
        }
        if let Some(hang) = &p.hang {
            let mut waits: Vec<_> = hang.channels.iter().map(|s| (s.peer, s.wait)).collect();
            waits.sort();
            waits.dedup();
            for (peer, wait) in waits {
                let mut attrs = with(keys::WAIT, wait.as_str());
                attrs.extend(peer.map(|p| KeyValue::new(keys::PEER, i64::from(p))));
                let attrs = self.attrs_or_overflow(Family::Progress, attrs, 1);
                self.inst.progress.stuck.record(hang.idle.as_secs_f64(), &attrs);
                self.progress.stuck_now.insert(attrs);
            }
        }
    }

    /// How long the operations `ops` of function `func` waited for their peers: by peer, and in
    /// their initial sync.
    pub(super) fn waits(&mut self, base: &[KeyValue], func: Func, ops: &[OpSample]) {
        // Timed operations only, each its weight times (sampling).
        let weighted = |o: &OpSample, wait: Option<f64>| wait.map(|w| (w, o.sample.weight())).filter(|(_, n)| *n > 0);
        let mut by_peer: BTreeMap<i32, Vec<(f64, u32)>> = BTreeMap::new();
        for o in ops {
            if let Some((peer, secs)) = o.waits.peer {
                by_peer.entry(peer).or_default().extend(weighted(o, Some(secs)));
            }
        }
        let n = |v: &[(f64, u32)]| v.iter().map(|(_, w)| u64::from(*w)).sum::<u64>();
        let with_func = || {
            let mut attrs = base.to_vec();
            attrs.push(KeyValue::new(keys::FUNC, func.as_str()));
            attrs
        };
        for (peer, secs) in by_peer.into_iter().filter(|(_, v)| !v.is_empty()) {
            let mut attrs = with_func();
            attrs.push(KeyValue::new(keys::PEER, i64::from(peer)));
            let attrs = self.attrs_or_overflow(Family::Progress, attrs, n(&secs));
            let h = self.inst.progress.peer_wait.bind(&attrs);
            secs.iter().for_each(|&(s, w)| record_n(&h, s, w));
        }
        let sync: Vec<(f64, u32)> = ops.iter().filter_map(|o| weighted(o, o.waits.sync)).collect();
        if !sync.is_empty() {
            let attrs = self.attrs_or_overflow(Family::Progress, with_func(), n(&sync));
            let h = self.inst.progress.sync_wait.bind(&attrs);
            sync.iter().for_each(|&(s, w)| record_n(&h, s, w));
        }
    }

    /// Ends the interval's progress: a stuck series that ended is reported at 0 once.
    pub(super) fn end_progress(&mut self) {
        let g = &mut self.progress;
        for ended in g.stuck_seen.difference(&g.stuck_now) {
            self.inst.progress.stuck.record(0.0, ended);
        }
        g.stuck_seen = std::mem::take(&mut g.stuck_now);
    }
}

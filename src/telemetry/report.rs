//! The export interval, owned by the telemetry thread, and the one plain value it hands the
//! exporter per pass ([`Report`]). The [`Reporter`] decides once when an interval ends, whether
//! ProxyStep detail was shed in it (then no link or channel gets a latency, bandwidth or R²),
//! what every counter gained since the last report, and which finalized communicators are still
//! reported; the exporter maps the values onto instruments and decides nothing.
//! Called on: the telemetry thread only.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crate::aggregate::flight::CommProgress;
use crate::aggregate::interval::{Figures, Interval};
use crate::aggregate::{Split, WindowSummary};
use super::DropCounts;
use crate::config::{Config, Problem};
use crate::record::CommMeta;
use crate::stats::Snapshot;

/// One communicator slot's state at a poll: the communicator that owns it, its counters and its
/// progress.
#[derive(Clone, Debug, PartialEq)]
pub struct CommState {
    /// Registry slot.
    pub slot: usize,
    /// Generation of the slot's current (or last) communicator.
    pub generation: u16,
    /// That communicator.
    pub meta: CommMeta,
    /// Its drop counters, cumulative since its `init`.
    pub counts: DropCounts,
    /// Whether it is still live.
    pub live: bool,
    /// Its operations in flight and hang episodes.
    pub progress: CommProgress,
}

/// One processed window with the queue wait and service time of each of its collectives, in the
/// order of its groups' operations.
#[derive(Clone, Debug)]
pub struct Window {
    /// The window's summary.
    pub summary: WindowSummary,
    /// Its collectives' splits ([`Interval::split`]).
    pub splits: Vec<Split>,
}

/// A communicator slot in an interval's self-telemetry.
#[derive(Clone, Debug, PartialEq)]
pub struct CommReport {
    /// The slot at the interval's end.
    pub state: CommState,
    /// What its drop counters gained in the interval.
    pub dropped: DropCounts,
    /// Hang episodes that started in the interval.
    pub episodes: u64,
    /// Whether its counters are exported: a live communicator always, a finalized one once more
    /// (so that even a short-lived one has its series), then only while its counters move.
    pub counted: bool,
}

/// The plugin's own counters for one interval, as plain values.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SelfTelemetry {
    /// What the process-wide counters gained in the interval.
    pub stats: Snapshot,
    /// Window summaries dropped from the full inbox in the interval.
    pub windows_dropped: u64,
    /// The fraction of time KernelCh is requested ([`crate::activation::duty`]).
    pub kernel_ch_duty: Option<f64>,
    /// Every communicator slot allocated so far, in slot order.
    pub comms: Vec<CommReport>,
    /// The configuration's problems ([`Config::problems`]).
    pub config_problems: &'static [Problem],
    /// Whether this is the first report with them (each is counted once).
    pub first_problems: bool,
    /// Whether a communicator is live (else the process has nothing more to report).
    pub live: bool,
}

/// The end of an interval: its figures and the plugin's own counters.
#[derive(Clone, Debug, Default)]
pub struct IntervalEnd {
    /// The interval's link, channel and sampling figures (fits withheld when detail was shed).
    pub figures: Figures,
    /// The self-telemetry.
    pub own: SelfTelemetry,
}

/// What the exporter gets on each pass: the windows processed since the last pass and, once per
/// interval (or on a flush), the interval's end, after which one export request is due.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Windows processed, oldest first.
    pub windows: Vec<Window>,
    /// The interval's end, when it ends on this pass.
    pub end: Option<IntervalEnd>,
}

/// What the process reports, as the [`Reporter`] closes an interval with it.
pub struct Now {
    /// The process-wide counters.
    pub stats: Snapshot,
    /// Window summaries dropped from the full inbox so far.
    pub windows_dropped: u64,
    /// See [`SelfTelemetry::kernel_ch_duty`].
    pub kernel_ch_duty: Option<f64>,
    /// Every communicator slot, in slot order.
    pub comms: Vec<CommState>,
    /// See [`SelfTelemetry::config_problems`].
    pub config_problems: &'static [Problem],
}

/// The interval being collected and what the last report said. Called on: the telemetry thread.
pub struct Reporter {
    interval: Interval,
    every: Duration,
    next: Instant,
    /// A window of the interval has operations whose steps were not recorded (detail shed).
    bare: bool,
    /// The process-wide counters and inbox drops last reported.
    stats: Snapshot,
    windows_dropped: u64,
    problems_reported: bool,
    /// Per communicator slot, what was last reported there.
    slots: Vec<Option<Last>>,
}

/// What was last reported of a communicator slot.
struct Last {
    generation: u16,
    meta: CommMeta,
    counts: DropCounts,
    episodes: u64,
}

impl Reporter {
    /// An empty interval of `config`'s length, ending an interval after `now`.
    pub fn new(config: &Config, now: Instant) -> Reporter {
        Reporter {
            interval: Interval::new(config.regression_mode),
            every: config.interval,
            next: now + config.interval,
            bare: false,
            stats: Snapshot::default(),
            windows_dropped: 0,
            problems_reported: false,
            slots: Vec::new(),
        }
    }

    /// Whether the interval has ended at `now`.
    pub fn due(&self, now: Instant) -> bool {
        now >= self.next
    }

    /// Adds processed windows to the interval: each collective's split, in enqueue order, then
    /// its links and channels.
    pub fn add(&mut self, summaries: impl IntoIterator<Item = WindowSummary>) -> Vec<Window> {
        summaries
            .into_iter()
            .map(|summary| {
                let splits = self.interval.split(&summary);
                self.interval.add(&summary);
                self.bare |= summary.stats.bare_ops > 0;
                Window { summary, splits }
            })
            .collect()
    }

    /// Ends the interval at `now` with what the process reports: the figures, over a shed
    /// interval when a window had bare operations or a communicator's detail counter moved, and
    /// what every counter gained since the last report.
    pub fn close(&mut self, now: Instant, process: Now) -> IntervalEnd {
        self.next = now + self.every;
        let comms: Vec<CommReport> = process.comms.into_iter().map(|state| self.comm(state)).collect();
        let shed = std::mem::take(&mut self.bare) || comms.iter().any(|c| c.dropped.shed > 0);
        let own = SelfTelemetry {
            stats: process.stats.since(&std::mem::replace(&mut self.stats, process.stats)),
            windows_dropped: process.windows_dropped.saturating_sub(self.windows_dropped),
            kernel_ch_duty: process.kernel_ch_duty,
            live: comms.iter().any(|c| c.state.live),
            comms,
            config_problems: process.config_problems,
            first_problems: !std::mem::replace(&mut self.problems_reported, true),
        };
        self.windows_dropped = process.windows_dropped;
        IntervalEnd {
            figures: self.interval.close(shed),
            own,
        }
    }

    /// `state`'s slot in the report: what its drop counters gained since they were last reported
    /// (all of them for a communicator new in its slot, or whose counters went back: a slot's
    /// counters restart at 0 when a communicator registers there), whether they are reported, and
    /// the hang episodes that started since (all of them for a new generation).
    fn comm(&mut self, state: CommState) -> CommReport {
        if self.slots.len() <= state.slot {
            self.slots.resize_with(state.slot + 1, || None);
        }
        let entry = &mut self.slots[state.slot];
        let generation = entry.as_ref().filter(|l| l.generation == state.generation);
        let episodes = state.progress.episodes - generation.map_or(0, |l| l.episodes.min(state.progress.episodes));
        let known = generation.filter(|l| l.meta == state.meta);
        let now = state.counts;
        let counts = known.map(|l| l.counts);
        let grew = |last: &DropCounts| {
            last.full <= now.full && last.late <= now.late && last.unpublished <= now.unpublished && last.shed <= now.shed
        };
        let last = counts.filter(grew).unwrap_or_default();
        let dropped = DropCounts {
            full: now.full - last.full,
            late: now.late - last.late,
            unpublished: now.unpublished - last.unpublished,
            shed: now.shed - last.shed,
        };
        *entry = Some(Last {
            generation: state.generation,
            meta: state.meta.clone(),
            counts: now,
            episodes: state.progress.episodes,
        });
        let counted = counts.is_none() || state.live || dropped != DropCounts::default();
        CommReport {
            state,
            dropped,
            episodes,
            counted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::interval::SHED;
    use crate::aggregate::{LinkGroup, WindowStats};
    use crate::aggregate::queue::Queue;

    fn meta() -> CommMeta {
        CommMeta {
            hash: 0xABC,
            name: "report".into(),
            rank: 0,
            nranks: 2,
            nnodes: 1,
            gpu: Default::default(),
        }
    }

    /// A window with one link of three idle transfers of three sizes (a fit), `bare` operations.
    fn window(bare: u64) -> WindowSummary {
        let mut queue = Queue::default();
        for (bytes, secs) in [(1024, 2e-5), (2048, 3e-5), (4096, 5e-5)] {
            queue.idle.push(bytes, secs);
        }
        let link = LinkGroup {
            rank: 0,
            peer: 1,
            bytes: 7168,
            transfers: 3,
            queue,
        };
        let mut s = WindowSummary::counted_only(meta(), Vec::new());
        s.links = vec![link];
        s.stats = WindowStats {
            bare_ops: bare,
            ..WindowStats::default()
        };
        s
    }

    fn state(counts: DropCounts, episodes: u64, live: bool) -> CommState {
        CommState {
            slot: 0,
            generation: 1,
            meta: meta(),
            counts,
            live,
            progress: CommProgress {
                episodes,
                ..CommProgress::default()
            },
        }
    }

    fn now(comms: Vec<CommState>) -> Now {
        Now {
            stats: Snapshot::default(),
            windows_dropped: 0,
            kernel_ch_duty: None,
            comms,
            config_problems: &[],
        }
    }

    /// Whether the interval's one link has its latency withheld as shed.
    fn shed(end: &IntervalEnd) -> bool {
        end.figures.links[0].fit.missing == Some(SHED)
    }

    #[test]
    fn an_interval_is_shed_once_by_bare_operations_or_a_moving_detail_counter() {
        let t0 = Instant::now();
        let mut r = Reporter::new(&Config::default(), t0);
        assert!(!r.due(t0) && r.due(t0 + Config::default().interval));
        r.add([window(1)]);
        assert!(shed(&r.close(t0, now(vec![state(DropCounts::default(), 0, true)]))));
        r.add([window(0)]);
        assert!(!shed(&r.close(t0, now(vec![state(DropCounts::default(), 0, true)]))));
        let detail = DropCounts {
            shed: 5,
            ..DropCounts::default()
        };
        r.add([window(0)]);
        assert!(shed(&r.close(t0, now(vec![state(detail, 0, true)]))), "the counter moved");
        r.add([window(0)]);
        assert!(!shed(&r.close(t0, now(vec![state(detail, 0, true)]))), "it stands still");
    }

    #[test]
    fn counters_are_reported_as_what_they_gained() {
        let t0 = Instant::now();
        let mut r = Reporter::new(&Config::default(), t0);
        let full = |full| DropCounts {
            full,
            ..DropCounts::default()
        };
        let first = r.close(t0, now(vec![state(full(3), 2, true)]));
        assert_eq!((first.own.comms[0].dropped, first.own.comms[0].episodes), (full(3), 2));
        let next = r.close(t0, now(vec![state(full(5), 3, true)]));
        assert_eq!((next.own.comms[0].dropped, next.own.comms[0].episodes), (full(2), 1));
        assert!(next.own.live && next.own.comms[0].counted);
        let ended = r.close(t0, now(vec![state(full(5), 3, false)]));
        assert!(!ended.own.comms[0].counted && !ended.own.live, "finalized: only while it moves");
        let moved = r.close(t0, now(vec![state(full(6), 3, false)]));
        assert!(moved.own.comms[0].counted);
        let reset = r.close(t0, now(vec![state(full(1), 0, false)]));
        assert_eq!(reset.own.comms[0].dropped, full(1), "counters went back: a new communicator");
        assert!(reset.own.comms[0].counted);
    }
}

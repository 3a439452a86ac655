//! Which transfers that opened a busy period of their link ([`super::queue`]) were idle: nothing
//! else this process sent was in flight at their SendWait, on any link, channel or communicator,
//! so no earlier transfer stood ahead of them in the NIC's queue. The interval collects the busy
//! periods of every window it merges and keeps the previous interval's, so a transfer behind one
//! in another window, on another communicator's or peer's link, or just before the interval
//! began is not taken as idle. Traffic the process does not see (other processes on the NIC,
//! windows processed after the interval closed) and transfers handed over after it that share
//! the wire with it (a NIC serving several queues at once) can still lengthen an idle transfer:
//! a latency from idle transfers is an upper bound. A busy period no other one overlapped is
//! **alone**: its queued transfers give the wire's own rate, which the idle transfers' latency is
//! computed at (one mixing other links' transfers queued on the same NIC would be too low).
//!
//! Pure; called on the telemetry thread only.
#![forbid(unsafe_code)]

use super::queue::Span;

/// Busy periods kept per interval at most (16 bytes each); past it the interval and the next
/// one take no transfer as idle.
pub const MAX_SPANS: usize = 1 << 16;

/// The busy periods of the process's links, this interval and the one before.
#[derive(Debug, Default)]
pub struct Timeline {
    spans: Vec<Span>,
    earlier: Vec<Span>,
    /// More periods came this interval than kept.
    overflow: bool,
    /// The same, the interval before.
    overflowed: bool,
}

impl Timeline {
    /// Adds one window's busy periods of a link; whether they were kept (else the interval
    /// checks nothing, and its caller need not keep what would be checked).
    pub fn add(&mut self, spans: impl ExactSizeIterator<Item = Span>) -> bool {
        self.overflow |= self.spans.len() + spans.len() > MAX_SPANS;
        if !self.overflow {
            self.spans.extend(spans);
        }
        !self.overflow
    }

    /// Ends the interval: the check of its lone transfers; its periods are kept for the next one.
    pub fn close(&mut self) -> Check {
        let mut all = std::mem::replace(&mut self.earlier, std::mem::take(&mut self.spans));
        all.extend_from_slice(&self.earlier);
        let trusted = !self.overflow && !self.overflowed;
        self.overflowed = std::mem::take(&mut self.overflow);
        if !trusted {
            return Check {
                merged: Vec::new(),
                all: Vec::new(),
            };
        }
        all.sort_unstable();
        // Overlapping periods merged.
        let mut merged: Vec<Span> = Vec::new();
        for &(from, to) in &all {
            match merged.last_mut() {
                Some((_, end)) if from < *end => *end = (*end).max(to),
                _ => merged.push((from, to)),
            }
        }
        Check { merged, all }
    }
}

/// The busy periods of an interval, sorted, and merged where they overlap.
#[derive(Debug)]
pub struct Check {
    merged: Vec<Span>,
    all: Vec<Span>,
}

impl Check {
    /// Whether a transfer handed over at `sent` that opened its link's busy period found no
    /// other transfer of the process in flight: its period opens a merged one, and no other
    /// period opened at the same tick.
    pub fn idle(&self, sent: u64) -> bool {
        let opens = |spans: &[Span]| spans.partition_point(|s| s.0 < sent)..spans.partition_point(|s| s.0 <= sent);
        let (merged, all) = (opens(&self.merged), opens(&self.all));
        merged.len() == 1 && all.len() == 1
    }

    /// Whether no other busy period of the process overlapped the period `span`.
    pub fn alone(&self, span: Span) -> bool {
        let started = |spans: &[Span], to: u64| spans.partition_point(|s| s.0 < to);
        let before = |spans: &[Span]| spans.partition_point(|s| s.0 < span.0);
        let merged = self.merged.get(started(&self.merged, span.0.saturating_add(1)).wrapping_sub(1));
        merged == Some(&span) && started(&self.all, span.1.max(span.0 + 1)) - before(&self.all) == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_opener_is_idle_only_with_nothing_in_flight_anywhere() {
        let mut t = Timeline::default();
        // Link A: periods at 10..20 and 50..60; link B (another communicator): busy 40..90;
        // link C: 20..30, right after A's first period, and 100..110, opening with D's.
        t.add([(10, 20), (50, 60)].into_iter());
        t.add([(40, 90)].into_iter());
        t.add([(20, 30), (100, 110)].into_iter());
        t.add([(100, 120)].into_iter());
        let c = t.close();
        assert!(c.idle(10) && c.idle(20) && c.idle(40));
        assert!(!c.idle(50), "B was in flight");
        assert!(!c.idle(100), "two opened at once");
        assert!(!c.idle(5), "a period nobody added");
        assert!(c.alone((10, 20)) && c.alone((20, 30)));
        assert!(!c.alone((50, 60)) && !c.alone((40, 90)) && !c.alone((100, 110)));
        assert!(!c.alone((0, 5)));
    }

    #[test]
    fn the_previous_interval_counts_and_overflow_trusts_nothing() {
        let mut t = Timeline::default();
        t.add([(0, 100)].into_iter());
        t.close();
        t.add([(90, 95), (200, 210)].into_iter());
        let c = t.close();
        assert!(!c.idle(90), "behind a transfer of the interval before");
        assert!(c.idle(200));
        t.add(vec![(1, 2); MAX_SPANS + 1].into_iter());
        t.add([(300, 310)].into_iter());
        assert!(!t.close().idle(300));
        t.add([(400, 410)].into_iter());
        assert!(!t.close().idle(400), "the interval after an overflow");
        t.add([(500, 510)].into_iter());
        assert!(t.close().idle(500));
    }
}

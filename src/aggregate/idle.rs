//! Which transfers that opened a busy period of their link ([`super::queue`]) were idle: nothing
//! else this process sent was in flight at their SendWait, on any link, channel or communicator,
//! so no earlier transfer stood ahead of them in the NIC's queue. The interval collects the busy
//! periods of every window it merges and keeps the previous interval's, so a transfer behind one
//! in another window, on another communicator's or peer's link, or just before the interval
//! began is not taken as idle. Traffic the process does not see (other processes on the NIC,
//! windows processed after the interval closed) and transfers handed over after it that share
//! the wire with it (a NIC serving several queues at once) can still lengthen an idle transfer:
//! a latency from idle transfers is an upper bound. A queued transfer in whose gap (the previous
//! completion of its link → its own) no other transfer of the process completed is **clean**:
//! its bytes alone went over the wire in the gap, so the clean ones give the wire's own rate, which
//! the idle transfers' latency is computed at (a rate mixing in other links' transfers queued on
//! the same NIC would be too low).
//!
//! Pure; called on the telemetry thread only.
#![forbid(unsafe_code)]

use super::queue::Span;

/// Busy periods and stops kept per interval at most (16 and 8 bytes each); past it the interval
/// and the next one take no transfer as idle and no gap as clean.
pub const MAX_SPANS: usize = 1 << 16;

/// The busy periods of the process's links, this interval and the one before.
#[derive(Debug, Default)]
pub struct Timeline {
    spans: Vec<Span>,
    earlier: Vec<Span>,
    stops: Vec<u64>,
    earlier_stops: Vec<u64>,
    /// More periods came this interval than kept.
    overflow: bool,
    /// The same, the interval before.
    overflowed: bool,
}

impl Timeline {
    /// Adds one window's busy periods and stops of a link; whether they were kept (else the
    /// interval checks nothing, and its caller need not keep what would be checked).
    pub fn add(&mut self, spans: &[Span], stops: &[u64]) -> bool {
        self.overflow |= self.spans.len() + spans.len() > MAX_SPANS || self.stops.len() + stops.len() > MAX_SPANS;
        if !self.overflow {
            self.spans.extend_from_slice(spans);
            self.stops.extend_from_slice(stops);
        }
        !self.overflow
    }

    /// Ends the interval: the check of its lone transfers; its periods are kept for the next one.
    pub fn close(&mut self) -> Check {
        let mut all = std::mem::replace(&mut self.earlier, std::mem::take(&mut self.spans));
        all.extend_from_slice(&self.earlier);
        let mut stops = std::mem::replace(&mut self.earlier_stops, std::mem::take(&mut self.stops));
        stops.extend_from_slice(&self.earlier_stops);
        let trusted = !self.overflow && !self.overflowed;
        self.overflowed = std::mem::take(&mut self.overflow);
        if !trusted {
            return Check {
                merged: Vec::new(),
                all: Vec::new(),
                stops: Vec::new(),
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
        stops.sort_unstable();
        Check { merged, all, stops }
    }
}

/// The busy periods of an interval, sorted, and merged where they overlap; the stops, sorted.
#[derive(Debug)]
pub struct Check {
    merged: Vec<Span>,
    all: Vec<Span>,
    stops: Vec<u64>,
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

    /// Whether no transfer of the process completed strictly between `after` and `stop`; false
    /// when the stops were not kept.
    pub fn clean(&self, after: u64, stop: u64) -> bool {
        let from = self.stops.partition_point(|&x| x <= after);
        !self.stops.is_empty() && self.stops.get(from).is_none_or(|&x| x >= stop)
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
        t.add(&[(10, 20), (50, 60)], &[]);
        t.add(&[(40, 90)], &[]);
        t.add(&[(20, 30), (100, 110)], &[]);
        t.add(&[(100, 120)], &[]);
        let c = t.close();
        assert!(c.idle(10) && c.idle(20) && c.idle(40));
        assert!(!c.idle(50), "B was in flight");
        assert!(!c.idle(100), "two opened at once");
        assert!(!c.idle(5), "a period nobody added");
    }

    #[test]
    fn a_gap_is_clean_without_another_completion_inside() {
        let mut t = Timeline::default();
        t.add(&[(0, 100)], &[10, 20, 30, 100]);
        t.add(&[(5, 25)], &[25]);
        let c = t.close();
        assert!(c.clean(10, 20) && c.clean(25, 30) && c.clean(30, 100));
        assert!(!c.clean(20, 30), "25 came between");
    }

    #[test]
    fn the_previous_interval_counts_and_overflow_trusts_nothing() {
        let mut t = Timeline::default();
        t.add(&[(0, 100)], &[]);
        t.close();
        t.add(&[(90, 95), (200, 210)], &[]);
        let c = t.close();
        assert!(!c.idle(90), "behind a transfer of the interval before");
        assert!(c.idle(200));
        t.add(&vec![(1, 2); MAX_SPANS + 1], &[]);
        t.add(&[(300, 310)], &[]);
        assert!(!t.close().idle(300));
        t.add(&[(400, 410)], &[]);
        assert!(!t.close().idle(400), "the interval after an overflow");
        t.add(&[(500, 510)], &[]);
        assert!(t.close().idle(500));
    }
}

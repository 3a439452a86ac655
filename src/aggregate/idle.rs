//! Which lone transfers (alone in their link's busy period, [`super::queue`]) were idle: nothing
//! else this process sent was in flight during their SendWait → stop, on any link, channel or
//! communicator. The interval collects the busy periods of every window it merges and keeps the
//! previous interval's, so a transfer whose company was in another window, on another
//! communicator's or peer's link, or just before the interval began is not taken as idle.
//! Traffic the process does not see (other processes on the NIC, windows processed after the
//! interval closed) can still pass unseen: a latency from idle transfers is an upper bound.
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
    /// Adds one window's busy periods of a link.
    pub fn add(&mut self, spans: &[Span]) {
        if self.spans.len() + spans.len() > MAX_SPANS {
            self.overflow = true;
        } else {
            self.spans.extend_from_slice(spans);
        }
    }

    /// Ends the interval: the check of its lone transfers; its periods are kept for the next one.
    pub fn close(&mut self) -> Check {
        let mut all = std::mem::replace(&mut self.earlier, std::mem::take(&mut self.spans));
        all.extend_from_slice(&self.earlier);
        let trusted = !self.overflow && !self.overflowed;
        self.overflowed = std::mem::take(&mut self.overflow);
        if !trusted {
            return Check { groups: Vec::new() };
        }
        all.sort_unstable();
        // Overlapping periods merged, with how many went into each.
        let mut groups: Vec<(Span, u32)> = Vec::new();
        for (from, to) in all {
            match groups.last_mut() {
                Some(((_, end), n)) if from < *end => {
                    *end = (*end).max(to);
                    *n += 1;
                }
                _ => groups.push(((from, to), 1)),
            }
        }
        Check { groups }
    }
}

/// The merged busy periods of an interval.
#[derive(Debug)]
pub struct Check {
    groups: Vec<(Span, u32)>,
}

impl Check {
    /// Whether the lone transfer of `span` overlapped no other known transfer of the process.
    pub fn idle(&self, span: Span) -> bool {
        let after = self.groups.partition_point(|g| g.0.0 <= span.0);
        after
            .checked_sub(1)
            .and_then(|i| self.groups.get(i))
            .is_some_and(|&(group, n)| n == 1 && group == span)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_transfer_is_idle_only_without_company_anywhere() {
        let mut t = Timeline::default();
        // Link A: lone at 10..20 and 50..60; link B (another communicator): busy 55..90.
        t.add(&[(10, 20), (50, 60)]);
        t.add(&[(55, 90)]);
        t.add(&[(20, 30)]); // touching is no overlap
        let c = t.close();
        assert!(c.idle((10, 20)) && c.idle((20, 30)));
        assert!(!c.idle((50, 60)));
        assert!(!c.idle((0, 5)), "a span nobody added");
    }

    #[test]
    fn the_previous_interval_counts_and_overflow_trusts_nothing() {
        let mut t = Timeline::default();
        t.add(&[(0, 100)]);
        t.close();
        t.add(&[(90, 95), (200, 210)]);
        let c = t.close();
        assert!(!c.idle((90, 95)), "in flight with a transfer of the interval before");
        assert!(c.idle((200, 210)));
        t.add(&vec![(1, 2); MAX_SPANS + 1]);
        t.add(&[(300, 310)]);
        assert!(!t.close().idle((300, 310)));
        t.add(&[(400, 410)]);
        assert!(!t.close().idle((400, 410)), "the interval after an overflow");
        t.add(&[(500, 510)]);
        assert!(t.close().idle((500, 510)));
    }
}

//! Which transfers that opened a busy period of their link ([`super::queue`]) were idle: nothing
//! else this process sent through the same NIC was in flight at their SendWait, on any link,
//! channel or communicator, so no earlier transfer stood ahead of them in the NIC's queue (one
//! [`Timeline`] per NIC: `super::interval`). The interval collects the busy
//! periods of every window it merges and keeps the previous interval's, so a transfer behind one
//! in another window, on another communicator's or peer's link, or just before the interval
//! began is not taken as idle. Traffic the process does not see (other processes on the NIC,
//! windows processed after the interval closed) and transfers handed over after it that share
//! the wire with it (a NIC serving several queues at once) can still lengthen an idle transfer:
//! a latency from idle transfers is an upper bound. A gap of queued transfers (the link's
//! previous observation → theirs, [`super::queue`]) near which no other transfer on the NIC
//! completed is **clean**: its bytes alone went over the wire in the gap, so the clean ones give
//! the wire's own rate: the link's bandwidth, and the rate the idle transfers' latency is computed at (a rate mixing in
//! other links' transfers queued on the same NIC would be too low).
//!
//! Memory stays bounded under any traffic: time is cut into slots of 2^20 clock ticks (about a
//! millisecond) and an interval keeps candidates (openers, gaps) from 1 in 2^k slots only, with
//! every busy period and completion those slots need to be checked; k grows by one after an
//! interval that kept more than half of [`MAX_SPANS`] and shrinks after one that kept less than an
//! eighth. A slot is sampled by a hash of its number, the same for every link and communicator,
//! and the slots of a larger k are among those of a smaller one.
//!
//! Pure; called on the telemetry thread only.
#![forbid(unsafe_code)]

use super::queue::Span;

/// Busy periods and stops kept per interval at most (16 and 8 bytes each); past it the interval
/// and the next one take no transfer as idle and no gap as clean.
pub const MAX_SPANS: usize = 1 << 16;

/// Bits of a clock tick below the slot number.
const SLOT_BITS: u32 = 20;

/// Most slots a busy period is looked through for a sampled one; a longer one is kept.
const SLOT_SCAN: u64 = 64;

/// Most slots a queued transfer's gap may start before the one it ends in to be checked (a
/// degraded link's 512 KiB steps take milliseconds on the wire).
const GAP_SLOTS: u64 = 8;

/// The largest k (1 in 2^k slots sampled).
const MAX_THIN: u32 = 24;

fn slot(tick: u64) -> u64 {
    tick >> SLOT_BITS
}

/// Whether slot `slot` is one of the 1 in 2^`thin` sampled.
fn sampled(slot: u64, thin: u32) -> bool {
    thin == 0 || slot.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - thin) == 0
}

/// The busy periods and completions of one NIC's links in the sampled slots, this interval
/// and the one before.
#[derive(Debug, Default)]
pub struct Timeline {
    spans: Vec<Span>,
    earlier: Vec<Span>,
    stops: Vec<u64>,
    earlier_stops: Vec<u64>,
    /// 1 in 2^`thin` slots sampled this interval; `earlier_thin` the interval before.
    thin: u32,
    earlier_thin: u32,
    /// More came this interval than kept.
    overflow: bool,
    /// The same, the interval before.
    overflowed: bool,
}

impl Timeline {
    /// Adds one window's busy periods and stops of a link (those its sampled slots need);
    /// whether they were kept (else the interval checks nothing, and its caller need not keep
    /// candidates).
    pub fn add(&mut self, spans: &[Span], stops: &[u64]) -> bool {
        let thin = self.thin;
        let needed = |&(from, to): &Span| {
            let (a, b) = (slot(from), slot(to));
            b - a.min(b) >= SLOT_SCAN || (a..=b.max(a)).any(|s| sampled(s, thin))
        };
        let before = (self.spans.len(), self.stops.len());
        self.spans.extend(spans.iter().filter(|s| needed(s)));
        // A gap ends in a sampled slot and starts at most GAP_SLOTS before.
        let near = |&x: &u64| (0..=GAP_SLOTS).any(|k| sampled(slot(x) + k, thin));
        self.stops.extend(stops.iter().filter(|x| near(x)));
        if self.spans.len() > MAX_SPANS || self.stops.len() > MAX_SPANS {
            self.overflow = true;
        }
        if self.overflow {
            self.spans.truncate(before.0);
            self.stops.truncate(before.1);
        }
        !self.overflow
    }

    /// Whether a candidate from `from` to `to` (an opener: its SendWait twice; a gap: the
    /// previous completion and its stop) is in a slot both this interval and the one before
    /// sampled, with `from` in that slot or at most [`GAP_SLOTS`] before.
    pub fn candidate(&self, from: u64, to: u64) -> bool {
        sampled(slot(to), self.thin.max(self.earlier_thin)) && slot(from) + GAP_SLOTS >= slot(to)
    }

    /// Ends the interval: the check of its candidates; its periods and stops are kept for the
    /// next one's.
    pub fn close(&mut self) -> Check {
        let mut all = std::mem::replace(&mut self.earlier, std::mem::take(&mut self.spans));
        all.extend_from_slice(&self.earlier);
        let mut stops = std::mem::replace(&mut self.earlier_stops, std::mem::take(&mut self.stops));
        stops.extend_from_slice(&self.earlier_stops);
        let trusted = !self.overflow && !self.overflowed;
        let kept = self.earlier.len().max(self.earlier_stops.len());
        self.earlier_thin = self.thin;
        if self.overflow || kept > MAX_SPANS / 2 {
            self.thin = (self.thin + 1).min(MAX_THIN);
        } else if kept < MAX_SPANS / 8 {
            self.thin = self.thin.saturating_sub(1);
        }
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
    /// other transfer on the NIC in flight: its period opens a merged one, and no other
    /// period opened at the same tick.
    pub fn idle(&self, sent: u64) -> bool {
        let opens = |spans: &[Span]| spans.partition_point(|s| s.0 < sent)..spans.partition_point(|s| s.0 <= sent);
        let (merged, all) = (opens(&self.merged), opens(&self.all));
        merged.len() == 1 && all.len() == 1
    }

    /// Whether the transfers on the NIC that completed in `around` (both ends included) are
    /// the `own` of the gap's link, no other; false when the stops were not kept.
    pub fn clean(&self, (from, to): Span, own: u32) -> bool {
        let n = self.stops.partition_point(|&x| x <= to) - self.stops.partition_point(|&x| x < from);
        !self.stops.is_empty() && n == own as usize
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

    /// Thinned out, an interval keeps what its sampled slots need and the checks there stay
    /// exact; the kept slots of a larger k are among those of a smaller one.
    #[test]
    fn sampled_slots_are_checked_exactly() {
        let mut t = Timeline {
            thin: 3,
            earlier_thin: 3,
            ..Timeline::default()
        };
        let at = |s: u64| s << SLOT_BITS;
        let yes = (GAP_SLOTS + 2..256).find(|&s| sampled(s, 3) && !sampled(s - 1, 3)).unwrap();
        let no = yes - 1;
        assert!((0..4096).filter(|&s| sampled(s, 4)).all(|s| sampled(s, 3)));
        let n = (0..4096).filter(|&s| sampled(s, 3)).count();
        assert!((400..624).contains(&n), "{n} of 4096 slots at 1 in 8");
        t.add(&[(at(yes), at(yes) + 10), (at(no), at(no) + 10), (at(no), at(yes) + 5)], &[at(yes) + 2, at(no)]);
        assert_eq!((t.spans.len(), t.stops.len()), (2, 2), "all but the period of slot `no` alone");
        assert!(t.candidate(at(yes), at(yes)) && !t.candidate(at(no), at(no)));
        assert!(t.candidate(at(yes) - at(GAP_SLOTS), at(yes)), "a gap from GAP_SLOTS back");
        assert!(!t.candidate(at(yes) - at(GAP_SLOTS + 1), at(yes)), "and one from further");
        let c = t.close();
        assert!(!c.idle(at(yes)), "a period from an unsampled slot was in flight");
        assert!(!c.clean((at(yes), at(yes) + 5), 0), "a completion in between");
    }

    #[test]
    fn a_gap_is_clean_with_its_own_completions_only_around_it() {
        let mut t = Timeline::default();
        t.add(&[(0, 100)], &[10, 20, 30, 100]);
        t.add(&[(5, 25)], &[25]);
        let c = t.close();
        assert!(c.clean((10, 20), 2) && c.clean((26, 30), 1) && c.clean((30, 100), 2));
        assert!(!c.clean((20, 30), 2), "25 came between");
        assert!(!c.clean((10, 25), 2), "another link's 25 at the widened edge");
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
        assert_eq!(t.thin, 1, "sampling thins out after an overflow");
        t.add(&[(400, 410)], &[]);
        assert!(!t.close().idle(400), "the interval after an overflow");
        assert_eq!(t.thin, 0, "and back when little came");
    }
}

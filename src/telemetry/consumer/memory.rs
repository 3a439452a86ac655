//! What a communicator's consumer keeps in memory between windows, and gives back: the scratch a
//! thread reads sealed windows into (reused, capped), the pages a processed window keeps for its
//! next cycle, and the release of everything an idle communicator holds.
//! Called on: the telemetry thread, and a thread running `finalize` (its own scratch).
#![forbid(unsafe_code)]

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{Locked, NONE, Route, Slot, WINDOWS};
use crate::aggregate::WindowSummary;
use crate::aggregate::link;
use crate::buffer::window::{WindowState, keep_within};
use crate::record::Record;
use crate::record::handle::LANES;

/// What reading a sealed window takes on the heap (its records, then the link pass's per-slot
/// scratch), kept by the thread that processes windows from one window to the next.
#[derive(Default)]
pub(super) struct Scratch {
    pub(super) records: Vec<Record>,
    pub(super) link: link::Scratch,
}

impl Scratch {
    /// Gives back the capacity past `records` records (what a window bigger than usual left).
    pub(super) fn cap(&mut self, records: usize) {
        self.records.clear();
        self.records.shrink_to(records);
        self.link.cap(records);
    }
}

thread_local! {
    /// The telemetry thread's scratch (a thread running `finalize` empties its own after).
    pub(super) static SCRATCH: RefCell<Scratch> = RefCell::default();
}

/// Windows' worth of records (at the count trigger) a thread's [`Scratch`] keeps allocated.
pub(super) const SCRATCH_WINDOWS: usize = 2;

/// Frees the scratch this thread reads windows into. Called on: the thread of a `finalize` or an
/// exit drain, after it; the telemetry thread, once every communicator is idle.
pub fn release_scratch() {
    SCRATCH.with_borrow_mut(|s| s.cap(0));
}

impl Slot<'_> {
    /// Whether the communicator is not live, or idle with what it held given back.
    /// Called on: the telemetry thread.
    pub fn is_idle(&self) -> bool {
        !self.comm.is_live() || self.state.lock().released
    }

    /// Per lane, the slots whose pages a window processed with `claimed` keeps for its next
    /// cycle: about the count trigger's worth in all.
    pub(super) fn keep(&self, claimed: [u32; LANES]) -> [u32; LANES] {
        keep_within(claimed, u32::try_from(self.comm.count_trigger).unwrap_or(u32::MAX))
    }

    /// Once the current window has claimed nothing and every other window was processed for an
    /// interval, gives back what the communicator holds, once per idle spell: the pages of every
    /// window but the current one (the standby disarmed first: once the route names no standby no
    /// producer can switch to it, and no child goes to a window without a claim), then, by a
    /// switch to such a released window (as a trigger makes), the pages the current window kept
    /// from its last cycle, and the spare capacity of the table of open operations (which
    /// `poll_loaded` gives back again while the operations it still holds leave). Returns the
    /// summary of a window a producer raced this into.
    pub(super) fn release_idle(&self, c: &mut Locked<'_>, secs_per_tick: f64, now: Instant) -> Vec<WindowSummary> {
        let cur = c.current;
        let settled = (0..WINDOWS)
            .all(|i| i == cur || matches!(self.comm.windows[i].state(), WindowState::Ready | WindowState::Filling));
        if self.comm.current_window() != cur || self.comm.windows[cur].claimed() > 0 || !settled {
            (c.active, c.released) = (now, false);
            return Vec::new();
        }
        if c.released || now.saturating_duration_since(c.active) < c.interval {
            return Vec::new();
        }
        let seen = self.comm.route.load(Ordering::Acquire);
        // AcqRel: a producer's switch either came first (the exchange fails: not idle after all)
        // or finds no standby.
        let r = Route::unpack(seen);
        let alone = Route {
            standby: NONE,
            standby_level: r.level,
            ..r
        };
        if r.standby != NONE
            && self
                .comm
                .route
                .compare_exchange(seen, alone.pack(), Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return Vec::new();
        }
        c.released = true;
        // The standby, or an orphan of a race: opened, unclaimed.
        let mut raced: Vec<WindowSummary> = (0..WINDOWS)
            .filter(|&i| i != cur)
            .filter_map(|i| self.retire(c, i, secs_per_tick, now))
            .collect();
        c.windows().iter().for_each(|w| w.release());
        c.open.shrink();
        self.arm(c);
        if self.comm.switch_to_standby(cur as u8) {
            self.notice(c, now);
            raced.extend(self.retire(c, cur, secs_per_tick, now));
            self.arm(c);
        }
        raced
    }

    /// Seals window `i` if it is FILLING and not current (after the caller made sure no producer
    /// switches to it): READY with every page released when nothing was claimed, else read as any
    /// window (a producer raced the seal), its summary returned.
    fn retire(&self, c: &mut Locked<'_>, i: usize, secs_per_tick: f64, now: Instant) -> Option<WindowSummary> {
        let w = c.windows()[i];
        if w.state() != WindowState::Filling {
            return None;
        }
        let n = w.seal()?;
        if n == [0; LANES] {
            if w.reset([0; LANES]) {
                w.release();
            }
            return None;
        }
        Some(self.read(c, i, n, secs_per_tick, now))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::*;
    use super::*;
    use crate::record::handle::CommId;
    use crate::aggregate::OpenOps;

    #[test]
    fn scratch_gives_back_what_a_big_window_left() {
        let filler = Record {
            id: 0,
            ts: 0,
            body: Body::Stop,
        };
        let records = vec![filler; 10_000];
        let sealed = Sealed {
            records: &records,
            lanes: Lanes::single(records.len()),
            id: WindowId {
                comm: CommId { slot: 0, generation: 1 },
                window: 0,
                epoch: 1,
            },
            forced: false,
            lost_children: false,
        };
        let at = Frontier {
            now: Instant::now(),
            filling: 1,
            settled: 1,
            flush: false,
            lost_held: false,
            drops: 0,
        };
        let mut s = Scratch::default();
        s.records.extend_from_slice(&records);
        let meta = Consumer::new(&Config::default()).meta;
        summarize_in(&mut s.link, sealed, &meta, 1.0, &mut OpenOps::default(), at);
        assert!(s.link.capacity() >= records.len());
        s.cap(100);
        assert!(s.records.capacity() < records.len() && s.link.capacity() < records.len());
        s.cap(0);
        assert_eq!((s.records.capacity(), s.link.capacity()), (0, 0));
    }
}

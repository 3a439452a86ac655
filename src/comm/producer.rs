//! The producer side of a communicator: routing each record to a window, lock-free and
//! allocation-free. Every record goes to its event kind's lane ([`Kind::lane`]) of the chosen
//! window. New events go to the current FILLING window up to [`super::ROOT_SHARE`] of their
//! lane's capacity; the one that fills its lane to the count trigger switches to the armed
//! standby window (two atomics, once per window), or, with none armed, raises the window's shed
//! level (escalation); children go to their parent's window while it takes records, else to the
//! current one; states and stops go to their event's window.
//! Called on: NCCL's user, proxy and profiler threads.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;

use super::{Comm, LOST, NONE, Route, forced, shed};
use crate::buffer::window::{Claim, Entry, MakeId, WindowState};
use crate::record::Body;
use crate::record::handle::{CommId, EPOCH_MASK, Handle, Kind};
use crate::stats::STATS;

/// Starts in a lane between two checks of the whole window against the count trigger.
const TRIGGER_STRIDE: u64 = 64;

impl Comm {
    /// Records the start of a new event of `kind` and returns its handle; `None` (counted) when
    /// no window has space. A child goes to the window of `parent` (one of our handles) while
    /// that window still takes records; otherwise, and for roots, to the current window.
    /// Called on: NCCL user and proxy threads; lock-free, allocation-free. Always inlined, so
    /// that each caller's body and lane are known when the record is put in its lane's form.
    #[inline(always)]
    pub fn start(&self, id: CommId, kind: Kind, parent: Option<Handle>, ts: u64, body: Body) -> Option<u64> {
        let Some(entry) = Entry::new(kind.lane(), ts, body) else {
            return self.dropped_start(id, parent);
        };
        // A child goes to its parent's window; when that is full or sealed, to the current one
        // (the consumer's table of open operations links it). A parent of an earlier
        // communicator in this slot is stale (counted), not ours.
        if let Some(p) = parent.filter(|p| p.comm_slot() == id.slot) {
            if !self.epoch_matches(p) {
                if self.stale(p.window(), p.epoch()) {
                    return None;
                }
            } else if let Some((h, index)) = self.push_start(id, kind, p.window(), None, entry) {
                // Children fill the proxy and kernel lanes: they switch windows too, or raise the
                // level when no standby is armed (nothing happens unless the parent's window is
                // current), so that the steps of the operations that follow are shed before
                // their lane fills.
                if self.reached_trigger(p.window(), index) && !self.switch_to_standby(p.window()) {
                    self.escalate(p.window());
                }
                return Some(h);
            }
        }
        self.start_current(id, kind, self.route_now(), entry)
            .or_else(|| self.dropped_start(id, parent))
    }

    /// Records the start of a new operation of `kind` (Coll, P2p) in the current window of
    /// `route` (as [`Comm::route_now`] read it); `None` when no window has space, not counted
    /// as a drop: the caller counts the operation without its record instead.
    /// Called on: NCCL user threads; lock-free, allocation-free.
    #[inline(always)]
    pub fn start_at(&self, id: CommId, kind: Kind, route: Route, ts: u64, body: Body) -> Option<u64> {
        let Some(entry) = Entry::new(kind.lane(), ts, body) else {
            return self.dropped_start(id, None);
        };
        self.start_current(id, kind, route, entry)
    }

    /// The current window and its shed level, in one load. Called on: NCCL's threads.
    #[inline(always)]
    pub fn route_now(&self) -> Route {
        // Relaxed: a push synchronises with the window's opening through its cursor.
        Route::unpack(self.route.load(Ordering::Relaxed))
    }

    /// The number of the collective starting now on this communicator (0, 1, …).
    #[inline(always)]
    pub fn next_coll(&self) -> u64 {
        self.ops.colls.fetch_add(1, Ordering::Relaxed)
    }

    /// The number of the P2P send starting now on this communicator (0, 1, …).
    #[inline(always)]
    pub fn next_p2p(&self) -> u64 {
        self.ops.p2ps.fetch_add(1, Ordering::Relaxed)
    }

    /// The communicator's hash as learned (from `init`, or its first Coll/P2p on v1–v3): the
    /// seed of its sample.
    #[inline(always)]
    pub fn learned_hash(&self) -> u64 {
        self.learned_hash.load(Ordering::Relaxed)
    }

    /// Ranks in the communicator; 0 when unknown (ABI v1–v3).
    #[inline(always)]
    pub fn nranks(&self) -> i32 {
        self.nranks.load(Ordering::Relaxed)
    }

    /// Puts a new event's start in the current window of `route`, up to the root limit; the
    /// one that brings it to the count trigger switches to the standby, or, with none armed,
    /// raises its level ([`Comm::escalate`]). `None` (not counted) when no window has room.
    #[inline(always)]
    fn start_current(&self, id: CommId, kind: Kind, route: Route, entry: Entry) -> Option<u64> {
        let cur = route.current;
        match self.push_start(id, kind, cur, Some(self.root_limit), entry) {
            Some((h, index)) => {
                if self.reached_trigger(cur, index) && !self.switch_to_standby(cur) {
                    self.escalate(cur);
                }
                Some(h)
            }
            None if self.switch_to_standby(cur) => {
                let cur = self.route_now().current;
                self.push_start(id, kind, cur, Some(self.root_limit), entry)
                    .map(|(h, _)| h)
            }
            None => {
                self.escalate(cur);
                None
            }
        }
    }

    /// Counts a start no window took; a child's parent loses its complete times.
    #[cold]
    fn dropped_start(&self, id: CommId, parent: Option<Handle>) -> Option<u64> {
        self.drops.full.fetch_add(1, Ordering::Relaxed);
        if let Some(p) = parent.filter(|p| p.comm_slot() == id.slot) {
            self.lost_child(p);
        }
        None
    }

    /// Whether the start just claimed at `index` of its lane brings window `w` to the count
    /// trigger: its lane alone, or all lanes together, which every [`TRIGGER_STRIDE`]th claim of
    /// a lane checks (the other lanes' cursors are other threads' cache lines).
    #[inline(always)]
    fn reached_trigger(&self, w: u8, index: u32) -> bool {
        let n = u64::from(index) + 1;
        n >= self.count_trigger
            || n % TRIGGER_STRIDE == 0
                && self
                    .windows
                    .get(usize::from(w))
                    .is_some_and(|w| w.claimed() >= self.count_trigger)
    }

    /// Claims a slot in `kind`'s lane of window `w` for the start of a new event, if that lane
    /// holds fewer than `limit` claims, and writes its record; returns the event's handle and its
    /// index in the lane.
    #[inline(always)]
    fn push_start(&self, id: CommId, kind: Kind, w: u8, limit: Option<u64>, entry: Entry) -> Option<(u64, u32)> {
        let lane = kind.lane();
        let window = self.windows.get(usize::from(w))?;
        if limit.is_some_and(|limit| window.lane_claimed(lane) >= limit) {
            return None;
        }
        let mut handle = 0;
        let claim = window.push(
            lane,
            entry,
            NewHandle {
                comm: id,
                window: w,
                kind,
                out: &mut handle,
            },
        )?;
        Some((handle, claim.index))
    }

    /// Makes the standby window current in place of `cur`, at the standby's level, if `cur`
    /// still is and a standby is armed; returns whether `cur` is no longer current. Called on:
    /// NCCL user and proxy threads (the root that filled the window to the count trigger), the
    /// telemetry thread.
    #[cold]
    pub fn switch_to_standby(&self, cur: u8) -> bool {
        // Every new event past the trigger comes here while no window is armed: a plain load
        // keeps that cheap.
        let mut seen = self.route.load(Ordering::Relaxed);
        loop {
            let r = Route::unpack(seen);
            if r.current != cur {
                return true;
            }
            if r.standby == NONE {
                return false;
            }
            let next = Route::alone(r.standby, forced().unwrap_or(r.standby_level));
            // Acquire: the standby window's opening (Release in `arm`) is visible before any
            // record goes to it. A failure means another thread switched (or the consumer
            // re-armed): look again.
            match self
                .route
                .compare_exchange_weak(seen, next.pack(), Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(actual) => seen = actual,
            }
        }
    }

    /// The current window `cur` reached its count trigger with no standby armed (the consumer
    /// lags): instead of filling toward its lanes' capacity at its level, it sheds more. Its level
    /// becomes the one it started at plus 2 for every further multiple of the count trigger
    /// its lanes hold (each step keeps about a quarter of the records), at most
    /// [`shed::MAX_LEVEL`]; every later start reads it from the route. Called on: NCCL user
    /// and proxy threads, past the trigger.
    #[cold]
    fn escalate(&self, cur: u8) {
        let Some(window) = self.windows.get(usize::from(cur)) else {
            return;
        };
        let multiples = window.claimed() / self.count_trigger.max(1);
        let steps = multiples.saturating_sub(1).min(u64::from(shed::MAX_LEVEL)) as u8;
        let mut seen = self.route.load(Ordering::Relaxed);
        loop {
            let r = Route::unpack(seen);
            let wanted = r.standby_level.saturating_add(2 * steps).min(shed::MAX_LEVEL);
            if r.current != cur || r.standby != NONE || wanted <= r.level {
                return;
            }
            let raised = Route { level: wanted, ..r };
            match self
                .route
                .compare_exchange_weak(seen, raised.pack(), Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(actual) => seen = actual,
            }
        }
    }

    /// A child of `parent` was dropped: its times can no longer be complete. Marks the parent's
    /// window for this epoch, or the consumer's held operations when that window was processed.
    #[cold]
    fn lost_child(&self, parent: Handle) {
        let unprocessed = self.windows.get(usize::from(parent.window())).is_some_and(|w| {
            matches!(w.state(), WindowState::Filling | WindowState::Closing) && self.epoch_matches(parent)
        });
        match self.lost.get(usize::from(parent.window())) {
            Some(lost) if unprocessed => lost.store(LOST | parent.epoch(), Ordering::Relaxed),
            _ => self.lost_held.store(true, Ordering::Relaxed),
        }
    }

    /// Records a state or stop of the event `handle` into its window; counted as late when that
    /// window was already processed, as full when it has no room left.
    /// Called on: NCCL user and proxy threads; lock-free.
    #[inline(always)]
    pub fn append(&self, handle: Handle, ts: u64, body: Body) {
        if !self.epoch_matches(handle) {
            if !self.stale(handle.window(), handle.epoch()) {
                self.drops.late.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        self.write(handle, ts, body);
    }

    /// Whether a handle of window `w` and `epoch`, which that window has left, is an earlier
    /// communicator's (its epoch is older than this communicator's first in that window); counted
    /// as stale if so.
    #[cold]
    fn stale(&self, w: u8, epoch: u32) -> bool {
        let w = usize::from(w);
        let (Some(window), Some(born)) = (self.windows.get(w), self.born.get(w)) else {
            return false;
        };
        let now = window.epoch();
        let age = |epoch: u32| now.wrapping_sub(epoch) & EPOCH_MASK;
        let stale = age(epoch) > age(born.load(Ordering::Relaxed));
        if stale {
            STATS.stale.incr();
        }
        stale
    }

    /// The write behind [`Comm::append`], once the epoch matched. The window can still cycle
    /// before the claim: then the slot of the new cycle gets a filler (the consumer skips it) and
    /// the record is counted late.
    #[inline(always)]
    pub(crate) fn write(&self, handle: Handle, ts: u64, body: Body) {
        let lane = handle.kind().lane();
        let pushed = Entry::new(lane, ts, body).and_then(|entry| {
            let w = self.windows.get(usize::from(handle.window()))?;
            w.push(lane, entry, InEpoch(handle))
        });
        match pushed {
            None => self.drops.full.fetch_add(1, Ordering::Relaxed),
            Some(c) if !InEpoch(handle).holds(c) => self.drops.late.fetch_add(1, Ordering::Relaxed),
            Some(_) => return,
        };
    }

    fn epoch_matches(&self, h: Handle) -> bool {
        self.windows
            .get(usize::from(h.window()))
            .is_some_and(|w| w.epoch() & EPOCH_MASK == h.epoch())
    }
}

/// The handle of a new event of `kind` in `window`, made from its claim and kept in `out`.
struct NewHandle<'a> {
    comm: CommId,
    window: u8,
    kind: Kind,
    out: &'a mut u64,
}

impl MakeId for NewHandle<'_> {
    #[inline(always)]
    fn make_id(self, c: Claim) -> u64 {
        *self.out = Handle::new(self.comm.slot, self.window, c.epoch, self.kind, c.slot).encode();
        *self.out
    }
}

/// A state or stop of the event `handle`: its handle when claimed in the event's epoch, else 0
/// (a filler the consumer skips).
#[derive(Clone, Copy)]
struct InEpoch(Handle);

impl InEpoch {
    /// Whether `c` was claimed in the event's epoch.
    #[inline(always)]
    fn holds(self, c: Claim) -> bool {
        c.epoch & EPOCH_MASK == self.0.epoch()
    }
}

impl MakeId for InEpoch {
    #[inline(always)]
    fn make_id(self, c: Claim) -> u64 {
        if self.holds(c) { self.0.encode() } else { 0 }
    }
}

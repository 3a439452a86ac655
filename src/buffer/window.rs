//! One window: a pre-allocated array of record slots in [`LANES`] lanes, a claim cursor per lane
//! and a per-slot epoch stamp. The application lane (0) holds full records (56-byte slots); the
//! proxy and kernel lanes, nine records in ten, hold them packed ([`Compact`], 32-byte slots, two
//! to a cache line), in an arena of their own.
//!
//! Producers (NCCL's user, proxy and profiler threads) only ever [`Window::push`] into the lane of
//! their event's kind, a record already in that lane's form ([`Entry`]): a `fetch_add` on that
//! lane's cursor claims a slot, the record is written with its handle,
//! and the slot's stamp is set to the window's epoch with `Release`. Each lane's cursor has its
//! own cache line and its slots their own range, so NCCL's threads, each writing mostly its own
//! lane, never write a line another one writes. Everything else belongs to the consumer role (the
//! telemetry thread or `finalize`), which owns every state edge and alone reads records. The role
//! is a type: a window's [`Consumer`] comes only from the [`Held`] lock of the [`Windows`] it is
//! in, stays on the thread holding it and lives no longer than the lock, so consumer operations
//! never run concurrently on one window:
//!
//! | edge                   | owner    | what happens                                              |
//! |------------------------|----------|-----------------------------------------------------------|
//! | READY → FILLING        | consumer | [`Consumer::open`]: cursors 0, claims succeed again        |
//! | FILLING → CLOSING      | consumer | count or time trigger; a newer window takes new roots      |
//! | CLOSING → PROCESSING   | consumer | [`Consumer::seal`]: cursors swapped past capacity, then every claimed slot is awaited |
//! | PROCESSING → READY     | consumer | [`Consumer::reset`], once every slot claimed before the seal is stamped: epoch + 1 (never 0), pages past the used part released |
//!
//! What needs the role: reading a record ([`Consumer::published`]: another consumer's reset and
//! reopen would let a producer rewrite the slot under the read), sealing and resetting (a reset
//! trusting another seal's counts would reuse slots still being written), opening (cursors back
//! to 0) and releasing pages; closing only for one owner per edge. What does not: [`Window::push`]
//! (its `fetch_add` claim makes the slot its own until the stamp, and only a reset that saw the
//! stamp lets the index be claimed again) and the atomic reads (state, epoch, claims, stamps).
//!
//! A READY or PROCESSING window is sealed, so a late producer's claim fails ("full") and is
//! counted by the caller: a slot being read is never overwritten and producers never wait. A
//! producer preempted between its claim and its stamp keeps the window PROCESSING ("draining")
//! until it stamps: the consumer may give up waiting for that record, but never reuses the slot
//! (or bumps the epoch the producer is about to read) under it.
//! Communicators keep their windows for the life of the process (type-stable memory), so even a
//! producer racing a `finalize` writes into mapped memory of the right type.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard};

use super::arena::{Arena, Slot};
use super::sync::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use crate::record::compact::Compact;
use crate::record::handle::LANES;
use crate::record::{Body, Record};

/// Cursor value of a sealed window; claims past it fail without wrapping for 2^62 attempts.
const SEALED: u64 = 1 << 62;

/// Where a window is in its cycle.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowState {
    /// Sealed, reset, waiting to be opened.
    Ready = 0,
    /// Takes new events.
    Filling = 1,
    /// Takes only records of events it already holds; waits for them to finish.
    Closing = 2,
    /// Sealed; the consumer reads it.
    Processing = 3,
}

/// A record in the form of the lane it goes to, its handle set when [`Window::push`] claims its
/// slot: full in the application lane (0), [`Compact`] in the others.
#[derive(Clone, Copy, Debug)]
pub enum Entry {
    /// For lane 0.
    Full(Record),
    /// For lanes 1 and up.
    Packed(Compact),
}

impl Entry {
    /// `body` at `ts` in the form of `lane`'s slots; `None` when that form cannot hold it exactly
    /// ([`Compact::pack`]). Called on: NCCL user and proxy threads.
    #[inline(always)]
    pub fn new(lane: usize, ts: u64, body: Body) -> Option<Entry> {
        let record = Record { id: 0, ts, body };
        if lane == 0 {
            Some(Entry::Full(record))
        } else {
            Compact::pack(&record).map(Entry::Packed)
        }
    }
}

/// Per lane, how many of the `claimed` slots a [`Consumer::reset`] keeps resident for a next
/// cycle expected to claim about `budget` slots over all lanes: each lane's own claims, scaled
/// down in proportion when they add up to more, so that the pages a one-off burst touched go back.
pub fn keep_within(claimed: [u32; LANES], budget: u32) -> [u32; LANES] {
    let total: u64 = claimed.iter().map(|&n| u64::from(n)).sum();
    if total <= u64::from(budget) {
        return claimed;
    }
    // Below `claimed`: the quotient fits.
    claimed.map(|n| (u64::from(n) * u64::from(budget) / total) as u32)
}

/// A slot claimed by [`Window::push`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim {
    /// Index of the slot in the window (lane `l`'s slots start at `l` × [`Window::stride`]).
    pub slot: u32,
    /// Index of the slot in its lane: claims in that lane before this one.
    pub index: u32,
    /// Window epoch the record was published in.
    pub epoch: u32,
}

/// What [`Window::push`] makes a record's handle from, once it has claimed the record's slot. A
/// closure does; a type implementing it with `#[inline(always)]` keeps the hot path inlined
/// where LLVM would leave a closure out of line.
pub trait MakeId {
    /// The handle of the record in `claim`.
    fn make_id(self, claim: Claim) -> u64;
}

impl<F: FnOnce(Claim) -> u64> MakeId for F {
    #[inline(always)]
    fn make_id(self, claim: Claim) -> u64 {
        self(claim)
    }
}

/// A fixed-capacity window of records.
pub struct Window {
    cursors: [CachePadded<AtomicU64>; LANES],
    epoch: AtomicU32,
    state: AtomicU8,
    /// Slots claimed per lane before the last seal (consumer-only).
    sealed: [AtomicU32; LANES],
    /// Slots per lane.
    capacity: u32,
    /// Distance between the first slots of two lanes: the capacity rounded up to 8 slots, so
    /// each lane starts on a cache line of a page-aligned arena.
    stride: u32,
    /// Lane 0's slots.
    app: Arena<Record>,
    /// Lanes 1 and up, one stride each: window slot `s` of those lanes is `s` − stride here.
    packed: Arena<Compact>,
}

/// Window slot `s`: lane 0's in the full arena, the others' in the packed one.
enum At<'a> {
    Full(&'a Slot<Record>),
    Packed(&'a Slot<Compact>),
}

impl At<'_> {
    fn stamp(&self) -> &AtomicU32 {
        match self {
            At::Full(s) => &s.stamp,
            At::Packed(s) => &s.stamp,
        }
    }
}

// SAFETY: slots are written only by the thread that claimed them (unique index from `fetch_add`)
// and read only after their stamp is published (`Release`/`Acquire`), by the one consumer the
// lock of its `Windows` admits (`Consumer` is neither `Send` nor `Sync`); `Record` and `Compact`
// are `Send + Copy`.
unsafe impl Sync for Window {}

/// Windows and the lock of their consumer role, which also guards the consumer's own state `T`.
/// Producers use the windows through `Deref` ([`Window::push`] and the atomic reads); every other
/// operation takes a window's [`Consumer`], which only [`Held`] hands out.
pub struct Windows<T, const N: usize> {
    windows: [Window; N],
    consumer: Mutex<T>,
}

impl<T, const N: usize> Windows<T, N> {
    /// `windows` with the consumer state `consumer`.
    pub fn new(windows: [Window; N], consumer: T) -> Self {
        Windows {
            windows,
            consumer: Mutex::new(consumer),
        }
    }

    /// Takes the consumer lock (waits for it). Called on: consumer.
    pub fn lock(&self) -> Held<'_, T, N> {
        self.held(self.consumer.lock())
    }

    /// Takes the consumer lock if it is free. Called on: consumer.
    pub fn try_lock(&self) -> Option<Held<'_, T, N>> {
        self.consumer.try_lock().map(|state| self.held(state))
    }

    fn held<'a>(&'a self, state: MutexGuard<'a, T>) -> Held<'a, T, N> {
        Held {
            state,
            windows: &self.windows,
            _one_thread: PhantomData,
        }
    }
}

impl<T, const N: usize> Deref for Windows<T, N> {
    type Target = [Window; N];

    fn deref(&self) -> &[Window; N] {
        &self.windows
    }
}

impl<'a, T, const N: usize> IntoIterator for &'a Windows<T, N> {
    type Item = &'a Window;
    type IntoIter = std::slice::Iter<'a, Window>;

    fn into_iter(self) -> Self::IntoIter {
        self.windows.iter()
    }
}

/// The consumer lock of a [`Windows`], held: the consumer's state (through `Deref`) and the
/// consumer role of every window. Neither `Send` nor `Sync`, like the roles it hands out.
pub struct Held<'a, T, const N: usize> {
    state: MutexGuard<'a, T>,
    windows: &'a [Window; N],
    _one_thread: PhantomData<*const ()>,
}

impl<T, const N: usize> Held<'_, T, N> {
    /// The consumer role of every window, for as long as this borrow of the lock.
    pub fn windows(&self) -> [Consumer<'_>; N] {
        self.windows.each_ref().map(Consumer::new)
    }

    /// The consumer's state and the consumer role of every window, borrowed at once.
    pub fn split(&mut self) -> (&mut T, [Consumer<'_>; N]) {
        (&mut self.state, self.windows.each_ref().map(Consumer::new))
    }
}

impl<T, const N: usize> Deref for Held<'_, T, N> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.state
    }
}

impl<T, const N: usize> DerefMut for Held<'_, T, N> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.state
    }
}

/// The consumer role of one window: its state edges and its records. Only [`Held`] makes one,
/// for no longer than the lock is held, and it stays on that thread (neither `Send` nor `Sync`),
/// so no two consumer operations on a window ever overlap. Reads the window through `Deref`.
#[derive(Clone, Copy)]
pub struct Consumer<'a> {
    window: &'a Window,
    _one_thread: PhantomData<*const ()>,
}

impl Deref for Consumer<'_> {
    type Target = Window;

    fn deref(&self) -> &Window {
        self.window
    }
}

impl Window {
    /// A sealed READY window of `capacity` slots per lane at epoch 1; `None` when out of memory.
    /// Untouched slots cost no resident memory: the arena is mapped zeroed (a valid empty `Slot`).
    pub fn new(capacity: u32) -> Option<Window> {
        let stride = capacity.max(1).next_multiple_of(8);
        Some(Window {
            cursors: std::array::from_fn(|_| CachePadded::new(AtomicU64::new(SEALED))),
            epoch: AtomicU32::new(1),
            state: AtomicU8::new(WindowState::Ready as u8),
            sealed: std::array::from_fn(|_| AtomicU32::new(0)),
            capacity: capacity.max(1),
            stride,
            app: Arena::zeroed(stride as usize)?,
            packed: Arena::zeroed(stride as usize * (LANES - 1))?,
        })
    }

    /// [`Window::new`] at `epoch`, for tests of the epoch's wrap.
    #[cfg(all(test, not(nccl_loom)))]
    fn at_epoch(capacity: u32, epoch: u32) -> Option<Window> {
        let w = Window::new(capacity)?;
        w.epoch.store(epoch, Ordering::Relaxed);
        Some(w)
    }

    fn at(&self, slot: u32) -> Option<At<'_>> {
        match slot.checked_sub(self.stride) {
            None => self.app.get(slot as usize).map(At::Full),
            Some(i) => self.packed.get(i as usize).map(At::Packed),
        }
    }

    /// Claims a slot in `lane`, writes `entry` into it with the handle `id(claim)` and publishes
    /// it. `None` when the lane is full, the window sealed, or `entry` is not of the lane's form
    /// (nothing is claimed then). Called on: NCCL user and proxy threads.
    #[inline(always)]
    pub fn push(&self, lane: usize, entry: Entry, id: impl MakeId) -> Option<Claim> {
        match entry {
            Entry::Full(r) if lane == 0 => {
                let (claim, slot) = self.claim(lane, &self.app, 0)?;
                Self::publish(
                    slot,
                    Record {
                        id: id.make_id(claim),
                        ..r
                    },
                    claim.epoch,
                );
                Some(claim)
            }
            Entry::Packed(p) if lane > 0 => {
                let base = (lane - 1) * self.stride as usize;
                let (claim, slot) = self.claim(lane, &self.packed, base)?;
                Self::publish(slot, p.with_id(id.make_id(claim)), claim.epoch);
                Some(claim)
            }
            _ => None,
        }
    }

    /// Claims a slot in `lane`, whose slots are `arena`'s from `base` on: the claim and its
    /// slot, for [`Window::publish`].
    #[inline(always)]
    fn claim<'a, T>(&self, lane: usize, arena: &'a Arena<T>, base: usize) -> Option<(Claim, &'a Slot<T>)> {
        // Acquire: pairs with `open`'s Release, so the epoch bumped by `reset` is visible.
        let index = self.cursors.get(lane)?.fetch_add(1, Ordering::Acquire);
        if index >= u64::from(self.capacity) {
            return None;
        }
        let claim = Claim {
            slot: lane as u32 * self.stride + index as u32,
            index: index as u32,
            epoch: self.epoch.load(Ordering::Relaxed),
        };
        // In range: `index` < capacity <= stride, and the arena holds `base` + stride slots.
        Some((claim, arena.get(base + index as usize)?))
    }

    /// Writes `value` into `slot`, then stamps it with `epoch`.
    #[inline(always)]
    fn publish<T>(slot: &Slot<T>, value: T, epoch: u32) {
        // SAFETY: the caller claimed the slot with a `fetch_add` below capacity, so this thread
        // alone owns it this epoch; the consumer reads it only after the stamp below, and `reset`
        // (the only way to reuse the index) happens after `seal` waited for that stamp.
        slot.record.with_mut(|p| unsafe { (*p).write(value) });
        // Release: the record is visible before the stamp that says it is there.
        slot.stamp.store(epoch, Ordering::Release);
    }

    /// Current epoch. Called on: any thread.
    #[inline]
    pub fn epoch(&self) -> u32 {
        self.epoch.load(Ordering::Relaxed)
    }

    /// Current state.
    pub fn state(&self) -> WindowState {
        match self.state.load(Ordering::Acquire) {
            1 => WindowState::Filling,
            2 => WindowState::Closing,
            3 => WindowState::Processing,
            _ => WindowState::Ready,
        }
    }

    /// Slots claimed so far in all lanes, each at most its capacity (huge once sealed).
    pub fn claimed(&self) -> u64 {
        (0..LANES).map(|l| self.lane_claimed(l)).fold(0, u64::saturating_add)
    }

    /// Slots claimed so far in `lane`, at most the capacity (huge once sealed).
    #[inline]
    pub fn lane_claimed(&self, lane: usize) -> u64 {
        let cursor = self.cursors.get(lane).map_or(0, |c| c.load(Ordering::Relaxed));
        if cursor >= SEALED {
            cursor
        } else {
            cursor.min(u64::from(self.capacity))
        }
    }

    /// Capacity in slots, per lane.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Index of lane `l`'s first slot is `l` × the stride.
    pub fn stride(&self) -> u32 {
        self.stride
    }

    fn transition(&self, from: WindowState, to: WindowState) -> bool {
        // AcqRel: the consumer's own writes before the edge are ordered with the edge.
        self.state
            .compare_exchange(from as u8, to as u8, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Whether the record in `slot` was published this epoch (its stamp only). Called on:
    /// consumer.
    pub fn is_published(&self, slot: u32) -> bool {
        self.at(slot).is_some_and(|s| self.stamped(&s))
    }

    fn stamped(&self, slot: &At<'_>) -> bool {
        // Acquire: pairs with `push`'s Release; the record is complete once the stamp matches.
        slot.stamp().load(Ordering::Acquire) == self.epoch()
    }

    /// The slots of `lane` below `n`, as window slot indices.
    pub fn lane_slots(&self, lane: usize, n: u32) -> std::ops::Range<u32> {
        let first = lane as u32 * self.stride;
        first..first + n.min(self.capacity)
    }
}

impl<'a> Consumer<'a> {
    fn new(window: &'a Window) -> Consumer<'a> {
        Consumer {
            window,
            _one_thread: PhantomData,
        }
    }

    /// READY → FILLING. Called on: consumer.
    pub fn open(&self) -> bool {
        let opened = self.transition(WindowState::Ready, WindowState::Filling);
        if opened {
            // Release: pairs with `push`'s Acquire (new epoch visible to every claimer).
            self.cursors.iter().for_each(|c| c.store(0, Ordering::Release));
        }
        opened
    }

    /// FILLING → CLOSING. Called on: consumer.
    pub fn close(&self) -> bool {
        self.transition(WindowState::Filling, WindowState::Closing)
    }

    /// FILLING or CLOSING → PROCESSING: no claim succeeds after this. Returns how many slots were
    /// claimed per lane (capped at capacity); read them with [`Consumer::published`]. Called on:
    /// consumer.
    pub fn seal(&self) -> Option<[u32; LANES]> {
        if !(self.transition(WindowState::Closing, WindowState::Processing)
            || self.transition(WindowState::Filling, WindowState::Processing))
        {
            return None;
        }
        let mut claimed = [0; LANES];
        for ((n, cursor), sealed) in claimed.iter_mut().zip(&self.cursors).zip(&self.sealed) {
            // AcqRel: every claim before the swap is counted in the returned value.
            *n = cursor.swap(SEALED, Ordering::AcqRel).min(u64::from(self.capacity)) as u32;
            sealed.store(*n, Ordering::Relaxed);
        }
        Some(claimed)
    }

    /// The record in `slot` if it was published this epoch. Called on: consumer (a slot below a
    /// claimed count of a CLOSING or PROCESSING window).
    pub fn published(&self, slot: u32) -> Option<Record> {
        Some(match self.at(slot).filter(|s| self.stamped(s))? {
            At::Full(s) => Self::read(s),
            At::Packed(s) => Self::read(s).unpack(),
        })
    }

    /// The value in a slot stamped with this epoch.
    fn read<T: Copy>(slot: &Slot<T>) -> T {
        // SAFETY: the caller saw the slot's stamp equal this epoch, so the record was fully
        // written by its claimer, and nobody writes the slot again before a `reset` and `open`,
        // which only this consumer role can do (the lock admits one) and does not do meanwhile.
        slot.record.with(|p| unsafe { (*p).assume_init() })
    }

    /// PROCESSING → READY, only once every slot claimed before the seal is published (else the
    /// window keeps draining and this returns `false`; call again later): bump the epoch (old
    /// stamps and handles become stale) and release the memory of each lane's slots past
    /// `keep[lane]`. Called on: consumer, after reading the sealed window.
    pub fn reset(&self, keep: [u32; LANES]) -> bool {
        let drained = self.sealed.iter().enumerate().all(|(l, sealed)| {
            self.lane_slots(l, sealed.load(Ordering::Relaxed))
                .all(|s| self.is_published(s))
        });
        if self.state() != WindowState::Processing || !drained {
            return false;
        }
        // Only the consumer writes the epoch. Stamp 0 is "never written": the epoch skips it.
        self.epoch.store(self.epoch().wrapping_add(1).max(1), Ordering::Relaxed);
        for (l, keep) in keep.into_iter().enumerate() {
            let lane = self.lane_slots(l, self.capacity);
            self.release_slots(lane.start + keep.min(self.capacity)..lane.end);
        }
        self.transition(WindowState::Processing, WindowState::Ready)
    }

    /// Returns the whole pages of window slots `range`, which lie in one lane, to the kernel.
    /// Called by `reset` only, on a sealed, drained window: every slot claimed this epoch is
    /// stamped and no other can be claimed, so no producer writes any slot, and this role alone
    /// reads.
    fn release_slots(&self, range: std::ops::Range<u32>) {
        // SAFETY: as said above, no slot of `range` is touched during the call.
        unsafe {
            match range.start.checked_sub(self.stride) {
                None => self.app.release(range),
                Some(start) => self.packed.release(start..range.end - self.stride),
            }
        }
    }

    /// Brings the window back to READY from any state, discarding its records (a communicator
    /// slot reused after its communicator was disabled); `false` while a producer still owns a
    /// slot. Called on: consumer (`register`).
    pub fn recycle(&self) -> bool {
        self.seal();
        self.reset([0; LANES]) || self.state() == WindowState::Ready
    }

    /// Releases the memory of every slot of a READY window. Called on: consumer (`finalize`).
    pub fn release(&self) {
        if self.state() == WindowState::Ready {
            // SAFETY: a READY window is sealed (no claim succeeds) and was drained by its reset
            // (no producer still writes); this role alone reads, and only it opens the window.
            unsafe {
                self.app.release(0..self.stride);
                self.packed.release(0..self.stride * (LANES as u32 - 1));
            }
        }
    }
}

#[cfg(all(test, not(nccl_loom)))]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn rec(id: u64) -> Record {
        Record {
            id,
            ts: id * 10,
            body: Body::Stop,
        }
    }

    /// One window of `capacity` slots per lane, with an empty consumer state.
    fn one(capacity: u32) -> Windows<(), 1> {
        Windows::new([Window::new(capacity).unwrap()], ())
    }

    /// Pushes `r` into `lane` in that lane's form.
    fn put(w: &Window, lane: usize, r: Record) -> Option<Claim> {
        w.push(lane, Entry::new(lane, r.ts, r.body)?, |_| r.id)
    }

    #[test]
    fn claims_publish_seal_and_reset() {
        let ws = one(4);
        let held = ws.lock();
        let [w] = held.windows();
        assert_eq!(w.stride(), 8, "lanes start on a cache line (8 slots of 56 or 32 bytes)");
        assert_eq!(put(&w, 0, rec(9)), None, "a new window is sealed until opened");
        assert!(w.open());
        let claims: Vec<_> = (1..=4).map(|i| put(&w, 0, rec(i)).unwrap()).collect();
        assert_eq!(
            claims[3],
            Claim {
                slot: 3,
                index: 3,
                epoch: 1
            }
        );
        assert_eq!(put(&w, 0, rec(5)), None, "lane 0 is full");
        assert_eq!(
            put(&w, 2, rec(6)),
            Some(Claim {
                slot: 16,
                index: 0,
                epoch: 1
            }),
            "lane 2 is not"
        );
        assert_eq!(put(&w, LANES, rec(6)), None, "no such lane");
        assert_eq!((w.claimed(), w.lane_claimed(1), w.lane_claimed(2)), (5, 0, 1));
        assert!(w.close());
        assert_eq!(w.published(2), Some(rec(3)));
        assert_eq!(w.published(16), Some(rec(6)));
        assert_eq!(w.seal(), Some([4, 0, 1]));
        assert_eq!(put(&w, 1, rec(6)), None, "sealed");
        assert!(w.reset([4, 0, 1]));
        assert_eq!(w.state(), WindowState::Ready);
        assert_eq!(w.published(0), None, "old stamps are stale after reset");
        assert!(w.open());
        assert_eq!(
            put(&w, 1, rec(7)),
            Some(Claim {
                slot: 8,
                index: 0,
                epoch: 2
            })
        );
    }

    #[test]
    fn an_entry_of_the_other_form_claims_nothing() {
        let ws = one(4);
        let held = ws.lock();
        let [w] = held.windows();
        w.open();
        let progress = Record {
            id: 7,
            ts: 3,
            body: Body::InProgress,
        };
        let full = Entry::new(0, progress.ts, progress.body).unwrap();
        assert_eq!(w.push(1, full, |_| 7), None, "a full record in a packed lane");
        let packed = Entry::new(1, progress.ts, progress.body).unwrap();
        assert_eq!(w.push(0, packed, |_| 7), None, "a packed record in the full lane");
        assert!(
            Entry::new(1, 5, Body::ProxyStep { parent: 1, step: 0 }).is_none(),
            "a timed start has no packed form"
        );
        assert_eq!(w.push(1, packed, |_| 7).map(|c| c.slot), Some(w.stride()));
        assert_eq!(w.published(w.stride()), Some(progress));
        assert_eq!(w.seal(), Some([0, 1, 0]), "only the matching push claimed a slot");
    }

    #[test]
    fn edges_have_one_owner() {
        let ws = one(2);
        let held = ws.lock();
        let [w] = held.windows();
        assert!(
            !w.close() && w.seal().is_none() && !w.reset([0; LANES]),
            "READY only opens"
        );
        assert!(w.open() && !w.open());
        assert_eq!(
            w.seal(),
            Some([0; LANES]),
            "an empty FILLING window can be sealed directly"
        );
        assert!(w.reset([0; LANES]));
    }

    #[test]
    fn released_pages_read_as_empty_slots() {
        let ws = one(10_000);
        let held = ws.lock();
        let [w] = held.windows();
        w.open();
        (0..10_000).for_each(|i| {
            put(&w, 1, rec(i)).unwrap();
        });
        assert_eq!(w.seal(), Some([0, 10_000, 0]));
        assert!(w.reset([0, 100, 0]));
        w.release();
        assert!(w.app.iter().all(|s| s.stamp.load(Ordering::Relaxed) <= 1));
        assert!(w.packed.iter().all(|s| s.stamp.load(Ordering::Relaxed) <= 1));
        assert!(w.open());
        assert_eq!(put(&w, 1, rec(1)).map(|c| c.epoch), Some(2));
    }

    #[test]
    fn keep_is_capped_in_proportion() {
        assert_eq!(keep_within([10, 20, 30], 100), [10, 20, 30], "within the budget");
        assert_eq!(keep_within([100, 300, 0], 100), [25, 75, 0]);
        assert_eq!(keep_within([u32::MAX; LANES], 6), [2; LANES], "no overflow");
        assert_eq!(keep_within([5; LANES], 0), [0; LANES]);
    }

    #[test]
    fn concurrent_producers_lose_nothing() {
        let ws = one(40_000);
        let held = ws.lock();
        let [w] = held.windows();
        w.open();
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let w = &ws[0];
                s.spawn(move || {
                    (0..10_000).for_each(|i| assert!(put(w, t as usize % LANES, rec(t << 32 | i)).is_some()))
                });
            }
        });
        let n = w.seal().unwrap();
        let mut ids: Vec<u64> = (0..LANES)
            .flat_map(|l| w.lane_slots(l, n[l]))
            .map(|s| w.published(s).unwrap().id)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 40_000);
    }

    #[test]
    fn the_epoch_skips_0_when_it_wraps() {
        let ws = Windows::new([Window::at_epoch(4, u32::MAX).unwrap()], ());
        let held = ws.lock();
        let [w] = held.windows();
        assert!(w.open());
        assert_eq!(put(&w, 0, rec(1)).map(|c| c.epoch), Some(u32::MAX));
        assert_eq!(w.seal(), Some([1, 0, 0]));
        assert!(w.reset([1, 0, 0]));
        assert_eq!(w.epoch(), 1, "past the wrap, the epoch is 1, never 0");
        assert!(w.open());
        assert!(
            (0..w.stride() * LANES as u32).all(|s| w.published(s).is_none()),
            "neither the old stamp nor a never-written slot (stamp 0) is published"
        );
        assert_eq!(put(&w, 0, rec(2)).map(|c| c.epoch), Some(1));
        assert_eq!(w.published(0), Some(rec(2)));
        let h = crate::record::handle::Handle::new(0, 0, w.epoch(), crate::record::handle::Kind::Coll, 0);
        assert_eq!(h.epoch(), 1, "a handle keeps the epoch's low bits");
    }
}

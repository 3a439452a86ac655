//! The producer side of a communicator: routing each record to a window, lock-free and
//! allocation-free. New events go to the current FILLING window up to [`super::ROOT_SHARE`] of its
//! capacity; children go to their parent's window while it takes records, else to the current
//! one (and the parent's window is marked spilled); states and stops go to their event's window.
//! Called on: NCCL's user and proxy threads.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;

use super::Comm;
use crate::record::handle::{CommId, EPOCH_MASK, Handle, Kind};
use crate::record::{Body, Record};

impl Comm {
    /// Records the start of a new event of `kind` and returns its handle; `None` (counted) when
    /// no window has space. A child goes to the window of `parent` (one of our handles) while
    /// that window still takes records; otherwise, and for roots, to the current window.
    /// Called on: NCCL user and proxy threads; lock-free, allocation-free.
    #[inline]
    pub fn start(&self, id: CommId, kind: Kind, parent: Option<Handle>, ts: u64, body: Body) -> Option<u64> {
        let push = |w: u8, limit: u64| {
            let window = self.windows.get(usize::from(w)).filter(|win| win.claimed() < limit)?;
            let claim = window.push(|c| Record {
                id: Handle {
                    comm: id,
                    window: w,
                    epoch: c.epoch & EPOCH_MASK,
                    kind,
                    slot: c.slot,
                }
                .encode(),
                ts,
                body,
            })?;
            Some(
                Handle {
                    comm: id,
                    window: w,
                    epoch: claim.epoch & EPOCH_MASK,
                    kind,
                    slot: claim.slot,
                }
                .encode(),
            )
        };
        if let Some(p) = parent.filter(|p| p.comm == id && self.epoch_matches(*p)) {
            if let Some(h) = push(p.window, u64::MAX) {
                return Some(h);
            }
            // The parent's window is full or sealed: the parent's duration there is incomplete.
            if let Some(spilled) = self.spilled.get(usize::from(p.window)) {
                spilled.store(true, Ordering::Relaxed);
            }
        }
        let handle = push(self.current.load(Ordering::Relaxed), self.root_limit);
        if handle.is_none() {
            self.drops.full.fetch_add(1, Ordering::Relaxed);
        }
        handle
    }

    /// Records a state or stop of the event `handle` into its window; counted as late when that
    /// window was already processed, as full when it has no room left.
    /// Called on: NCCL user and proxy threads; lock-free.
    #[inline]
    pub fn append(&self, handle: Handle, ts: u64, body: Body) {
        if !self.epoch_matches(handle) {
            self.drops.late.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let window = self.windows.get(usize::from(handle.window));
        if window
            .and_then(|w| {
                w.push(|_| Record {
                    id: handle.encode(),
                    ts,
                    body,
                })
            })
            .is_none()
        {
            self.drops.full.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn epoch_matches(&self, h: Handle) -> bool {
        self.windows
            .get(usize::from(h.window))
            .is_some_and(|w| w.epoch() & EPOCH_MASK == h.epoch)
    }
}

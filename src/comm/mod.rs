//! Per-communicator state: identity, the four windows, routing of records, drop counters, and the
//! consumer side that closes, processes and recycles windows.
//!
//! Communicators live in a fixed registry of [`MAX_COMMS`] slots. A slot's `Comm` is allocated on
//! first use and kept for the life of the process (type-stable), and reused by later
//! communicators with a new generation; handles and contexts carry (slot, generation), so a stale
//! one is recognised by a generation mismatch without touching freed memory.
//!
//! Routing: new events go to the current FILLING window, but only up to [`ROOT_SHARE`] of its
//! capacity, so the events already in it always have room for their children, states and stops.
//! Children go to their parent's window while it takes records (a Coll and its ProxyOps and
//! ProxySteps are processed together), else to the current one, where the consumer's table of
//! open operations links them; states and stops go to their event's window.
//!
//! Threads: NCCL user and proxy threads call [`Comm::start`] and [`Comm::append`] (lock-free,
//! [`producer`]); the telemetry thread and `finalize` call [`Comm::poll`] and [`Comm::finalize`]
//! under the communicator's consumer lock ([`consumer`]); `init` calls [`register`] under the
//! registry lock ([`registry`]).
#![forbid(unsafe_code)]

mod consumer;
mod producer;
mod registry;
#[cfg(test)]
mod tests;

pub use registry::{all, find_by_hash_tag, get, get_context, register};

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

use crate::aggregate::CommMeta;
use crate::buffer::window::Window;
use crate::config::Config;
use crate::record::handle::{Context, GEN_MASK};
use consumer::Consumer;

/// Windows per communicator.
pub const WINDOWS: usize = 4;
/// A CLOSING window waits at least this long for children of its last roots (a ProxyOp can
/// start just after its Coll stopped), then until nothing is open, at most the grace period.
pub const SETTLE: Duration = Duration::from_millis(20);
/// Share of a window's capacity open to new events (the rest is headroom for their children,
/// states and stops); the count trigger is capped to it too.
pub const ROOT_SHARE: (u64, u64) = (3, 4);
/// `state` bit of a live communicator.
const LIVE: u32 = 1 << 31;
/// Bit of a `lost` entry that is set (the low bits are the window's epoch).
const LOST: u32 = 1 << 31;

/// Records that could not be kept, by reason.
#[derive(Default)]
pub struct Drops {
    /// No space: the window was full (or being sealed).
    pub full: AtomicU64,
    /// A state or stop for an event whose window was already processed.
    pub late: AtomicU64,
    /// Claimed but not published in time when the window was read.
    pub unpublished: AtomicU64,
}

impl Drops {
    fn reset(&self) {
        [&self.full, &self.late, &self.unpublished]
            .iter()
            .for_each(|c| c.store(0, Ordering::Relaxed));
    }
}

/// A snapshot of a communicator's drop counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropCounts {
    /// See [`Drops::full`].
    pub full: u64,
    /// See [`Drops::late`].
    pub late: u64,
    /// See [`Drops::unpublished`].
    pub unpublished: u64,
}

/// One communicator's state.
pub struct Comm {
    /// Registry slot.
    index: u16,
    /// `generation | LIVE` while initialised, `generation` after finalize.
    state: AtomicU32,
    /// [`Context::tag`] of the communicator hash, for PXN matching and context checks.
    hash_tag: AtomicU64,
    /// Index of the FILLING window new roots go to.
    current: AtomicU8,
    /// Claims a new event may take in the current window.
    root_limit: u64,
    windows: [Window; WINDOWS],
    /// Per window, `LOST | epoch` when a child of one of its operations was dropped for lack of
    /// room during that epoch: the consumer withholds the times of its operations.
    lost: [AtomicU32; WINDOWS],
    /// A child of an operation whose window was already processed was dropped.
    lost_held: AtomicBool,
    /// Drop counters (cumulative since `init`; consumers diff them).
    pub drops: CachePadded<Drops>,
    consumer: Mutex<Consumer>,
}

impl Comm {
    fn new(index: u16, config: &Config) -> Option<Comm> {
        let w = || Window::new(config.capacity);
        Some(Comm {
            index,
            state: AtomicU32::new(0),
            hash_tag: AtomicU64::new(0),
            current: AtomicU8::new(0),
            root_limit: u64::from(config.capacity) * ROOT_SHARE.0 / ROOT_SHARE.1,
            windows: [w()?, w()?, w()?, w()?],
            lost: std::array::from_fn(|_| AtomicU32::new(0)),
            lost_held: AtomicBool::new(false),
            drops: CachePadded::new(Drops::default()),
            consumer: Mutex::new(Consumer::new(config)),
        })
    }

    /// Makes this slot's communicator live under `generation`, with a fresh first window. The
    /// caller holds the slot's consumer lock `c` (and, in `register`, the registry lock); the slot
    /// is not live and every window is READY.
    fn activate(&self, c: &mut Consumer, generation: u32, meta: CommMeta, config: &Config) {
        self.hash_tag.store(Context::tag(meta.hash), Ordering::Relaxed);
        c.reset(meta, config, self.root_limit);
        self.drops.reset();
        self.lost.iter().for_each(|l| l.store(0, Ordering::Relaxed));
        self.lost_held.store(false, Ordering::Relaxed);
        self.windows[0].open();
        self.current.store(0, Ordering::Relaxed);
        // Release: everything above is visible to whoever sees the communicator live.
        self.state.store(generation | LIVE, Ordering::Release);
    }

    /// Whether a communicator currently uses this slot.
    pub fn is_live(&self) -> bool {
        self.state.load(Ordering::Acquire) & LIVE != 0
    }

    /// Generation of the slot's current (or last) communicator; changes with every `register`.
    pub fn generation(&self) -> u16 {
        (self.state.load(Ordering::Acquire) & GEN_MASK) as u16
    }

    /// Snapshot of the drop counters.
    pub fn drop_counts(&self) -> DropCounts {
        DropCounts {
            full: self.drops.full.load(Ordering::Relaxed),
            late: self.drops.late.load(Ordering::Relaxed),
            unpublished: self.drops.unpublished.load(Ordering::Relaxed),
        }
    }
}

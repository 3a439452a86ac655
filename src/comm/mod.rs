//! Per-communicator state: identity, the four windows, routing of records, drop counters. The
//! consumer side that closes, processes and recycles windows is the telemetry thread's
//! (`crate::telemetry::consumer`); this module gives it the windows' consumer role ([`Held`]) and
//! the route's consumer edges ([`Comm::arm`]).
//!
//! Communicators live in a fixed registry of [`MAX_COMMS`] slots. A slot's `Comm` is allocated on
//! first use and kept for the life of the process (type-stable), and reused by later
//! communicators with a new generation; contexts carry (slot, generation), handles (slot, window,
//! epoch): its windows stay with the slot and their epochs only grow, so a stale context or handle
//! is recognised by a generation or epoch mismatch without touching freed memory, and a handle of
//! an earlier communicator by an epoch from before this one's `init` (`Comm::born`).
//!
//! Routing: every record goes to its event kind's lane of a window ([`crate::record::handle::Kind::lane`]). New events
//! go to the current FILLING window, but only up to [`ROOT_SHARE`] of their lane's capacity, so
//! the events already in it always have room for their states and stops. The root that fills its
//! lane to the count trigger switches `current` to the standby window the consumer armed (opened
//! in advance), as does the consumer when the window's lanes together reach it; the consumer
//! closes the old one when it next looks.
//! Children go to their parent's window while it takes records (a Coll and its ProxyOps and
//! ProxySteps are processed together), else to the current one, where the consumer's table of
//! open operations links them; states and stops go to their event's window.
//!
//! Threads: NCCL user and proxy threads call [`Comm::start`] and [`Comm::append`] (lock-free,
//! [`producer`]); the consumer (the telemetry thread, `finalize`) takes the communicator's
//! consumer lock ([`Comm::lock`]); `init` calls [`register`] under the registry lock
//! ([`registry`]).
#![forbid(unsafe_code)]

pub mod counts;
mod producer;
mod registry;
pub mod shed;

#[cfg(test)]
pub(crate) use registry::{TESTS, bucket};
#[cfg(any(test, feature = "testing"))]
pub use registry::get;
pub use registry::{all, find_by_hash_tag, get_context, get_slot, register};

use crossbeam_utils::CachePadded;

use crate::buffer::sync::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use crate::buffer::window::{self, Window, WindowState, Windows};
use crate::config::Config;
use crate::record::CommMeta;
use crate::record::handle::{CommId, Context, GEN_MASK};

/// Windows per communicator.
pub const WINDOWS: usize = 4;
/// A communicator's consumer lock, held: its windows' consumer role.
pub type Held<'a> = window::Held<'a, (), WINDOWS>;
/// The standby of [`Comm::route`] when no window is armed.
pub const NONE: u8 = u8::MAX;


/// A [`Comm::route`] value: the current window and the standby, with their shed levels
/// ([`shed`]). While no standby is armed, `standby_level` keeps the level the current window
/// started at, from which the producers' escalation counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// The FILLING window new events go to.
    pub current: u8,
    /// The armed standby window, or [`NONE`].
    pub standby: u8,
    /// The current window's shed level.
    pub level: u8,
    /// The standby window's shed level (see the type's doc when none is armed).
    pub standby_level: u8,
}

impl Route {
    /// `current` with no standby, at `level`.
    pub const fn alone(current: u8, level: u8) -> Route {
        Route {
            current,
            standby: NONE,
            level,
            standby_level: level,
        }
    }

    /// The atomic's value.
    pub const fn pack(self) -> u32 {
        u32::from_le_bytes([self.current, self.standby, self.level, self.standby_level])
    }

    /// The route of an atomic's value.
    #[inline(always)]
    pub const fn unpack(bits: u32) -> Route {
        let [current, standby, level, standby_level] = bits.to_le_bytes();
        Route {
            current,
            standby,
            level,
            standby_level,
        }
    }
}

/// The shed level forced for every communicator's next windows (`u16::MAX`: none).
#[cfg(any(test, feature = "testing"))]
static FORCED: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(u16::MAX);

/// Test seam: forces the shed level of every communicator's windows from their next switch on
/// (`None`: the controller decides again). The consumer arms standbys at this level and
/// switches an empty current window whose level differs.
#[cfg(any(test, feature = "testing"))]
pub fn force_level(level: Option<u8>) {
    let value = level.map_or(u16::MAX, |l| u16::from(l.min(shed::MAX_LEVEL)));
    FORCED.store(value, std::sync::atomic::Ordering::SeqCst);
}

/// The level [`force_level`] set, if any.
#[inline(always)]
pub fn forced() -> Option<u8> {
    #[cfg(any(test, feature = "testing"))]
    {
        u8::try_from(FORCED.load(std::sync::atomic::Ordering::SeqCst)).ok()
    }
    #[cfg(not(any(test, feature = "testing")))]
    {
        None
    }
}
/// Share of a window's capacity open to new events (the rest is headroom for their children,
/// states and stops); the count trigger is capped to it too.
pub const ROOT_SHARE: (u64, u64) = (3, 4);
/// `state` bit of a live communicator.
pub const LIVE: u32 = 1 << 31;
/// Bit of a `lost` entry that is set (the low bits are the window's epoch).
pub const LOST: u32 = 1 << 31;

/// Records that could not be kept, by reason.
#[derive(Default)]
pub struct Drops {
    /// No space: the window was full (or being sealed).
    pub full: AtomicU64,
    /// A state or stop for an event whose window was already processed.
    pub late: AtomicU64,
    /// Claimed but not published in time when the window was read.
    pub unpublished: AtomicU64,
    /// ProxyStep detail not recorded because the window's shed level is at least 1: step
    /// starts (with everything they would have recorded) and legacy per-transfer op states.
    pub shed: AtomicU64,
}

impl Drops {
    /// Zeroes every counter (a new communicator in the slot).
    fn reset(&self) {
        [&self.full, &self.late, &self.unpublished, &self.shed]
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
    /// See [`Drops::shed`].
    pub shed: u64,
}

/// One communicator's state.
pub struct Comm {
    /// Registry slot.
    pub(crate) index: u16,
    /// `generation | LIVE` while initialised, `generation` after finalize.
    pub(crate) state: AtomicU32,
    /// [`Context::tag`] of the communicator hash, for PXN matching and context checks.
    hash_tag: AtomicU64,
    /// The communicator's hash and our rank: from `init`, or (ABI v1–v3, whose `init` gets
    /// neither: rank −1) from its first Coll/P2p ([`Comm::identify`]).
    learned_hash: AtomicU64,
    learned_rank: AtomicI32,
    /// The current window and the standby, in one atomic ([`Comm::route`]) so that a switch and
    /// an arming never see each other half done. Current: the FILLING window new roots go to.
    /// Standby: an opened, empty window the current one switches to ([`NONE`]: none armed yet);
    /// the consumer arms it, and the first root to claim [`Comm::count_trigger`] slots in its lane
    /// of the current window, or the consumer's own trigger, makes it current, so a busy window
    /// never waits for the telemetry thread to be scheduled. With each window its shed level
    /// ([`Route`]): the hot path reads the current window and its level in one load.
    pub(crate) route: AtomicU32,
    /// Claims a new event may take in its lane of the current window.
    root_limit: u64,
    /// Claims in a lane of the current window (or, for the consumer, in all of them) that switch
    /// it to the standby window: the count trigger, at most `root_limit`.
    pub(crate) count_trigger: u64,
    /// The windows, with the consumer lock that guards their consumer role.
    pub(crate) windows: Windows<(), WINDOWS>,
    /// Per window, `LOST | epoch` when a child of one of its operations was dropped for lack of
    /// room during that epoch: the consumer withholds the times of its operations.
    pub(crate) lost: [AtomicU32; WINDOWS],
    /// A child of an operation whose window was already processed was dropped.
    pub(crate) lost_held: AtomicBool,
    /// Per window, its epoch when the communicator was made live: handles with older epochs are
    /// an earlier communicator's (stale), not late records of this one.
    born: [AtomicU32; WINDOWS],
    /// Drop counters (cumulative since `init`; consumers diff them).
    pub drops: CachePadded<Drops>,
    /// Operations counted without a record (shed under overload); the consumer drains it. On
    /// the heap: it is most of a communicator's size.
    pub counts: Box<CachePadded<counts::Counts>>,
    /// The plugin's own numbering of the communicator's operations, the key of the sample.
    ops: CachePadded<OpCounts>,
    /// Ranks in the communicator (0 when `init` did not tell: ABI v1–v3).
    nranks: AtomicI32,
}

/// The starts of a communicator's operations so far, counted before any decline or drop, so
/// that every rank numbers the same operations the same way: collectives (Coll, CeColl, API
/// collectives) and, apart, P2P sends (local to the rank). Atomic: CUDA graph replays start
/// Coll events on CUDA's host-callback thread, which may race the user thread.
#[derive(Default)]
struct OpCounts {
    colls: AtomicU64,
    p2ps: AtomicU64,
}

impl Comm {
    /// A communicator slot's state before its first `register`; `None` when its windows cannot be
    /// allocated.
    pub fn new(index: u16, config: &Config) -> Option<Comm> {
        let w = || Window::new(config.capacity);
        let root_limit = u64::from(config.capacity) * ROOT_SHARE.0 / ROOT_SHARE.1;
        Some(Comm {
            index,
            state: AtomicU32::new(0),
            hash_tag: AtomicU64::new(0),
            learned_hash: AtomicU64::new(0),
            learned_rank: AtomicI32::new(-1),
            route: AtomicU32::new(Route::alone(0, 0).pack()),
            root_limit,
            count_trigger: u64::from(config.count_trigger).min(root_limit),
            windows: Windows::new([w()?, w()?, w()?, w()?], ()),
            lost: std::array::from_fn(|_| AtomicU32::new(0)),
            lost_held: AtomicBool::new(false),
            born: std::array::from_fn(|_| AtomicU32::new(0)),
            drops: CachePadded::new(Drops::default()),
            counts: Box::new(CachePadded::new(counts::Counts::default())),
            ops: CachePadded::new(OpCounts::default()),
            nranks: AtomicI32::new(0),
        })
    }

    /// Makes this slot's communicator live under `generation`, with a fresh first window and a
    /// standby at shed level `level`. The caller holds the slot's consumer lock `held` (and, in
    /// `register`, the registry lock), has reset the consumer's state of the slot, and the slot is
    /// not live with every window READY.
    pub fn activate(&self, held: &Held<'_>, generation: u32, meta: &CommMeta, level: u8) {
        self.hash_tag.store(Context::tag(meta.hash), Ordering::Relaxed);
        self.learned_hash.store(meta.hash, Ordering::Relaxed);
        self.learned_rank.store(meta.rank, Ordering::Relaxed);
        self.nranks.store(meta.nranks, Ordering::Relaxed);
        self.ops.colls.store(0, Ordering::Relaxed);
        self.ops.p2ps.store(0, Ordering::Relaxed);
        self.drops.reset();
        self.lost.iter().for_each(|l| l.store(0, Ordering::Relaxed));
        self.lost_held.store(false, Ordering::Relaxed);
        for (born, window) in self.born.iter().zip(&self.windows) {
            born.store(window.epoch(), Ordering::Relaxed);
        }
        held.windows()[0].open();
        self.route.store(Route::alone(0, level).pack(), Ordering::Relaxed);
        self.arm(held, 0, level);
        // Release: everything above is visible to whoever sees the communicator live.
        self.state.store(generation | LIVE, Ordering::Release);
    }

    /// Stops profiling communicator `id` without processing its windows (after a caught panic);
    /// its handles become stale and `finalize` finds nothing to do. Called on: any thread.
    pub fn disable(&self, id: CommId) {
        let live = u32::from(id.generation) | LIVE;
        // AcqRel: as in `finalize`.
        let _ = self
            .state
            .compare_exchange(live, u32::from(id.generation), Ordering::AcqRel, Ordering::Acquire);
    }

    /// Takes the communicator's consumer lock: its windows' consumer role. Called on: the
    /// consumer (the telemetry thread, `finalize`), `register`.
    pub fn lock(&self) -> Held<'_> {
        self.windows.lock()
    }

    /// The hash and our rank as learned ([`Comm::identify`]), once a rank is known.
    pub fn learned(&self) -> Option<(u64, i32)> {
        let rank = self.learned_rank.load(Ordering::Acquire);
        (rank >= 0).then(|| (self.learned_hash.load(Ordering::Relaxed), rank))
    }

    /// Arms a standby window for producers to switch to, when none is: an opened empty window
    /// nobody points at (left by a race), else a READY one, opened now, looked for from the one
    /// after `seen` (the current window as the consumer last saw it); at shed level `level`. An
    /// armed standby takes that level too. Called on: the consumer, `register`.
    pub fn arm(&self, held: &Held<'_>, seen: usize, level: u8) {
        // Acquire: pairs with a producer's switch. The route changes under us only by a switch
        // (when a standby is armed) or an escalation (when none is): a failed exchange looks again.
        let mut bits = self.route.load(Ordering::Acquire);
        loop {
            let r = Route::unpack(bits);
            let next = if r.standby != NONE {
                if r.standby_level == level {
                    return;
                }
                Route {
                    standby_level: level,
                    ..r
                }
            } else {
                let current = usize::from(r.current) % WINDOWS;
                let others = || {
                    (1..WINDOWS)
                        .map(move |k| (seen + k) % WINDOWS)
                        .filter(move |&i| i != current)
                };
                let armed = others()
                    .find(|&i| self.windows[i].state() == WindowState::Filling && self.windows[i].claimed() == 0)
                    .or_else(|| others().find(|&i| held.windows()[i].open()));
                let Some(i) = armed else { return };
                Route {
                    standby: i as u8,
                    standby_level: level,
                    ..r
                }
            };
            // Release: the window's opening is visible to the producer that takes it.
            match self
                .route
                .compare_exchange(bits, next.pack(), Ordering::Release, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(actual) => bits = actual,
            }
        }
    }

    /// The window new events go to now (producers may switch it at any time).
    pub fn current_window(&self) -> usize {
        // Acquire: pairs with a producer's switch, so the standby's opening is visible.
        usize::from(Route::unpack(self.route.load(Ordering::Acquire)).current) % WINDOWS
    }

    /// Whether a communicator currently uses this slot.
    pub fn is_live(&self) -> bool {
        self.state.load(Ordering::Acquire) & LIVE != 0
    }

    /// Generation of the slot's current (or last) communicator; changes with every `register`.
    pub fn generation(&self) -> u16 {
        (self.state.load(Ordering::Acquire) & GEN_MASK) as u16
    }

    /// Learns the communicator's hash and our rank from a Coll/P2p descriptor (ABI v1–v3); only
    /// the first call of a communicator whose `init` did not tell them stores anything.
    /// Called on: NCCL's user thread (hot path: one load once learned).
    pub fn identify(&self, hash: u64, rank: i32) {
        if self.learned_rank.load(Ordering::Relaxed) < 0 && rank >= 0 {
            self.learned_hash.store(hash, Ordering::Relaxed);
            self.learned_rank.store(rank, Ordering::Release);
        }
    }

    /// The current window's shed level ([`shed`]), as the hot path reads it now. Called on: the
    /// telemetry thread (and tests).
    pub fn level_now(&self) -> u8 {
        Route::unpack(self.route.load(Ordering::Acquire)).level
    }

    /// Snapshot of the drop counters.
    pub fn drop_counts(&self) -> DropCounts {
        DropCounts {
            full: self.drops.full.load(Ordering::Relaxed),
            late: self.drops.late.load(Ordering::Relaxed),
            unpublished: self.drops.unpublished.load(Ordering::Relaxed),
            shed: self.drops.shed.load(Ordering::Relaxed),
        }
    }
}

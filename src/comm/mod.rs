//! Per-communicator state: identity, the four windows, routing of records, drop counters, and the
//! consumer side that closes, processes and recycles windows.
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
//! [`producer`]); the telemetry thread and `finalize` call [`Comm::poll`] and [`Comm::finalize`]
//! under the communicator's consumer lock ([`consumer`]); `init` calls [`register`] under the
//! registry lock ([`registry`]).
#![forbid(unsafe_code)]

mod consumer;
pub mod counts;
#[cfg(all(test, nccl_loom))]
mod loom;
mod producer;
mod registry;
pub mod shed;
#[cfg(test)]
mod tests;

#[cfg(test)]
pub(crate) use registry::TESTS;
#[cfg(any(test, feature = "testing"))]
pub use consumer::set_throttle;
pub use consumer::take_hang_started;
#[cfg(any(test, feature = "testing"))]
pub use registry::get;
pub use registry::{all, find_by_hash_tag, get_context, get_slot, register};

use std::time::Duration;

use crossbeam_utils::CachePadded;

use crate::buffer::sync::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use crate::buffer::window::{Held, Window, Windows};
use crate::config::Config;
use crate::record::CommMeta;
use crate::record::handle::{Context, GEN_MASK};
use consumer::Consumer;

/// Windows per communicator.
pub const WINDOWS: usize = 4;
/// A communicator's consumer lock, held: its [`Consumer`] state and its windows' consumer role.
type Locked<'a> = Held<'a, Consumer, WINDOWS>;
/// The standby of [`Comm::route`] when no window is armed.
const NONE: u8 = u8::MAX;


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
    const fn alone(current: u8, level: u8) -> Route {
        Route {
            current,
            standby: NONE,
            level,
            standby_level: level,
        }
    }

    /// The atomic's value.
    const fn pack(self) -> u32 {
        u32::from_le_bytes([self.current, self.standby, self.level, self.standby_level])
    }

    /// The route of an atomic's value.
    #[inline(always)]
    const fn unpack(bits: u32) -> Route {
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
fn forced() -> Option<u8> {
    #[cfg(any(test, feature = "testing"))]
    {
        u8::try_from(FORCED.load(std::sync::atomic::Ordering::SeqCst)).ok()
    }
    #[cfg(not(any(test, feature = "testing")))]
    {
        None
    }
}
/// A CLOSING window waits at least this long for children of its last roots (a ProxyOp can
/// start just after its Coll stopped), then until nothing is open, at most the grace period.
pub const SETTLE: Duration = Duration::from_millis(20);
/// Longest a CLOSING window waits (from its closing) for operations of it that still progress
/// after its grace period (a collective longer than the interval): their stops land in it. Then
/// it is processed with them open and their later states and stops are lost (counted late).
pub const HOLD_PROGRESSING: Duration = Duration::from_secs(60);
/// How soon the telemetry thread looks again at a [`Comm::busy`] communicator: between two looks
/// a window may take a quarter of its capacity beyond the count trigger (up to the root share)
/// before new events are dropped, 25,000 records at the default capacity, so 1 ms keeps up with
/// 25 M records/s per communicator where the usual 10 ms tick keeps up with 2.5 M.
pub const BUSY_TICK: Duration = Duration::from_millis(1);
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
    /// ProxyStep detail not recorded because the window's shed level is at least 1: step
    /// starts (with everything they would have recorded) and legacy per-transfer op states.
    pub shed: AtomicU64,
}

impl Drops {
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
    index: u16,
    /// `generation | LIVE` while initialised, `generation` after finalize.
    state: AtomicU32,
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
    route: AtomicU32,
    /// Claims a new event may take in its lane of the current window.
    root_limit: u64,
    /// Claims in a lane of the current window (or, for the consumer, in all of them) that switch
    /// it to the standby window: the count trigger, at most `root_limit`.
    count_trigger: u64,
    /// The windows, with the consumer lock that guards their consumer role and the [`Consumer`].
    windows: Windows<Consumer, WINDOWS>,
    /// Per window, `LOST | epoch` when a child of one of its operations was dropped for lack of
    /// room during that epoch: the consumer withholds the times of its operations.
    lost: [AtomicU32; WINDOWS],
    /// A child of an operation whose window was already processed was dropped.
    lost_held: AtomicBool,
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
    fn new(index: u16, config: &Config) -> Option<Comm> {
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
            windows: Windows::new([w()?, w()?, w()?, w()?], Consumer::new(config)),
            lost: std::array::from_fn(|_| AtomicU32::new(0)),
            lost_held: AtomicBool::new(false),
            born: std::array::from_fn(|_| AtomicU32::new(0)),
            drops: CachePadded::new(Drops::default()),
            counts: Box::new(CachePadded::new(counts::Counts::default())),
            ops: CachePadded::new(OpCounts::default()),
            nranks: AtomicI32::new(0),
        })
    }

    /// Makes this slot's communicator live under `generation`, with a fresh first window. The
    /// caller holds the slot's consumer lock `c` (and, in `register`, the registry lock); the slot
    /// is not live and every window is READY.
    fn activate(&self, c: &mut Locked<'_>, generation: u32, meta: CommMeta, config: &Config) {
        self.hash_tag.store(Context::tag(meta.hash), Ordering::Relaxed);
        self.learned_hash.store(meta.hash, Ordering::Relaxed);
        self.learned_rank.store(meta.rank, Ordering::Relaxed);
        self.nranks.store(meta.nranks, Ordering::Relaxed);
        self.ops.colls.store(0, Ordering::Relaxed);
        self.ops.p2ps.store(0, Ordering::Relaxed);
        c.reset(meta, config);
        self.drops.reset();
        self.lost.iter().for_each(|l| l.store(0, Ordering::Relaxed));
        self.lost_held.store(false, Ordering::Relaxed);
        for (born, window) in self.born.iter().zip(&self.windows) {
            born.store(window.epoch(), Ordering::Relaxed);
        }
        c.windows()[0].open();
        let level = Consumer::wanted_level(c);
        self.route.store(Route::alone(0, level).pack(), Ordering::Relaxed);
        self.arm(c);
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

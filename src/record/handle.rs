//! What we hand NCCL as `eHandle` and as the communicator `context`: plain integers, never pointers.
//!
//! A handle packs (communicator slot, window, window epoch, event kind, record slot). Decoding
//! checks every field's range; the caller then checks that the slot is live and the epoch is its
//! window's, so a stale, recycled or foreign value is rejected without touching freed memory
//! (spec 4.1, 4.2). A handle needs no generation: a slot's windows outlive its communicators and
//! their epochs only grow, so a handle of an earlier communicator in the slot names an epoch its
//! window has left. Its 24 epoch bits wrap after 16.7 M cycles of one window: at a million
//! records a second and the default count trigger, a window cycles about 17 times a second, so a
//! stale handle could alias only after some 11 days. A window's epoch skips 0 (the stamp of a
//! slot never written) where its 32 bits wrap; the 24 bits a handle keeps may still be 0, as
//! they are only ever compared with a window epoch's low bits, never with a stamp, and ages
//! across that wrap count the skipped value for a handle and a communicator's birth alike.
//! Called on: every NCCL thread; pure bit arithmetic.
//!
//! | bits  | field          |
//! |-------|----------------|
//! | 0–20  | record slot    |
//! | 21–23 | kind (1–14), low bits |
//! | 24–47 | window epoch (low 24 bits) |
//! | 48–49 | window index   |
//! | 50–61 | comm slot      |
//! | 62    | kind, high bit |
//! | 63    | 1: a handle (never NULL, never a context) |
//!
//! A context packs (comm slot, generation: bits 38–49, 1–4095) the same way, a tag of this process
//! (bits 22–37, random per process) and the low 22 bits of the communicator hash, so a PXN op from
//! another process can be matched to our own communicator with that hash, and is never taken for
//! ours even when its process has our PID (containers in other PID namespaces sharing the node).
//! Its bits 62–63 are 0.
#![forbid(unsafe_code)]

use std::sync::OnceLock;

/// Largest slot index a handle can name.
pub const MAX_SLOTS: u32 = (1 << 21) - 1;
/// Producer lanes of a window (see [`Kind::lane`]): each has its own claim cursor and its own
/// range of the window's slots, which a handle's slot bits share.
pub const LANES: usize = 3;
/// Most slots one lane can hold: a multiple of 8, so that every lane's range fits the slot bits.
pub const MAX_LANE_SLOTS: u32 = (MAX_SLOTS + 1) / LANES as u32 / 8 * 8;
/// Number of communicator slots.
pub const MAX_COMMS: usize = 1 << 12;
/// Generations cycle through 1..=GEN_MASK (0 is never valid, so handles are never NULL).
pub const GEN_MASK: u32 = (1 << 12) - 1;
/// Mask of the epoch bits a handle keeps.
pub const EPOCH_MASK: u32 = (1 << 24) - 1;

const SLOT_BITS: u32 = 21;
const KIND_SHIFT: u32 = 21;
const EPOCH_SHIFT: u32 = 24;
const WINDOW_SHIFT: u32 = 48;
/// Where a context's generation goes.
const GEN_SHIFT: u32 = 38;
const COMM_SHIFT: u32 = 50;
const HASH_BITS: u32 = 22;
/// Where a context's process tag goes (16 bits, up to the generation).
const PROCESS_SHIFT: u32 = HASH_BITS;
/// Where the kind's high bit (of [`Kind::KernelPhase`]) goes.
const KIND_HIGH_SHIFT: u32 = 62;
/// Set in every handle, clear in every context.
const HANDLE_BIT: u64 = 1 << 63;

/// Event kinds we hand out handles for.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Group: a valid handle with no record behind it.
    Group = 1,
    /// Collective.
    Coll = 2,
    /// Point-to-point send.
    P2p = 3,
    /// Send proxy operation.
    ProxyOp = 4,
    /// Send proxy step.
    ProxyStep = 5,
    /// Kernel channel.
    KernelCh = 6,
    /// Receive proxy operation of one of our collectives.
    RecvOp = 7,
    /// Kernel phase (v7): one of a kernel channel's initial sync, compute, final sync.
    KernelPhase = 8,
    /// CollApi or P2pApi (v5+): a valid handle with no record behind it; its record slot holds
    /// the call's `graphCaptured` (1) or not (0), which its Coll/P2p children read.
    Api = 9,
    /// A CollApi recorded (NCCL 2.29–2.30, not graph-captured): a collective NCCL may run with
    /// its API events only; its Coll or CeColl claims it.
    ApiCall = 10,
    /// Receive proxy step (v4+) of a [`Kind::RecvOp`]: only its first RecvGPUWait and its stop
    /// are recorded after its start, for hang diagnosis.
    RecvStep = 11,
    /// An operation counted without a record (overload shedding), or an event started under
    /// one: a valid handle with no record behind it, whose descendants are shed too.
    Shed = 12,
    /// Send proxy operation recorded without its steps (ProxyStep detail shed).
    ProxyOpBare = 13,
    /// Receive proxy operation recorded without its steps (ProxyStep detail shed).
    RecvOpBare = 14,
}

impl Kind {
    fn from_bits(bits: u64) -> Option<Kind> {
        Some(match bits {
            1 => Kind::Group,
            2 => Kind::Coll,
            3 => Kind::P2p,
            4 => Kind::ProxyOp,
            5 => Kind::ProxyStep,
            6 => Kind::KernelCh,
            7 => Kind::RecvOp,
            8 => Kind::KernelPhase,
            9 => Kind::Api,
            10 => Kind::ApiCall,
            11 => Kind::RecvStep,
            12 => Kind::Shed,
            13 => Kind::ProxyOpBare,
            14 => Kind::RecvOpBare,
            _ => return None,
        })
    }
}

impl Kind {
    /// The window lane this kind's records go to, by the NCCL thread that makes most of them:
    /// 0 the application's thread (Coll, P2p, API calls), 1 the proxy thread (ProxyOp, ProxyStep),
    /// 2 kernel events (KernelCh, KernelPhase: the proxy thread before NCCL 2.31, its profiler
    /// thread since).
    pub fn lane(self) -> usize {
        match self {
            Kind::Group | Kind::Coll | Kind::P2p | Kind::Api | Kind::ApiCall | Kind::Shed => 0,
            Kind::ProxyOp | Kind::RecvOp | Kind::ProxyStep | Kind::RecvStep | Kind::ProxyOpBare | Kind::RecvOpBare => 1,
            Kind::KernelCh | Kind::KernelPhase => 2,
        }
    }

    /// The kind a bare proxy operation is of when its missing steps do not matter (itself for
    /// every other kind).
    pub fn base(self) -> Kind {
        match self {
            Kind::ProxyOpBare => Kind::ProxyOp,
            Kind::RecvOpBare => Kind::RecvOp,
            k => k,
        }
    }
}

/// Identity of a live communicator: slot in the registry and the generation that slot had at init.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommId {
    /// Registry slot, `< MAX_COMMS`.
    pub slot: u16,
    /// Generation, `1..=GEN_MASK`.
    pub generation: u16,
}

/// One of our event handles, checked: the integer NCCL stores, whose fields are read on demand
/// (a callback reads only those it needs; re-encoding is free).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle {
    raw: u64,
    kind: Kind,
}

impl Handle {
    /// The handle of an event of `kind` whose start record is in `slot` of window `window` of
    /// the communicator in registry slot `comm_slot`, at that window's `epoch` (low bits kept).
    #[inline(always)]
    pub fn new(comm_slot: u16, window: u8, epoch: u32, kind: Kind, slot: u32) -> Handle {
        let raw = u64::from(slot & MAX_SLOTS)
            | (kind as u64 & 7) << KIND_SHIFT
            | (kind as u64 >> 3) << KIND_HIGH_SHIFT
            | u64::from(epoch & EPOCH_MASK) << EPOCH_SHIFT
            | u64::from(window & 3) << WINDOW_SHIFT
            | slot_bits(comm_slot)
            | HANDLE_BIT;
        Handle { raw, kind }
    }

    /// The non-zero integer NCCL stores.
    #[inline(always)]
    pub fn encode(self) -> u64 {
        self.raw
    }

    /// Checks a value NCCL gave back; `None` when it cannot be one of ours.
    #[inline(always)]
    pub fn decode(value: u64) -> Option<Handle> {
        if value & HANDLE_BIT == 0 {
            return None;
        }
        let kind = Kind::from_bits(value >> KIND_SHIFT & 7 | (value >> KIND_HIGH_SHIFT & 1) << 3)?;
        Some(Handle { raw: value, kind })
    }

    /// Whether the record with id `value` is a proxy operation recorded bare: without its steps
    /// (detail shed).
    pub fn is_bare(value: u64) -> bool {
        Handle::decode(value).is_some_and(|h| h.kind() != h.kind().base())
    }

    /// Registry slot of the communicator the event belongs to, `< MAX_COMMS`.
    #[inline(always)]
    pub fn comm_slot(self) -> u16 {
        (self.raw >> COMM_SHIFT) as u16 & (MAX_COMMS as u16 - 1)
    }

    /// Window the event's records go to.
    #[inline(always)]
    pub fn window(self) -> u8 {
        (self.raw >> WINDOW_SHIFT & 3) as u8
    }

    /// Low bits ([`EPOCH_MASK`]) of that window's epoch when the event started.
    #[inline(always)]
    pub fn epoch(self) -> u32 {
        (self.raw >> EPOCH_SHIFT) as u32 & EPOCH_MASK
    }

    /// Event kind.
    #[inline(always)]
    pub fn kind(self) -> Kind {
        self.kind
    }

    /// Slot of the event's start record (or, for Group and API handles, their value).
    #[inline(always)]
    pub fn slot(self) -> u32 {
        (self.raw & u64::from(MAX_SLOTS)) as u32
    }
}

/// A decoded communicator context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Context {
    /// The communicator.
    pub comm: CommId,
    /// Low 22 bits of the communicator hash.
    pub hash_tag: u64,
    /// Tag of the process that made the context ([`process_tag`] in ours).
    pub process: u16,
}

/// This process's context tag: random, fixed for the process's life. Called on: any thread
/// (one load once set).
pub fn process_tag() -> u16 {
    static TAG: OnceLock<u16> = OnceLock::new();
    *TAG.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        // std's hasher keys come from the OS's random source, fresh per process.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish() as u16
    })
}

impl Context {
    /// Builds this process's context of a communicator with hash `comm_hash`.
    pub fn new(comm: CommId, comm_hash: u64) -> Context {
        Context {
            comm,
            hash_tag: Context::tag(comm_hash),
            process: process_tag(),
        }
    }

    /// Whether this process made the context.
    pub fn is_ours(&self) -> bool {
        self.process == process_tag()
    }

    /// The part of a communicator hash a context carries.
    pub fn tag(comm_hash: u64) -> u64 {
        comm_hash & ((1 << HASH_BITS) - 1)
    }

    /// Packs into the non-zero integer NCCL stores as `*context`.
    pub fn encode(self) -> u64 {
        comm_bits(self.comm) | u64::from(self.process) << PROCESS_SHIFT | Context::tag(self.hash_tag)
    }

    /// Unpacks a context; `None` when it cannot be one of ours.
    pub fn decode(value: u64) -> Option<Context> {
        if value >> 62 != 0 {
            return None;
        }
        Some(Context {
            comm: comm_from_bits(value)?,
            hash_tag: Context::tag(value),
            process: (value >> PROCESS_SHIFT) as u16,
        })
    }
}

fn slot_bits(slot: u16) -> u64 {
    (slot as u64 & (MAX_COMMS as u64 - 1)) << COMM_SHIFT
}

fn comm_bits(comm: CommId) -> u64 {
    u64::from(comm.generation as u32 & GEN_MASK) << GEN_SHIFT | slot_bits(comm.slot)
}

fn comm_from_bits(value: u64) -> Option<CommId> {
    let generation = (value >> GEN_SHIFT) as u32 & GEN_MASK;
    (generation != 0).then_some(CommId {
        slot: (value >> COMM_SHIFT) as u16 & (MAX_COMMS as u16 - 1),
        generation: generation as u16,
    })
}

const _: () = assert!(
    SLOT_BITS == KIND_SHIFT
        && EPOCH_SHIFT + EPOCH_MASK.count_ones() == WINDOW_SHIFT
        && WINDOW_SHIFT + 2 == COMM_SHIFT
        && COMM_SHIFT + 12 == KIND_HIGH_SHIFT
        && PROCESS_SHIFT + 16 == GEN_SHIFT
        && GEN_SHIFT + 12 == COMM_SHIFT
);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kind(i: u8) -> Kind {
        Kind::from_bits(u64::from(i % 14 + 1)).unwrap()
    }

    proptest! {
        #[test]
        fn handle_round_trips(comm_slot in 0u16..4096, window in 0u8..4, epoch in any::<u32>(),
                              k in any::<u8>(), rec in 0..=MAX_SLOTS) {
            let h = Handle::new(comm_slot, window, epoch, kind(k), rec);
            let v = h.encode();
            prop_assert_ne!(v, 0);
            prop_assert_eq!(Handle::decode(v), Some(h));
            let fields = (h.comm_slot(), h.window(), h.epoch(), h.kind(), h.slot());
            prop_assert_eq!(fields, (comm_slot, window, epoch & EPOCH_MASK, kind(k), rec));
            prop_assert_eq!(Context::decode(v), None);
        }

        #[test]
        fn context_round_trips(slot in 0u16..4096, generation in 1u16..4096, hash in any::<u64>(),
                               process in any::<u16>()) {
            let c = Context::new(CommId { slot, generation }, hash);
            prop_assert!(c.is_ours());
            prop_assert_ne!(c.encode(), 0);
            prop_assert_eq!(Context::decode(c.encode()), Some(c));
            prop_assert_eq!(Handle::decode(c.encode()), None);
            let other = Context { process, ..c };
            prop_assert_eq!(Context::decode(other.encode()), Some(other));
            prop_assert_eq!(other.is_ours(), process == process_tag());
        }

        #[test]
        fn decode_never_panics(v in any::<u64>()) {
            let _ = Handle::decode(v);
            let _ = Context::decode(v);
        }
    }

    #[test]
    fn rejects_unmarked_handles_unknown_kinds_and_zero_generations() {
        assert_eq!(Handle::decode(0), None);
        assert_eq!(Context::decode(0), None);
        let h = Handle::new(1, 0, 0, Kind::Coll, 0);
        assert_eq!(Handle::decode(h.encode() & !(7 << KIND_SHIFT)), None);
        assert_eq!(Handle::decode(h.encode() & !HANDLE_BIT), None);
        let all_bits = Handle::new(1, 0, 0, Kind::KernelPhase, 0).encode() | 7 << KIND_SHIFT;
        assert_eq!(Handle::decode(all_bits), None, "kind 15 does not exist");
        let ctx = Context::new(CommId { slot: 1, generation: 1 }, 7).encode();
        assert_eq!(Context::decode(ctx & !(u64::from(GEN_MASK) << GEN_SHIFT)), None);
        assert_eq!(Context::decode(ctx | 1 << 62), None);
    }
}

//! The process-wide registry of communicators: [`MAX_COMMS`] slots, each holding a type-stable
//! [`Comm`] allocated on first use and reused by later communicators with a new generation.
//! Lookups by id, context or PXN hash tag are lock-free; `register` serialises on one lock.
//! A new slot is allocated only when every allocated one is live (or still draining a window),
//! so the slots allocated never exceed the most communicators live at once plus those draining,
//! however fast communicators come and go.
//! Called on: NCCL's init thread (`register`); any thread (lookups); the telemetry thread (`all`).
#![forbid(unsafe_code)]

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU16, Ordering};

use parking_lot::Mutex;

use super::{Comm, Held, LIVE};
use crate::config::Config;
use crate::record::CommMeta;
use crate::record::handle::{CommId, Context, GEN_MASK, MAX_COMMS};

static COMMS: [OnceLock<&'static Comm>; MAX_COMMS] = [const { OnceLock::new() }; MAX_COMMS];
static REGISTRY: Mutex<()> = Mutex::new(());

/// Buckets of [`BY_TAG`].
const TAG_BUCKETS: usize = 1024;
/// For PXN lookups: per bucket of hash tags, the slot last registered with a tag in it
/// ([`NO_SLOT`]: none). A hint, checked against the slot (live, same tag); a miss scans.
static BY_TAG: [AtomicU16; TAG_BUCKETS] = [const { AtomicU16::new(NO_SLOT) }; TAG_BUCKETS];
const NO_SLOT: u16 = u16::MAX;

/// The bucket of [`BY_TAG`] of a hash tag.
pub(crate) fn bucket(hash_tag: u64) -> usize {
    (hash_tag ^ hash_tag >> 20 ^ hash_tag >> 40) as usize % TAG_BUCKETS
}

/// Registers a communicator and opens its first window; `None` when every slot is live (or still
/// draining) or the windows cannot be allocated. `reset` starts the consumer's state of the slot
/// over, with the slot's consumer lock held, and returns the shed level of its first windows.
/// Called on: NCCL's init thread.
pub fn register(meta: &CommMeta, config: &Config, reset: impl FnOnce(&'static Comm) -> u8) -> Option<CommId> {
    let _registry = REGISTRY.lock();
    let (slot, comm, held) = free_slot(config)?;
    let generation = (comm.state.load(Ordering::Relaxed) & GEN_MASK) % GEN_MASK + 1;
    let hash_tag = Context::tag(meta.hash);
    let level = reset(comm);
    comm.activate(&held, generation, meta, level);
    BY_TAG[bucket(hash_tag)].store(slot as u16, Ordering::Relaxed);
    Some(CommId {
        slot: slot as u16,
        generation: generation as u16,
    })
}

/// A slot not live whose windows are all READY (after recycling what a disabled communicator
/// left), with its consumer lock: the first one whose lock is free, else the first one being
/// finalized or polled (its lock is taken: waited for, milliseconds), else a new `Comm` in the
/// slot after the last one allocated, when there is one (nothing is allocated otherwise).
/// Called with the registry lock held.
fn free_slot(config: &Config) -> Option<(usize, &'static Comm, Held<'static>)> {
    let mut busy = None;
    for (i, comm) in all().enumerate() {
        if comm.is_live() {
            continue;
        }
        match comm.windows.try_lock() {
            Some(c) if ready(&c) => return Some((i, comm, c)),
            Some(_) => {}
            None => busy = busy.or(Some((i, comm))),
        }
    }
    if let Some((i, comm)) = busy {
        let c = comm.windows.lock();
        if !comm.is_live() && ready(&c) {
            return Some((i, comm, c));
        }
    }
    let i = all().count();
    let cell = COMMS.get(i)?;
    let comm = Comm::new(i as u16, config)?;
    // The cell is empty: only `register` fills cells, in order, under the registry lock.
    let comm: &'static Comm = cell.get_or_init(|| Box::leak(Box::new(comm)));
    // Once published, the telemetry thread's poll may hold the new slot's lock for a moment.
    Some((i, comm, comm.windows.lock()))
}

/// Recycles every window of a slot that is not live (no short-circuit); whether all are READY.
fn ready(c: &Held<'_>) -> bool {
    c.windows().iter().filter(|w| !w.recycle()).count() == 0
}

/// The live communicator `id`, or `None` when stale. Called on: any thread; lock-free.
#[inline]
pub fn get(id: CommId) -> Option<&'static Comm> {
    let comm = *COMMS.get(usize::from(id.slot))?.get()?;
    // Acquire: pairs with `register`'s Release.
    (comm.state.load(Ordering::Acquire) == u32::from(id.generation) | LIVE).then_some(comm)
}

/// The communicator live in registry slot `slot`, with its id. Called on: any thread; lock-free.
#[inline]
pub fn get_slot(slot: u16) -> Option<(CommId, &'static Comm)> {
    let comm = *COMMS.get(usize::from(slot))?.get()?;
    // Acquire: pairs with `register`'s Release.
    let state = comm.state.load(Ordering::Acquire);
    let generation = (state & GEN_MASK) as u16;
    (state & LIVE != 0).then_some((CommId { slot, generation }, comm))
}

/// The live communicator a context of ours names: process tag, slot, generation and hash tag must
/// all match.
/// Called on: any thread; lock-free.
#[inline]
pub fn get_context(ctx: Context) -> Option<&'static Comm> {
    get(ctx.comm).filter(|c| ctx.is_ours() && c.hash_tag.load(Ordering::Relaxed) == ctx.hash_tag)
}

/// The live communicator whose hash has this [`Context::tag`]: the same communicator seen from
/// another process's PXN op. Called on: proxy threads; one slot checked when the hint of its
/// bucket is right, else a scan of the slots allocated so far.
pub fn find_by_hash_tag(hash_tag: u64) -> Option<(CommId, &'static Comm)> {
    let hint = BY_TAG[bucket(hash_tag)].load(Ordering::Relaxed);
    if let Some(found) = with_tag(hint, hash_tag) {
        return Some(found);
    }
    all().enumerate().find_map(|(i, _)| with_tag(i as u16, hash_tag))
}

/// Slot `i`'s communicator with its id, when it is live with this hash tag.
fn with_tag(i: u16, hash_tag: u64) -> Option<(CommId, &'static Comm)> {
    get_slot(i).filter(|(_, comm)| comm.hash_tag.load(Ordering::Relaxed) == hash_tag)
}

/// Every communicator slot allocated so far, live or not (slots are allocated in order).
pub fn all() -> impl Iterator<Item = &'static Comm> {
    COMMS.iter().map_while(|cell| cell.get().copied())
}

/// Serialises the unit tests that register communicators: one of them fills every slot.
#[cfg(test)]
pub(crate) static TESTS: Mutex<()> = Mutex::new(());

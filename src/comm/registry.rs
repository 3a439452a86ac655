//! The process-wide registry of communicators: [`MAX_COMMS`] slots, each holding a type-stable
//! [`Comm`] allocated on first use and reused by later communicators with a new generation.
//! Lookups by id, context or PXN hash tag are lock-free; `register` serialises on one lock.
//! Called on: NCCL's init thread (`register`); any thread (lookups); the telemetry thread (`all`).
#![forbid(unsafe_code)]

use std::sync::OnceLock;
use std::sync::atomic::Ordering;

use parking_lot::{Mutex, MutexGuard};

use super::consumer::Consumer;
use super::{Comm, LIVE};
use crate::aggregate::CommMeta;
use crate::config::Config;
use crate::record::handle::{CommId, Context, GEN_MASK, MAX_COMMS};

static COMMS: [OnceLock<&'static Comm>; MAX_COMMS] = [const { OnceLock::new() }; MAX_COMMS];
static REGISTRY: Mutex<()> = Mutex::new(());

/// Registers a communicator and opens its first window; `None` when every slot is live (or still
/// draining) or the windows cannot be allocated. Called on: NCCL's init thread.
pub fn register(meta: CommMeta, config: &Config) -> Option<CommId> {
    let _registry = REGISTRY.lock();
    let (slot, comm, mut c) = free_slot(config)?;
    let generation = (comm.state.load(Ordering::Relaxed) & GEN_MASK) % GEN_MASK + 1;
    comm.activate(&mut c, generation, meta, config);
    Some(CommId {
        slot: slot as u16,
        generation: generation as u16,
    })
}

/// The first slot not live, not being finalized (its consumer lock is free) and whose windows
/// are all READY (after recycling what a disabled communicator left), with its consumer lock;
/// allocates a new `Comm` after the last one in use.
fn free_slot(config: &Config) -> Option<(usize, &'static Comm, MutexGuard<'static, Consumer>)> {
    for (i, cell) in COMMS.iter().enumerate() {
        let comm = match cell.get() {
            Some(comm) => *comm,
            None => {
                let comm: &'static Comm = Box::leak(Box::new(Comm::new(i as u16, config)?));
                *cell.get_or_init(|| comm)
            }
        };
        if comm.state.load(Ordering::Acquire) & LIVE != 0 {
            continue;
        }
        let Some(consumer) = comm.consumer.try_lock() else {
            continue;
        };
        // Recycle every window (no short-circuit), then require all of them READY.
        if comm.windows.iter().filter(|w| !w.recycle()).count() == 0 {
            return Some((i, comm, consumer));
        }
    }
    None
}

/// The live communicator `id`, or `None` when stale. Called on: any thread; lock-free.
#[inline]
pub fn get(id: CommId) -> Option<&'static Comm> {
    let comm = *COMMS.get(usize::from(id.slot))?.get()?;
    // Acquire: pairs with `register`'s Release.
    (comm.state.load(Ordering::Acquire) == u32::from(id.generation) | LIVE).then_some(comm)
}

/// The live communicator a context of ours names: slot, generation and hash tag must all match.
/// Called on: any thread; lock-free.
#[inline]
pub fn get_context(ctx: Context) -> Option<&'static Comm> {
    get(ctx.comm).filter(|c| c.hash_tag.load(Ordering::Relaxed) == ctx.hash_tag)
}

/// The live communicator whose hash has this [`Context::tag`]: the same communicator seen from
/// another process's PXN op. Called on: proxy threads; scans the slots allocated so far.
pub fn find_by_hash_tag(hash_tag: u64) -> Option<(CommId, &'static Comm)> {
    all().enumerate().find_map(|(i, comm)| {
        let state = comm.state.load(Ordering::Acquire);
        (state & LIVE != 0 && comm.hash_tag.load(Ordering::Relaxed) == hash_tag).then_some((
            CommId {
                slot: i as u16,
                generation: (state & GEN_MASK) as u16,
            },
            comm,
        ))
    })
}

/// Every communicator slot allocated so far, live or not (slots are allocated in order).
pub fn all() -> impl Iterator<Item = &'static Comm> {
    COMMS.iter().map_while(|cell| cell.get().copied())
}

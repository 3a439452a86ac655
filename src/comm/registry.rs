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

use super::{Comm, LIVE, Locked};
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

fn bucket(hash_tag: u64) -> usize {
    (hash_tag ^ hash_tag >> 20 ^ hash_tag >> 40) as usize % TAG_BUCKETS
}

/// Registers a communicator and opens its first window; `None` when every slot is live (or still
/// draining) or the windows cannot be allocated. Called on: NCCL's init thread.
pub fn register(meta: CommMeta, config: &Config) -> Option<CommId> {
    let _registry = REGISTRY.lock();
    let (slot, comm, mut c) = free_slot(config)?;
    let generation = (comm.state.load(Ordering::Relaxed) & GEN_MASK) % GEN_MASK + 1;
    let hash_tag = Context::tag(meta.hash);
    comm.activate(&mut c, generation, meta, config);
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
fn free_slot(config: &Config) -> Option<(usize, &'static Comm, Locked<'static>)> {
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
fn ready(c: &Locked<'_>) -> bool {
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn meta(hash: u64) -> CommMeta {
        CommMeta {
            hash,
            name: "pxn".into(),
            rank: 0,
            nranks: 2,
            nnodes: 2,
            gpu: Default::default(),
        }
    }

    #[test]
    fn a_pxn_lookup_finds_its_communicator_when_its_bucket_hints_another() {
        let _serial = TESTS.lock();
        let config = Config::default();
        let h1 = 0x5A5A_0000_0000_1234;
        let tag1 = Context::tag(h1);
        // A second hash in the same bucket: registered after the first, its slot is the hint.
        let h2 = (1..)
            .map(|i| h1 + i)
            .find(|h| bucket(Context::tag(*h)) == bucket(tag1))
            .unwrap();
        let a = register(meta(h1), &config).unwrap();
        let b = register(meta(h2), &config).unwrap();
        assert_eq!(find_by_hash_tag(tag1).map(|(id, _)| id), Some(a));
        assert_eq!(find_by_hash_tag(Context::tag(h2)).map(|(id, _)| id), Some(b));
        for id in [a, b] {
            get(id).unwrap().finalize(id, 1e-9).unwrap();
        }
        assert!(
            find_by_hash_tag(tag1).is_none(),
            "a finalized communicator is not found"
        );
    }

    /// Virtual memory of this process, in kB.
    fn vm_size_kb() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmSize:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    fn a_full_registry_refuses_without_allocating() {
        let _serial = TESTS.lock();
        let small = Config {
            capacity: 1024,
            count_trigger: 512,
            ..Config::default()
        };
        let ids: Vec<CommId> = (0..MAX_COMMS as u64)
            .map(|h| register(meta(0xF111_0000 + h), &small).unwrap())
            .collect();
        assert_eq!(all().count(), MAX_COMMS);
        // A communicator of the largest windows maps some 330 MB of address space: eight leaked
        // ones would show.
        let large = Config {
            capacity: crate::record::handle::MAX_LANE_SLOTS,
            ..Config::default()
        };
        let before = vm_size_kb();
        assert!(
            (0..8).all(|_| register(meta(0xF222_0000), &large).is_none()),
            "every slot is live"
        );
        let grown = vm_size_kb().saturating_sub(before);
        assert!(grown < 1 << 20, "a refused init maps nothing ({grown} kB more)");
        for id in ids {
            get(id).unwrap().finalize(id, 1e-9).unwrap();
        }
        let id = register(meta(0xF333_0000), &small).expect("a finalized slot is reused");
        get(id).unwrap().finalize(id, 1e-9).unwrap();
    }
}

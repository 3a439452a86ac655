//! What the recording path (`events`) and the shedding path (`shedding`) of the hot path share:
//! the live communicator of a handle's slot, the time of untimed records, and a recorded root's
//! Tag and Claim records. Called on: NCCL's threads (every callback).
#![forbid(unsafe_code)]

use super::guard::Owner;
use crate::comm::{self, Comm};
use crate::record::Body;
use crate::record::handle::{CommId, Handle, Kind};
use crate::stats::STATS;

/// Time of records whose time nothing uses (ProxyOp, ProxyStep, KernelCh starts; Coll, P2p,
/// KernelCh stops; KernelChStop): the clock is not read for them.
pub(super) const UNTIMED: u64 = 0;

/// The Coll/P2p `handle`, with a Tag record after its start when the application tagged it (v7),
/// and a Claim when its parent is a recorded API call.
#[inline]
pub(super) fn annotated(comm: &Comm, handle: u64, tag: u64, parent: u64) -> Option<u64> {
    let api = Handle::decode(parent).is_some_and(|p| p.kind() == Kind::ApiCall);
    if (tag != 0 || api)
        && let Some(h) = Handle::decode(handle)
    {
        if tag != 0 {
            comm.append(h, UNTIMED, Body::Tag { tag });
        }
        if api {
            comm.append(h, UNTIMED, Body::Claim { api: parent });
        }
    }
    Some(handle)
}

/// The communicator live in registry slot `slot`, with its id; counted as stale otherwise.
#[inline]
pub(super) fn live(owner: &Owner, slot: u16) -> Option<(CommId, &'static Comm)> {
    let found = comm::get_slot(slot);
    match found {
        Some(_) => owner.set(found),
        None => STATS.stale.incr(),
    }
    found
}

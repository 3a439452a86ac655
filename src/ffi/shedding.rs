//! The hot path's shedding under overload (the window's shed level, `crate::comm::shed`): which
//! collectives and P2P sends a sampling level records (`crate::record::sample`), the count table
//! for the others, and the record-less `Shed` handles of those and of their children; the detail
//! of shed or bare parents (steps, kernel phases, legacy transfer states) counted as shed.
//! Called on: NCCL's user and proxy threads; lock-free, allocation-free. The decisions are kept
//! out of line: the level-0 path in `events` stays straight.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::sync::atomic::Ordering;

use super::guard::Owner;
use super::roots::{UNTIMED, annotated, live};
use crate::abi::Abi;
use crate::abi::legacy::{self, OpState};
use crate::bindings::{self, ncclProfilerEventState_t};
use crate::comm::{Comm, Route, shed};
use crate::record::counted::CountKey;
use crate::record::handle::{CommId, EPOCH_MASK, Handle, Kind, MAX_SLOTS};
use crate::record::sample::{self, Role, Sample};
use crate::record::size::{UNKNOWN_CLASS, size_class, test_size};
use crate::record::{Algo, Body, CollStart, Datatype, Func, P2pStart, Proto};
use crate::stats::STATS;

/// Mixed into a communicator's hash for the sample of its P2P sends (numbered apart from its
/// collectives, and decided by each rank alone).
const P2P_SALT: u64 = 0x5032_5053_414C_5421;

/// Collective `n` at a sampling level (`1 + k`): recorded when it is in the communicator's
/// sample or precedes one that is ([`sample::decide`]: every rank decides the same), else only
/// counted.
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub(super) fn sampled_coll(
    comm: &Comm,
    id: CommId,
    route: Route,
    n: u64,
    ts: u64,
    mut coll: CollStart,
    tag: u64,
    parent: u64,
) -> Option<u64> {
    let Some(s) = sample::decide(comm.learned_hash(), n, shed::k_of(route.level)) else {
        return counted_coll(comm, id, &coll, parent);
    };
    coll.sample = s;
    match comm.start_at(id, Kind::Coll, route, ts, Body::Coll(coll)) {
        Some(handle) => annotated(comm, handle, tag, parent),
        None => counted_coll(comm, id, &coll, parent),
    }
}

/// P2P send `n` at a sampling level: recorded when in the rank's own sample (no pairs: the
/// service split of P2P is not exported), else only counted.
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub(super) fn sampled_p2p(
    comm: &Comm,
    id: CommId,
    route: Route,
    n: u64,
    ts: u64,
    mut p2p: P2pStart,
    tag: u64,
    parent: u64,
) -> Option<u64> {
    let k = shed::k_of(route.level);
    if !sample::sampled(sample::key(comm.learned_hash() ^ P2P_SALT, n), k) {
        return counted_p2p(comm, id, &p2p, parent);
    }
    p2p.sample = Sample::new(k, Role::Timed, n as u8);
    match comm.start_at(id, Kind::P2p, route, ts, Body::P2p(p2p)) {
        Some(handle) => annotated(comm, handle, tag, parent),
        None => counted_p2p(comm, id, &p2p, parent),
    }
}

/// Counts a collective without a record (not in the sample, or no room for its start) and hands
/// out a [`Kind::Shed`] handle.
#[cold]
#[inline(never)]
pub(super) fn counted_coll(comm: &Comm, id: CommId, coll: &CollStart, parent: u64) -> Option<u64> {
    let (func, algo, proto) = (coll.func, coll.algo, coll.proto);
    count(comm, func, algo, proto, coll.count, coll.datatype, false);
    shed_root(comm, id, parent)
}

/// [`counted_coll`] for a P2P send.
#[cold]
#[inline(never)]
pub(super) fn counted_p2p(comm: &Comm, id: CommId, p2p: &P2pStart, parent: u64) -> Option<u64> {
    count(
        comm,
        Func::Send,
        Algo::Unknown,
        Proto::Unknown,
        p2p.count,
        p2p.datatype,
        true,
    );
    shed_root(comm, id, parent)
}

/// Adds one operation of `count` elements of `datatype` to the communicator's count table.
fn count(comm: &Comm, func: Func, algo: Algo, proto: Proto, count: u64, datatype: Datatype, p2p: bool) {
    let bytes = count.saturating_mul(datatype.size());
    let class = test_size(func, bytes, comm.nranks()).map_or(UNKNOWN_CLASS, size_class);
    let key = CountKey {
        func,
        algo,
        proto,
        class,
        p2p,
    };
    comm.counts.add(key, bytes);
}

/// The handle of an operation counted without a record. Under a recorded API call
/// (NCCL 2.29–2.30) it still claims the call, or the consumer would report the call itself as a
/// collective: the claim is the handle's only record.
fn shed_root(comm: &Comm, id: CommId, parent: u64) -> Option<u64> {
    if Handle::decode(parent).is_some_and(|p| p.kind() == Kind::ApiCall)
        && let Some(h) = comm.start(id, Kind::Shed, None, UNTIMED, Body::Claim { api: parent })
    {
        return Some(h);
    }
    Some(shed_handle(id))
}

/// A [`Kind::Shed`] handle of communicator `id`, with no record behind it: its children are shed
/// by its kind alone, its states and stop ignored. Its epoch bits carry the communicator's
/// generation, so that a later communicator in the slot does not take its children, and its
/// record slot is [`MAX_SLOTS`], which no record has (lanes end below it).
fn shed_handle(id: CommId) -> u64 {
    Handle::new(id.slot, 0, u32::from(id.generation), Kind::Shed, MAX_SLOTS).encode()
}

/// The [`Kind::Shed`] handle of an event started under the shed `parent` (a ProxyOp, a
/// KernelCh); `None`, counted stale, when the parent's communicator is no longer live.
pub(super) fn shed_child(owner: &Owner, parent: Handle) -> Option<u64> {
    let (id, _) = live(owner, parent.comm_slot())?;
    if parent.epoch() != u32::from(id.generation) & EPOCH_MASK {
        STATS.stale.incr();
        return None;
    }
    Some(shed_handle(id))
}

/// A start that is detail of a shed or bare parent (a step, a kernel phase): no handle, counted
/// as shed on the parent's communicator.
#[cold]
pub(super) fn shed_detail(owner: &Owner, parent: Handle) -> Option<u64> {
    let (_, comm) = live(owner, parent.comm_slot())?;
    comm.drops.shed.fetch_add(1, Ordering::Relaxed);
    None
}

/// A state of a bare proxy op or a shed event: a bare receive's InProgress is recorded (it will
/// stop); the transfer states of bare ops ([`legacy::op_state`] on `abi`: all of a send's, a
/// receive's counts) are shed (counted); other states NCCL defines for them are ignored, unknown
/// ones counted.
#[cold]
#[inline(never)]
pub(super) fn bare_state(owner: &Owner, h: Handle, state: ncclProfilerEventState_t, ts: u64, abi: Abi) {
    let op = legacy::op_state(abi, state);
    match (h.kind(), state) {
        (Kind::RecvOpBare, bindings::ncclProfilerProxyOpInProgress_v4) => {
            if let Some((_, comm)) = live(owner, h.comm_slot()) {
                comm.append(h, ts, Body::InProgress);
            }
        }
        (Kind::RecvOpBare, _) if op.is_some_and(OpState::counts_receive) => {
            shed_detail(owner, h);
        }
        (Kind::ProxyOpBare, _) if op.is_some() => {
            shed_detail(owner, h);
        }
        (
            Kind::ProxyOpBare | Kind::RecvOpBare,
            bindings::ncclProfilerProxyOpSendPosted..=bindings::ncclProfilerProxyOpRecvDone
            | bindings::ncclProfilerProxyOpInProgress_v4,
        )
        | (Kind::Shed, _) => {}
        _ => STATS.unknown_states.incr(),
    }
}

//! The generic bodies of the hot-path callbacks (`startEvent`, `stopEvent`, `recordEventState`),
//! one per callback for every ABI version: decode the handle or context, classify the event,
//! copy its scalars into a record and route it to the communicator's window. NULL, stale,
//! foreign, declined and unknown inputs are counted in [`STATS`] and answered with success.
//! Called on: NCCL's user and proxy threads; lock-free, allocation-free, no syscall but the clock.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicI32, Ordering};

use super::guard::{Owner, guarded};
use super::roots::{UNTIMED, annotated, live};
use super::shedding::{bare_state, counted_coll, counted_p2p, sampled_coll, sampled_p2p, shed_child, shed_detail};
use crate::abi::legacy::{self, OpState};
use crate::abi::{Abi, Descriptor, Filled, StateArgs};
use crate::bindings;
use crate::bindings::{
    ncclProfileCeBatch, ncclProfileCeColl, ncclProfileCeSync, ncclProfileColl, ncclProfileCollApi, ncclProfileGroup,
    ncclProfileGroupApi, ncclProfileKernelCh, ncclProfileKernelLaunch, ncclProfileKernelPhase, ncclProfileNetPlugin,
    ncclProfileP2p, ncclProfileP2pApi, ncclProfileProxyCtrl, ncclProfileProxyOp, ncclProfileProxyStep,
    ncclProfilerEventState_t, ncclResult_t,
};
use crate::clock;
use crate::comm::{self, Comm, shed};
use crate::record::handle::{CommId, Context, Handle, Kind};
use crate::record::sample::{Role, Sample};
use crate::record::{Algo, Body, CollStart, Func, PHASES, ProxyOpStart};
use crate::stats::STATS;

/// Our process id, for telling PXN ops from other processes apart (set by `init`).
pub(super) static OWN_PID: AtomicI32 = AtomicI32::new(0);

/// The event types, widened as [`Descriptor::event_type`] reads them.
const GROUP: u64 = ncclProfileGroup as u64;
const COLL: u64 = ncclProfileColl as u64;
const P2P: u64 = ncclProfileP2p as u64;
const PROXY_OP: u64 = ncclProfileProxyOp as u64;
const PROXY_STEP: u64 = ncclProfileProxyStep as u64;
const PROXY_CTRL: u64 = ncclProfileProxyCtrl as u64;
const KERNEL_CH: u64 = ncclProfileKernelCh as u64;
const NET_PLUGIN: u64 = ncclProfileNetPlugin as u64;
const GROUP_API: u64 = ncclProfileGroupApi as u64;
const COLL_API: u64 = ncclProfileCollApi as u64;
const P2P_API: u64 = ncclProfileP2pApi as u64;
const KERNEL_LAUNCH: u64 = ncclProfileKernelLaunch as u64;
const CE_COLL: u64 = ncclProfileCeColl as u64;
const CE_SYNC: u64 = ncclProfileCeSync as u64;
const CE_BATCH: u64 = ncclProfileCeBatch as u64;
const KERNEL_PHASE: u64 = ncclProfileKernelPhase as u64;

/// # Safety
/// `handle` is NULL or writable; `descr` is NULL or points to a descriptor NCCL filled for this
/// call.
pub(super) unsafe fn start_event<D>(owner: &Owner, context: u64, handle: *mut *mut c_void, descr: *const D)
where
    Filled<D>: Descriptor,
{
    if handle.is_null() {
        STATS.null_args.incr();
        return;
    }
    // SAFETY: checked non-NULL; NCCL passes the address of its handle slot.
    unsafe { *handle = std::ptr::null_mut() };
    // SAFETY: NULL or filled by NCCL for this call, per this function's contract.
    let Some(d) = (unsafe { Filled::from_ptr(descr) }) else {
        STATS.null_args.incr();
        return;
    };
    if let Some(h) = start(owner, context, d) {
        // SAFETY: as above.
        unsafe { *handle = h as *mut c_void };
    }
}

/// Records a start; the new handle, or `None` when declined, invalid or dropped (all counted).
/// Children name their communicator by their parent, the others by `context`. Known types that
/// are never recorded (ProxyCtrl, NetPlugin, GroupApi, KernelLaunch, CeSync, CeBatch) are
/// declined; Group gets a handle of its own, CollApi and P2pApi one that tells their children
/// `graphCaptured` (or a record, [`start_api`]); CeColl is recorded as a collective.
fn start<D: Descriptor>(owner: &Owner, context: u64, d: &D) -> Option<u64> {
    let declined = || {
        STATS.declined.incr();
        None
    };
    match d.event_type() {
        PROXY_OP => start_proxy_op(owner, context, d),
        PROXY_STEP => match Handle::decode(d.parent()).map(|p| (p, p.kind())) {
            Some((parent, Kind::ProxyOp)) => start_step::<D, false>(owner, parent, d),
            Some((parent, Kind::RecvOp)) => start_step::<D, true>(owner, parent, d),
            Some((parent, Kind::ProxyOpBare | Kind::RecvOpBare | Kind::Shed)) => shed_detail(owner, parent),
            _ => declined(),
        },
        KERNEL_CH => {
            let Some(parent) = own_parent(d.parent(), &[Kind::Coll, Kind::P2p, Kind::Shed]) else {
                return declined();
            };
            if parent.kind() == Kind::Shed {
                return shed_child(owner, parent);
            }
            let (id, comm) = live(owner, parent.comm_slot())?;
            let Some((channel, gpu_start)) = d.kernel_ch() else {
                return declined(); // v3: no GPU time
            };
            let body = Body::KernelCh {
                parent: parent.encode(),
                channel,
                gpu_start,
            };
            comm.start(id, Kind::KernelCh, Some(parent), UNTIMED, body)
        }
        KERNEL_PHASE => {
            let Some(parent) = own_parent(d.parent(), &[Kind::KernelCh, Kind::Shed]) else {
                return declined();
            };
            if parent.kind() == Kind::Shed {
                return shed_detail(owner, parent);
            }
            let (id, comm) = live(owner, parent.comm_slot())?;
            let Some((phase, gpu_start)) = d.kernel_phase() else {
                STATS.unknown_types.incr(); // a table without the member
                return None;
            };
            if usize::from(phase) >= PHASES.len() {
                return declined();
            }
            let body = Body::KernelPhase {
                parent: parent.encode(),
                phase,
                gpu_start,
            };
            comm.start(id, Kind::KernelPhase, Some(parent), UNTIMED, body)
        }
        PROXY_CTRL | NET_PLUGIN | GROUP_API | KERNEL_LAUNCH | CE_SYNC | CE_BATCH => declined(),
        GROUP => {
            let (id, _) = local(owner, context)?;
            Some(no_record(id, Kind::Group, 0))
        }
        COLL => {
            // Only a Coll/P2p start time is used (a collective's duration starts there).
            let ts = clock::now();
            let (id, comm) = local(owner, context)?;
            identify(comm, d);
            let n = comm.next_coll();
            let mut coll = d.coll()?;
            if d.symmetric() {
                coll.algo = Algo::Symmetric;
            }
            coll.graph = api_graph(d.parent());
            record_coll(comm, id, n, ts, coll, d)
        }
        P2P => {
            let ts = clock::now();
            let (id, comm) = local(owner, context)?;
            identify(comm, d);
            match d.p2p()? {
                (Func::Recv, _) => declined(),
                (_, mut p2p) => {
                    let n = comm.next_p2p();
                    p2p.graph = api_graph(d.parent());
                    let route = comm.route_now();
                    if route.level > shed::DETAIL {
                        return sampled_p2p(comm, id, route, n, ts, p2p, d.user_tag(), d.parent());
                    }
                    p2p.sample = Sample::new(0, Role::Timed, n as u8);
                    match comm.start_at(id, Kind::P2p, route, ts, Body::P2p(p2p)) {
                        Some(handle) => annotated(comm, handle, d.user_tag(), d.parent()),
                        None => counted_p2p(comm, id, &p2p, d.parent()),
                    }
                }
            }
        }
        COLL_API | P2P_API => start_api(owner, context, d),
        // Collectives seen only as copy-engine work: no children.
        CE_COLL => {
            let (id, comm) = local(owner, context)?;
            match d.ce_coll() {
                Some(coll) => start_only(comm, id, coll, d),
                None => unknown_type(), // a table without the member
            }
        }
        _ => {
            local(owner, context)?;
            unknown_type()
        }
    }
}

/// A ProxyStep start under our send (`RECV` false) or receive ProxyOp `parent`: each call site
/// puts its own body in the proxy lane. Declined on v1–v3 (no bytes in their states; their
/// receive steps would lose stops on 2.24–2.26).
#[inline(always)]
fn start_step<D: Descriptor, const RECV: bool>(owner: &Owner, parent: Handle, d: &D) -> Option<u64> {
    let (id, comm) = live(owner, parent.comm_slot())?;
    let Some(step) = d.proxy_step() else {
        STATS.declined.incr();
        return None;
    };
    let parent_handle = parent.encode();
    if RECV {
        let body = Body::RecvStep {
            parent: parent_handle,
            step,
        };
        comm.start(id, Kind::RecvStep, Some(parent), UNTIMED, body)
    } else {
        let body = Body::ProxyStep {
            parent: parent_handle,
            step,
        };
        comm.start(id, Kind::ProxyStep, Some(parent), UNTIMED, body)
    }
}

/// Counts a start of a type this table does not define.
fn unknown_type() -> Option<u64> {
    STATS.unknown_types.incr();
    None
}

/// Learns the communicator's hash and our rank from a Coll/P2p (ABI v1–v3).
#[inline(always)]
fn identify<D: Descriptor>(comm: &Comm, d: &D) {
    if let Some((hash, rank)) = d.identity() {
        comm.identify(hash, rank);
    }
}

/// A CollApi or P2pApi start. A CollApi's call is read only where it is kept: a Broadcast on
/// NCCL's AllGatherV path (its only event), and on 2.29–2.30 every call outside a capture (its
/// Coll or CeColl will claim it, unless NCCL runs it with API events only; a graph's calls are
/// claimed at its replays).
fn start_api<D: Descriptor>(owner: &Owner, context: u64, d: &D) -> Option<u64> {
    let coll_api = d.event_type() == COLL_API;
    let abi = Abi::current();
    let broadcasts = coll_api && abi.api_broadcasts();
    let calls = coll_api && abi.api_calls();
    let call = (broadcasts || calls).then(|| d.coll_api()).flatten();
    let api_broadcast = broadcasts && call.is_some_and(|c| c.func == Func::Broadcast);
    let (id, comm) = local(owner, context)?;
    if !api_broadcast && let Some(graph) = d.api_graph() {
        if let Some(call) = call.filter(|_| calls && !graph) {
            return comm.start(id, Kind::ApiCall, None, UNTIMED, Body::Api(call));
        }
        // A handle without a record: its children read `graphCaptured` from it.
        return Some(no_record(id, Kind::Api, u32::from(graph)));
    }
    // A collective seen only at the API (Broadcast): no children.
    match call.filter(|_| api_broadcast) {
        Some(coll) => start_only(comm, id, coll, d),
        None => unknown_type(), // a table without API events
    }
}

/// Records a collective that has no Coll event (CeColl, an API Broadcast), as a Coll.
fn start_only<D: Descriptor>(comm: &Comm, id: CommId, mut coll: CollStart, d: &D) -> Option<u64> {
    let n = comm.next_coll();
    coll.graph = coll.graph.or_else(|| api_graph(d.parent()));
    record_coll(comm, id, n, UNTIMED, coll, d)
}

/// Records collective `n` of the communicator at the current window's level: every one up to
/// [`shed::DETAIL`], else as [`sampled_coll`] decides. One that finds no room is counted
/// ([`counted_coll`]).
#[inline(always)]
fn record_coll<D: Descriptor>(comm: &Comm, id: CommId, n: u64, ts: u64, mut coll: CollStart, d: &D) -> Option<u64> {
    let route = comm.route_now();
    if route.level > shed::DETAIL {
        return sampled_coll(comm, id, route, n, ts, coll, d.user_tag(), d.parent());
    }
    coll.sample = Sample::new(0, Role::Timed, n as u8);
    match comm.start_at(id, Kind::Coll, route, ts, Body::Coll(coll)) {
        Some(handle) => annotated(comm, handle, d.user_tag(), d.parent()),
        None => counted_coll(comm, id, &coll, d.parent()),
    }
}

/// A handle with no record behind it (Group, CollApi/P2pApi) whose slot bits carry `value`;
/// counted as declined.
fn no_record(comm: CommId, kind: Kind, value: u32) -> u64 {
    STATS.declined.incr();
    Handle::new(comm.slot, 0, 0, kind, value).encode()
}

/// `graphCaptured` of the API call whose handle is `parent` (v5+: the parent of Coll, P2p and
/// CeColl); `None` for any other parent (before 2.28: the Group).
fn api_graph(parent: u64) -> Option<bool> {
    match Handle::decode(parent)? {
        h if h.kind() == Kind::Api => Some(h.slot() == 1),
        h if h.kind() == Kind::ApiCall => Some(false), // only calls outside a capture are recorded
        _ => None,
    }
}

/// A ProxyOp start. A receive op is recorded only under one of our Coll/P2p (a collective ends
/// when its last op of either direction stops), as kind [`Kind::RecvOp`] so that its steps are
/// told from send steps by their parent's kind alone. A PXN op (pid not ours, or a context
/// another process tagged: PID namespaces let PIDs coincide) carries another process's context
/// and parent: neither is decoded as ours; a send is attributed to our communicator with the
/// same hash, under the originating rank (unless contexts know no hash,
/// [`Abi::identity_in_events`]); a receive is declined. From shed level 1 on, ops start bare ([`Kind::ProxyOpBare`], [`Kind::RecvOpBare`]:
/// their steps are shed) and PXN ops are shed; an op of a counted-only operation gets a
/// [`Kind::Shed`] handle.
fn start_proxy_op<D: Descriptor>(owner: &Owner, context: u64, d: &D) -> Option<u64> {
    let op = d.proxy_op()?;
    let tagged_elsewhere = Context::decode(context).is_some_and(|c| !c.is_ours());
    let own = op.pid == OWN_PID.load(Ordering::Relaxed) && !tagged_elsewhere;
    let mut origin = 0;
    let (id, comm, parent) = if own {
        let parent = own_parent(d.parent(), &[Kind::Coll, Kind::P2p, Kind::Shed]);
        if let Some(p) = parent.filter(|p| p.kind() == Kind::Shed) {
            return shed_child(owner, p);
        }
        // NCCL 2.23 gives a ProxyOp the context of the last op that shares its proxy arguments
        // (spec 8.2.1): its parent names its communicator.
        match parent
            .filter(|_| const { D::ABI.identity_in_events() })
            .and_then(|p| comm::get_slot(p.comm_slot()))
        {
            Some((id, comm)) => {
                owner.set(Some((id, comm)));
                (id, comm, parent)
            }
            None => {
                let (id, comm) = local(owner, context)?;
                (id, comm, parent.filter(|p| p.comm_slot() == id.slot))
            }
        }
    } else if op.is_send && !const { D::ABI.identity_in_events() } {
        // Only the hash bits of a foreign context are used, never its slot or generation.
        let Some((id, comm)) = Context::decode(context).and_then(|c| comm::find_by_hash_tag(c.hash_tag)) else {
            STATS.foreign_unmatched.incr();
            return None;
        };
        STATS.foreign_ops.incr();
        owner.set(Some((id, comm)));
        if comm.route_now().level >= shed::DETAIL {
            // Link detail only.
            comm.drops.shed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let foreign = d.parent();
        origin = (foreign ^ foreign >> 32) as u32 | 1;
        (id, comm, None)
    } else if op.is_send {
        STATS.foreign_unmatched.incr();
        return None;
    } else {
        STATS.declined.incr();
        return None;
    };
    if !op.is_send && parent.is_none() {
        STATS.declined.incr();
        return None;
    }
    let body = Body::ProxyOp(ProxyOpStart {
        parent: parent.map_or(0, Handle::encode),
        rank: op.rank,
        peer: op.peer,
        channel: op.channel,
        send: op.is_send,
        origin,
    });
    let bare = comm.route_now().level >= shed::DETAIL;
    let kind = match (op.is_send, bare) {
        (true, false) => Kind::ProxyOp,
        (false, false) => Kind::RecvOp,
        (true, true) => Kind::ProxyOpBare,
        (false, true) => Kind::RecvOpBare,
    };
    let handle = comm.start(id, kind, parent, UNTIMED, body)?;
    // Only network ops get events, and all of them stop (spec 8.1); no InProgress says so.
    if const { D::ABI.transfer_states() }
        && !op.is_send
        && let Some(h) = Handle::decode(handle)
    {
        comm.append(h, UNTIMED, Body::InProgress);
    }
    Some(handle)
}

/// Our live communicator behind a context (slot, generation and hash tag all match); counted as
/// NULL or stale otherwise.
pub(super) fn local(owner: &Owner, context: u64) -> Option<(CommId, &'static Comm)> {
    if context == 0 {
        STATS.null_args.incr();
        return None;
    }
    let found = Context::decode(context).and_then(|c| comm::get_context(c).map(|comm| (c.comm, comm)));
    match found {
        Some(_) => owner.set(found),
        None => STATS.stale.incr(),
    }
    found
}

/// `parentObj` decoded as one of our handles of the given kinds; `None` for NULL or anything else.
fn own_parent(parent: u64, kinds: &[Kind]) -> Option<Handle> {
    Handle::decode(parent).filter(|h| kinds.contains(&h.kind()))
}

/// `eHandle` decoded as one of our handles (not yet checked live); counted when NULL or invalid.
fn decode(handle: *mut c_void) -> Option<Handle> {
    if handle.is_null() {
        STATS.null_args.incr();
        return None;
    }
    let h = Handle::decode(handle as u64);
    if h.is_none() {
        STATS.stale.incr();
    }
    h
}

thread_local! {
    /// The send steps whose first SendPeerWait this thread recorded, direct-mapped by slot: NCCL
    /// repeats the state while the receiver is not ready, and a proxy thread has at most one
    /// such step per sub-operation at a time (spec 3.7). A collision records a repeat, which the
    /// consumer ignores.
    static PEER_WAITED: [Cell<u64>; 64] = const { [const { Cell::new(0) }; 64] };
}

/// Whether this is the first SendPeerWait of step `h` on this thread (no shared write).
fn first_peer_wait(h: Handle) -> bool {
    PEER_WAITED.with(|seen| first_seen(seen, h, h.encode()))
}

/// Whether `key` differs from what the entry of `seen` that `h`'s slot maps to held, which it
/// now holds: the first of a repeated state on this thread (a collision lets a repeat through).
#[inline(always)]
fn first_seen<K: Copy + PartialEq>(seen: &[Cell<K>], h: Handle, key: K) -> bool {
    seen.get(h.slot() as usize % seen.len())
        .is_some_and(|c| c.replace(key) != key)
}

thread_local! {
    /// ABI v1–v3: the (send ProxyOp, transfer) whose first SendRemFifoWait this thread recorded,
    /// direct-mapped by the op's slot (NCCL repeats the state while the receiver is not ready).
    static FIFO_WAITED: [Cell<(u64, i32)>; 16] = const { [const { Cell::new((0, 0)) }; 16] };
}

/// Whether this is the first SendRemFifoWait of send op `h` for the transfer `steps` names
/// (ABI v1–v3: transfers done plus the slice) on this thread.
fn first_fifo_wait(h: Handle, steps: i32) -> bool {
    FIFO_WAITED.with(|seen| first_seen(seen, h, (h.encode(), steps)))
}

/// `stopEvent` of the table of ABI version `ABI`. A `stopEvent(NULL)` is counted as declined
/// where NCCL stops the tasks we declined that way ([`Abi::stops_declined_tasks`]), as a NULL
/// argument on every other table.
pub(super) unsafe extern "C" fn stop_event<const ABI: u8>(handle: *mut c_void) -> ncclResult_t {
    // Only ProxyStep (transfer end) and ProxyOp (collective end) stop times are used; read the
    // clock before anything else so the time is the callback's.
    let timed = Handle::decode(handle as u64).is_some_and(|h| {
        matches!(
            h.kind(),
            Kind::ProxyOp | Kind::RecvOp | Kind::ProxyStep | Kind::ProxyOpBare | Kind::RecvOpBare
        )
    });
    let ts = if timed { clock::now() } else { UNTIMED };
    guarded(|owner| {
        if const { Abi::table(ABI).stops_declined_tasks() } && handle.is_null() {
            STATS.declined.incr();
            return;
        }
        let Some(h) = decode(handle) else { return };
        // Group, API and shed events are not stopped in records, and a KernelPhase ends with its
        // KernelPhaseStop: their stops are ignored before the communicator is looked up, live
        // or stale alike (as ignored states are).
        if matches!(
            h.kind(),
            Kind::Group | Kind::Api | Kind::ApiCall | Kind::KernelPhase | Kind::Shed
        ) {
            return;
        }
        if let Some((_, comm)) = live(owner, h.comm_slot()) {
            comm.append(h, ts, Body::Stop);
        }
    })
}

/// States we record: SendWait (bytes of a send step), the first SendPeerWait of a send step,
/// the RecvGPUWait of a receive step, KernelChStop and KernelPhaseStop (GPU stop times), a
/// receive op's InProgress (it will stop) and, where ProxyOps report transfer states
/// ([`legacy::op_state`] on `abi`), a send op's transfer edges with its byte total
/// ([`OpState::mark`]) and the first SendRemFifoWait of each of its transfers (as a PeerWait),
/// and a receive op's RecvPosted and RecvReceived counts. Other states NCCL defines for the event's type are ignored before the communicator is looked up (no
/// shared read or write, stale or not); unknown ones are counted.
pub(super) fn record_event_state<A: StateArgs>(
    owner: &Owner,
    handle: *mut c_void,
    state: ncclProfilerEventState_t,
    args: Option<&A>,
    ts: u64,
    abi: Abi,
) {
    let Some(h) = decode(handle) else { return };
    // The v1–v3 reading of `state`, asked by the ProxyOp arms only.
    let op = || legacy::op_state(abi, state);
    let (ts, body) = match (h.kind(), state) {
        (Kind::ProxyStep, bindings::ncclProfilerProxyStepSendPeerWait_v4) => {
            if !first_peer_wait(h) {
                return;
            }
            (clock::now(), Some(Body::PeerWait))
        }
        (Kind::ProxyStep, bindings::ncclProfilerProxyStepSendWait) => {
            (ts, args.map(|a| Body::SendWait { bytes: a.trans_size() }))
        }
        (Kind::KernelCh, bindings::ncclProfilerKernelChStop) => {
            (ts, args.map(|a| Body::KernelChStop { gpu_stop: a.p_timer() }))
        }
        (Kind::KernelPhase, bindings::ncclProfilerKernelPhaseStop) => {
            (ts, args.map(|a| Body::PhaseStop { gpu_stop: a.p_timer() }))
        }
        (Kind::RecvStep, bindings::ncclProfilerProxyStepRecvGPUWait) => (clock::now(), Some(Body::GpuWait)),
        (Kind::RecvOp, bindings::ncclProfilerProxyOpInProgress_v4) => (ts, Some(Body::InProgress)),
        (Kind::RecvOp, bindings::ncclProfilerProxyOpSendPosted..=bindings::ncclProfilerProxyOpRecvDone)
            if op().is_some_and(OpState::counts_receive) =>
        {
            let received = op() == Some(OpState::RecvReceived);
            (
                ts,
                args.map(|a| Body::RecvCount {
                    received,
                    steps: a.steps(),
                }),
            )
        }
        (Kind::ProxyOp, bindings::ncclProfilerProxyOpSendPosted..=bindings::ncclProfilerProxyOpRecvDone)
            if op().is_some() =>
        {
            match (op(), args) {
                // The peer has not posted the receive: the wait of v4's SendPeerWait.
                (Some(OpState::SendRemFifoWait), Some(a)) if first_fifo_wait(h, a.steps()) => {
                    (clock::now(), Some(Body::PeerWait))
                }
                (Some(OpState::SendRemFifoWait), Some(_)) => return,
                (op, Some(a)) => match op.and_then(|op| op.mark(abi, a.steps())) {
                    Some(mark) => (
                        ts,
                        Some(Body::OpBytes {
                            mark,
                            total: a.trans_size(),
                        }),
                    ),
                    None => return,
                },
                (_, None) => (ts, None),
            }
        }
        // Bare and shed events: out of line.
        (Kind::ProxyOpBare | Kind::RecvOpBare | Kind::Shed, _) => return bare_state(owner, h, state, ts, abi),
        // ProxyStep send/receive waits but SendWait and RecvGPUWait; ProxyOp legacy states and
        // InProgress.
        (
            Kind::ProxyStep,
            bindings::ncclProfilerProxyStepSendGPUWait
            | bindings::ncclProfilerProxyStepRecvWait..=bindings::ncclProfilerProxyStepRecvGPUWait,
        )
        | (Kind::RecvStep, bindings::ncclProfilerProxyStepRecvWait | bindings::ncclProfilerProxyStepRecvFlushWait)
        | (
            Kind::ProxyOp,
            bindings::ncclProfilerProxyOpSendPosted..=bindings::ncclProfilerProxyOpRecvDone
            | bindings::ncclProfilerProxyOpInProgress_v4,
        )
        | (Kind::RecvOp, bindings::ncclProfilerProxyOpSendPosted..=bindings::ncclProfilerProxyOpRecvDone) => return,
        _ => {
            STATS.unknown_states.incr();
            return;
        }
    };
    let Some((_, comm)) = live(owner, h.comm_slot()) else {
        return;
    };
    match body {
        Some(body) => comm.append(h, ts, body),
        None => STATS.null_args.incr(),
    }
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::bindings::ncclSuccess;
    use crate::config::Config;
    use crate::nccl_log;
    use crate::record::CommMeta;

    #[test]
    fn a_panic_disables_the_communicator_and_its_last_finalize_still_flushes() {
        clock::init();
        let meta = CommMeta {
            hash: 0xBAD,
            name: "panic".into(),
            rank: 0,
            nranks: 2,
            nnodes: 1,
            gpu: Default::default(),
        };
        let _serial = comm::TESTS.lock();
        let id = crate::telemetry::consumer::register(meta, Config::global()).expect("a free slot");
        let context = Context::new(id, 0xBAD).encode();
        let before = STATS.panics.get();
        let rc = guarded(|owner| {
            local(owner, context);
            panic!("injected")
        });
        assert_eq!(rc, ncclSuccess);
        assert_eq!(STATS.panics.get(), before + 1);
        assert!(comm::get(id).is_none(), "the communicator is disabled");
        // Its `finalize`, the last one, still ends the process's profiling: the flush runs and
        // NCCL's logger is forgotten (this test is the only one registering communicators).
        // SAFETY: the fake logger is never called here (nothing logs at WARN in this test).
        unsafe { nccl_log::set_logger(Some(fake_logger())) };
        // SAFETY: a context value, as NCCL passes it back.
        let rc = unsafe { super::super::lifecycle::finalize(context as *mut std::ffi::c_void) };
        assert_eq!(rc, ncclSuccess);
        assert!(
            !nccl_log::logger_set(),
            "the last finalize ran its end-of-process steps"
        );
    }

    /// A logger value that is never called here (nothing logs at WARN in this test).
    fn fake_logger() -> unsafe extern "C" fn(
        crate::bindings::ncclDebugLogLevel,
        std::ffi::c_ulong,
        *const std::ffi::c_char,
        std::ffi::c_int,
        *const std::ffi::c_char,
        ...
    ) {
        unsafe extern "C" fn ignore(
            _: crate::bindings::ncclDebugLogLevel,
            _: std::ffi::c_ulong,
            _: *const std::ffi::c_char,
            _: std::ffi::c_int,
            _: *const std::ffi::c_char,
            _: *const std::ffi::c_char,
        ) {
        }
        // SAFETY: only stored and compared with NULL; on x86_64 and aarch64 a call with six
        // integer arguments would even pass them as the variadic signature does.
        unsafe { std::mem::transmute(ignore as unsafe extern "C" fn(_, _, _, _, _, _)) }
    }
}

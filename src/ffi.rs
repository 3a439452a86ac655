//! The exported `ncclProfiler_v4` table and its `extern "C"` callbacks.
//!
//! Every entry point runs inside [`guarded`] (a panic is caught, counted and answered with
//! `ncclSuccess`), writes its out-parameters first (`*eHandle`, `*context` = NULL), tolerates
//! NULL, stale, foreign and unknown inputs (counted in [`STATS`]) and returns `ncclSuccess`.
//! `init` never fails: a communicator we cannot profile gets a NULL context (spec 1.4).
//! The bodies are generic over the ABI version's [`Descriptor`] and [`StateArgs`] adapters.
//! Threads: `init` on NCCL's init threads; start/state/stop on user and proxy threads (lock-free,
//! allocation-free); `finalize` on the thread freeing the communicator.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::cell::Cell;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicI32, Ordering};

use crate::abi::v4::{DescrV4, StateArgsV4};
use crate::abi::{Descriptor, StateArgs};
use crate::aggregate::CommMeta;
use crate::bindings::{
    ncclDebugLogger_t, ncclProfileColl, ncclProfileGroup, ncclProfileKernelCh, ncclProfileP2p, ncclProfileProxyOp,
    ncclProfileProxyStep, ncclProfiler_v4_t, ncclProfilerEventDescr_v4_t, ncclProfilerEventState_t,
    ncclProfilerEventStateArgs_v4_t, ncclProfilerKernelChStop, ncclProfilerProxyStepSendWait, ncclResult_t,
    ncclSuccess,
};
use crate::comm::{self, Comm};
use crate::config::Config;
use crate::event::{Body, Func, ProxyOpStart};
use crate::handle::{CommId, Context, Handle, Kind};
use crate::stats::STATS;
use crate::{clock, nccl_log, telemetry};

/// The exported function table: `#[repr(transparent)]` so its symbol has the C layout.
#[repr(transparent)]
pub struct Table<T>(pub T);

// SAFETY: the only non-`Sync` field is `name`, a pointer to a `'static` C string literal that is
// never written; the rest are function pointers.
unsafe impl<T> Sync for Table<T> {}

/// Profiler API v4, found by NCCL 2.27 and later.
#[unsafe(no_mangle)]
pub static ncclProfiler_v4: Table<ncclProfiler_v4_t> = Table(ncclProfiler_v4_t {
    name: c"otel".as_ptr(),
    init: Some(init_v4),
    startEvent: Some(start_event_v4),
    stopEvent: Some(stop_event),
    recordEventState: Some(record_event_state_v4),
    finalize: Some(finalize),
});

/// Time of records whose time nothing uses (ProxyOp, ProxyStep, KernelCh starts; Coll, P2p,
/// KernelCh stops; KernelChStop): the clock is not read for them.
const UNTIMED: u64 = 0;

/// Our process id, for telling PXN ops from other processes apart (set by `init`).
static OWN_PID: AtomicI32 = AtomicI32::new(0);

/// Event types that are known but never recorded (Group gets a handle of its own).
const DECLINED_TYPES: u64 = 0x20 | 0x80 | 0x7F00;

/// The communicator a callback resolved so far: a panic after that point disables it, and only
/// it (never one a foreign PXN context happens to name).
type Owner = Cell<Option<(CommId, &'static Comm)>>;

/// Runs a callback body; a panic is counted, disables the communicator the body resolved, and the
/// callback still reports success.
fn guarded(body: impl FnOnce(&Owner)) -> ncclResult_t {
    let owner = Owner::new(None);
    if catch_unwind(AssertUnwindSafe(|| body(&owner))).is_err() {
        STATS.panics.incr();
        if let Some((id, comm)) = owner.get() {
            comm.disable(id);
        }
    }
    ncclSuccess
}

unsafe extern "C" fn init_v4(
    context: *mut *mut c_void,
    activation_mask: *mut c_int,
    comm_name: *const c_char,
    comm_hash: u64,
    n_nodes: c_int,
    nranks: c_int,
    rank: c_int,
    logfn: ncclDebugLogger_t,
) -> ncclResult_t {
    guarded(|_| {
        if context.is_null() {
            STATS.null_args.incr();
            return;
        }
        // SAFETY: NCCL passes the address of the communicator's context slot (checked non-NULL).
        unsafe { *context = std::ptr::null_mut() };
        // SAFETY: `comm_name` is NULL or the user's NUL-terminated `config.commName`, valid for
        // this call; we copy it.
        let name = (!comm_name.is_null()).then(|| unsafe { CStr::from_ptr(comm_name) }.to_string_lossy().into_owned());
        let meta = CommMeta {
            hash: comm_hash,
            name: name.unwrap_or_default(),
            rank,
            nranks,
            nnodes: n_nodes,
        };
        let Some((ctx, mask)) = init(meta, logfn) else { return };
        // SAFETY: `context` was checked non-NULL above.
        unsafe { *context = ctx as *mut c_void };
        if !activation_mask.is_null() {
            // SAFETY: NCCL passes the address of its process-wide mask `int`, which it reads with
            // relaxed atomic loads; it is aligned and lives as long as libnccl.
            unsafe { AtomicI32::from_ptr(activation_mask) }.store(mask, Ordering::Relaxed);
        }
    })
}

/// Version-neutral `init`: returns the context value and activation mask, or `None` to leave the
/// communicator unprofiled (NULL context, success). In a forked child of a profiled process the
/// plugin is inert: no lock, no log, no thread (the parent's threads and lock owners are gone).
fn init(meta: CommMeta, logfn: ncclDebugLogger_t) -> Option<(u64, i32)> {
    if telemetry::forked() {
        return None;
    }
    nccl_log::set_logger(logfn);
    nccl_log::install();
    let config = Config::global();
    for warning in Config::take_warnings() {
        tracing::warn!("{warning}");
    }
    if meta.rank == 0 {
        tracing::info!("{}", config.describe());
    }
    if !config.enable {
        return None;
    }
    // SAFETY: `getpid` has no preconditions.
    OWN_PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
    clock::init();
    if config.telemetry_enable && telemetry::start() {
        register_exit_flush();
    }
    let hash = meta.hash;
    let Some(id) = comm::register(meta, config) else {
        tracing::warn!("no communicator slot or memory left; this communicator is not profiled");
        return None;
    };
    Some((Context::new(id, hash).encode(), config.event_mask))
}

unsafe extern "C" fn start_event_v4(
    context: *mut c_void,
    handle: *mut *mut c_void,
    descr: *mut ncclProfilerEventDescr_v4_t,
) -> ncclResult_t {
    // SAFETY: NCCL passes a valid descriptor pointer or NULL; `DescrV4` is `repr(transparent)`.
    guarded(|owner| unsafe { start_event(owner, context as u64, handle, descr.cast::<DescrV4>()) })
}

/// # Safety
/// `handle` is NULL or writable; `descr` is NULL or points to a descriptor NCCL filled for this
/// call.
unsafe fn start_event<D: Descriptor>(owner: &Owner, context: u64, handle: *mut *mut c_void, descr: *const D) {
    if handle.is_null() {
        STATS.null_args.incr();
        return;
    }
    // SAFETY: checked non-NULL; NCCL passes the address of its handle slot.
    unsafe { *handle = std::ptr::null_mut() };
    // SAFETY: NULL or valid for the duration of this call, per this function's contract.
    let Some(d) = (unsafe { descr.as_ref() }) else {
        STATS.null_args.incr();
        return;
    };
    if let Some(h) = start(owner, context, d) {
        // SAFETY: as above.
        unsafe { *handle = h as *mut c_void };
    }
}

/// Records a start; the new handle, or `None` when declined, invalid or dropped (all counted).
fn start<D: Descriptor>(owner: &Owner, context: u64, d: &D) -> Option<u64> {
    let ty = d.event_type();
    // Only a Coll/P2p start time is used (a collective's duration starts there).
    let ts = if ty == u64::from(ncclProfileColl) || ty == u64::from(ncclProfileP2p) {
        clock::now()
    } else {
        UNTIMED
    };
    let declined = || {
        STATS.declined.incr();
        None
    };
    if ty == u64::from(ncclProfileProxyOp) {
        return start_proxy_op(owner, context, d);
    }
    if ty == u64::from(ncclProfileProxyStep) {
        let Some(parent) = own_parent(d.parent(), &[Kind::ProxyOp]) else {
            return declined();
        };
        let (comm, step) = (live(owner, parent.comm)?, d.proxy_step()?);
        let body = Body::ProxyStep {
            parent: parent.encode(),
            step,
        };
        return comm.start(parent.comm, Kind::ProxyStep, Some(parent), UNTIMED, body);
    }
    if ty == u64::from(ncclProfileKernelCh) {
        let Some(parent) = own_parent(d.parent(), &[Kind::Coll, Kind::P2p]) else {
            return declined();
        };
        let (comm, (channel, gpu_start)) = (live(owner, parent.comm)?, d.kernel_ch()?);
        let body = Body::KernelCh {
            parent: parent.encode(),
            channel,
            gpu_start,
        };
        return comm.start(parent.comm, Kind::KernelCh, Some(parent), UNTIMED, body);
    }
    if ty & DECLINED_TYPES != 0 && ty.is_power_of_two() {
        return declined();
    }
    let (id, comm) = local(owner, context)?;
    if ty == u64::from(ncclProfileGroup) {
        STATS.declined.incr(); // a handle, but no record
        return Some(
            Handle {
                comm: id,
                window: 0,
                epoch: 0,
                kind: Kind::Group,
                slot: 0,
            }
            .encode(),
        );
    }
    if ty == u64::from(ncclProfileColl) {
        return comm.start(id, Kind::Coll, None, ts, Body::Coll(d.coll()?));
    }
    if ty == u64::from(ncclProfileP2p) {
        return match d.p2p()? {
            (Func::Recv, _) => declined(),
            (_, p2p) => comm.start(id, Kind::P2p, None, ts, Body::P2p(p2p)),
        };
    }
    STATS.unknown_types.incr();
    None
}

/// A ProxyOp start. Receive ops are declined (they would only distort send-side figures, and
/// non-NET receive ops are never stopped). A PXN op (pid not ours) carries another process's
/// context and parent: neither is decoded as ours; the op is attributed to our communicator
/// with the same hash, under the originating rank.
fn start_proxy_op<D: Descriptor>(owner: &Owner, context: u64, d: &D) -> Option<u64> {
    let op = d.proxy_op()?;
    if !op.is_send {
        STATS.declined.incr();
        return None;
    }
    let (id, comm, parent) = if op.pid == OWN_PID.load(Ordering::Relaxed) {
        let (id, comm) = local(owner, context)?;
        (
            id,
            comm,
            own_parent(d.parent(), &[Kind::Coll, Kind::P2p]).filter(|p| p.comm == id),
        )
    } else {
        // Only the hash bits of a foreign context are used, never its slot or generation.
        let Some((id, comm)) = Context::decode(context).and_then(|c| comm::find_by_hash_tag(c.hash_tag)) else {
            STATS.foreign_unmatched.incr();
            return None;
        };
        STATS.foreign_ops.incr();
        owner.set(Some((id, comm)));
        (id, comm, None)
    };
    let body = Body::ProxyOp(ProxyOpStart {
        parent: parent.map_or(0, Handle::encode),
        rank: op.rank,
        peer: op.peer,
        n_steps: op.n_steps,
        chunk_size: op.chunk_size,
        channel: op.channel,
    });
    comm.start(id, Kind::ProxyOp, parent, UNTIMED, body)
}

/// Our live communicator behind a context (slot, generation and hash tag all match); counted as
/// NULL or stale otherwise.
fn local(owner: &Owner, context: u64) -> Option<(CommId, &'static Comm)> {
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

/// The live communicator `id`; counted as stale otherwise.
fn live(owner: &Owner, id: CommId) -> Option<&'static Comm> {
    let comm = comm::get(id);
    match comm {
        Some(c) => owner.set(Some((id, c))),
        None => STATS.stale.incr(),
    }
    comm
}

/// `parentObj` decoded as one of our handles of the given kinds; `None` for NULL or anything else.
fn own_parent(parent: u64, kinds: &[Kind]) -> Option<Handle> {
    Handle::decode(parent).filter(|h| kinds.contains(&h.kind))
}

/// Our handle behind `eHandle` with its live communicator; counted when NULL or stale.
fn event(owner: &Owner, handle: *mut c_void) -> Option<(Handle, &'static Comm)> {
    if handle.is_null() {
        STATS.null_args.incr();
        return None;
    }
    let Some(h) = Handle::decode(handle as u64) else {
        STATS.stale.incr();
        return None;
    };
    Some((h, live(owner, h.comm)?))
}

unsafe extern "C" fn stop_event(handle: *mut c_void) -> ncclResult_t {
    // Only ProxyStep (transfer end) and ProxyOp (collective end) stop times are used; read the
    // clock before anything else so the time is the callback's.
    let timed = Handle::decode(handle as u64).is_some_and(|h| matches!(h.kind, Kind::ProxyOp | Kind::ProxyStep));
    let ts = if timed { clock::now() } else { UNTIMED };
    guarded(|owner| {
        if let Some((h, comm)) = event(owner, handle).filter(|(h, _)| h.kind != Kind::Group) {
            comm.append(h, ts, Body::Stop);
        }
    })
}

unsafe extern "C" fn record_event_state_v4(
    handle: *mut c_void,
    state: ncclProfilerEventState_t,
    args: *mut ncclProfilerEventStateArgs_v4_t,
) -> ncclResult_t {
    // Only SendWait's time is used (a transfer starts there); read it first.
    let ts = if state == ncclProfilerProxyStepSendWait {
        clock::now()
    } else {
        UNTIMED
    };
    guarded(|owner| {
        // SAFETY: NCCL passes NULL or valid state args for this call; `StateArgsV4` is transparent.
        let args = unsafe { args.cast::<StateArgsV4>().as_ref() };
        record_event_state(owner, handle, state, args, ts)
    })
}

/// States we record: SendWait (bytes of a send step) and KernelChStop (GPU stop time). Other
/// states NCCL defines for the event's type are ignored; unknown ones are counted.
fn record_event_state<A: StateArgs>(
    owner: &Owner,
    handle: *mut c_void,
    state: ncclProfilerEventState_t,
    args: Option<&A>,
    ts: u64,
) {
    let Some((h, comm)) = event(owner, handle) else { return };
    let body = match (h.kind, state) {
        (Kind::ProxyStep, s) if s == ncclProfilerProxyStepSendWait => {
            args.map(|a| Body::SendWait { bytes: a.trans_size() })
        }
        (Kind::KernelCh, s) if s == ncclProfilerKernelChStop => {
            args.map(|a| Body::KernelChStop { gpu_stop: a.p_timer() })
        }
        // ProxyStep send/receive states 8–12 and 20; ProxyOp legacy states 0–7 and InProgress (19).
        (Kind::ProxyStep, 8..=12 | 20) | (Kind::ProxyOp, 0..=7 | 19) => return,
        _ => {
            STATS.unknown_states.incr();
            return;
        }
    };
    match body {
        Some(body) => comm.append(h, ts, body),
        None => STATS.null_args.incr(),
    }
}

unsafe extern "C" fn finalize(context: *mut c_void) -> ncclResult_t {
    guarded(|owner| {
        // A forked child must not touch state whose locks the parent's threads may hold.
        if telemetry::forked() {
            return;
        }
        let Some((id, comm)) = local(owner, context as u64) else {
            return;
        };
        if let Some(summaries) = comm.finalize(id, clock::secs_per_tick()) {
            telemetry::deliver(&summaries);
        }
        if !comm::all().any(Comm::is_live) {
            // The last communicator: export what is left, waiting at most the export timeout
            // even when the collector hangs, and not at all while exports are failing.
            telemetry::flush(telemetry::flush_deadline(), false, telemetry::Wait::IfHealthy);
            // NCCL may unload libnccl after its last communicator: forget its logger.
            nccl_log::clear_logger();
        }
    })
}

/// Registers [`exit_flush`] with `atexit` once per process.
fn register_exit_flush() {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: `exit_flush` is a plain `extern "C" fn()` that never unwinds, and this library is
        // never unmapped (`-z nodelete`, see build.rs), so the pointer stays valid until exit.
        if unsafe { libc::atexit(exit_flush) } != 0 {
            tracing::warn!("cannot register the exit flush; data of the last interval may be lost at exit");
        }
    });
}

/// At process exit without `finalize`: processes the live communicators' windows and exports them,
/// waiting at most the export timeout plus a margin. Inert in a forked child.
extern "C" fn exit_flush() {
    let _ = catch_unwind(|| {
        if !telemetry::forked() {
            telemetry::flush(telemetry::flush_deadline(), true, telemetry::Wait::Always);
        }
    });
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_caught_counted_and_disables_the_communicator() {
        clock::init();
        let meta = CommMeta {
            hash: 0xBAD,
            name: "panic".into(),
            rank: 0,
            nranks: 2,
            nnodes: 1,
        };
        let id = comm::register(meta, Config::global()).expect("a free slot");
        let context = Context::new(id, 0xBAD).encode();
        let before = STATS.panics.get();
        let rc = guarded(|owner| {
            local(owner, context);
            panic!("injected")
        });
        assert_eq!(rc, ncclSuccess);
        assert_eq!(STATS.panics.get(), before + 1);
        assert!(comm::get(id).is_none(), "the communicator is disabled");
    }
}

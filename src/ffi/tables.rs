//! The exported tables NCCL looks up (`ncclProfiler_v4`) and their version-specific `extern "C"`
//! shims, which read the C arguments and call the generic bodies in [`super::events`] and
//! [`super::lifecycle`]. Called on: NCCL's init, user and proxy threads.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::ffi::{CStr, c_char, c_int, c_void};

use super::events::{UNTIMED, record_event_state, start_event, stop_event};
use super::guard::guarded;
use super::lifecycle::{finalize, init};
use crate::abi::v4::{DescrV4, StateArgsV4};
use crate::aggregate::CommMeta;
use crate::bindings::{
    ncclDebugLogger_t, ncclProfiler_v4_t, ncclProfilerEventDescr_v4_t, ncclProfilerEventState_t,
    ncclProfilerEventStateArgs_v4_t, ncclProfilerProxyStepSendWait, ncclResult_t,
};
use crate::clock;
use crate::stats::STATS;

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
        let Some(ctx) = init(meta, logfn, activation_mask) else {
            return;
        };
        // SAFETY: `context` was checked non-NULL above.
        unsafe { *context = ctx as *mut c_void };
    })
}

unsafe extern "C" fn start_event_v4(
    context: *mut c_void,
    handle: *mut *mut c_void,
    descr: *mut ncclProfilerEventDescr_v4_t,
) -> ncclResult_t {
    // SAFETY: NCCL passes a valid descriptor pointer or NULL; `DescrV4` is `repr(transparent)`.
    guarded(|owner| unsafe { start_event(owner, context as u64, handle, descr.cast::<DescrV4>()) })
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

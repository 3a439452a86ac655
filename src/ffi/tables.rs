//! The exported tables NCCL looks up (`ncclProfiler_v1` to `ncclProfiler_v7`; NCCL takes the
//! newest it knows, spec 1.3 and 7.4) and their `extern "C"` shims, one generic shim per callback:
//! they read the C arguments and call the generic bodies in [`super::events`] and
//! [`super::lifecycle`]. Called on: NCCL's init, user and proxy threads.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::ffi::{CStr, c_char, c_int, c_void};

use super::events::{record_event_state, start_event, stop_event};
use super::guard::guarded;
use super::lifecycle::{finalize, init};
use super::roots::UNTIMED;
use crate::abi::legacy::{self, OpState};
use crate::abi::{Abi, Descriptor, Filled, StateArgs};
use crate::bindings::{
    ncclDebugLogger_t, ncclProfiler_v1_t, ncclProfiler_v2_t, ncclProfiler_v3_t, ncclProfiler_v4_t, ncclProfiler_v5_t,
    ncclProfiler_v6_t, ncclProfiler_v7_t, ncclProfilerEventState_t, ncclProfilerProxyStepSendWait, ncclResult_t,
};
use crate::clock;
use crate::record::CommMeta;
use crate::stats::STATS;

/// The exported function table: `#[repr(transparent)]` so its symbol has the C layout. Built
/// only here, over the profiler table types ([`ProfilerTable`]).
#[repr(transparent)]
pub struct Table<T>(T);

impl<T> Table<T> {
    /// The table NCCL reads.
    pub const fn get(&self) -> &T {
        &self.0
    }
}

mod sealed {
    /// Implemented by the bindings' profiler tables only.
    pub trait Sealed {}
}

/// A profiler table of the bindings (or the padded v7 one): function pointers, a `name` pointer
/// and NULL padding, nothing else.
pub trait ProfilerTable: sealed::Sealed {}

macro_rules! profiler_tables {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl ProfilerTable for $t {}
    )*};
}
profiler_tables!(
    ncclProfiler_v1_t,
    ncclProfiler_v2_t,
    ncclProfiler_v3_t,
    ncclProfiler_v4_t,
    ncclProfiler_v5_t,
    ncclProfiler_v6_t,
    Padded<ncclProfiler_v7_t>
);

// SAFETY: a `ProfilerTable`'s only non-`Sync` fields are `name`, a pointer to a `'static` C
// string literal that is never written, and NULL padding; the rest are function pointers. The
// field is private and every `Table` is one of the immutable statics below.
unsafe impl<T: ProfilerTable> Sync for Table<T> {}

/// A table followed by two NULL pointers. Two unreleased designs that reuse the name
/// `ncclProfiler_v7` give the table a seventh (and eighth) entry and read NULL there as "not
/// provided" (spec 8.x.4): with the padding, no NCCL reads past our object.
#[repr(C)]
pub struct Padded<T> {
    /// The table as NCCL 2.31.2 defines it (six entries).
    pub table: T,
    /// NULL, for the entries other definitions append.
    pub reserved: [*const c_void; 2],
}

/// The six entries every version shares, for a version's table type, its `init` and its
/// number.
macro_rules! table {
    ($t:ident, $init:expr, $abi:literal) => {
        $t {
            name: c"otel".as_ptr(),
            init: Some($init),
            startEvent: Some(start_event_shim),
            stopEvent: Some(stop_event::<$abi>),
            recordEventState: Some(record_event_state_shim::<_, $abi>),
            finalize: Some(finalize),
        }
    };
}

/// Profiler API v1: used by NCCL 2.23.
#[unsafe(no_mangle)]
pub static ncclProfiler_v1: Table<ncclProfiler_v1_t> = Table(table!(ncclProfiler_v1_t, init_v1::<1>, 1));

/// Profiler API v2: used by NCCL 2.24 and 2.25.
#[unsafe(no_mangle)]
pub static ncclProfiler_v2: Table<ncclProfiler_v2_t> = Table(table!(ncclProfiler_v2_t, init_v1::<2>, 2));

/// Profiler API v3: used by NCCL 2.26.
#[unsafe(no_mangle)]
pub static ncclProfiler_v3: Table<ncclProfiler_v3_t> = Table(table!(ncclProfiler_v3_t, init_v1::<3>, 3));

/// Profiler API v4: used by NCCL 2.27.
#[unsafe(no_mangle)]
pub static ncclProfiler_v4: Table<ncclProfiler_v4_t> = Table(table!(ncclProfiler_v4_t, init_v4, 4));

/// Profiler API v5: used by NCCL 2.28.
#[unsafe(no_mangle)]
pub static ncclProfiler_v5: Table<ncclProfiler_v5_t> = Table(table!(ncclProfiler_v5_t, init_v5::<5>, 5));

/// Profiler API v6: used by NCCL 2.29 and 2.30.
#[unsafe(no_mangle)]
pub static ncclProfiler_v6: Table<ncclProfiler_v6_t> = Table(table!(ncclProfiler_v6_t, init_v5::<6>, 6));

/// Profiler API v7 as released in NCCL 2.31.2: used by NCCL 2.31 and later.
#[unsafe(no_mangle)]
pub static ncclProfiler_v7: Table<Padded<ncclProfiler_v7_t>> = Table(Padded {
    table: table!(ncclProfiler_v7_t, init_v5::<7>, 7),
    reserved: [std::ptr::null(); 2],
});

/// `init` of v1 to v3 (`ABI`): no communicator identity (its hash and our rank come with its
/// first Coll/P2p, its size never) and no logger.
unsafe extern "C" fn init_v1<const ABI: u8>(context: *mut *mut c_void, activation_mask: *mut c_int) -> ncclResult_t {
    // SAFETY: NCCL's arguments, passed on; the rest stands for "unknown".
    unsafe { init_shim(ABI, context, 0, activation_mask, std::ptr::null(), 0, 0, -1, None) }
}

/// `init` of v4: the communicator's hash comes after its name.
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
    // SAFETY: NCCL's arguments, passed on.
    unsafe {
        init_shim(
            4,
            context,
            comm_hash,
            activation_mask,
            comm_name,
            n_nodes,
            nranks,
            rank,
            logfn,
        )
    }
}

/// `init` of v5 to v7 (`ABI`): the communicator's hash comes second.
unsafe extern "C" fn init_v5<const ABI: u8>(
    context: *mut *mut c_void,
    comm_id: u64,
    activation_mask: *mut c_int,
    comm_name: *const c_char,
    n_nodes: c_int,
    nranks: c_int,
    rank: c_int,
    logfn: ncclDebugLogger_t,
) -> ncclResult_t {
    // SAFETY: NCCL's arguments, passed on.
    unsafe {
        init_shim(
            ABI,
            context,
            comm_id,
            activation_mask,
            comm_name,
            n_nodes,
            nranks,
            rank,
            logfn,
        )
    }
}

/// # Safety
/// `context` is NULL or NCCL's context slot; `comm_name` NULL or a C string valid for the call.
#[allow(clippy::too_many_arguments)] // NCCL's `init` arguments, one to one
unsafe fn init_shim(
    abi: u8,
    context: *mut *mut c_void,
    comm_hash: u64,
    activation_mask: *mut c_int,
    comm_name: *const c_char,
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
            gpu: Default::default(), // `init` asks the driver, once enabled
        };
        // SAFETY: `logfn` and `activation_mask` are this `init`'s arguments from NCCL, passed on.
        let Some(ctx) = (unsafe { init(meta, logfn, activation_mask, abi) }) else {
            return;
        };
        // SAFETY: `context` was checked non-NULL above.
        unsafe { *context = ctx as *mut c_void };
    })
}

/// `startEvent` of every version, over its descriptor type `D`.
unsafe extern "C" fn start_event_shim<D>(context: *mut c_void, handle: *mut *mut c_void, descr: *mut D) -> ncclResult_t
where
    Filled<D>: Descriptor,
{
    // SAFETY: NCCL passes a valid descriptor pointer of its table's version, or NULL.
    guarded(|owner| unsafe { start_event(owner, context as u64, handle, descr.cast_const()) })
}

/// `recordEventState` of every version, over its state-argument type `A` and its number.
unsafe extern "C" fn record_event_state_shim<A: StateArgs, const ABI: u8>(
    handle: *mut c_void,
    state: ncclProfilerEventState_t,
    args: *mut A,
) -> ncclResult_t {
    // The times of transfer edges (SendWait, the ends of v1–v3 transfers): read the clock first.
    // SendPeerWait reads it only once its repeat check let it through (NCCL may repeat it
    // thousands of times per step).
    let abi = Abi::table(ABI);
    let edge =
        state == ncclProfilerProxyStepSendWait || legacy::op_state(abi, state).is_some_and(OpState::ends_transfer);
    let ts = if edge { clock::now() } else { UNTIMED };
    guarded(|owner| {
        // SAFETY: NCCL passes NULL or valid state args of its table's version for this call.
        let args = unsafe { args.as_ref() };
        record_event_state(owner, handle, state, args, ts, abi)
    })
}

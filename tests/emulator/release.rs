//! The NCCL release the emulator claims to be: its `ncclGetVersion`, which the plugin finds in
//! this executable's dynamic symbol table (build.rs exports it from tests, benches and
//! examples) as it finds libnccl's in a real job. Process-wide, like NCCL's: set it before the
//! first `init` of a test binary that needs another release than 2.30.7.

use std::ffi::c_int;
use std::sync::atomic::{AtomicI32, Ordering};

use nccl_profiler_otel::bindings::{ncclInvalidArgument, ncclResult_t, ncclSuccess};

/// NCCL 2.30.7, the release whose call orders the emulator follows (`NCCL_VERSION_CODE`).
pub const NCCL_2_30_7: i32 = 23007;
/// NCCL 2.31.2: KernelCh costs 4–13 % of GPU time there (spec 7.3.6).
pub const NCCL_2_31_2: i32 = 23102;

static CODE: AtomicI32 = AtomicI32::new(NCCL_2_30_7);

/// Makes `ncclGetVersion` report `code` from now on.
pub fn set(code: i32) {
    CODE.store(code, Ordering::Relaxed);
}

/// NCCL's `ncclGetVersion`: writes `NCCL_VERSION_CODE`.
///
/// # Safety
/// `version` is NULL or a writable `int`, as NCCL's callers guarantee.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> ncclResult_t {
    if version.is_null() {
        return ncclInvalidArgument;
    }
    // SAFETY: checked non-NULL; the caller passes a writable int.
    unsafe { *version = CODE.load(Ordering::Relaxed) };
    ncclSuccess
}

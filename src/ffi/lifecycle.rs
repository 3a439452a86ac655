//! The generic bodies of `init` and `finalize`, and the exit flush: a communicator is registered
//! (starting the telemetry and export threads on the first `init`) and, when it is freed, its last
//! windows are processed and, after the last one, exported within a bounded wait.
//! Called on: NCCL's init thread, the thread freeing a communicator, the exiting thread.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::ffi::{c_int, c_void};
use std::panic::catch_unwind;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use super::events::{OWN_PID, local};
use super::guard::guarded;
use crate::abi::{self, Abi};
use crate::activation;
use crate::bindings::{ncclDebugLogger_t, ncclResult_t};
use crate::comm::{self, Comm};
use crate::config::Config;
use crate::record::CommMeta;
use crate::record::handle::Context;
use crate::telemetry::consumer;
use crate::{clock, cuda, export, nccl_log, nccl_version, telemetry};

/// Version-neutral `init` (`version`: the profiler ABI version of the table NCCL chose): returns
/// the context value, having stored the activation mask due now into `mask` (NCCL's process-wide
/// mask, or NULL), or `None` to leave the communicator
/// unprofiled (NULL context, success, mask untouched). The first profiled `init` fixes the
/// process's ABI description ([`Abi`]) from the version, the NCCL release and the configuration,
/// and the activation plan from it. In a forked child of a profiled process
/// the plugin is inert: no lock, no log, no thread (the parent's threads and lock owners are gone).
///
/// # Safety
/// `logfn` and `mask` are what NCCL passed to this `init`: a logger NCCL keeps valid while it is
/// loaded (or NULL), and NULL or NCCL's activation mask (see [`activation::attach`]).
pub(super) unsafe fn init(mut meta: CommMeta, logfn: ncclDebugLogger_t, mask: *mut c_int, version: u8) -> Option<u64> {
    if telemetry::forked() {
        return None;
    }
    // SAFETY: `logfn` is NCCL's logger, by this function's contract.
    unsafe { nccl_log::set_logger(logfn) };
    nccl_log::install();
    let config = Config::global();
    for warning in Config::take_warnings() {
        tracing::info!("{warning}");
    }
    // Rank −1: v1–v3, whose `init` does not tell.
    if meta.rank <= 0 {
        tracing::info!("{}", config.describe());
    }
    if !config.enable {
        return None;
    }
    // SAFETY: `getpid` has no preconditions.
    OWN_PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
    clock::init();
    meta.gpu = cuda::current_gpu();
    if config.telemetry_enable && telemetry::start(|| export::install(config)) {
        register_exit_flush();
    }
    let hash = meta.hash;
    let Some(id) = consumer::register(meta, config) else {
        tracing::warn!("no communicator slot or memory left; this communicator is not profiled");
        return None;
    };
    let plan = || {
        let nccl = nccl_version::detect(logfn);
        let abi = Abi::new(
            version,
            nccl,
            config.v7_extensions,
            abi::description::allgatherv_enabled(),
        );
        abi.install();
        activation::plan(config, abi, nccl)
    };
    // SAFETY: `mask` is NULL or NCCL's activation mask, by this function's contract.
    unsafe { activation::attach(mask, plan, SystemTime::now()) };
    telemetry::wake(); // parked while no communicator was live
    Some(Context::new(id, hash).encode())
}

pub(super) unsafe extern "C" fn finalize(context: *mut c_void) -> ncclResult_t {
    guarded(|owner| {
        // A forked child must not touch state whose locks the parent's threads may hold.
        if telemetry::forked() {
            return;
        }
        // A communicator disabled by a caught panic has nothing left to process, but when it
        // is the last one, the others' last interval is still to be exported.
        if let Some((id, comm)) = local(owner, context as u64)
            && let Some(summaries) = consumer::slot(comm).and_then(|s| s.finalize(id, clock::secs_per_tick()))
        {
            telemetry::deliver(&summaries);
        }
        if activation::detach(|| !comm::all().any(Comm::is_live)) {
            // The last communicator: export what is left, waiting at most the export timeout
            // even when the collector hangs, and not at all while exports are failing.
            telemetry::flush(telemetry::flush_deadline(), false);
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

/// At process exit: processes the live communicators' windows and exports them, waiting at most
/// the export timeout plus a margin, and not at all while exports fail or an earlier flush (the
/// last `finalize`'s) is still waiting for a hung collector. Inert in a forked child.
extern "C" fn exit_flush() {
    let _ = catch_unwind(|| {
        if !telemetry::forked() {
            telemetry::flush(telemetry::flush_deadline(), true);
        }
    });
}

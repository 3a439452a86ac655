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
use crate::abi::{self, v7};
use crate::activation::{self, Plan};
use crate::aggregate::CommMeta;
use crate::bindings::{
    ncclDebugLogger_t, ncclProfileCeColl, ncclProfileColl, ncclProfileProxyOp, ncclProfileProxyStep, ncclResult_t,
};
use crate::comm::{self, Comm};
use crate::config::Config;
use crate::nccl_version::{self, NcclVersion};
use crate::record::handle::Context;
use crate::{clock, export, nccl_log, telemetry};

/// The Coll, CeColl, ProxyOp and ProxyStep bits of the activation mask.
const COLL: i32 = ncclProfileColl as i32;
const CE_COLL: i32 = ncclProfileCeColl as i32;
const PROXY_OP: i32 = ncclProfileProxyOp as i32;
const PROXY_STEP: i32 = ncclProfileProxyStep as i32;

/// Version-neutral `init` (`abi`: the profiler ABI version of the table NCCL chose): returns the
/// context value, having stored the activation mask due now into `mask` (NCCL's process-wide
/// mask, or NULL), or `None` to leave the communicator
/// unprofiled (NULL context, success, mask untouched). In a forked child of a profiled process
/// the plugin is inert: no lock, no log, no thread (the parent's threads and lock owners are gone).
pub(super) fn init(meta: CommMeta, logfn: ncclDebugLogger_t, mask: *mut c_int, abi: u8) -> Option<u64> {
    if telemetry::forked() {
        return None;
    }
    // SAFETY: `logfn` is what NCCL passed to this `init` (the shims in `tables` pass it on).
    unsafe { nccl_log::set_logger(logfn) };
    nccl_log::install();
    let config = Config::global();
    for warning in Config::take_warnings() {
        tracing::warn!("{warning}");
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
    if config.telemetry_enable && telemetry::start(|| export::install(config)) {
        register_exit_flush();
    }
    let hash = meta.hash;
    let Some(id) = comm::register(meta, config) else {
        tracing::warn!("no communicator slot or memory left; this communicator is not profiled");
        return None;
    };
    activation::attach(mask, || plan(config, logfn, abi), SystemTime::now());
    telemetry::wake(); // parked while no communicator was live
    Some(Context::new(id, hash).encode())
}

/// The process's activation plan, made at its first profiled `init` and logged with the NCCL
/// release and the profiler ABI version NCCL chose: KernelCh's duty is
/// `NCCL_PROFILER_OTEL_KERNEL_CH_EVERY` or follows the release. The release and ABI also decide
/// what comes with the configured mask: CeColl with Coll from v6 (copy-engine collectives have
/// no other event); on v7, whether the fields only NCCL 2.31's layout has are read
/// (`NCCL_PROFILER_OTEL_V7_EXTENSIONS`) and, when they are, KernelPhase with KernelCh (the GPU
/// pays for phases with KernelCh on 2.31, spec 7.3.1); whether Broadcast is counted from its
/// API event (NCCL's AllGatherV path, 2.29+, spec 3.12); and whether CollApis are recorded for
/// the symmetric-memory collectives 2.29 and 2.30 run with API events only. On v1–v3 the bytes
/// are in ProxyOp states and no GPU time exists (spec 8.7): ProxyOp replaces ProxyStep, KernelCh
/// is not requested.
fn plan(config: &Config, logfn: ncclDebugLogger_t, abi: u8) -> Plan {
    let nccl = nccl_version::detect(logfn);
    let known_layout = nccl.is_some_and(|v| v.major == 2 && v.minor == 31);
    let extensions = abi == 7 && config.v7_extensions.unwrap_or(known_layout);
    v7::EXTENSIONS.store(extensions, Ordering::Relaxed);
    // A release that chose v6 or later is 2.29+ even when it cannot be named.
    let allgatherv = nccl.map_or(abi >= 6, |v| v >= NcclVersion::new(2, 29, 0))
        && std::env::var("NCCL_ALLGATHERV_ENABLE").map_or(true, |v| v.trim() != "0");
    abi::API_BROADCASTS.store(abi >= 5 && allgatherv, Ordering::Relaxed);
    // 2.29 and 2.30 (a release that chose v6 when it cannot be named).
    let api_only = nccl.map_or(abi == 6, |v| v.major == 2 && (29..=30).contains(&v.minor));
    abi::API_CALLS.store(abi >= 5 && api_only, Ordering::Relaxed);
    let mut mask = config.event_mask;
    if abi <= 3 {
        if mask & PROXY_STEP != 0 {
            mask |= PROXY_OP;
        }
        mask &= !(PROXY_STEP | activation::KERNEL_CH | activation::KERNEL_PHASE);
    }
    let mut implied = 0;
    if extensions && mask & activation::KERNEL_CH != 0 {
        implied |= activation::KERNEL_PHASE;
    }
    if abi >= 6 && mask & COLL != 0 {
        implied |= CE_COLL;
    }
    let plan = Plan {
        mask: mask | implied,
        every: config
            .kernel_ch_every
            .unwrap_or_else(|| activation::default_every(nccl, abi)),
        period: config.interval,
    };
    let release = nccl.map_or_else(|| "NCCL of unknown release".to_owned(), |v| format!("NCCL {v}"));
    tracing::info!(
        "{release} chose profiler ABI v{abi}: activation mask {:#x}, KernelCh (GPU times) requested {:.0} % of the time",
        plan.mask,
        plan.duty() * 100.0
    );
    if abi == 7 && !extensions {
        tracing::info!(
            "v7 descriptors are read as their v6 part (no userTag, KernelPhase or symmetric kernels): this NCCL's v7 layout is not known to be 2.31's; NCCL_PROFILER_OTEL_V7_EXTENSIONS=on reads them"
        );
    }
    plan
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
            && let Some(summaries) = comm.finalize(id, clock::secs_per_tick())
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

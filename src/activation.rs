//! NCCL's process-wide activation mask (spec 3.2) and the duty cycle of KernelCh.
//!
//! Every `init` passes the address of NCCL's one mask `int`; [`attach`] keeps it and stores the
//! mask due now. When KernelCh is sampled ([`Plan::every`] > 1), it is requested during the first
//! `1/every` of each telemetry interval, aligned on the wall clock so that every rank of a job
//! samples the same operations, and the telemetry thread's [`tick`] toggles bit 6 (with
//! KernelPhase, bit 15, which NCCL 2.31 refuses without it) and nothing else (the Coll/P2p bits
//! never change: NCCL double-stops stale API handles when they do, spec
//! 4.2). NCCL samples the mask at each API call, so an operation keeps the mask of its enqueue
//! and a captured CUDA graph that of its capture. A value in the mask that the plugin did not
//! write (NCCL's RAS override, spec 7.3.4) stops the toggling until the next `init`, with one
//! WARN per process. After the last `finalize`, [`detach`] forgets the address: libnccl may be
//! unloaded. [`plan`] decides the mask and the duty from the configuration and what the ABI
//! description ([`Abi`]) says. Called on: NCCL's init thread ([`plan`], [`attach`]), the thread
//! of the last `finalize` ([`detach`]), the telemetry thread ([`tick`], [`duty`]); never the hot
//! path.

use std::ffi::c_int;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;

use crate::abi::Abi;
use crate::bindings::{
    ncclProfileCeColl, ncclProfileColl, ncclProfileKernelCh, ncclProfileKernelPhase,
    ncclProfileProxyOp, ncclProfileProxyStep,
};
use crate::config::Config;
use crate::nccl_version::NcclVersion;

/// The KernelCh bit of the mask.
pub const KERNEL_CH: i32 = ncclProfileKernelCh as i32;
/// The KernelPhase bit of the mask (v7): toggled with KernelCh.
pub const KERNEL_PHASE: i32 = ncclProfileKernelPhase as i32;

/// The shortest time KernelCh is requested at a stretch: the telemetry thread toggles it on
/// 10 ms ticks, so shorter stretches would not be the fraction they claim.
const MIN_ON: Duration = Duration::from_millis(100);

/// How often KernelCh is requested: a part in `every` of each telemetry interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The configured mask (`NCCL_PROFILE_EVENT_MASK`).
    pub mask: i32,
    /// `NCCL_PROFILER_OTEL_KERNEL_CH_EVERY`, or [`default_every`] of the running NCCL.
    pub every: u32,
    /// The telemetry interval.
    pub period: Duration,
}

impl Plan {
    /// Whether KernelCh is toggled at all: the mask has it and it is not always on.
    fn samples(&self) -> bool {
        self.mask & KERNEL_CH != 0 && self.every > 1
    }

    /// How long KernelCh is requested per period: `period / every`, at least [`MIN_ON`].
    fn on_time(&self) -> Duration {
        (self.period / self.every.max(1)).max(MIN_ON).min(self.period)
    }

    /// The fraction of time KernelCh is requested: 0 without it in the mask.
    pub fn duty(&self) -> f64 {
        match (self.mask & KERNEL_CH != 0, self.samples()) {
            (false, _) => 0.0,
            (true, false) => 1.0,
            (true, true) => self.on_time().as_secs_f64() / self.period.as_secs_f64(),
        }
    }

    /// The mask due at wall-clock time `now`.
    pub fn due(&self, now: SystemTime) -> i32 {
        if !self.samples() {
            return self.mask;
        }
        let since = now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        let phase = since.as_nanos() % self.period.as_nanos().max(1);
        if phase < self.on_time().as_nanos() {
            self.mask
        } else {
            self.mask & !(KERNEL_CH | KERNEL_PHASE)
        }
    }
}

/// KernelCh's default duty: always on where it costs about 0.4–1 % of GPU time; one part in 10
/// where it costs 4–13 % ([`Abi::kernel_ch_costly`]).
pub fn default_every(abi: Abi) -> u32 {
    if abi.kernel_ch_costly() { 10 } else { 1 }
}

/// The process's activation plan, made at its first profiled `init` from its ABI description
/// and logged with the NCCL release `nccl` and the profiler ABI version NCCL chose: KernelCh's
/// duty is `NCCL_PROFILER_OTEL_KERNEL_CH_EVERY` or follows its cost ([`default_every`]). The
/// description also decides what comes with the configured mask: CeColl with Coll where
/// copy-engine events exist (copy-engine collectives have no other event); KernelPhase with
/// KernelCh where the v7 extension fields are read (the GPU pays for phases with KernelCh on
/// 2.31, spec 7.3.1). Where the bytes are in ProxyOp states, no GPU time exists (spec 8.7):
/// ProxyOp replaces ProxyStep, KernelCh is not requested.
/// Called on: NCCL's init thread (the first profiled `init`).
pub fn plan(config: &Config, abi: Abi, nccl: Option<NcclVersion>) -> Plan {
    const COLL: i32 = ncclProfileColl as i32;
    const CE_COLL: i32 = ncclProfileCeColl as i32;
    const PROXY_OP: i32 = ncclProfileProxyOp as i32;
    const PROXY_STEP: i32 = ncclProfileProxyStep as i32;
    let mut mask = config.event_mask;
    if abi.transfer_states() {
        if mask & PROXY_STEP != 0 {
            mask |= PROXY_OP;
        }
        mask &= !(PROXY_STEP | KERNEL_CH | KERNEL_PHASE);
    }
    let mut implied = 0;
    if abi.extensions() && mask & KERNEL_CH != 0 {
        implied |= KERNEL_PHASE;
    }
    if abi.ce_events() && mask & COLL != 0 {
        implied |= CE_COLL;
    }
    let plan = Plan {
        mask: mask | implied,
        every: config.kernel_ch_every.unwrap_or_else(|| default_every(abi)),
        period: config.interval,
    };
    let release = nccl.map_or_else(|| "NCCL of unknown release".to_owned(), |v| format!("NCCL {v}"));
    tracing::info!(
        "{release} chose profiler ABI v{}: activation mask {:#x}, KernelCh (GPU times) requested {:.0} % of the time",
        abi.version(),
        plan.mask,
        plan.duty() * 100.0
    );
    if abi.extensions_offered() && !abi.extensions() {
        tracing::info!(
            "v7 descriptors are read as their v6 part (no userTag, KernelPhase or symmetric kernels): this NCCL's v7 layout is not known to be 2.31's; NCCL_PROFILER_OTEL_V7_EXTENSIONS=on reads them"
        );
    }
    plan
}

/// NCCL's mask `int`, kept while a communicator lives.
struct NcclMask(*mut c_int);

// SAFETY: the pointer is only used under `STATE`'s lock, as an atomic int (NCCL reads it with
// relaxed atomic loads from any thread), and only between an `init` and the last `finalize`.
unsafe impl Send for NcclMask {}

impl NcclMask {
    fn cell(&self) -> &AtomicI32 {
        // SAFETY: NCCL's `init` contract: an aligned `int` that NCCL reads atomically and that
        // lives as long as libnccl, which stays loaded until after the last `finalize` (`detach`
        // drops this pointer then).
        unsafe { AtomicI32::from_ptr(self.0) }
    }
}

struct State {
    mask: Option<NcclMask>,
    plan: Option<Plan>,
    /// The last value stored through `mask`.
    written: i32,
    /// Someone else wrote the mask since; toggling waits for the next `init`.
    overridden: bool,
    warned: bool,
}

static STATE: Mutex<State> = Mutex::new(State {
    mask: None,
    plan: None,
    written: 0,
    overridden: false,
    warned: false,
});

/// At `init`: keeps NCCL's mask address (when not NULL) and stores the mask due now. The first
/// call fixes the process's plan with `plan` (later calls reuse it) and logs it. Returns the
/// mask due.
///
/// # Safety
/// `mask` is NULL or points to an aligned `int` that is only accessed atomically and stays valid
/// until [`detach`] reports the last communicator gone (NCCL's `init` contract).
pub unsafe fn attach(mask: *mut c_int, plan: impl FnOnce() -> Plan, now: SystemTime) -> i32 {
    let mut state = STATE.lock();
    let plan = *state.plan.get_or_insert_with(plan);
    let due = plan.due(now);
    if !mask.is_null() {
        let mask = NcclMask(mask);
        mask.cell().store(due, Ordering::Relaxed);
        state.mask = Some(mask);
        state.written = due;
        state.overridden = false;
    }
    due
}

/// At a `finalize`: forgets NCCL's mask address when `last` says no communicator lives (checked
/// under the lock, so an `init` racing with it keeps its address). Returns `last`'s answer.
pub fn detach(last: impl FnOnce() -> bool) -> bool {
    let mut state = STATE.lock();
    let last = last();
    if last {
        state.mask = None;
    }
    last
}

/// On the telemetry thread, every tick: stores the mask due at `now` when it differs from the
/// last one stored, unless someone else changed the mask since.
pub fn tick(now: SystemTime) {
    let mut state = STATE.lock();
    let Some(plan) = state.plan.filter(|p| p.samples()) else {
        return;
    };
    let due = plan.due(now);
    if state.overridden || due == state.written {
        return;
    }
    let Some(cell) = state.mask.as_ref().map(NcclMask::cell) else {
        return;
    };
    let found = cell.load(Ordering::Relaxed);
    if found == state.written {
        cell.store(due, Ordering::Relaxed);
        state.written = due;
        return;
    }
    state.overridden = true;
    let (written, warn) = (state.written, !std::mem::replace(&mut state.warned, true));
    drop(state);
    if warn {
        tracing::warn!(
            "NCCL's activation mask is {found:#x}, not the {written:#x} the plugin stored (NCCL's RAS may have set it): KernelCh sampling stops until the next init and the mask is left as it is"
        );
    }
}

/// The fraction of time KernelCh is requested, for the gauge that marks GPU-time figures as a
/// sample: the plan's duty, or, while someone else's mask is in force, whether it has KernelCh.
/// `None` before the first `init`, or when an overriding mask cannot be read any more.
pub fn duty() -> Option<f64> {
    let state = STATE.lock();
    let plan = state.plan?;
    if !state.overridden {
        return Some(plan.duty());
    }
    let mask = state.mask.as_ref()?.cell().load(Ordering::Relaxed);
    Some(if mask & KERNEL_CH != 0 { 1.0 } else { 0.0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: f64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs_f64(secs)
    }

    const SAMPLED: Plan = Plan {
        mask: 0x5e,
        every: 10,
        period: Duration::from_secs(5),
    };

    #[test]
    fn kernel_ch_is_due_in_the_first_part_of_each_period_only() {
        assert_eq!(SAMPLED.due(at(1000.0)), 0x5e);
        assert_eq!(SAMPLED.due(at(1000.49)), 0x5e);
        assert_eq!(SAMPLED.due(at(1000.51)), 0x1e);
        assert_eq!(SAMPLED.due(at(1004.99)), 0x1e);
        assert_eq!(SAMPLED.due(at(1005.01)), 0x5e);
        assert!((SAMPLED.duty() - 0.1).abs() < 1e-12);
        let short = Plan {
            period: Duration::from_millis(500),
            ..SAMPLED
        };
        assert!((short.duty() - 0.2).abs() < 1e-12, "at least 100 ms on");
        let always = Plan { every: 1, ..SAMPLED };
        assert_eq!((always.due(at(1000.7)), always.duty()), (0x5e, 1.0));
        let without = Plan { mask: 0x1e, ..SAMPLED };
        assert_eq!((without.due(at(1000.0)), without.duty()), (0x1e, 0.0));
    }

    #[test]
    fn the_default_duty_follows_nccls_kernel_ch_cost() {
        let every = |nccl, version| default_every(Abi::new(version, nccl, None, true));
        assert_eq!(every(Some(NcclVersion::new(2, 30, 7)), 6), 1);
        assert_eq!(every(Some(NcclVersion::new(2, 23, 4)), 1), 1);
        assert_eq!(every(Some(NcclVersion::new(2, 31, 2)), 7), 10);
        assert_eq!(every(None, 7), 10);
        assert_eq!(every(None, 6), 1, "a NCCL that chose v6 predates 2.31");
    }

    /// The only test touching the process-wide state: the mask toggles, stops toggling on a
    /// foreign value, resumes at the next attach and is forgotten at the last finalize.
    #[test]
    fn toggles_only_kernel_ch_and_yields_to_a_foreign_mask() {
        let nccl = Box::new(AtomicI32::new(0));
        let ptr = nccl.as_ptr();
        let attach = |plan: fn() -> Plan, now| {
            // SAFETY: `nccl` is an atomic int that outlives the test, whose last step detaches it.
            unsafe { attach(ptr, plan, now) }
        };
        assert_eq!(attach(|| SAMPLED, at(1000.0)), 0x5e);
        assert_eq!(attach(|| unreachable!("the plan is fixed"), at(1000.0)), 0x5e);
        tick(at(1000.6));
        assert_eq!(nccl.load(Ordering::Relaxed), 0x1e);
        tick(at(1005.0));
        assert_eq!(nccl.load(Ordering::Relaxed), 0x5e);
        assert_eq!(duty(), Some(0.1));

        nccl.store(0x2, Ordering::Relaxed); // RAS
        tick(at(1005.6));
        assert_eq!(nccl.load(Ordering::Relaxed), 0x2, "left as it is");
        assert_eq!(duty(), Some(0.0));
        tick(at(1010.0));
        assert_eq!(nccl.load(Ordering::Relaxed), 0x2);

        assert_eq!(attach(|| SAMPLED, at(1010.7)), 0x1e);
        tick(at(1015.0));
        assert_eq!(nccl.load(Ordering::Relaxed), 0x5e, "toggling again after init");
        detach(|| true);
        tick(at(1015.6));
        assert_eq!(
            nccl.load(Ordering::Relaxed),
            0x5e,
            "not touched after the last finalize"
        );
    }
}

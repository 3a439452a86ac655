//! The NCCL release the emulator claims to be, and what that release does differently: which
//! profiler tables it looks up (spec 5, 7.6), which events it emits (spec 8.1), and its
//! `ncclGetVersion`, which the plugin finds in this executable's dynamic symbol table (build.rs
//! exports it from tests, benches and examples) as it finds libnccl's in a real job.
//!
//! Process-wide, like NCCL's: `EMU_NCCL=2.31.2` (or [`set`] before the first `init`) chooses it;
//! 2.30.7 by default.

use std::ffi::c_int;
use std::fmt;
use std::sync::atomic::{AtomicI32, Ordering};

use nccl_profiler_otel::bindings::{ncclInvalidArgument, ncclResult_t, ncclSuccess};

use super::plugin::Version;

/// An NCCL release by its `NCCL_VERSION_CODE` (major × 10000 + minor × 100 + patch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Release(pub i32);

impl Release {
    /// v1 only.
    pub const V2_23_4: Release = Release(22304);
    /// v2, v1.
    pub const V2_25_1: Release = Release(22501);
    /// v3 to v1.
    pub const V2_26_6: Release = Release(22606);
    /// v4 to v1: the last release without API-level events.
    pub const V2_27_7: Release = Release(22707);
    /// v5 to v1: API-level events.
    pub const V2_28_9: Release = Release(22809);
    /// v6 to v1: copy-engine events, Broadcast as AllGatherV. The emulator's default.
    pub const V2_30_7: Release = Release(23007);
    /// v7 to v1: userTag, KernelPhase, the profiler thread; KernelCh costs 4–13 % of GPU time
    /// (spec 7.3.6).
    pub const V2_31_2: Release = Release(23102);

    /// One release per profiler ABI version, oldest first.
    pub const ONE_PER_ABI: [Release; 7] = [
        Release::V2_23_4,
        Release::V2_25_1,
        Release::V2_26_6,
        Release::V2_27_7,
        Release::V2_28_9,
        Release::V2_30_7,
        Release::V2_31_2,
    ];

    /// `2.31.2` → 23102; `None` for anything else.
    pub fn parse(s: &str) -> Option<Release> {
        let mut parts = s.trim().split('.').map(|p| p.parse::<i32>().ok());
        let (Some(Some(major)), Some(Some(minor)), Some(Some(patch)), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        (major == 2 && (0..100).contains(&minor) && (0..100).contains(&patch))
            .then_some(Release(major * 10000 + minor * 100 + patch))
    }

    /// The newest profiler table this release looks up: the last whose first release (2.23 v1,
    /// 2.24 v2, 2.26 v3, 2.27 v4, 2.28 v5, 2.29 v6, 2.31 v7) it reaches.
    pub fn newest_abi(self) -> Version {
        const FIRST: [i32; 7] = [22300, 22400, 22600, 22700, 22800, 22900, 23100];
        let known = FIRST.iter().filter(|&&code| self.0 >= code).count();
        Version::ALL[known.clamp(1, Version::ALL.len()) - 1]
    }

    /// The symbols this release looks up, in its order: newest first (spec 1.3, 7.4).
    pub fn lookup_order(self) -> Vec<Version> {
        Version::ALL
            .iter()
            .rev()
            .copied()
            .filter(|&v| v <= self.newest_abi())
            .collect()
    }

    /// GroupApi, CollApi, P2pApi and KernelLaunch exist (2.28+); Coll/P2p hang under the API
    /// events and no longer need a Group handle.
    pub fn api_events(self) -> bool {
        self >= Release::V2_28_9
    }

    /// `ncclBroadcast` runs as AllGatherV (2.29+) unless `NCCL_ALLGATHERV_ENABLE=0`: NCCL then
    /// emits only its API events (spec 3.12). Copy-engine collectives exist from the same release.
    pub fn allgatherv_broadcast(self) -> bool {
        self >= Release(22900) && std::env::var("NCCL_ALLGATHERV_ENABLE").map_or(true, |v| v.trim() != "0")
    }

    /// The plan's task events are stopped without a look at their handles, so a task the
    /// plugin declined gets `stopEvent(NULL)` (2.23–2.25, `ncclProfilerStopTaskEvents`; 2.26
    /// checks each handle).
    pub fn stops_tasks_unchecked(self) -> bool {
        self < Release(22600)
    }

    /// Copy-engine collectives (CeColl, CeSync, CeBatch) exist (2.29+).
    pub fn copy_engine(self) -> bool {
        self >= Release(22900)
    }

    /// KernelCh (and KernelPhase) come from a profiler thread of their own, not the proxy
    /// thread (2.31+).
    pub fn profiler_thread(self) -> bool {
        self >= Release::V2_31_2
    }

    /// The release's `ncclGetVersion` code.
    pub fn code(self) -> i32 {
        self.0
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.0 / 10000, self.0 / 100 % 100, self.0 % 100)
    }
}

/// 0 until the first [`current`] or [`set`].
static CODE: AtomicI32 = AtomicI32::new(0);

/// The release emulated: the last [`set`], else `EMU_NCCL`, else 2.30.7. Panics on an
/// `EMU_NCCL` that is not a release (a test setting must not be silently ignored).
pub fn current() -> Release {
    let code = CODE.load(Ordering::Relaxed);
    if code != 0 {
        return Release(code);
    }
    let release = match std::env::var("EMU_NCCL") {
        Ok(s) => Release::parse(&s).unwrap_or_else(|| panic!("EMU_NCCL={s:?} is not a release like 2.31.2")),
        Err(_) => Release::V2_30_7,
    };
    set(release);
    release
}

/// Makes the emulator (and its `ncclGetVersion`) `release` from now on.
pub fn set(release: Release) {
    CODE.store(release.0, Ordering::Relaxed);
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
    unsafe { *version = current().code() };
    ncclSuccess
}

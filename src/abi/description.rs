//! The one description of the profiler ABI the plugin runs on: what the table version fixes
//! (what descriptors carry, how ProxyOp states read, which events exist) and what the NCCL
//! release and the configuration decide (the v7 extension fields read, the collectives seen at
//! their API event, KernelCh's cost). Readers, the callback bodies and the activation plan ask
//! it by name; the version numbers are compared here only.
//!
//! Fixed once per process, at its first profiled `init` ([`Abi::install`]). The callback bodies,
//! instantiated per table, ask [`Abi::table`] what their version fixes (known at compile time);
//! what the release decided they ask [`Abi::current`], one relaxed load.
//! Called on: NCCL's init thread ([`Abi::new`], [`Abi::install`], [`allgatherv_enabled`]), its
//! user and proxy threads ([`Abi::current`]).

use std::sync::atomic::{AtomicU16, Ordering};

use crate::nccl_version::NcclVersion;

/// The profiler ABI: a table version and what the running release decided. Copy, one `u16`
/// (passed in one register): the table version NCCL chose (1–7; 0 before the first profiled
/// `init`) in the low byte, the [`Flag`]s the release and the configuration decided above it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(transparent)]
pub struct Abi(u16);

/// One bit of an [`Abi`]'s high byte.
#[derive(Clone, Copy)]
#[repr(u8)]
enum Flag {
    Extensions = 1,
    ApiBroadcasts = 2,
    ApiCalls = 4,
    CostlyKernelCh = 8,
}

/// The process's description; 0 until the first profiled `init`.
static CURRENT: AtomicU16 = AtomicU16::new(0);

/// NCCL 2.29.0: Broadcast on the AllGatherV path, symmetric-memory collectives (spec 3.12).
const V2_29: NcclVersion = NcclVersion::new(2, 29, 0);
/// The first release past the last patch of `2.minor`.
const fn after(minor: u32) -> NcclVersion {
    NcclVersion::new(2, minor + 1, 0)
}

/// The releases, `[first, end)`, whose newest table is each version (spec 7.6, 8): NCCL picks
/// the newest table it knows, so a release that cannot be named is one of its table's.
const NATIVE: [(NcclVersion, NcclVersion); 7] = [
    (NcclVersion::new(2, 23, 0), after(23)),
    (NcclVersion::new(2, 24, 0), after(25)),
    (NcclVersion::new(2, 26, 0), after(26)),
    (NcclVersion::new(2, 27, 0), after(27)),
    (NcclVersion::new(2, 28, 0), after(28)),
    (V2_29, after(30)),
    (NcclVersion::V2_31, ANY.1),
];
/// Every release: a table this plugin does not export.
const ANY: (NcclVersion, NcclVersion) = (NcclVersion::new(0, 0, 0), NcclVersion::new(u32::MAX, 0, 0));

impl Abi {
    /// What table `version` fixes, with nothing decided by a release: the callback bodies
    /// instantiated per table ask it for the capabilities below [`Abi::version`].
    pub const fn table(version: u8) -> Abi {
        Abi(version as u16)
    }

    /// The description of table `version` under release `nccl` (`None`: not found, judged by
    /// the table NCCL chose, the newest it knows). `v7_extensions` is `NCCL_PROFILER_OTEL_V7_EXTENSIONS` (`None`:
    /// read them on 2.31, whose layout is known, spec 8.x); `allgatherv` is NCCL's
    /// `NCCL_ALLGATHERV_ENABLE` not being 0 ([`allgatherv_enabled`]).
    pub fn new(version: u8, nccl: Option<NcclVersion>, v7_extensions: Option<bool>, allgatherv: bool) -> Abi {
        let table = Abi::table(version);
        let (first, end) = match nccl {
            Some(v) => (v, NcclVersion::new(v.major, v.minor, v.patch.saturating_add(1))),
            None => NATIVE.get(usize::from(version).wrapping_sub(1)).copied().unwrap_or(ANY),
        };
        let known_layout = nccl.is_some_and(|v| (NcclVersion::V2_31..after(31)).contains(&v));
        let before_2_31 = end <= NcclVersion::V2_31;
        let mut flags = 0;
        for (flag, on) in [
            (Flag::Extensions, table.extensions_offered() && v7_extensions.unwrap_or(known_layout)),
            (Flag::ApiBroadcasts, table.api_events() && first >= V2_29 && allgatherv),
            (Flag::ApiCalls, table.api_events() && first >= V2_29 && before_2_31),
            (Flag::CostlyKernelCh, !before_2_31),
        ] {
            if on {
                flags |= flag as u8;
            }
        }
        Abi(u16::from(version) | u16::from(flags) << 8)
    }

    /// Makes this the process's description ([`Abi::current`]).
    /// Called on: NCCL's init thread (the first profiled `init`).
    pub fn install(self) {
        CURRENT.store(self.0, Ordering::Relaxed);
    }

    /// The process's description: [`Abi::table`]`(0)` before the first profiled `init`.
    /// Called on: any thread, inside a callback too (one relaxed load).
    #[inline(always)]
    pub fn current() -> Abi {
        Abi(CURRENT.load(Ordering::Relaxed))
    }

    const fn has(self, flag: Flag) -> bool {
        self.0 >> 8 & flag as u16 != 0
    }

    /// The table version NCCL chose.
    pub const fn version(self) -> u8 {
        self.0 as u8
    }

    /// ProxyOps report the states 0–7 with the op's running byte total (`transSize`, `steps`;
    /// [`super::legacy::op_state`]) and no InProgress; ProxySteps carry no bytes and KernelCh no
    /// GPU time (v1–v3, spec 8.2.2, 8.7).
    pub const fn transfer_states(self) -> bool {
        self.version() <= 3 // one compare on the hot path: no table has version 0
    }

    /// A ProxyOp state's `steps` counts network transfers and SendTransmitted's total includes its
    /// own transfer (v2, v3); v1 counts NCCL steps and reports the total before (spec 8.7).
    pub const fn counts_transfers(self) -> bool {
        matches!(self.version(), 2..=3)
    }

    /// `init` gets neither the communicator's hash nor our rank: Coll/P2p carry them, a context
    /// has no hash a PXN op could be matched by, and a ProxyOp's parent, not its context (NCCL
    /// 2.23 may pass another op's, spec 8.2.1), names its communicator (v1–v3).
    pub const fn identity_in_events(self) -> bool {
        matches!(self.version(), 1..=3)
    }

    /// NCCL stops the tasks of a Group we accepted without checking their handles, so a task we
    /// declined (a P2P receive) comes back as `stopEvent(NULL)` (v1, v2: NCCL 2.23–2.25, spec
    /// 8.2–8.3).
    pub const fn stops_declined_tasks(self) -> bool {
        matches!(self.version(), 1..=2)
    }

    /// The API events exist: GroupApi, CollApi, P2pApi, KernelLaunch (v5 on).
    pub const fn api_events(self) -> bool {
        self.version() >= 5
    }

    /// The copy-engine events exist; a copy-engine collective has no other (v6 on).
    pub const fn ce_events(self) -> bool {
        self.version() >= 6
    }

    /// The descriptors may have the fields past v6's that NCCL 2.31.2 added (`userTag`,
    /// `isSymColl`, KernelPhase; v7), whether or not [`Abi::extensions`] reads them.
    pub const fn extensions_offered(self) -> bool {
        self.version() == 7
    }

    /// The v7 fields past v6's are read: the layout is 2.31.2's (or the configuration says so).
    pub const fn extensions(self) -> bool {
        self.has(Flag::Extensions)
    }

    /// `ncclBroadcast` is counted from its CollApi event: the release converts it to AllGatherV
    /// (2.29 on, `NCCL_ALLGATHERV_ENABLE` not 0, spec 3.12) and emits no Coll for it.
    pub const fn api_broadcasts(self) -> bool {
        self.has(Flag::ApiBroadcasts)
    }

    /// Every other collective's CollApi (not graph-captured) is recorded for a Coll or CeColl to
    /// claim: 2.29 and 2.30 run symmetric-memory collectives with their API events only (spec
    /// 3.12); 2.31 emits a Coll for them (spec 7.3.5).
    pub const fn api_calls(self) -> bool {
        self.has(Flag::ApiCalls)
    }

    /// KernelCh costs 4–13 % of GPU time (2.31 on, NVIDIA/nccl#2355), not 0.4–1 %.
    pub const fn kernel_ch_costly(self) -> bool {
        self.has(Flag::CostlyKernelCh)
    }
}

/// Whether NCCL's AllGatherV path is enabled (`NCCL_ALLGATHERV_ENABLE` is not 0; on by default).
/// Called on: NCCL's init thread (the first profiled `init`).
pub fn allgatherv_enabled() -> bool {
    std::env::var("NCCL_ALLGATHERV_ENABLE").map_or(true, |v| v.trim() != "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(minor: u32, patch: u32) -> Option<NcclVersion> {
        Some(NcclVersion::new(2, minor, patch))
    }

    /// (extensions, api_broadcasts, api_calls, kernel_ch_costly) with `NCCL_ALLGATHERV_ENABLE`
    /// unset and no configured extensions.
    fn decided(version: u8, nccl: Option<NcclVersion>) -> (bool, bool, bool, bool) {
        let abi = Abi::new(version, nccl, None, true);
        (abi.extensions(), abi.api_broadcasts(), abi.api_calls(), abi.kernel_ch_costly())
    }

    #[test]
    fn the_release_or_else_the_table_decides() {
        assert_eq!(decided(7, release(31, 2)), (true, true, false, true));
        assert_eq!(decided(7, release(32, 3)), (false, true, false, true), "2.32's v7 layout is not known");
        assert_eq!(decided(7, None), (false, true, false, true));
        assert_eq!(decided(6, release(30, 7)), (false, true, true, false));
        assert_eq!(decided(6, release(31, 2)), (false, true, false, true), "2.31 through its v6 adapter");
        assert_eq!(decided(6, None), (false, true, true, false), "a NCCL that chose v6 is 2.29 or 2.30");
        assert_eq!(decided(5, None), (false, false, false, false));
        assert_eq!(decided(5, release(29, 1)), (false, true, true, false));
        assert_eq!(decided(4, release(31, 2)), (false, false, false, true), "no API events on v4");
        assert_eq!(decided(1, None), (false, false, false, false));
        let off = Abi::new(7, release(31, 2), Some(false), false);
        assert!(!off.extensions() && !off.api_broadcasts());
        assert!(Abi::new(7, None, Some(true), true).extensions());
        assert!(!Abi::new(6, None, Some(true), true).extensions(), "only v7 has them");
    }

    #[test]
    fn the_table_alone_fixes_what_descriptors_carry() {
        let caps = |v| {
            let t = Abi::table(v);
            (t.transfer_states(), t.counts_transfers(), t.stops_declined_tasks(), t.api_events(), t.ce_events())
        };
        assert_eq!(caps(1), (true, false, true, false, false));
        assert_eq!(caps(2), (true, true, true, false, false));
        assert_eq!(caps(3), (true, true, false, false, false));
        assert_eq!(caps(4), (false, false, false, false, false));
        assert_eq!(caps(5), (false, false, false, true, false));
        assert_eq!(caps(7), (false, false, false, true, true));
        let abi = Abi::new(7, release(31, 2), None, true);
        assert_eq!(Abi::table(7).extensions_offered(), abi.extensions_offered());
        assert_eq!(Abi(abi.0 & 0xff), Abi::table(7));
    }
}

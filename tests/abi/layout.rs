//! ABI facts of the NCCL profiler plugin interface (spec sections 2.1-2.9),
//! checked against the bindgen types in `nccl_profiler_otel::bindings`. Every size and offset the
//! spec lists for v1 to v7 (sections 2.4–2.9, 7.2) appears here; offsets are from the start of
//! the descriptor.
//! x86_64 / LP64 only, like the spec's numbers.

use std::mem::{align_of, offset_of, size_of};

use nccl_profiler_otel::bindings::*;

/// Asserts `offset_of!(T, path) == offset` for each `path @ offset`.
macro_rules! offsets {
    ($t:ty { $($($f:ident).+ @ $off:expr),+ $(,)? }) => {
        $(
            assert_eq!(
                offset_of!($t, $($f).+),
                $off,
                concat!(stringify!($t), ".", stringify!($($f).+)),
            );
        )+
    };
}

/// Size of the pointee type, from a raw pointer (no read, no reference into a union).
fn pointee_size<T>(_: *const T) -> usize {
    size_of::<T>()
}

/// Asserts the size of a descriptor's union member, reached through the anonymous union.
macro_rules! member_size {
    ($t:ty, $member:ident, $size:expr) => {{
        let d: $t = Default::default();
        assert_eq!(
            pointee_size(&raw const d.__bindgen_anon_1.$member),
            $size,
            concat!("sizeof ", stringify!($t), ".", stringify!($member)),
        );
    }};
}

/// Header, and the members v4 shares with v5 and v6 at identical offsets (spec 2.7:
/// proxyOp, proxyStep, kernelCh, netPlugin "same offsets as v6").
macro_rules! shared_members {
    ($t:ty) => {
        offsets!($t {
            parentObj @ 8,
            rank @ 16,
            __bindgen_anon_1 @ 24,
            __bindgen_anon_1.proxyOp.pid @ 24,
            __bindgen_anon_1.proxyOp.channelId @ 28,
            __bindgen_anon_1.proxyOp.peer @ 32,
            __bindgen_anon_1.proxyOp.nSteps @ 36,
            __bindgen_anon_1.proxyOp.chunkSize @ 40,
            __bindgen_anon_1.proxyOp.isSend @ 44,
            __bindgen_anon_1.proxyStep.step @ 24,
            __bindgen_anon_1.kernelCh.channelId @ 24,
            __bindgen_anon_1.kernelCh.pTimer @ 32,
            __bindgen_anon_1.netPlugin.id @ 24,
            __bindgen_anon_1.netPlugin.data @ 32,
        });
        member_size!($t, proxyOp, 24);
        member_size!($t, proxyStep, 4);
        member_size!($t, kernelCh, 16);
        member_size!($t, netPlugin, 16);
    };
}

/// The v5 members, which v6 and v7 repeat at the same offsets (spec 2.5, 2.6, 7.2.2).
macro_rules! v5_members {
    ($t:ty) => {
        assert_eq!(size_of::<$t>(), 112);
        assert_eq!(size_of_val(&<$t>::default().__bindgen_anon_1), 88);
        member_size!($t, collApi, 48);
        member_size!($t, p2pApi, 40);
        member_size!($t, coll, 88);
        member_size!($t, p2p, 48);
        v5_offsets!($t);
    };
}

/// The v5 members' offsets and the sizes v5, v6 and v7 share.
macro_rules! v5_offsets {
    ($t:ty) => {
        assert_eq!(align_of::<$t>(), 8);
        offsets!($t { type_ @ 0 });
        let d: $t = Default::default();
        assert_eq!(size_of_val(&d.type_), 8, "type is u64 since v5");
        shared_members!($t);
        offsets!($t {
            __bindgen_anon_1.groupApi.graphCaptured @ 24,
            __bindgen_anon_1.groupApi.groupDepth @ 28,
            __bindgen_anon_1.collApi.func @ 24,
            __bindgen_anon_1.collApi.count @ 32,
            __bindgen_anon_1.collApi.datatype @ 40,
            __bindgen_anon_1.collApi.root @ 48,
            __bindgen_anon_1.collApi.stream @ 56,
            __bindgen_anon_1.collApi.graphCaptured @ 64,
            __bindgen_anon_1.p2pApi.func @ 24,
            __bindgen_anon_1.p2pApi.count @ 32,
            __bindgen_anon_1.p2pApi.datatype @ 40,
            __bindgen_anon_1.p2pApi.stream @ 48,
            __bindgen_anon_1.p2pApi.graphCaptured @ 56,
            __bindgen_anon_1.kernelLaunch.stream @ 24,
            __bindgen_anon_1.coll.seqNumber @ 24,
            __bindgen_anon_1.coll.func @ 32,
            __bindgen_anon_1.coll.sendBuff @ 40,
            __bindgen_anon_1.coll.recvBuff @ 48,
            __bindgen_anon_1.coll.count @ 56,
            __bindgen_anon_1.coll.root @ 64,
            __bindgen_anon_1.coll.datatype @ 72,
            __bindgen_anon_1.coll.nChannels @ 80,
            __bindgen_anon_1.coll.nWarps @ 81,
            __bindgen_anon_1.coll.algo @ 88,
            __bindgen_anon_1.coll.proto @ 96,
            __bindgen_anon_1.coll.parentGroup @ 104,
            __bindgen_anon_1.p2p.func @ 24,
            __bindgen_anon_1.p2p.buff @ 32,
            __bindgen_anon_1.p2p.datatype @ 40,
            __bindgen_anon_1.p2p.count @ 48,
            __bindgen_anon_1.p2p.peer @ 56,
            __bindgen_anon_1.p2p.nChannels @ 60,
            __bindgen_anon_1.p2p.parentGroup @ 64,
        });
        member_size!($t, groupApi, 8);
        member_size!($t, kernelLaunch, 8);
    };
}

/// The copy-engine members of v6, which v7 repeats at the same offsets (spec 2.5, 7.2.2).
macro_rules! ce_members {
    ($t:ty) => {
        offsets!($t {
            __bindgen_anon_1.ceColl.seqNumber @ 24,
            __bindgen_anon_1.ceColl.func @ 32,
            __bindgen_anon_1.ceColl.sendBuff @ 40,
            __bindgen_anon_1.ceColl.recvBuff @ 48,
            __bindgen_anon_1.ceColl.count @ 56,
            __bindgen_anon_1.ceColl.root @ 64,
            __bindgen_anon_1.ceColl.datatype @ 72,
            __bindgen_anon_1.ceColl.syncStrategy @ 80,
            __bindgen_anon_1.ceColl.intraBatchSync @ 88,
            __bindgen_anon_1.ceColl.batchSize @ 92,
            __bindgen_anon_1.ceColl.numBatches @ 96,
            __bindgen_anon_1.ceColl.ceSeqNum @ 100,
            __bindgen_anon_1.ceColl.stream @ 104,
            __bindgen_anon_1.ceCollSync.isComplete @ 24,
            __bindgen_anon_1.ceCollSync.nRanks @ 28,
            __bindgen_anon_1.ceCollBatch.numOps @ 24,
            __bindgen_anon_1.ceCollBatch.totalBytes @ 32,
            __bindgen_anon_1.ceCollBatch.useIntraSync @ 40,
        });
        member_size!($t, ceCollSync, 8);
        member_size!($t, ceCollBatch, 24);
    };
}

/// Header and the members v1, v2 and v3 share (spec 2.8): `type` u8, proxyOp and proxyStep at
/// the v6 offsets, coll/p2p starting with `name` and `commHash`.
macro_rules! v1_members {
    ($t:ty) => {
        assert_eq!(align_of::<$t>(), 8);
        offsets!($t {
            type_ @ 0,
            parentObj @ 8,
            rank @ 16,
            __bindgen_anon_1 @ 24,
            __bindgen_anon_1.coll.name @ 24,
            __bindgen_anon_1.coll.commHash @ 32,
            __bindgen_anon_1.coll.seqNumber @ 40,
            __bindgen_anon_1.coll.func @ 48,
            __bindgen_anon_1.coll.sendBuff @ 56,
            __bindgen_anon_1.coll.recvBuff @ 64,
            __bindgen_anon_1.coll.count @ 72,
            __bindgen_anon_1.coll.root @ 80,
            __bindgen_anon_1.p2p.name @ 24,
            __bindgen_anon_1.p2p.commHash @ 32,
            __bindgen_anon_1.p2p.func @ 40,
            __bindgen_anon_1.p2p.buff @ 48,
            __bindgen_anon_1.p2p.datatype @ 56,
            __bindgen_anon_1.p2p.count @ 64,
            __bindgen_anon_1.p2p.peer @ 72,
            __bindgen_anon_1.proxyOp.pid @ 24,
            __bindgen_anon_1.proxyOp.channelId @ 28,
            __bindgen_anon_1.proxyOp.peer @ 32,
            __bindgen_anon_1.proxyOp.nSteps @ 36,
            __bindgen_anon_1.proxyOp.chunkSize @ 40,
            __bindgen_anon_1.proxyOp.isSend @ 44,
            __bindgen_anon_1.proxyStep.step @ 24,
        });
        let d: $t = Default::default();
        assert_eq!(size_of_val(&d.type_), 1, "type is u8 before v5");
        member_size!($t, proxyOp, 24);
        member_size!($t, proxyStep, 4);
    };
}

/// The state-args union (spec 2.9): 8 bytes, every member at offset 0.
macro_rules! state_args {
    ($t:ty) => {
        assert_eq!(size_of::<$t>(), 8);
        assert_eq!(align_of::<$t>(), 8);
        offsets!($t {
            proxyStep.transSize @ 0,
            proxyCtrl.appendedProxyOps @ 0,
            netPlugin.data @ 0,
            kernelCh.pTimer @ 0,
        });
        let a: $t = Default::default();
        assert_eq!(pointee_size(&raw const a.proxyStep), 8, "transSize: size_t");
        assert_eq!(pointee_size(&raw const a.proxyCtrl), 4, "appendedProxyOps: int");
        assert_eq!(pointee_size(&raw const a.netPlugin), 8, "data: void*");
        assert_eq!(pointee_size(&raw const a.kernelCh), 8, "pTimer: u64");
    };
}

/// The function table (spec 2.4): six pointer-sized fields, identical shape in all versions.
macro_rules! table {
    ($t:ty) => {
        assert_eq!(size_of::<$t>(), 48);
        assert_eq!(align_of::<$t>(), 8);
        offsets!($t {
            name @ 0,
            init @ 8,
            startEvent @ 16,
            stopEvent @ 24,
            recordEventState @ 32,
            finalize @ 40,
        });
        let t: $t = Default::default();
        assert!(t.name.is_null() && t.init.is_none() && t.finalize.is_none());
    };
}

#[test]
fn v1_descriptor() {
    type D = ncclProfilerEventDescr_v1_t;
    assert_eq!(size_of::<D>(), 120);
    v1_members!(D);
    offsets!(D {
        __bindgen_anon_1.coll.datatype @ 84,
        __bindgen_anon_1.coll.op @ 88,
        __bindgen_anon_1.coll.trafficBytes @ 96,
        __bindgen_anon_1.coll.nMaxChannels @ 104,
        __bindgen_anon_1.coll.nWarps @ 105,
        __bindgen_anon_1.coll.algo @ 106,
        __bindgen_anon_1.coll.proto @ 107,
        __bindgen_anon_1.coll.isCollnet @ 108,
        __bindgen_anon_1.coll.isNvls @ 112,
    });
    let d = D::default();
    // SAFETY: reading plain integers of a zeroed union (only their sizes matter).
    let codes = unsafe {
        [
            size_of_val(&d.__bindgen_anon_1.coll.func),
            size_of_val(&d.__bindgen_anon_1.p2p.datatype),
        ]
    };
    assert_eq!(codes, [1, 1], "v1 names functions and types by u8 codes");
}

#[test]
fn v2_descriptor() {
    type D = ncclProfilerEventDescr_v2_t;
    assert_eq!(size_of::<D>(), 128);
    v1_members!(D);
    offsets!(D {
        __bindgen_anon_1.coll.datatype @ 88,
        __bindgen_anon_1.coll.trafficBytes @ 96,
        __bindgen_anon_1.coll.nMaxChannels @ 104,
        __bindgen_anon_1.coll.nWarps @ 105,
        __bindgen_anon_1.coll.algo @ 112,
        __bindgen_anon_1.coll.proto @ 120,
    });
}

#[test]
fn v3_descriptor() {
    type D = ncclProfilerEventDescr_v3_t;
    assert_eq!(size_of::<D>(), 120);
    v1_members!(D);
    offsets!(D {
        __bindgen_anon_1.coll.datatype @ 88,
        __bindgen_anon_1.coll.nMaxChannels @ 96,
        __bindgen_anon_1.coll.nWarps @ 97,
        __bindgen_anon_1.coll.algo @ 104,
        __bindgen_anon_1.coll.proto @ 112,
        __bindgen_anon_1.kernelCh.channelId @ 24,
        __bindgen_anon_1.netPlugin.id @ 24,
        __bindgen_anon_1.netPlugin.data @ 32,
    });
    member_size!(D, kernelCh, 1);
    member_size!(D, netPlugin, 16);
}

#[test]
fn v1_state_args() {
    type A = ncclProfilerEventStateArgs_v1_t;
    assert_eq!((size_of::<A>(), align_of::<A>()), (16, 8));
    offsets!(A {
        proxyOp.transSize @ 0,
        proxyOp.steps @ 8,
        proxyCtrl.appendedProxyOps @ 0,
    });
    // v2 and v3 reuse the v1 type.
    let _: ncclProfilerEventStateArgs_v2_t = A::default();
    let _: ncclProfilerEventStateArgs_v3_t = A::default();
}

#[test]
fn v4_descriptor() {
    type D = ncclProfilerEventDescr_v4_t;
    assert_eq!(size_of::<D>(), 104);
    assert_eq!(align_of::<D>(), 8);
    offsets!(D { type_ @ 0 });
    let d = D::default();
    assert_eq!(size_of_val(&d.type_), 1, "type is u8 in v4");
    assert_eq!(size_of_val(&d.__bindgen_anon_1), 80);
    shared_members!(D);
    offsets!(D {
        __bindgen_anon_1.coll.seqNumber @ 24,
        __bindgen_anon_1.coll.func @ 32,
        __bindgen_anon_1.coll.sendBuff @ 40,
        __bindgen_anon_1.coll.recvBuff @ 48,
        __bindgen_anon_1.coll.count @ 56,
        __bindgen_anon_1.coll.root @ 64,
        __bindgen_anon_1.coll.datatype @ 72,
        __bindgen_anon_1.coll.nChannels @ 80,
        __bindgen_anon_1.coll.nWarps @ 81,
        __bindgen_anon_1.coll.algo @ 88,
        __bindgen_anon_1.coll.proto @ 96,
        __bindgen_anon_1.p2p.func @ 24,
        __bindgen_anon_1.p2p.buff @ 32,
        __bindgen_anon_1.p2p.datatype @ 40,
        __bindgen_anon_1.p2p.count @ 48,
        __bindgen_anon_1.p2p.peer @ 56,
        __bindgen_anon_1.p2p.nChannels @ 60,
    });
    member_size!(D, coll, 80);
    member_size!(D, p2p, 40);
}

#[test]
fn v5_descriptor() {
    v5_members!(ncclProfilerEventDescr_v5_t);
}

#[test]
fn v6_descriptor() {
    type D = ncclProfilerEventDescr_v6_t;
    v5_members!(D);
    ce_members!(D);
    member_size!(D, ceColl, 88);
}

#[test]
fn v7_descriptor() {
    type D = ncclProfilerEventDescr_v7_t;
    assert_eq!(size_of::<D>(), 136);
    assert_eq!(size_of_val(&D::default().__bindgen_anon_1), 112);
    v5_offsets!(D);
    ce_members!(D);
    offsets!(D {
        __bindgen_anon_1.collApi.userTag @ 72,
        __bindgen_anon_1.p2pApi.userTag @ 64,
        __bindgen_anon_1.coll.kernelVariant @ 112,
        __bindgen_anon_1.coll.isSymColl @ 120,
        __bindgen_anon_1.coll.userTag @ 128,
        __bindgen_anon_1.p2p.userTag @ 72,
        __bindgen_anon_1.ceColl.userTag @ 112,
        __bindgen_anon_1.kernelPhase.channelId @ 24,
        __bindgen_anon_1.kernelPhase.phaseId @ 25,
        __bindgen_anon_1.kernelPhase.phaseName @ 32,
        __bindgen_anon_1.kernelPhase.pTimer @ 40,
    });
    member_size!(D, collApi, 56);
    member_size!(D, p2pApi, 48);
    member_size!(D, coll, 112);
    member_size!(D, p2p, 56);
    member_size!(D, ceColl, 96);
    member_size!(D, kernelPhase, 24);
}

/// Our exported v7 object is the 48-byte table plus two NULL entries (spec 8.x.4), so a NCCL
/// that reads a seventh or eighth entry under the same symbol finds NULL, never our next object.
#[test]
fn exported_v7_is_padded_with_null_entries() {
    let t = &nccl_profiler_otel::ffi::ncclProfiler_v7;
    assert_eq!(size_of_val(t), 64);
    assert!(t.get().reserved.iter().all(|p| p.is_null()));
    assert!(t.get().table.startEvent.is_some() && t.get().table.finalize.is_some());
}

#[test]
fn state_args_all_versions() {
    state_args!(ncclProfilerEventStateArgs_v4_t);
    state_args!(ncclProfilerEventStateArgs_v5_t);
    state_args!(ncclProfilerEventStateArgs_v6_t);
    state_args!(ncclProfilerEventStateArgs_v7_t);
}

#[test]
fn function_tables_all_versions() {
    table!(ncclProfiler_v4_t);
    table!(ncclProfiler_v5_t);
    table!(ncclProfiler_v6_t);
    table!(ncclProfiler_v7_t);
    table!(ncclProfiler_v1_t);
    table!(ncclProfiler_v2_t);
    table!(ncclProfiler_v3_t);
}

/// The init argument order differs between v1–v3, v4 and v5–v7 (spec 2.4, 7.2.4); these
/// coercions fail to compile if the generated signatures drift.
#[test]
fn init_signatures() {
    use std::ffi::{c_char, c_int, c_void};

    unsafe extern "C" fn init_v4(
        _context: *mut *mut c_void,
        _mask: *mut c_int,
        _comm_name: *const c_char,
        _comm_hash: u64,
        _n_nodes: c_int,
        _nranks: c_int,
        _rank: c_int,
        _logfn: ncclDebugLogger_t,
    ) -> ncclResult_t {
        ncclSuccess
    }
    unsafe extern "C" fn init_v5(
        _context: *mut *mut c_void,
        _comm_id: u64,
        _mask: *mut c_int,
        _comm_name: *const c_char,
        _n_nodes: c_int,
        _nranks: c_int,
        _rank: c_int,
        _logfn: ncclDebugLogger_t,
    ) -> ncclResult_t {
        ncclSuccess
    }
    let t4 = ncclProfiler_v4_t {
        init: Some(init_v4),
        ..Default::default()
    };
    let t5 = ncclProfiler_v5_t {
        init: Some(init_v5),
        ..Default::default()
    };
    let t6 = ncclProfiler_v6_t {
        init: Some(init_v5),
        ..Default::default()
    };
    let t7 = ncclProfiler_v7_t {
        init: Some(init_v5),
        ..Default::default()
    };
    unsafe extern "C" fn init_v1(_context: *mut *mut c_void, _mask: *mut c_int) -> ncclResult_t {
        ncclSuccess
    }
    let t1 = ncclProfiler_v1_t {
        init: Some(init_v1),
        ..Default::default()
    };
    let t3 = ncclProfiler_v3_t {
        init: Some(init_v1),
        ..Default::default()
    };
    assert!(t4.init.is_some() && t5.init.is_some() && t6.init.is_some() && t7.init.is_some());
    assert!(t1.init.is_some() && t3.init.is_some());
    assert_eq!(size_of::<ncclDebugLogger_t>(), 8, "nullable fn pointer");
    assert_eq!(size_of::<ncclProfilerEventState_t>(), 4);
    assert_eq!(size_of::<ncclResult_t>(), 4);
}

#[test]
fn event_type_bits() {
    let bits = [
        (ncclProfileGroup, 0x1),
        (ncclProfileColl, 0x2),
        (ncclProfileP2p, 0x4),
        (ncclProfileProxyOp, 0x8),
        (ncclProfileProxyStep, 0x10),
        (ncclProfileProxyCtrl, 0x20),
        (ncclProfileKernelCh, 0x40),
        (ncclProfileNetPlugin, 0x80),
        (ncclProfileGroupApi, 0x100),
        (ncclProfileCollApi, 0x200),
        (ncclProfileP2pApi, 0x400),
        (ncclProfileKernelLaunch, 0x800),
        (ncclProfileCeColl, 0x1000),
        (ncclProfileCeSync, 0x2000),
        (ncclProfileCeBatch, 0x4000),
        (ncclProfileKernelPhase, 0x8000),
    ];
    for (i, (bit, value)) in bits.into_iter().enumerate() {
        assert_eq!(bit, value);
        assert_eq!(bit, 1 << i);
    }
}

#[test]
fn state_values() {
    assert_eq!(ncclProfilerProxyOpSendPosted, 0);
    assert_eq!(ncclProfilerProxyOpRecvDone, 7);
    assert_eq!(ncclProfilerProxyStepSendGPUWait, 8);
    assert_eq!(ncclProfilerProxyStepSendWait, 9);
    assert_eq!(ncclProfilerProxyStepRecvWait, 10);
    assert_eq!(ncclProfilerProxyStepRecvFlushWait, 11);
    assert_eq!(ncclProfilerProxyStepRecvGPUWait, 12);
    assert_eq!(ncclProfilerProxyCtrlIdle, 13);
    assert_eq!(ncclProfilerProxyCtrlAppendEnd, 18);
    assert_eq!(ncclProfilerProxyOpInProgress_v4, 19);
    assert_eq!(ncclProfilerProxyStepSendPeerWait_v4, 20);
    assert_eq!(ncclProfilerNetPluginUpdate, 21);
    assert_eq!(ncclProfilerKernelChStop, 22);
    assert_eq!(ncclProfilerGroupStartApiStop, 23);
    assert_eq!(ncclProfilerGroupEndApiStart, 24);
    assert_eq!(ncclProfilerCeCollStart, 25);
    assert_eq!(ncclProfilerCeBatchComplete, 30);
    assert_eq!(ncclProfilerKernelPhaseStop, 31);
}

#[test]
fn result_codes_and_log_constants() {
    let results = [
        ncclSuccess,
        ncclUnhandledCudaError,
        ncclSystemError,
        ncclInternalError,
        ncclInvalidArgument,
        ncclInvalidUsage,
        ncclRemoteError,
        ncclInProgress,
        ncclTimeout,
        ncclNumResults,
    ];
    for (value, code) in results.into_iter().enumerate() {
        assert_eq!(code as usize, value);
    }
    assert_eq!(NCCL_LOG_NONE, 0);
    assert_eq!(NCCL_LOG_WARN, 2);
    assert_eq!(NCCL_LOG_INFO, 3);
    assert_eq!(NCCL_LOG_TRACE, 5);
    assert_eq!(NCCL_INIT, 0x1);
    assert_eq!(NCCL_PROXY, 0x400);
    assert_eq!(NCCL_PROFILE, 0x4000);
    assert_eq!(NCCL_ALL, !0);
}

//! ABI v4 (NCCL 2.27+): `ncclProfilerEventDescr_v4_t` (`type` is a `u8`) and
//! `ncclProfilerEventStateArgs_v4_t`. Under NCCL ≥ 2.28 the v4 adapter does not zero the
//! descriptor and leaves `p2p.nChannels` unset (spec 4.8): we never read that field.

use super::{Descriptor, ProxyOp, StateArgs, c_bytes};
use crate::bindings::{
    ncclProfileColl, ncclProfileKernelCh, ncclProfileP2p, ncclProfileProxyOp, ncclProfileProxyStep,
    ncclProfilerEventDescr_v4_t, ncclProfilerEventStateArgs_v4_t,
};
use crate::record::{Algo, CollStart, Datatype, Func, P2pStart, Proto};

/// A v4 descriptor as NCCL passes it.
#[repr(transparent)]
pub struct DescrV4(pub ncclProfilerEventDescr_v4_t);

/// v4 state arguments as NCCL passes them.
#[repr(transparent)]
pub struct StateArgsV4(pub ncclProfilerEventStateArgs_v4_t);

impl DescrV4 {
    fn is(&self, bit: u32) -> bool {
        u64::from(self.0.type_) == u64::from(bit)
    }
}

impl Descriptor for DescrV4 {
    fn event_type(&self) -> u64 {
        u64::from(self.0.type_)
    }

    fn parent(&self) -> u64 {
        self.0.parentObj as u64
    }

    fn coll(&self) -> Option<CollStart> {
        if !self.is(ncclProfileColl) {
            return None;
        }
        // SAFETY: `type` is Coll, so NCCL filled the `coll` member; its strings are NULL or
        // NUL-terminated literals of libnccl.
        unsafe {
            let c = &self.0.__bindgen_anon_1.coll;
            Some(CollStart {
                seq: c.seqNumber,
                count: c.count as u64,
                func: Func::from_bytes(c_bytes(c.func)),
                algo: Algo::from_bytes(c_bytes(c.algo)),
                proto: Proto::from_bytes(c_bytes(c.proto)),
                datatype: Datatype::from_bytes(c_bytes(c.datatype)),
                n_channels: c.nChannels,
            })
        }
    }

    fn p2p(&self) -> Option<(Func, P2pStart)> {
        if !self.is(ncclProfileP2p) {
            return None;
        }
        // SAFETY: `type` is P2p, so NCCL filled `p2p` (all but `nChannels`, which we skip).
        unsafe {
            let p = &self.0.__bindgen_anon_1.p2p;
            let start = P2pStart {
                count: p.count as u64,
                peer: p.peer,
                datatype: Datatype::from_bytes(c_bytes(p.datatype)),
            };
            Some((Func::from_bytes(c_bytes(p.func)), start))
        }
    }

    fn proxy_op(&self) -> Option<ProxyOp> {
        if !self.is(ncclProfileProxyOp) {
            return None;
        }
        // SAFETY: `type` is ProxyOp, so NCCL filled the `proxyOp` member (plain integers).
        let p = unsafe { &self.0.__bindgen_anon_1.proxyOp };
        Some(ProxyOp {
            pid: p.pid,
            rank: self.0.rank,
            peer: p.peer,
            channel: p.channelId,
            is_send: p.isSend != 0,
        })
    }

    fn proxy_step(&self) -> Option<i32> {
        if !self.is(ncclProfileProxyStep) {
            return None;
        }
        // SAFETY: `type` is ProxyStep, so NCCL filled `proxyStep.step`.
        Some(unsafe { self.0.__bindgen_anon_1.proxyStep.step })
    }

    fn kernel_ch(&self) -> Option<(u8, u64)> {
        if !self.is(ncclProfileKernelCh) {
            return None;
        }
        // SAFETY: `type` is KernelCh, so NCCL filled `kernelCh` (integers).
        let k = unsafe { &self.0.__bindgen_anon_1.kernelCh };
        Some((k.channelId, k.pTimer))
    }
}

impl StateArgs for StateArgsV4 {
    fn trans_size(&self) -> u64 {
        // SAFETY: every member is plain integer data of the same 8 bytes; any bit pattern is valid.
        unsafe { self.0.proxyStep.transSize as u64 }
    }

    fn p_timer(&self) -> u64 {
        // SAFETY: as above.
        unsafe { self.0.kernelCh.pTimer }
    }
}

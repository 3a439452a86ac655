//! What ABI v1 to v3 (NCCL 2.23 to 2.26, spec 8) share: descriptors that carry the
//! communicator's hash and rank on Coll/P2p (their `init` gets neither), names as v1 codes or
//! v2/v3 strings, and byte counts only in ProxyOp states, as a running total per proxy slot that
//! NCCL never resets (spec 8.2.2, 8.7). ProxySteps (their states carry no arguments) and v3's
//! KernelCh (no GPU time, only when the proxy thread noticed the kernel) are not used.

use std::os::raw::c_char;

use crate::bindings::{
    ncclProfilerEventStateArgs_v1_t, ncclProfilerProxyOpSendDone, ncclProfilerProxyOpSendPosted,
    ncclProfilerProxyOpSendTransmitted,
};
use crate::record::{Algo, Datatype, Func, Mark, Proto, names::codes};

/// A name field of a legacy descriptor: a v1 code or a v2/v3 C string.
pub trait Name: Copy {
    /// # Safety
    /// A string is NULL or NUL-terminated (NCCL passes literals of libnccl).
    unsafe fn func(self) -> Func;
    /// # Safety
    /// As [`Name::func`].
    unsafe fn datatype(self) -> Datatype;
    /// # Safety
    /// As [`Name::func`].
    unsafe fn algo(self) -> Algo;
    /// # Safety
    /// As [`Name::func`].
    unsafe fn proto(self) -> Proto;
}

impl Name for u8 {
    unsafe fn func(self) -> Func {
        codes::func(self)
    }
    unsafe fn datatype(self) -> Datatype {
        codes::datatype(self)
    }
    unsafe fn algo(self) -> Algo {
        codes::algo(self)
    }
    unsafe fn proto(self) -> Proto {
        codes::proto(self)
    }
}

impl Name for *const c_char {
    unsafe fn func(self) -> Func {
        // SAFETY: per the trait's contract.
        Func::from_bytes(unsafe { super::c_bytes(self) })
    }
    unsafe fn datatype(self) -> Datatype {
        // SAFETY: as above.
        Datatype::from_bytes(unsafe { super::c_bytes(self) })
    }
    unsafe fn algo(self) -> Algo {
        // SAFETY: as above.
        Algo::from_bytes(unsafe { super::c_bytes(self) })
    }
    unsafe fn proto(self) -> Proto {
        // SAFETY: as above.
        Proto::from_bytes(unsafe { super::c_bytes(self) })
    }
}

impl super::StateArgs for ncclProfilerEventStateArgs_v1_t {
    fn trans_size(&self) -> u64 {
        // SAFETY: both members are plain integers over the same bytes; any bit pattern is valid.
        unsafe { self.proxyOp.transSize as u64 }
    }

    fn p_timer(&self) -> u64 {
        0 // no such member before v4
    }

    fn steps(&self) -> i32 {
        // SAFETY: as above.
        unsafe { self.proxyOp.steps }
    }
}

/// The transfer edge a ProxyOp `state` of a send op marks on ABI `abi` (v1–v3), with its
/// `steps` argument; `None` for the states not used (RemFifoWait repeats, the receive states,
/// and every SendPosted but an op's first, which only v2 and v3 need: their SendTransmitted
/// total includes the transfer, v1's does not, spec 8.7).
pub fn mark(abi: u8, state: u32, steps: i32) -> Option<Mark> {
    match state {
        // v2+ count `steps` in transfers, after the increment: 1 is the op's first posting.
        s if s == ncclProfilerProxyOpSendPosted && abi >= 2 && steps == 1 => Some(Mark::Base),
        s if s == ncclProfilerProxyOpSendTransmitted => Some(if abi >= 2 { Mark::Sent } else { Mark::SentBefore }),
        s if s == ncclProfilerProxyOpSendDone => Some(Mark::Done),
        _ => None,
    }
}

/// Implements [`super::Descriptor`] for a v1, v2 or v3 descriptor (spec 2.8): `type` is a `u8`,
/// names are codes (v1) or strings, Coll/P2p carry `commHash` and the rank, Coll has
/// `nMaxChannels` (an upper bound, reported as the channel count) and P2p no channels.
macro_rules! legacy_family {
    ($descr:ty) => {
        impl $crate::abi::Descriptor for $crate::abi::Filled<$descr> {
            const LEGACY: bool = true;

            fn event_type(&self) -> u64 {
                u64::from(self.type_)
            }

            fn parent(&self) -> u64 {
                self.parentObj as u64
            }

            fn identity(&self) -> Option<(u64, i32)> {
                let ty = self.event_type();
                // SAFETY: `type` says which member NCCL filled; both have `commHash` (an integer).
                unsafe {
                    if ty == u64::from($crate::bindings::ncclProfileColl) {
                        Some((self.__bindgen_anon_1.coll.commHash, self.rank))
                    } else if ty == u64::from($crate::bindings::ncclProfileP2p) {
                        Some((self.__bindgen_anon_1.p2p.commHash, self.rank))
                    } else {
                        None
                    }
                }
            }

            fn coll(&self) -> Option<$crate::record::CollStart> {
                use $crate::abi::legacy::Name;
                if self.event_type() != u64::from($crate::bindings::ncclProfileColl) {
                    return None;
                }
                // SAFETY: `type` is Coll, so NCCL filled `coll`; its names are codes or NULL or
                // NUL-terminated literals of libnccl.
                unsafe {
                    let c = &self.__bindgen_anon_1.coll;
                    Some($crate::record::CollStart {
                        seq: c.seqNumber,
                        count: c.count as u64,
                        func: c.func.func(),
                        algo: c.algo.algo(),
                        proto: c.proto.proto(),
                        datatype: c.datatype.datatype(),
                        n_channels: c.nMaxChannels,
                        graph: None,
                        sample: crate::record::Sample::ALL,
                    })
                }
            }

            fn p2p(&self) -> Option<($crate::record::Func, $crate::record::P2pStart)> {
                use $crate::abi::legacy::Name;
                if self.event_type() != u64::from($crate::bindings::ncclProfileP2p) {
                    return None;
                }
                // SAFETY: `type` is P2p, so NCCL filled `p2p` (as for `coll`).
                unsafe {
                    let p = &self.__bindgen_anon_1.p2p;
                    let start = $crate::record::P2pStart {
                        count: p.count as u64,
                        peer: p.peer,
                        datatype: p.datatype.datatype(),
                        graph: None,
                        sample: crate::record::Sample::ALL,
                    };
                    Some((p.func.func(), start))
                }
            }

            $crate::abi::proxy_op!();

            fn proxy_step(&self) -> Option<i32> {
                None // declined: their states carry no bytes (spec 8.2.2)
            }

            fn kernel_ch(&self) -> Option<(u8, u64)> {
                None // v3's has no GPU time (spec 8.4.2): declined
            }
        }
    };
}
pub(super) use legacy_family;

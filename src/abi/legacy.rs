//! What ABI v1 to v3 (NCCL 2.23 to 2.26, spec 8) share: descriptors that carry the
//! communicator's hash and rank on Coll/P2p (their `init` gets neither), names as v1 codes or
//! v2/v3 strings, and byte counts only in ProxyOp states, as a running total per proxy slot that
//! NCCL never resets (spec 8.2.2, 8.7), which one classifier reads ([`op_state`]). ProxySteps
//! (their states carry no arguments) and v3's KernelCh (no GPU time, only when the proxy thread
//! noticed the kernel) are not used.

use std::os::raw::c_char;

use super::Abi;
use crate::bindings::{self, ncclProfilerEventStateArgs_v1_t};
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

/// A ProxyOp state of ABI v1–v3 (spec 8.2.2): the one reading of that state machine, which the
/// clock read, the recorder and the shedding of `crate::ffi` share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpState {
    /// SendPosted: a send posted a transfer.
    SendPosted,
    /// SendRemFifoWait: the peer has not posted the receive (repeated while it waits).
    SendRemFifoWait,
    /// SendTransmitted: the network took a transfer.
    SendTransmitted,
    /// SendDone: the network finished a transfer.
    SendDone,
    /// RecvPosted: a receive posted a transfer.
    RecvPosted,
    /// RecvReceived: a transfer arrived.
    RecvReceived,
    /// RecvTransmitted: not used.
    RecvTransmitted,
    /// RecvDone: not used.
    RecvDone,
}

/// The ProxyOp state `state` is on `abi`; `None` when `abi`'s ProxyOps have no such states
/// ([`Abi::transfer_states`]) or `state` is none of them.
#[inline(always)]
pub fn op_state(abi: Abi, state: u32) -> Option<OpState> {
    if !abi.transfer_states() {
        return None;
    }
    Some(match state {
        bindings::ncclProfilerProxyOpSendPosted => OpState::SendPosted,
        bindings::ncclProfilerProxyOpSendRemFifoWait => OpState::SendRemFifoWait,
        bindings::ncclProfilerProxyOpSendTransmitted => OpState::SendTransmitted,
        bindings::ncclProfilerProxyOpSendDone => OpState::SendDone,
        bindings::ncclProfilerProxyOpRecvPosted => OpState::RecvPosted,
        bindings::ncclProfilerProxyOpRecvReceived => OpState::RecvReceived,
        bindings::ncclProfilerProxyOpRecvTransmitted => OpState::RecvTransmitted,
        bindings::ncclProfilerProxyOpRecvDone => OpState::RecvDone,
        _ => return None,
    })
}

impl OpState {
    /// Whether it ends a send's transfer (SendTransmitted, SendDone): the callback's time is
    /// read before anything else.
    pub fn ends_transfer(self) -> bool {
        matches!(self, OpState::SendTransmitted | OpState::SendDone)
    }

    /// Whether a receive op records it (RecvPosted, RecvReceived: how far its transfers got).
    pub fn counts_receive(self) -> bool {
        matches!(self, OpState::RecvPosted | OpState::RecvReceived)
    }

    /// The transfer edge it marks on a send op of `abi`, with its `steps` argument; `None` for
    /// the states not used (RemFifoWait repeats, the receive states, and every SendPosted but
    /// an op's first, which only v2 and v3 need: their SendTransmitted total includes the
    /// transfer, v1's does not, spec 8.7).
    pub fn mark(self, abi: Abi, steps: i32) -> Option<Mark> {
        match self {
            // `steps` counts transfers, after the increment: 1 is the op's first posting.
            OpState::SendPosted if abi.counts_transfers() && steps == 1 => Some(Mark::Base),
            OpState::SendTransmitted if abi.counts_transfers() => Some(Mark::Sent),
            OpState::SendTransmitted => Some(Mark::SentBefore),
            OpState::SendDone => Some(Mark::Done),
            _ => None,
        }
    }
}

/// Implements [`super::Descriptor`] for the descriptor of table version `$version`, v1 to v3
/// (spec 2.8): `type` is a `u8`, names are codes (v1) or strings, Coll/P2p carry `commHash` and the rank, Coll has
/// `nMaxChannels` (an upper bound, reported as the channel count) and P2p no channels.
macro_rules! legacy_family {
    ($version:literal, $descr:ty) => {
        impl $crate::abi::Descriptor for $crate::abi::Filled<$descr> {
            const ABI: $crate::abi::Abi = $crate::abi::Abi::table($version);

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

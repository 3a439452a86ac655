//! Readers of each NCCL profiler ABI version's descriptors and state arguments.
//!
//! Each version (`vN`) implements [`Descriptor`] and [`StateArgs`] on its bindgen types; the
//! versions that share field names and meanings share one implementation ([`api_family!`]), and
//! `crate::ffi` has one generic body per callback. What a version carries and what the running
//! release decided is one description, [`Abi`] (`description`). Every method checks the type tag
//! before it reads the union and copies what it needs: no pointer into NCCL memory is kept.
//! Called on: NCCL's user and proxy threads, inside a callback.

pub mod description;
pub mod legacy;
pub mod v1;
pub mod v2;
pub mod v3;
pub mod v4;
pub mod v5;
pub mod v6;
pub mod v7;

pub use description::Abi;

use crate::record::{CollStart, Func, P2pStart};

/// A ProxyOp descriptor's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProxyOp {
    /// Process that created the op (PXN: another one).
    pub pid: i32,
    /// Rank that created the op.
    pub rank: i32,
    /// Remote rank.
    pub peer: i32,
    /// Channel.
    pub channel: u8,
    /// Network send (the only ops that get steps and a stop for sends).
    pub is_send: bool,
}

/// A descriptor NCCL filled for the current callback: its `type` names the member it filled, whose
/// string pointers are NULL or NUL-terminated. [`Descriptor`] is implemented on it, never on the
/// bare bindgen type, so members are read only from a value someone vouched for.
#[repr(transparent)]
pub struct Filled<T>(T);

impl<T> Filled<T> {
    /// The descriptor at `ptr`; `None` for NULL.
    ///
    /// # Safety
    /// `ptr` is NULL or points to a `T` NCCL filled for the current callback (as above), valid
    /// and unchanged for `'a`.
    pub unsafe fn from_ptr<'a>(ptr: *const T) -> Option<&'a Filled<T>> {
        // SAFETY: `Filled<T>` is a transparent `T`; the rest is the caller's promise.
        unsafe { ptr.cast::<Filled<T>>().as_ref() }
    }
}

impl<T> std::ops::Deref for Filled<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// What `startEvent` needs from one ABI version's descriptor ([`Filled`]).
pub trait Descriptor {
    /// What the descriptor's table version fixes ([`Abi::table`]).
    const ABI: Abi;
    /// The `type` field, widened.
    fn event_type(&self) -> u64;
    /// `parentObj` as an integer (never dereferenced).
    fn parent(&self) -> u64;
    /// Coll member, when `type` is Coll.
    fn coll(&self) -> Option<CollStart>;
    /// P2p member (function, start), when `type` is P2p.
    fn p2p(&self) -> Option<(Func, P2pStart)>;
    /// ProxyOp member with the descriptor's rank, when `type` is ProxyOp.
    fn proxy_op(&self) -> Option<ProxyOp>;
    /// ProxyStep `step`, when `type` is ProxyStep.
    fn proxy_step(&self) -> Option<i32>;
    /// KernelCh (channel, GPU start time), when `type` is KernelCh.
    fn kernel_ch(&self) -> Option<(u8, u64)>;
    /// The communicator's hash and our rank, on a Coll or P2p of v1–v3 (their `init` gets
    /// neither).
    fn identity(&self) -> Option<(u64, i32)> {
        None
    }
    /// The application's tag of a Coll or P2p (v7 `userTag`); 0 when untagged or not given.
    fn user_tag(&self) -> u64 {
        0
    }
    /// KernelPhase (phase id, GPU start time), when `type` is KernelPhase (v7).
    fn kernel_phase(&self) -> Option<(u8, u64)> {
        None
    }
    /// Whether a Coll ran a symmetric-memory kernel (v7 `isSymColl`; NCCL then overwrites its
    /// algorithm and protocol names, spec 7.2.6).
    fn symmetric(&self) -> bool {
        false
    }
    /// CollApi member (v5+) as a collective's start: the user's function, count and type; no
    /// algorithm, protocol or channels.
    fn coll_api(&self) -> Option<CollStart> {
        None
    }
    /// CeColl member (v6+) as a collective's start, algorithm [`crate::record::Algo::CopyEngine`].
    fn ce_coll(&self) -> Option<CollStart> {
        None
    }
    /// `graphCaptured` of a CollApi or P2pApi (v5+).
    fn api_graph(&self) -> Option<bool> {
        None
    }
}

/// The [`Descriptor::coll_api`] and [`Descriptor::api_graph`] of a v5-to-v7 descriptor type,
/// inside its impl.
macro_rules! coll_api {
    () => {
        fn api_graph(&self) -> Option<bool> {
            // SAFETY: `type` says which member NCCL filled. `graphCaptured` is read as the byte
            // it is: a value other than 0 or 1 (an adapter's garbage) must not become a `bool`.
            unsafe {
                let u = &self.__bindgen_anon_1;
                let byte = if self.type_ == u64::from($crate::bindings::ncclProfileCollApi) {
                    (&raw const u.collApi.graphCaptured).cast::<u8>().read()
                } else if self.type_ == u64::from($crate::bindings::ncclProfileP2pApi) {
                    (&raw const u.p2pApi.graphCaptured).cast::<u8>().read()
                } else {
                    return None;
                };
                Some(byte != 0)
            }
        }

        fn coll_api(&self) -> Option<$crate::record::CollStart> {
            use $crate::record::{Algo, CollStart, Datatype, Func, Proto};
            if self.type_ != u64::from($crate::bindings::ncclProfileCollApi) {
                return None;
            }
            // SAFETY: `type` is CollApi, so NCCL filled `collApi`; its strings are NULL or
            // NUL-terminated literals of libnccl.
            unsafe {
                let c = &self.__bindgen_anon_1.collApi;
                Some(CollStart {
                    seq: 0,
                    count: c.count as u64,
                    func: Func::from_bytes($crate::abi::c_bytes(c.func)),
                    algo: Algo::Unknown,
                    proto: Proto::Unknown,
                    datatype: Datatype::from_bytes($crate::abi::c_bytes(c.datatype)),
                    n_channels: 0,
                    graph: self.api_graph(),
                    sample: crate::record::Sample::ALL,
                })
            }
        }
    };
}
use coll_api;

/// The [`Descriptor::ce_coll`] of a v6 or v7 descriptor type, inside its impl.
macro_rules! ce_coll {
    () => {
        fn ce_coll(&self) -> Option<$crate::record::CollStart> {
            use $crate::record::{Algo, CollStart, Datatype, Func, Proto};
            if self.type_ != u64::from($crate::bindings::ncclProfileCeColl) {
                return None;
            }
            // SAFETY: `type` is CeColl, so NCCL filled `ceColl`; its strings are NULL or
            // NUL-terminated literals of libnccl.
            unsafe {
                let c = &self.__bindgen_anon_1.ceColl;
                Some(CollStart {
                    seq: c.seqNumber,
                    count: c.count as u64,
                    func: Func::from_bytes($crate::abi::c_bytes(c.func)),
                    algo: Algo::CopyEngine,
                    proto: Proto::Unknown,
                    datatype: Datatype::from_bytes($crate::abi::c_bytes(c.datatype)),
                    n_channels: 0,
                    graph: None, // its parent CollApi tells
                    sample: crate::record::Sample::ALL,
                })
            }
        }
    };
}
use ce_coll;

/// What `recordEventState` needs from one ABI version's state arguments. The caller picks the
/// member by the state value, as NCCL does.
pub trait StateArgs {
    /// `proxyStep.transSize`.
    fn trans_size(&self) -> u64;
    /// `kernelCh.pTimer`.
    fn p_timer(&self) -> u64;
    /// `proxyOp.steps` (v1–v3).
    fn steps(&self) -> i32 {
        0
    }
}

/// The [`Descriptor::proxy_op`] of every version (the member has the same fields in all), inside
/// its impl.
macro_rules! proxy_op {
    () => {
        fn proxy_op(&self) -> Option<$crate::abi::ProxyOp> {
            if self.event_type() != u64::from($crate::bindings::ncclProfileProxyOp) {
                return None;
            }
            // SAFETY: `type` is ProxyOp, so NCCL filled the `proxyOp` member (plain integers).
            let p = unsafe { &self.__bindgen_anon_1.proxyOp };
            Some($crate::abi::ProxyOp {
                pid: p.pid,
                rank: self.rank,
                peer: p.peer,
                channel: p.channelId,
                is_send: p.isSend != 0,
            })
        }
    };
}
use proxy_op;

/// Bytes of a NUL-terminated C string, at most 64 of them; empty for NULL.
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string or at least 64 readable bytes (NCCL passes
/// static literals).
pub unsafe fn c_bytes<'a>(ptr: *const std::os::raw::c_char) -> &'a [u8] {
    if ptr.is_null() {
        return &[];
    }
    // SAFETY: per this function's contract, bytes are readable up to the NUL or the 64th.
    let len = (0..64).take_while(|&i| unsafe { *ptr.add(i) } != 0).count();
    // SAFETY: the `len` bytes just read are readable and stay valid for the callback.
    unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }
}

/// Implements [`Descriptor`] for the descriptor of table version `$version` of the v4 to v7
/// family (spec 2.5–2.7, 7.2.2): the `coll`, `p2p`, `proxyOp`, `proxyStep` and `kernelCh` members have the same fields and meanings in
/// all of them; only the width of `type` and members we do not read differ. `p2p.nChannels` is
/// never read (garbage under the v4 adapter, spec 4.8). With a state-argument type, implements
/// [`StateArgs`] for it too (v6 and v7 reuse v5's type); with a block, adds its methods to the
/// impl (v7's extensions).
macro_rules! api_family {
    ($version:literal, $descr:ty, $args:ty $(, { $($extra:tt)* })?) => {
        $crate::abi::api_family!($version, $descr { $($($extra)*)? });

        impl $crate::abi::StateArgs for $args {
            fn trans_size(&self) -> u64 {
                // SAFETY: every member is plain integer data of the same 8 bytes; any bit
                // pattern is valid.
                unsafe { self.proxyStep.transSize as u64 }
            }

            fn p_timer(&self) -> u64 {
                // SAFETY: as above.
                unsafe { self.kernelCh.pTimer }
            }
        }
    };
    ($version:literal, $descr:ty { $($extra:tt)* }) => {
        impl $crate::abi::Descriptor for $crate::abi::Filled<$descr> {
            const ABI: $crate::abi::Abi = $crate::abi::Abi::table($version);

            $($extra)*

            fn event_type(&self) -> u64 {
                u64::from(self.type_)
            }

            fn parent(&self) -> u64 {
                self.parentObj as u64
            }

            fn coll(&self) -> Option<$crate::record::CollStart> {
                use $crate::record::{Algo, CollStart, Datatype, Func, Proto};
                if self.event_type() != u64::from($crate::bindings::ncclProfileColl) {
                    return None;
                }
                // SAFETY: `type` is Coll, so NCCL filled the `coll` member; its strings are NULL
                // or NUL-terminated literals of libnccl.
                unsafe {
                    let c = &self.__bindgen_anon_1.coll;
                    Some(CollStart {
                        seq: c.seqNumber,
                        count: c.count as u64,
                        func: Func::from_bytes($crate::abi::c_bytes(c.func)),
                        algo: Algo::from_bytes($crate::abi::c_bytes(c.algo)),
                        proto: Proto::from_bytes($crate::abi::c_bytes(c.proto)),
                        datatype: Datatype::from_bytes($crate::abi::c_bytes(c.datatype)),
                        n_channels: c.nChannels,
                        graph: None, // its parent CollApi tells (v5+)
                        sample: crate::record::Sample::ALL,
                    })
                }
            }

            fn p2p(&self) -> Option<($crate::record::Func, $crate::record::P2pStart)> {
                use $crate::record::{Datatype, Func, P2pStart};
                if self.event_type() != u64::from($crate::bindings::ncclProfileP2p) {
                    return None;
                }
                // SAFETY: `type` is P2p, so NCCL filled `p2p` (all but `nChannels` under the v4
                // adapter, which we skip).
                unsafe {
                    let p = &self.__bindgen_anon_1.p2p;
                    let start = P2pStart {
                        count: p.count as u64,
                        peer: p.peer,
                        datatype: Datatype::from_bytes($crate::abi::c_bytes(p.datatype)),
                        graph: None, // its parent P2pApi tells (v5+)
                        sample: crate::record::Sample::ALL,
                    };
                    Some((Func::from_bytes($crate::abi::c_bytes(p.func)), start))
                }
            }

            $crate::abi::proxy_op!();

            fn proxy_step(&self) -> Option<i32> {
                if self.event_type() != u64::from($crate::bindings::ncclProfileProxyStep) {
                    return None;
                }
                // SAFETY: `type` is ProxyStep, so NCCL filled `proxyStep.step`.
                Some(unsafe { self.__bindgen_anon_1.proxyStep.step })
            }

            fn kernel_ch(&self) -> Option<(u8, u64)> {
                if self.event_type() != u64::from($crate::bindings::ncclProfileKernelCh) {
                    return None;
                }
                // SAFETY: `type` is KernelCh, so NCCL filled `kernelCh` (integers).
                let k = unsafe { &self.__bindgen_anon_1.kernelCh };
                Some((k.channelId, k.pTimer))
            }
        }
    };
}
use api_family;

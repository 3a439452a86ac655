//! Version-neutral records: what the hot path copies out of an NCCL callback into a window slot.
//!
//! Written by NCCL's user and proxy threads (one record per recorded callback), read by the
//! telemetry thread (or `finalize`) once the window is sealed. Every record names the event it
//! belongs to by its handle ([`crate::handle::Handle`] bits); start records also name their parent.
//! Strings from descriptors are classified into small enums during the call: no pointer into NCCL
//! memory survives the callback.
#![forbid(unsafe_code)]

/// Generates a `#[repr(u8)]` enum classified from the C string NCCL passes, with its display name.
macro_rules! c_string_enum {
    ($(#[$doc:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? } else $other:ident) => {
        $(#[$doc])*
        #[repr(u8)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $(#[doc = $text] $variant,)+
            /// Anything else (NULL, unknown, or a future NCCL spelling).
            $other,
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+ $name::$other];

            /// Classifies the bytes of a C string (without its NUL).
            pub fn from_bytes(bytes: &[u8]) -> Self {
                $(if bytes == $text.as_bytes() {
                    return $name::$variant;
                })+
                $name::$other
            }

            /// The name used in metric attributes.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                    $name::$other => "Unknown",
                }
            }
        }
    };
}

c_string_enum! {
    /// Collective or point-to-point function (`coll.func`, `p2p.func`).
    Func {
        AllGather => "AllGather",
        AllReduce => "AllReduce",
        AlltoAll => "AlltoAll",
        Broadcast => "Broadcast",
        Gather => "Gather",
        Reduce => "Reduce",
        ReduceScatter => "ReduceScatter",
        Scatter => "Scatter",
        SendRecv => "SendRecv",
        Send => "Send",
        Recv => "Recv",
    } else Unknown
}

c_string_enum! {
    /// Algorithm NCCL chose (`coll.algo`).
    Algo {
        Tree => "TREE",
        Ring => "RING",
        CollnetDirect => "COLLNET_DIRECT",
        CollnetChain => "COLLNET_CHAIN",
        Nvls => "NVLS",
        NvlsTree => "NVLS_TREE",
        Pat => "PAT",
    } else Unknown
}

c_string_enum! {
    /// Protocol NCCL chose (`coll.proto`).
    Proto {
        Ll => "LL",
        Ll128 => "LL128",
        Simple => "SIMPLE",
    } else Unknown
}

c_string_enum! {
    /// Element type (`coll.datatype`, `p2p.datatype`).
    Datatype {
        Int8 => "ncclInt8",
        Int32 => "ncclInt32",
        Uint32 => "ncclUint32",
        Int64 => "ncclInt64",
        Uint64 => "ncclUint64",
        Float16 => "ncclFloat16",
        Float32 => "ncclFloat32",
        Float64 => "ncclFloat64",
        Bfloat16 => "ncclBfloat16",
        Float8e4m3 => "ncclFloat8e4m3",
        Float8e5m2 => "ncclFloat8e5m2",
    } else Unknown
}

impl Datatype {
    /// Size of one element in bytes; `Unknown` is NCCL's spelling of uint8 (1 byte).
    pub fn size(self) -> u64 {
        match self {
            Datatype::Int8 | Datatype::Float8e4m3 | Datatype::Float8e5m2 | Datatype::Unknown => 1,
            Datatype::Float16 | Datatype::Bfloat16 => 2,
            Datatype::Int32 | Datatype::Uint32 | Datatype::Float32 => 4,
            Datatype::Int64 | Datatype::Uint64 | Datatype::Float64 => 8,
        }
    }
}

/// Start of a collective (`Coll` event).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CollStart {
    /// Per-communicator, per-function sequence number.
    pub seq: u64,
    /// Element count as NCCL reports it (bytes for AllGather/Broadcast, see `datatype`).
    pub count: u64,
    /// Root rank, for rooted collectives.
    pub root: i32,
    /// Function.
    pub func: Func,
    /// Algorithm.
    pub algo: Algo,
    /// Protocol.
    pub proto: Proto,
    /// Element type.
    pub datatype: Datatype,
    /// Channels the collective uses.
    pub n_channels: u8,
}

/// Start of a point-to-point send (`P2p` event; receives are declined).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct P2pStart {
    /// Element count.
    pub count: u64,
    /// Peer rank in the communicator.
    pub peer: i32,
    /// Element type.
    pub datatype: Datatype,
}

/// Start of a network send proxy operation (`ProxyOp` event with `isSend`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProxyOpStart {
    /// Handle of the Coll/P2p this op serves; 0 when NULL or foreign (PXN).
    pub parent: u64,
    /// Rank that created the op: ours, or the originator's for a PXN op.
    pub rank: i32,
    /// Remote rank the data goes to.
    pub peer: i32,
    /// Number of network transfers NCCL plans.
    pub n_steps: i32,
    /// Nominal bytes per transfer.
    pub chunk_size: i32,
    /// Channel.
    pub channel: u8,
}

/// What one record says about its event.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Body {
    /// A collective started.
    Coll(CollStart),
    /// A point-to-point send started.
    P2p(P2pStart),
    /// A send proxy operation started.
    ProxyOp(ProxyOpStart),
    /// A send proxy step (one network transfer) started under the ProxyOp handle `parent`.
    ProxyStep {
        /// Handle of the step's ProxyOp.
        parent: u64,
        /// Transfer index within the op.
        step: i32,
    },
    /// A kernel channel started on the GPU (`pTimer` at start, GPU nanoseconds).
    KernelCh {
        /// Handle of the Coll/P2p the channel works for.
        parent: u64,
        /// Channel.
        channel: u8,
        /// GPU start time (`%globaltimer`, ns).
        gpu_start: u64,
    },
    /// `ProxyStepSendWait`: the network accepted `bytes` for this step.
    SendWait {
        /// Bytes handed to the network (`transSize`).
        bytes: u64,
    },
    /// `KernelChStop`: the channel finished on the GPU.
    KernelChStop {
        /// GPU stop time (`%globaltimer`, ns).
        gpu_stop: u64,
    },
    /// The event stopped.
    Stop,
}

impl Body {
    /// Whether this record opens an event that is expected to get a `Stop`.
    pub fn opens(&self) -> bool {
        matches!(
            self,
            Body::Coll(_) | Body::P2p(_) | Body::ProxyOp(_) | Body::ProxyStep { .. } | Body::KernelCh { .. }
        )
    }
}

/// One slot's content: which event (`id`, a handle value), when (`ts`, clock ticks), and what.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Record {
    /// Handle of the event this record is about.
    pub id: u64,
    /// CPU time of the callback, in [`crate::clock`] ticks; 0 where nothing uses it (only
    /// Coll/P2p starts, SendWait, and ProxyOp/ProxyStep stops are timed).
    pub ts: u64,
    /// Payload.
    pub body: Body,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_nccl_strings() {
        assert_eq!(Func::from_bytes(b"AllReduce"), Func::AllReduce);
        assert_eq!(Func::from_bytes(b"Nope"), Func::Unknown);
        assert_eq!(Algo::from_bytes(b"NVLS_TREE"), Algo::NvlsTree);
        assert_eq!(Proto::from_bytes(b"LL128"), Proto::Ll128);
        assert_eq!(Datatype::from_bytes(b"ncclBfloat16"), Datatype::Bfloat16);
        assert_eq!(Datatype::from_bytes(b""), Datatype::Unknown);
        assert_eq!(Algo::Ring.as_str(), "RING");
        assert_eq!(Datatype::Unknown.as_str(), "Unknown");
    }

    #[test]
    fn record_fits_a_cache_friendly_slot() {
        assert!(std::mem::size_of::<Record>() <= 56, "{}", std::mem::size_of::<Record>());
    }
}

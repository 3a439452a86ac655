//! Names NCCL passes as C strings (function, algorithm, protocol, datatype), classified into
//! one-byte enums during the callback so that no pointer into NCCL memory is kept.
//! Called on: NCCL's user thread (classification); the telemetry thread (`as_str`).
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
    /// Algorithm NCCL chose (`coll.algo`); `SYMMETRIC` for a symmetric-memory kernel (v7
    /// `isSymColl`), whose own names NCCL puts in `algo` and `proto` (spec 7.2.6); `CE` for a
    /// copy-engine collective (v6 CeColl).
    Algo {
        Tree => "TREE",
        Ring => "RING",
        CollnetDirect => "COLLNET_DIRECT",
        CollnetChain => "COLLNET_CHAIN",
        Nvls => "NVLS",
        NvlsTree => "NVLS_TREE",
        Pat => "PAT",
        Symmetric => "SYMMETRIC",
        CopyEngine => "CE",
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

/// The numeric codes ABI v1 (NCCL 2.23) passes instead of strings: `ncclFunc_t`,
/// `ncclDataType_t` and NCCL's algorithm and protocol indices; anything else is `Unknown`.
pub mod codes {
    use super::{Algo, Datatype, Func, Proto};

    /// `ncclFunc_t` 0–7 (SendRecv never reaches a profiler).
    const FUNCS: [Func; 8] = [
        Func::Broadcast,
        Func::Reduce,
        Func::AllGather,
        Func::ReduceScatter,
        Func::AllReduce,
        Func::SendRecv,
        Func::Send,
        Func::Recv,
    ];
    /// `ncclDataType_t` 0–11 (`ncclUint8`, 1, has no name of its own: `Unknown`, 1 byte).
    const DATATYPES: [Datatype; 12] = [
        Datatype::Int8,
        Datatype::Unknown,
        Datatype::Int32,
        Datatype::Uint32,
        Datatype::Int64,
        Datatype::Uint64,
        Datatype::Float16,
        Datatype::Float32,
        Datatype::Float64,
        Datatype::Bfloat16,
        Datatype::Float8e4m3,
        Datatype::Float8e5m2,
    ];
    /// `NCCL_ALGO_*` 0–6.
    const ALGOS: [Algo; 7] = [
        Algo::Tree,
        Algo::Ring,
        Algo::CollnetDirect,
        Algo::CollnetChain,
        Algo::Nvls,
        Algo::NvlsTree,
        Algo::Pat,
    ];
    /// `NCCL_PROTO_*` 0–2.
    const PROTOS: [Proto; 3] = [Proto::Ll, Proto::Ll128, Proto::Simple];

    /// Function of a `ncclFunc_t` code.
    pub fn func(code: u8) -> Func {
        FUNCS.get(usize::from(code)).copied().unwrap_or(Func::Unknown)
    }
    /// Element type of a `ncclDataType_t` code.
    pub fn datatype(code: u8) -> Datatype {
        DATATYPES.get(usize::from(code)).copied().unwrap_or(Datatype::Unknown)
    }
    /// Algorithm of an `NCCL_ALGO_*` index.
    pub fn algo(code: u8) -> Algo {
        ALGOS.get(usize::from(code)).copied().unwrap_or(Algo::Unknown)
    }
    /// Protocol of an `NCCL_PROTO_*` index.
    pub fn proto(code: u8) -> Proto {
        PROTOS.get(usize::from(code)).copied().unwrap_or(Proto::Unknown)
    }
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
    fn classifies_v1_codes() {
        assert_eq!(codes::func(4), Func::AllReduce);
        assert_eq!(codes::func(6), Func::Send);
        assert_eq!(codes::func(8), Func::Unknown);
        assert_eq!(codes::datatype(9), Datatype::Bfloat16);
        assert_eq!(codes::datatype(1).size(), 1);
        assert_eq!(codes::algo(6), Algo::Pat);
        assert_eq!(codes::proto(2), Proto::Simple);
        assert_eq!(codes::proto(3), Proto::Unknown);
    }
}

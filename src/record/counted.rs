//! What the hot path keeps of an operation it counts without recording it (overload shedding):
//! the attributes a count and a size need, nothing else. Written on NCCL's user threads (into
//! the communicator's count table), read on the telemetry thread.
#![forbid(unsafe_code)]

use super::{Algo, Func, Proto};

/// The attributes of a counted-only operation. A P2P send is counted under `Func::Send` with no
/// peer; a collective's size class is [`super::size::size_class`] of its nccl-tests size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CountKey {
    /// Function.
    pub func: Func,
    /// Algorithm (`Unknown` for P2P).
    pub algo: Algo,
    /// Protocol (`Unknown` for P2P).
    pub proto: Proto,
    /// Message-size class ([`super::size::UNKNOWN_CLASS`] when the size is unknown).
    pub class: u8,
    /// A point-to-point send, not a collective.
    pub p2p: bool,
}

impl CountKey {
    /// The key as a non-zero integer (0 marks an empty table entry).
    pub fn pack(self) -> u32 {
        1 | u32::from(self.func as u8) << 1
            | u32::from(self.algo as u8) << 6
            | u32::from(self.proto as u8) << 11
            | u32::from(self.class) << 16
            | u32::from(self.p2p) << 24
    }

    /// The key [`CountKey::pack`] made `bits` from; `None` for 0 or bits no key makes.
    pub fn unpack(bits: u32) -> Option<CountKey> {
        if bits & 1 == 0 {
            return None;
        }
        let field = |shift: u32, width: u32| ((bits >> shift) & ((1 << width) - 1)) as usize;
        Some(CountKey {
            func: *Func::ALL.get(field(1, 5))?,
            algo: *Algo::ALL.get(field(6, 5))?,
            proto: *Proto::ALL.get(field(11, 5))?,
            class: field(16, 8) as u8,
            p2p: field(24, 1) == 1,
        })
    }
}

/// Operations counted without a record since the last drain, under one key (`None`: the table
/// was full, attributes folded into `other`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counted {
    /// The attributes, or `None` for the overflow entry.
    pub key: Option<CountKey>,
    /// Operations.
    pub ops: u64,
    /// Their bytes: NCCL's `count` × datatype size, summed (the per-rank part for AllGather and
    /// ReduceScatter, as in a [`super::CollStart`]).
    pub bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        for &func in Func::ALL {
            for &algo in Algo::ALL {
                for &proto in Proto::ALL {
                    for (class, p2p) in [(0, false), (10, true), (32, false)] {
                        let k = CountKey { func, algo, proto, class, p2p };
                        assert_ne!(k.pack(), 0);
                        assert_eq!(CountKey::unpack(k.pack()), Some(k));
                    }
                }
            }
        }
        assert_eq!(CountKey::unpack(0), None);
    }
}

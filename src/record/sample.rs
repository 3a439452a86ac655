//! Deterministic sampling of operations under overload: which operations keep their times when
//! the plugin sheds records, decided from (communicator hash, the plugin's own count of the
//! communicator's operations) so that every rank of a communicator keeps the same ones without
//! talking, and nested across rates (a rank keeping 1 in 2^(k+1) keeps a subset of a rank keeping
//! 1 in 2^k). Pure arithmetic; called on NCCL's threads (the decision) and the telemetry thread
//! (the weights).
#![forbid(unsafe_code)]

/// The largest sampling exponent: 1 in 4,096 operations timed.
pub const MAX_K: u8 = 12;

/// SplitMix64's `n`-th output from the seed `hash`: the key of operation `n` of a communicator.
#[inline]
pub fn key(hash: u64, n: u64) -> u64 {
    let mut z = hash.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Whether the operation of `key` is in the sample of rate 2^-k: its top `k` bits are zero.
/// Nested: in the sample at `k + 1` ⇒ in the sample at `k`; every key is in the sample at 0.
#[inline]
pub fn sampled(key: u64, k: u8) -> bool {
    key.leading_zeros() >= u32::from(k)
}

/// Why a recorded operation was recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Role {
    /// In the sample: its times stand for 2^k operations.
    #[default]
    Timed,
    /// Only the predecessor of a timed operation: recorded for its completion (the service time
    /// of its successor starts there), counted, but not in timed statistics.
    Predecessor,
}

/// How a recorded Coll/P2p start was sampled; part of its start record (two bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// The sampling exponent `k` (bits 0–6) and [`Role::Predecessor`] (bit 7).
    bits: u8,
    /// The low byte of the operation's number on its communicator (Coll and P2P counted apart),
    /// to tell whether two recorded operations are consecutive.
    pub ord: u8,
}

impl Sample {
    /// Every operation recorded and timed (no shedding).
    pub const ALL: Sample = Sample { bits: 0, ord: 0 };

    /// Operation `ord` (low byte) recorded as `role` at exponent `k` (at most [`MAX_K`]).
    pub fn new(k: u8, role: Role, ord: u8) -> Sample {
        let pred = if role == Role::Predecessor { 0x80 } else { 0 };
        Sample { bits: k.min(MAX_K) | pred, ord }
    }

    /// The sampling exponent in force: 1 in 2^k operations timed (0: every one).
    pub fn k(self) -> u8 {
        self.bits & 0x7F
    }

    /// Why it was recorded.
    pub fn role(self) -> Role {
        if self.bits & 0x80 != 0 { Role::Predecessor } else { Role::Timed }
    }

    /// How many operations this one's times stand for: 2^k when timed, 0 for a predecessor only.
    pub fn weight(self) -> u32 {
        match self.role() {
            Role::Timed => 1 << self.k(),
            Role::Predecessor => 0,
        }
    }

    /// Whether an operation recorded with `self` directly follows one recorded with `prev`.
    pub fn follows(self, prev: Sample) -> bool {
        self.ord == prev.ord.wrapping_add(1)
    }
}

/// The decision for operation `n` of a communicator of hash `hash` at sampling exponent `k`:
/// `Some(sample)` when it is recorded (timed, or the predecessor of a timed one), `None` when it
/// is only counted.
#[inline]
pub fn decide(hash: u64, n: u64, k: u8) -> Option<Sample> {
    let ord = n as u8;
    if sampled(key(hash, n), k) {
        Some(Sample::new(k, Role::Timed, ord))
    } else if sampled(key(hash, n.wrapping_add(1)), k) {
        Some(Sample::new(k, Role::Predecessor, ord))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_operation_is_timed_at_zero() {
        for n in 0..1000 {
            assert_eq!(decide(7, n, 0), Some(Sample::new(0, Role::Timed, n as u8)));
        }
    }

    #[test]
    fn the_rate_is_two_to_the_minus_k() {
        let hash = 0x1234_5678_9abc_def0;
        for k in 1..=6u8 {
            let n = 1u64 << 16;
            let timed = (0..n).filter(|&i| sampled(key(hash, i), k)).count() as f64;
            let p = 1.0 / f64::from(1u32 << k);
            let sigma = (n as f64 * p * (1.0 - p)).sqrt();
            assert!((timed - n as f64 * p).abs() < 4.0 * sigma, "k {k}: {timed} of {n}");
        }
    }

    #[test]
    fn predecessors_precede_timed_operations() {
        let (hash, k) = (99, 3);
        for n in 0..5000u64 {
            if decide(hash, n, k).map(Sample::role) == Some(Role::Predecessor) {
                assert_eq!(decide(hash, n + 1, k).map(Sample::role), Some(Role::Timed));
            }
        }
    }

    #[test]
    fn weights_and_adjacency() {
        let s = Sample::new(3, Role::Timed, 0);
        assert_eq!((s.k(), s.role(), s.weight()), (3, Role::Timed, 8));
        assert_eq!(Sample::new(3, Role::Predecessor, 0).weight(), 0);
        assert!(s.follows(Sample::new(3, Role::Timed, 255)));
        assert!(!s.follows(Sample::new(3, Role::Timed, 254)));
    }

    proptest! {
        #[test]
        fn samples_are_nested(hash: u64, n: u64, k in 0u8..MAX_K) {
            let x = key(hash, n);
            prop_assert!(!sampled(x, k + 1) || sampled(x, k));
        }
    }
}

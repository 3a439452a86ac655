//! Sizes and bandwidths as nccl-tests defines them, so figures compare with what NCCL users
//! already know: an operation's "size" from NCCL's `count`, the bus-bandwidth factor per function,
//! and the power-of-two message-size class that bounds the size attribute.
//! Pure arithmetic; used on the telemetry thread.
#![forbid(unsafe_code)]

use crate::record::{CollStart, Func};
pub use crate::record::size::{UNKNOWN_CLASS, size_class, size_class_name, test_size};

/// [`test_size`] of a collective from its start record.
pub fn coll_size(c: &CollStart, nranks: i32) -> Option<u64> {
    test_size(c.func, c.count.saturating_mul(c.datatype.size()), nranks)
}

/// nccl-tests' bus-bandwidth factor (`busBw = algBw × factor`): `2(n−1)/n` for AllReduce,
/// `(n−1)/n` for AllGather, ReduceScatter and AlltoAll (`None` for these when `nranks` is
/// unknown, 0), 1 otherwise (Broadcast, Reduce, Send, Recv).
pub fn bus_factor(func: Func, nranks: i32) -> Option<f64> {
    let n = f64::from(nranks.max(1));
    match func {
        Func::AllReduce | Func::AllGather | Func::ReduceScatter | Func::AlltoAll if nranks <= 0 => None,
        Func::AllReduce => Some(2.0 * (n - 1.0) / n),
        Func::AllGather | Func::ReduceScatter | Func::AlltoAll => Some((n - 1.0) / n),
        _ => Some(1.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_factors_are_nccl_tests_factors() {
        assert_eq!(bus_factor(Func::AllReduce, 4), Some(1.5));
        assert_eq!(bus_factor(Func::AllGather, 4), Some(0.75));
        assert_eq!(bus_factor(Func::ReduceScatter, 8), Some(0.875));
        assert_eq!(bus_factor(Func::Broadcast, 8), Some(1.0));
        assert_eq!(bus_factor(Func::Send, 2), Some(1.0));
        assert_eq!(bus_factor(Func::AllReduce, 1), Some(0.0));
        assert_eq!(bus_factor(Func::AllReduce, 0), None, "nranks unknown (v1–v3)");
        assert_eq!(bus_factor(Func::Broadcast, 0), Some(1.0));
    }

}

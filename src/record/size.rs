//! Message sizes as nccl-tests defines them: an operation's "size" from NCCL's `count`, and the
//! power-of-two size class that bounds the size attribute. Pure arithmetic; used on NCCL's
//! threads (the class of an operation counted without a record) and the telemetry thread.
#![forbid(unsafe_code)]

use super::Func;

/// nccl-tests' "size" of one operation, in bytes, from the Coll/P2p event's `count` × datatype
/// size (`count_bytes`): AllGather and ReduceScatter report the per-rank part (AllGather's
/// `sendcount`, ReduceScatter's `recvcount`), nccl-tests the whole buffer, so × `nranks`
/// (`None` when the communicator's size is unknown, `nranks` 0: ABI v1–v3); every other
/// function as reported.
pub fn test_size(func: Func, count_bytes: u64, nranks: i32) -> Option<u64> {
    match func {
        Func::AllGather | Func::ReduceScatter if nranks <= 0 => None,
        Func::AllGather | Func::ReduceScatter => Some(count_bytes.saturating_mul(u64::from(nranks.unsigned_abs()))),
        _ => Some(count_bytes),
    }
}

/// The size class of an operation whose size is unknown ([`test_size`] `None`).
pub const UNKNOWN_CLASS: u8 = 0;

/// Smallest and largest size class: 1 KiB (everything up to it) and 4 GiB (everything above
/// 2 GiB).
const MIN_CLASS: u8 = 10;
const MAX_CLASS: u8 = 32;

/// The message-size class of `bytes`: `k` for sizes in `(2^(k−1), 2^k]`, clamped to 10..=32
/// (≤ 1 KiB … > 2 GiB): 23 values at most.
pub fn size_class(bytes: u64) -> u8 {
    let k = u64::BITS - bytes.saturating_sub(1).leading_zeros();
    (k as u8).clamp(MIN_CLASS, MAX_CLASS)
}

/// The attribute value of a size class: its upper bound, `1KiB` … `4GiB`, or `unknown`.
pub fn size_class_name(class: u8) -> &'static str {
    if class == UNKNOWN_CLASS {
        return "unknown";
    }
    const NAMES: [&str; 23] = [
        "1KiB", "2KiB", "4KiB", "8KiB", "16KiB", "32KiB", "64KiB", "128KiB", "256KiB", "512KiB", "1MiB", "2MiB",
        "4MiB", "8MiB", "16MiB", "32MiB", "64MiB", "128MiB", "256MiB", "512MiB", "1GiB", "2GiB", "4GiB",
    ];
    let i = usize::from(class.clamp(MIN_CLASS, MAX_CLASS) - MIN_CLASS);
    NAMES.get(i).copied().unwrap_or("4GiB")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_nccl_tests_sizes() {
        assert_eq!(test_size(Func::AllReduce, 1 << 20, 8), Some(1 << 20));
        assert_eq!(test_size(Func::AllGather, 1 << 20, 8), Some(8 << 20));
        assert_eq!(test_size(Func::ReduceScatter, 1 << 20, 4), Some(4 << 20));
        assert_eq!(test_size(Func::Broadcast, 1 << 20, 8), Some(1 << 20));
        assert_eq!(test_size(Func::Send, 100, 8), Some(100));
        assert_eq!(test_size(Func::AllGather, 1 << 20, 0), None, "nranks unknown (v1–v3)");
        assert_eq!(test_size(Func::AllReduce, 1 << 20, 0), Some(1 << 20));
    }

    #[test]
    fn size_classes_are_bounded_powers_of_two() {
        assert_eq!(size_class(0), 10);
        assert_eq!(size_class(1024), 10);
        assert_eq!(size_class(1025), 11);
        assert_eq!(size_class(1 << 20), 20);
        assert_eq!(size_class((1 << 20) + 1), 21);
        assert_eq!(size_class(u64::MAX), 32);
        assert_eq!(size_class_name(size_class(1 << 20)), "1MiB");
        assert_eq!(size_class_name(size_class(3 << 30)), "4GiB");
        assert_eq!(size_class_name(size_class(1)), "1KiB");
    }
}

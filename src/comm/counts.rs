//! A communicator's table of operations counted without a record: when the hot path sheds an
//! operation (overload), it still counts it and its bytes here, under its [`CountKey`], so every
//! operation is counted and sized. Lock-free: NCCL's user threads (and CUDA's host-callback
//! thread for graph replays) add; the consumer drains. 64 keys, then the `other` entry.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use crate::record::counted::{CountKey, Counted};

/// Distinct keys a communicator's table holds before folding into `other`.
const SLOTS: usize = 64;
/// Entries tried from a key's home slot before `other`.
const PROBES: usize = 4;

/// One key's counts (key 0: empty).
#[derive(Default)]
struct Entry {
    key: AtomicU32,
    ops: AtomicU64,
    bytes: AtomicU64,
}

impl Entry {
    fn add(&self, bytes: u64) {
        self.ops.fetch_add(1, Relaxed);
        self.bytes.fetch_add(bytes, Relaxed);
    }

    /// The counts since the last take, reset to 0 (an add racing the take lands in this take or
    /// the next: nothing is lost).
    fn take(&self, key: Option<CountKey>) -> Option<Counted> {
        let ops = self.ops.swap(0, Relaxed);
        let bytes = self.bytes.swap(0, Relaxed);
        (ops != 0 || bytes != 0).then_some(Counted { key, ops, bytes })
    }
}

/// The table ([`SLOTS`] keys, open addressing, then `other`).
pub struct Counts {
    slots: [Entry; SLOTS],
    other: Entry,
}

impl Default for Counts {
    fn default() -> Self {
        Counts { slots: std::array::from_fn(|_| Entry::default()), other: Entry::default() }
    }
}

impl Counts {
    /// Counts one operation of `bytes` under `key`. Never blocks, never allocates.
    pub fn add(&self, key: CountKey, bytes: u64) {
        let bits = key.pack();
        let home = (bits.wrapping_mul(0x9E37_79B9) >> 26) as usize;
        for i in 0..PROBES {
            let e = &self.slots[(home + i) % SLOTS];
            let seen = e.key.load(Relaxed);
            let mine = seen == bits
                || (seen == 0 && e.key.compare_exchange(0, bits, Relaxed, Relaxed).map_or_else(|won| won == bits, |_| true));
            if mine {
                e.add(bytes);
                return;
            }
        }
        self.other.add(bytes);
    }

    /// Appends to `out` every key's counts since the last drain and resets them.
    pub fn drain(&self, out: &mut Vec<Counted>) {
        for e in &self.slots {
            if let Some(key) = CountKey::unpack(e.key.load(Relaxed)) {
                out.extend(e.take(Some(key)));
            }
        }
        out.extend(self.other.take(None));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Algo, Func, Proto};

    fn key(class: u8) -> CountKey {
        CountKey { func: Func::AllReduce, algo: Algo::Ring, proto: Proto::Simple, class, p2p: false }
    }

    #[test]
    fn counts_by_key_and_folds_the_rest_into_other() {
        let t = Counts::default();
        for class in 0..=255u8 {
            t.add(key(class), 10);
        }
        t.add(key(3), 5);
        let mut out = Vec::new();
        t.drain(&mut out);
        assert_eq!(out.iter().map(|c| c.ops).sum::<u64>(), 257);
        assert_eq!(out.iter().map(|c| c.bytes).sum::<u64>(), 2565);
        assert!(out.iter().filter(|c| c.key.is_some()).count() <= SLOTS);
        assert!(out.iter().any(|c| c.key.is_none()), "256 keys overflow 64 slots");
        let three = out.iter().find(|c| c.key == Some(key(3)));
        assert!(three.is_none_or(|c| c.ops == 2 && c.bytes == 15));
        out.clear();
        t.drain(&mut out);
        assert!(out.is_empty(), "a drain resets");
    }

    #[test]
    fn concurrent_adds_are_all_counted() {
        let t = Counts::default();
        std::thread::scope(|s| {
            for th in 0..2u8 {
                let t = &t;
                s.spawn(move || {
                    for i in 0..20_000u32 {
                        t.add(key((i % 7) as u8 + th), 1);
                    }
                });
            }
        });
        let mut out = Vec::new();
        t.drain(&mut out);
        assert_eq!(out.iter().map(|c| c.ops).sum::<u64>(), 40_000);
        assert_eq!(out.iter().filter(|c| c.key.is_some()).count(), 8);
    }
}

//! Process-wide counters for what cannot be attributed to a communicator (NULL or stale inputs,
//! declined events, caught panics). Called on: every NCCL thread (`add`), the telemetry thread
//! (`get`). Counters are sharded by the calling thread's stack address, so proxy threads of
//! different communicators do not bounce one cache line; no thread-local storage, no allocation.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

const SHARDS: usize = 8;

/// A relaxed counter spread over a few cache lines.
pub struct Counter([CachePadded<AtomicU64>; SHARDS]);

impl Counter {
    /// Zero.
    pub const fn new() -> Counter {
        Counter([const { CachePadded::new(AtomicU64::new(0)) }; SHARDS])
    }

    /// Adds one. Called on: any thread; lock-free.
    #[inline]
    pub fn incr(&self) {
        let probe = 0u8;
        // Thread stacks are separate mappings, so the address picks a stable shard per thread.
        let shard = ((&probe as *const u8 as usize >> 16).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 61) % SHARDS;
        if let Some(c) = self.0.get(shard) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Sum of all shards.
    pub fn get(&self) -> u64 {
        self.0.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

impl Default for Counter {
    fn default() -> Self {
        Counter::new()
    }
}

/// Why a callback did nothing.
pub struct Stats {
    /// Panics caught by the FFI guard.
    pub panics: Counter,
    /// NULL `eHandle`, descriptor or context where one was needed.
    pub null_args: Counter,
    /// Handles or contexts that are not (or no longer) ours.
    pub stale: Counter,
    /// Event types we do not know.
    pub unknown_types: Counter,
    /// States we do not know for the event's type.
    pub unknown_states: Counter,
    /// Events declined by design: P2P receives, receive steps of ABI v1–v3, ProxyCtrl, NetPlugin,
    /// children of declined parents, and Group (it gets a handle but no record); and the
    /// `stopEvent(NULL)` NCCL 2.23–2.25 send for the tasks we declined.
    pub declined: Counter,
    /// PXN ProxyOps from another process, recorded under our communicator with the same hash.
    pub foreign_ops: Counter,
    /// PXN ProxyOps from another process with no matching communicator here (dropped).
    pub foreign_unmatched: Counter,
}

/// The counters' values at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// See [`Stats::panics`].
    pub panics: u64,
    /// See [`Stats::null_args`].
    pub null_args: u64,
    /// See [`Stats::stale`].
    pub stale: u64,
    /// See [`Stats::unknown_types`].
    pub unknown_types: u64,
    /// See [`Stats::unknown_states`].
    pub unknown_states: u64,
    /// See [`Stats::declined`].
    pub declined: u64,
    /// See [`Stats::foreign_ops`].
    pub foreign_ops: u64,
    /// See [`Stats::foreign_unmatched`].
    pub foreign_unmatched: u64,
}

impl Stats {
    /// Every counter now. Called on: the telemetry thread.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            panics: self.panics.get(),
            null_args: self.null_args.get(),
            stale: self.stale.get(),
            unknown_types: self.unknown_types.get(),
            unknown_states: self.unknown_states.get(),
            declined: self.declined.get(),
            foreign_ops: self.foreign_ops.get(),
            foreign_unmatched: self.foreign_unmatched.get(),
        }
    }
}

impl Snapshot {
    /// What each counter gained since `earlier`.
    pub fn since(&self, earlier: &Snapshot) -> Snapshot {
        Snapshot {
            panics: self.panics.saturating_sub(earlier.panics),
            null_args: self.null_args.saturating_sub(earlier.null_args),
            stale: self.stale.saturating_sub(earlier.stale),
            unknown_types: self.unknown_types.saturating_sub(earlier.unknown_types),
            unknown_states: self.unknown_states.saturating_sub(earlier.unknown_states),
            declined: self.declined.saturating_sub(earlier.declined),
            foreign_ops: self.foreign_ops.saturating_sub(earlier.foreign_ops),
            foreign_unmatched: self.foreign_unmatched.saturating_sub(earlier.foreign_unmatched),
        }
    }
}

/// The process's counters.
pub static STATS: Stats = Stats {
    panics: Counter::new(),
    null_args: Counter::new(),
    stale: Counter::new(),
    unknown_types: Counter::new(),
    unknown_states: Counter::new(),
    declined: Counter::new(),
    foreign_ops: Counter::new(),
    foreign_unmatched: Counter::new(),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_across_threads() {
        let c = Counter::new();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| (0..1000).for_each(|_| c.incr()));
            }
        });
        assert_eq!(c.get(), 4000);
    }
}

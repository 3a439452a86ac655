//! The shed level a communicator's next window gets (overload): 0 records everything, 1 drops
//! ProxyStep detail, `1 + k` also times only 1 in 2^k operations (`crate::record::sample`),
//! counting the others. Decided by the consumer (telemetry thread or `finalize`) from what it
//! observes; pure policy, no atomics.
#![forbid(unsafe_code)]

/// Level 1: ProxyStep detail off, every operation timed.
pub const DETAIL: u8 = 1;
/// The highest level: detail off, 1 in 2^[`crate::record::sample::MAX_K`] operations timed.
pub const MAX_LEVEL: u8 = 1 + crate::record::sample::MAX_K;

/// The sampling exponent `k` of a level (0 at levels 0 and 1).
pub fn k_of(level: u8) -> u8 {
    level.saturating_sub(DETAIL).min(crate::record::sample::MAX_K)
}

/// What the consumer observed since its last decision.
#[derive(Clone, Copy, Debug, Default)]
pub struct Signals {
    /// Records dropped (full, late or unpublished) since the last decision.
    pub drops: u64,
    /// Windows closed and not yet processed.
    pub backlog: usize,
    /// Fraction of recent wall time the telemetry thread spent working (0–1).
    pub busy: f64,
    /// Bytes of records buffered in the communicator's FILLING and CLOSING windows.
    pub buffered: u64,
}

/// A communicator's level controller.
#[derive(Clone, Debug, Default)]
pub struct Controller {
    level: u8,
}

impl Controller {
    /// The level the next window gets.
    pub fn level(&self) -> u8 {
        self.level
    }

    /// Takes in what the consumer observed.
    pub fn observe(&mut self, _signals: Signals) {}
}

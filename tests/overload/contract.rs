//! Stand-ins for names the shedding hot path and the weighted aggregation add, so that this
//! binary builds before they exist. Each item says what it stands for; once those names exist,
//! this file goes and its callers use them directly (set [`MERGED`] to `true` first to see the
//! bounds asserted).

use nccl_profiler_otel::aggregate::{OpSample, WindowSummary};

/// Whether the stand-ins below are the real thing: the tests assert their bounds only then
/// (before, they print what they measured).
pub const MERGED: bool = false;

/// Stands for `comm::force_level(Option<u8>)`: every communicator's windows at this shed level
/// (`None`: the controller decides).
pub fn force_level(_level: Option<u8>) {}

/// Stands for `WindowSummary::counted`: the operations of the window's communicator counted
/// without a record (`Σ Counted::ops`).
pub fn counted_ops(_s: &WindowSummary) -> u64 {
    0
}

/// Stands for `OpSample::weight`: 2^k for a timed operation of a window at `1 + k`, 0 for one
/// recorded only as the predecessor of a timed one (every operation is timed with weight 1 at
/// levels 0 and 1).
pub fn weight(_o: &OpSample) -> u32 {
    1
}

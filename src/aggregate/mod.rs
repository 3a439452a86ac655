//! Aggregation of closed windows, on the telemetry thread (or `finalize`): the summary types
//! ([`summary`]), the linking pass that builds them from one window's records ([`link`]), and the
//! mergeable least-squares statistics behind every link and channel fit ([`regression`]).
//! Pure: no I/O, clocks, atomics or OpenTelemetry types.

pub mod link;
pub mod regression;
pub mod summary;

pub use link::summarize;
pub use summary::{
    ChannelGroup, CollGroup, CollKey, CommMeta, LinkGroup, OpSample, P2pGroup, Transfer, WindowId, WindowStats,
    WindowSummary,
};

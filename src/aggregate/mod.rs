//! Aggregation of closed windows, on the telemetry thread (or `finalize`): the summary types
//! ([`summary`]), the rule for which events are open ([`lifetime`]), the linking pass that builds them from one window's records ([`link`]), the
//! table of operations still open across windows ([`open`]) with the operations in flight
//! ([`flight`]), each link's transfers as a queue
//! ([`queue`]), the mergeable least-squares
//! statistics behind every link and channel fit ([`regression`]), each operation's queue wait and
//! service time ([`service`]), nccl-tests' size and
//! bandwidth definitions ([`bandwidth`]), and the export interval those summaries are merged
//! into and fitted over ([`interval`]: the values the exporter reads).
//! Pure: no I/O, clocks, atomics or OpenTelemetry types.

pub mod bandwidth;
pub mod flight;
pub mod idle;
pub mod interval;
pub mod lifetime;
pub mod link;
pub mod open;
pub mod queue;
pub mod regression;
pub mod service;
pub mod summary;

#[cfg(any(test, feature = "testing"))]
pub use crate::record::CommMeta;
pub use flight::CommProgress;
#[cfg(any(test, feature = "testing"))]
pub use link::summarize;
pub use link::{Lanes, Sealed, release};
pub use open::{Frontier, OpenOps};
pub use service::{SERVICE_MISSING, Split};
pub use summary::{OpSample, Transfer, WindowId, WindowSummary};
#[cfg(any(test, feature = "testing"))]
pub use summary::{LinkGroup, Waits, WindowStats};

//! The background telemetry thread, the sinks it feeds, and flushing with a deadline.
//!
//! One thread per process, started by the first `init` and never stopped (the library is linked
//! `-z nodelete`, so it survives NCCL's `dlclose` and serves later `init`s), parked while no
//! communicator is live (once the final totals were exported). Every [`thread::TICK`], or at once
//! when [`flush`] asks, it polls each communicator ([`consumer::Slot::poll_loaded`], the consumer
//! side of the windows, which this module owns): windows close on their count or time trigger and
//! finished windows are summarised. The [`report::Reporter`] merges the summaries into the export
//! interval and decides when it ends; each pass hands the export [`Pipeline`] one plain
//! [`Report`], and the pass that ends an interval (or flushes) queues one export request.
//! `finalize` processes its communicator's last windows ([`consumer::Slot::finalize`]) and hands
//! them to the thread through the [`inbox`] ([`deliver`]). With the `testing` feature, every
//! summary also goes to the sinks tests register ([`sink`]).
//!
//! The export side is reached only through the traits here ([`Pipeline`], [`Delivery`]) and
//! plain values ([`Report`]): `crate::export` depends on this module, never the reverse.
//!
//! Threads: the telemetry thread ([`thread`]); NCCL's finalizing thread in [`deliver`] and
//! [`flush`]; `init` in [`start`]; the exiting thread in [`flush`] (atexit). [`flush`] never
//! waits past its deadline, whatever the collector does. In a forked child ([`forked`]) none of
//! this runs: the thread did not survive the fork and its locks may be held forever.
#![forbid(unsafe_code)]

pub mod consumer;
pub mod flush;
pub mod inbox;
pub mod process;
pub mod report;
pub mod sink;
pub mod thread;

pub use flush::{flush, flush_deadline, wake};
pub use crate::comm::DropCounts;
pub use report::{CommState, IntervalEnd, Report, SelfTelemetry};
pub use process::forked;
pub use sink::deliver;
pub use thread::start;
#[cfg(any(test, feature = "testing"))]
pub use {
    sink::{Sink, add_sink},
    thread::{TICK, passes},
};

use std::time::Instant;

/// What the telemetry thread drives every pass: the export pipeline (`crate::export` implements
/// it). Called on: the telemetry thread only.
pub trait Pipeline: Send {
    /// Records `report`'s windows; when it ends an interval, records the interval's figures and
    /// counters and queues one export request, whose sequence number it returns.
    fn export(&mut self, report: Report) -> Option<u64>;
}

/// The export queue as flushing threads see it (`crate::export` implements it).
/// Called on: a finalizing NCCL thread, the exiting thread.
pub trait Delivery: Sync {
    /// Whether the last export request went through (true before the first one).
    fn healthy(&self) -> bool;
    /// Waits until request `seq` is finished (sent or failed, or dropped and a later one sent or
    /// failed) or `deadline` passes; returns whether it finished.
    fn wait_exported(&self, seq: u64, deadline: Instant) -> bool;
}

/// Builds the pipeline on the telemetry thread when it starts; `None` leaves export off.
pub type BuildPipeline = Box<dyn FnOnce() -> Option<Box<dyn Pipeline>> + Send>;

/// An export back end, built once per process at the first `init`.
pub struct Backend {
    /// See [`BuildPipeline`].
    pub pipeline: BuildPipeline,
    /// The queue [`flush`] waits on.
    pub delivery: &'static dyn Delivery,
}

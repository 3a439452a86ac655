//! The background telemetry thread, the sinks it feeds, and flushing with a deadline.
//!
//! One thread per process, started by the first `init` and never stopped (the library is linked
//! `-z nodelete`, so it survives NCCL's `dlclose` and serves later `init`s), parked while no
//! communicator is live (once the final totals were exported). Every [`thread::TICK`], or at once
//! when [`flush`] asks, it polls each communicator ([`crate::comm::Comm::poll`]): windows
//! close on their count or time trigger, finished windows are summarised, and each summary goes
//! straight to the export [`Pipeline`], which records it and, once per interval or on a flush,
//! queues an export request. `finalize` hands its communicator's last windows to the pipeline
//! through the [`inbox`] ([`deliver`]). With the `testing` feature, every summary also goes to the
//! sinks tests register ([`sink`]).
//!
//! The export side is reached only through the traits here ([`Pipeline`], [`Delivery`]) and
//! plain values ([`SelfTelemetry`]): `crate::export` depends on this module, never the reverse.
//!
//! Threads: the telemetry thread ([`thread`]); NCCL's finalizing thread in [`deliver`] and
//! [`flush`]; `init` in [`start`]; the exiting thread in [`flush`] (atexit). [`flush`] never
//! waits past its deadline, whatever the collector does. In a forked child ([`forked`]) none of
//! this runs: the thread did not survive the fork and its locks may be held forever.
#![forbid(unsafe_code)]

pub mod flush;
pub mod inbox;
pub mod process;
pub mod sink;
pub mod thread;

pub use crate::comm::DropCounts;
pub use flush::{flush, flush_deadline, wake};
pub use process::forked;
pub use sink::deliver;
pub use thread::start;
#[cfg(any(test, feature = "testing"))]
pub use {
    sink::{Sink, add_sink},
    thread::{TICK, passes},
};

use std::time::Instant;

use crate::aggregate::WindowSummary;
use crate::aggregate::flight::CommProgress;
use crate::record::CommMeta;
use crate::stats::Snapshot;

/// What the telemetry thread drives every tick: the export pipeline (`crate::export` implements
/// it). Called on: the telemetry thread only.
pub trait Pipeline: Send {
    /// Records `summaries`; at the end of an interval, or when `flush` is set, closes the interval
    /// with the counters `own` reads and queues one export request. Returns that request's
    /// sequence number.
    fn tick(
        &mut self,
        now: Instant,
        flush: bool,
        summaries: &[WindowSummary],
        own: &dyn Fn() -> SelfTelemetry,
    ) -> Option<u64>;
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
pub type BuildPipeline = Box<dyn FnOnce(Instant) -> Option<Box<dyn Pipeline>> + Send>;

/// An export back end, built once per process at the first `init`.
pub struct Backend {
    /// See [`BuildPipeline`].
    pub pipeline: BuildPipeline,
    /// The queue [`flush`] waits on.
    pub delivery: &'static dyn Delivery,
}

/// The plugin's own counters at the end of an interval, as plain values.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SelfTelemetry {
    /// Process-wide counters.
    pub stats: Snapshot,
    /// Window summaries dropped from the full inbox.
    pub windows_dropped: u64,
    /// The fraction of time KernelCh is requested ([`crate::activation::duty`]).
    pub kernel_ch_duty: Option<f64>,
    /// Every communicator slot allocated so far, in slot order.
    pub comms: Vec<CommDrops>,
    /// The configuration's problems ([`crate::config::Config::problems`]).
    pub config_problems: &'static [crate::config::Problem],
}

/// One communicator slot's drop counters and progress, with the communicator that owns them.
#[derive(Clone, Debug, PartialEq)]
pub struct CommDrops {
    /// Registry slot.
    pub slot: usize,
    /// Generation of the slot's current (or last) communicator.
    pub generation: u16,
    /// That communicator.
    pub meta: CommMeta,
    /// Its counters, cumulative since its `init`.
    pub counts: DropCounts,
    /// Whether it is still live.
    pub live: bool,
    /// Its operations in flight and hang episodes ([`crate::comm::Comm::progress`]).
    pub progress: CommProgress,
}

//! OTLP export: the metric catalogue ([`catalogue`], `docs/metrics.md` followed exactly), the
//! cardinality limiter ([`limiter`]), the telemetry thread's [`pipeline`], the export [`queue`],
//! the exporter thread ([`sender`]), the exported [`resource`], the bounded user-tag attribute
//! ([`tags`]), the aggregation of each instrument ([`views`]) and the weighted recording of
//! operations under sampling ([`weighted`]). The only module that imports
//! `opentelemetry*`; it reaches the rest of the plugin only through `crate::telemetry`'s traits and
//! plain values, never the communicator registry.
//!
//! Threads:
//! - the telemetry thread owns the [`pipeline::Pipeline`]: it maps each [`crate::telemetry::Report`]
//!   it hands over onto the SDK's instruments (the windows processed, and at an interval's end its
//!   figures and counters) and then collects the SDK's state into one export request and queues
//!   it. It decides nothing about the interval and never waits for I/O.
//! - the exporter thread sends queued requests ([`sender`]).
//!
//! Invariants: at most `queue` requests wait (the oldest is dropped and counted); at most
//! `cardinality_limit` attribute sets per instrument are recorded as themselves, later ones go to
//! the `otel.metric.overflow=true` series and are counted (the SDK's own limit is set above ours,
//! so its silent overflow never triggers).
#![forbid(unsafe_code)]

pub mod catalogue;
pub mod limiter;
pub mod pipeline;
pub mod queue;
pub mod resource;
pub mod sender;
pub mod tags;
pub mod views;
pub mod weighted;

#[cfg(any(test, feature = "testing"))]
pub use {
    catalogue::SIZE_BOUNDS,
    queue::{ExportStats, stats},
    resource::host_name,
};

use crate::config::{self, Exporter, Temporality};
use crate::telemetry::{self, Backend};

/// Sets up export for this process unless the exporter is `none`: sizes the queue, starts the
/// exporter thread, and returns the back end the telemetry thread drives (its pipeline is built
/// on that thread). A thread that cannot be spawned is logged; requests then wait unsent.
/// Called on: NCCL's init thread, once per process (before the telemetry thread exists).
pub fn install(config: &'static config::Config) -> Option<Backend> {
    let export = &config.export;
    if export.exporter == Exporter::None {
        return None;
    }
    if export.exporter == Exporter::File {
        // A bad path is reported now, not at the first export one interval later.
        let path = sender::file_path(export);
        if let Err(e) = sender::open_file(&path) {
            tracing::warn!("file exporter: {e}; requests will fail until it can be opened");
        }
    }
    queue::set_capacity(export.queue as usize);
    let spawned = std::thread::Builder::new()
        .name("nccl-otel-export".into())
        .spawn(move || sender::run_exporter(export));
    if let Err(e) = spawned {
        tracing::warn!("cannot start the export thread ({e}); metrics are not exported");
    }
    Some(Backend {
        pipeline: Box::new(move || {
            pipeline::Pipeline::new(config).map(|p| Box::new(p) as Box<dyn telemetry::Pipeline>)
        }),
        delivery: &queue::DELIVERY,
    })
}

/// The SDK's temporality for ours.
fn sdk_temporality(t: Temporality) -> opentelemetry_sdk::metrics::Temporality {
    match t {
        Temporality::Cumulative => opentelemetry_sdk::metrics::Temporality::Cumulative,
        Temporality::Delta => opentelemetry_sdk::metrics::Temporality::Delta,
        Temporality::LowMemory => opentelemetry_sdk::metrics::Temporality::LowMemory,
    }
}

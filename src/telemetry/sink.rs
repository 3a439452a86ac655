//! Where processed windows go besides the export pipeline: [`deliver`] hands a finalizing
//! thread's summaries to the inbox; with the `testing` feature, a registry of sinks sees every
//! processed window (tests watch the plugin's summaries through it). Called on: a finalizing NCCL
//! thread ([`deliver`]), the telemetry thread (`to_sinks`), a test (`add_sink`); never on the hot
//! path.
#![forbid(unsafe_code)]

#[cfg(any(test, feature = "testing"))]
use std::sync::Arc;

#[cfg(any(test, feature = "testing"))]
use parking_lot::RwLock;

use super::inbox;
use crate::aggregate::WindowSummary;

/// Receives every processed window. Called on: the telemetry thread or a finalizing NCCL thread,
/// never on the hot path; must not block for long.
#[cfg(any(test, feature = "testing"))]
pub trait Sink: Send + Sync {
    /// One window's summary.
    fn window(&self, summary: &WindowSummary);
}

#[cfg(any(test, feature = "testing"))]
static SINKS: RwLock<Vec<Arc<dyn Sink>>> = RwLock::new(Vec::new());

/// Registers a sink for all later windows.
#[cfg(any(test, feature = "testing"))]
pub fn add_sink(sink: Arc<dyn Sink>) {
    SINKS.write().push(sink);
}

/// Hands summaries a thread other than the telemetry thread processed (a finalizing one) to every
/// sink and, through the inbox, to the export pipeline.
pub fn deliver(summaries: &[WindowSummary]) {
    to_sinks(summaries);
    inbox::push(summaries);
}

/// Hands summaries to every sink; the telemetry thread hands its own to the pipeline itself.
#[cfg(any(test, feature = "testing"))]
pub(super) fn to_sinks(summaries: &[WindowSummary]) {
    let sinks = SINKS.read().clone();
    for summary in summaries {
        sinks.iter().for_each(|s| s.window(summary));
    }
}

/// The shipped library has no sinks.
#[cfg(not(any(test, feature = "testing")))]
pub(super) fn to_sinks(_: &[WindowSummary]) {}

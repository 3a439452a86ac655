//! Sinks: whoever wants every processed window (tests, tools). Called on: a finalizing NCCL thread
//! ([`deliver`]), the telemetry thread (`to_sinks`), `init` ([`add_sink`]); never on the hot path.
#![forbid(unsafe_code)]

use std::sync::Arc;

use parking_lot::RwLock;

use super::inbox;
use crate::aggregate::WindowSummary;

/// Receives every processed window. Called on: the telemetry thread or a finalizing NCCL thread,
/// never on the hot path; must not block for long.
pub trait Sink: Send + Sync {
    /// One window's summary.
    fn window(&self, summary: &WindowSummary);
}

static SINKS: RwLock<Vec<Arc<dyn Sink>>> = RwLock::new(Vec::new());

/// Registers a sink for all later windows.
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
pub(super) fn to_sinks(summaries: &[WindowSummary]) {
    let sinks = SINKS.read().clone();
    for summary in summaries {
        sinks.iter().for_each(|s| s.window(summary));
    }
}

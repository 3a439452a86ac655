//! The progress family's instruments (`nccl.progress.*`, `docs/metrics.md`): operations in flight,
//! the oldest one, the last completed sequence numbers, the current hang, and the peer waits.
//! Called on: the telemetry thread (through the pipeline).
#![forbid(unsafe_code)]

use opentelemetry::metrics::{Counter, Histogram, Meter};

use super::{DURATION_BOUNDS, Fresh, gauge, histogram};

/// The progress family's instruments.
pub(in crate::export) struct ProgressInstruments {
    pub(in crate::export) in_flight: Fresh<f64>,
    pub(in crate::export) oldest_age: Fresh<f64>,
    pub(in crate::export) oldest_idle: Fresh<f64>,
    pub(in crate::export) oldest_seq: Fresh<f64>,
    pub(in crate::export) oldest_bytes: Fresh<f64>,
    pub(in crate::export) completed_seq: Fresh<f64>,
    pub(in crate::export) stuck: Fresh<f64>,
    pub(in crate::export) episodes: Counter<u64>,
    pub(in crate::export) peer_wait: Histogram<f64>,
    pub(in crate::export) sync_wait: Histogram<f64>,
}

impl ProgressInstruments {
    pub(super) fn new(meter: &Meter) -> ProgressInstruments {
        ProgressInstruments {
            in_flight: gauge(
                meter,
                "nccl.progress.in_flight",
                "{operation}",
                "Collectives and P2P sends started and not completed",
            ),
            oldest_age: gauge(
                meter,
                "nccl.progress.oldest.age",
                "s",
                "Time since the oldest operation in flight started",
            ),
            oldest_idle: gauge(
                meter,
                "nccl.progress.oldest.idle",
                "s",
                "Time since the oldest operation in flight or one of its children made progress",
            ),
            oldest_seq: gauge(
                meter,
                "nccl.progress.oldest.seq",
                "{operation}",
                "Sequence number (per function) of the oldest collective in flight",
            ),
            oldest_bytes: gauge(
                meter,
                "nccl.progress.oldest.bytes",
                "By",
                "Size of the oldest operation in flight as nccl-tests reports it",
            ),
            completed_seq: gauge(
                meter,
                "nccl.progress.completed.seq",
                "{operation}",
                "Sequence number of the last completed collective, per function",
            ),
            stuck: gauge(
                meter,
                "nccl.progress.hang.stuck",
                "s",
                "Time the hung operation has made no progress, per peer and wait kind (0 once it resumed)",
            ),
            episodes: meter
                .u64_counter("nccl.progress.hang.episodes")
                .with_unit("{episode}")
                .with_description("Hang episodes: an operation made no progress for the hang threshold")
                .build(),
            peer_wait: histogram(
                meter,
                "nccl.progress.peer_wait",
                "s",
                "Per operation and peer: how long its first transfer to the peer waited for the peer to post its receive",
                &DURATION_BOUNDS,
            ),
            sync_wait: histogram(
                meter,
                "nccl.progress.sync_wait",
                "s",
                "Per operation: its longest kernel channel initial synchronisation with its peers (NCCL 2.31+)",
                &DURATION_BOUNDS,
            ),
        }
    }

    /// Starts an interval: last interval's gauges go.
    pub(in crate::export) fn clear(&self) {
        let gauges = [
            &self.in_flight,
            &self.oldest_age,
            &self.oldest_idle,
            &self.oldest_seq,
            &self.oldest_bytes,
            &self.completed_seq,
            &self.stuck,
        ];
        gauges.into_iter().for_each(Fresh::clear);
    }
}

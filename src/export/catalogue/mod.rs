//! The metric catalogue (`docs/metrics.md`, followed exactly here): every instrument's name,
//! unit, description and histogram bounds, and every attribute key ([`keys`]); the operations'
//! instruments ([`ops`], a group of operations is recorded into them by [`super::weighted`]) and
//! the progress family's ([`progress`]) apart.
//! Called on: the telemetry thread (through the pipeline).
#![forbid(unsafe_code)]

use std::borrow::Cow;
use std::sync::Arc;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{AsyncInstrument, Counter, Histogram, Meter, ObservableGauge};
use parking_lot::Mutex;

pub mod keys;
mod ops;
mod progress;

pub(super) use ops::OpInstruments;
pub(super) use progress::ProgressInstruments;

/// Histogram bounds for sizes (`By`): powers of two from 1 KiB to 4 GiB.
pub const SIZE_BOUNDS: [f64; 23] = {
    let mut b = [0.0; 23];
    let mut i = 0;
    while i < 23 {
        b[i] = (1u64 << (10 + i)) as f64;
        i += 1;
    }
    b
};

/// Histogram bounds for durations (`s`): 1, 2, 5 per decade from 1 µs to 10 s.
pub const DURATION_BOUNDS: [f64; 22] = [
    1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1.0, 2.0,
    5.0, 10.0,
];

/// Histogram bounds for bandwidths (`By/s`): 1, 2, 5 per decade from 1 MB/s to 5 TB/s.
pub const BANDWIDTH_BOUNDS: [f64; 21] = [
    1e6, 2e6, 5e6, 1e7, 2e7, 5e7, 1e8, 2e8, 5e8, 1e9, 2e9, 5e9, 1e10, 2e10, 5e10, 1e11, 2e11, 5e11, 1e12, 2e12, 5e12,
];

/// Histogram bounds for transfers per operation: powers of two from 1 to 65536.
pub const COUNT_BOUNDS: [f64; 17] = {
    let mut b = [0.0; 17];
    let mut i = 0;
    while i < 17 {
        b[i] = (1u64 << i) as f64;
        i += 1;
    }
    b
};

/// The values a [`Fresh`] gauge reports at the next collection, with their attributes.
type Values<T> = Arc<Mutex<Vec<(Vec<KeyValue>, T)>>>;

/// A gauge that reports only the values measured in the current interval: an observable gauge
/// (the SDK reports those as delta, so a series absent from the last callback is absent from the
/// export) whose callback reads what [`Fresh::record`] stored since the last [`Fresh::clear`].
pub(super) struct Fresh<T> {
    values: Values<T>,
    _gauge: ObservableGauge<T>,
}

impl<T: Copy + Send + Sync + 'static> Fresh<T> {
    /// Stores `value` for the next collection.
    pub(super) fn record(&self, value: T, attrs: &[KeyValue]) {
        self.values.lock().push((attrs.to_vec(), value));
    }

    /// Forgets the previous interval's values.
    pub(super) fn clear(&self) {
        self.values.lock().clear();
    }

    fn callback(values: &Values<T>) -> impl Fn(&dyn AsyncInstrument<T>) + Send + Sync + 'static {
        let values = values.clone();
        move |observer| {
            for (attrs, value) in values.lock().iter() {
                observer.observe(*value, attrs);
            }
        }
    }
}

pub(super) struct Instruments {
    pub(super) coll: OpInstruments,
    pub(super) p2p: OpInstruments,
    pub(super) link_bytes: Counter<u64>,
    pub(super) link_latency: Fresh<f64>,
    pub(super) link_bandwidth: Fresh<f64>,
    pub(super) link_r2: Fresh<f64>,
    pub(super) link_throughput: Fresh<f64>,
    pub(super) link_queue_wait: Fresh<f64>,
    pub(super) link_samples: Fresh<u64>,
    pub(super) link_latency_missing: Counter<u64>,
    pub(super) channel_transfer_size: Histogram<f64>,
    pub(super) channel_transfer_duration: Histogram<f64>,
    pub(super) channel_latency: Fresh<f64>,
    pub(super) kernel_phase_duration: Histogram<f64>,
    pub(super) gpu_invalid: Counter<u64>,
    pub(super) user_tag_overflow: Counter<u64>,
    pub(super) events_recorded: Counter<u64>,
    pub(super) events_dropped: Counter<u64>,
    pub(super) events_rejected: Counter<u64>,
    pub(super) events_declined: Counter<u64>,
    pub(super) events_unfinished: Counter<u64>,
    pub(super) events_orphaned: Counter<u64>,
    pub(super) pxn_ops: Counter<u64>,
    pub(super) pxn_collectives: Counter<u64>,
    pub(super) windows_processed: Counter<u64>,
    pub(super) windows_forced: Counter<u64>,
    pub(super) windows_dropped: Counter<u64>,
    pub(super) panics: Counter<u64>,
    pub(super) export_sent: Counter<u64>,
    pub(super) export_failures: Counter<u64>,
    pub(super) export_dropped: Counter<u64>,
    pub(super) cardinality_overflow: Counter<u64>,
    pub(super) kernel_ch_duty: Fresh<f64>,
    pub(super) export_interval: Fresh<f64>,
    pub(super) config_problems: Counter<u64>,
    pub(super) progress: ProgressInstruments,
    pub(super) comm_member: Fresh<f64>,
    pub(super) sampling_ratio: Fresh<f64>,
    pub(super) events_shed: Counter<u64>,
}

pub(super) fn counter(meter: &Meter, name: &'static str, unit: &'static str, description: &'static str) -> Counter<u64> {
    meter
        .u64_counter(name)
        .with_unit(unit)
        .with_description(description)
        .build()
}

fn f64_counter(
    meter: &Meter,
    name: String,
    unit: &'static str,
    description: String,
) -> Counter<f64> {
    meter
        .f64_counter(name)
        .with_unit(unit)
        .with_description(description)
        .build()
}

pub(super) fn histogram(
    meter: &Meter,
    name: impl Into<Cow<'static, str>>,
    unit: &'static str,
    description: impl Into<Cow<'static, str>>,
    bounds: &[f64],
) -> Histogram<f64> {
    meter
        .f64_histogram(name)
        .with_unit(unit)
        .with_description(description)
        .with_boundaries(bounds.to_vec())
        .build()
}

pub(super) fn gauge(meter: &Meter, name: &'static str, unit: &'static str, description: &'static str) -> Fresh<f64> {
    let values = Arc::default();
    let gauge = meter
        .f64_observable_gauge(name)
        .with_unit(unit)
        .with_description(description)
        .with_callback(Fresh::callback(&values))
        .build();
    Fresh { values, _gauge: gauge }
}

impl Instruments {
    /// Every instrument of the catalogue, built on `meter`.
    pub(super) fn new(meter: &Meter) -> Self {
        Instruments {
            coll: OpInstruments::new(meter, "nccl.coll", "collective", true),
            p2p: OpInstruments::new(meter, "nccl.p2p", "P2P send", false),
            link_bytes: counter(
                meter,
                "nccl.link.bytes",
                "By",
                "Bytes sent from rank to peer over the network",
            ),
            link_latency: gauge(
                meter,
                "nccl.link.latency",
                "s",
                "Latency of the link: a transfer's time on an idle link beyond its bytes at the link's bandwidth",
            ),
            link_bandwidth: gauge(
                meter,
                "nccl.link.bandwidth",
                "By/s",
                "Wire rate of the link: bytes per time between the observed completions of queued transfers that no other link's shared, else the idle transfers' fit",
            ),
            link_r2: gauge(
                meter,
                "nccl.link.r2",
                "1",
                "Coefficient of determination of the idle transfers' time-vs-size fit",
            ),
            link_throughput: gauge(
                meter,
                "nccl.link.throughput",
                "By/s",
                "Achieved throughput of the link: bytes per second with a transfer in flight",
            ),
            link_queue_wait: gauge(
                meter,
                "nccl.link.queue.wait",
                "s",
                "Mean time a transfer waited, from its SendWait, for the link's earlier transfers to complete",
            ),
            link_latency_missing: counter(
                meter,
                "nccl.link.latency.missing",
                "{interval}",
                "Intervals in which a link with transfers got no latency, by reason",
            ),
            link_samples: {
                let values = Arc::default();
                let gauge = meter
                    .u64_observable_gauge("nccl.link.samples")
                    .with_unit("{transfer}")
                    .with_description("Transfers of the link in the interval")
                    .with_callback(Fresh::callback(&values))
                    .build();
                Fresh { values, _gauge: gauge }
            },
            channel_transfer_size: histogram(
                meter,
                "nccl.channel.transfer.size",
                "By",
                "Bytes of each network transfer on the channel",
                &SIZE_BOUNDS,
            ),
            channel_transfer_duration: histogram(
                meter,
                "nccl.channel.transfer.duration",
                "s",
                "Duration of each network transfer on the channel",
                &DURATION_BOUNDS,
            ),
            channel_latency: gauge(
                meter,
                "nccl.channel.latency",
                "s",
                "Latency of the channel: intercept of the time-vs-size fit of its transfers that found the link idle",
            ),
            kernel_phase_duration: histogram(
                meter,
                "nccl.kernel.phase.duration",
                "s",
                "GPU time of each kernel channel's phase: initial_sync (waiting for peers), compute, final_sync (NCCL 2.31+)",
                &DURATION_BOUNDS,
            ),
            gpu_invalid: counter(
                meter,
                "nccl.profiler.gpu_intervals.invalid",
                "{interval}",
                "Kernel channel or phase GPU intervals that end before they start, left out",
            ),
            user_tag_overflow: counter(
                meter,
                "nccl.profiler.user_tag.overflow",
                "{operation}",
                "Operations whose application tag was exported as other: the process had more distinct tags than the bound",
            ),
            events_recorded: counter(
                meter,
                "nccl.profiler.events.recorded",
                "{event}",
                "Records (starts, states, stops) stored and processed",
            ),
            events_dropped: counter(
                meter,
                "nccl.profiler.events.dropped",
                "{event}",
                "Records of a communicator lost, by reason",
            ),
            events_rejected: counter(
                meter,
                "nccl.profiler.events.rejected",
                "{event}",
                "Callbacks ignored for bad or unattributable input, by reason",
            ),
            events_declined: counter(
                meter,
                "nccl.profiler.events.declined",
                "{event}",
                "Events not recorded by design (P2P receives, receive steps, ProxyCtrl, children of declined events)",
            ),
            events_unfinished: counter(
                meter,
                "nccl.profiler.events.unfinished",
                "{event}",
                "Events started and not finished when their window was processed",
            ),
            events_orphaned: counter(
                meter,
                "nccl.profiler.events.orphaned",
                "{event}",
                "Child events whose parent was neither in their window nor found in time across windows",
            ),
            pxn_ops: counter(
                meter,
                "nccl.profiler.pxn.ops",
                "{event}",
                "Proxy ops of another process (PXN) recorded under a local communicator",
            ),
            windows_processed: counter(
                meter,
                "nccl.profiler.windows.processed",
                "{window}",
                "Windows processed",
            ),
            pxn_collectives: counter(
                meter,
                "nccl.profiler.pxn.collectives",
                "{collective}",
                "Collectives of other processes whose PXN send proxy ops ran here: their own process saw their completion only in part",
            ),
            windows_forced: counter(
                meter,
                "nccl.profiler.windows.forced",
                "{window}",
                "Windows processed with events still open (grace period over, finalize, exit)",
            ),
            windows_dropped: counter(
                meter,
                "nccl.profiler.windows.dropped",
                "{window}",
                "Window summaries dropped before export (full inbox)",
            ),
            panics: counter(
                meter,
                "nccl.profiler.panics",
                "{panic}",
                "Panics caught by the callback guard",
            ),
            export_sent: counter(
                meter,
                "nccl.profiler.export.sent",
                "{request}",
                "Export requests the collector accepted (file and stdout: written)",
            ),
            export_failures: counter(
                meter,
                "nccl.profiler.export.failures",
                "{request}",
                "Export requests that failed (error, timeout, refused, error status)",
            ),
            export_dropped: counter(
                meter,
                "nccl.profiler.export.dropped",
                "{request}",
                "Export requests dropped unsent from the full queue",
            ),
            cardinality_overflow: counter(
                meter,
                "nccl.profiler.cardinality.overflow",
                "{measurement}",
                "Measurements recorded into the overflow series, by metric family",
            ),
            kernel_ch_duty: gauge(
                meter,
                "nccl.profiler.kernel_ch.duty",
                "1",
                "Fraction of the time the plugin requests KernelCh events: GPU-time figures are a sample of this fraction of operations",
            ),
            export_interval: gauge(
                meter,
                "nccl.profiler.export.interval",
                "s",
                "The export interval, 0 once no communicator is live: a process whose latest point is older than two intervals stopped exporting",
            ),
            config_problems: counter(
                meter,
                "nccl.profiler.config.problems",
                "{variable}",
                "Variables whose value was rejected (the default used) or partly ignored, by variable and problem",
            ),
            progress: ProgressInstruments::new(meter),
            comm_member: gauge(
                meter,
                "nccl.comm.member",
                "{member}",
                "1 per communicator of this process: its rank there, with the process's host, node and launcher rank",
            ),
            sampling_ratio: gauge(
                meter,
                "nccl.sampling.ratio",
                "1",
                "Fraction of the communicator's operations timed in the interval (1 unless overload sheds records): \
                 timed figures carry weights so that they stand for every operation",
            ),
            events_shed: counter(
                meter,
                "nccl.profiler.events.shed",
                "{event}",
                "Events not recorded under overload, by reason: detail (ProxyStep detail), untimed (operations counted and sized without a record)",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_sorted_and_documented_ranges() {
        assert_eq!(SIZE_BOUNDS[0], 1024.0);
        assert_eq!(SIZE_BOUNDS[22], 4.0 * 1024.0 * 1024.0 * 1024.0);
        assert!(SIZE_BOUNDS.windows(2).all(|w| w[1] == 2.0 * w[0]));
        assert_eq!((DURATION_BOUNDS[0], DURATION_BOUNDS[21]), (1e-6, 10.0));
        assert!(DURATION_BOUNDS.windows(2).all(|w| w[0] < w[1]));
        assert!(BANDWIDTH_BOUNDS.windows(2).all(|w| w[0] < w[1]));
        assert_eq!((COUNT_BOUNDS[0], COUNT_BOUNDS[16]), (1.0, 65536.0));
    }
}

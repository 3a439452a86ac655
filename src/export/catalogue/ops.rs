//! The instruments of one kind of operation (`nccl.coll.*`, `nccl.p2p.*`): sizes, latencies,
//! GPU times and bandwidths, transfers, and for collectives the split of their latency into queue
//! wait and service time with the sums that make busBw a ratio of sums ([`super::super::weighted`]
//! records a group of operations into them).
//! Called on: the telemetry thread (through the pipeline).
#![forbid(unsafe_code)]

use opentelemetry::metrics::{Counter, Histogram, Meter};

use super::{BANDWIDTH_BOUNDS, COUNT_BOUNDS, DURATION_BOUNDS, SIZE_BOUNDS, f64_counter, histogram};

/// Histograms of collectives or P2P sends.
/// Byte histograms are `f64`: the OTLP sum is a double anyway, and an `f64` sum cannot overflow
/// (a `u64` one can, on absurd byte counts: the SDK then panics in debug builds and wraps in
/// release).
pub(in crate::export) struct OpInstruments {
    pub(in crate::export) bytes: Histogram<f64>,
    pub(in crate::export) duration: Histogram<f64>,
    pub(in crate::export) kernel_duration: Histogram<f64>,
    pub(in crate::export) kernel_algbw: Histogram<f64>,
    pub(in crate::export) kernel_busbw: Histogram<f64>,
    pub(in crate::export) transfers: Histogram<u64>,
    pub(in crate::export) transfer_size: Histogram<f64>,
    pub(in crate::export) transfer_duration: Histogram<f64>,
    /// Collectives only: a group's P2P sends run together (one kernel), not one after the other.
    pub(in crate::export) served: Option<Served>,
}

/// The split of collectives' latency and the sums that make busBw a ratio of sums.
pub(in crate::export) struct Served {
    pub(in crate::export) service: Histogram<f64>,
    pub(in crate::export) queue: Histogram<f64>,
    pub(in crate::export) service_time: Counter<f64>,
    pub(in crate::export) service_bus_bytes: Counter<f64>,
    pub(in crate::export) kernel_time: Counter<f64>,
    pub(in crate::export) kernel_bus_bytes: Counter<f64>,
    pub(in crate::export) missing: Counter<u64>,
}

impl Served {
    fn new(meter: &Meter, prefix: &str, what: &str) -> Self {
        Served {
            service: histogram(
                meter,
                format!("{prefix}.service.duration"),
                "s",
                format!("Service time of each {what}: from the communicator being free (or its enqueue) to completion"),
                &DURATION_BOUNDS,
            ),
            queue: histogram(
                meter,
                format!("{prefix}.queue.duration"),
                "s",
                format!("Queue wait of each {what}: enqueue until the earlier operations of its communicator completed"),
                &DURATION_BOUNDS,
            ),
            service_time: f64_counter(
                meter,
                format!("{prefix}.service.time"),
                "s",
                format!("Service time of every {what} with a service time and a bus factor, summed"),
            ),
            service_bus_bytes: f64_counter(
                meter,
                format!("{prefix}.service.bus_bytes"),
                "By",
                format!(
                    "Bytes × bus factor of every {what} counted in {prefix}.service.time: \
                     their rate over its rate is nccl-tests' busBw"
                ),
            ),
            kernel_time: f64_counter(
                meter,
                format!("{prefix}.kernel.time"),
                "s",
                format!("GPU time of every {what} with a GPU time and a bus factor, summed"),
            ),
            kernel_bus_bytes: f64_counter(
                meter,
                format!("{prefix}.kernel.bus_bytes"),
                "By",
                format!(
                    "Bytes × bus factor of every {what} counted in {prefix}.kernel.time: \
                     their rate over its rate is the GPU's busBw"
                ),
            ),
            missing: meter
                .u64_counter(format!("{prefix}.service.missing"))
                .with_unit("{operation}")
                .with_description(format!("Number of {what}s without a service time, by reason"))
                .build(),
        }
    }
}

impl OpInstruments {
    /// `serial`: the operations run one after the other on their communicator (collectives), so
    /// their latency is split and their busBw summed.
    pub(in crate::export) fn new(meter: &Meter, prefix: &str, what: &str, serial: bool) -> Self {
        OpInstruments {
            bytes: histogram(
                meter,
                format!("{prefix}.bytes"),
                "By",
                format!("Size of each {what} as nccl-tests reports it"),
                &SIZE_BOUNDS,
            ),
            duration: histogram(
                meter,
                format!("{prefix}.duration"),
                "s",
                format!(
                    "Latency of each {what}: enqueue to the last network proxy op stop, either direction \
                     (includes queueing behind earlier operations)"
                ),
                &DURATION_BOUNDS,
            ),
            kernel_duration: histogram(
                meter,
                format!("{prefix}.kernel.duration"),
                "s",
                format!("GPU time of each {what}: first kernel channel start to last channel stop"),
                &DURATION_BOUNDS,
            ),
            kernel_algbw: histogram(
                meter,
                format!("{prefix}.kernel.algbw"),
                "By/s",
                format!("Algorithm bandwidth of each {what} (nccl-tests algBw) from its GPU time"),
                &BANDWIDTH_BOUNDS,
            ),
            kernel_busbw: histogram(
                meter,
                format!("{prefix}.kernel.busbw"),
                "By/s",
                format!("Bus bandwidth of each {what} (nccl-tests busBw) from its GPU time"),
                &BANDWIDTH_BOUNDS,
            ),
            transfers: meter
                .u64_histogram(format!("{prefix}.transfers"))
                .with_unit("{transfer}")
                .with_description(format!("Network transfers of each {what}"))
                .with_boundaries(COUNT_BOUNDS.to_vec())
                .build(),
            transfer_size: histogram(
                meter,
                format!("{prefix}.transfer.size"),
                "By",
                format!("Bytes of each network transfer of a {what}"),
                &SIZE_BOUNDS,
            ),
            transfer_duration: histogram(
                meter,
                format!("{prefix}.transfer.duration"),
                "s",
                format!("Duration of each network transfer of a {what}"),
                &DURATION_BOUNDS,
            ),
            served: serial.then(|| Served::new(meter, prefix, what)),
        }
    }
}

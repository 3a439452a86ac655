//! Which aggregation each instrument gets, as the one SDK view of the provider: every stream keeps
//! the SDK's cardinality limit above ours; the families left out (`NCCL_PROFILER_OTEL_DETAIL`,
//! `NCCL_PROFILER_OTEL_DROP_METRICS`) are neither aggregated nor exported; histograms get base-2
//! exponential buckets or, with `OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION`, keep
//! the catalogue's explicit ones.
//! Called on: the telemetry thread (when instruments are created).
#![forbid(unsafe_code)]

use opentelemetry_sdk::metrics::{Aggregation, Instrument, InstrumentKind, Stream};

use crate::config::{self, Histograms};

/// Exponential histograms with the specification's defaults: at most 160 buckets, scale at most
/// 20, minimum and maximum kept.
const EXPONENTIAL: Aggregation = Aggregation::Base2ExponentialHistogram {
    max_size: 160,
    max_scale: 20,
    record_min_max: true,
};

/// The view for `export`'s settings.
pub fn view(export: &config::Export) -> impl Fn(&Instrument) -> Option<Stream> + Send + Sync + 'static {
    // Above ours: every set we admit plus the overflow set, twice for delta's two intervals.
    let sdk_limit = 2 * export.cardinality_limit as usize + 2;
    let dropped: Vec<String> = export
        .left_out()
        .into_iter()
        .flat_map(|f| match f {
            "transfer" => vec!["nccl.coll.transfer".to_owned(), "nccl.p2p.transfer".to_owned()],
            f => vec![format!("nccl.{f}.")],
        })
        .collect();
    let histograms = export.histograms;
    move |instrument: &Instrument| {
        let stream = Stream::builder().with_cardinality_limit(sdk_limit);
        let stream = if dropped.iter().any(|p| instrument.name().starts_with(p.as_str())) {
            stream.with_aggregation(Aggregation::Drop)
        } else if histograms == Histograms::Exponential && instrument.kind() == InstrumentKind::Histogram {
            stream.with_aggregation(EXPONENTIAL)
        } else {
            stream
        };
        stream.build().ok()
    }
}

//! The telemetry thread's export state: the OpenTelemetry meter provider and its instruments, and
//! the mapping of each [`Report`] onto them: every window summary (with the weights of sampling
//! and the operations counted without a record: [`super::weighted`]), and at an interval's end
//! its link and channel figures, the self-telemetry counters, each communicator's progress
//! ([`progress`]) and membership ([`member`]), then one export request handed to the queue.
//! Decides nothing about the interval (the telemetry thread's [`crate::telemetry::report`] does)
//! and never waits for I/O. Called on: the telemetry thread only.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

mod member;
mod progress;

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::reader::MetricReader;
use opentelemetry_sdk::metrics::{InstrumentKind, ManualReader, Pipeline as SdkPipeline, SdkMeterProvider};

use super::catalogue::{Instruments, OpInstruments, keys};
use super::limiter::{Family, Limiter};
use super::resource::resource;
use super::tags::UserTags;
use super::views::view;
use super::weighted::counted_attrs;
use super::{queue, sdk_temporality};
use crate::aggregate::interval::{CommKey, Figures, Scale, size_class_name};
use crate::config::{self, Exporter, Temporality};
use crate::record::{CommMeta, Func, PHASES};
use crate::telemetry::report::Window;
use crate::telemetry::{self, IntervalEnd, Report, SelfTelemetry};

/// A [`ManualReader`] the provider and the [`Pipeline`] share: the provider registers it, the
/// telemetry thread collects through it.
#[derive(Debug, Clone)]
struct SharedReader(Arc<ManualReader>);

impl MetricReader for SharedReader {
    fn register_pipeline(&self, pipeline: Weak<SdkPipeline>) {
        self.0.register_pipeline(pipeline);
    }

    fn collect(&self, rm: &mut ResourceMetrics) -> OTelSdkResult {
        self.0.collect(rm)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn temporality(&self, kind: InstrumentKind) -> opentelemetry_sdk::metrics::Temporality {
        self.0.temporality(kind)
    }
}

/// The export queue's counters last exported, to add only the change.
#[derive(Clone, Copy, Default)]
struct Exports {
    failures: u64,
    dropped: u64,
    sent: u64,
}

/// The telemetry thread's export state. Called on: the telemetry thread only.
pub struct Pipeline {
    _provider: SdkMeterProvider,
    reader: SharedReader,
    inst: Instruments,
    limiter: Limiter,
    interval: Duration,
    exports: Exports,
    tags: UserTags,
    endpoint: String,
    progress: progress::Progress,
    members: member::Members,
    /// Whether the last logged export state was failing.
    failing: bool,
    failures_logged: u64,
    exported_logged: u64,
}

impl Pipeline {
    /// The provider, its instruments and an empty interval; `None` when export is off.
    /// Called on: the telemetry thread.
    pub fn new(config: &config::Config) -> Option<Pipeline> {
        let export = &config.export;
        if export.exporter == Exporter::None {
            return None;
        }
        let reader = SharedReader(Arc::new(
            ManualReader::builder()
                .with_temporality(sdk_temporality(export.temporality))
                .build(),
        ));
        let provider = SdkMeterProvider::builder()
            .with_resource(resource(export))
            .with_reader(reader.clone())
            .with_view(view(export))
            .build();
        let scope = InstrumentationScope::builder("nccl-profiler-otel")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let meter = provider.meter_with_scope(scope);
        let inst = Instruments::new(&meter);
        Some(Pipeline {
            _provider: provider,
            reader,
            inst,
            limiter: Limiter {
                limit: export.cardinality_limit as usize,
                per_interval: export.temporality == Temporality::Delta,
                seen: HashMap::new(),
            },
            interval: config.interval,
            exports: Exports::default(),
            tags: UserTags::default(),
            progress: progress::Progress::default(),
            members: member::Members::new(export),
            endpoint: match export.exporter {
                Exporter::File => format!("file {}", export.file),
                Exporter::Stdout => "stdout".to_owned(),
                Exporter::Otlp | Exporter::None => export.endpoint.clone(),
            },
            failing: false,
            failures_logged: 0,
            exported_logged: 0,
        })
    }

    /// Admits `attrs` for `family`, or counts `n` measurements as overflow and returns the
    /// overflow attribute set.
    fn attrs_or_overflow(&mut self, family: Family, attrs: Vec<KeyValue>, n: u64) -> Vec<KeyValue> {
        if self.limiter.admit(family, &attrs) {
            return attrs;
        }
        self.overflow(family, n);
        vec![KeyValue::new(keys::OVERFLOW, true)]
    }

    /// Adds `nccl.user_tag` for a tagged group of `ops` operations (bounded, [`UserTags`]).
    fn user_tag(&mut self, attrs: &mut Vec<KeyValue>, tag: u64, ops: usize) {
        if tag == 0 {
            return;
        }
        let (name, past_bound) = self.tags.name(tag);
        if past_bound {
            self.inst.user_tag_overflow.add(ops as u64, &[]);
        }
        attrs.push(KeyValue::new(keys::USER_TAG, name));
    }

    fn overflow(&mut self, family: Family, n: u64) {
        queue::count_overflow(n);
        self.inst
            .cardinality_overflow
            .add(n, &[KeyValue::new(keys::FAMILY, family.prefix())]);
    }

    /// The attributes of a collective group's summed times and bus bytes: its communicator's,
    /// `nccl.func` and `nccl.size_class` (admitted, or the overflow set).
    fn totals(&mut self, base: &[KeyValue], func: Func, class: u8) -> Vec<KeyValue> {
        let mut attrs = base.to_vec();
        attrs.extend([
            KeyValue::new(keys::FUNC, func.as_str()),
            KeyValue::new(keys::SIZE_CLASS, size_class_name(class)),
        ]);
        self.attrs_or_overflow(Family::Coll, attrs, 4)
    }

    /// One window's histograms and counters.
    fn record(&mut self, w: &Window) {
        let s = &w.summary;
        let base = comm_attrs(&s.comm);
        let comm = self.attrs_or_overflow(Family::Profiler, base.clone(), 7);
        let i = &self.inst;
        i.events_recorded.add(s.stats.records, &comm);
        i.events_unfinished.add(s.stats.unfinished, &comm);
        i.events_orphaned.add(s.stats.orphans, &comm);
        i.windows_processed.add(s.stats.windows, &comm);
        i.windows_forced.add(u64::from(s.stats.forced), &comm);
        i.pxn_collectives.add(s.stats.pxn_collectives, &comm);
        i.gpu_invalid.add(s.stats.invalid_gpu, &comm);

        // The collectives' splits, group by group.
        let mut rest = w.splits.as_slice();
        for g in &s.colls {
            let (splits, tail) = rest.split_at(g.ops.len().min(rest.len()));
            rest = tail;
            let mut attrs = base.clone();
            attrs.extend([
                KeyValue::new(keys::FUNC, g.key.func.as_str()),
                KeyValue::new(keys::ALGO, g.key.algo.as_str()),
                KeyValue::new(keys::PROTO, g.key.proto.as_str()),
                KeyValue::new(keys::DATATYPE, g.key.datatype.as_str()),
                KeyValue::new(keys::SIZE_CLASS, size_class_name(g.key.size_class)),
            ]);
            attrs.extend(graph_attr(g.key.graph));
            let n = OpInstruments::measurements(&g.ops, splits, &g.transfers);
            let totals = self.totals(&base, g.key.func, g.key.size_class);
            self.user_tag(&mut attrs, g.key.tag, g.ops.len());
            let attrs = self.attrs_or_overflow(Family::Coll, attrs, n);
            let scale = Scale::coll(&g.key, s.comm.nranks);
            let split = Some((splits, totals.as_slice()));
            self.inst.coll.record(&g.ops, &g.transfers, scale, &attrs, split);
            self.waits(&base, g.key.func, &g.ops);
        }
        for g in &s.p2ps {
            let mut attrs = base.clone();
            attrs.extend([
                KeyValue::new(keys::FUNC, "Send"),
                KeyValue::new(keys::PEER, i64::from(g.peer)),
                KeyValue::new(keys::DATATYPE, g.datatype.as_str()),
                KeyValue::new(keys::SIZE_CLASS, size_class_name(g.size_class)),
            ]);
            attrs.extend(graph_attr(g.graph));
            let n = OpInstruments::measurements(&g.ops, &[], &g.transfers);
            self.user_tag(&mut attrs, g.tag, g.ops.len());
            let attrs = self.attrs_or_overflow(Family::P2p, attrs, n);
            self.inst
                .p2p
                .record(&g.ops, &g.transfers, Scale::send(s.comm.nranks), &attrs, None);
            self.waits(&base, Func::Send, &g.ops);
        }
        for c in &s.counted {
            let (family, attrs) = counted_attrs(&base, c);
            let attrs = self.attrs_or_overflow(family, attrs, c.ops);
            let inst = if family == Family::P2p { &self.inst.p2p } else { &self.inst.coll };
            inst.record_counted(c, s.comm.nranks, &attrs);
        }
        if !s.counted.is_empty() {
            let mut attrs = base.clone();
            attrs.push(KeyValue::new(keys::REASON, "untimed"));
            let attrs = self.attrs_or_overflow(Family::Profiler, attrs, 1);
            self.inst.events_shed.add(s.counted.iter().map(|c| c.ops).sum(), &attrs);
        }
        for l in &s.links {
            let attrs = link_attrs(&CommKey::new(&s.comm, l.rank), Some(l.peer));
            let attrs = self.attrs_or_overflow(Family::Link, attrs, 1);
            self.inst.link_bytes.add(l.bytes, &attrs);
        }
        for (phase, secs) in PHASES.iter().zip(&s.phases).filter(|(_, secs)| !secs.is_empty()) {
            let mut attrs = base.clone();
            attrs.push(KeyValue::new(keys::PHASE, *phase));
            let attrs = self.attrs_or_overflow(Family::Kernel, attrs, secs.len() as u64);
            let h = self.inst.kernel_phase_duration.bind(&attrs);
            secs.iter().for_each(|&s| h.record(s));
        }
        for c in &s.channels {
            let attrs = channel_attrs(&CommKey::new(&s.comm, s.comm.rank), c.channel);
            let attrs = self.attrs_or_overflow(Family::Channel, attrs, 2 * c.transfers.len() as u64);
            if !c.transfers.is_empty() {
                let size = self.inst.channel_transfer_size.bind(&attrs);
                let secs = self.inst.channel_transfer_duration.bind(&attrs);
                for t in &c.transfers {
                    size.record(t.bytes as f64);
                    secs.record(t.secs);
                }
            }
        }
    }

    /// The interval's figures into the gauges, the self-telemetry counters, and the export state
    /// logged (at most one line per interval).
    fn end_interval(&mut self, end: &IntervalEnd) {
        let (figures, own) = (&end.figures, &end.own);
        let i = &self.inst;
        for fresh in [
            &i.link_latency,
            &i.link_bandwidth,
            &i.link_r2,
            &i.link_throughput,
            &i.link_queue_wait,
            &i.channel_latency,
            &i.kernel_ch_duty,
            &i.export_interval,
        ] {
            fresh.clear();
        }
        i.link_samples.clear();
        self.inst.sampling_ratio.clear();
        self.inst.comm_member.clear();
        self.inst.progress.clear();
        self.figures(figures);
        self.self_telemetry(own);
        self.log_export_state();
    }

    /// The interval's link, channel and sampling figures into the gauges.
    fn figures(&mut self, figures: &Figures) {
        for (comm, ratio) in &figures.sampling {
            let attrs = link_attrs(comm, None);
            if !self.limiter.admit(Family::Profiler, &attrs) {
                self.overflow(Family::Profiler, 1);
                continue;
            }
            self.inst.sampling_ratio.record(*ratio, &attrs);
        }
        for link in &figures.links {
            let attrs = link_attrs(&link.comm, Some(link.peer));
            if !self.limiter.admit(Family::Link, &attrs) {
                self.overflow(Family::Link, 1);
                continue;
            }
            let fit = link.fit;
            let i = &self.inst;
            i.link_samples.record(link.transfers, &attrs);
            let gauges = [
                (&i.link_latency, fit.latency),
                (&i.link_bandwidth, fit.bandwidth),
                (&i.link_r2, fit.r2),
                (&i.link_throughput, fit.throughput),
                (&i.link_queue_wait, fit.wait),
            ];
            for (gauge, value) in gauges {
                if let Some(v) = value {
                    gauge.record(v, &attrs);
                }
            }
            if let Some(reason) = fit.missing {
                let mut attrs = attrs;
                attrs.push(KeyValue::new(keys::REASON, reason));
                let attrs = self.attrs_or_overflow(Family::Link, attrs, 1);
                self.inst.link_latency_missing.add(1, &attrs);
            }
        }
        for channel in &figures.channels {
            let attrs = channel_attrs(&channel.comm, channel.channel);
            if !self.limiter.admit(Family::Channel, &attrs) {
                self.overflow(Family::Channel, 1);
                continue;
            }
            if let Some(latency) = channel.latency {
                self.inst.channel_latency.record(latency, &attrs);
            }
        }
    }

    /// Adds what the process-wide, per-communicator and export counters gained in the interval
    /// (zero included, so every series exists from the first export on).
    fn self_telemetry(&mut self, own: &SelfTelemetry) {
        let (d, i) = (own.stats, &self.inst);
        let reason = |r: &'static str| [KeyValue::new(keys::REASON, r)];
        i.panics.add(d.panics, &[]);
        i.events_rejected.add(d.null_args, &reason("null_arg"));
        i.events_rejected.add(d.stale, &reason("stale"));
        i.events_rejected.add(d.unknown_types, &reason("unknown_type"));
        i.events_rejected.add(d.unknown_states, &reason("unknown_state"));
        i.events_rejected.add(d.foreign_unmatched, &reason("pxn_unmatched"));
        i.events_declined.add(d.declined, &[]);
        i.pxn_ops.add(d.foreign_ops, &[]);
        if let Some(duty) = own.kernel_ch_duty {
            i.kernel_ch_duty.record(duty, &[]);
        }
        // 0 once no communicator is live: the process has nothing more to report.
        let interval = if own.live { self.interval.as_secs_f64() } else { 0.0 };
        i.export_interval.record(interval, &[]);
        // Counted once, then zero every interval: the series lasts, its total stays one.
        for p in own.config_problems {
            let attrs = [
                KeyValue::new(keys::VARIABLE, p.variable.clone()),
                KeyValue::new(keys::REASON, p.kind.as_str()),
            ];
            i.config_problems.add(u64::from(own.first_problems), &attrs);
        }

        let stats = queue::stats();
        let now = Exports {
            failures: stats.failures,
            dropped: stats.dropped,
            sent: stats.exported,
        };
        let last = std::mem::replace(&mut self.exports, now);
        i.export_failures.add(now.failures.saturating_sub(last.failures), &[]);
        i.export_dropped.add(now.dropped.saturating_sub(last.dropped), &[]);
        i.windows_dropped.add(own.windows_dropped, &[]);
        i.export_sent.add(now.sent.saturating_sub(last.sent), &[]);

        for c in &own.comms {
            self.progress(c);
            if !c.counted {
                continue;
            }
            let (meta, d) = (&c.state.meta, c.dropped);
            self.member(meta);
            for (reason, delta) in [("full", d.full), ("late", d.late), ("unpublished", d.unpublished)] {
                let mut attrs = comm_attrs(meta);
                attrs.push(KeyValue::new(keys::REASON, reason));
                let attrs = self.attrs_or_overflow(Family::Profiler, attrs, 1);
                self.inst.events_dropped.add(delta, &attrs);
            }
            // Untimed operations are counted as their summaries are recorded.
            for (reason, delta) in [("detail", d.shed), ("untimed", 0)] {
                let mut attrs = comm_attrs(meta);
                attrs.push(KeyValue::new(keys::REASON, reason));
                let attrs = self.attrs_or_overflow(Family::Profiler, attrs, 1);
                self.inst.events_shed.add(delta, &attrs);
            }
        }
        self.end_progress();
    }

    /// Logs export failures since the last interval: WARN when exports start failing, INFO
    /// while they keep failing, INFO when they recover. At most one line per interval.
    fn log_export_state(&mut self) {
        let stats = queue::stats();
        let (failures, exported) = (stats.failures, stats.exported);
        let new_failures = failures - self.failures_logged;
        let new_exports = exported - self.exported_logged;
        self.failures_logged = failures;
        self.exported_logged = exported;
        let error = queue::take_error();
        if new_failures > 0 {
            let error = error.unwrap_or_default();
            let target = &self.endpoint;
            if self.failing {
                tracing::info!("metrics export to {target} still failing: {new_failures} more failures, last: {error}");
            } else {
                tracing::warn!(
                    "metrics export to {target} failed ({error}); retrying every interval, data is kept \
                     cumulatively (NCCL_PROFILER_OTEL_EXPORTER=none turns export off)"
                );
            }
            self.failing = true;
        } else if self.failing && new_exports > 0 {
            tracing::info!("metrics export to {} recovered", self.endpoint);
            self.failing = false;
        }
    }
}

impl telemetry::Pipeline for Pipeline {
    fn export(&mut self, report: Report) -> Option<u64> {
        for window in &report.windows {
            self.record(window);
        }
        self.end_interval(&report.end?);
        let mut rm = ResourceMetrics::default();
        if let Err(e) = self.reader.collect(&mut rm) {
            tracing::warn!("cannot collect metrics: {e}");
            return None;
        }
        self.limiter.end_interval();
        Some(queue::enqueue(rm))
    }
}

/// `nccl.graph_captured`, when NCCL tells (2.28+).
fn graph_attr(graph: Option<bool>) -> Option<KeyValue> {
    graph.map(|g| KeyValue::new(keys::GRAPH_CAPTURED, g))
}

/// `nccl.comm.hash`, `nccl.comm.name`, `nccl.rank`, `nccl.nranks`.
fn comm_attrs(meta: &CommMeta) -> Vec<KeyValue> {
    link_attrs(&CommKey::new(meta, meta.rank), None)
}

/// The channel's attributes: its communicator's and `nccl.channel`.
fn channel_attrs(comm: &CommKey, channel: u8) -> Vec<KeyValue> {
    let mut attrs = link_attrs(comm, None);
    attrs.push(KeyValue::new(keys::CHANNEL, i64::from(channel)));
    attrs
}

/// The communicator's attributes with `nccl.rank` = its key's rank (a link's sending rank) and,
/// for a link, `nccl.peer`; no `nccl.nranks` when the size is unknown (0: ABI v1–v3).
fn link_attrs(comm: &CommKey, peer: Option<i32>) -> Vec<KeyValue> {
    let mut attrs = vec![
        KeyValue::new(keys::COMM_HASH, format!("{:#x}", comm.hash)),
        KeyValue::new(keys::COMM_NAME, comm.name.clone()),
        KeyValue::new(keys::RANK, i64::from(comm.rank)),
    ];
    if comm.nranks > 0 {
        attrs.push(KeyValue::new(keys::NRANKS, i64::from(comm.nranks)));
    }
    attrs.extend(peer.map(|p| KeyValue::new(keys::PEER, i64::from(p))));
    attrs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::queue::Queue;
    use crate::aggregate::regression::Samples;
    use crate::aggregate::{LinkGroup, WindowStats, WindowSummary};
    use crate::telemetry::DropCounts;
    use crate::config::Problem;
    use crate::telemetry::CommState;
    use crate::telemetry::report::{Now, Reporter};
    use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
    use std::collections::BTreeMap;
    use std::time::Instant;

    /// A pipeline with the telemetry thread's reporter in front of it.
    struct Harness {
        p: Pipeline,
        r: Reporter,
    }

    impl Harness {
        fn new(config: &config::Config) -> Harness {
            Harness {
                p: Pipeline::new(config).expect("export on"),
                r: Reporter::new(config, Instant::now()),
            }
        }

        /// Records one processed window.
        fn record(&mut self, s: &WindowSummary) {
            for w in self.r.add([s.clone()]) {
                self.p.record(&w);
            }
        }

        /// Ends the interval with the communicator slots `comms` and the configuration's
        /// `problems`.
        fn end(&mut self, comms: Vec<CommState>, problems: &'static [Problem]) {
            let now = Now {
                stats: crate::stats::STATS.snapshot(),
                windows_dropped: 0,
                kernel_ch_duty: None,
                comms,
                config_problems: problems,
            };
            let end = self.r.close(Instant::now(), now);
            self.p.end_interval(&end);
        }
    }

    fn summary(links: Vec<LinkGroup>) -> WindowSummary {
        WindowSummary {
            comm: CommMeta {
                hash: 0x51a1e,
                name: "gauges".into(),
                rank: 0,
                nranks: 2,
                nnodes: 2,
                gpu: Default::default(),
            },
            colls: Vec::new(),
            p2ps: Vec::new(),
            phases: Default::default(),
            links,
            channels: Vec::new(),
            stats: WindowStats::default(),
            counted: Vec::new(),
        }
    }

    /// Points of the gauge `name` in one collection.
    fn gauge_points(p: &mut Pipeline, name: &str) -> usize {
        let mut rm = ResourceMetrics::default();
        p.reader.collect(&mut rm).expect("collect");
        let m = rm.scope_metrics().flat_map(|s| s.metrics()).find(|m| m.name() == name);
        match m.map(|m| m.data()) {
            Some(AggregatedMetrics::F64(MetricData::Gauge(g))) => g.data_points().count(),
            Some(AggregatedMetrics::U64(MetricData::Gauge(g))) => g.data_points().count(),
            Some(AggregatedMetrics::U64(MetricData::Sum(s))) => s.data_points().count(),
            _ => 0,
        }
    }

    /// A link with a fit in one interval and no transfers in the next has no gauge values in
    /// the next export (cumulative temporality, where the SDK's synchronous gauges keep the last
    /// value forever).
    #[test]
    fn a_gauge_reports_only_what_its_interval_measured() {
        let (config, _) = config::Config::from_lookup(|k| (k == config::EXPORTER).then(|| "file".to_owned()));
        assert_eq!(config.export.temporality, Temporality::Cumulative);
        let mut h = Harness::new(&config);
        let link = fitted_link();
        h.record(&summary(vec![link]));
        h.end(Vec::new(), &[]);
        const GAUGES: [&str; 4] = [
            "nccl.link.latency",
            "nccl.link.bandwidth",
            "nccl.link.r2",
            "nccl.link.samples",
        ];
        for name in GAUGES {
            assert_eq!(gauge_points(&mut h.p, name), 1, "{name} in the interval with a fit");
        }
        h.end(Vec::new(), &[]);
        for name in GAUGES {
            assert_eq!(
                gauge_points(&mut h.p, name),
                0,
                "{name} in the interval without transfers"
            );
        }
        // One transfer: a sample count and a throughput, no latency (counted why).
        let mut one = Samples::default();
        one.push(1024, 2e-5);
        let queue = crate::aggregate::queue::analyze(
            &mut [crate::aggregate::queue::Step {
                sent: 0,
                stop: 20_000,
                bytes: 1024,
                tag: 0,
            }],
            1e-9,
            |_| 0,
        );
        let link = LinkGroup {
            rank: 0,
            peer: 1,
            bytes: 1024,
            transfers: 1,
            queue,
        };
        h.record(&summary(vec![link]));
        h.end(Vec::new(), &[]);
        assert_eq!(gauge_points(&mut h.p, "nccl.link.latency"), 0);
        assert_eq!(gauge_points(&mut h.p, "nccl.link.throughput"), 1);
        assert_eq!(gauge_points(&mut h.p, "nccl.link.latency.missing"), 1, "reason one_size");
    }

    /// OTLP points of `name` in `rm` (decoded with the official types): attributes, and the
    /// count (histograms) or value (gauges, sums).
    fn otlp(rm: &ResourceMetrics, name: &str) -> Vec<(BTreeMap<String, String>, f64, f64)> {
        use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
        use opentelemetry_proto::tonic::common::v1::{KeyValue as Kv, any_value::Value};
        use opentelemetry_proto::tonic::metrics::v1::{metric::Data, number_data_point::Value as N};
        let attrs = |kvs: &[Kv]| {
            kvs.iter()
                .map(|kv| {
                    let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                        Some(Value::StringValue(s)) => s.clone(),
                        Some(Value::IntValue(i)) => i.to_string(),
                        other => format!("{other:?}"),
                    };
                    (kv.key.clone(), v)
                })
                .collect::<BTreeMap<_, _>>()
        };
        let number = |v: &Option<N>| match v {
            Some(N::AsDouble(d)) => *d,
            Some(N::AsInt(i)) => *i as f64,
            None => f64::NAN,
        };
        let req = ExportMetricsServiceRequest::from(rm);
        let mut metrics = req.resource_metrics.iter().flat_map(|r| &r.scope_metrics).flat_map(|s| &s.metrics);
        let Some(m) = metrics.rfind(|m| m.name == name) else {
            return Vec::new();
        };
        match &m.data {
            Some(Data::Histogram(h)) => {
                let points = h.data_points.iter();
                points.map(|p| (attrs(&p.attributes), p.count as f64, p.sum.unwrap_or(0.0))).collect()
            }
            Some(Data::ExponentialHistogram(h)) => {
                let points = h.data_points.iter();
                points.map(|p| (attrs(&p.attributes), p.count as f64, p.sum.unwrap_or(0.0))).collect()
            }
            Some(Data::Gauge(g)) => g.data_points.iter().map(|p| (attrs(&p.attributes), number(&p.value), 0.0)).collect(),
            Some(Data::Sum(s)) => s.data_points.iter().map(|p| (attrs(&p.attributes), number(&p.value), 0.0)).collect(),
            _ => Vec::new(),
        }
    }

    /// The slot of one live communicator `meta`, its drops `counts`.
    fn with_comm(meta: CommMeta, counts: DropCounts) -> CommState {
        CommState {
            slot: 0,
            generation: 1,
            meta,
            counts,
            live: true,
            progress: Default::default(),
        }
    }

    /// `nccl.profiler.export.interval` is the interval while a communicator is live, 0 once none
    /// is (the process has nothing more to report).
    #[test]
    fn the_interval_gauge_says_when_the_process_is_done() {
        let (config, _) = config::Config::from_lookup(|k| (k == config::EXPORTER).then(|| "file".to_owned()));
        let mut h = Harness::new(&config);
        let mut own = with_comm(summary(Vec::new()).comm, DropCounts::default());
        let mut interval = |own: &CommState| {
            h.end(vec![own.clone()], &[]);
            let mut rm = ResourceMetrics::default();
            h.p.reader.collect(&mut rm).expect("collect");
            let points = otlp(&rm, "nccl.profiler.export.interval");
            assert_eq!(points.len(), 1, "{points:?}");
            points[0].1
        };
        assert_eq!(interval(&own), config.interval.as_secs_f64());
        own.live = false;
        assert_eq!(interval(&own), 0.0);
    }

    /// Each configuration problem is a series of `nccl.profiler.config.problems`, counted once
    /// (cumulative: 1 after any number of intervals).
    #[test]
    fn config_problems_are_counted_once() {
        let env = |k: &str| match k {
            config::EXPORTER => Some("file".to_owned()),
            config::DROP_METRICS => Some("channels,link".to_owned()),
            config::WINDOW_CAPACITY => Some("1".to_owned()),
            _ => None,
        };
        let (config, _, problems) = config::Config::read(env);
        let problems: &'static [Problem] = problems.leak();
        let mut h = Harness::new(&config);
        h.end(Vec::new(), problems);
        h.end(Vec::new(), problems);
        let mut rm = ResourceMetrics::default();
        h.p.reader.collect(&mut rm).expect("collect");
        let mut points: Vec<(String, String, f64)> = otlp(&rm, "nccl.profiler.config.problems")
            .into_iter()
            .map(|(a, v, _)| (a["nccl.variable"].clone(), a["nccl.reason"].clone(), v))
            .collect();
        points.sort_by(|a, b| a.0.cmp(&b.0));
        let expected = [
            (config::DROP_METRICS, "unknown_words", 1.0),
            (config::WINDOW_CAPACITY, "invalid", 1.0),
        ];
        let expected: Vec<(String, String, f64)> =
            expected.iter().map(|(v, r, n)| ((*v).to_owned(), (*r).to_owned(), *n)).collect();
        assert_eq!(points, expected);
    }

    /// Under sampling: a timed operation's times count its weight (2^3), a predecessor's only
    /// its size; operations counted without a record are counted and sized under count-only
    /// attributes; the ratio and the shed counter say how much was timed.
    #[test]
    fn sampled_and_counted_operations_are_weighted_and_counted() {
        use crate::aggregate::Split;
        use crate::aggregate::summary::{CollGroup, CollKey, OpSample, Waits};
        use crate::record::counted::{CountKey, Counted};
        use crate::record::sample::{Role, Sample};
        use crate::record::{Algo, Datatype, Proto};

        let (config, _) = config::Config::from_lookup(|k| match k {
            config::EXPORTER => Some("file".to_owned()),
            config::DETAIL => Some("full".to_owned()),
            _ => None,
        });
        let mut h = Harness::new(&config);
        let op = |start: f64, role, ord| OpSample {
            bytes: 1 << 20,
            start,
            duration: Some(1e-3),
            gpu: Some(5e-4),
            transfers: 0,
            waits: Waits::default(),
            sample: Sample::new(3, role, ord),
            bare: true,
        };
        let key = |func, class, p2p| CountKey {
            func,
            algo: Algo::Ring,
            proto: Proto::Simple,
            class,
            p2p,
        };
        let counted = |key, ops, bytes| Counted { key, ops, bytes };
        let mut s = summary(Vec::new());
        s.colls = vec![CollGroup {
            key: CollKey {
                datatype: Datatype::Bfloat16,
                size_class: 20,
                graph: None,
                tag: 0,
                func: Func::AllReduce,
                algo: Algo::Ring,
                proto: Proto::Simple,
            },
            ops: vec![op(0.0, Role::Predecessor, 4), op(1e-4, Role::Timed, 5)],
            transfers: Vec::new(),
        }];
        s.counted = vec![
            counted(Some(key(Func::AllReduce, 20, false)), 5, 5 << 20),
            counted(Some(key(Func::Send, 13, true)), 2, 12 << 10),
            counted(None, 1, 100),
        ];
        let served = Split {
            service: Some(1e-4),
            queue: Some(1e-3),
            missing: None,
        };
        // Sizes and transfers once (none for bare ops), times 8 times: 2 + 8 × (1 + 2 + 3).
        assert_eq!(OpInstruments::measurements(&s.colls[0].ops, &[Split::default(), served], &[]), 50);
        h.record(&s);
        h.end(Vec::new(), &[]);
        let mut rm = ResourceMetrics::default();
        h.p.reader.collect(&mut rm).expect("collect");

        let one = |name: &str| {
            let points = otlp(&rm, name);
            assert_eq!(points.len(), 1, "{name}: {points:?}");
            (points[0].1, points[0].2)
        };
        assert_eq!(one("nccl.coll.duration").0, 8.0, "the timed operation, 8 times");
        assert_eq!(one("nccl.coll.kernel.duration").0, 8.0);
        let (service, summed) = (one("nccl.coll.service.duration"), one("nccl.coll.service.time"));
        assert_eq!(service.0, 8.0);
        assert!((summed.0 - 8.0 * 1e-4).abs() < 1e-12, "service time × 8: {summed:?}");
        assert!(otlp(&rm, "nccl.coll.transfers").is_empty(), "steps shed: transfers unknown");
        let bytes = otlp(&rm, "nccl.coll.bytes");
        let by = |datatype: &str, func: &str| {
            let p = bytes.iter().find(|(a, ..)| a["nccl.datatype"] == datatype && a["nccl.func"] == func);
            p.map(|(a, count, sum)| (a.clone(), *count, *sum)).expect("a bytes series")
        };
        assert_eq!(by("ncclBfloat16", "AllReduce").1, 2.0, "recorded operations, predecessor included");
        let (attrs, count, sum) = by("other", "AllReduce");
        assert_eq!((count, sum, attrs["nccl.algo"].as_str()), (5.0, f64::from(5 << 20), "RING"));
        assert_eq!(attrs["nccl.size_class"], "1MiB");
        assert!(!attrs.contains_key("nccl.user_tag") && !attrs.contains_key("nccl.graph_captured"));
        let (attrs, count, _) = by("other", "other");
        assert_eq!(count, 1.0);
        assert!(["nccl.algo", "nccl.proto", "nccl.size_class"].iter().all(|k| attrs[*k] == "other"));
        let sends = otlp(&rm, "nccl.p2p.bytes");
        assert_eq!(sends.len(), 1);
        let (attrs, count, sum) = &sends[0];
        assert_eq!((attrs["nccl.peer"].as_str(), *count, *sum), ("other", 2.0, f64::from(12 << 10)));
        let ratio = one("nccl.sampling.ratio").0;
        assert!((ratio - 0.1).abs() < 1e-12, "1 timed of 2 recorded and 8 counted: {ratio}");
        let shed = otlp(&rm, "nccl.profiler.events.shed");
        assert!(shed.iter().any(|(a, v, _)| a["nccl.reason"] == "untimed" && *v == 8.0), "{shed:?}");
    }

    /// A link whose three idle transfers of three sizes make a fit.
    fn fitted_link() -> LinkGroup {
        let mut idle = Samples::default();
        for (bytes, secs) in [(1024, 2e-5), (2048, 3e-5), (4096, 5e-5)] {
            idle.push(bytes, secs);
        }
        LinkGroup {
            rank: 0,
            peer: 1,
            bytes: 7168,
            transfers: 3,
            queue: Queue {
                idle,
                ..Queue::default()
            },
        }
    }

    /// A communicator whose ProxyStep detail was shed since the last interval: no link of the
    /// interval gets a latency (reason `shed`), the shed counter says how much.
    #[test]
    fn shed_detail_anywhere_withholds_link_latency() {
        let (config, _) = config::Config::from_lookup(|k| (k == config::EXPORTER).then(|| "file".to_owned()));
        let mut h = Harness::new(&config);
        let s = summary(vec![fitted_link()]);
        let own = with_comm(s.comm.clone(), DropCounts { shed: 40, ..DropCounts::default() });
        h.record(&s);
        h.end(vec![own], &[]);
        let mut rm = ResourceMetrics::default();
        h.p.reader.collect(&mut rm).expect("collect");
        assert!(otlp(&rm, "nccl.link.latency").is_empty());
        let missing = otlp(&rm, "nccl.link.latency.missing");
        assert!(missing.iter().any(|(a, v, _)| a["nccl.reason"] == "shed" && *v == 1.0), "{missing:?}");
        let shed = otlp(&rm, "nccl.profiler.events.shed");
        assert!(shed.iter().any(|(a, v, _)| a["nccl.reason"] == "detail" && *v == 40.0), "{shed:?}");
    }
}

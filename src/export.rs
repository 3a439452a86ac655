//! OTLP export: the OpenTelemetry meter provider, the instruments of the metric catalogue
//! (`docs/metrics.md`, followed exactly here), and the exporter thread. The only module that
//! imports `opentelemetry*`.
//!
//! Threads:
//! - whoever delivers window summaries (the telemetry thread, or NCCL's thread in `finalize`)
//!   calls the [`Inbox`] sink: a short lock and a clone, no OpenTelemetry call.
//! - the telemetry thread owns the [`Pipeline`]: it drains the inbox, records into the SDK's
//!   instruments, merges each interval's regression samples per link and channel, and once per
//!   interval (or when asked to flush) collects the SDK's state into one export request and
//!   queues it. It never waits for I/O.
//! - the exporter thread (`nccl-otel-export`, ours, one per process) sends queued requests: OTLP
//!   over HTTP with reqwest's blocking client, OTLP over gRPC on a tokio runtime private to that
//!   thread (cargo feature `grpc`), or OTLP-JSON lines to a file or stdout. Retries are off: each
//!   request takes at most the export timeout, and the next interval's request supersedes it.
//!
//! Invariants: at most `queue` requests wait (the oldest is dropped and counted); at most
//! `cardinality_limit` attribute sets per instrument are recorded as themselves, later ones go to
//! the `otel.metric.overflow=true` series and are counted (the SDK's own limit is set above ours,
//! so its silent overflow never triggers); the inbox holds at most [`INBOX_CAPACITY`] summaries.
#![forbid(unsafe_code)]

use std::borrow::Cow;
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::io::Write as _;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use opentelemetry::metrics::{Counter, Gauge, Histogram, Meter, MeterProvider as _};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter as _;
use opentelemetry_sdk::metrics::reader::MetricReader;
use opentelemetry_sdk::metrics::{InstrumentKind, ManualReader, Pipeline as SdkPipeline, SdkMeterProvider, Stream};
use parking_lot::{Condvar, Mutex};

use crate::aggregate::{CommMeta, OpSample, Transfer, WindowSummary};
use crate::comm::{self, DropCounts};
use crate::config::{self, Exporter, Protocol, Temporality};
use crate::regression::{Mode, Samples};
use crate::stats::STATS;
use crate::telemetry::{self, Sink};

/// Summaries waiting for the telemetry thread; the oldest is dropped (and counted) beyond this.
pub const INBOX_CAPACITY: usize = 256;

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

/// The attribute every measurement beyond the cardinality limit carries instead of its own.
pub const OVERFLOW_ATTRIBUTE: &str = "otel.metric.overflow";

/// Counters of the export machinery; exported as self-telemetry, and read by tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportStats {
    /// Requests the exporter delivered.
    pub exported: u64,
    /// Requests the exporter failed to deliver (error, timeout, refused, HTTP/gRPC status).
    pub failures: u64,
    /// Requests dropped from a full queue.
    pub dropped: u64,
    /// Requests waiting now (the one in flight excluded).
    pub queued: u64,
    /// Window summaries dropped from a full inbox.
    pub windows_dropped: u64,
    /// Measurements that went to an overflow series.
    pub overflow: u64,
}

static EXPORTED: AtomicU64 = AtomicU64::new(0);
static FAILURES: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
static WINDOWS_DROPPED: AtomicU64 = AtomicU64::new(0);
static OVERFLOW: AtomicU64 = AtomicU64::new(0);
/// Whether the last request went through (true before the first).
static HEALTHY: AtomicBool = AtomicBool::new(true);

/// A snapshot of the export counters. Called on: any thread.
pub fn stats() -> ExportStats {
    ExportStats {
        exported: EXPORTED.load(Ordering::Relaxed),
        failures: FAILURES.load(Ordering::Relaxed),
        dropped: DROPPED.load(Ordering::Relaxed),
        queued: QUEUE.state.lock().requests.len() as u64,
        windows_dropped: WINDOWS_DROPPED.load(Ordering::Relaxed),
        overflow: OVERFLOW.load(Ordering::Relaxed),
    }
}

// ---------------------------------------------------------------------------------------------
// Inbox: summaries from any delivering thread to the telemetry thread.

static INBOX: Mutex<VecDeque<WindowSummary>> = Mutex::new(VecDeque::new());

/// The sink that hands summaries to the telemetry thread. Called on: the telemetry thread or a
/// finalizing NCCL thread; never records into OpenTelemetry itself.
pub struct Inbox;

impl Sink for Inbox {
    fn window(&self, summary: &WindowSummary) {
        let mut inbox = INBOX.lock();
        if inbox.len() >= INBOX_CAPACITY {
            inbox.pop_front();
            WINDOWS_DROPPED.fetch_add(1, Ordering::Relaxed);
        }
        inbox.push_back(summary.clone());
    }
}

// ---------------------------------------------------------------------------------------------
// Queue: export requests from the telemetry thread to the exporter thread.

struct QueueState {
    /// (sequence number, request), oldest first.
    requests: VecDeque<(u64, ResourceMetrics)>,
    capacity: usize,
    /// Sequence number of the last request queued.
    queued: u64,
    /// Every request up to this sequence number is finished: sent or failed, or dropped before a
    /// later one that was.
    done: u64,
    /// The last error, until the telemetry thread logs it.
    error: Option<String>,
}

struct Queue {
    state: Mutex<QueueState>,
    /// Wakes the exporter thread.
    work: Condvar,
    /// Wakes [`wait_exported`].
    progress: Condvar,
}

static QUEUE: Queue = Queue {
    state: Mutex::new(QueueState {
        requests: VecDeque::new(),
        capacity: 1,
        queued: 0,
        done: 0,
        error: None,
    }),
    work: Condvar::new(),
    progress: Condvar::new(),
};

/// Queues one request; returns its sequence number. Drops the oldest waiting one when full.
fn enqueue(rm: ResourceMetrics) -> u64 {
    let mut q = QUEUE.state.lock();
    // A dropped request is not `done`: a flush waiting for it waits for a later request (which
    // carries the dropped one's cumulative totals) to be sent.
    while q.requests.len() >= q.capacity && q.requests.pop_front().is_some() {
        DROPPED.fetch_add(1, Ordering::Relaxed);
    }
    q.queued += 1;
    let seq = q.queued;
    q.requests.push_back((seq, rm));
    QUEUE.work.notify_one();
    QUEUE.progress.notify_all();
    seq
}

/// Whether the last export request went through (true before the first one). Called on: any
/// thread.
pub fn healthy() -> bool {
    HEALTHY.load(Ordering::Relaxed)
}

/// Waits until request `seq` is finished (sent or failed, or dropped and a later one sent or
/// failed) or `deadline` passes;
/// returns whether it finished. Called on: a flushing NCCL thread (`finalize`, exit).
pub fn wait_exported(seq: u64, deadline: Instant) -> bool {
    let mut q = QUEUE.state.lock();
    while q.done < seq {
        if QUEUE.progress.wait_until(&mut q, deadline).timed_out() {
            return q.done >= seq;
        }
    }
    true
}

// ---------------------------------------------------------------------------------------------
// Start.

/// Registers the [`Inbox`] sink and starts the exporter thread, unless the exporter is `none`.
/// Returns whether export is on. Called on: NCCL's init thread, once per process (before the
/// telemetry thread exists).
pub fn install(config: &config::Export) -> bool {
    if config.exporter == Exporter::None {
        return false;
    }
    QUEUE.state.lock().capacity = config.queue as usize;
    telemetry::add_sink(Arc::new(Inbox));
    let owned = config.clone();
    let spawned = std::thread::Builder::new()
        .name("nccl-otel-export".into())
        .spawn(move || run_exporter(&owned));
    if let Err(e) = spawned {
        tracing::warn!("cannot start the export thread ({e}); metrics are not exported");
        return false;
    }
    true
}

/// The resource of every export: `service.name`, `host.name`, `process.pid`, the SDK's
/// `telemetry.sdk.*`, ours as `telemetry.distro.*`, the launcher identity and
/// `OTEL_RESOURCE_ATTRIBUTES` (which wins).
fn resource(config: &config::Export) -> Resource {
    let mut attributes = vec![
        KeyValue::new("telemetry.sdk.name", "opentelemetry"),
        KeyValue::new("telemetry.sdk.language", "rust"),
        KeyValue::new("telemetry.distro.name", "nccl-profiler-otel"),
        KeyValue::new("telemetry.distro.version", env!("CARGO_PKG_VERSION")),
        KeyValue::new("host.name", host_name()),
        KeyValue::new("process.pid", i64::from(std::process::id())),
    ];
    attributes.extend(config.resource.iter().map(|(k, v)| KeyValue::new(k.clone(), v.clone())));
    attributes.push(KeyValue::new("service.name", config.service_name.clone()));
    Resource::builder_empty().with_attributes(attributes).build()
}

/// The kernel's host name (`/proc/sys/kernel/hostname`), else `unknown`.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The file exporter's path: `%h` host, `%p` pid, `%%` a percent sign.
pub fn expand_path(pattern: &str, host: &str, pid: u32) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        match (c, c == '%') {
            (_, false) => out.push(c),
            (_, true) => match chars.next() {
                Some('h') => out.push_str(host),
                Some('p') => out.push_str(&pid.to_string()),
                Some(other) => {
                    out.push('%');
                    if other != '%' {
                        out.push(other);
                    }
                }
                None => out.push('%'),
            },
        }
    }
    out
}

fn sdk_temporality(t: Temporality) -> opentelemetry_sdk::metrics::Temporality {
    match t {
        Temporality::Cumulative => opentelemetry_sdk::metrics::Temporality::Cumulative,
        Temporality::Delta => opentelemetry_sdk::metrics::Temporality::Delta,
        Temporality::LowMemory => opentelemetry_sdk::metrics::Temporality::LowMemory,
    }
}

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

// ---------------------------------------------------------------------------------------------
// Instruments.

/// Histograms of collectives or P2P sends.
/// Byte histograms are `f64`: the OTLP sum is a double anyway, and an `f64` sum cannot overflow
/// (a `u64` one can, on absurd byte counts: the SDK then panics in debug builds and wraps in
/// release).
struct OpInstruments {
    bytes: Histogram<f64>,
    duration: Histogram<f64>,
    transfers: Histogram<u64>,
    transfer_size: Histogram<f64>,
    transfer_duration: Histogram<f64>,
}

impl OpInstruments {
    fn new(meter: &Meter, prefix: &str, what: &str) -> Self {
        OpInstruments {
            bytes: histogram(
                meter,
                format!("{prefix}.bytes"),
                "By",
                format!("Bytes of each {what} (count × datatype size)"),
                &SIZE_BOUNDS,
            ),
            duration: histogram(
                meter,
                format!("{prefix}.duration"),
                "s",
                format!("Duration of each {what}, start to last proxy op stop"),
                &DURATION_BOUNDS,
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
        }
    }

    /// Bound once per group: the attribute lookup is paid per call, not per measurement. Only
    /// instruments that get a value are bound (binding alone creates the series).
    fn record(&self, ops: &[OpSample], transfers: &[Transfer], attrs: &[KeyValue]) {
        if !ops.is_empty() {
            let (bytes, count) = (self.bytes.bind(attrs), self.transfers.bind(attrs));
            for op in ops {
                bytes.record(op.bytes as f64);
                count.record(u64::from(op.transfers));
            }
        }
        if ops.iter().any(|op| op.duration.is_some()) {
            let duration = self.duration.bind(attrs);
            ops.iter().filter_map(|op| op.duration).for_each(|d| duration.record(d));
        }
        if !transfers.is_empty() {
            let (size, secs) = (self.transfer_size.bind(attrs), self.transfer_duration.bind(attrs));
            for t in transfers {
                size.record(t.bytes as f64);
                secs.record(t.secs);
            }
        }
    }

    /// Measurements [`OpInstruments::record`] makes.
    fn measurements(ops: &[OpSample], transfers: &[Transfer]) -> u64 {
        let durations = ops.iter().filter(|o| o.duration.is_some()).count();
        (2 * ops.len() + durations + 2 * transfers.len()) as u64
    }
}

struct Instruments {
    coll: OpInstruments,
    p2p: OpInstruments,
    link_bytes: Counter<u64>,
    link_latency: Gauge<f64>,
    link_bandwidth: Gauge<f64>,
    link_r2: Gauge<f64>,
    link_samples: Gauge<u64>,
    channel_transfer_size: Histogram<f64>,
    channel_transfer_duration: Histogram<f64>,
    channel_latency: Gauge<f64>,
    events_recorded: Counter<u64>,
    events_dropped: Counter<u64>,
    events_rejected: Counter<u64>,
    events_declined: Counter<u64>,
    events_unfinished: Counter<u64>,
    events_orphaned: Counter<u64>,
    pxn_ops: Counter<u64>,
    windows_processed: Counter<u64>,
    windows_forced: Counter<u64>,
    windows_dropped: Counter<u64>,
    panics: Counter<u64>,
    export_sent: Counter<u64>,
    export_failures: Counter<u64>,
    export_dropped: Counter<u64>,
    cardinality_overflow: Counter<u64>,
}

fn counter(meter: &Meter, name: &'static str, unit: &'static str, description: &'static str) -> Counter<u64> {
    meter
        .u64_counter(name)
        .with_unit(unit)
        .with_description(description)
        .build()
}

fn histogram(
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

fn gauge(meter: &Meter, name: &'static str, unit: &'static str, description: &'static str) -> Gauge<f64> {
    meter
        .f64_gauge(name)
        .with_unit(unit)
        .with_description(description)
        .build()
}

impl Instruments {
    fn new(meter: &Meter) -> Self {
        Instruments {
            coll: OpInstruments::new(meter, "nccl.coll", "collective"),
            p2p: OpInstruments::new(meter, "nccl.p2p", "P2P send"),
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
                "Per-transfer latency of the link: intercept of the interval's time-vs-size fit",
            ),
            link_bandwidth: gauge(
                meter,
                "nccl.link.bandwidth",
                "By/s",
                "Bandwidth of the link: inverse slope of the interval's time-vs-size fit",
            ),
            link_r2: gauge(
                meter,
                "nccl.link.r2",
                "1",
                "Coefficient of determination of the link's fit",
            ),
            link_samples: meter
                .u64_gauge("nccl.link.samples")
                .with_unit("{transfer}")
                .with_description("Transfers of the link in the interval's fit")
                .build(),
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
                "Per-transfer latency of the channel: intercept of the interval's time-vs-size fit",
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
                "Events not recorded by design (receive side, ProxyCtrl, children of declined events)",
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
                "Child events whose parent was not in their window",
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
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Cardinality.

/// Metric families: the instruments of one family share their attribute sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Family {
    Coll,
    P2p,
    Link,
    Channel,
    Profiler,
}

impl Family {
    fn prefix(self) -> &'static str {
        match self {
            Family::Coll => "nccl.coll",
            Family::P2p => "nccl.p2p",
            Family::Link => "nccl.link",
            Family::Channel => "nccl.channel",
            Family::Profiler => "nccl.profiler",
        }
    }
}

/// Admits at most `limit` attribute sets per family: forever under cumulative temporality,
/// per interval under delta (the SDK forgets what was not updated in an interval).
struct Limiter {
    limit: usize,
    per_interval: bool,
    seen: HashMap<Family, HashSet<Vec<KeyValue>>>,
}

impl Limiter {
    fn admit(&mut self, family: Family, attrs: &[KeyValue]) -> bool {
        let seen = self.seen.entry(family).or_default();
        if seen.contains(attrs) {
            return true;
        }
        if seen.len() >= self.limit {
            return false;
        }
        seen.insert(attrs.to_vec());
        true
    }

    fn end_interval(&mut self) {
        if self.per_interval {
            self.seen.values_mut().for_each(HashSet::clear);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Pipeline: the telemetry thread's side.

/// A link's identity within an interval: (hash, name, nranks, sending rank, peer).
type LinkKey = (u64, String, i32, i32, i32);
/// A channel's identity within an interval: (hash, name, rank, nranks, channel).
type ChannelKey = (u64, String, i32, i32, u8);

/// Process-wide counters last exported, to add only the change.
#[derive(Default)]
struct Seen {
    stats: [u64; 8],
    export: [u64; 4],
    /// Per communicator slot: the generation and communicator last seen there, its drop counts.
    drops: Vec<Option<(u16, CommMeta, DropCounts)>>,
}

/// The telemetry thread's export state. Called on: the telemetry thread only.
pub struct Pipeline {
    _provider: SdkMeterProvider,
    reader: SharedReader,
    inst: Instruments,
    limiter: Limiter,
    mode: Mode,
    interval: Duration,
    next: Instant,
    links: HashMap<LinkKey, Samples>,
    channels: HashMap<ChannelKey, Samples>,
    seen: Seen,
    endpoint: String,
    /// Whether the last logged export state was failing.
    failing: bool,
    failures_logged: u64,
    exported_logged: u64,
}

impl Pipeline {
    /// The provider, its instruments and an empty interval; `None` when export is off.
    /// Called on: the telemetry thread.
    pub fn new(config: &config::Config, now: Instant) -> Option<Pipeline> {
        let export = &config.export;
        if export.exporter == Exporter::None {
            return None;
        }
        let reader = SharedReader(Arc::new(
            ManualReader::builder()
                .with_temporality(sdk_temporality(export.temporality))
                .build(),
        ));
        // Above ours: every set we admit plus the overflow set, twice for delta's two intervals.
        let sdk_limit = 2 * export.cardinality_limit as usize + 2;
        let provider = SdkMeterProvider::builder()
            .with_resource(resource(export))
            .with_reader(reader.clone())
            .with_view(move |_: &opentelemetry_sdk::metrics::Instrument| {
                Stream::builder().with_cardinality_limit(sdk_limit).build().ok()
            })
            .build();
        let scope = InstrumentationScope::builder("nccl-profiler-otel")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let inst = Instruments::new(&provider.meter_with_scope(scope));
        Some(Pipeline {
            _provider: provider,
            reader,
            inst,
            limiter: Limiter {
                limit: export.cardinality_limit as usize,
                per_interval: export.temporality == Temporality::Delta,
                seen: HashMap::new(),
            },
            mode: config.regression_mode,
            interval: config.interval,
            next: now + config.interval,
            links: HashMap::new(),
            channels: HashMap::new(),
            seen: Seen::default(),
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

    /// Records the summaries delivered since the last call; at the end of an interval, or when
    /// `flush` is set, closes the interval and queues one export request. Returns that request's
    /// sequence number. Called on: the telemetry thread, every tick.
    pub fn tick(&mut self, now: Instant, flush: bool) -> Option<u64> {
        let summaries = std::mem::take(&mut *INBOX.lock());
        for summary in &summaries {
            self.record(summary);
        }
        if !(flush || now >= self.next) {
            return None;
        }
        self.next = now + self.interval;
        self.end_interval();
        let mut rm = ResourceMetrics::default();
        if let Err(e) = self.reader.collect(&mut rm) {
            tracing::warn!("cannot collect metrics: {e}");
            return None;
        }
        self.limiter.end_interval();
        Some(enqueue(rm))
    }

    /// Admits `attrs` for `family`, or counts `n` measurements as overflow and returns the
    /// overflow attribute set.
    fn attrs_or_overflow(&mut self, family: Family, attrs: Vec<KeyValue>, n: u64) -> Vec<KeyValue> {
        if self.limiter.admit(family, &attrs) {
            return attrs;
        }
        self.overflow(family, n);
        vec![KeyValue::new(OVERFLOW_ATTRIBUTE, true)]
    }

    fn overflow(&mut self, family: Family, n: u64) {
        OVERFLOW.fetch_add(n, Ordering::Relaxed);
        self.inst
            .cardinality_overflow
            .add(n, &[KeyValue::new("nccl.family", family.prefix())]);
    }

    /// One window's histograms and counters, and its regression samples for the interval.
    fn record(&mut self, s: &WindowSummary) {
        let base = comm_attrs(&s.comm);
        let comm = self.attrs_or_overflow(Family::Profiler, base.clone(), 5);
        let i = &self.inst;
        i.events_recorded.add(s.stats.records, &comm);
        i.events_unfinished.add(s.stats.unfinished, &comm);
        i.events_orphaned.add(s.stats.orphans, &comm);
        i.windows_processed.add(1, &comm);
        i.windows_forced.add(u64::from(s.stats.forced), &comm);

        for g in &s.colls {
            let mut attrs = base.clone();
            attrs.extend([
                KeyValue::new("nccl.func", g.key.func.as_str()),
                KeyValue::new("nccl.algo", g.key.algo.as_str()),
                KeyValue::new("nccl.proto", g.key.proto.as_str()),
                KeyValue::new("nccl.datatype", g.key.datatype.as_str()),
            ]);
            let n = OpInstruments::measurements(&g.ops, &g.transfers);
            let attrs = self.attrs_or_overflow(Family::Coll, attrs, n);
            self.inst.coll.record(&g.ops, &g.transfers, &attrs);
        }
        for g in &s.p2ps {
            let mut attrs = base.clone();
            attrs.extend([
                KeyValue::new("nccl.func", "Send"),
                KeyValue::new("nccl.peer", i64::from(g.peer)),
                KeyValue::new("nccl.datatype", g.datatype.as_str()),
            ]);
            let n = OpInstruments::measurements(&g.ops, &g.transfers);
            let attrs = self.attrs_or_overflow(Family::P2p, attrs, n);
            self.inst.p2p.record(&g.ops, &g.transfers, &attrs);
        }
        for l in &s.links {
            let attrs = link_attrs(&s.comm, l.rank, l.peer);
            let attrs = self.attrs_or_overflow(Family::Link, attrs, 1);
            self.inst.link_bytes.add(l.bytes, &attrs);
            let key = (s.comm.hash, s.comm.name.clone(), s.comm.nranks, l.rank, l.peer);
            self.links.entry(key).or_default().merge(&l.samples);
        }
        for c in &s.channels {
            let mut attrs = base.clone();
            attrs.push(KeyValue::new("nccl.channel", i64::from(c.channel)));
            let attrs = self.attrs_or_overflow(Family::Channel, attrs, 2 * c.transfers.len() as u64);
            if !c.transfers.is_empty() {
                let size = self.inst.channel_transfer_size.bind(&attrs);
                let secs = self.inst.channel_transfer_duration.bind(&attrs);
                for t in &c.transfers {
                    size.record(t.bytes as f64);
                    secs.record(t.secs);
                }
            }
            let key = (s.comm.hash, s.comm.name.clone(), s.comm.rank, s.comm.nranks, c.channel);
            self.channels.entry(key).or_default().merge(&c.samples);
        }
    }

    /// Fits the interval's samples into the gauges, adds the self-telemetry counters and logs
    /// the export state (at most one line per interval).
    fn end_interval(&mut self) {
        for ((hash, name, nranks, rank, peer), samples) in std::mem::take(&mut self.links) {
            let meta = CommMeta {
                hash,
                name,
                rank,
                nranks,
                nnodes: 0,
            };
            let attrs = link_attrs(&meta, rank, peer);
            if !self.limiter.admit(Family::Link, &attrs) {
                self.overflow(Family::Link, 1);
                continue;
            }
            let i = &self.inst;
            i.link_samples.record(samples.len(), &attrs);
            if let Some(fit) = samples.fit(self.mode) {
                i.link_latency.record(fit.latency(), &attrs);
                i.link_bandwidth.record(fit.bandwidth(), &attrs);
                i.link_r2.record(fit.r2, &attrs);
            }
        }
        for ((hash, name, rank, nranks, channel), samples) in std::mem::take(&mut self.channels) {
            let meta = CommMeta {
                hash,
                name,
                rank,
                nranks,
                nnodes: 0,
            };
            let mut attrs = comm_attrs(&meta);
            attrs.push(KeyValue::new("nccl.channel", i64::from(channel)));
            if !self.limiter.admit(Family::Channel, &attrs) {
                self.overflow(Family::Channel, 1);
                continue;
            }
            if let Some(fit) = samples.fit(self.mode) {
                self.inst.channel_latency.record(fit.latency(), &attrs);
            }
        }
        self.self_telemetry();
        self.log_export_state();
    }

    /// Adds what the process-wide, per-communicator and export counters gained since the last
    /// interval (zero included, so every series exists from the first export on).
    fn self_telemetry(&mut self) {
        let now = [
            STATS.panics.get(),
            STATS.null_args.get(),
            STATS.stale.get(),
            STATS.unknown_types.get(),
            STATS.unknown_states.get(),
            STATS.foreign_unmatched.get(),
            STATS.declined.get(),
            STATS.foreign_ops.get(),
        ];
        let d: Vec<u64> = now
            .iter()
            .zip(self.seen.stats)
            .map(|(n, s)| n.saturating_sub(s))
            .collect();
        self.seen.stats = now;
        let i = &self.inst;
        let reason = |r: &'static str| [KeyValue::new("nccl.reason", r)];
        i.panics.add(d[0], &[]);
        i.events_rejected.add(d[1], &reason("null_arg"));
        i.events_rejected.add(d[2], &reason("stale"));
        i.events_rejected.add(d[3], &reason("unknown_type"));
        i.events_rejected.add(d[4], &reason("unknown_state"));
        i.events_rejected.add(d[5], &reason("pxn_unmatched"));
        i.events_declined.add(d[6], &[]);
        i.pxn_ops.add(d[7], &[]);

        let export = [
            FAILURES.load(Ordering::Relaxed),
            DROPPED.load(Ordering::Relaxed),
            WINDOWS_DROPPED.load(Ordering::Relaxed),
            EXPORTED.load(Ordering::Relaxed),
        ];
        let e: Vec<u64> = export
            .iter()
            .zip(self.seen.export)
            .map(|(n, s)| n.saturating_sub(s))
            .collect();
        self.seen.export = export;
        i.export_failures.add(e[0], &[]);
        i.export_dropped.add(e[1], &[]);
        i.windows_dropped.add(e[2], &[]);
        i.export_sent.add(e[3], &[]);

        // A slot's counters restart at 0 when a communicator registers there (a new generation).
        for (slot, c) in comm::all().enumerate() {
            let generation = c.generation();
            let (meta, counts, live) = (c.meta(), c.drop_counts(), c.is_live());
            if c.generation() != generation {
                continue; // re-registered meanwhile: next interval
            }
            if self.seen.drops.len() <= slot {
                self.seen.drops.resize(slot + 1, None);
            }
            let known = matches!(&self.seen.drops[slot], Some((g, m, _)) if *g == generation && *m == meta);
            let last = match &self.seen.drops[slot] {
                Some((_, _, last))
                    if known
                        && last.full <= counts.full
                        && last.late <= counts.late
                        && last.unpublished <= counts.unpublished =>
                {
                    *last
                }
                _ => DropCounts::default(),
            };
            let deltas = [
                ("full", counts.full - last.full),
                ("late", counts.late - last.late),
                ("unpublished", counts.unpublished - last.unpublished),
            ];
            self.seen.drops[slot] = Some((generation, meta.clone(), counts));
            // A finalized communicator is reported once more (so even a short-lived one has
            // its series), then only if its counters still move.
            if known && !live && deltas.iter().all(|(_, d)| *d == 0) {
                continue;
            }
            for (reason, delta) in deltas {
                let mut attrs = comm_attrs(&meta);
                attrs.push(KeyValue::new("nccl.reason", reason));
                let attrs = self.attrs_or_overflow(Family::Profiler, attrs, 1);
                self.inst.events_dropped.add(delta, &attrs);
            }
        }
    }

    /// Logs export failures since the last interval: WARN when exports start failing, INFO
    /// while they keep failing, INFO when they recover. At most one line per interval.
    fn log_export_state(&mut self) {
        let failures = FAILURES.load(Ordering::Relaxed);
        let exported = EXPORTED.load(Ordering::Relaxed);
        let new_failures = failures - self.failures_logged;
        let new_exports = exported - self.exported_logged;
        self.failures_logged = failures;
        self.exported_logged = exported;
        let error = QUEUE.state.lock().error.take();
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

/// `nccl.comm.hash`, `nccl.comm.name`, `nccl.rank`, `nccl.nranks`.
fn comm_attrs(meta: &CommMeta) -> Vec<KeyValue> {
    vec![
        KeyValue::new("nccl.comm.hash", format!("{:#x}", meta.hash)),
        KeyValue::new("nccl.comm.name", meta.name.clone()),
        KeyValue::new("nccl.rank", i64::from(meta.rank)),
        KeyValue::new("nccl.nranks", i64::from(meta.nranks)),
    ]
}

/// The link's attributes: its communicator's, with `nccl.rank` the sending rank, and `nccl.peer`.
fn link_attrs(meta: &CommMeta, rank: i32, peer: i32) -> Vec<KeyValue> {
    vec![
        KeyValue::new("nccl.comm.hash", format!("{:#x}", meta.hash)),
        KeyValue::new("nccl.comm.name", meta.name.clone()),
        KeyValue::new("nccl.rank", i64::from(rank)),
        KeyValue::new("nccl.nranks", i64::from(meta.nranks)),
        KeyValue::new("nccl.peer", i64::from(peer)),
    ]
}

// ---------------------------------------------------------------------------------------------
// Exporter thread.

/// What sends requests; built on the exporter thread.
enum Sender {
    Otlp(Box<Otlp>),
    File(FileSink),
    Stdout,
}

/// OTLP exporter and, for gRPC, the runtime it runs on.
struct Otlp {
    exporter: opentelemetry_otlp::MetricExporter,
    timeout: Duration,
    #[cfg(feature = "grpc")]
    runtime: Option<tokio::runtime::Runtime>,
}

/// The file exporter: opened on first use, appended to.
struct FileSink {
    path: String,
    file: Option<std::fs::File>,
}

/// The exporter thread: builds the sender, then sends each queued request in order.
fn run_exporter(config: &config::Export) {
    let mut sender = build_sender(config);
    loop {
        let (seq, rm) = {
            let mut q = QUEUE.state.lock();
            loop {
                if let Some(next) = q.requests.pop_front() {
                    break next;
                }
                QUEUE.work.wait(&mut q);
            }
        };
        // A panic in the exporter stack is a failed request, never the end of this thread.
        let result = catch_unwind(AssertUnwindSafe(|| match &mut sender {
            Ok(sender) => send(sender, &rm),
            Err(e) => Err(e.clone()),
        }))
        .unwrap_or_else(|_| {
            STATS.panics.incr();
            Err("the exporter panicked".to_owned())
        });
        drop(rm);
        let mut q = QUEUE.state.lock();
        HEALTHY.store(result.is_ok(), Ordering::Relaxed);
        match result {
            Ok(()) => EXPORTED.fetch_add(1, Ordering::Relaxed),
            Err(e) => {
                q.error = Some(e);
                FAILURES.fetch_add(1, Ordering::Relaxed)
            }
        };
        q.done = q.done.max(seq);
        QUEUE.progress.notify_all();
    }
}

fn build_sender(config: &config::Export) -> Result<Sender, String> {
    match config.exporter {
        Exporter::File => {
            let path = expand_path(&config.file, &host_name(), std::process::id());
            Ok(Sender::File(FileSink { path, file: None }))
        }
        Exporter::Stdout => Ok(Sender::Stdout),
        Exporter::Otlp | Exporter::None => build_otlp(config).map(|o| Sender::Otlp(Box::new(o))),
    }
}

fn send(sender: &mut Sender, rm: &ResourceMetrics) -> Result<(), String> {
    match sender {
        Sender::Otlp(otlp) => otlp.send(rm),
        Sender::File(f) => {
            let line = json_line(rm)?;
            if f.file.is_none() {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&f.path)
                    .map_err(|e| format!("cannot open {}: {e}", f.path))?;
                f.file = Some(file);
            }
            let Some(file) = f.file.as_mut() else {
                return Err(format!("cannot open {}", f.path));
            };
            file.write_all(&line)
                .and_then(|()| file.flush())
                .map_err(|e| format!("cannot write {}: {e}", f.path))
        }
        Sender::Stdout => {
            let line = json_line(rm)?;
            let mut out = std::io::stdout().lock();
            out.write_all(&line)
                .and_then(|()| out.flush())
                .map_err(|e| format!("cannot write to stdout: {e}"))
        }
    }
}

/// One `ExportMetricsServiceRequest` in the OTLP/JSON encoding (camelCase fields, 64-bit integers
/// as strings, enums as numbers), followed by a newline.
fn json_line(rm: &ResourceMetrics) -> Result<Vec<u8>, String> {
    let request = ExportMetricsServiceRequest::from(rm);
    let mut line = serde_json::to_vec(&request).map_err(|e| format!("cannot encode JSON: {e}"))?;
    line.push(b'\n');
    Ok(line)
}

/// Whether `endpoint`'s host is a loopback name or address.
fn is_loopback(endpoint: &str) -> bool {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.split(':').next().unwrap_or_default(),
    };
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn headers_map(headers: &[(String, String)]) -> HashMap<String, String> {
    headers.iter().cloned().collect()
}

fn build_otlp(config: &config::Export) -> Result<Otlp, String> {
    use opentelemetry_otlp::{MetricExporter, RetryPolicy, WithExportConfig as _};

    #[cfg(feature = "tls")]
    let _ = rustls::crypto::ring::default_provider().install_default();
    let temporality = sdk_temporality(config.temporality);
    let fail = |e: &dyn std::fmt::Display| format!("cannot build the OTLP exporter for {}: {e}", config.endpoint);
    match config.protocol {
        Protocol::HttpProtobuf | Protocol::HttpJson => {
            use opentelemetry_otlp::WithHttpConfig as _;
            let mut client = reqwest::blocking::Client::builder()
                .timeout(config.timeout)
                .connect_timeout(config.timeout);
            if is_loopback(&config.endpoint) {
                // HTTP_PROXY and friends must not capture a collector on this machine.
                client = client.no_proxy();
            }
            #[cfg(feature = "tls")]
            if let Some(ca) = &config.certificate {
                let certs = reqwest::Certificate::from_pem_bundle(&ca.pem).map_err(|e| fail(&e))?;
                client = client.tls_certs_only(certs);
            } else if !config.endpoint.starts_with("https://") {
                // Nothing to verify: without this the client loads the system roots, and cannot be
                // built on a host that has none.
                client = client.tls_certs_only([]);
            }
            let client = client.build().map_err(|e| fail(&e))?;
            let protocol = match config.protocol {
                Protocol::HttpJson => opentelemetry_otlp::Protocol::HttpJson,
                _ => opentelemetry_otlp::Protocol::HttpBinary,
            };
            let exporter = MetricExporter::builder()
                .with_http()
                .with_http_client(client)
                .with_endpoint(config.endpoint.clone())
                .with_protocol(protocol)
                .with_timeout(config.timeout)
                .with_headers(headers_map(&config.headers))
                .with_retry_policy(RetryPolicy::disabled())
                .with_temporality(temporality)
                .build()
                .map_err(|e| fail(&e))?;
            Ok(Otlp {
                exporter,
                timeout: config.timeout,
                #[cfg(feature = "grpc")]
                runtime: None,
            })
        }
        #[cfg(feature = "grpc")]
        Protocol::Grpc => {
            use opentelemetry_otlp::WithTonicConfig as _;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| fail(&e))?;
            let mut metadata = tonic::metadata::MetadataMap::new();
            for (k, v) in &config.headers {
                let key = tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes());
                if let (Ok(key), Ok(value)) = (key, v.parse()) {
                    metadata.insert(key, value);
                }
            }
            let builder = MetricExporter::builder()
                .with_tonic()
                .with_endpoint(config.endpoint.clone())
                .with_protocol(opentelemetry_otlp::Protocol::Grpc)
                .with_timeout(config.timeout)
                .with_metadata(metadata)
                .with_retry_policy(RetryPolicy::disabled())
                .with_temporality(temporality);
            #[cfg(feature = "tls")]
            let builder = if config.endpoint.starts_with("https://") {
                let tls = tonic::transport::ClientTlsConfig::new();
                builder.with_tls_config(match &config.certificate {
                    Some(ca) => tls.ca_certificate(tonic::transport::Certificate::from_pem(&ca.pem)),
                    None => tls.with_enabled_roots(),
                })
            } else {
                builder
            };
            let exporter = {
                let _entered = runtime.enter();
                builder.build().map_err(|e| fail(&e))?
            };
            Ok(Otlp {
                exporter,
                timeout: config.timeout,
                runtime: Some(runtime),
            })
        }
        #[cfg(not(feature = "grpc"))]
        Protocol::Grpc => Err(fail(&"this build has no gRPC support (cargo feature grpc)")),
    }
}

impl Otlp {
    /// One export, bounded by the timeout (the HTTP client's own; gRPC also under a timer).
    fn send(&self, rm: &ResourceMetrics) -> Result<(), String> {
        #[cfg(feature = "grpc")]
        if let Some(runtime) = &self.runtime {
            let limit = self.timeout + Duration::from_millis(100);
            let export = async { tokio::time::timeout(limit, self.exporter.export(rm)).await };
            return match runtime.block_on(export) {
                Ok(result) => result.map_err(|e| e.to_string()),
                Err(_) => Err(format!("timed out after {} ms", limit.as_millis())),
            };
        }
        let _ = self.timeout;
        block_on(self.exporter.export(rm)).map_err(|e| e.to_string())
    }
}

/// Polls `future` to completion on this thread. The blocking HTTP client does its I/O inside the
/// first poll, so this rarely parks.
fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        match future.as_mut().poll(&mut cx) {
            Poll::Ready(output) => return output,
            Poll::Pending => std::thread::park(),
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
        assert_eq!((COUNT_BOUNDS[0], COUNT_BOUNDS[16]), (1.0, 65536.0));
    }

    #[test]
    fn path_placeholders() {
        assert_eq!(
            expand_path("nccl-otel-%h-%p.jsonl", "node1", 42),
            "nccl-otel-node1-42.jsonl"
        );
        assert_eq!(expand_path("/a/100%%/%p", "h", 7), "/a/100%/7");
        assert_eq!(expand_path("x%", "h", 7), "x%");
    }

    #[test]
    fn loopback_detection() {
        for e in [
            "http://localhost:4318/v1/metrics",
            "http://127.0.0.1:4318",
            "https://127.1.2.3",
            "http://[::1]:4317",
            "http://LOCALHOST",
        ] {
            assert!(is_loopback(e), "{e}");
        }
        for e in ["http://collector:4318", "http://10.0.0.1:4318", "http://[fe80::1]:4317"] {
            assert!(!is_loopback(e), "{e}");
        }
    }

    #[test]
    fn limiter_admits_up_to_the_limit() {
        let mut l = Limiter {
            limit: 2,
            per_interval: true,
            seen: HashMap::new(),
        };
        let set = |i: i64| vec![KeyValue::new("k", i)];
        assert!(l.admit(Family::Coll, &set(1)));
        assert!(l.admit(Family::Coll, &set(2)));
        assert!(l.admit(Family::Coll, &set(1)));
        assert!(!l.admit(Family::Coll, &set(3)));
        assert!(l.admit(Family::Link, &set(3)));
        l.end_interval();
        assert!(l.admit(Family::Coll, &set(3)));
    }
}

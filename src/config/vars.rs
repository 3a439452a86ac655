//! The names of every variable the plugin reads: ours (`NCCL_*`), the standard OpenTelemetry
//! ones ([`otel`]) and the launcher's, with the defaults that are names themselves. The table for
//! operators is `docs/configuration.md`.
#![forbid(unsafe_code)]

/// Master switch: `false` makes `init` succeed with activation mask 0 (the plugin does nothing).
pub const ENABLE: &str = "NCCL_PROFILER_OTEL_ENABLE";
/// Whether the telemetry thread runs and exports.
pub const TELEMETRY_ENABLE: &str = "NCCL_PROFILER_OTEL_TELEMETRY_ENABLE";
/// Seconds between telemetry wake-ups (decimal allowed).
pub const TELEMETRY_INTERVAL_SEC: &str = "NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC";
/// Seconds without progress after which an operation in flight is reported hung (decimal allowed).
pub const HANG_THRESHOLD_SEC: &str = "NCCL_PROFILER_OTEL_HANG_THRESHOLD_SEC";
/// Which transfer times the bandwidth/latency fit uses: `AVG` (all) or `MIN` (a low percentile per size).
pub const LINEAR_REGRESSION_MODE: &str = "NCCL_PROFILER_LINEAR_REGRESSION_MODE";
/// Event bits (spec 2.2) stored into NCCL's activation mask.
pub const EVENT_MASK: &str = "NCCL_PROFILE_EVENT_MASK";
/// KernelCh requested for one part in N of each telemetry interval: `auto` or 1..=1000.
pub const KERNEL_CH_EVERY: &str = "NCCL_PROFILER_OTEL_KERNEL_CH_EVERY";
/// Whether the fields only NCCL 2.31's v7 descriptor has are read: `auto` (on NCCL 2.31), `on`, `off`.
pub const V7_EXTENSIONS: &str = "NCCL_PROFILER_OTEL_V7_EXTENSIONS";
/// Record slots per window.
pub const WINDOW_CAPACITY: &str = "NCCL_PROFILER_OTEL_WINDOW_CAPACITY";
/// Records in a window that make the telemetry thread close it early.
pub const WINDOW_COUNT_TRIGGER: &str = "NCCL_PROFILER_OTEL_WINDOW_COUNT_TRIGGER";

/// Where metrics go: `otlp`, `file`, `stdout` or `none`.
pub const EXPORTER: &str = "NCCL_PROFILER_OTEL_EXPORTER";
/// OTLP endpoint URL; for HTTP, `/v1/metrics` is appended unless the path already ends with it.
pub const TELEMETRY_ENDPOINT: &str = "NCCL_PROFILER_OTEL_TELEMETRY_ENDPOINT";
/// Timeout of one export request, milliseconds.
pub const TELEMETRY_BATCH_TIMEOUT_MS: &str = "NCCL_PROFILER_OTEL_TELEMETRY_BATCH_TIMEOUT_MS";
/// Path pattern of the `file` exporter (`%h` host, `%p` pid, `%r` rank, `%j` job, `%%` a percent
/// sign).
pub const EXPORT_FILE: &str = "NCCL_PROFILER_OTEL_EXPORT_FILE";
/// Export requests waiting for the exporter thread; the oldest is dropped beyond this.
pub const EXPORT_QUEUE: &str = "NCCL_PROFILER_OTEL_EXPORT_QUEUE";
/// Attribute sets kept per instrument before measurements go to the overflow series.
pub const CARDINALITY_LIMIT: &str = "NCCL_PROFILER_OTEL_CARDINALITY_LIMIT";
/// Metric families not exported, comma-separated ([`METRIC_FAMILIES`]), or `none`.
pub const DROP_METRICS: &str = "NCCL_PROFILER_OTEL_DROP_METRICS";

/// The metric families [`DROP_METRICS`] names: each is every metric named `nccl.<family>.*`, but
/// `transfer`: the per-transfer histograms of collectives and sends (`nccl.{coll,p2p}.transfer*`).
pub const METRIC_FAMILIES: [&str; 7] = ["coll", "p2p", "transfer", "link", "channel", "kernel", "progress"];

/// Every `NCCL_*` variable read by [`Config::from_lookup`], in the order [`Config::describe`]
/// prints them.
pub const ALL: [&str; 17] = [
    ENABLE,
    TELEMETRY_ENABLE,
    TELEMETRY_INTERVAL_SEC,
    HANG_THRESHOLD_SEC,
    LINEAR_REGRESSION_MODE,
    EVENT_MASK,
    KERNEL_CH_EVERY,
    V7_EXTENSIONS,
    WINDOW_CAPACITY,
    WINDOW_COUNT_TRIGGER,
    EXPORTER,
    TELEMETRY_ENDPOINT,
    TELEMETRY_BATCH_TIMEOUT_MS,
    EXPORT_FILE,
    EXPORT_QUEUE,
    CARDINALITY_LIMIT,
    DROP_METRICS,
];

/// Standard OpenTelemetry variables, used when ours leave the setting open.
pub mod otel {
    /// Base URL for every signal; `/v1/metrics` is appended for HTTP.
    pub const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
    /// Metrics URL, used as is.
    pub const METRICS_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT";
    /// `k=v,k2=v2` request headers (values percent-decoded).
    pub const HEADERS: &str = "OTEL_EXPORTER_OTLP_HEADERS";
    /// Metrics request headers; a key here replaces the same key of [`HEADERS`].
    pub const METRICS_HEADERS: &str = "OTEL_EXPORTER_OTLP_METRICS_HEADERS";
    /// Export timeout, milliseconds.
    pub const TIMEOUT: &str = "OTEL_EXPORTER_OTLP_TIMEOUT";
    /// Metrics export timeout, milliseconds.
    pub const METRICS_TIMEOUT: &str = "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT";
    /// `http/protobuf`, `http/json` or `grpc`.
    pub const PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
    /// Metrics protocol.
    pub const METRICS_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL";
    /// `cumulative`, `delta` or `lowmemory`.
    pub const TEMPORALITY: &str = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE";
    /// `k=v,k2=v2` resource attributes (values percent-decoded).
    pub const RESOURCE_ATTRIBUTES: &str = "OTEL_RESOURCE_ATTRIBUTES";
    /// `service.name`.
    pub const SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
    /// Path of a PEM file of the CA certificates trusted for the collector (cargo feature `tls`).
    pub const CERTIFICATE: &str = "OTEL_EXPORTER_OTLP_CERTIFICATE";
    /// Metrics CA file; wins over [`CERTIFICATE`].
    pub const METRICS_CERTIFICATE: &str = "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE";
    /// `gzip` or `none`: compression of OTLP request bodies.
    pub const COMPRESSION: &str = "OTEL_EXPORTER_OTLP_COMPRESSION";
    /// Metrics compression; wins over [`COMPRESSION`].
    pub const METRICS_COMPRESSION: &str = "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION";
    /// Milliseconds between exports: the default of our interval.
    pub const METRIC_EXPORT_INTERVAL: &str = "OTEL_METRIC_EXPORT_INTERVAL";
    /// `true`: nothing is exported (the default of our exporter becomes `none`).
    pub const SDK_DISABLED: &str = "OTEL_SDK_DISABLED";
    /// `explicit_bucket_histogram` or `base2_exponential_bucket_histogram`.
    pub const HISTOGRAM_AGGREGATION: &str = "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION";
}

/// Every standard variable read by [`Config::from_lookup`].
pub const STANDARD: [&str; 16] = [
    otel::ENDPOINT,
    otel::METRICS_ENDPOINT,
    otel::HEADERS,
    otel::METRICS_HEADERS,
    otel::TIMEOUT,
    otel::METRICS_TIMEOUT,
    otel::PROTOCOL,
    otel::METRICS_PROTOCOL,
    otel::TEMPORALITY,
    otel::RESOURCE_ATTRIBUTES,
    otel::SERVICE_NAME,
    otel::COMPRESSION,
    otel::METRICS_COMPRESSION,
    otel::METRIC_EXPORT_INTERVAL,
    otel::SDK_DISABLED,
    otel::HISTOGRAM_AGGREGATION,
];

/// Standard variables read by [`Config::from_lookup`] only in builds with the cargo feature `tls`.
pub const TLS_STANDARD: [&str; 2] = [otel::CERTIFICATE, otel::METRICS_CERTIFICATE];

/// Launcher variables that become resource attributes when set: (variable, attribute).
pub const LAUNCHER: [(&str, &str); 7] = [
    ("SLURM_JOB_ID", "slurm.job.id"),
    ("SLURM_PROCID", "slurm.procid"),
    ("RANK", "job.rank"),
    ("LOCAL_RANK", "job.local_rank"),
    ("WORLD_SIZE", "job.world_size"),
    ("POD_NAME", "k8s.pod.name"),
    ("POD_NAMESPACE", "k8s.namespace.name"),
];

/// `service.name` when neither [`otel::SERVICE_NAME`] nor [`otel::RESOURCE_ATTRIBUTES`] sets it.
pub const DEFAULT_SERVICE_NAME: &str = "nccl";
/// Default of [`EXPORT_FILE`]: in the working directory, one file per process.
pub const DEFAULT_EXPORT_FILE: &str = "nccl-otel-%h-%p.jsonl";

//! Every variable the plugin reads. Ours (`NCCL_*`) are one table, `VARS`: a row holds the
//! name, what it means and accepts, its default and how its value is parsed and shown, so
//! [`Config::from_lookup`], [`Config::describe`] and `docs/configuration.md` (rendered from the
//! rows; a unit test fails on drift) all read the same row. The standard OpenTelemetry variables
//! ([`otel`]) are resolved by `chain.rs`; their documentation rows are `STANDARD_DOCS`. Then the
//! launcher's variables (`LAUNCHER`, applied by `launcher.rs`, also rendered into the document) and
//! the defaults that are names themselves.
#![forbid(unsafe_code)]

use super::parse::{
    BOOL, URLS, accepted, millis_in, parse_auto_bool, parse_bool, parse_detail, parse_endpoint, parse_event_mask,
    parse_every, parse_exporter, parse_families, parse_file_pattern, parse_u32_in, secs_in, show_auto_bool, show_bool,
    show_detail, show_every, show_exporter, show_families, show_mask, show_millis, show_mode, show_secs, show_u32,
    u32_in,
};
use super::{Config, Detail, Mode};
use crate::record::handle::MAX_LANE_SLOTS;
use Fallback::{Standard, Value};

/// One of our variables. [`Config::from_lookup`] applies the rows in order: the default first
/// ([`Var::fallback`]), then the value, if set, through [`Var::set`]. The documentation fields
/// are read only by the test that renders `docs/configuration.md`, [`Var::rejected`] only by tests.
#[cfg_attr(not(test), expect(dead_code, reason = "the documentation fields"))]
pub(super) struct Var {
    /// The environment variable.
    pub(super) name: &'static str,
    /// What it does, for operators (markdown; also the doc comment of its name constant).
    pub(super) doc: &'static str,
    /// What it accepts, for operators (markdown).
    pub(super) valid: &'static str,
    /// Said after the default in the documentation (markdown), often nothing.
    pub(super) default_note: &'static str,
    /// Where the default comes from.
    pub(super) fallback: Fallback,
    /// Parses a trimmed, non-empty value into its field; `Err` says what a value must be (the
    /// warning's `is not …`) and leaves the field as it was.
    pub(super) set: fn(&mut Config, &str) -> Result<(), String>,
    /// The field, in the syntax [`Var::set`] accepts.
    pub(super) show: fn(&Config) -> String,
    /// A value [`Var::set`] rejects: the tests set it to check the warning.
    pub(super) rejected: &'static str,
}

/// Where a variable's default comes from.
pub(super) enum Fallback {
    /// Written by this function, after the rows above it are read (a default may depend on them).
    Value(fn(&mut Config)),
    /// What the standard OpenTelemetry variables resolved to (`chain.rs`, read before every row):
    /// a bad value falls back to the next variable of that chain.
    Standard,
}

/// Declares each variable's name constant, documented by its row's `doc`, then [`ALL`] and
/// [`VARS`] from the same list: a name, its row and its place cannot part.
macro_rules! variables {
    ($($konst:ident = $name:literal { doc: $doc:literal, $($field:ident: $value:expr,)* })*) => {
        $(#[doc = $doc] pub const $konst: &str = $name;)*

        /// Every `NCCL_*` variable read by [`Config::from_lookup`], in the order of their rows (the
        /// order [`Config::describe`] prints them).
        #[cfg(any(test, feature = "testing"))]
        pub const ALL: [&str; VARS.len()] = [$($konst),*];

        /// Our variables, one row each, in the order they are read, printed and documented.
        pub(super) const VARS: &[Var] = &[$(Var { name: $konst, doc: $doc, $($field: $value,)* }),*];

        /// Each of our variables with a value it rejects, in the order of their rows.
        #[cfg(any(test, feature = "testing"))]
        pub fn rejected() -> impl Iterator<Item = (&'static str, &'static str)> {
            VARS.iter().map(|v| (v.name, v.rejected))
        }
    };
}

variables! {
    ENABLE = "NCCL_PROFILER_OTEL_ENABLE" {
        doc: "Master switch. `false`: `init` succeeds but sets the activation mask to 0, so NCCL sends no events.",
        valid: "boolean",
        default_note: "",
        fallback: Value(|c| c.enable = true),
        set: |c, s| accepted(parse_bool(s), BOOL).map(|v| c.enable = v),
        show: |c| show_bool(c.enable),
        rejected: "maybe",
    }
    TELEMETRY_ENABLE = "NCCL_PROFILER_OTEL_TELEMETRY_ENABLE" {
        doc: "Run the telemetry thread that aggregates closed windows and exports them.",
        valid: "boolean",
        default_note: "",
        fallback: Value(|c| c.telemetry_enable = true),
        set: |c, s| accepted(parse_bool(s), BOOL).map(|v| c.telemetry_enable = v),
        show: |c| show_bool(c.telemetry_enable),
        rejected: "-1",
    }
    TELEMETRY_INTERVAL_SEC = "NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC" {
        doc: "Longest time a window keeps filling before the telemetry thread closes and summarises it (when it \
              holds at least one record); also the longest wait for a closing window's events to stop. When \
              unset: `OTEL_METRIC_EXPORT_INTERVAL`.",
        valid: "decimal seconds, `0.01` to `3600` (e.g. `0.5`); `nan`/`inf` rejected",
        default_note: "",
        fallback: Standard,
        set: |c, s| secs_in(s, 0.01..=3600.0).map(|v| c.interval = v),
        show: |c| show_secs(c.interval),
        rejected: "1e999",
    }
    HANG_THRESHOLD_SEC = "NCCL_PROFILER_OTEL_HANG_THRESHOLD_SEC" {
        doc: "How long the oldest operation in flight may go without progress (no callback of its own or of its \
              children) before the communicator is reported hung: one WARN per episode and the \
              `nccl.progress.hang.*` metrics (`metrics.md`, `operations.md`). A collective that keeps moving never \
              trips it; a rank that waits for a peer longer than this (one rank checkpointing while the others \
              wait in a collective) does.",
        valid: "decimal seconds, `0.1` to `86400`",
        default_note: "",
        fallback: Value(|c| c.hang_threshold = std::time::Duration::from_secs(5)),
        set: |c, s| secs_in(s, 0.1..=86400.0).map(|v| c.hang_threshold = v),
        show: |c| show_secs(c.hang_threshold),
        rejected: "0.05",
    }
    LINEAR_REGRESSION_MODE = "NCCL_PROFILER_LINEAR_REGRESSION_MODE" {
        doc: "Which transfer times the bandwidth/latency fit uses: `AVG` every sample, `MIN` a low percentile \
              (the 10th) of each message size's times.",
        valid: "`AVG`, `MIN` (any case)",
        default_note: "",
        fallback: Value(|c| c.regression_mode = Mode::Avg),
        set: |c, s| accepted(Mode::parse(s), "AVG or MIN").map(|v| c.regression_mode = v),
        show: |c| show_mode(c.regression_mode),
        rejected: "AVERAGE",
    }
    EVENT_MASK = "NCCL_PROFILE_EVENT_MASK" {
        doc: "Event types NCCL should send (0x1 Group, 0x2 Coll, 0x4 P2p, 0x8 ProxyOp, 0x10 ProxyStep, 0x20 \
              ProxyCtrl, 0x40 KernelCh, … up to 0x4000 CeBatch, 0x8000 KernelPhase), stored into NCCL's \
              activation mask. NCCL also starts parent events of the selected ones; the plugin declines those it \
              does not use. `0` means no events. From ABI v6 CeColl is added whenever Coll is in the mask; on ABI \
              v7 with its extensions read, KernelPhase whenever KernelCh is.",
        valid: "integer using only bits 0–15 (`0`..`0xffff`)",
        default_note: " (Coll|P2p|ProxyOp|ProxyStep|KernelCh)",
        fallback: Value(|c| c.event_mask = 0x5E),
        set: |c, s| {
            let valid = "an event mask using only bits 0..=15 (0..=0xffff, decimal or 0x-hex)";
            accepted(parse_event_mask(s), valid).map(|v| c.event_mask = v)
        },
        show: |c| show_mask(c.event_mask),
        rejected: "0x10000",
    }
    KERNEL_CH_EVERY = "NCCL_PROFILER_OTEL_KERNEL_CH_EVERY" {
        doc: "KernelCh (GPU times) is requested for one part in N of each telemetry interval, at its start, \
              aligned on the wall clock so that every rank samples the same operations: N = 10 with a 5 s \
              interval is 500 ms in every 5 s (at least 100 ms). `1`: always. `auto`: 1 before NCCL 2.31, 10 from \
              2.31 (KernelCh costs 4–13 % of GPU time there) and when NCCL's release cannot be found \
              (`ncclGetVersion`). Only the KernelCh bit changes; no effect without it in the mask.",
        valid: "`auto` or an integer, `1` to `1000`",
        default_note: "",
        fallback: Value(|c| c.kernel_ch_every = None),
        set: |c, s| accepted(parse_every(s), "auto or an integer in 1..=1000").map(|v| c.kernel_ch_every = v),
        show: |c| show_every(c.kernel_ch_every),
        rejected: "0",
    }
    V7_EXTENSIONS = "NCCL_PROFILER_OTEL_V7_EXTENSIONS" {
        doc: "Whether, on profiler ABI v7, the plugin reads what only NCCL 2.31's v7 layout has (`userTag`, \
              `isSymColl`) and requests KernelPhase with KernelCh. Other definitions under the same symbol pass \
              the shorter v6 descriptor (README, \"What NCCL versions\"). `auto`: only when `ncclGetVersion` says \
              2.31.x. `on`: on any release that chooses v7 (2.32 and later, once you know its layout is 2.31's). \
              `off`: v7 descriptors are read as their v6 part.",
        valid: "`auto` or a boolean",
        default_note: "",
        fallback: Value(|c| c.v7_extensions = None),
        set: |c, s| {
            let valid = "auto or a boolean (1/0, true/false, yes/no, on/off)";
            accepted(parse_auto_bool(s), valid).map(|v| c.v7_extensions = v)
        },
        show: |c| show_auto_bool(c.v7_extensions),
        rejected: "sometimes",
    }
    WINDOW_CAPACITY = "NCCL_PROFILER_OTEL_WINDOW_CAPACITY" {
        doc: "Record slots per window lane. Each communicator has four windows of three lanes (application \
              thread, proxy thread, kernel events; docs/architecture.md) of 56-byte (application lane) and \
              32-byte slots: 48 MB of address space per communicator at the default, resident only as far as \
              records are actually buffered. A full lane drops further records and counts the drops.",
        valid: "integer, `1024` to `699048`",
        default_note: "",
        fallback: Value(|c| c.capacity = 100_000),
        set: |c, s| u32_in(s, 1024..=MAX_LANE_SLOTS).map(|v| c.capacity = v),
        show: |c| show_u32(c.capacity),
        rejected: "99999999999999999999",
    }
    WINDOW_COUNT_TRIGGER = "NCCL_PROFILER_OTEL_WINDOW_COUNT_TRIGGER" {
        doc: "Records in the filling window (all lanes) at which new events move on to the next window (opened \
              in advance), before the interval ends; the rest of the capacity is headroom for the children, \
              states and stops of the events already in it. Under a sustained burst each of the four windows \
              holds about this many records (32 bytes each in the proxy and kernel lanes): a smaller value keeps \
              less memory resident and leaves less headroom for bursts (the default keeps about 3.6 MiB per \
              communicator resident at 1 M callbacks/s without export and 4.4–4.7 MiB with it; 20000 kept 4.9 \
              and 6.0 MiB, 50000 10–11.5 MiB, all with the same drop-free ceiling: docs/benchmarks.md).",
        valid: "integer, `1` to the effective window capacity",
        default_note: ", or capacity/2 if that is smaller",
        fallback: Value(|c| c.count_trigger = 15_000.min(c.capacity / 2)),
        set: |c, s| {
            let capacity = c.capacity;
            let valid = || format!("an integer in 1..={capacity} (the window capacity)");
            parse_u32_in(s, 1..=capacity).map(|v| c.count_trigger = v).ok_or_else(valid)
        },
        show: |c| show_u32(c.count_trigger),
        rejected: "12abc",
    }
    EXPORTER = "NCCL_PROFILER_OTEL_EXPORTER" {
        doc: "Where metrics go. `otlp`: to an OpenTelemetry collector (below). `file`: OTLP-JSON lines to \
              `NCCL_PROFILER_OTEL_EXPORT_FILE`. `stdout`: the same lines to standard output. `none`: no export \
              (windows are still processed, so memory stays bounded).",
        valid: "`otlp`, `file`, `stdout`, `none` (any case)",
        default_note: " (`none` when `OTEL_SDK_DISABLED` is true)",
        fallback: Standard,
        set: |c, s| accepted(parse_exporter(s), "otlp, file, stdout or none").map(|v| c.export.exporter = v),
        show: |c| show_exporter(c.export.exporter),
        rejected: "otlp2",
    }
    TELEMETRY_ENDPOINT = "NCCL_PROFILER_OTEL_TELEMETRY_ENDPOINT" {
        doc: "OTLP endpoint URL. For HTTP, `/v1/metrics` is appended unless the path already ends with it \
              (`http://c:4318` and `http://c:4318/v1/metrics` are the same); for gRPC the URL is used as is. When \
              unset: `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` (as is), then `OTEL_EXPORTER_OTLP_ENDPOINT` \
              (`/v1/metrics` appended for HTTP). A value without a scheme (`host:port`) means `http://host:port` \
              (said in the log, at INFO).",
        valid: "`http://host[:port][/path]` or `host[:port][/path]`; `https://` only in builds with the cargo \
                feature `tls`",
        default_note: " (gRPC: `http://localhost:4317`)",
        fallback: Standard,
        set: |c, s| {
            let endpoint = parse_endpoint(s, c.export.protocol);
            accepted(endpoint, URLS).map(|v| c.export.endpoint = v)
        },
        show: |c| c.export.endpoint.clone(),
        rejected: "localhost:x4318",
    }
    TELEMETRY_BATCH_TIMEOUT_MS = "NCCL_PROFILER_OTEL_TELEMETRY_BATCH_TIMEOUT_MS" {
        doc: "Timeout of one export request (connect, send, answer). Also bounds the last `finalize` and the \
              exit flush: they wait at most this plus 250 ms, once in all. When unset: \
              `OTEL_EXPORTER_OTLP_METRICS_TIMEOUT`, then `OTEL_EXPORTER_OTLP_TIMEOUT`.",
        valid: "integer milliseconds, `1` to `60000`",
        default_note: "",
        fallback: Standard,
        set: |c, s| millis_in(s, TIMEOUT_MILLIS).map(|v| c.export.timeout = v),
        show: |c| show_millis(c.export.timeout),
        rejected: "-100",
    }
    EXPORT_FILE = "NCCL_PROFILER_OTEL_EXPORT_FILE" {
        doc: "Path of the `file` exporter, created (with its directories) or appended to, at the first `init`: a \
              path that cannot be opened is reported then (one WARN; every export fails and is counted until it \
              can be). `%h` is the host name, `%p` the process id, `%r` the launcher's rank (resource \
              attribute `job.rank`; `x` when unset), `%j` the job (`job.id`; `x` when unset), `%%` a `%`. \
              Relative paths are relative to the working directory at that `init`.",
        valid: "a path whose only `%` sequences are `%h`, `%p`, `%r`, `%j`, `%%`",
        default_note: "",
        fallback: Value(|c| c.export.file = DEFAULT_EXPORT_FILE.to_owned()),
        set: |c, s| {
            let valid = "a path whose only % sequences are %h, %p, %r, %j and %%";
            accepted(parse_file_pattern(s), valid).map(|v| c.export.file = v)
        },
        show: |c| c.export.file.clone(),
        rejected: "out-%d.jsonl",
    }
    EXPORT_QUEUE = "NCCL_PROFILER_OTEL_EXPORT_QUEUE" {
        doc: "Export requests that may wait for the exporter thread (one is made per interval). When the \
              collector is slow or down and the queue is full, the oldest waiting request is dropped and counted \
              (`nccl.profiler.export.dropped`); with cumulative temporality the next request carries its totals \
              anyway.",
        valid: "integer, `1` to `1024`",
        default_note: "",
        fallback: Value(|c| c.export.queue = 8),
        set: |c, s| u32_in(s, 1..=1024).map(|v| c.export.queue = v),
        show: |c| show_u32(c.export.queue),
        rejected: "0",
    }
    CARDINALITY_LIMIT = "NCCL_PROFILER_OTEL_CARDINALITY_LIMIT" {
        doc: "Attribute sets recorded per metric family before further ones go to the `otel.metric.overflow=true` \
              series (counted in `nccl.profiler.cardinality.overflow`; see `metrics.md`).",
        valid: "integer, `1` to `1000000`",
        default_note: "",
        fallback: Value(|c| c.export.cardinality_limit = 2000),
        set: |c, s| u32_in(s, 1..=1_000_000).map(|v| c.export.cardinality_limit = v),
        show: |c| show_u32(c.export.cardinality_limit),
        rejected: "1e6",
    }
    DETAIL = "NCCL_PROFILER_OTEL_DETAIL" {
        doc: "How much is exported. `basic`: every family the dashboard and the rules read, every link's latency \
              and bandwidth included, but not the per-channel metrics (`nccl.channel.*`) nor the per-transfer \
              histograms (`nccl.coll.transfer*`, `nccl.p2p.transfer*`), which no dashboard panel or rule reads: \
              310 Prometheus series per rank instead of 480 with native histograms, 4,400 instead of 8,500 with \
              classic ones, in `scale.md`'s job. \
              `full`: those too, to find the channel or the transfer size that is slow. \
              `NCCL_PROFILER_OTEL_DROP_METRICS` leaves out more on top of either.",
        valid: "`basic`, `full` (any case)",
        default_note: "",
        fallback: Value(|c| c.export.detail = Detail::Basic),
        set: |c, s| accepted(parse_detail(s), "basic or full").map(|v| c.export.detail = v),
        show: |c| show_detail(c.export.detail),
        rejected: "high",
    }
    DROP_METRICS = "NCCL_PROFILER_OTEL_DROP_METRICS" {
        doc: "Metric families that are not exported (neither aggregated nor sent), to keep a fleet's series \
              within budget: `coll`, `p2p`, `link`, `channel`, `kernel`, `progress`, each meaning every metric \
              named `nccl.<family>.*` (`metrics.md`), and `transfer`, the per-transfer histograms of collectives \
              and sends (`nccl.coll.transfer*`, `nccl.p2p.transfer*`); the `nccl.profiler.*` self-telemetry is \
              always exported. Applies on top of `NCCL_PROFILER_OTEL_DETAIL` (`channel` and `transfer` are \
              already left out at `basic`); `scale.md` measures what each switch saves. Unknown words are \
              ignored with a warning, the others applied.",
        valid: "`none`, or families separated by commas, any case",
        default_note: "",
        fallback: Value(|c| c.export.dropped = Vec::new()),
        set: |c, s| {
            let valid = || format!("none or metric families among {} separated by commas", METRIC_FAMILIES.join(","));
            parse_families(s).map(|v| c.export.dropped = v).ok_or_else(valid)
        },
        show: |c| show_families(&c.export.dropped),
        rejected: "profiler",
    }
}

/// Export timeouts accepted, ours and the standard ones, milliseconds.
pub(super) const TIMEOUT_MILLIS: std::ops::RangeInclusive<u64> = 1..=60_000;

/// The metric families [`DROP_METRICS`] names: each is every metric named `nccl.<family>.*`, but
/// `transfer`: the per-transfer histograms of collectives and sends (`nccl.{coll,p2p}.transfer*`).
pub const METRIC_FAMILIES: [&str; 7] = ["coll", "p2p", "transfer", "link", "channel", "kernel", "progress"];

/// Our list variables and their words: a value with unknown words applies the known ones, with a
/// warning naming the others.
pub(super) const LISTS: [(&str, &[&str]); 1] = [(DROP_METRICS, &METRIC_FAMILIES)];

/// The endpoint variables: a value without a scheme gets `http://`.
pub(super) const ENDPOINTS: [&str; 3] = [TELEMETRY_ENDPOINT, otel::ENDPOINT, otel::METRICS_ENDPOINT];

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
#[cfg(any(test, feature = "testing"))]
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
#[cfg(any(test, feature = "testing"))]
pub const TLS_STANDARD: [&str; 2] = [otel::CERTIFICATE, otel::METRICS_CERTIFICATE];

/// The documentation of standard variables that share a meaning (the general form and its
/// `METRICS_` form), for operators; `docs/configuration.md`'s second table is rendered from these.
#[cfg_attr(not(test), expect(dead_code, reason = "read by the documentation test"))]
pub(super) struct StandardDoc {
    /// The variables, general form first.
    pub(super) names: &'static [&'static str],
    /// What they do (markdown).
    pub(super) doc: &'static str,
    /// Their default (markdown).
    pub(super) default: &'static str,
    /// What a bad value gives (markdown).
    pub(super) on_bad: &'static str,
}

/// The rows of [`StandardDoc`]: every name of [`STANDARD`] and [`TLS_STANDARD`] once.
#[cfg_attr(not(test), expect(dead_code, reason = "read by the documentation test"))]
pub(super) const STANDARD_DOCS: &[StandardDoc] = &[
    StandardDoc {
        names: &[otel::ENDPOINT],
        doc: "Base URL; `/v1/metrics` is appended for HTTP. Used when neither \
              `NCCL_PROFILER_OTEL_TELEMETRY_ENDPOINT` nor `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` is set. Without a \
              scheme (`host:port`), `http://` is assumed (said in the log, at INFO).",
        default: "`http://localhost:4318` (gRPC `http://localhost:4317`)",
        on_bad: "one warning, the default",
    },
    StandardDoc {
        names: &[otel::METRICS_ENDPOINT],
        doc: "Metrics URL, used as is (but `http://` is assumed without a scheme). Used when \
              `NCCL_PROFILER_OTEL_TELEMETRY_ENDPOINT` is not set.",
        default: "unset",
        on_bad: "one warning, the next in the chain",
    },
    StandardDoc {
        names: &[otel::PROTOCOL, otel::METRICS_PROTOCOL],
        doc: "`http/protobuf`, `http/json`, or `grpc` (builds with the cargo feature `grpc`); the metrics \
              variable wins.",
        default: "`http/protobuf`",
        on_bad: "one warning, the default",
    },
    StandardDoc {
        names: &[otel::HEADERS, otel::METRICS_HEADERS],
        doc: "Request headers (gRPC: metadata), `key=value,key2=value2`, values percent-decoded; a key in the \
              metrics variable replaces the same key of the general one.",
        default: "none",
        on_bad: "one warning (without the value); the bad entries ignored, the others used",
    },
    StandardDoc {
        names: &[otel::TIMEOUT, otel::METRICS_TIMEOUT],
        doc: "Export timeout in milliseconds, when `NCCL_PROFILER_OTEL_TELEMETRY_BATCH_TIMEOUT_MS` is not set; \
              the metrics variable wins.",
        default: "`3000` (not the specification's 10 s)",
        on_bad: "one warning, the next in the chain",
    },
    StandardDoc {
        names: &[otel::TEMPORALITY],
        doc: "`cumulative`, `delta` or `lowmemory` (see `metrics.md`).",
        default: "`cumulative`",
        on_bad: "one warning, the default",
    },
    StandardDoc {
        names: &[otel::COMPRESSION, otel::METRICS_COMPRESSION],
        doc: "Compression of OTLP request bodies, HTTP (`Content-Encoding: gzip`) and gRPC (`grpc-encoding: \
              gzip`): `gzip` or `none`, any case; the metrics variable wins. `zstd` is not built in.",
        default: "`gzip` (not the specification's `none`)",
        on_bad: "one warning, the next in the chain",
    },
    StandardDoc {
        names: &[otel::HISTOGRAM_AGGREGATION],
        doc: "`base2_exponential_bucket_histogram`: base-2 exponential buckets (at most 160 per point, scale at \
              most 20, minimum and maximum kept), which Prometheus stores as native histograms: one series per \
              histogram instead of one per bucket (`scale.md`); the backend must accept them (Prometheus with \
              `--enable-feature=native-histograms`, `prometheus.md`). `explicit_bucket_histogram`: the \
              catalogue's buckets (`metrics.md`), classic Prometheus histograms (`_bucket`, `_sum`, `_count`).",
        default: "`base2_exponential_bucket_histogram` (not the specification's `explicit_bucket_histogram`)",
        on_bad: "one warning, the default",
    },
    StandardDoc {
        names: &[otel::METRIC_EXPORT_INTERVAL],
        doc: "Milliseconds between exports, when `NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC` is not set (the \
              telemetry interval is the export interval).",
        default: "`5000` (not the specification's 60 s)",
        on_bad: "one warning, the default",
    },
    StandardDoc {
        names: &[otel::SDK_DISABLED],
        doc: "`true`: nothing is exported; the default of `NCCL_PROFILER_OTEL_EXPORTER` becomes `none` (setting \
              that variable still wins). Events are still aggregated, and hang and straggler warnings still \
              logged; `NCCL_PROFILER_OTEL_ENABLE=false` turns the plugin off.",
        default: "`false`",
        on_bad: "one warning, the default",
    },
    StandardDoc {
        names: &[otel::SERVICE_NAME],
        doc: "`service.name` of the resource.",
        default: "`service.name` of `OTEL_RESOURCE_ATTRIBUTES`, else the job's name or id (Launcher identity), \
                  else `nccl`",
        on_bad: "—",
    },
    StandardDoc {
        names: &[otel::RESOURCE_ATTRIBUTES],
        doc: "Extra resource attributes, `key=value,…`, values percent-decoded; they override the detected ones \
              (`metrics.md`, Resource).",
        default: "none",
        on_bad: "one warning; the bad entries ignored, the others used",
    },
    StandardDoc {
        names: &[otel::CERTIFICATE, otel::METRICS_CERTIFICATE],
        doc: "Only in builds with the cargo feature `tls` (otherwise ignored, without a warning). Path of a PEM \
              file of CA certificates: an `https://` collector's certificate (HTTP and gRPC) is then checked \
              against these CAs only, instead of the system's roots, as the other OpenTelemetry SDKs do. Sections \
              other than certificates (a key, say) are skipped. The file is read once, at the first `init`. The \
              metrics variable wins.",
        default: "unset: the system roots",
        on_bad: "one warning, the next in the chain (in the end the system roots). Bad: missing or unreadable, not a \
                 regular file, over 1 MiB, no certificate, or a certificate that does not parse",
    },
];

/// One launcher variable that becomes a resource attribute when set (`launcher.rs` applies them).
pub struct LauncherVar {
    /// The environment variable.
    pub name: &'static str,
    /// The launcher that sets it: [`SLURM`], [`TORCHRUN`], [`MPI`] or [`KUBERNETES`].
    pub launcher: &'static str,
    /// The resource attribute it becomes.
    pub attribute: &'static str,
}

/// [`LauncherVar::launcher`] of Slurm's variables (`srun`, `sbatch`).
pub const SLURM: &str = "slurm";
/// [`LauncherVar::launcher`] of torchrun's (TorchElastic's) variables.
pub const TORCHRUN: &str = "torchrun";
/// [`LauncherVar::launcher`] of Open MPI's and PMIx's variables (`mpirun`, `srun --mpi=pmix`).
pub const MPI: &str = "mpi";
/// [`LauncherVar::launcher`] of the variables a pod's spec sets with the downward API (and
/// `JOB_COMPLETION_INDEX`, which Kubernetes sets in an Indexed Job's pods); read only when
/// [`IN_KUBERNETES`] is set.
pub const KUBERNETES: &str = "kubernetes";
/// Set by Kubernetes in every container: the [`KUBERNETES`] rows count only inside a pod, since
/// names such as `NODE_NAME` are common elsewhere.
pub const IN_KUBERNETES: &str = "KUBERNETES_SERVICE_HOST";

/// The launcher variables. For each attribute the first row that is set (non-empty after
/// trimming) wins, so the order is the precedence: the job's id and name from the outermost
/// launcher, the scheduler (Slurm, then torchrun's run id, then the PMIx namespace); the
/// process's place in it from the innermost one (torchrun, then MPI, then Slurm), because the
/// workers of a torchrun started by `srun` all inherit that one task's `SLURM_PROCID`.
pub const LAUNCHER: [LauncherVar; 25] = [
    launcher("SLURM_JOB_ID", SLURM, "job.id"),
    launcher("TORCHELASTIC_RUN_ID", TORCHRUN, "job.id"),
    launcher("PMIX_NAMESPACE", MPI, "job.id"),
    launcher("SLURM_JOB_NAME", SLURM, "job.name"),
    launcher("K8S_JOB_NAME", KUBERNETES, "job.name"),
    launcher("RANK", TORCHRUN, "job.rank"),
    launcher("OMPI_COMM_WORLD_RANK", MPI, "job.rank"),
    launcher("PMIX_RANK", MPI, "job.rank"),
    launcher("SLURM_PROCID", SLURM, "job.rank"),
    launcher("LOCAL_RANK", TORCHRUN, "job.local_rank"),
    launcher("OMPI_COMM_WORLD_LOCAL_RANK", MPI, "job.local_rank"),
    launcher("SLURM_LOCALID", SLURM, "job.local_rank"),
    launcher("GROUP_RANK", TORCHRUN, "job.node_rank"),
    launcher("SLURM_NODEID", SLURM, "job.node_rank"),
    launcher("JOB_COMPLETION_INDEX", KUBERNETES, "job.node_rank"),
    launcher("WORLD_SIZE", TORCHRUN, "job.world_size"),
    launcher("OMPI_COMM_WORLD_SIZE", MPI, "job.world_size"),
    launcher("SLURM_NTASKS", SLURM, "job.world_size"),
    launcher("SLURMD_NODENAME", SLURM, "job.node_name"),
    launcher("POD_NAME", KUBERNETES, "k8s.pod.name"),
    launcher("K8S_POD_NAME", KUBERNETES, "k8s.pod.name"),
    launcher("POD_NAMESPACE", KUBERNETES, "k8s.namespace.name"),
    launcher("K8S_NAMESPACE", KUBERNETES, "k8s.namespace.name"),
    launcher("NODE_NAME", KUBERNETES, "k8s.node.name"),
    launcher("K8S_NODE_NAME", KUBERNETES, "k8s.node.name"),
];

/// A row of [`LAUNCHER`].
const fn launcher(name: &'static str, launcher: &'static str, attribute: &'static str) -> LauncherVar {
    LauncherVar {
        name,
        launcher,
        attribute,
    }
}

/// `service.name` when neither [`otel::SERVICE_NAME`] nor [`otel::RESOURCE_ATTRIBUTES`] sets it and
/// no launcher is detected.
pub const DEFAULT_SERVICE_NAME: &str = "nccl";
/// Default of [`EXPORT_FILE`]: in the working directory, one file per process.
pub const DEFAULT_EXPORT_FILE: &str = "nccl-otel-%h-%p.jsonl";

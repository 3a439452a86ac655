//! Every environment variable the plugin reads, parsed once per process into [`Config`].
//!
//! [`Config::from_lookup`] takes a lookup function and returns the configuration plus one warning
//! per bad variable; its only I/O is reading the CA file named by [`TLS_STANDARD`] (cargo feature
//! `tls`). [`Config::global`] applies it to the process environment the first time it is called;
//! [`Config::take_warnings`] hands its warnings out once, for logging through NCCL. Called on: the
//! NCCL app thread in `init` (the first call reads the environment), then any.
//!
//! Rules for every variable: unset means the default, silently. A value that is empty after
//! trimming whitespace, does not parse or is out of range gives the default and exactly one
//! warning naming the variable, the value and the default used (`VAR=` is usually a launcher
//! script's mistake, so it is reported, not taken silently as "not set").
//! Nothing here panics. The table for operators is `docs/configuration.md`.
//!
//! Export settings fall back to the standard OpenTelemetry variables ([`STANDARD`]) when ours are
//! unset: each level's default is what the lower-priority levels resolved to, so a bad value warns
//! once and leaves the rest of the chain in force. Header values are secrets: never logged.
#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::sync::OnceLock;

use parking_lot::Mutex;
use std::time::Duration;

use crate::handle::MAX_SLOTS;
use crate::regression::Mode;

/// Master switch: `false` makes `init` succeed with activation mask 0 (the plugin does nothing).
pub const ENABLE: &str = "NCCL_PROFILER_OTEL_ENABLE";
/// Whether the telemetry thread runs and exports.
pub const TELEMETRY_ENABLE: &str = "NCCL_PROFILER_OTEL_TELEMETRY_ENABLE";
/// Seconds between telemetry wake-ups (decimal allowed).
pub const TELEMETRY_INTERVAL_SEC: &str = "NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC";
/// Which per-size transfer time the bandwidth/latency fit uses: `AVG` or `MIN`.
pub const LINEAR_REGRESSION_MODE: &str = "NCCL_PROFILER_LINEAR_REGRESSION_MODE";
/// Event bits (spec 2.2) stored into NCCL's activation mask.
pub const EVENT_MASK: &str = "NCCL_PROFILE_EVENT_MASK";
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
/// Path pattern of the `file` exporter (`%h` host, `%p` pid, `%%` a percent sign).
pub const EXPORT_FILE: &str = "NCCL_PROFILER_OTEL_EXPORT_FILE";
/// Export requests waiting for the exporter thread; the oldest is dropped beyond this.
pub const EXPORT_QUEUE: &str = "NCCL_PROFILER_OTEL_EXPORT_QUEUE";
/// Attribute sets kept per instrument before measurements go to the overflow series.
pub const CARDINALITY_LIMIT: &str = "NCCL_PROFILER_OTEL_CARDINALITY_LIMIT";

/// Every `NCCL_*` variable read by [`Config::from_lookup`], in the order [`Config::describe`]
/// prints them.
pub const ALL: [&str; 13] = [
    ENABLE,
    TELEMETRY_ENABLE,
    TELEMETRY_INTERVAL_SEC,
    LINEAR_REGRESSION_MODE,
    EVENT_MASK,
    WINDOW_CAPACITY,
    WINDOW_COUNT_TRIGGER,
    EXPORTER,
    TELEMETRY_ENDPOINT,
    TELEMETRY_BATCH_TIMEOUT_MS,
    EXPORT_FILE,
    EXPORT_QUEUE,
    CARDINALITY_LIMIT,
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
}

/// Every standard variable read by [`Config::from_lookup`].
pub const STANDARD: [&str; 11] = [
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

/// Highest event bit NCCL defines (CeBatch, spec 2.2); masks with higher bits are rejected.
const MAX_EVENT_BIT: u32 = 14;

/// The effective configuration. Defaults: [`Config::default`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// [`ENABLE`], default `true`.
    pub enable: bool,
    /// [`TELEMETRY_ENABLE`], default `true`.
    pub telemetry_enable: bool,
    /// [`TELEMETRY_INTERVAL_SEC`], default 5 s, valid 0.01..=3600 s.
    pub interval: Duration,
    /// [`LINEAR_REGRESSION_MODE`], default [`Mode::Avg`].
    pub regression_mode: Mode,
    /// [`EVENT_MASK`], default Coll|P2p|ProxyOp|ProxyStep = 0x1E, bits 0..=14 only.
    pub event_mask: i32,
    /// [`WINDOW_CAPACITY`], default 100000, valid 1024..=[`MAX_SLOTS`].
    pub capacity: u32,
    /// [`WINDOW_COUNT_TRIGGER`], default min(50000, capacity/2), valid 1..=capacity.
    pub count_trigger: u32,
    /// Export settings.
    pub export: Export,
}

/// Where metrics go ([`EXPORTER`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exporter {
    /// OTLP to a collector.
    Otlp,
    /// OTLP-JSON lines to a file per process.
    File,
    /// OTLP-JSON lines to standard output.
    Stdout,
    /// Nowhere: windows are still processed and recycled.
    None,
}

/// OTLP transport ([`otel::PROTOCOL`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// `http/protobuf`.
    HttpProtobuf,
    /// `http/json`.
    HttpJson,
    /// `grpc` (cargo feature `grpc`).
    Grpc,
}

/// Aggregation temporality preference ([`otel::TEMPORALITY`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Temporality {
    /// Counters and histograms report totals since the start.
    Cumulative,
    /// Counters, histograms (and up-down counters) report the change since the last export.
    Delta,
    /// Counters and histograms delta, the rest cumulative.
    LowMemory,
}

/// Export settings, each resolved from our variable, then the standard ones, then the default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Export {
    /// [`EXPORTER`], default [`Exporter::Otlp`].
    pub exporter: Exporter,
    /// [`otel::METRICS_PROTOCOL`], [`otel::PROTOCOL`], default [`Protocol::HttpProtobuf`].
    pub protocol: Protocol,
    /// The URL requests go to: [`TELEMETRY_ENDPOINT`], [`otel::METRICS_ENDPOINT`],
    /// [`otel::ENDPOINT`], default `http://localhost:4318/v1/metrics` (gRPC `http://localhost:4317`).
    pub endpoint: String,
    /// [`TELEMETRY_BATCH_TIMEOUT_MS`], [`otel::METRICS_TIMEOUT`], [`otel::TIMEOUT`], default 3 s,
    /// valid 1..=60000 ms.
    pub timeout: Duration,
    /// [`otel::HEADERS`] overlaid with [`otel::METRICS_HEADERS`], sorted by key.
    pub headers: Vec<(String, String)>,
    /// [`otel::TEMPORALITY`], default [`Temporality::Cumulative`].
    pub temporality: Temporality,
    /// [`EXPORT_FILE`], default [`DEFAULT_EXPORT_FILE`].
    pub file: String,
    /// [`EXPORT_QUEUE`], default 8, valid 1..=1024.
    pub queue: u32,
    /// [`CARDINALITY_LIMIT`], default 2000, valid 1..=1000000.
    pub cardinality_limit: u32,
    /// [`otel::SERVICE_NAME`], else `service.name` of [`otel::RESOURCE_ATTRIBUTES`], else
    /// [`DEFAULT_SERVICE_NAME`].
    pub service_name: String,
    /// Launcher identity ([`LAUNCHER`]) overlaid with [`otel::RESOURCE_ATTRIBUTES`] (without
    /// `service.name`), sorted by key.
    pub resource: Vec<(String, String)>,
    /// The CA certificates trusted for an `https://` collector instead of the system's:
    /// [`otel::METRICS_CERTIFICATE`], [`otel::CERTIFICATE`]; default (and always without the
    /// cargo feature `tls`) `None`, the system roots.
    pub certificate: Option<CaFile>,
}

/// A PEM file of CA certificates, read when the configuration is loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaFile {
    /// The path, as given.
    pub path: String,
    /// Its contents: PEM, at least one certificate, each usable as a trust anchor.
    pub pem: Vec<u8>,
}

impl Default for Config {
    fn default() -> Self {
        Self::from_lookup(|_| None).0
    }
}

/// What [`Config::global`] loaded from the environment.
struct Loaded {
    config: Config,
    warnings: Mutex<Vec<String>>,
}

static GLOBAL: OnceLock<Loaded> = OnceLock::new();

impl Config {
    /// Parses every variable in [`ALL`] through `lookup`; returns the configuration and one warning
    /// per variable whose value was rejected:
    /// `VAR='value' is not <what>; using default <d>`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> (Config, Vec<String>) {
        let mut r = Reader {
            lookup,
            warnings: Vec::new(),
        };
        let enable = r.read(ENABLE, true, BOOL, parse_bool, show_bool);
        let telemetry_enable = r.read(TELEMETRY_ENABLE, true, BOOL, parse_bool, show_bool);
        let interval = r.read(
            TELEMETRY_INTERVAL_SEC,
            Duration::from_secs(5),
            "a number of seconds in 0.01..=3600",
            parse_interval,
            show_secs,
        );
        let regression_mode = r.read(LINEAR_REGRESSION_MODE, Mode::Avg, "AVG or MIN", Mode::parse, show_mode);
        let event_mask = r.read(
            EVENT_MASK,
            0x1E,
            "an event mask using only bits 0..=14 (0..=0x7fff, decimal or 0x-hex)",
            parse_event_mask,
            show_mask,
        );
        let capacity = r.read(
            WINDOW_CAPACITY,
            100_000,
            &format!("an integer in 1024..={MAX_SLOTS}"),
            |s| parse_u32_in(s, 1024..=MAX_SLOTS),
            show_u32,
        );
        let count_trigger = r.read(
            WINDOW_COUNT_TRIGGER,
            50_000.min(capacity / 2),
            &format!("an integer in 1..={capacity} (the window capacity)"),
            |s| parse_u32_in(s, 1..=capacity),
            show_u32,
        );
        let export = r.export();
        let config = Config {
            enable,
            telemetry_enable,
            interval,
            regression_mode,
            event_mask,
            capacity,
            count_trigger,
            export,
        };
        (config, r.warnings)
    }

    /// The configuration of this process, read from the environment on the first call.
    /// Called on: NCCL app thread (`init`), telemetry thread.
    pub fn global() -> &'static Config {
        &Self::loaded().config
    }

    /// The warnings produced while loading [`Config::global`]; the first call gets them, later
    /// calls get an empty `Vec`, so each bad variable is logged once per process.
    /// Called on: NCCL app thread.
    #[must_use]
    pub fn take_warnings() -> Vec<String> {
        let mut warnings = Self::loaded().warnings.lock();
        std::mem::take(&mut *warnings)
    }

    fn loaded() -> &'static Loaded {
        GLOBAL.get_or_init(|| {
            // Lossy: a non-UTF-8 value fails its parser and is reported, not taken as unset.
            let env = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
            let (config, warnings) = Self::from_lookup(env);
            Loaded {
                config,
                warnings: Mutex::new(warnings),
            }
        })
    }

    /// One line with the plugin version and the effective value of every variable in [`ALL`],
    /// then of the protocol, temporality, service name and, when one is in effect, the CA file,
    /// in the syntax each variable accepts; logged at `init` on rank 0. Headers are never shown
    /// (they carry credentials).
    #[must_use]
    pub fn describe(&self) -> String {
        let e = &self.export;
        let values = [
            show_bool(self.enable),
            show_bool(self.telemetry_enable),
            show_secs(self.interval),
            show_mode(self.regression_mode),
            show_mask(self.event_mask),
            show_u32(self.capacity),
            show_u32(self.count_trigger),
            show_exporter(e.exporter),
            e.endpoint.clone(),
            show_millis(e.timeout),
            e.file.clone(),
            show_u32(e.queue),
            show_u32(e.cardinality_limit),
        ];
        let mut line = format!("nccl-profiler-otel {}:", env!("CARGO_PKG_VERSION"));
        let standard = [
            (otel::METRICS_PROTOCOL, show_protocol(e.protocol)),
            (otel::TEMPORALITY, show_temporality(e.temporality)),
            (otel::SERVICE_NAME, e.service_name.clone()),
        ];
        let ca = e
            .certificate
            .as_ref()
            .map(|c| (otel::METRICS_CERTIFICATE, c.path.clone()));
        for (name, value) in ALL.iter().copied().zip(values).chain(standard).chain(ca) {
            let _ = write!(line, " {name}={value}"); // a String never fails
        }
        line
    }
}

/// Collects the warnings while [`Config::from_lookup`] reads variables one by one.
struct Reader<L> {
    lookup: L,
    warnings: Vec<String>,
}

impl<L: Fn(&str) -> Option<String>> Reader<L> {
    /// The value of `name`, trimmed; `None` when unset, or when blank (with a warning ending in
    /// `instead`, what is used in its place).
    fn value(&mut self, name: &str, instead: impl FnOnce() -> String) -> Option<String> {
        let raw = (self.lookup)(name)?;
        let value = raw.trim();
        if value.is_empty() {
            self.warnings.push(format!("{name}='' is empty; {}", instead()));
            return None;
        }
        Some(value.to_owned())
    }

    /// Reads `name`: unset gives `default` silently; blank, or `parse` failing, gives `default`
    /// and a warning (saying the value is not `valid`).
    fn read<T: Copy>(
        &mut self,
        name: &str,
        default: T,
        valid: &str,
        parse: impl Fn(&str) -> Option<T>,
        show: fn(T) -> String,
    ) -> T {
        self.read_owned(name, default, valid, parse, |v| show(*v))
    }

    /// [`Reader::read`] for non-`Copy` values.
    fn read_owned<T>(
        &mut self,
        name: &str,
        default: T,
        valid: &str,
        parse: impl Fn(&str) -> Option<T>,
        show: impl Fn(&T) -> String,
    ) -> T {
        let Some(value) = self.value(name, || format!("using default {}", show(&default))) else {
            return default;
        };
        parse(&value).unwrap_or_else(|| {
            let shown = show(&default);
            self.warnings
                .push(format!("{name}='{value}' is not {valid}; using default {shown}"));
            default
        })
    }

    /// A `k=v,…` list; a bad one warns without echoing the value (headers carry credentials)
    /// and gives the empty list.
    fn read_pairs(&mut self, name: &str, secret: bool) -> Vec<(String, String)> {
        let Some(value) = self.value(name, || "ignoring it".to_owned()) else {
            return Vec::new();
        };
        parse_pairs(&value).unwrap_or_else(|| {
            let shown = if secret {
                format!("<{} bytes, not shown>", value.len())
            } else {
                format!("'{value}'")
            };
            self.warnings.push(format!(
                "{name}={shown} is not a comma-separated list of key=value pairs (values \
                 percent-encoded); ignoring it"
            ));
            Vec::new()
        })
    }

    /// Every export setting.
    fn export(&mut self) -> Export {
        let exporter = self.read(
            EXPORTER,
            Exporter::Otlp,
            "otlp, file, stdout or none",
            parse_exporter,
            show_exporter,
        );
        let protocols = if cfg!(feature = "grpc") {
            "http/protobuf, http/json or grpc"
        } else {
            "http/protobuf or http/json (grpc needs the cargo feature grpc)"
        };
        let protocol = self.read(
            otel::PROTOCOL,
            Protocol::HttpProtobuf,
            protocols,
            parse_protocol,
            show_protocol,
        );
        let protocol = self.read(
            otel::METRICS_PROTOCOL,
            protocol,
            protocols,
            parse_protocol,
            show_protocol,
        );

        let urls = if cfg!(feature = "tls") {
            "an http:// or https:// URL"
        } else {
            "an http:// URL (https needs the cargo feature tls)"
        };
        let endpoint = match protocol {
            Protocol::Grpc => "http://localhost:4317".to_owned(),
            Protocol::HttpProtobuf | Protocol::HttpJson => "http://localhost:4318/v1/metrics".to_owned(),
        };
        let base = |s: &str| parse_endpoint(s, protocol);
        let endpoint = self.read_owned(otel::ENDPOINT, endpoint, urls, base, Clone::clone);
        let exact = |s: &str| parse_endpoint(s, Protocol::Grpc);
        let endpoint = self.read_owned(otel::METRICS_ENDPOINT, endpoint, urls, exact, Clone::clone);
        let endpoint = self.read_owned(TELEMETRY_ENDPOINT, endpoint, urls, base, Clone::clone);

        let millis = "an integer number of milliseconds in 1..=60000";
        let timeout = Duration::from_millis(3000);
        let timeout = self.read(otel::TIMEOUT, timeout, millis, parse_millis, show_millis);
        let timeout = self.read(otel::METRICS_TIMEOUT, timeout, millis, parse_millis, show_millis);
        let timeout = self.read(TELEMETRY_BATCH_TIMEOUT_MS, timeout, millis, parse_millis, show_millis);

        let headers = overlay(
            self.read_pairs(otel::HEADERS, true),
            self.read_pairs(otel::METRICS_HEADERS, true),
        );
        #[cfg(feature = "tls")]
        let certificate = {
            let valid = "a readable file of PEM CA certificates (at most 1 MiB)";
            let read = |s: &str| read_ca_file(s).map(Some);
            let certificate = self.read_owned(otel::CERTIFICATE, None, valid, read, show_ca_file);
            self.read_owned(otel::METRICS_CERTIFICATE, certificate, valid, read, show_ca_file)
        };
        #[cfg(not(feature = "tls"))]
        let certificate = None;
        let temporality = self.read(
            otel::TEMPORALITY,
            Temporality::Cumulative,
            "cumulative, delta or lowmemory",
            parse_temporality,
            show_temporality,
        );
        let file = self.read_owned(
            EXPORT_FILE,
            DEFAULT_EXPORT_FILE.to_owned(),
            "a path whose only % sequences are %h, %p and %%",
            parse_file_pattern,
            Clone::clone,
        );
        let queue = self.read(
            EXPORT_QUEUE,
            8,
            "an integer in 1..=1024",
            |s| parse_u32_in(s, 1..=1024),
            show_u32,
        );
        let cardinality_limit = self.read(
            CARDINALITY_LIMIT,
            2000,
            "an integer in 1..=1000000",
            |s| parse_u32_in(s, 1..=1_000_000),
            show_u32,
        );

        let launcher: Vec<(String, String)> = LAUNCHER
            .iter()
            .filter_map(|(var, key)| {
                let value = (self.lookup)(var)?;
                let value = value.trim();
                (!value.is_empty()).then(|| ((*key).to_owned(), value.to_owned()))
            })
            .collect();
        let mut resource = overlay(launcher, self.read_pairs(otel::RESOURCE_ATTRIBUTES, false));
        let from_resource = resource
            .iter()
            .position(|(k, _)| k == "service.name")
            .map(|i| resource.remove(i).1);
        let service_name = self.read_owned(
            otel::SERVICE_NAME,
            from_resource.unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned()),
            "a service name",
            |s| Some(s.to_owned()),
            Clone::clone,
        );
        Export {
            exporter,
            protocol,
            endpoint,
            timeout,
            headers,
            temporality,
            file,
            queue,
            cardinality_limit,
            service_name,
            resource,
            certificate,
        }
    }
}

const BOOL: &str = "a boolean (1/0, true/false, yes/no, on/off)";

fn parse_bool(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// Decimal seconds; NaN and infinities fail the range check.
fn parse_interval(s: &str) -> Option<Duration> {
    let secs: f64 = s.parse().ok()?;
    (0.01..=3600.0).contains(&secs).then(|| Duration::from_secs_f64(secs))
}

/// A non-negative integer, decimal or `0x`-hex, digits only (no sign, no separators).
fn parse_uint(s: &str) -> Option<u64> {
    let (digits, radix) = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None => (s, 10),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

fn parse_u32_in(s: &str, valid: std::ops::RangeInclusive<u32>) -> Option<u32> {
    let value = u32::try_from(parse_uint(s)?).ok()?;
    valid.contains(&value).then_some(value)
}

fn parse_event_mask(s: &str) -> Option<i32> {
    let mask = parse_uint(s)?;
    if mask >> (MAX_EVENT_BIT + 1) != 0 {
        return None;
    }
    i32::try_from(mask).ok()
}

fn parse_exporter(s: &str) -> Option<Exporter> {
    match s.to_ascii_lowercase().as_str() {
        "otlp" => Some(Exporter::Otlp),
        "file" => Some(Exporter::File),
        "stdout" => Some(Exporter::Stdout),
        "none" => Some(Exporter::None),
        _ => None,
    }
}

fn parse_protocol(s: &str) -> Option<Protocol> {
    match s.to_ascii_lowercase().as_str() {
        "http/protobuf" => Some(Protocol::HttpProtobuf),
        "http/json" => Some(Protocol::HttpJson),
        "grpc" if cfg!(feature = "grpc") => Some(Protocol::Grpc),
        _ => None,
    }
}

fn parse_temporality(s: &str) -> Option<Temporality> {
    match s.to_ascii_lowercase().as_str() {
        "cumulative" => Some(Temporality::Cumulative),
        "delta" => Some(Temporality::Delta),
        "lowmemory" => Some(Temporality::LowMemory),
        _ => None,
    }
}

/// Whole milliseconds in 1..=60000.
fn parse_millis(s: &str) -> Option<Duration> {
    let ms = parse_uint(s)?;
    (1..=60_000).contains(&ms).then(|| Duration::from_millis(ms))
}

/// An `http://` (or, with TLS, `https://`) URL with a host and an optional numeric port; for
/// HTTP protocols, the path gets `/v1/metrics` unless it already ends with it. gRPC URLs are taken
/// as they are.
fn parse_endpoint(s: &str, protocol: Protocol) -> Option<String> {
    let rest = s
        .strip_prefix("http://")
        .or_else(|| s.strip_prefix("https://").filter(|_| cfg!(feature = "tls")))?;
    if s.contains(|c: char| c.is_whitespace() || c.is_control()) {
        return None;
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let port = match authority.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6.split_once(']')?;
            if host.is_empty() {
                return None;
            }
            match after {
                "" => None,
                p => Some(p.strip_prefix(':')?),
            }
        }
        None => {
            let (host, port) = match authority.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            };
            if host.is_empty() || host.contains(['@', '[', ']']) {
                return None;
            }
            port
        }
    };
    if port.is_some_and(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) || p.parse::<u16>().is_err()) {
        return None;
    }
    Some(match protocol {
        Protocol::Grpc => s.to_owned(),
        Protocol::HttpProtobuf | Protocol::HttpJson => {
            let trimmed = s.trim_end_matches('/');
            if trimmed.ends_with("/v1/metrics") {
                trimmed.to_owned()
            } else {
                format!("{trimmed}/v1/metrics")
            }
        }
    })
}

/// The regular file at `path` when it holds PEM certificates that are all usable as trust anchors
/// (sections of other types are skipped), at least one.
#[cfg(feature = "tls")]
fn read_ca_file(path: &str) -> Option<CaFile> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    /// A bundle of every public root is about 220 KB.
    const MAX_CA_FILE: u64 = 1 << 20;
    // Checked before opening: a FIFO or a device such as /dev/stdin could block or never end.
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() > MAX_CA_FILE {
        return None;
    }
    let pem = std::fs::read(path).ok()?;
    let certs: Vec<CertificateDer> = CertificateDer::pem_slice_iter(&pem).collect::<Result<_, _>>().ok()?;
    let (added, ignored) = rustls::RootCertStore::empty().add_parsable_certificates(certs);
    (added > 0 && ignored == 0).then(|| CaFile {
        path: path.to_owned(),
        pem,
    })
}

/// A path pattern whose `%` sequences are `%h`, `%p` or `%%`.
fn parse_file_pattern(s: &str) -> Option<String> {
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '%' && !matches!(chars.next(), Some('h' | 'p' | '%')) {
            return None;
        }
    }
    (!s.contains('\0')).then(|| s.to_owned())
}

/// `k=v,k2=v2`: keys trimmed and non-empty, values trimmed and percent-decoded; empty entries
/// (`a=1,,b=2`, a trailing comma) are skipped.
fn parse_pairs(s: &str) -> Option<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (key, value) = entry.split_once('=')?;
        let key = key.trim();
        if key.is_empty() || key.contains(char::is_whitespace) {
            return None;
        }
        pairs.push((key.to_owned(), percent_decode(value.trim())?));
    }
    Some(overlay(Vec::new(), pairs))
}

/// `%XX` escapes decoded; `None` for a bad escape or invalid UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `base` with every key of `top` set to top's value (later duplicates in `top` win); sorted by key.
fn overlay(base: Vec<(String, String)>, top: Vec<(String, String)>) -> Vec<(String, String)> {
    let map: std::collections::BTreeMap<String, String> = base.into_iter().chain(top).collect();
    map.into_iter().collect()
}

fn show_exporter(value: Exporter) -> String {
    match value {
        Exporter::Otlp => "otlp",
        Exporter::File => "file",
        Exporter::Stdout => "stdout",
        Exporter::None => "none",
    }
    .to_owned()
}

fn show_protocol(value: Protocol) -> String {
    match value {
        Protocol::HttpProtobuf => "http/protobuf",
        Protocol::HttpJson => "http/json",
        Protocol::Grpc => "grpc",
    }
    .to_owned()
}

fn show_temporality(value: Temporality) -> String {
    match value {
        Temporality::Cumulative => "cumulative",
        Temporality::Delta => "delta",
        Temporality::LowMemory => "lowmemory",
    }
    .to_owned()
}

fn show_millis(value: Duration) -> String {
    value.as_millis().to_string()
}

fn show_bool(value: bool) -> String {
    value.to_string()
}

fn show_secs(value: Duration) -> String {
    value.as_secs_f64().to_string()
}

fn show_mode(value: Mode) -> String {
    value.as_str().to_owned()
}

fn show_mask(value: i32) -> String {
    format!("{value:#x}")
}

fn show_u32(value: u32) -> String {
    value.to_string()
}

#[cfg(feature = "tls")]
fn show_ca_file(value: &Option<CaFile>) -> String {
    value
        .as_ref()
        .map_or_else(|| "(the system roots)".to_owned(), |c| c.path.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(vars: &[(&str, &str)]) -> (Config, Vec<String>) {
        Config::from_lookup(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned()))
    }

    /// Asserts `value` for `name` is rejected with exactly one warning and the default kept.
    fn assert_rejected(name: &str, value: &str, default_shown: &str) {
        let (config, warnings) = load(&[(name, value)]);
        assert_eq!(config, Config::default(), "{name}={value:?}");
        assert_eq!(warnings.len(), 1, "{name}={value:?}: {warnings:?}");
        let w = &warnings[0];
        assert!(w.starts_with(&format!("{name}='{}' is not ", value.trim())), "{w}");
        assert!(w.ends_with(&format!("; using default {default_shown}")), "{w}");
    }

    #[test]
    fn defaults() {
        let (config, warnings) = load(&[]);
        assert!(warnings.is_empty());
        assert_eq!(
            config,
            Config {
                enable: true,
                telemetry_enable: true,
                interval: Duration::from_secs(5),
                regression_mode: Mode::Avg,
                event_mask: 0x1E,
                capacity: 100_000,
                count_trigger: 50_000,
                export: Export {
                    exporter: Exporter::Otlp,
                    protocol: Protocol::HttpProtobuf,
                    endpoint: "http://localhost:4318/v1/metrics".into(),
                    timeout: Duration::from_millis(3000),
                    headers: vec![],
                    temporality: Temporality::Cumulative,
                    file: "nccl-otel-%h-%p.jsonl".into(),
                    queue: 8,
                    cardinality_limit: 2000,
                    service_name: "nccl".into(),
                    resource: vec![],
                    certificate: None,
                },
            }
        );
    }

    #[test]
    fn empty_and_blank_values_warn_once_and_keep_the_default() {
        for name in ALL {
            for value in ["", "   ", "\t"] {
                let (config, warnings) = load(&[(name, value)]);
                assert_eq!(config, Config::default(), "{name}={value:?}");
                // The default named is the one the configuration line shows.
                let described = Config::default().describe();
                let shown = described
                    .split(&format!(" {name}="))
                    .nth(1)
                    .and_then(|v| v.split(' ').next());
                let expected = format!("{name}='' is empty; using default {}", shown.unwrap_or("?"));
                assert_eq!(warnings, [expected], "{name}={value:?}");
            }
        }
    }

    #[test]
    fn bools() {
        for (value, expected) in [
            ("1", true),
            ("0", false),
            ("true", true),
            ("FALSE", false),
            ("Yes", true),
            ("no", false),
            ("ON", true),
            (" off ", false),
        ] {
            for name in [ENABLE, TELEMETRY_ENABLE] {
                let (config, warnings) = load(&[(name, value)]);
                assert!(warnings.is_empty());
                let got = if name == ENABLE {
                    config.enable
                } else {
                    config.telemetry_enable
                };
                assert_eq!(got, expected, "{name}={value:?}");
            }
        }
        for value in ["2", "-1", "y", "enable", "truee", "nan"] {
            assert_rejected(ENABLE, value, "true");
            assert_rejected(TELEMETRY_ENABLE, value, "true");
        }
    }

    #[test]
    fn interval() {
        for (value, expected) in [
            ("5", Duration::from_secs(5)),
            ("0.5", Duration::from_millis(500)),
            (".25", Duration::from_millis(250)),
            ("0.01", Duration::from_millis(10)),
            ("3600", Duration::from_secs(3600)),
            ("1e1", Duration::from_secs(10)),
        ] {
            let (config, warnings) = load(&[(TELEMETRY_INTERVAL_SEC, value)]);
            assert!(warnings.is_empty(), "{value}: {warnings:?}");
            assert_eq!(config.interval, expected, "{value}");
        }
        for value in [
            "0", "0.009", "-1", "3600.001", "1e9", "nan", "NaN", "inf", "-inf", "0x10", "5s", "abc", "1,5",
        ] {
            assert_rejected(TELEMETRY_INTERVAL_SEC, value, "5");
        }
    }

    #[test]
    fn regression_mode() {
        for (value, expected) in [("AVG", Mode::Avg), ("MIN", Mode::Min), ("min", Mode::Min)] {
            let (config, warnings) = load(&[(LINEAR_REGRESSION_MODE, value)]);
            assert!(warnings.is_empty());
            assert_eq!(config.regression_mode, expected);
        }
        for value in ["MAX", "0", "average"] {
            assert_rejected(LINEAR_REGRESSION_MODE, value, "AVG");
        }
    }

    #[test]
    fn event_mask() {
        for (value, expected) in [
            ("30", 0x1E),
            ("0x65E", 0x65E),
            ("0X7fff", 0x7FFF),
            ("0", 0),
            ("16384", 0x4000),
        ] {
            let (config, warnings) = load(&[(EVENT_MASK, value)]);
            assert!(warnings.is_empty(), "{value}: {warnings:?}");
            assert_eq!(config.event_mask, expected, "{value}");
        }
        for value in [
            "0x8000",
            "32768",
            "-1",
            "+30",
            "0x",
            "0x-1",
            "1e3",
            "abc",
            "0xg",
            "4294967296",
            "99999999999999999999999",
            "nan",
            "inf",
            "3 0",
        ] {
            assert_rejected(EVENT_MASK, value, "0x1e");
        }
    }

    #[test]
    fn capacity_and_trigger() {
        for (vars, capacity, trigger) in [
            (&[(WINDOW_CAPACITY, "1024")][..], 1024, 512),
            (&[(WINDOW_CAPACITY, "2097151")][..], MAX_SLOTS, 50_000),
            (&[(WINDOW_CAPACITY, "0x10000")][..], 65_536, 32_768),
            (&[(WINDOW_COUNT_TRIGGER, "1")][..], 100_000, 1),
            (&[(WINDOW_COUNT_TRIGGER, "100000")][..], 100_000, 100_000),
            (
                &[(WINDOW_CAPACITY, "4096"), (WINDOW_COUNT_TRIGGER, "4096")][..],
                4096,
                4096,
            ),
        ] {
            let (config, warnings) = load(vars);
            assert!(warnings.is_empty(), "{vars:?}: {warnings:?}");
            assert_eq!((config.capacity, config.count_trigger), (capacity, trigger), "{vars:?}");
        }
        for value in [
            "1023",
            "2097152",
            "0",
            "-5",
            "4294967296",
            "1e5",
            "100000.0",
            "nan",
            "0x",
        ] {
            assert_rejected(WINDOW_CAPACITY, value, "100000");
        }
        for value in ["0", "100001", "-1", "4294967296", "inf", "x"] {
            assert_rejected(WINDOW_COUNT_TRIGGER, value, "50000");
        }
    }

    #[test]
    fn trigger_above_capacity_uses_half_the_capacity() {
        let (config, warnings) = load(&[(WINDOW_CAPACITY, "2048"), (WINDOW_COUNT_TRIGGER, "50000")]);
        assert_eq!((config.capacity, config.count_trigger), (2048, 1024));
        assert_eq!(
            warnings,
            [format!(
                "{WINDOW_COUNT_TRIGGER}='50000' is not an integer in 1..=2048 (the window \
                 capacity); using default 1024"
            )]
        );
    }

    #[test]
    fn one_warning_per_bad_variable() {
        let vars: Vec<(&str, &str)> = ALL.iter().map(|name| (*name, "%bogus")).collect();
        let (config, warnings) = load(&vars);
        assert_eq!(config, Config::default());
        assert_eq!(warnings.len(), ALL.len());
        for name in ALL {
            let prefix = format!("{name}='%bogus' is not ");
            assert!(warnings.iter().any(|w| w.starts_with(&prefix)), "{name}: {warnings:?}");
        }
    }

    #[test]
    fn describe_round_trips() {
        let (config, _) = load(&[
            (ENABLE, "off"),
            (TELEMETRY_INTERVAL_SEC, "0.5"),
            (LINEAR_REGRESSION_MODE, "MIN"),
            (EVENT_MASK, "0x65e"),
            (WINDOW_CAPACITY, "4096"),
            (EXPORTER, "file"),
            (otel::ENDPOINT, "http://collector:4318/"),
            (otel::TIMEOUT, "250"),
            (EXPORT_FILE, "/tmp/x-%h-%p-%%.jsonl"),
            (EXPORT_QUEUE, "3"),
            (CARDINALITY_LIMIT, "16"),
            (otel::PROTOCOL, "http/json"),
            (otel::TEMPORALITY, "delta"),
            (otel::RESOURCE_ATTRIBUTES, "service.name=trainer"),
        ]);
        let line = config.describe();
        assert!(
            line.starts_with(&format!("nccl-profiler-otel {}: ", env!("CARGO_PKG_VERSION"))),
            "{line}"
        );
        assert!(line.contains(" NCCL_PROFILE_EVENT_MASK=0x65e "), "{line}");
        let (_, pairs) = line.split_once(": ").unwrap();
        let vars: Vec<(&str, &str)> = pairs.split(' ').map(|pair| pair.split_once('=').unwrap()).collect();
        assert_eq!(vars.len(), ALL.len() + 3);
        assert!(line.contains(" NCCL_PROFILER_OTEL_TELEMETRY_ENDPOINT=http://collector:4318/v1/metrics "));
        assert!(line.ends_with(" OTEL_SERVICE_NAME=trainer"), "{line}");
        assert_eq!(load(&vars), (config, Vec::new()));
    }

    #[test]
    fn exporter_and_queue_and_limit() {
        for (value, expected) in [
            ("otlp", Exporter::Otlp),
            ("FILE", Exporter::File),
            ("stdout", Exporter::Stdout),
            (" none ", Exporter::None),
        ] {
            let (config, warnings) = load(&[(EXPORTER, value)]);
            assert!(warnings.is_empty());
            assert_eq!(config.export.exporter, expected);
        }
        for value in ["otel", "json", "0"] {
            assert_rejected(EXPORTER, value, "otlp");
        }
        for value in ["0", "1025", "-1", "x"] {
            assert_rejected(EXPORT_QUEUE, value, "8");
        }
        for value in ["0", "1000001", "1e3"] {
            assert_rejected(CARDINALITY_LIMIT, value, "2000");
        }
        let (config, _) = load(&[(EXPORT_QUEUE, "1"), (CARDINALITY_LIMIT, "0x10")]);
        assert_eq!((config.export.queue, config.export.cardinality_limit), (1, 16));
    }

    #[test]
    fn endpoint_resolution_order() {
        let endpoint = |vars: &[(&str, &str)]| load(vars).0.export.endpoint;
        assert_eq!(endpoint(&[]), "http://localhost:4318/v1/metrics");
        assert_eq!(endpoint(&[(otel::ENDPOINT, "http://c:1")]), "http://c:1/v1/metrics");
        assert_eq!(
            endpoint(&[(otel::ENDPOINT, "http://c:1/base/")]),
            "http://c:1/base/v1/metrics"
        );
        assert_eq!(
            endpoint(&[
                (otel::ENDPOINT, "http://c:1"),
                (otel::METRICS_ENDPOINT, "http://m:2/custom")
            ]),
            "http://m:2/custom"
        );
        assert_eq!(
            endpoint(&[
                (otel::METRICS_ENDPOINT, "http://m:2/custom"),
                (TELEMETRY_ENDPOINT, "http://127.0.0.1:9")
            ]),
            "http://127.0.0.1:9/v1/metrics"
        );
        assert_eq!(
            endpoint(&[(TELEMETRY_ENDPOINT, "http://[::1]:4318/v1/metrics")]),
            "http://[::1]:4318/v1/metrics"
        );
        // A bad value of ours keeps what the standard variables say.
        let (config, warnings) = load(&[(otel::ENDPOINT, "http://c:1"), (TELEMETRY_ENDPOINT, "c:1")]);
        assert_eq!(config.export.endpoint, "http://c:1/v1/metrics");
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0].ends_with("using default http://c:1/v1/metrics"),
            "{warnings:?}"
        );
        for value in [
            "localhost:4318",
            "ftp://x",
            "http://",
            "http://:80",
            "http://h:x",
            "http://h:99999",
            "http://a b",
        ] {
            assert_rejected(TELEMETRY_ENDPOINT, value, "http://localhost:4318/v1/metrics");
        }
        if !cfg!(feature = "tls") {
            assert_rejected(TELEMETRY_ENDPOINT, "https://c:4318", "http://localhost:4318/v1/metrics");
        }
    }

    #[test]
    fn protocol_timeout_and_temporality() {
        let (config, warnings) = load(&[(otel::PROTOCOL, "http/json"), (otel::TIMEOUT, "100")]);
        assert!(warnings.is_empty());
        assert_eq!(config.export.protocol, Protocol::HttpJson);
        assert_eq!(config.export.timeout, Duration::from_millis(100));
        let (config, _) = load(&[
            (otel::PROTOCOL, "http/json"),
            (otel::METRICS_PROTOCOL, "http/protobuf"),
            (otel::TIMEOUT, "100"),
            (otel::METRICS_TIMEOUT, "200"),
        ]);
        assert_eq!(config.export.protocol, Protocol::HttpProtobuf);
        assert_eq!(config.export.timeout, Duration::from_millis(200));
        let (config, _) = load(&[(otel::METRICS_TIMEOUT, "200"), (TELEMETRY_BATCH_TIMEOUT_MS, "50")]);
        assert_eq!(config.export.timeout, Duration::from_millis(50));
        for value in ["0", "60001", "1.5", "abc"] {
            assert_rejected(TELEMETRY_BATCH_TIMEOUT_MS, value, "3000");
        }
        assert_rejected(otel::PROTOCOL, "http", "http/protobuf");
        let grpc = load(&[(otel::PROTOCOL, "grpc")]);
        if cfg!(feature = "grpc") {
            assert_eq!(grpc.0.export.protocol, Protocol::Grpc);
            assert_eq!(grpc.0.export.endpoint, "http://localhost:4317");
            let (config, _) = load(&[(otel::PROTOCOL, "grpc"), (TELEMETRY_ENDPOINT, "http://c:4317")]);
            assert_eq!(config.export.endpoint, "http://c:4317");
        } else {
            assert_eq!(grpc.1.len(), 1, "{:?}", grpc.1);
        }
        for (value, expected) in [
            ("cumulative", Temporality::Cumulative),
            ("Delta", Temporality::Delta),
            ("LOWMEMORY", Temporality::LowMemory),
        ] {
            assert_eq!(load(&[(otel::TEMPORALITY, value)]).0.export.temporality, expected);
        }
        assert_rejected(otel::TEMPORALITY, "deltas", "cumulative");
    }

    #[test]
    fn headers_overlay_and_stay_secret() {
        let (config, warnings) = load(&[
            (otel::HEADERS, "authorization=Bearer%20abc, x-a = 1 ,"),
            (otel::METRICS_HEADERS, "x-a=2"),
        ]);
        assert!(warnings.is_empty());
        assert_eq!(
            config.export.headers,
            [
                ("authorization".into(), "Bearer abc".into()),
                ("x-a".into(), "2".into())
            ]
        );
        assert!(!config.describe().contains("abc"));
        let (config, warnings) = load(&[(otel::HEADERS, "secret-token-without-key")]);
        assert!(config.export.headers.is_empty());
        assert_eq!(warnings.len(), 1);
        assert!(!warnings[0].contains("secret"), "{warnings:?}");
        assert_eq!(load(&[(otel::HEADERS, "a=%zz")]).1.len(), 1);
    }

    #[test]
    fn resource_and_service_name() {
        let (config, warnings) = load(&[
            ("SLURM_JOB_ID", "4242"),
            ("RANK", " 3 "),
            ("POD_NAME", ""),
            (
                otel::RESOURCE_ATTRIBUTES,
                "team=ml,service.name=from-resource,job.rank=7",
            ),
        ]);
        assert!(warnings.is_empty());
        assert_eq!(config.export.service_name, "from-resource");
        assert_eq!(
            config.export.resource,
            [
                ("job.rank".into(), "7".into()),
                ("slurm.job.id".into(), "4242".into()),
                ("team".into(), "ml".into())
            ]
        );
        let (config, _) = load(&[
            (otel::RESOURCE_ATTRIBUTES, "service.name=from-resource"),
            (otel::SERVICE_NAME, "trainer"),
        ]);
        assert_eq!(config.export.service_name, "trainer");
        assert!(config.export.resource.is_empty());
        assert_eq!(load(&[(otel::RESOURCE_ATTRIBUTES, "novalue")]).1.len(), 1);
    }

    #[test]
    fn file_pattern() {
        let (config, warnings) = load(&[(EXPORT_FILE, "/tmp/%h/%p-100%%.jsonl")]);
        assert!(warnings.is_empty());
        assert_eq!(config.export.file, "/tmp/%h/%p-100%%.jsonl");
        for value in ["a%d", "trailing%", "%H"] {
            assert_rejected(EXPORT_FILE, value, DEFAULT_EXPORT_FILE);
        }
    }

    #[test]
    #[cfg(not(feature = "tls"))]
    fn certificate_is_ignored_without_tls() {
        let (config, warnings) = load(&[(otel::CERTIFICATE, "/nonexistent"), (otel::METRICS_CERTIFICATE, "")]);
        assert_eq!((config, warnings), (Config::default(), Vec::new()));
    }

    /// A file in the temporary directory holding `contents`; returns its path.
    #[cfg(feature = "tls")]
    fn scratch(name: &str, contents: &[u8]) -> String {
        let path = std::env::temp_dir().join(format!("nccl-otel-config-{}-{name}", std::process::id()));
        std::fs::write(&path, contents).unwrap();
        path.to_string_lossy().into_owned()
    }

    /// A self-signed CA certificate, PEM.
    #[cfg(feature = "tls")]
    fn ca_pem() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().pem()
    }

    #[test]
    #[cfg(feature = "tls")]
    fn certificate_files() {
        let ca = ca_pem();
        let key = rcgen::KeyPair::generate().unwrap().serialize_pem();
        // A key section before the certificate is skipped.
        let good = scratch("good.pem", format!("{key}{ca}").as_bytes());
        let other = scratch("other.pem", ca_pem().as_bytes());
        let (config, warnings) = load(&[(otel::CERTIFICATE, &good)]);
        assert!(warnings.is_empty(), "{warnings:?}");
        let loaded = config.export.certificate.clone().expect("CA file");
        assert_eq!(
            (loaded.path.as_str(), loaded.pem.as_slice()),
            (good.as_str(), format!("{key}{ca}").as_bytes())
        );
        let line = config.describe();
        assert!(
            line.ends_with(&format!(" {}={good}", otel::METRICS_CERTIFICATE)),
            "{line}"
        );
        let (_, pairs) = line.split_once(": ").unwrap();
        let vars: Vec<(&str, &str)> = pairs.split(' ').map(|pair| pair.split_once('=').unwrap()).collect();
        assert_eq!(load(&vars), (config, Vec::new()));

        // The metrics variable wins; a bad one warns once and keeps the generic one.
        let path = |vars: &[(&str, &str)]| load(vars).0.export.certificate.map(|c| c.path);
        let both = [
            (otel::CERTIFICATE, other.as_str()),
            (otel::METRICS_CERTIFICATE, good.as_str()),
        ];
        assert_eq!(path(&both), Some(good.clone()));
        let (config, warnings) = load(&[(otel::CERTIFICATE, &other), (otel::METRICS_CERTIFICATE, "/nonexistent")]);
        assert_eq!(config.export.certificate.map(|c| c.path), Some(other.clone()));
        assert_eq!(
            warnings,
            [format!(
                "{}='/nonexistent' is not a readable file of PEM CA certificates (at most 1 MiB); using \
                 default {other}",
                otel::METRICS_CERTIFICATE
            )]
        );

        let body = ca.lines().filter(|l| !l.starts_with("-----")).collect::<String>();
        let bad = [
            scratch("empty.pem", b""),
            scratch("key.pem", key.as_bytes()),
            scratch("text.pem", b"not a certificate\n"),
            scratch("base64.pem", ca.replacen(&body[..8], "!!!!!!!!", 1).as_bytes()),
            scratch(
                "der.pem",
                b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            ),
            scratch("huge.pem", &vec![b'\n'; (1 << 20) + 1]),
        ];
        let tmp = std::env::temp_dir().to_string_lossy().into_owned();
        let not_files = ["/nonexistent/ca.pem", tmp.as_str(), "/dev/null", "/dev/stdin"];
        for value in bad.iter().map(String::as_str).chain(not_files) {
            for name in TLS_STANDARD {
                assert_rejected(name, value, "(the system roots)");
            }
        }
        for name in TLS_STANDARD {
            let (config, warnings) = load(&[(name, " ")]);
            assert_eq!(config, Config::default());
            assert_eq!(
                warnings,
                [format!("{name}='' is empty; using default (the system roots)")]
            );
        }
        for file in bad.iter().chain([&good, &other]) {
            std::fs::remove_file(file).unwrap();
        }
    }

    #[test]
    fn global_is_loaded_once() {
        assert!(std::ptr::eq(Config::global(), Config::global()));
        let _ = Config::take_warnings();
        assert!(Config::take_warnings().is_empty());
    }
}

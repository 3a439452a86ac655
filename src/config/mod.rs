//! Every environment variable the plugin reads, parsed once per process into [`Config`]: the
//! names ([`vars`]), the reader that applies the warning rules ([`reader`]), the value parsers and
//! printers ([`parse`]), and the export settings' resolution through the standard OpenTelemetry
//! variables ([`chain`]).
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

mod chain;
mod parse;
mod reader;
#[cfg(test)]
mod tests;
pub mod vars;

pub use vars::*;

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::time::Duration;

use parking_lot::Mutex;

use crate::aggregate::regression::Mode;
use crate::record::handle::MAX_LANE_SLOTS;
use parse::{
    BOOL, parse_auto_bool, parse_bool, parse_event_mask, parse_every, parse_millis, parse_secs_in, parse_u32_in,
    show_auto_bool, show_bool, show_compression, show_every, show_exporter, show_families, show_histograms, show_mask,
    show_millis, show_mode, show_protocol, show_secs, show_temporality, show_u32,
};
use reader::Reader;

/// The effective configuration. Defaults: [`Config::default`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// [`ENABLE`], default `true`.
    pub enable: bool,
    /// [`TELEMETRY_ENABLE`], default `true`.
    pub telemetry_enable: bool,
    /// [`TELEMETRY_INTERVAL_SEC`], [`otel::METRIC_EXPORT_INTERVAL`], default 5 s, valid
    /// 0.01..=3600 s.
    pub interval: Duration,
    /// [`HANG_THRESHOLD_SEC`], default 30 s, valid 0.1..=86400 s.
    pub hang_threshold: Duration,
    /// [`LINEAR_REGRESSION_MODE`], default [`Mode::Avg`].
    pub regression_mode: Mode,
    /// [`EVENT_MASK`], default Coll|P2p|ProxyOp|ProxyStep|KernelCh = 0x5E, bits 0..=15 only.
    pub event_mask: i32,
    /// [`KERNEL_CH_EVERY`]: `None` (`auto`, the default) leaves it to the NCCL release
    /// ([`crate::activation::default_every`]); else 1..=1000.
    pub kernel_ch_every: Option<u32>,
    /// [`V7_EXTENSIONS`]: `None` (`auto`, the default) reads them on NCCL 2.31 only.
    pub v7_extensions: Option<bool>,
    /// [`WINDOW_CAPACITY`], default 100000, valid 1024..=[`MAX_LANE_SLOTS`].
    pub capacity: u32,
    /// [`WINDOW_COUNT_TRIGGER`], default min(15000, capacity/2), valid 1..=capacity.
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

/// Compression of OTLP request bodies ([`otel::COMPRESSION`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// gzip (`Content-Encoding: gzip`, gRPC `grpc-encoding: gzip`).
    Gzip,
    /// Uncompressed.
    None,
}

/// How histograms are aggregated ([`otel::HISTOGRAM_AGGREGATION`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Histograms {
    /// Explicit buckets (the catalogue's boundaries, `docs/metrics.md`).
    Explicit,
    /// Base-2 exponential buckets (at most 160 per point, scale at most 20): Prometheus' native
    /// histograms.
    Exponential,
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
    /// [`EXPORTER`], default [`Exporter::Otlp`] ([`Exporter::None`] when
    /// [`otel::SDK_DISABLED`] is true).
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
    /// [`otel::METRICS_COMPRESSION`], [`otel::COMPRESSION`], default [`Compression::Gzip`].
    pub compression: Compression,
    /// [`otel::TEMPORALITY`], default [`Temporality::Cumulative`].
    pub temporality: Temporality,
    /// [`EXPORT_FILE`], default [`DEFAULT_EXPORT_FILE`].
    pub file: String,
    /// [`EXPORT_QUEUE`], default 8, valid 1..=1024.
    pub queue: u32,
    /// [`CARDINALITY_LIMIT`], default 2000, valid 1..=1000000.
    pub cardinality_limit: u32,
    /// [`DROP_METRICS`]: families of [`METRIC_FAMILIES`] not exported, default none.
    pub dropped: Vec<&'static str>,
    /// [`otel::HISTOGRAM_AGGREGATION`], default [`Histograms::Explicit`].
    pub histograms: Histograms,
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
            otel::METRIC_EXPORT_INTERVAL,
            Duration::from_secs(5),
            "an integer number of milliseconds in 10..=3600000",
            |s| parse_millis(s, 10..=3_600_000),
            show_millis,
        );
        let interval = r.read(
            TELEMETRY_INTERVAL_SEC,
            interval,
            "a number of seconds in 0.01..=3600",
            |s| parse_secs_in(s, 0.01..=3600.0),
            show_secs,
        );
        let hang_threshold = r.read(
            HANG_THRESHOLD_SEC,
            Duration::from_secs(30),
            "a number of seconds in 0.1..=86400",
            |s| parse_secs_in(s, 0.1..=86400.0),
            show_secs,
        );
        let regression_mode = r.read(LINEAR_REGRESSION_MODE, Mode::Avg, "AVG or MIN", Mode::parse, show_mode);
        let event_mask = r.read(
            EVENT_MASK,
            0x5E,
            "an event mask using only bits 0..=15 (0..=0xffff, decimal or 0x-hex)",
            parse_event_mask,
            show_mask,
        );
        let kernel_ch_every = r.read(
            KERNEL_CH_EVERY,
            None,
            "auto or an integer in 1..=1000",
            parse_every,
            show_every,
        );
        let v7_extensions = r.read(
            V7_EXTENSIONS,
            None,
            "auto or a boolean (1/0, true/false, yes/no, on/off)",
            parse_auto_bool,
            show_auto_bool,
        );
        let capacity = r.read(
            WINDOW_CAPACITY,
            100_000,
            &format!("an integer in 1024..={MAX_LANE_SLOTS}"),
            |s| parse_u32_in(s, 1024..=MAX_LANE_SLOTS),
            show_u32,
        );
        let count_trigger = r.read(
            WINDOW_COUNT_TRIGGER,
            15_000.min(capacity / 2),
            &format!("an integer in 1..={capacity} (the window capacity)"),
            |s| parse_u32_in(s, 1..=capacity),
            show_u32,
        );
        let export = r.export();
        let config = Config {
            enable,
            telemetry_enable,
            interval,
            hang_threshold,
            regression_mode,
            event_mask,
            kernel_ch_every,
            v7_extensions,
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
            show_secs(self.hang_threshold),
            show_mode(self.regression_mode),
            show_mask(self.event_mask),
            show_every(self.kernel_ch_every),
            show_auto_bool(self.v7_extensions),
            show_u32(self.capacity),
            show_u32(self.count_trigger),
            show_exporter(e.exporter),
            e.endpoint.clone(),
            show_millis(e.timeout),
            e.file.clone(),
            show_u32(e.queue),
            show_u32(e.cardinality_limit),
            show_families(&e.dropped),
        ];
        let mut line = format!("nccl-profiler-otel {}:", env!("CARGO_PKG_VERSION"));
        let standard = [
            (otel::METRICS_PROTOCOL, show_protocol(e.protocol)),
            (otel::METRICS_COMPRESSION, show_compression(e.compression)),
            (otel::TEMPORALITY, show_temporality(e.temporality)),
            (otel::HISTOGRAM_AGGREGATION, show_histograms(e.histograms)),
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

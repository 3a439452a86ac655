//! Every environment variable the plugin reads, parsed once per process into [`Config`]: the
//! table of our variables and the names of the others ([`vars`]), the reader that applies the
//! warning rules ([`reader`]), the value parsers and printers ([`parse`]), the resolution of the
//! standard OpenTelemetry variables ([`chain`]), the launcher's identity ([`launcher`]) and the
//! regression mode ([`Mode`]).
//!
//! [`Config::from_lookup`] takes a lookup function and returns the configuration plus one warning
//! per bad variable ([`Config::read`] also the [`Problem`] each reports, which the self-telemetry
//! exports); its only I/O is reading the CA file named by [`TLS_STANDARD`] (cargo feature
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
//!
//! Adding a variable of ours is its row in [`vars`] and its field here: the row writes the default,
//! parses and shows the value, and documents it (`docs/configuration.md`'s table is rendered from
//! the rows; a unit test fails on drift, `BLESS=1` rewrites it).
#![forbid(unsafe_code)]

mod chain;
mod launcher;
mod mode;
mod parse;
mod reader;
#[cfg(test)]
mod tests;
pub mod vars;

pub use mode::Mode;
pub use reader::Problem;
pub use vars::*;

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::time::Duration;

use parking_lot::Mutex;

use parse::{show_compression, show_histograms, show_protocol, show_temporality};
use reader::Reader;
use vars::{Fallback, VARS};

/// A placeholder value of a field, which the standard variables' chain or a row's default
/// overwrites before [`Config::from_lookup`] returns.
trait Blank {
    /// The placeholder.
    fn blank() -> Self;
}

/// [`Blank`] for field types: `type => placeholder`.
macro_rules! blank {
    ($($ty:ty => $value:expr),* $(,)?) => {
        $(impl Blank for $ty {
            fn blank() -> Self {
                $value
            }
        })*
    };
}

blank!(
    bool => false,
    u32 => 0,
    i32 => 0,
    Duration => Duration::ZERO,
    String => String::new(),
    Mode => Mode::Avg,
    Exporter => Exporter::None,
    Protocol => Protocol::HttpProtobuf,
    Compression => Compression::None,
    Temporality => Temporality::Cumulative,
    Histograms => Histograms::Explicit,
    Detail => Detail::Basic,
);

impl<T> Blank for Option<T> {
    fn blank() -> Self {
        None
    }
}

impl<T> Blank for Vec<T> {
    fn blank() -> Self {
        Vec::new()
    }
}

/// Declares a struct of settings and its [`Blank`]: every field's placeholder, so a new field
/// needs no line anywhere else to be constructed.
macro_rules! settings {
    ($(#[$meta:meta])* pub struct $name:ident { $($(#[$field_meta:meta])* pub $field:ident: $ty:ty,)* }) => {
        $(#[$meta])*
        pub struct $name {
            $($(#[$field_meta])* pub $field: $ty,)*
        }

        impl Blank for $name {
            fn blank() -> Self {
                Self { $($field: Blank::blank(),)* }
            }
        }
    };
}

settings! {
/// The effective configuration. Defaults: [`Config::default`]. A field of ours is documented,
/// with its default and range, by its variable's row in [`vars`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// [`ENABLE`], default `true`.
    pub enable: bool,
    /// [`TELEMETRY_ENABLE`], default `true`.
    pub telemetry_enable: bool,
    /// [`TELEMETRY_INTERVAL_SEC`], else [`otel::METRIC_EXPORT_INTERVAL`].
    pub interval: Duration,
    /// [`HANG_THRESHOLD_SEC`].
    pub hang_threshold: Duration,
    /// [`LINEAR_REGRESSION_MODE`].
    pub regression_mode: Mode,
    /// [`EVENT_MASK`].
    pub event_mask: i32,
    /// [`KERNEL_CH_EVERY`]: `None` (`auto`) leaves it to the NCCL release
    /// ([`crate::activation::default_every`]).
    pub kernel_ch_every: Option<u32>,
    /// [`V7_EXTENSIONS`]: `None` (`auto`) reads them on NCCL 2.31 only.
    pub v7_extensions: Option<bool>,
    /// [`WINDOW_CAPACITY`].
    pub capacity: u32,
    /// [`WINDOW_COUNT_TRIGGER`].
    pub count_trigger: u32,
    /// Export settings.
    pub export: Export,
}
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

/// Which metric families are exported ([`DETAIL`]), before [`DROP_METRICS`] leaves out more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detail {
    /// Every family but [`Detail::FULL_ONLY`]: what the dashboard and the rules read.
    Basic,
    /// Every family.
    Full,
}

impl Detail {
    /// The families of [`METRIC_FAMILIES`] that only [`Detail::Full`] exports: per channel and
    /// per transfer.
    pub const FULL_ONLY: [&str; 2] = ["channel", "transfer"];
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

settings! {
/// Export settings, each resolved from our variable, then the standard ones, then the default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Export {
    /// [`EXPORTER`], else [`Exporter::None`] when [`otel::SDK_DISABLED`] is true.
    pub exporter: Exporter,
    /// [`otel::METRICS_PROTOCOL`], [`otel::PROTOCOL`], default [`Protocol::HttpProtobuf`].
    pub protocol: Protocol,
    /// The URL requests go to: [`TELEMETRY_ENDPOINT`], [`otel::METRICS_ENDPOINT`],
    /// [`otel::ENDPOINT`].
    pub endpoint: String,
    /// [`TELEMETRY_BATCH_TIMEOUT_MS`], [`otel::METRICS_TIMEOUT`], [`otel::TIMEOUT`].
    pub timeout: Duration,
    /// [`otel::HEADERS`] overlaid with [`otel::METRICS_HEADERS`], sorted by key.
    pub headers: Vec<(String, String)>,
    /// [`otel::METRICS_COMPRESSION`], [`otel::COMPRESSION`], default [`Compression::Gzip`].
    pub compression: Compression,
    /// [`otel::TEMPORALITY`], default [`Temporality::Cumulative`].
    pub temporality: Temporality,
    /// [`EXPORT_FILE`].
    pub file: String,
    /// [`EXPORT_QUEUE`].
    pub queue: u32,
    /// [`CARDINALITY_LIMIT`].
    pub cardinality_limit: u32,
    /// [`DETAIL`].
    pub detail: Detail,
    /// [`DROP_METRICS`]: families of [`METRIC_FAMILIES`] not exported.
    pub dropped: Vec<&'static str>,
    /// [`otel::HISTOGRAM_AGGREGATION`], default [`Histograms::Exponential`].
    pub histograms: Histograms,
    /// [`otel::SERVICE_NAME`], else `service.name` of [`otel::RESOURCE_ATTRIBUTES`], else the
    /// job's name or id from the launcher ([`LAUNCHER`]), else [`DEFAULT_SERVICE_NAME`].
    pub service_name: String,
    /// Launcher identity ([`LAUNCHER`]) overlaid with [`otel::RESOURCE_ATTRIBUTES`] (without
    /// `service.name`), with `service.namespace` = the job's id unless the user set it; sorted
    /// by key.
    pub resource: Vec<(String, String)>,
    /// The CA certificates trusted for an `https://` collector instead of the system's:
    /// [`otel::METRICS_CERTIFICATE`], [`otel::CERTIFICATE`]; default (and always without the
    /// cargo feature `tls`) `None`, the system roots.
    pub certificate: Option<CaFile>,
}
}

/// A PEM file of CA certificates, read when the configuration is loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaFile {
    /// The path, as given.
    pub path: String,
    /// Its contents: PEM, at least one certificate, each usable as a trust anchor.
    pub pem: Vec<u8>,
}

impl Export {
    /// The families of [`METRIC_FAMILIES`] not exported: [`Export::dropped`], and
    /// [`Detail::FULL_ONLY`] at [`Detail::Basic`]; in the table's order.
    /// Called on: the telemetry thread.
    #[must_use]
    pub fn left_out(&self) -> Vec<&'static str> {
        let basic = |f: &&str| self.detail == Detail::Basic && Detail::FULL_ONLY.contains(f);
        METRIC_FAMILIES
            .into_iter()
            .filter(|f| self.dropped.contains(f) || basic(f))
            .collect()
    }

    /// The value of resource attribute `key` in [`Export::resource`].
    /// Called on: the telemetry thread, the exporter thread.
    #[must_use]
    pub fn attribute(&self, key: &str) -> Option<&str> {
        attribute(&self.resource, key)
    }
}

/// The value of attribute `key` in `resource`.
fn attribute<'a>(resource: &'a [(String, String)], key: &str) -> Option<&'a str> {
    resource.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
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
    problems: Vec<Problem>,
}

static GLOBAL: OnceLock<Loaded> = OnceLock::new();

impl Config {
    /// Parses every variable in [`ALL`], [`STANDARD`] and (cargo feature `tls`) [`TLS_STANDARD`]
    /// through `lookup`: first the standard ones, then the rows of [`vars`] in order. Returns the
    /// configuration and one warning per variable whose value was rejected:
    /// `VAR='value' is not <what>; using default <d>`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> (Config, Vec<String>) {
        let (config, warnings, _) = Self::read(lookup);
        (config, warnings)
    }

    /// [`Config::from_lookup`], with the problems its warnings report: one per rejected value
    /// or list with unknown entries (a note, such as an endpoint taken as `http://`, is none).
    pub fn read(lookup: impl Fn(&str) -> Option<String>) -> (Config, Vec<String>, Vec<Problem>) {
        let mut r = Reader {
            lookup,
            warnings: Vec::new(),
            problems: Vec::new(),
        };
        let mut config = Config::blank();
        r.standard(&mut config);
        for var in VARS {
            if let Fallback::Value(default) = var.fallback {
                default(&mut config);
            }
            r.apply(var, &mut config);
        }
        (config, r.warnings, r.problems)
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

    /// The problems found while loading [`Config::global`], for the self-telemetry.
    /// Called on: telemetry thread.
    pub fn problems() -> &'static [Problem] {
        &Self::loaded().problems
    }

    fn loaded() -> &'static Loaded {
        GLOBAL.get_or_init(|| {
            // Lossy: a non-UTF-8 value fails its parser and is reported, not taken as unset.
            let env = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
            let (config, warnings, problems) = Self::read(env);
            Loaded {
                config,
                warnings: Mutex::new(warnings),
                problems,
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
        let ours = VARS.iter().map(|var| (var.name, (var.show)(self)));
        for (name, value) in ours.chain(standard).chain(ca) {
            let _ = write!(line, " {name}={value}"); // a String never fails
        }
        line
    }
}

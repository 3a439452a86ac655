//! The standard OpenTelemetry variables, resolved before our rows are read: each level's default
//! is what the lower-priority levels resolved to, so a bad value warns once and leaves the rest of
//! the chain in force. Where one of ours overrides the result (the interval, exporter, endpoint and
//! timeout), its row keeps this value as its default. Header values are secrets: never logged.
//! The resource is the launcher's identity (`launcher.rs`) overlaid with the user's attributes.
#![forbid(unsafe_code)]

use std::time::Duration;

use super::parse::{
    BOOL, PROTOCOLS, URLS, accepted, millis_in, overlay, parse_bool, parse_compression, parse_endpoint,
    parse_histograms, parse_protocol, parse_temporality, show_bool, show_compression, show_histograms, show_millis,
    show_protocol, show_temporality,
};
#[cfg(feature = "tls")]
use super::parse::{read_ca_file, show_ca_file};
use super::reader::Reader;
use super::launcher;
use super::vars::{TIMEOUT_MILLIS, otel};
use super::{Compression, Config, Exporter, Histograms, Protocol, Temporality};

impl<L: Fn(&str) -> Option<String>> Reader<L> {
    /// Every setting the standard variables decide, into `config`.
    pub(super) fn standard(&mut self, config: &mut Config) {
        config.interval = self.read(
            otel::METRIC_EXPORT_INTERVAL,
            Duration::from_secs(5),
            |s| millis_in(s, 10..=3_600_000),
            show_millis,
        );
        let e = &mut config.export;
        let disabled = self.read(otel::SDK_DISABLED, false, |s| accepted(parse_bool(s), BOOL), show_bool);
        e.exporter = if disabled { Exporter::None } else { Exporter::Otlp };

        let protocol = |s: &str| accepted(parse_protocol(s), PROTOCOLS);
        e.protocol = self.read(otel::PROTOCOL, Protocol::HttpProtobuf, protocol, show_protocol);
        e.protocol = self.read(otel::METRICS_PROTOCOL, e.protocol, protocol, show_protocol);

        let endpoint = match e.protocol {
            Protocol::Grpc => "http://localhost:4317".to_owned(),
            Protocol::HttpProtobuf | Protocol::HttpJson => "http://localhost:4318/v1/metrics".to_owned(),
        };
        let base = |s: &str| accepted(parse_endpoint(s, e.protocol), URLS);
        let endpoint = self.read_owned(otel::ENDPOINT, endpoint, base, Clone::clone);
        let exact = |s: &str| accepted(parse_endpoint(s, Protocol::Grpc), URLS);
        e.endpoint = self.read_owned(otel::METRICS_ENDPOINT, endpoint, exact, Clone::clone);

        let millis = |s: &str| millis_in(s, TIMEOUT_MILLIS);
        e.timeout = self.read(otel::TIMEOUT, Duration::from_millis(3000), millis, show_millis);
        e.timeout = self.read(otel::METRICS_TIMEOUT, e.timeout, millis, show_millis);

        let compression = |s: &str| accepted(parse_compression(s), "gzip or none");
        e.compression = self.read(otel::COMPRESSION, Compression::Gzip, compression, show_compression);
        e.compression = self.read(otel::METRICS_COMPRESSION, e.compression, compression, show_compression);

        e.headers = overlay(
            self.read_pairs(otel::HEADERS, true),
            self.read_pairs(otel::METRICS_HEADERS, true),
        );
        #[cfg(feature = "tls")]
        {
            let valid = "a readable file of PEM CA certificates (at most 1 MiB)";
            let read = |s: &str| accepted(read_ca_file(s).map(Some), valid);
            e.certificate = self.read_owned(otel::CERTIFICATE, None, read, show_ca_file);
            e.certificate = self.read_owned(otel::METRICS_CERTIFICATE, e.certificate.take(), read, show_ca_file);
        }
        let temporality = |s: &str| accepted(parse_temporality(s), "cumulative, delta or lowmemory");
        e.temporality = self.read(
            otel::TEMPORALITY,
            Temporality::Cumulative,
            temporality,
            show_temporality,
        );
        let histograms = |s: &str| {
            let valid = "explicit_bucket_histogram or base2_exponential_bucket_histogram";
            accepted(parse_histograms(s), valid)
        };
        e.histograms = self.read(
            otel::HISTOGRAM_AGGREGATION,
            Histograms::Exponential,
            histograms,
            show_histograms,
        );

        let detected = launcher::detect(&self.lookup);
        e.resource = overlay(detected, self.read_pairs(otel::RESOURCE_ATTRIBUTES, false));
        let from_resource = e
            .resource
            .iter()
            .position(|(k, _)| k == "service.name")
            .map(|i| e.resource.remove(i).1);
        let detected_name = launcher::complete(&mut e.resource);
        e.service_name = self.read_owned(
            otel::SERVICE_NAME,
            from_resource.unwrap_or(detected_name),
            |s| Ok(s.to_owned()),
            Clone::clone,
        );
    }
}

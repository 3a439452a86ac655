//! The export settings, each resolved from our variable, then the standard OpenTelemetry ones,
//! then the default: each level's default is what the lower-priority levels resolved to, so a bad
//! value warns once and leaves the rest of the chain in force. Header values are secrets: never
//! logged.
#![forbid(unsafe_code)]

use std::time::Duration;

use super::parse::{
    BOOL, overlay, parse_bool, parse_compression, parse_endpoint, parse_exporter, parse_families, parse_file_pattern,
    parse_histograms, parse_millis, parse_protocol, parse_temporality, parse_u32_in, show_bool, show_compression,
    show_exporter, show_families, show_histograms, show_millis, show_protocol, show_temporality, show_u32,
};
#[cfg(feature = "tls")]
use super::parse::{read_ca_file, show_ca_file};
use super::reader::Reader;
use super::vars::{
    CARDINALITY_LIMIT, DEFAULT_EXPORT_FILE, DEFAULT_SERVICE_NAME, DROP_METRICS, EXPORT_FILE, EXPORT_QUEUE, EXPORTER,
    LAUNCHER, METRIC_FAMILIES, TELEMETRY_BATCH_TIMEOUT_MS, TELEMETRY_ENDPOINT, otel,
};
use super::{Compression, Export, Exporter, Histograms, Protocol, Temporality};

impl<L: Fn(&str) -> Option<String>> Reader<L> {
    /// Every export setting.
    pub(super) fn export(&mut self) -> Export {
        let disabled = self.read(otel::SDK_DISABLED, false, BOOL, parse_bool, show_bool);
        let exporter = self.read(
            EXPORTER,
            if disabled { Exporter::None } else { Exporter::Otlp },
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
        let parse = |s: &str| parse_millis(s, 1..=60_000);
        let timeout = Duration::from_millis(3000);
        let timeout = self.read(otel::TIMEOUT, timeout, millis, parse, show_millis);
        let timeout = self.read(otel::METRICS_TIMEOUT, timeout, millis, parse, show_millis);
        let timeout = self.read(TELEMETRY_BATCH_TIMEOUT_MS, timeout, millis, parse, show_millis);

        let gzip_or_none = "gzip or none";
        let compression = Compression::Gzip;
        let compression = self.read(
            otel::COMPRESSION,
            compression,
            gzip_or_none,
            parse_compression,
            show_compression,
        );
        let compression = self.read(
            otel::METRICS_COMPRESSION,
            compression,
            gzip_or_none,
            parse_compression,
            show_compression,
        );

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
            "a path whose only % sequences are %h, %p, %r, %j and %%",
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

        let families = format!(
            "none or metric families among {} separated by commas",
            METRIC_FAMILIES.join(",")
        );
        let dropped = self.read_owned(DROP_METRICS, Vec::new(), &families, parse_families, |v| {
            show_families(v)
        });
        let histograms = self.read(
            otel::HISTOGRAM_AGGREGATION,
            Histograms::Explicit,
            "explicit_bucket_histogram or base2_exponential_bucket_histogram",
            parse_histograms,
            show_histograms,
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
            compression,
            temporality,
            file,
            queue,
            cardinality_limit,
            dropped,
            histograms,
            service_name,
            resource,
            certificate,
        }
    }
}

//! The exporter thread (`nccl-otel-export`, ours, one per process): builds the sender once, then
//! sends each queued request in order: OTLP over HTTP with reqwest's blocking client, OTLP over
//! gRPC on a tokio runtime private to this thread (cargo feature `grpc`), or OTLP-JSON lines to a
//! file or stdout. Retries are off: each request takes at most the export timeout, and the next
//! interval's request supersedes it. Called on: the exporter thread only.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::future::Future;
use std::io::Write as _;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter as _;

use super::queue;
use super::resource::host_name;
use super::sdk_temporality;
use crate::config::{self, Exporter, Protocol};
use crate::stats::STATS;

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
pub fn run_exporter(config: &config::Export) {
    let mut sender = build_sender(config);
    loop {
        let (seq, rm) = queue::next();
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
        queue::finish(seq, result);
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

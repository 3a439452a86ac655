//! The exporter thread (`nccl-otel-export`, ours, one per process): builds the sender once, then
//! sends each queued request in order: OTLP over HTTP with reqwest's blocking client, OTLP over
//! gRPC on a tokio runtime private to this thread (cargo feature `grpc`), or OTLP-JSON lines to a
//! file or stdout. OTLP bodies are gzip-compressed unless the configuration says `none`. Retries
//! are off: each request takes at most the export timeout, and the next interval's request
//! supersedes it. A failed HTTP request's error names its cause (refused, DNS, timeout: the HTTP
//! client's error chain, which the OTLP exporter reduces to "network error"). Called on: the
//! exporter thread only.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::future::Future;
use std::io::Write as _;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter as _;
use parking_lot::Mutex;

use super::queue;
use super::catalogue::keys;
use super::resource::host_name;
use super::sdk_temporality;
use crate::config::{self, Compression, Exporter, Protocol};
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
    /// Cause of the last failed HTTP request, from the HTTP client ([`Explained`]).
    cause: Arc<Mutex<Option<String>>>,
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
        Exporter::File => Ok(Sender::File(FileSink {
            path: file_path(config),
            file: None,
        })),
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
                f.file = Some(open_file(&f.path)?);
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
            let cause = Arc::new(Mutex::new(None));
            let client = Explained {
                client: client.build().map_err(|e| fail(&e))?,
                cause: cause.clone(),
            };
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
                .with_temporality(temporality);
            let exporter = match config.compression {
                Compression::Gzip => exporter.with_compression(opentelemetry_otlp::Compression::Gzip),
                // Explicitly none: the exporter would otherwise read the standard variables itself.
                Compression::None => exporter,
            };
            let exporter = exporter.build().map_err(|e| fail(&e))?;
            Ok(Otlp {
                exporter,
                timeout: config.timeout,
                cause,
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
            let builder = match config.compression {
                Compression::Gzip => builder.with_compression(opentelemetry_otlp::Compression::Gzip),
                Compression::None => builder,
            };
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
                cause: Arc::default(),
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
        self.cause.lock().take();
        block_on(self.exporter.export(rm)).map_err(|e| match self.cause.lock().take() {
            Some(cause) => format!("{e} ({cause})"),
            None => e.to_string(),
        })
    }
}

/// The HTTP client, keeping the cause of its last failure for [`Otlp::send`].
#[derive(Debug)]
struct Explained {
    client: reqwest::blocking::Client,
    cause: Arc<Mutex<Option<String>>>,
}

#[async_trait::async_trait]
impl HttpClient for Explained {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let response = self.client.send_bytes(request).await;
        if let Err(e) = &response {
            *self.cause.lock() = Some(error_chain(e.as_ref()));
        }
        response
    }
}

/// An error and its sources, outermost first, each once: `a: b: c`.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let message = s.to_string();
        if !out.contains(&message) {
            out.push_str(": ");
            out.push_str(&message);
        }
        source = s.source();
    }
    out
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

/// The file exporter's path for this process ([`expand_path`] with its host, pid, and the
/// launcher's rank and job from the resource: `job.rank`, `job.id`).
pub fn file_path(config: &config::Export) -> String {
    let values = PathValues {
        host: &host_name(),
        pid: std::process::id(),
        rank: config.attribute(keys::JOB_RANK.as_str()).unwrap_or("x"),
        job: config.attribute(keys::JOB_ID.as_str()).unwrap_or("x"),
    };
    expand_path(&config.file, &values)
}

/// Opens the file exporter's file for appending, creating it and its directories.
pub fn open_file(path: &str) -> Result<std::fs::File, String> {
    let parent = std::path::Path::new(path)
        .parent()
        .filter(|p| !p.as_os_str().is_empty());
    if let Some(dir) = parent {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("cannot open {path}: {e}"))
}

/// What the file exporter's placeholders stand for.
pub struct PathValues<'a> {
    /// `%h`.
    pub host: &'a str,
    /// `%p`.
    pub pid: u32,
    /// `%r` (`x` when the launcher set none).
    pub rank: &'a str,
    /// `%j` (`x` when the launcher set none).
    pub job: &'a str,
}

/// The file exporter's path: `%h` host, `%p` pid, `%r` rank, `%j` job, `%%` a percent sign.
pub fn expand_path(pattern: &str, values: &PathValues<'_>) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        match (c, c == '%') {
            (_, false) => out.push(c),
            (_, true) => match chars.next() {
                Some('h') => out.push_str(values.host),
                Some('p') => out.push_str(&values.pid.to_string()),
                Some('r') => out.push_str(values.rank),
                Some('j') => out.push_str(values.job),
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
        let v = PathValues {
            host: "node1",
            pid: 42,
            rank: "3",
            job: "77",
        };
        assert_eq!(expand_path("nccl-otel-%h-%p.jsonl", &v), "nccl-otel-node1-42.jsonl");
        assert_eq!(expand_path("/a/100%%/%p", &v), "/a/100%/42");
        assert_eq!(expand_path("x%", &v), "x%");
        assert_eq!(expand_path("/out/%j/rank-%r.jsonl", &v), "/out/77/rank-3.jsonl");
    }

    #[test]
    fn the_file_exporter_creates_its_directories() {
        let dir = std::env::temp_dir().join(format!("nccl-otel-open-{}", std::process::id()));
        let path = dir.join("a/b/c.jsonl");
        open_file(path.to_str().unwrap()).unwrap();
        assert!(path.is_file());
        let blocked = dir.join("a/b/c.jsonl/d.jsonl");
        let e = open_file(blocked.to_str().unwrap()).unwrap_err();
        assert!(e.starts_with("cannot create "), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
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

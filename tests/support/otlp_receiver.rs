//! A small OTLP metrics receiver for tests and examples: OTLP/HTTP (protobuf or JSON, plain or
//! gzip) on `127.0.0.1:0`, and OTLP/gRPC with the `grpc` feature; each over TLS too with the `tls`
//! feature. Requests are decoded with the official OTLP types (`opentelemetry-proto`) and kept in
//! arrival order.
//!
//! ```ignore
//! let rx = Receiver::start();                    // or start_grpc(), start_tls(..), start_grpc_tls(..)
//! std::env::set_var("NCCL_PROFILER_OTEL_TELEMETRY_ENDPOINT", rx.endpoint());
//! // ... run the plugin ...
//! rx.wait_for(Duration::from_secs(5), |reqs| find(reqs, "nccl.link.bytes").is_some());
//! for m in metrics(&rx.requests()) { println!("{} [{}]", m.name, m.unit); }
//! rx.set_fault(Fault::Status(503));             // then Fault::Healthy again
//! ```
//!
//! Faults: [`Fault::Refuse`] closes the listening socket (connections are refused) and reopens the
//! same port when the fault ends; [`Fault::Close`] accepts and closes without answering;
//! [`Fault::Hang`] reads the request and never answers (until the fault ends, then closes);
//! [`Fault::Status`] answers with that HTTP status (gRPC: `UNAVAILABLE` for 503, `INTERNAL`
//! otherwise). Over gRPC, `Refuse` and `Close` answer `UNAVAILABLE`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
pub use opentelemetry_proto::tonic::metrics::v1::{Metric, metric};
use prost::Message;

/// How the receiver answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Decode, keep, answer 200 (gRPC OK).
    Healthy,
    /// No listener: connections are refused.
    Refuse,
    /// Accept, then close without an answer.
    Close,
    /// Read the request and never answer.
    Hang,
    /// Answer with this HTTP status.
    Status(u16),
}

struct Shared {
    fault: Mutex<Fault>,
    requests: Mutex<Vec<ExportMetricsServiceRequest>>,
    arrived: Condvar,
    /// Requests seen, whatever the answer.
    attempts: AtomicU64,
    /// Requests that could not be decoded.
    bad: AtomicU64,
    /// Content types and paths of the requests, in order.
    seen: Mutex<Vec<(String, String)>>,
    /// Content encodings of the requests, in order (`""`: none).
    encodings: Mutex<Vec<String>>,
    stop: AtomicBool,
}

/// A running receiver. Dropping it stops accepting.
pub struct Receiver {
    endpoint: String,
    shared: Arc<Shared>,
}

impl Receiver {
    /// OTLP/HTTP on 127.0.0.1 (a free port).
    pub fn start() -> Receiver {
        Self::start_http("http", serve_connection)
    }

    /// OTLP/HTTP over TLS (`https://`) on 127.0.0.1 (a free port), presenting the certificate
    /// chain `cert_pem` (leaf first) with its private key `key_pem`.
    #[cfg(feature = "tls")]
    pub fn start_tls(cert_pem: &str, key_pem: &str) -> Receiver {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes()).collect::<Result<_, _>>();
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).expect("a private key in PEM");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain.expect("certificates in PEM"), key)
            .expect("a usable server certificate and key");
        let config = Arc::new(config);
        Self::start_http("https", move |stream, shared| {
            // A failed handshake ends the connection at the first read, before any request.
            if let Ok(tls) = rustls::ServerConnection::new(config.clone()) {
                serve_connection(rustls::StreamOwned::new(tls, stream), shared);
            }
        })
    }

    /// OTLP/HTTP on 127.0.0.1 (a free port); `serve` handles each accepted connection.
    fn start_http(scheme: &str, serve: impl Fn(TcpStream, Arc<Shared>) + Send + Sync + 'static) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared::new());
        let s = shared.clone();
        std::thread::Builder::new()
            .name("otlp-receiver".into())
            .spawn(move || accept_loop(listener, addr, s, Arc::new(serve)))
            .unwrap();
        Receiver {
            endpoint: format!("{scheme}://{addr}"),
            shared,
        }
    }

    /// OTLP/gRPC on 127.0.0.1 (a free port), served by tonic on its own thread.
    #[cfg(feature = "grpc")]
    pub fn start_grpc() -> Receiver {
        Self::start_grpc_with("http", |server| server)
    }

    /// OTLP/gRPC over TLS (`https://`) on 127.0.0.1 (a free port), presenting `cert_pem` (leaf
    /// first) with its private key `key_pem`.
    #[cfg(all(feature = "grpc", feature = "tls"))]
    pub fn start_grpc_tls(cert_pem: &str, key_pem: &str) -> Receiver {
        let identity = tonic::transport::Identity::from_pem(cert_pem, key_pem);
        let tls = tonic::transport::ServerTlsConfig::new().identity(identity);
        Self::start_grpc_with("https", move |server| {
            server.tls_config(tls).expect("a usable server certificate and key")
        })
    }

    /// OTLP/gRPC on 127.0.0.1 (a free port); `configure` adjusts tonic's server (TLS).
    #[cfg(feature = "grpc")]
    fn start_grpc_with(
        scheme: &str,
        configure: impl FnOnce(tonic::transport::Server) -> tonic::transport::Server + Send + 'static,
    ) -> Receiver {
        let shared = Arc::new(Shared::new());
        let (tx, rx) = std::sync::mpsc::channel();
        let s = shared.clone();
        std::thread::Builder::new()
            .name("otlp-receiver-grpc".into())
            .spawn(move || grpc::serve(s, tx, configure))
            .unwrap();
        let addr = rx.recv().expect("gRPC receiver started");
        Receiver {
            endpoint: format!("{scheme}://{addr}"),
            shared,
        }
    }

    /// Base URL (`http://127.0.0.1:PORT`, or `https://`); OTLP/HTTP clients append `/v1/metrics`.
    pub fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    /// Every decoded request so far, in arrival order.
    pub fn requests(&self) -> Vec<ExportMetricsServiceRequest> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// Takes the decoded requests (later calls see only newer ones).
    pub fn take(&self) -> Vec<ExportMetricsServiceRequest> {
        std::mem::take(&mut *self.shared.requests.lock().unwrap())
    }

    /// Waits until `done(requests so far)` holds or `timeout` passes; returns whether it held.
    pub fn wait_for(&self, timeout: Duration, done: impl Fn(&[ExportMetricsServiceRequest]) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut reqs = self.shared.requests.lock().unwrap();
        loop {
            if done(&reqs) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            reqs = self.shared.arrived.wait_timeout(reqs, left).unwrap().0;
        }
    }

    /// Changes how later requests are answered.
    pub fn set_fault(&self, fault: Fault) {
        *self.shared.fault.lock().unwrap() = fault;
    }

    /// Requests received so far, whatever the answer (refused connections are not requests).
    pub fn attempts(&self) -> u64 {
        self.shared.attempts.load(Ordering::Relaxed)
    }

    /// Requests that arrived but did not decode as `ExportMetricsServiceRequest`.
    pub fn undecodable(&self) -> u64 {
        self.shared.bad.load(Ordering::Relaxed)
    }

    /// `(content type, path)` of every request so far (gRPC: `("application/grpc", "")`).
    pub fn seen(&self) -> Vec<(String, String)> {
        self.shared.seen.lock().unwrap().clone()
    }

    /// The content encoding of every request so far (HTTP `content-encoding`, gRPC
    /// `grpc-encoding`; `""` when uncompressed).
    pub fn encodings(&self) -> Vec<String> {
        self.shared.encodings.lock().unwrap().clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}

impl Shared {
    fn new() -> Shared {
        Shared {
            fault: Mutex::new(Fault::Healthy),
            requests: Mutex::new(Vec::new()),
            arrived: Condvar::new(),
            attempts: AtomicU64::new(0),
            bad: AtomicU64::new(0),
            seen: Mutex::new(Vec::new()),
            encodings: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        }
    }

    fn fault(&self) -> Fault {
        *self.fault.lock().unwrap()
    }

    fn keep(&self, request: ExportMetricsServiceRequest) {
        self.requests.lock().unwrap().push(request);
        self.arrived.notify_all();
    }
}

/// Accepts until stopped, each connection on a thread of its own running `serve`; drops the
/// listener while the fault is `Refuse` and binds the same port again after.
fn accept_loop(
    listener: TcpListener,
    addr: SocketAddr,
    shared: Arc<Shared>,
    serve: Arc<dyn Fn(TcpStream, Arc<Shared>) + Send + Sync>,
) {
    let mut listener = Some(listener);
    while !shared.stop.load(Ordering::Relaxed) {
        match (shared.fault(), listener.is_some()) {
            (Fault::Refuse, true) => listener = None,
            (Fault::Refuse, false) => {}
            (_, false) => listener = TcpListener::bind(addr).ok(),
            (_, true) => {}
        }
        let Some(l) = &listener else {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        };
        l.set_nonblocking(true).unwrap();
        match l.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).ok();
                stream.set_read_timeout(Some(Duration::from_secs(30))).ok();
                let (s, serve) = (shared.clone(), serve.clone());
                std::thread::spawn(move || serve(stream, s));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(2)),
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

/// One HTTP/1.1 connection, keep-alive: request after request until the client closes.
fn serve_connection(stream: impl Read + Write, shared: Arc<Shared>) {
    let mut reader = BufReader::new(stream);
    loop {
        let Some((path, headers, body)) = read_request(&mut reader) else {
            return;
        };
        shared.attempts.fetch_add(1, Ordering::Relaxed);
        let content_type = headers.get("content-type").cloned().unwrap_or_default();
        let encoding = headers.get("content-encoding").cloned().unwrap_or_default();
        let gzip = encoding.eq_ignore_ascii_case("gzip");
        shared.encodings.lock().unwrap().push(encoding);
        let body = if gzip { gunzip(&body).unwrap_or_default() } else { body };
        shared.seen.lock().unwrap().push((content_type.clone(), path));
        match shared.fault() {
            Fault::Refuse | Fault::Close => return,
            Fault::Hang => {
                let start = Instant::now();
                while shared.fault() == Fault::Hang && start.elapsed() < Duration::from_secs(60) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                return;
            }
            Fault::Status(code) => {
                let reply = format!("HTTP/1.1 {code} Fault\r\ncontent-length: 0\r\n\r\n");
                if send(reader.get_mut(), &reply).is_err() {
                    return;
                }
            }
            Fault::Healthy => {
                let decoded = if content_type.starts_with("application/json") {
                    serde_json::from_slice::<ExportMetricsServiceRequest>(&body).ok()
                } else {
                    ExportMetricsServiceRequest::decode(body.as_slice()).ok()
                };
                let (status, reply_type) = match decoded {
                    Some(request) => {
                        shared.keep(request);
                        ("200 OK", content_type.as_str())
                    }
                    None => {
                        shared.bad.fetch_add(1, Ordering::Relaxed);
                        ("400 Bad Request", "text/plain")
                    }
                };
                // An empty ExportMetricsServiceResponse: no bytes in protobuf, `{}` in JSON.
                let body = if reply_type.starts_with("application/json") {
                    "{}"
                } else {
                    ""
                };
                let reply = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: {reply_type}\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                if send(reader.get_mut(), &reply).is_err() {
                    return;
                }
            }
        }
    }
}

/// Writes `reply` out (through TLS, too).
fn send(out: &mut impl Write, reply: &str) -> std::io::Result<()> {
    out.write_all(reply.as_bytes())?;
    out.flush()
}

fn gunzip(body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(body).read_to_end(&mut out).ok()?;
    Some(out)
}

/// Reads one request: (path, lower-case headers, body). `None` at end of stream or on garbage.
fn read_request(reader: &mut impl BufRead) -> Option<(String, BTreeMap<String, String>, Vec<u8>)> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let path = line.split_whitespace().nth(1)?.to_owned();
    let mut headers = BTreeMap::new();
    loop {
        line.clear();
        reader.read_line(&mut line).ok()?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l.split_once(':')?;
        headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
    }
    let mut body = Vec::new();
    if headers
        .get("transfer-encoding")
        .is_some_and(|t| t.eq_ignore_ascii_case("chunked"))
    {
        loop {
            line.clear();
            reader.read_line(&mut line).ok()?;
            let size = usize::from_str_radix(line.trim().split(';').next()?, 16).ok()?;
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).ok()?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else {
        let len: usize = headers.get("content-length").map_or(Some(0), |v| v.parse().ok())?;
        body.resize(len, 0);
        reader.read_exact(&mut body).ok()?;
    }
    Some((path, headers, body))
}

#[cfg(feature = "grpc")]
mod grpc {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
        MetricsService, MetricsServiceServer,
    };
    use opentelemetry_proto::tonic::collector::metrics::v1::{
        ExportMetricsServiceRequest, ExportMetricsServiceResponse,
    };

    use super::{Fault, Shared};

    struct Service(Arc<Shared>);

    #[tonic::async_trait]
    impl MetricsService for Service {
        async fn export(
            &self,
            request: tonic::Request<ExportMetricsServiceRequest>,
        ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
            let shared = &self.0;
            shared.attempts.fetch_add(1, Ordering::Relaxed);
            let encoding = request.metadata().get("grpc-encoding").and_then(|e| e.to_str().ok());
            shared
                .encodings
                .lock()
                .unwrap()
                .push(encoding.unwrap_or_default().to_owned());
            shared
                .seen
                .lock()
                .unwrap()
                .push(("application/grpc".into(), String::new()));
            match shared.fault() {
                Fault::Healthy => {
                    shared.keep(request.into_inner());
                    Ok(tonic::Response::new(ExportMetricsServiceResponse {
                        partial_success: None,
                    }))
                }
                Fault::Hang => {
                    let start = Instant::now();
                    while shared.fault() == Fault::Hang && start.elapsed() < Duration::from_secs(60) {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(tonic::Status::unavailable("hung"))
                }
                Fault::Status(500) => Err(tonic::Status::internal("fault")),
                Fault::Refuse | Fault::Close | Fault::Status(_) => Err(tonic::Status::unavailable("fault")),
            }
        }
    }

    pub(super) fn serve(
        shared: Arc<Shared>,
        started: std::sync::mpsc::Sender<std::net::SocketAddr>,
        configure: impl FnOnce(tonic::transport::Server) -> tonic::transport::Server,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            started.send(listener.local_addr().unwrap()).unwrap();
            let incoming = tonic::transport::server::TcpIncoming::from(listener);
            configure(tonic::transport::Server::builder())
                .add_service(
                    MetricsServiceServer::new(Service(shared))
                        .accept_compressed(tonic::codec::CompressionEncoding::Gzip),
                )
                .serve_with_incoming(incoming)
                .await
                .unwrap();
        });
    }
}

// ---------------------------------------------------------------------------------------------
// Reading what arrived.

/// Every metric of every request, in order (a name appears once per request it is in).
pub fn metrics(requests: &[ExportMetricsServiceRequest]) -> Vec<&Metric> {
    requests
        .iter()
        .flat_map(|r| &r.resource_metrics)
        .flat_map(|rm| &rm.scope_metrics)
        .flat_map(|sm| &sm.metrics)
        .collect()
}

/// The last occurrence of metric `name` (with cumulative temporality: the latest totals).
pub fn find<'a>(requests: &'a [ExportMetricsServiceRequest], name: &str) -> Option<&'a Metric> {
    metrics(requests).into_iter().rev().find(|m| m.name == name)
}

/// One data point, flattened: attributes as strings, and the value(s).
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// Attributes, values rendered as strings (ints and bools by `to_string`).
    pub attrs: BTreeMap<String, String>,
    /// Gauge or sum value (ints converted); histogram sum.
    pub value: f64,
    /// Histogram count (0 otherwise).
    pub count: u64,
    /// Explicit histogram bucket counts (empty otherwise).
    pub buckets: Vec<u64>,
    /// Histogram explicit bounds (empty otherwise).
    pub bounds: Vec<f64>,
    /// `time_unix_nano`: when it was collected.
    pub time: u64,
}

/// What kind of data a metric carries: `gauge`, `sum` (with monotonic flag and temporality),
/// `histogram` (with temporality).
pub fn kind(m: &Metric) -> String {
    match &m.data {
        Some(metric::Data::Gauge(_)) => "gauge".into(),
        Some(metric::Data::Sum(s)) => format!(
            "sum(monotonic={}, temporality={})",
            s.is_monotonic, s.aggregation_temporality
        ),
        Some(metric::Data::Histogram(h)) => format!("histogram(temporality={})", h.aggregation_temporality),
        Some(metric::Data::ExponentialHistogram(_)) => "exponential_histogram".into(),
        Some(metric::Data::Summary(_)) => "summary".into(),
        None => "none".into(),
    }
}

/// The data points of a metric.
pub fn points(m: &Metric) -> Vec<Point> {
    use opentelemetry_proto::tonic::metrics::v1::NumberDataPoint;
    use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value;
    let number = |p: &NumberDataPoint| Point {
        attrs: attrs(&p.attributes),
        value: match p.value {
            Some(Value::AsDouble(d)) => d,
            Some(Value::AsInt(i)) => i as f64,
            None => f64::NAN,
        },
        count: 0,
        buckets: vec![],
        bounds: vec![],
        time: p.time_unix_nano,
    };
    // Without buckets (an exponential histogram's are not kept).
    let histogram = |attributes: &[KeyValue], sum: Option<f64>, count, time| Point {
        attrs: attrs(attributes),
        value: sum.unwrap_or(f64::NAN),
        count,
        buckets: vec![],
        bounds: vec![],
        time,
    };
    match &m.data {
        Some(metric::Data::Gauge(g)) => g.data_points.iter().map(number).collect(),
        Some(metric::Data::Sum(s)) => s.data_points.iter().map(number).collect(),
        Some(metric::Data::Histogram(h)) => h
            .data_points
            .iter()
            .map(|p| Point {
                buckets: p.bucket_counts.clone(),
                bounds: p.explicit_bounds.clone(),
                ..histogram(&p.attributes, p.sum, p.count, p.time_unix_nano)
            })
            .collect(),
        Some(metric::Data::ExponentialHistogram(h)) => h
            .data_points
            .iter()
            .map(|p| histogram(&p.attributes, p.sum, p.count, p.time_unix_nano))
            .collect(),
        _ => vec![],
    }
}

/// Attributes as a sorted map of strings.
pub fn attrs(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), value_string(kv.value.as_ref())))
        .collect()
}

fn value_string(v: Option<&AnyValue>) -> String {
    match v.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

/// Resource attributes of the first request.
pub fn resource(requests: &[ExportMetricsServiceRequest]) -> BTreeMap<String, String> {
    requests
        .first()
        .and_then(|r| r.resource_metrics.first())
        .and_then(|rm| rm.resource.as_ref())
        .map(|r| attrs(&r.attributes))
        .unwrap_or_default()
}

/// A plain-text table of the latest value of every metric (name, unit, kind, attributes, value):
/// what an example prints.
pub fn table(requests: &[ExportMetricsServiceRequest]) -> String {
    let mut latest: BTreeMap<String, &Metric> = BTreeMap::new();
    for m in metrics(requests) {
        latest.insert(m.name.clone(), m);
    }
    let mut out = String::new();
    for (name, m) in latest {
        for p in points(m) {
            let attrs: Vec<String> = p.attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let value = if p.buckets.is_empty() {
                format!("{:.6e}", p.value)
            } else {
                format!("count={} sum={:.6e}", p.count, p.value)
            };
            out.push_str(&format!("{name} [{}] {} {}\n", m.unit, attrs.join(","), value));
        }
    }
    out
}

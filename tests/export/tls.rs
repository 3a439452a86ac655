//! OTLP over TLS end to end (cargo feature `tls`): a CA and a server certificate for `localhost`
//! and 127.0.0.1 made at test time, and the in-test receiver serving `https://` (OTLP/HTTP
//! protobuf; gRPC too with the `grpc` feature). With the CA in `OTEL_EXPORTER_OTLP_CERTIFICATE` the
//! scripted workload arrives complete, on a host without system roots (`SSL_CERT_FILE` and
//! `SSL_CERT_DIR` naming an empty file), as it does over plain `http://` there. With the system
//! roots only (the variable unset, or naming a file that holds no certificate: one WARN), every
//! export fails its handshake and is counted, the failure is logged, `finalize` stays within its
//! bound and a later communicator works.
//!
//! The configuration is read once per process, so each case runs the workload in a child process
//! (this binary again, [`CHILD`] naming the case) against a receiver in the parent.
//!
//! Run with `cargo test --features grpc,tls --test export tls::`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::support::emulator::Plugin;
use crate::support::export as sx;
use crate::support::otlp_receiver::Receiver;
use crate::support::{emulator, process};
use nccl_profiler_otel::config::otel;
use nccl_profiler_otel::export;

/// Environment variable telling a re-executed test binary which case its child runs.
const CHILD: &str = "EXPORT_TLS_CHILD";
const TIMEOUT_MS: u64 = 1000;
/// What the last `finalize` may take: the timeout, the flush margin, slack for a loaded machine.
const FLUSH_BOUND: Duration = Duration::from_millis(TIMEOUT_MS + 250 + 400);
/// The communicator of the child's workload.
const TRUTH: sx::Truth = sx::Truth {
    hash: 0x7150_0001,
    name: "tls",
    rank: 0,
};

/// A CA, and a server certificate it signed for `localhost` and 127.0.0.1.
struct Pki {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

impl Pki {
    fn new() -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "nccl-profiler-otel test CA");
        let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
        let key = KeyPair::generate().unwrap();
        let mut server = CertificateParams::new(["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert_pem = server.signed_by(&key, &Issuer::new(ca, ca_key)).unwrap().pem();
        Pki {
            ca_pem,
            cert_pem,
            key_pem: key.serialize_pem(),
        }
    }
}

/// The variables that leave a child without system roots, given an empty file.
fn no_system_roots(empty: &Scratch) -> [(&str, &str); 2] {
    [("SSL_CERT_FILE", empty.path()), ("SSL_CERT_DIR", empty.path())]
}

/// A file in the temporary directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str, contents: &str) -> Scratch {
        let path = std::env::temp_dir().join(format!("nccl-otel-tls-{}-{name}", std::process::id()));
        std::fs::write(&path, contents).unwrap();
        Scratch(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Runs the child `case` exporting to `endpoint` over `protocol`, with `vars` set and the
/// certificate variables otherwise unset; asserts it passed.
fn run_child(case: &str, protocol: &str, endpoint: &str, vars: &[(&str, &str)]) {
    let mut cmd = process::child(module_path!(), "child", CHILD, case);
    cmd.env("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        .env("NCCL_PROFILER_OTEL_TELEMETRY_ENDPOINT", endpoint)
        .env("NCCL_PROFILER_OTEL_TELEMETRY_BATCH_TIMEOUT_MS", TIMEOUT_MS.to_string())
        .env_remove(otel::CERTIFICATE)
        .env_remove(otel::METRICS_CERTIFICATE)
        .envs(vars.iter().copied());
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "child {case} over {protocol}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The workload arrives over `https://` with the CA given (and no system roots); without it (or
/// with a file holding no certificate) nothing arrives and the child sees the failures.
fn trusted_only_with_the_ca(rx: &Receiver, protocol: &str, endpoint: &str, ca: &Scratch) {
    let empty = Scratch::new(&format!("{}-empty", protocol.replace('/', "-")), "");
    let [file, dir] = no_system_roots(&empty);
    run_child(
        "trusted",
        protocol,
        endpoint,
        &[(otel::CERTIFICATE, ca.path()), file, dir],
    );
    let reqs = rx.take();
    assert!(sx::complete(&reqs, &TRUTH), "{} requests", reqs.len());
    sx::check(&reqs, &TRUTH);
    assert_eq!(rx.undecodable(), 0);
    let attempts = rx.attempts();

    run_child("untrusted", protocol, endpoint, &[]);
    let not_pem = Scratch::new(
        &format!("{}-not-pem", protocol.replace('/', "-")),
        "not a certificate\n",
    );
    run_child(
        "untrusted",
        protocol,
        endpoint,
        &[(otel::METRICS_CERTIFICATE, not_pem.path())],
    );
    assert!(rx.requests().is_empty(), "an untrusted collector got data");
    assert_eq!(rx.attempts(), attempts, "a request got through a failed handshake");
}

#[test]
fn http_protobuf_over_tls() {
    let Some(_serial) = sx::serial() else {
        return;
    };
    let pki = Pki::new();
    let ca = Scratch::new("http-ca.pem", &pki.ca_pem);
    let rx = Receiver::start_tls(&pki.cert_pem, &pki.key_pem);
    // By name: the certificate's DNS name is checked (the gRPC case checks its IP address).
    let endpoint = rx.endpoint().replace("127.0.0.1", "localhost");
    assert!(endpoint.starts_with("https://localhost:"), "{endpoint}");
    trusted_only_with_the_ca(&rx, "http/protobuf", &endpoint, &ca);
    sx::assert_protobuf_to_v1_metrics(&rx);
}

#[test]
fn plain_http_needs_no_system_roots() {
    let Some(_serial) = sx::serial() else {
        return;
    };
    let rx = Receiver::start();
    let empty = Scratch::new("plain-empty", "");
    run_child("trusted", "http/protobuf", &rx.endpoint(), &no_system_roots(&empty));
    let reqs = rx.requests();
    assert!(sx::complete(&reqs, &TRUTH), "{} requests", reqs.len());
    sx::check(&reqs, &TRUTH);
}

#[test]
#[cfg(feature = "grpc")]
fn grpc_over_tls() {
    let Some(_serial) = sx::serial() else {
        return;
    };
    let pki = Pki::new();
    let ca = Scratch::new("grpc-ca.pem", &pki.ca_pem);
    let rx = Receiver::start_grpc_tls(&pki.cert_pem, &pki.key_pem);
    let endpoint = rx.endpoint();
    assert!(endpoint.starts_with("https://127.0.0.1:"), "{endpoint}");
    trusted_only_with_the_ca(&rx, "grpc", &endpoint, &ca);
}

#[test]
#[ignore = "run by the other tests in a child process"]
fn child() {
    let Ok(case) = std::env::var(CHILD) else {
        return;
    };
    // SAFETY: the only test of this process; nothing else touches the environment.
    unsafe { sx::base_env(&[]) };
    let p = Plugin::in_process();
    match case.as_str() {
        "trusted" => trusted(&p),
        "untrusted" => untrusted(&p),
        other => panic!("unknown case {other}"),
    }
}

/// The workload, then the last `finalize`, which returns once its data is sent.
fn trusted(p: &Plugin) {
    let (c, _) = sx::workload(p, TRUTH.hash, TRUTH.name);
    let t = Instant::now();
    p.finalize(c.context);
    assert!(t.elapsed() < FLUSH_BOUND, "last finalize took {:?}", t.elapsed());
    let stats = export::stats();
    assert!(stats.exported >= 1 && stats.failures == 0, "{stats:?}");
}

/// Exports fail, are counted and logged; the job goes on.
fn untrusted(p: &Plugin) {
    // Open until the end: the plugin logs through NCCL's logger while a communicator lives.
    let (keeper, _) = p.init(Some("keeper"), TRUTH.hash + 1, 1, 2, 0);
    // Configuration lines come at INFO.
    let infos: Vec<String> = emulator::logger::lines()
        .into_iter()
        .filter(|l| l.level == 3)
        .map(|l| l.text)
        .collect();
    let bad_file = std::env::var(otel::METRICS_CERTIFICATE).ok();
    let expected: Vec<String> = bad_file
        .iter()
        .map(|path| {
            format!(
                "{}='{path}' is not a readable file of PEM CA certificates (at most 1 MiB); using \
                 default (the system roots)",
                otel::METRICS_CERTIFICATE
            )
        })
        .collect();
    let config: Vec<&String> = infos.iter().filter(|w| w.contains("_CERTIFICATE")).collect();
    assert_eq!(config.len(), expected.len(), "{infos:?}");
    assert!(config.iter().zip(&expected).all(|(w, e)| w.ends_with(e)), "{infos:?}");

    let (c, _) = sx::workload(p, TRUTH.hash, TRUTH.name);
    p.finalize(c.context);
    let failed = || {
        let stats = export::stats();
        let logged = emulator::logger::warnings()
            .iter()
            .any(|w| w.contains("metrics export to") && w.contains("failed"));
        stats.failures >= 1 && logged
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    while !failed() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(failed(), "{:?} {:?}", export::stats(), emulator::logger::warnings());
    let t = Instant::now();
    p.finalize(keeper.context);
    assert!(t.elapsed() < FLUSH_BOUND, "last finalize took {:?}", t.elapsed());

    // A later communicator records and finalizes within the bound; its export fails too.
    let failures = export::stats().failures;
    let (c2, _) = sx::workload(p, TRUTH.hash + 2, "tls-again");
    let t = Instant::now();
    p.finalize(c2.context);
    assert!(t.elapsed() < FLUSH_BOUND, "last finalize took {:?}", t.elapsed());
    let deadline = Instant::now() + Duration::from_secs(3);
    while export::stats().failures == failures && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let stats = export::stats();
    assert!(stats.failures > failures && stats.exported == 0, "{stats:?}");
}

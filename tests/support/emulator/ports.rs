//! The test suite never exports to a port of the machine it runs on: a collector or Prometheus
//! listening on its default port (4317, 4318, 9090) would receive the tests' series. Every
//! `init` through [`crate::support::emulator::Plugin`] checks, in the package's own test builds
//! (feature `testing`: its tests and benches, not the demo), the configuration the plugin reads
//! from this process's environment, and panics when it would export OTLP to such a port. A test
//! gives the plugin an in-test receiver, a file or no exporter, or [`closed_endpoint`].
//! Called on: the thread calling `init`.

use std::sync::OnceLock;

use nccl_profiler_otel::config::{Config, Exporter};

/// The default ports of an OpenTelemetry collector (gRPC, HTTP) and of Prometheus.
pub const DEFAULT_PORTS: [u16; 3] = [4317, 4318, 9090];

/// The endpoint the plugin would export to, per `lookup`, when it is on one of [`DEFAULT_PORTS`]
/// (or has no port: 80, any web server's).
pub fn default_endpoint(lookup: impl Fn(&str) -> Option<String>) -> Option<String> {
    let (config, _) = Config::from_lookup(lookup);
    let exports = config.enable && config.telemetry_enable && config.export.exporter == Exporter::Otlp;
    let endpoint = config.export.endpoint;
    let authority = endpoint
        .split("://")
        .nth(1)
        .unwrap_or_default()
        .split('/')
        .next()
        .unwrap_or_default();
    let port = authority
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse::<u16>().ok());
    (exports && port.is_none_or(|p| DEFAULT_PORTS.contains(&p))).then_some(endpoint)
}

/// Panics when the plugin, configured by `lookup`, would export to a default port.
pub fn refuse_default_endpoint(lookup: impl Fn(&str) -> Option<String>) {
    if let Some(endpoint) = default_endpoint(lookup) {
        panic!(
            "this test would export to {endpoint}, a default port of the machine it runs on: give it a \
             receiver of its own, NCCL_PROFILER_OTEL_EXPORTER=none or file, or emulator::ports::closed_endpoint()"
        );
    }
}

/// An OTLP/HTTP endpoint on 127.0.0.1 that refuses every connection: a TCP socket of this
/// process bound to a free port, never listening, open until the process exits.
pub fn closed_endpoint() -> String {
    static PORT: OnceLock<u16> = OnceLock::new();
    let port = PORT.get_or_init(|| {
        // SAFETY: plain socket calls on a descriptor this function owns; `addr` and `len` are a
        // valid `sockaddr_in` and its size for `bind` and `getsockname`.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
            let mut addr: libc::sockaddr_in = std::mem::zeroed();
            addr.sin_family = libc::AF_INET as libc::sa_family_t;
            addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
            let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let sa = (&raw mut addr).cast::<libc::sockaddr>();
            assert_eq!(libc::bind(fd, sa, len), 0, "bind: {}", std::io::Error::last_os_error());
            assert_eq!(libc::getsockname(fd, sa, &mut len), 0, "getsockname");
            u16::from_be(addr.sin_port) // the descriptor stays open: the port stays ours
        }
    });
    format!("http://127.0.0.1:{port}")
}

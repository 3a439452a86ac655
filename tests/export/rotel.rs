//! Interop with a real collector: the plugin exports OTLP/HTTP (gzip) to `rotel-agent` (PyPI
//! `rotel`), which forwards OTLP/HTTP to the in-test receiver; the workload of this process and of
//! a second one must arrive intact (ground truth, catalogue, resource), and no series of one
//! process may coincide with one of the other's (Prometheus keys a series by `service.name`,
//! `service.instance.id` and the point's attributes).
//!
//! Ignored by default: `.ci/export-interop.sh` installs rotel and runs
//! `ROTEL_AGENT=/path/to/rotel-agent cargo test --test export -- --ignored rotel::`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::emulator::Plugin;
use crate::support::export as sx;
use crate::support::otlp_receiver::{ExportMetricsServiceRequest, Receiver, attrs, points, resource};
use crate::support::process;

/// Environment variable telling a re-executed test binary to run the second process's workload.
const CHILD: &str = "EXPORT_ROTEL_CHILD";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Kills the collector when the test ends, however it ends.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Every series that arrived, as Prometheus would key it (`service.name`, `service.instance.id`,
/// metric, point attributes), with the `process.pid`s that sent points to it.
fn series(requests: &[ExportMetricsServiceRequest]) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for rm in requests.iter().flat_map(|r| &r.resource_metrics) {
        let res = rm.resource.as_ref().map(|r| attrs(&r.attributes)).unwrap_or_default();
        let get = |k: &str| res.get(k).cloned().unwrap_or_default();
        for m in rm.scope_metrics.iter().flat_map(|s| &s.metrics) {
            for p in points(m) {
                let key = format!(
                    "{} {} {} {:?}",
                    get("service.name"),
                    get("service.instance.id"),
                    m.name,
                    p.attrs
                );
                out.entry(key).or_default().insert(get("process.pid"));
            }
        }
    }
    out
}

#[test]
#[ignore = "run by metrics_arrive_intact_through_rotel in a child process"]
fn second_process() {
    if sx::run_child(CHILD, "second", 0x2073_0002, "rotel-2") {
        assert_eq!(nccl_profiler_otel::export::stats().failures, 0);
    }
}

#[test]
#[ignore = "needs rotel-agent: run through .ci/export-interop.sh"]
fn metrics_arrive_intact_through_rotel() {
    let Some(_serial) = sx::own_process(module_path!(), "metrics_arrive_intact_through_rotel") else {
        return;
    };
    let agent = std::env::var("ROTEL_AGENT").expect("set ROTEL_AGENT to the rotel-agent binary");
    let rx = Receiver::start();
    let (grpc_port, http_port) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("nccl-otel-rotel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("rotel.log");
    let child = Command::new(&agent)
        .arg("start")
        .args(["--otlp-grpc-endpoint", &format!("127.0.0.1:{grpc_port}")])
        .args(["--otlp-http-endpoint", &format!("127.0.0.1:{http_port}")])
        .args(["--exporter", "otlp"])
        .args(["--otlp-exporter-endpoint", &rx.endpoint()])
        .args(["--otlp-exporter-protocol", "http"])
        .args(["--otlp-exporter-compression", "none"])
        .args(["--batch-timeout", "50ms"])
        .args(["--pid-file", dir.join("rotel.pid").to_str().unwrap()])
        .args(["--log-file", log.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {agent}: {e}"));
    let _agent = Agent(child);
    let deadline = Instant::now() + Duration::from_secs(15);
    while TcpStream::connect(("127.0.0.1", http_port)).is_err() {
        assert!(Instant::now() < deadline, "rotel-agent did not listen on {http_port}");
        std::thread::sleep(Duration::from_millis(50));
    }

    let endpoint = format!("http://127.0.0.1:{http_port}");
    // SAFETY: this process runs this test alone (`own_process`); nothing else touches the environment.
    unsafe {
        sx::base_env(&[
            ("NCCL_PROFILER_OTEL_TELEMETRY_ENDPOINT", endpoint.as_str()),
            ("SLURM_JOB_ID", "777"),
        ]);
    }
    let p = Plugin::in_process();
    let (c, truth) = sx::workload(&p, 0x2073_0001, "rotel");
    p.finalize(c.context);
    assert_eq!(
        nccl_profiler_otel::export::stats().failures,
        0,
        "export to rotel failed"
    );
    // A second process (same service.name, same job) through the same collector.
    let out = process::child(module_path!(), "second_process", CHILD, "second")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let truth2 = sx::Truth {
        hash: 0x2073_0002,
        name: "rotel-2",
        rank: 0,
    };
    let arrived = rx.wait_for(Duration::from_secs(15), |r| {
        sx::complete(r, &truth) && sx::complete(r, &truth2)
    });
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(arrived, "metrics did not come through rotel; its log:\n{log_text}");
    let reqs = rx.requests();
    assert_eq!(rx.undecodable(), 0);
    let series = series(&reqs);
    let shared: Vec<_> = series.iter().filter(|(_, pids)| pids.len() > 1).collect();
    assert!(shared.is_empty(), "series of both processes coincide: {shared:?}");
    let pids: BTreeSet<_> = series.values().flatten().collect();
    assert_eq!(pids.len(), 2, "{pids:?}");
    sx::check(&reqs, &truth);
    sx::check(&reqs, &truth2);
    sx::check_catalogue(&reqs);
    let res = resource(&reqs);
    assert_eq!(res["service.name"], "777");
    assert_eq!(res["job.id"], "777");
    assert_eq!(res["process.pid"], std::process::id().to_string());
    println!(
        "through rotel: {} requests, {} series of two processes, {:?}",
        reqs.len(),
        series.len(),
        rx.seen().first().map(|(ct, path)| format!("{ct} {path}"))
    );
    std::fs::remove_dir_all(dir).ok();
}

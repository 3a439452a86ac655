//! OTLP/HTTP export end to end: a scripted workload through the real exported `ncclProfiler_v4`
//! table, exported to an in-test OTLP/HTTP receiver and decoded with the official OTLP types.
//! Asserts names, units, instruments, attribute sets and values against the workload's ground
//! truth and `docs/metrics.md`, the resource, cumulative temporality, that the last `finalize`
//! returns only once its data has arrived (and within its bound), and that `HTTP_PROXY` does not
//! capture the loopback collector.

use std::time::{Duration, Instant};

use crate::support::emulator::Plugin;
use crate::support::export as sx;
use crate::support::otlp_receiver::{Receiver, find, kind, metrics, resource};
use crate::support::{otlp_receiver, process};

/// Tells a re-executed test binary to run the `http/json` child.
const CHILD: &str = "EXPORT_HTTP_CHILD";

#[test]
fn workload_arrives_with_the_documented_catalogue() {
    let Some(_serial) = sx::own_process(module_path!(), "workload_arrives_with_the_documented_catalogue") else {
        return;
    };
    let rx = Receiver::start();
    let endpoint = rx.endpoint();
    // SAFETY: this process runs this test alone (`own_process`); nothing else touches the environment.
    unsafe {
        sx::base_env(&[
            ("NCCL_PROFILER_OTEL_TELEMETRY_ENDPOINT", endpoint.as_str()),
            // A proxy that refuses everything: a loopback collector must bypass it.
            ("HTTP_PROXY", "http://127.0.0.1:9"),
            ("http_proxy", "http://127.0.0.1:9"),
            ("ALL_PROXY", "http://127.0.0.1:9"),
            ("SLURM_JOB_ID", "4242"),
            ("RANK", "3"),
            ("LOCAL_RANK", "1"),
            ("WORLD_SIZE", "8"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "team=ml%2Cinfra,deployment.environment=test",
            ),
            ("OTEL_SERVICE_NAME", ""),
        ]);
    }
    let p = Plugin::in_process();

    let (c, truth) = sx::workload(&p, 0xA11_0001, "dp");
    let t = Instant::now();
    p.finalize(c.context);
    let took = t.elapsed();
    assert!(
        took < Duration::from_millis(3000 + 250 + 500),
        "last finalize took {took:?}"
    );
    let reqs = rx.requests();
    assert!(
        sx::complete(&reqs, &truth),
        "the last finalize returned before its data arrived ({} requests)",
        reqs.len()
    );
    sx::check(&reqs, &truth);
    sx::check_catalogue(&reqs);

    // Transport: protobuf to /v1/metrics, every request decoded, none failed (the proxy was
    // bypassed).
    assert_eq!(rx.undecodable(), 0);
    sx::assert_protobuf_to_v1_metrics(&rx);
    assert!(
        rx.encodings().iter().all(|e| e == "gzip"),
        "gzip by default: {:?}",
        rx.encodings()
    );
    assert_eq!(
        nccl_profiler_otel::export::stats().failures,
        0,
        "export failed (proxy?)"
    );
    let failures = find(&reqs, "nccl.profiler.export.failures").expect("failures counter");
    assert_eq!(otlp_receiver::points(failures)[0].value, 0.0);

    // Cumulative temporality: monotonic sums and histograms with temporality 2.
    assert_eq!(
        kind(find(&reqs, "nccl.link.bytes").unwrap()),
        "sum(monotonic=true, temporality=2)"
    );
    assert_eq!(
        kind(find(&reqs, "nccl.coll.bytes").unwrap()),
        "histogram(temporality=2)"
    );
    let bytes = find(&reqs, "nccl.coll.bytes").unwrap();
    let bounds = &otlp_receiver::points(bytes)[0].bounds;
    assert_eq!(bounds.as_slice(), nccl_profiler_otel::export::SIZE_BOUNDS.as_slice());

    // Resource.
    let res = resource(&reqs);
    assert_eq!(res["service.name"], "4242");
    assert_eq!(res["service.namespace"], "4242");
    assert_eq!(res["process.pid"], std::process::id().to_string());
    assert_eq!(res["host.name"], nccl_profiler_otel::export::host_name());
    assert_eq!(
        res["service.instance.id"],
        format!("{}:{}:3", res["host.name"], res["process.pid"])
    );
    assert_eq!(res["job.id"], "4242");
    assert_eq!(res["job.launcher"], "slurm");
    assert_eq!(res["job.rank"], "3");
    assert_eq!(res["job.local_rank"], "1");
    assert_eq!(res["job.world_size"], "8");
    assert_eq!(res["team"], "ml,infra");
    assert_eq!(res["deployment.environment"], "test");
    assert_eq!(res["telemetry.distro.name"], "nccl-profiler-otel");
    let scope = &reqs[0].resource_metrics[0].scope_metrics[0].scope;
    assert_eq!(scope.as_ref().unwrap().name, "nccl-profiler-otel");

    // Init after a full finalize works, and the first communicator's totals stay (cumulative).
    let (c2, truth2) = sx::workload(&p, 0xB22_0002, "tp");
    // Data also arrives on the interval while a communicator is live, not only on finalize
    // (with none live the telemetry thread is parked: no interval exports).
    let n = metrics(&rx.requests()).len();
    assert!(
        rx.wait_for(Duration::from_secs(2), |r| metrics(r).len() > n),
        "no interval export"
    );
    p.finalize(c2.context);
    let reqs = rx.requests();
    assert!(sx::complete(&reqs, &truth2));
    sx::check(&reqs, &truth2);
    sx::check(&reqs, &truth);
}

#[test]
fn http_json_protocol() {
    let Some(_serial) = sx::serial() else {
        return;
    };
    let rx = Receiver::start();
    let out = process::child(module_path!(), "http_json_child", CHILD, "json")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", rx.endpoint())
        .env("OTEL_EXPORTER_OTLP_COMPRESSION", "none")
        // An inherited one would win over ours.
        .env_remove("NCCL_PROFILER_OTEL_TELEMETRY_ENDPOINT")
        .env("NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC", "0.2")
        .env("NCCL_PROFILER_LINEAR_REGRESSION_MODE", "MIN")
        .envs(sx::DETAILED)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let truth = sx::Truth {
        hash: 0x1507_0001,
        name: "json",
        rank: 0,
    };
    let reqs = rx.requests();
    assert!(sx::complete(&reqs, &truth), "{} requests", reqs.len());
    sx::check(&reqs, &truth);
    assert_eq!(rx.undecodable(), 0);
    assert!(
        rx.seen()
            .iter()
            .all(|(ct, path)| ct == "application/json" && path == "/v1/metrics"),
        "{:?}",
        rx.seen()
    );
    assert!(rx.encodings().iter().all(String::is_empty), "{:?}", rx.encodings());
}

#[test]
#[ignore = "run by http_json_protocol in a child process"]
fn http_json_child() {
    sx::run_child(CHILD, "json", 0x1507_0001, "json");
}

/// `OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION=base2_exponential_bucket_histogram`
/// makes every histogram exponential (decoded with the official types), and
/// `NCCL_PROFILER_OTEL_DROP_METRICS=channel,transfer` removes the channel family and the
/// per-transfer histograms, and nothing else.
#[test]
fn exponential_histograms_and_a_dropped_family() {
    let Some(_serial) = sx::serial() else {
        return;
    };
    let rx = Receiver::start();
    let out = process::child(module_path!(), "exponential_child", CHILD, "exponential")
        .env("NCCL_PROFILER_OTEL_TELEMETRY_ENDPOINT", rx.endpoint())
        .env(
            "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION",
            "base2_exponential_bucket_histogram",
        )
        .env("NCCL_PROFILER_OTEL_DROP_METRICS", "channel,transfer")
        .env("NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC", "0.2")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let reqs = rx.requests();
    assert_eq!(rx.undecodable(), 0);
    let all = metrics(&reqs);
    let names: std::collections::BTreeSet<&str> = all.iter().map(|m| m.name.as_str()).collect();
    let gone = |n: &&str| {
        ["nccl.channel.", "nccl.coll.transfer", "nccl.p2p.transfer"]
            .iter()
            .any(|p| n.starts_with(p))
    };
    assert!(!names.iter().any(gone), "{names:?}");
    for kept in [
        "nccl.link.latency",
        "nccl.coll.duration",
        "nccl.coll.service.duration",
        "nccl.profiler.events.recorded",
    ] {
        assert!(names.contains(kept), "{kept} missing: {names:?}");
    }
    use otlp_receiver::metric::Data;
    let mut exponential = 0;
    for m in &all {
        match &m.data {
            Some(Data::Histogram(_)) => panic!("{} is an explicit histogram", m.name),
            Some(Data::ExponentialHistogram(h)) => {
                for p in &h.data_points {
                    let buckets: u64 = p.positive.as_ref().map_or(0, |b| b.bucket_counts.iter().sum());
                    assert_eq!(
                        buckets + p.zero_count + p.negative.as_ref().map_or(0, |b| b.bucket_counts.iter().sum::<u64>()),
                        p.count,
                        "{}",
                        m.name
                    );
                    assert!(p.scale <= 20, "{}: scale {}", m.name, p.scale);
                }
                exponential += 1;
            }
            _ => {}
        }
    }
    assert!(names.contains("nccl.coll.duration") && exponential > 0);
    let duration = find(&reqs, "nccl.coll.duration").unwrap();
    let Some(Data::ExponentialHistogram(h)) = &duration.data else {
        panic!("nccl.coll.duration is not exponential")
    };
    assert!(
        h.data_points
            .iter()
            .any(|p| p.count > 0 && p.sum.is_some_and(|s| s > 0.0))
    );
}

#[test]
#[ignore = "run by exponential_histograms_and_a_dropped_family in a child process"]
fn exponential_child() {
    sx::run_child(CHILD, "exponential", 0xE4B0_0001, "expo");
}

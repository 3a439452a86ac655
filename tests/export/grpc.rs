//! OTLP/gRPC export end to end (cargo feature `grpc`): the scripted workload through the real
//! exported table to an in-test tonic receiver, checked against its ground truth and
//! `docs/metrics.md`; then an `UNAVAILABLE` collector (failures counted, data resumes) and a
//! hung one (the last `finalize` stays within its bound).
//!
//! Run with `cargo test --features grpc --test export grpc::`.

use std::time::{Duration, Instant};

use crate::support::emulator::Plugin;
use crate::support::export as sx;
use crate::support::otlp_receiver::{Fault, Receiver, resource};
use nccl_profiler_otel::export;

#[test]
fn workload_arrives_over_grpc() {
    let Some(_serial) = sx::own_process(module_path!(), "workload_arrives_over_grpc") else {
        return;
    };
    let rx = Receiver::start_grpc();
    let endpoint = rx.endpoint();
    // SAFETY: this process runs this test alone (`own_process`); nothing else touches the environment.
    unsafe {
        sx::base_env(&[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=nccl"),
            ("OTEL_SERVICE_NAME", "trainer"),
            ("NCCL_PROFILER_OTEL_TELEMETRY_BATCH_TIMEOUT_MS", "300"),
        ]);
    }
    let p = Plugin::in_process();

    let (reqs, _) = sx::finalized_workload(&p, &rx, 0x6290_0001, "grpc");
    sx::check_catalogue(&reqs);
    assert_eq!(resource(&reqs)["service.name"], "trainer");
    assert!(rx.seen().iter().all(|(ct, _)| ct == "application/grpc"));
    assert!(rx.encodings().iter().all(|e| e == "gzip"), "{:?}", rx.encodings());
    assert_eq!(export::stats().failures, 0);

    // UNAVAILABLE: counted; healthy again: data resumes.
    let (keeper, _) = p.init(Some("keeper"), 0x6290_00FF, 1, 2, 0);
    rx.set_fault(Fault::Status(503));
    let failures = export::stats().failures;
    let deadline = Instant::now() + Duration::from_secs(3);
    while export::stats().failures == failures && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(export::stats().failures > failures, "UNAVAILABLE not counted");

    // Hung: the last finalize is bounded.
    rx.set_fault(Fault::Hang);
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    p.finalize(keeper.context);
    assert!(
        t.elapsed() < Duration::from_millis(300 + 250 + 400),
        "{:?}",
        t.elapsed()
    );

    rx.set_fault(Fault::Healthy);
    let (c2, truth2) = sx::workload(&p, 0x6290_0002, "grpc-again");
    p.finalize(c2.context);
    assert!(
        rx.wait_for(Duration::from_secs(3), |r| sx::complete(r, &truth2)),
        "no data after recovery"
    );
    sx::check(&rx.requests(), &truth2);
}

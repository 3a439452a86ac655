//! Export end to end, one module per transport or concern: the scripted workload of
//! `support::export` through the real exported table, received by an in-test collector
//! (`support::otlp_receiver`) and decoded with the official OTLP types.
//!
//! - `http`: OTLP/HTTP protobuf and JSON, the documented catalogue, exponential histograms;
//! - `grpc` (feature `grpc`), `tls` (feature `tls`; its gRPC case also needs `grpc`);
//! - `file`: the `file` and `stdout` exporters;
//! - `golden`: the export compared line by line with `tests/golden/export.txt`;
//! - `faults`: faulty collectors, exit and fork;
//! - `gpu`: each communicator's GPU on its member series, through the CUDA driver's stand-in;
//! - `budget`: the Prometheus series of one rank of `docs/scale.md`'s job at the defaults, and
//!   what `NCCL_PROFILER_OTEL_DETAIL=full` restores;
//! - `rotel`: interop with a real collector (ignored; `.ci/export-interop.sh`).
//!
//! The plugin reads its configuration once per process, so every test that configures the
//! in-process plugin runs in a process of its own (`support::process`), and the tests run one at
//! a time (`support::export::SERIAL`).

#[path = "../support"]
mod support {
    pub mod cuda;
    pub mod emulator;
    pub mod export;
    pub mod otlp_receiver;
    pub mod process;
    // Only the translation, for the series budget.
    #[allow(dead_code)]
    pub mod prom;
    pub mod scale;
    pub mod shipped;
}

mod budget;
mod faults;
mod file;
mod golden;
mod gpu;
#[cfg(feature = "grpc")]
mod grpc;
mod http;
mod rotel;
#[cfg(feature = "tls")]
mod tls;

//! nccl-profiler-otel: an NCCL profiler plugin (`NCCL_PROFILER_PLUGIN=otel`) that turns NCCL's
//! profiler events into OpenTelemetry metrics.
//!
//! NCCL calls the newest exported `ncclProfiler_vN` table it knows (v1 to v7; [`ffi`], reading
//! descriptors through `abi`) from its user and proxy threads. Each callback copies a few scalars
//! into a `record` in a pre-allocated slot of the communicator's current window (`buffer`, `comm`);
//! the telemetry thread (`telemetry`) closes windows, links and summarises their records
//! (`aggregate`) and hands the summaries to `export`. See `docs/architecture.md`.
//!
//! The public API is the exported tables ([`ffi`]) and the C types they are made of
//! ([`bindings`]), and the culprit vocabulary ([`culprit`]: plain values the rules and
//! `nccl_report` share). Every other module is private; the cargo feature `testing` (the project's tests,
//! benches and emulator; never a shipped build) makes them public and compiles the test seams.
#![deny(unsafe_op_in_unsafe_fn, missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

/// Declares internal modules: private in the shipped library, public with the `testing` feature
/// (the project's tests, benches and emulator reach into them).
macro_rules! internal {
    ($($m:ident),* $(,)?) => {$(
        #[cfg(feature = "testing")]
        pub mod $m;
        #[cfg(not(feature = "testing"))]
        mod $m;
    )*};
}

pub mod bindings;
// Public in every build: plain values `nccl_report` shares (it includes the file) and the tests
// check the Prometheus rules against; nothing of it is exported by the `.so`.
pub mod culprit;
pub mod ffi;

internal!(
    abi,
    activation,
    aggregate,
    buffer,
    clock,
    comm,
    config,
    cuda,
    export,
    nccl_log,
    nccl_version,
    record,
    stats,
    telemetry,
);

//! nccl-profiler-otel: an NCCL profiler plugin (`NCCL_PROFILER_PLUGIN=otel`) that turns NCCL's
//! profiler events into OpenTelemetry metrics.
//!
//! NCCL calls the newest exported `ncclProfiler_vN` table it knows (v1 to v7; [`ffi`], reading
//! descriptors through [`abi`]) from its user and proxy threads. Each callback copies a few scalars into a [`record`] in a
//! pre-allocated slot of the communicator's current window ([`buffer`], [`comm`]); the telemetry
//! thread ([`telemetry`]) closes windows, links and summarises their records ([`aggregate`]) and
//! hands the summaries to its sinks and to [`export`]. See `docs/architecture.md`.
#![deny(unsafe_op_in_unsafe_fn, missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod abi;
pub mod activation;
pub mod aggregate;
pub mod bindings;
pub mod buffer;
pub mod clock;
pub mod comm;
pub mod config;
pub mod export;
pub mod ffi;
pub mod nccl_log;
pub mod nccl_version;
pub mod record;
pub mod stats;
pub mod telemetry;

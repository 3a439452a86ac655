//! The C boundary: the exported `ncclProfiler_v1` to `_v7` tables and their `extern "C"` callbacks
//! (`tables`), the guard they all run in (`guard`), and the generic bodies of the hot-path
//! callbacks (`events`, with `shedding` under overload) and of `init`/`finalize` (`lifecycle`). The seven tables are the crate's
//! public API; the rest is private.
//!
//! Every entry point runs inside `guard::guarded` (a panic is caught, counted and answered with
//! `ncclSuccess`), writes its out-parameters first (`*eHandle`, `*context` = NULL), tolerates
//! NULL, stale, foreign and unknown inputs (counted in `crate::stats::STATS`) and returns `ncclSuccess`.
//! `init` never fails: a communicator we cannot profile gets a NULL context (spec 1.4).
//! The bodies are generic over the ABI version's `crate::abi::Descriptor` and `crate::abi::StateArgs` adapters.
//! Threads: `init` on NCCL's init threads; start/state/stop on user and proxy threads (lock-free,
//! allocation-free); `finalize` on the thread freeing the communicator.

mod events;
mod guard;
mod lifecycle;
mod roots;
mod shedding;
mod tables;

pub use tables::{
    ncclProfiler_v1, ncclProfiler_v2, ncclProfiler_v3, ncclProfiler_v4, ncclProfiler_v5, ncclProfiler_v6,
    ncclProfiler_v7,
};

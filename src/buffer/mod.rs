//! The lock-free record buffer: a window of pre-allocated slots that producers claim and stamp
//! ([`window`]), the slot memory behind it ([`arena`]), the std/loom atomics both use
//! ([`sync`]), and the trim of the process heap once that memory is no longer needed ([`heap`]).
//! Knows records, nothing of communicators or aggregation.

pub mod arena;
pub mod heap;
#[cfg(all(test, nccl_loom))]
mod loom;
pub mod sync;
pub mod window;

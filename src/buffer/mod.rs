//! The lock-free record buffer: a window of pre-allocated slots that producers claim and stamp
//! ([`window`]), the slot memory behind it ([`arena`]), and the std/loom atomics both use
//! ([`sync`]). Knows records, nothing of communicators or aggregation.

pub mod arena;
#[cfg(all(test, nccl_loom))]
mod loom;
pub mod sync;
pub mod window;

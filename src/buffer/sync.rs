//! Atomics and `UnsafeCell` for the lock-free window and a communicator's routing: `std`'s, or
//! `loom`'s under `cfg(nccl_loom)` (our own cfg name: tokio changes behaviour under the usual
//! `cfg(loom)`, which reaches every crate) so the loom models (`buffer::loom`, the
//! window; `comm::loom`, the producers' routing) explore every interleaving of the same code.
#![forbid(unsafe_code)]

#[cfg(nccl_loom)]
pub use loom::{
    cell::UnsafeCell,
    sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicU32, AtomicU64, Ordering},
};

#[cfg(not(nccl_loom))]
pub use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicU32, AtomicU64, Ordering};

/// `std`'s `UnsafeCell` with loom's `with`/`with_mut` access API.
#[cfg(not(nccl_loom))]
#[derive(Debug, Default)]
pub struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(nccl_loom))]
impl<T> UnsafeCell<T> {
    /// Gives `f` a shared raw pointer to the content.
    pub fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Gives `f` a mutable raw pointer to the content.
    pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

//! Readers of each NCCL profiler ABI version's descriptors and state arguments.
//!
//! Each version implements [`Descriptor`] and [`StateArgs`] over a `#[repr(transparent)]` wrapper
//! of its bindgen type; `crate::ffi` has one generic body per callback. Every method checks the
//! type tag before it reads the union and copies what it needs: no pointer into NCCL memory is
//! kept. Called on: NCCL's user and proxy threads, inside a callback.

pub mod v4;

use crate::record::{CollStart, Func, P2pStart};

/// A ProxyOp descriptor's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProxyOp {
    /// Process that created the op (PXN: another one).
    pub pid: i32,
    /// Rank that created the op.
    pub rank: i32,
    /// Remote rank.
    pub peer: i32,
    /// Channel.
    pub channel: u8,
    /// Network send (the only ops that get steps and a stop for sends).
    pub is_send: bool,
}

/// What `startEvent` needs from one ABI version's descriptor.
pub trait Descriptor {
    /// The `type` field, widened.
    fn event_type(&self) -> u64;
    /// `parentObj` as an integer (never dereferenced).
    fn parent(&self) -> u64;
    /// Coll member, when `type` is Coll.
    fn coll(&self) -> Option<CollStart>;
    /// P2p member (function, start), when `type` is P2p.
    fn p2p(&self) -> Option<(Func, P2pStart)>;
    /// ProxyOp member with the descriptor's rank, when `type` is ProxyOp.
    fn proxy_op(&self) -> Option<ProxyOp>;
    /// ProxyStep `step`, when `type` is ProxyStep.
    fn proxy_step(&self) -> Option<i32>;
    /// KernelCh (channel, GPU start time), when `type` is KernelCh.
    fn kernel_ch(&self) -> Option<(u8, u64)>;
}

/// What `recordEventState` needs from one ABI version's state arguments. The caller picks the
/// member by the state value, as NCCL does.
pub trait StateArgs {
    /// `proxyStep.transSize`.
    fn trans_size(&self) -> u64;
    /// `kernelCh.pTimer`.
    fn p_timer(&self) -> u64;
}

/// Bytes of a NUL-terminated C string, at most 64 of them; empty for NULL.
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string or at least 64 readable bytes (NCCL passes
/// static literals).
pub unsafe fn c_bytes<'a>(ptr: *const std::os::raw::c_char) -> &'a [u8] {
    if ptr.is_null() {
        return &[];
    }
    // SAFETY: per this function's contract, bytes are readable up to the NUL or the 64th.
    let len = (0..64).take_while(|&i| unsafe { *ptr.add(i) } != 0).count();
    // SAFETY: the `len` bytes just read are readable and stay valid for the callback.
    unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }
}

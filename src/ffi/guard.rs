//! The one guard every entry point runs in: a panic is caught, counted, disables the
//! communicator the callback had resolved (and only it), and the callback still reports success.
//! Called on: every NCCL thread, inside every callback.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::bindings::{ncclResult_t, ncclSuccess};
use crate::comm::Comm;
use crate::record::handle::CommId;
use crate::stats::STATS;

/// The communicator a callback resolved so far: a panic after that point disables it, and only
/// it (never one a foreign PXN context happens to name).
pub(super) type Owner = Cell<Option<(CommId, &'static Comm)>>;

/// Runs a callback body; a panic is counted, disables the communicator the body resolved, and the
/// callback still reports success.
#[inline(always)]
pub(super) fn guarded(body: impl FnOnce(&Owner)) -> ncclResult_t {
    let owner = Owner::new(None);
    if catch_unwind(AssertUnwindSafe(|| body(&owner))).is_err() {
        STATS.panics.incr();
        if let Some((id, comm)) = owner.get() {
            comm.disable(id);
        }
    }
    ncclSuccess
}

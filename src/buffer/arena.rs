//! The slot arena of a window: one allocation of record slots, zeroed and lazily backed by the
//! kernel, whose unused pages are handed back after processing. A zeroed slot is a valid empty
//! slot (stamp 0 is no epoch), so released pages read as empty.
//! Called on: the consumer (allocation at `register`, release after processing and `finalize`);
//! producers only write claimed slots (see [`super::window`]).
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::mem::MaybeUninit;

use super::sync::{AtomicU32, UnsafeCell};
use crate::record::Record;

/// One record slot.
pub struct Slot {
    /// Epoch of the window when this slot's record was published.
    pub stamp: AtomicU32,
    /// The record, written by its claimer before the stamp.
    pub record: UnsafeCell<MaybeUninit<Record>>,
}

/// Returns the whole pages of slots at and past `first` to the kernel (they read as zero, a
/// valid empty slot, and cost no resident memory until touched again).
#[cfg(not(nccl_loom))]
pub fn release_from(slots: &[Slot], first: u32) {
    let page = 4096usize;
    let base = slots.as_ptr() as usize;
    let end = base + std::mem::size_of_val(slots);
    let from = (base + first as usize * size_of::<Slot>()).next_multiple_of(page);
    if from < end {
        let len = (end - from) / page * page;
        // SAFETY: [from, from+len) lies inside our own slot allocation, which is never freed;
        // MADV_DONTNEED zero-fills it, and all-zero bytes are a valid `Slot`. A racing late
        // producer at worst writes a page that is then zero or kept: no invalid memory access.
        unsafe { libc::madvise(from as *mut libc::c_void, len, libc::MADV_DONTNEED) };
    }
}

/// Under loom the slots are plain heap memory: nothing to release.
#[cfg(nccl_loom)]
pub fn release_from(_slots: &[Slot], _first: u32) {}

/// `capacity` empty slots, allocated zeroed so untouched pages are never resident; `None` when
/// the memory cannot be had.
#[cfg(not(nccl_loom))]
pub fn zeroed_slots(capacity: usize) -> Option<Box<[Slot]>> {
    let layout = std::alloc::Layout::array::<Slot>(capacity.max(1)).ok()?;
    // SAFETY: the layout is non-zero-sized; a zeroed `Slot` is valid (stamp 0 is no epoch, the
    // record is `MaybeUninit`); pointer and length describe exactly that allocation, made with
    // the layout `Box<[Slot]>` frees it with.
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout).cast::<Slot>();
        (!ptr.is_null()).then(|| Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, capacity.max(1))))
    }
}

/// Under loom: `capacity` empty slots of loom cells.
#[cfg(nccl_loom)]
pub fn zeroed_slots(capacity: usize) -> Option<Box<[Slot]>> {
    Some(
        (0..capacity)
            .map(|_| Slot {
                stamp: AtomicU32::new(0),
                record: UnsafeCell::new(MaybeUninit::uninit()),
            })
            .collect(),
    )
}

#[cfg(all(test, not(nccl_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_a_stamp_and_a_record() {
        assert_eq!(
            std::mem::size_of::<Slot>(),
            56,
            "docs/architecture.md states the slot size"
        );
    }
}

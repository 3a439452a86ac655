//! The slot arenas of a window: page-aligned anonymous mappings of record slots, zeroed and
//! lazily backed by the kernel, whose unused pages are handed back after processing. A slot is a
//! stamp and a value of the lane's record form (56 bytes for a full
//! [`Record`](crate::record::Record), 32 for a [`Compact`](crate::record::compact::Compact)). A
//! zeroed slot is a valid empty slot (stamp 0 is no epoch), so released pages read as empty. The
//! mappings reserve no swap (`MAP_NORESERVE`): only the pages records touch count, also under
//! strict overcommit.
//! Called on: the consumer (mapping at `register`, release after processing and `finalize`);
//! producers only write claimed slots (see [`super::window`]).
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::mem::MaybeUninit;
use std::ops::{Deref, Range};

use super::sync::{AtomicU32, UnsafeCell};

/// One record slot holding a `T` (a record in one of its forms: plain data, all-zero valid).
pub struct Slot<T> {
    /// Epoch of the window when this slot's record was published.
    pub stamp: AtomicU32,
    /// The record, written by its claimer before the stamp.
    pub record: UnsafeCell<MaybeUninit<T>>,
}

/// A window's slots of one record form.
#[cfg(not(nccl_loom))]
pub struct Arena<T> {
    slots: std::ptr::NonNull<Slot<T>>,
    len: usize,
}

// SAFETY: the arena owns its mapping; `T: Send` values move between the claimer and the reader.
#[cfg(not(nccl_loom))]
unsafe impl<T: Send> Send for Arena<T> {}
// SAFETY: slots are atomics and a cell whose access the window's claim protocol serialises (one
// writer per slot and epoch, readers only after its stamp); `T: Send` is all that needs.
#[cfg(not(nccl_loom))]
unsafe impl<T: Send> Sync for Arena<T> {}

#[cfg(not(nccl_loom))]
impl<T> Arena<T> {
    /// `len` empty slots, mapped zeroed so untouched pages are never resident; `None` when the
    /// address space cannot be had.
    pub fn zeroed(len: usize) -> Option<Arena<T>> {
        let bytes = len.max(1).checked_mul(size_of::<Slot<T>>())?;
        // SAFETY: a fresh private anonymous mapping, no address hint; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        Some(Arena {
            slots: std::ptr::NonNull::new(p.cast::<Slot<T>>())?,
            len: len.max(1),
        })
    }

    /// Returns the whole pages of the slots in `range` to the kernel (they read as zero, a valid
    /// empty slot, and cost no resident memory until touched again).
    ///
    /// # Safety
    /// No thread reads or writes a slot in `range` during the call: the kernel replaces their
    /// bytes under any access.
    pub unsafe fn release(&self, range: Range<u32>) {
        const PAGE: usize = 4096;
        let base = self.slots.as_ptr() as usize;
        let at = |slot: u32| base + (slot as usize).min(self.len) * size_of::<Slot<T>>();
        let from = at(range.start).next_multiple_of(PAGE);
        // The mapping ends on a page boundary: its last page is released whole with the last slot.
        let end = if range.end as usize >= self.len {
            at(range.end).next_multiple_of(PAGE)
        } else {
            at(range.end) / PAGE * PAGE
        };
        if from < end {
            // SAFETY: [from, end) lies inside our own mapping and its slots are untouched meanwhile
            // (this function's contract); MADV_DONTNEED zero-fills it, and all-zero bytes are a
            // valid `Slot`.
            unsafe { libc::madvise(from as *mut libc::c_void, end - from, libc::MADV_DONTNEED) };
        }
    }
}

#[cfg(not(nccl_loom))]
impl<T> Deref for Arena<T> {
    type Target = [Slot<T>];

    fn deref(&self) -> &[Slot<T>] {
        // SAFETY: the mapping holds `len` zero-initialised slots (a valid `Slot` each: an atomic
        // and a `MaybeUninit`) and lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.slots.as_ptr(), self.len) }
    }
}

#[cfg(not(nccl_loom))]
impl<T> Drop for Arena<T> {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `zeroed`; nothing borrows it any more.
        unsafe { libc::munmap(self.slots.as_ptr().cast(), self.len * size_of::<Slot<T>>()) };
    }
}

/// Under loom: plain heap slots of loom cells; nothing to release.
#[cfg(nccl_loom)]
pub struct Arena<T>(Box<[Slot<T>]>);

#[cfg(nccl_loom)]
impl<T> Arena<T> {
    /// `len` empty slots.
    pub fn zeroed(len: usize) -> Option<Arena<T>> {
        Some(Arena(
            (0..len)
                .map(|_| Slot {
                    stamp: AtomicU32::new(0),
                    record: UnsafeCell::new(MaybeUninit::uninit()),
                })
                .collect(),
        ))
    }

    /// Nothing to release on the heap.
    ///
    /// # Safety
    /// As the mapped arena's: no thread touches a slot in `range` during the call.
    pub unsafe fn release(&self, _range: Range<u32>) {}
}

#[cfg(nccl_loom)]
impl<T> Deref for Arena<T> {
    type Target = [Slot<T>];

    fn deref(&self) -> &[Slot<T>] {
        &self.0
    }
}

#[cfg(all(test, not(nccl_loom)))]
#[allow(clippy::expect_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::record::Record;
    use crate::record::compact::Compact;

    #[test]
    fn a_slot_is_a_stamp_and_a_record() {
        assert_eq!(
            (size_of::<Slot<Record>>(), size_of::<Slot<Compact>>()),
            (56, 32),
            "docs/architecture.md states the slot sizes"
        );
    }

    #[test]
    fn the_arena_is_page_aligned_and_released_pages_read_as_zero() {
        let a = Arena::<Record>::zeroed(1000).expect("mapped");
        assert_eq!(a.as_ptr() as usize % 4096, 0);
        a.iter()
            .for_each(|s| s.stamp.store(7, std::sync::atomic::Ordering::Relaxed));
        // SAFETY: this thread alone uses the arena.
        unsafe { a.release(100..990) };
        let first_released = (100 * size_of::<Slot<Record>>()).next_multiple_of(4096) / size_of::<Slot<Record>>() + 1;
        assert_eq!(a[99].stamp.load(std::sync::atomic::Ordering::Relaxed), 7);
        assert_eq!(a[first_released].stamp.load(std::sync::atomic::Ordering::Relaxed), 0);
        assert_eq!(
            a[989].stamp.load(std::sync::atomic::Ordering::Relaxed),
            7,
            "a partial last page is kept"
        );
        // SAFETY: as above.
        unsafe { a.release(0..1000) };
        assert!(
            a.iter()
                .all(|s| s.stamp.load(std::sync::atomic::Ordering::Relaxed) == 0)
        );
    }
}

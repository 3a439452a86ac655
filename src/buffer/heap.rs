//! Giving the allocator's free memory back to the kernel. glibc keeps freed heap memory (and,
//! once its dynamic mmap threshold has risen, large freed blocks) resident for reuse; the
//! telemetry thread calls [`trim`] once every communicator went idle. Not part of the hot path:
//! it takes the allocator's locks. Here because the telemetry module admits no `unsafe`.
//! Called on: the telemetry thread.

/// Returns the free memory of every malloc arena to the kernel (glibc; nothing elsewhere).
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only takes the allocator's own locks and touches only free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

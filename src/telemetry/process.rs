//! Which process the telemetry thread belongs to: whether it runs here, and whether this process
//! is a fork of the one that started it (then the plugin stays inert).
//! Called on: NCCL's init thread (`claim`); any thread ([`forked`], [`running`]).
#![forbid(unsafe_code)]

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// Whether the telemetry thread was started, once per process.
static THREAD: OnceLock<bool> = OnceLock::new();
/// Pid of the process that started the thread; 0 before.
static OWNER: AtomicU32 = AtomicU32::new(0);

/// Runs `spawn` once per process, this process becoming the thread's owner first; every call
/// returns what that one call returned (whether the thread runs).
pub(super) fn claim(spawn: impl FnOnce() -> bool) -> bool {
    *THREAD.get_or_init(|| {
        OWNER.store(std::process::id(), Ordering::Relaxed);
        spawn()
    })
}

/// Whether this process is a fork of the one that started the telemetry thread: then the plugin
/// must stay inert. Called on: any thread (init, finalize, exit).
pub fn forked() -> bool {
    let owner = OWNER.load(Ordering::Relaxed);
    owner != 0 && owner != std::process::id()
}

/// Whether the telemetry thread runs in this process.
pub fn running() -> bool {
    THREAD.get().copied().unwrap_or(false) && !forked()
}

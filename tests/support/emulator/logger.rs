//! The logger NCCL passes to `init` (`ncclDebugLogger_t`, spec 2.1), capturing lines instead of
//! printing them.
//!
//! NCCL's logger is C-variadic, which stable Rust cannot define. The plugin calls it as
//! `logfn(level, flags, file, line, "%s", text)`; on x86_64 and aarch64 Linux a variadic call
//! passes those six integer/pointer arguments in the same registers as a fixed six-argument call,
//! so a fixed-arity function stands in for it there. Elsewhere the emulator passes NULL, which
//! NCCL never does but the plugin accepts.

use parking_lot::Mutex;
use std::ffi::{CStr, c_char, c_int, c_uint, c_ulong};

use nccl_profiler_otel::bindings::ncclDebugLogger_t;

/// One captured line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    /// `ncclDebugLogLevel`: 2 WARN, 3 INFO, 5 TRACE.
    pub level: i32,
    /// Subsystem flags (`NCCL_PROFILE` = 0x4000).
    pub flags: u64,
    pub text: String,
}

/// Most lines kept; older ones are dropped.
const KEEP: usize = 4096;

static LINES: Mutex<Vec<Line>> = Mutex::new(Vec::new());

/// Every line captured so far (up to the last 4096), oldest first.
pub fn lines() -> Vec<Line> {
    LINES.lock().clone()
}

/// Captured WARN lines.
pub fn warnings() -> Vec<String> {
    lines().into_iter().filter(|l| l.level == 2).map(|l| l.text).collect()
}

unsafe extern "C" fn capture(
    level: c_uint,
    flags: c_ulong,
    _file: *const c_char,
    _line: c_int,
    fmt: *const c_char,
    arg: *const c_char,
) {
    if fmt.is_null() {
        return;
    }
    // SAFETY: `fmt` is a NUL-terminated format string (the plugin passes "%s").
    let fmt = unsafe { CStr::from_ptr(fmt) };
    let text = if fmt.to_bytes() == b"%s" && !arg.is_null() {
        // SAFETY: with "%s" the one variadic argument is a NUL-terminated string.
        unsafe { CStr::from_ptr(arg) }.to_string_lossy().into_owned()
    } else {
        fmt.to_string_lossy().into_owned()
    };
    let mut lines = LINES.lock();
    if lines.len() >= KEEP {
        lines.remove(0);
    }
    lines.push(Line {
        level: level as i32,
        #[allow(clippy::useless_conversion)] // `c_ulong` is `u32` on some targets
        flags: u64::from(flags),
        text,
    });
}

/// The logger to pass to `init`.
#[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
pub fn logfn() -> ncclDebugLogger_t {
    type Fixed = unsafe extern "C" fn(c_uint, c_ulong, *const c_char, c_int, *const c_char, *const c_char);
    type Variadic = unsafe extern "C" fn(c_uint, c_ulong, *const c_char, c_int, *const c_char, ...);
    // SAFETY: on these targets a variadic call with six integer/pointer arguments uses the same
    // registers as a fixed six-argument call (see the module docs); the plugin passes exactly
    // one variadic argument, a string.
    Some(unsafe { std::mem::transmute::<Fixed, Variadic>(capture as Fixed) })
}

/// The logger to pass to `init` (NULL on targets where the stand-in is not ABI-compatible).
#[cfg(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))))]
pub fn logfn() -> ncclDebugLogger_t {
    None
}

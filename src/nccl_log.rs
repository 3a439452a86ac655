//! Forwards our `tracing` events to NCCL's debug logger (`logfn` of `init`, spec 2.1).
//!
//! [`set_logger`] keeps the latest non-NULL logger process-wide, [`clear_logger`] forgets it, and
//! [`install`] makes a small [`Subscriber`] the global `tracing` default. Each event becomes one
//! call `logfn(level, NCCL_PROFILE, "nccl-profiler-otel", line, "%s", text)` with text
//! `NCCL_PROFILER_OTEL: <message> k=v…`, so `NCCL_DEBUG` and `NCCL_DEBUG_SUBSYS=PROFILE` filter
//! it like NCCL's own output. Without a logger (NCCL 2.23–2.26 pass none, and none is left after
//! the last `finalize`), WARN/ERROR go to stderr, INFO too when `NCCL_DEBUG` is INFO or TRACE,
//! and the rest is dropped.
//! Spans are ignored, and so are dependencies' events below WARN.
//! Called on: the NCCL app thread (init/finalize) and the telemetry thread; never the hot path
//! (NCCL's logger takes a mutex, and formatting allocates). A WARN also replaces the text of
//! `ncclGetLastError()`, so WARN only for real problems.

use std::ffi::{CString, c_int, c_ulong};
use std::fmt::{self, Write as _};
use std::io::Write as _;

use parking_lot::RwLock;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber, span};

use crate::bindings::{
    NCCL_LOG_INFO, NCCL_LOG_TRACE, NCCL_LOG_WARN, NCCL_PROFILE, ncclDebugLogLevel, ncclDebugLogger_t,
};

/// `NCCL_PROFILE` subsystem flag (`NCCL_DEBUG_SUBSYS=PROFILE`); a small positive C enum value.
const SUBSYS_PROFILE: c_ulong = NCCL_PROFILE as c_ulong;

/// Printed by NCCL as the file name of a WARN and as the function name of a TRACE.
const FILE: &std::ffi::CStr = c"nccl-profiler-otel";
const PREFIX: &str = "NCCL_PROFILER_OTEL: ";
/// Target prefix of this crate's events (their module path).
const CRATE: &str = "nccl_profiler_otel";

/// The latest logger NCCL gave us. Readers hold the lock across the call, so [`clear_logger`]
/// returns only once no call is in flight.
static LOGGER: RwLock<ncclDebugLogger_t> = RwLock::new(None);

/// Remembers `logfn` for every later log line; `None` (NULL) keeps the previous logger.
/// Called on: NCCL app thread (`init`).
///
/// # Safety
/// `logfn` is NULL or NCCL's logger from `init`: callable from any thread as
/// `logfn(level, subsystem, file, line, "%s", text)` until [`clear_logger`] returns.
pub unsafe fn set_logger(logfn: ncclDebugLogger_t) {
    if logfn.is_some() {
        *LOGGER.write() = logfn;
    }
}

/// Forgets the logger, waiting for calls in flight; later WARN/ERROR go to stderr until the next
/// [`set_logger`]. Call it in the last `finalize`: this library stays loaded (`-z nodelete`) and
/// its telemetry thread keeps running after NCCL's `dlclose`, while libnccl (the logger's code)
/// may be unloaded. Called on: NCCL app thread (`finalize`).
pub fn clear_logger() {
    *LOGGER.write() = None;
}

/// Whether a logger is kept (for tests of the last `finalize`).
#[cfg(test)]
pub(crate) fn logger_set() -> bool {
    LOGGER.read().is_some()
}

/// Makes the NCCL forwarder the process-wide `tracing` subscriber. Idempotent and thread-safe;
/// does nothing if a global default (ours or anyone's) is already set.
/// Called on: NCCL app thread (`init`).
pub fn install() {
    // Err means a global default already exists: keep it.
    let _ = tracing::subscriber::set_global_default(Forwarder { sink: emit });
}

/// One event, ready for NCCL's logger.
#[derive(Debug, PartialEq, Eq)]
struct Line {
    /// `NCCL_LOG_*` level.
    level: ncclDebugLogLevel,
    /// Source line of the event, 0 when unknown.
    line: c_int,
    /// `PREFIX` + message + ` key=value` fields, NUL bytes escaped.
    text: CString,
}

/// Minimal subscriber: events only, each rendered and handed to `sink`.
struct Forwarder {
    sink: fn(Line),
}

impl Subscriber for Forwarder {
    /// Events of this crate at every level; from dependencies (the HTTP/2 stack logs every frame
    /// at TRACE) only WARN and ERROR, so their chatter costs nothing.
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.is_event() && (metadata.target().starts_with(CRATE) || *metadata.level() <= Level::WARN)
    }

    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }

    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}

    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}

    fn event(&self, event: &Event<'_>) {
        (self.sink)(render(event));
    }

    fn enter(&self, _: &span::Id) {}

    fn exit(&self, _: &span::Id) {}
}

/// Whether NCCL itself would print INFO lines (`NCCL_DEBUG=INFO` or `TRACE`), read once.
fn info_wanted() -> bool {
    static WANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WANTED.get_or_init(|| {
        std::env::var("NCCL_DEBUG").is_ok_and(|v| v.eq_ignore_ascii_case("INFO") || v.eq_ignore_ascii_case("TRACE"))
    })
}

/// Sends `line` to NCCL's logger, or to stderr when there is none: WARN/ERROR, and INFO when
/// NCCL would print it.
fn emit(line: Line) {
    let logger = LOGGER.read();
    match *logger {
        // SAFETY: `logfn` is NCCL's logger (`set_logger`'s contract) and stays valid while
        // libnccl is loaded; the read guard keeps `clear_logger` (last `finalize`, before NCCL
        // may unload) from returning during the call. `fmt` is "%s" and the one variadic argument is a NUL-terminated string
        // that lives across the call, matching the printf contract.
        Some(logfn) => unsafe {
            logfn(
                line.level,
                SUBSYS_PROFILE,
                FILE.as_ptr(),
                line.line,
                c"%s".as_ptr(),
                line.text.as_ptr(),
            );
        },
        None if line.level == NCCL_LOG_WARN || (line.level == NCCL_LOG_INFO && info_wanted()) => {
            let mut stderr = std::io::stderr().lock();
            // Nowhere to report a failed write to stderr.
            let _ = stderr
                .write_all(line.text.as_bytes())
                .and_then(|()| stderr.write_all(b"\n"));
        }
        None => {}
    }
}

fn render(event: &Event<'_>) -> Line {
    let mut fields = Fields::default();
    event.record(&mut fields);
    let metadata = event.metadata();
    Line {
        level: nccl_level(*metadata.level()),
        line: metadata.line().and_then(|l| c_int::try_from(l).ok()).unwrap_or(0),
        text: c_text(&fields.message, &fields.rest),
    }
}

fn nccl_level(level: Level) -> ncclDebugLogLevel {
    match level {
        Level::ERROR | Level::WARN => NCCL_LOG_WARN,
        Level::INFO => NCCL_LOG_INFO,
        _ => NCCL_LOG_TRACE,
    }
}

/// `PREFIX` + `message` + `rest` as a C string; interior NULs become the two characters `\0`.
fn c_text(message: &str, rest: &str) -> CString {
    let body = format!("{message}{rest}");
    let text = format!("{PREFIX}{}", body.trim_start()).replace('\0', "\\0");
    // Cannot fail: no NUL is left.
    CString::new(text).unwrap_or_default()
}

/// The event's `message` field, and every other field as ` key=value`.
#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
}

impl Fields {
    fn push(&mut self, field: &Field, value: fmt::Arguments<'_>) {
        // Writing to a `String` fails only if a `Debug` impl does; keep what was written.
        let _ = if field.name() == "message" {
            self.message.write_fmt(value)
        } else {
            write!(self.rest, " {}={value}", field.name())
        };
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.push(field, format_args!("{value}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.push(field, format_args!("{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    thread_local! {
        static CAPTURED: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
    }

    /// Runs `f` with a thread-local forwarder that captures lines instead of calling NCCL.
    fn capture(f: impl FnOnce()) -> Vec<Line> {
        let forwarder = Forwarder {
            sink: |line| CAPTURED.with(|c| c.borrow_mut().push(line)),
        };
        tracing::subscriber::with_default(forwarder, f);
        CAPTURED.with(RefCell::take)
    }

    fn text(line: &Line) -> &str {
        line.text.to_str().unwrap()
    }

    #[test]
    fn levels_map_to_nccl_levels() {
        assert_eq!(nccl_level(Level::ERROR), 2);
        assert_eq!(nccl_level(Level::WARN), 2);
        assert_eq!(nccl_level(Level::INFO), 3);
        assert_eq!(nccl_level(Level::DEBUG), 5);
        assert_eq!(nccl_level(Level::TRACE), 5);
    }

    #[test]
    fn event_becomes_prefixed_message_with_fields() {
        let lines = capture(|| {
            tracing::warn!(rank = 3, name = "x y", "bad {}", "value");
            tracing::info!("version 1");
            tracing::trace!(answer = 42);
        });
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].level, NCCL_LOG_WARN);
        assert!(lines[0].line > 0);
        assert_eq!(text(&lines[0]), "NCCL_PROFILER_OTEL: bad value rank=3 name=x y");
        assert_eq!(lines[1].level, NCCL_LOG_INFO);
        assert_eq!(text(&lines[1]), "NCCL_PROFILER_OTEL: version 1");
        assert_eq!(lines[2].level, NCCL_LOG_TRACE);
        assert_eq!(text(&lines[2]), "NCCL_PROFILER_OTEL: answer=42");
    }

    #[test]
    fn spans_are_ignored() {
        let lines = capture(|| {
            let span = tracing::info_span!("outer", k = 1);
            let _entered = span.enter();
            tracing::error!("inside");
        });
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].level, NCCL_LOG_WARN);
        assert_eq!(text(&lines[0]), "NCCL_PROFILER_OTEL: inside");
    }

    #[test]
    fn dependencies_below_warn_are_ignored() {
        let lines = capture(|| {
            tracing::trace!(target: "h2::codec", "frame");
            tracing::info!(target: "reqwest::connect", "connecting");
            tracing::warn!(target: "h2::proto", "connection error");
            tracing::trace!("ours");
        });
        let texts: Vec<&str> = lines.iter().map(text).collect();
        assert_eq!(
            texts,
            ["NCCL_PROFILER_OTEL: connection error", "NCCL_PROFILER_OTEL: ours"]
        );
    }

    #[test]
    fn interior_nul_is_escaped() {
        let lines = capture(|| tracing::warn!(field = "a\0b", "x\0y"));
        assert_eq!(text(&lines[0]), "NCCL_PROFILER_OTEL: x\\0y field=a\\0b");
        assert_eq!(c_text("\0", "").as_bytes(), b"NCCL_PROFILER_OTEL: \\0".as_slice());
    }

    #[test]
    fn null_logger_is_ignored_and_install_is_idempotent() {
        // SAFETY: NULL, which keeps the previous logger.
        unsafe { set_logger(None) };
        assert!(LOGGER.read().is_none());
        install();
        install();
    }
}

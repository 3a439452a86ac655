//! The background telemetry thread and the sinks it feeds.
//!
//! One thread per process, started by the first `init` and never stopped (the library is linked
//! `-z nodelete`, so it survives NCCL's `dlclose` and serves later `init`s). Every [`TICK`] it
//! polls each communicator ([`crate::comm::Comm::poll`]): windows close on their count or time
//! trigger, finished windows are summarised, and each summary goes to every registered [`Sink`].
//! `finalize` hands its communicator's last windows to the same sinks ([`deliver`]).
//! Threads: the telemetry thread; NCCL's finalizing thread in [`deliver`]; `init` in [`start`].
#![forbid(unsafe_code)]

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::RwLock;

use crate::aggregate::WindowSummary;
use crate::{clock, comm};

/// How often the thread looks at the windows (close triggers are checked at this granularity).
pub const TICK: Duration = Duration::from_millis(10);

/// Receives every processed window. Called on: the telemetry thread or a finalizing NCCL thread,
/// never on the hot path; must not block for long.
pub trait Sink: Send + Sync {
    /// One window's summary.
    fn window(&self, summary: &WindowSummary);
}

static SINKS: RwLock<Vec<Arc<dyn Sink>>> = RwLock::new(Vec::new());
static THREAD: OnceLock<()> = OnceLock::new();

/// Registers a sink for all later windows.
pub fn add_sink(sink: Arc<dyn Sink>) {
    SINKS.write().push(sink);
}

/// Hands summaries to every sink.
pub fn deliver(summaries: &[WindowSummary]) {
    let sinks = SINKS.read().clone();
    for summary in summaries {
        sinks.iter().for_each(|s| s.window(summary));
    }
}

/// Starts the telemetry thread once per process; failure to spawn is logged and leaves windows
/// to be processed at `finalize` only.
pub fn start() {
    THREAD.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("nccl-otel-telemetry".into())
            .spawn(|| {
                loop {
                    std::thread::sleep(TICK);
                    poll_all();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot start the telemetry thread ({e}); windows are processed at finalize only");
        }
    });
}

/// One pass over every communicator.
fn poll_all() {
    let secs_per_tick = clock::secs_per_tick();
    for comm in comm::all() {
        deliver(&comm.poll(Instant::now(), secs_per_tick));
    }
}

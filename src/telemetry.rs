//! The background telemetry thread, the sinks it feeds, and flushing with a deadline.
//!
//! One thread per process, started by the first `init` and never stopped (the library is linked
//! `-z nodelete`, so it survives NCCL's `dlclose` and serves later `init`s). Every [`TICK`], or at
//! once when [`flush`] asks, it polls each communicator ([`crate::comm::Comm::poll`]): windows
//! close on their count or time trigger, finished windows are summarised, and each summary goes to
//! every registered [`Sink`]; then the export [`Pipeline`] records what arrived and, once per
//! interval or on a flush, queues an export request. `finalize` hands its communicator's last
//! windows to the same sinks ([`deliver`]).
//!
//! Threads: the telemetry thread; NCCL's finalizing thread in [`deliver`] and [`flush`]; `init` in
//! [`start`]; the exiting thread in [`flush`] (atexit). [`flush`] never waits past its deadline,
//! whatever the collector does. In a forked child ([`forked`]) none of this runs: the thread did
//! not survive the fork and its locks may be held forever.
#![forbid(unsafe_code)]

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};

use crate::aggregate::WindowSummary;
use crate::config::Config;
use crate::export::{self, Pipeline};
use crate::stats::STATS;
use crate::{clock, comm};

/// How often the thread looks at the windows (close triggers are checked at this granularity).
pub const TICK: Duration = Duration::from_millis(10);

/// Added to the export timeout for a flush's deadline: the telemetry thread's own work.
pub const FLUSH_MARGIN: Duration = Duration::from_millis(250);

/// Receives every processed window. Called on: the telemetry thread or a finalizing NCCL thread,
/// never on the hot path; must not block for long.
pub trait Sink: Send + Sync {
    /// One window's summary.
    fn window(&self, summary: &WindowSummary);
}

static SINKS: RwLock<Vec<Arc<dyn Sink>>> = RwLock::new(Vec::new());
static THREAD: OnceLock<bool> = OnceLock::new();
/// Pid of the process that started the thread; 0 before.
static OWNER: AtomicU32 = AtomicU32::new(0);

/// Flush requests to the telemetry thread, and its answers.
struct Control {
    /// Requests made so far.
    requested: u64,
    /// Requests the thread has served.
    served: u64,
    /// Export request queued by the last serve, if any.
    seq: Option<u64>,
    /// Whether a pending request wants live communicators' windows processed too.
    drain_live: bool,
}

static CONTROL: Mutex<Control> = Mutex::new(Control {
    requested: 0,
    served: 0,
    seq: None,
    drain_live: false,
});
/// Wakes the telemetry thread for a flush.
static WAKE: Condvar = Condvar::new();
/// Tells flushers a request was served.
static SERVED: Condvar = Condvar::new();

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

/// Starts the telemetry thread (and export, unless it is `none`) once per process; failure to
/// spawn is logged and leaves windows to be processed at `finalize` only. Returns whether the
/// thread runs. Called on: NCCL's init thread.
pub fn start() -> bool {
    *THREAD.get_or_init(|| {
        let config = Config::global();
        OWNER.store(std::process::id(), Ordering::Relaxed);
        export::install(&config.export);
        let spawned = std::thread::Builder::new()
            .name("nccl-otel-telemetry".into())
            .spawn(move || run(config));
        if let Err(e) = &spawned {
            tracing::warn!("cannot start the telemetry thread ({e}); windows are processed at finalize only");
        }
        spawned.is_ok()
    })
}

/// The thread's loop: wait a tick (or a flush request), poll, export. A panic in one pass is
/// counted and the loop goes on.
fn run(config: &'static Config) {
    let mut pipeline = Pipeline::new(config, Instant::now());
    loop {
        let request = {
            let mut c = CONTROL.lock();
            if c.requested == c.served {
                WAKE.wait_for(&mut c, TICK);
            }
            (c.requested > c.served).then(|| (c.requested, std::mem::take(&mut c.drain_live)))
        };
        let mut seq = None;
        let pass = catch_unwind(AssertUnwindSafe(|| {
            let now = Instant::now();
            poll_all(now);
            if request.is_some_and(|(_, drain)| drain) {
                drain_live(now, config.interval);
            }
            seq = pipeline.as_mut().and_then(|p| p.tick(now, request.is_some()));
        }));
        if pass.is_err() {
            STATS.panics.incr();
        }
        if let Some((generation, _)) = request {
            let mut c = CONTROL.lock();
            c.served = c.served.max(generation);
            c.seq = seq;
            SERVED.notify_all();
        }
    }
}

/// One pass over every communicator.
fn poll_all(now: Instant) {
    let secs_per_tick = clock::secs_per_tick();
    for comm in comm::all() {
        deliver(&comm.poll(now, secs_per_tick));
    }
}

/// Processes every window of the live communicators that holds records, as if the interval and
/// then the grace period were over: the current window closes, and closing windows are processed
/// with their open events counted unfinished. For the exit flush only: afterwards the windows'
/// clocks run ahead, so their time trigger fires late.
fn drain_live(now: Instant, interval: Duration) {
    let close = now + interval + comm::SETTLE;
    poll_all(close);
    poll_all(close + interval + comm::SETTLE);
}

/// How [`flush`] waits for the export it asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Until the request is done or the deadline passes (exit: the last chance).
    Always,
    /// Only while exports go through: with a failing or hung collector, a program that destroys
    /// communicators in a loop must not pay the timeout each time; the data follows with the
    /// next request that gets through.
    IfHealthy,
}

/// Asks the telemetry thread to process what was delivered (with `drain_live`, also the live
/// communicators' windows), then to export at once, and waits (see [`Wait`]) until that export
/// finished or `deadline` passed. Returns whether it finished in time. Never calls into the SDK
/// here, never waits past `deadline`, returns at once in a forked child or without a telemetry
/// thread. Called on: a finalizing NCCL thread, the exiting thread (atexit).
pub fn flush(deadline: Instant, drain_live: bool, wait: Wait) -> bool {
    if !running() {
        return false;
    }
    let seq = {
        let mut c = CONTROL.lock();
        c.requested += 1;
        c.drain_live |= drain_live;
        let generation = c.requested;
        WAKE.notify_one();
        while c.served < generation {
            if SERVED.wait_until(&mut c, deadline).timed_out() && c.served < generation {
                return false;
            }
        }
        c.seq
    };
    if wait == Wait::IfHealthy && !export::healthy() {
        return false;
    }
    seq.is_none_or(|seq| export::wait_exported(seq, deadline))
}

/// The deadline of a flush started now: the export timeout plus [`FLUSH_MARGIN`].
pub fn flush_deadline() -> Instant {
    Instant::now() + Config::global().export.timeout + FLUSH_MARGIN
}

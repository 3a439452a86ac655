//! Flushing with a deadline: a finalizing or exiting thread asks the telemetry thread to process
//! and export at once, and waits for that export, never past its deadline.
//! Called on: a finalizing NCCL thread, the exiting thread (atexit) ([`flush`]); the telemetry
//! thread ([`next_request`], [`serve`]); NCCL's init thread ([`set_delivery`]).
#![forbid(unsafe_code)]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::Delivery;
use super::process::running;
use crate::config::Config;

/// Added to the export timeout for a flush's deadline: the telemetry thread's own work.
pub const FLUSH_MARGIN: Duration = Duration::from_millis(250);

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
    /// A communicator became live: a parked telemetry thread resumes its ticks.
    woken: bool,
}

static CONTROL: Mutex<Control> = Mutex::new(Control {
    requested: 0,
    served: 0,
    seq: None,
    drain_live: false,
    woken: false,
});
/// Wakes the telemetry thread for a flush, or to resume its ticks.
static WAKE: Condvar = Condvar::new();
/// Tells flushers a request was served.
static SERVED: Condvar = Condvar::new();
/// The export queue, when export is on.
static DELIVERY: OnceLock<&'static dyn Delivery> = OnceLock::new();
/// The export request a flush stopped waiting for at its deadline, and that deadline: while it is
/// pending (a hung collector), later flushes wait no longer, so shutdown costs one wait in all.
static STALLED: Mutex<Option<(u64, Instant)>> = Mutex::new(None);

/// Sets the export queue flushes wait on (once per process).
pub fn set_delivery(delivery: &'static dyn Delivery) {
    let _ = DELIVERY.set(delivery);
}

/// Flush requests pending when the telemetry thread took them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// The newest request number taken.
    generation: u64,
    /// Whether the live communicators' windows are to be processed too.
    pub drain_live: bool,
}

/// Waits up to `tick` (`None`: parked, until [`wake`] or a flush) for a flush request; the
/// pending requests, if any.
pub fn next_request(tick: Option<Duration>) -> Option<Request> {
    let mut c = CONTROL.lock();
    if c.requested == c.served && !c.woken {
        match tick {
            Some(tick) => {
                WAKE.wait_for(&mut c, tick);
            }
            None => {
                while c.requested == c.served && !c.woken {
                    WAKE.wait(&mut c);
                }
            }
        }
    }
    c.woken = false;
    (c.requested > c.served).then(|| Request {
        generation: c.requested,
        drain_live: std::mem::take(&mut c.drain_live),
    })
}

/// Whether export request `seq` is finished and exports go through (true without export).
/// Called on: the telemetry thread.
pub fn exported(seq: u64) -> bool {
    DELIVERY
        .get()
        .is_none_or(|d| d.wait_exported(seq, Instant::now()) && d.healthy())
}

/// Resumes a parked telemetry thread (a communicator became live). Called on: NCCL's init thread.
pub fn wake() {
    let mut c = CONTROL.lock();
    c.woken = true;
    WAKE.notify_one();
}

/// Answers `request`: the export it queued (`seq`), if any.
pub fn serve(request: Request, seq: Option<u64>) {
    let mut c = CONTROL.lock();
    c.served = c.served.max(request.generation);
    c.seq = seq;
    SERVED.notify_all();
}

/// Asks the telemetry thread to process what was delivered (with `drain_live`, also the live
/// communicators' windows), then to export at once, and waits until that export finished or
/// `deadline` passed, or the deadline of an earlier flush whose request is still pending
/// ([`STALLED`]); not at all while exports fail: with a failing or hung collector, a program
/// that destroys communicators in a loop must not pay the timeout each time, nor an exit after a
/// last `finalize` that already waited (the data follows with the next request that gets
/// through). Never calls into the SDK here, never waits past `deadline`, returns at once in a
/// forked child or without a telemetry thread.
/// Called on: a finalizing NCCL thread, the exiting thread (atexit).
pub fn flush(deadline: Instant, drain_live: bool) {
    if !running() {
        return;
    }
    let seq = {
        let mut c = CONTROL.lock();
        c.requested += 1;
        c.drain_live |= drain_live;
        let generation = c.requested;
        WAKE.notify_one();
        while c.served < generation {
            if SERVED.wait_until(&mut c, deadline).timed_out() && c.served < generation {
                return;
            }
        }
        c.seq
    };
    let (Some(seq), Some(delivery)) = (seq, DELIVERY.get()) else {
        return;
    };
    if !delivery.healthy() {
        return;
    }
    let deadline = match *STALLED.lock() {
        Some((pending, at)) if !delivery.wait_exported(pending, Instant::now()) => deadline.min(at),
        _ => deadline,
    };
    if !delivery.wait_exported(seq, deadline) {
        *STALLED.lock() = Some((seq, deadline));
    }
}

/// The deadline of a flush started now: the export timeout plus [`FLUSH_MARGIN`].
pub fn flush_deadline() -> Instant {
    Instant::now() + Config::global().export.timeout + FLUSH_MARGIN
}

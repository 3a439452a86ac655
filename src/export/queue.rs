//! The export queue between the telemetry thread (which queues one request per interval) and the
//! exporter thread (which sends them in order), and the export counters. At most `capacity`
//! requests wait: the oldest is dropped and counted.
//! Called on: the telemetry thread ([`enqueue`], [`take_error`]); the exporter thread ([`next`],
//! [`finish`]); a flushing NCCL thread ([`QueueDelivery`]); any thread ([`stats`]).
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use opentelemetry_sdk::metrics::data::ResourceMetrics;
use parking_lot::{Condvar, Mutex};

use crate::telemetry::{self, Delivery};

/// Counters of the export machinery; exported as self-telemetry, and read by tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportStats {
    /// Requests the exporter delivered.
    pub exported: u64,
    /// Requests the exporter failed to deliver (error, timeout, refused, HTTP/gRPC status).
    pub failures: u64,
    /// Requests dropped from a full queue.
    pub dropped: u64,
    /// Requests waiting now (the one in flight excluded).
    pub queued: u64,
    /// Window summaries dropped from a full inbox.
    pub windows_dropped: u64,
    /// Measurements that went to an overflow series.
    pub overflow: u64,
}

static EXPORTED: AtomicU64 = AtomicU64::new(0);
static FAILURES: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
static OVERFLOW: AtomicU64 = AtomicU64::new(0);
/// Whether the last request went through (true before the first).
static HEALTHY: AtomicBool = AtomicBool::new(true);

/// A snapshot of the export counters. Called on: any thread.
pub fn stats() -> ExportStats {
    ExportStats {
        exported: EXPORTED.load(Ordering::Relaxed),
        failures: FAILURES.load(Ordering::Relaxed),
        dropped: DROPPED.load(Ordering::Relaxed),
        queued: QUEUE.state.lock().requests.len() as u64,
        windows_dropped: telemetry::inbox::windows_dropped(),
        overflow: OVERFLOW.load(Ordering::Relaxed),
    }
}

/// Counts `n` measurements recorded into an overflow series.
pub fn count_overflow(n: u64) {
    OVERFLOW.fetch_add(n, Ordering::Relaxed);
}

struct QueueState {
    /// (sequence number, request), oldest first.
    requests: VecDeque<(u64, ResourceMetrics)>,
    capacity: usize,
    /// Sequence number of the last request queued.
    queued: u64,
    /// Every request up to this sequence number is finished: sent or failed, or dropped before a
    /// later one that was.
    done: u64,
    /// The last error, until the telemetry thread logs it.
    error: Option<String>,
}

struct Queue {
    state: Mutex<QueueState>,
    /// Wakes the exporter thread.
    work: Condvar,
    /// Wakes [`QueueDelivery::wait_exported`].
    progress: Condvar,
}

static QUEUE: Queue = Queue {
    state: Mutex::new(QueueState {
        requests: VecDeque::new(),
        capacity: 1,
        queued: 0,
        done: 0,
        error: None,
    }),
    work: Condvar::new(),
    progress: Condvar::new(),
};

/// Sets how many requests may wait. Called on: NCCL's init thread, before the first request.
pub fn set_capacity(capacity: usize) {
    QUEUE.state.lock().capacity = capacity;
}

/// Queues one request; returns its sequence number. Drops the oldest waiting one when full.
pub fn enqueue(rm: ResourceMetrics) -> u64 {
    let mut q = QUEUE.state.lock();
    // A dropped request is not `done`: a flush waiting for it waits for a later request (which
    // carries the dropped one's cumulative totals) to be sent.
    while q.requests.len() >= q.capacity && q.requests.pop_front().is_some() {
        DROPPED.fetch_add(1, Ordering::Relaxed);
    }
    q.queued += 1;
    let seq = q.queued;
    q.requests.push_back((seq, rm));
    QUEUE.work.notify_one();
    QUEUE.progress.notify_all();
    seq
}

/// The oldest waiting request, waiting for one. Called on: the exporter thread.
pub fn next() -> (u64, ResourceMetrics) {
    let mut q = QUEUE.state.lock();
    loop {
        if let Some(next) = q.requests.pop_front() {
            return next;
        }
        QUEUE.work.wait(&mut q);
    }
}

/// Records how request `seq` ended and wakes its waiters. Called on: the exporter thread.
pub fn finish(seq: u64, result: Result<(), String>) {
    let mut q = QUEUE.state.lock();
    HEALTHY.store(result.is_ok(), Ordering::Relaxed);
    match result {
        Ok(()) => EXPORTED.fetch_add(1, Ordering::Relaxed),
        Err(e) => {
            q.error = Some(e);
            FAILURES.fetch_add(1, Ordering::Relaxed)
        }
    };
    q.done = q.done.max(seq);
    QUEUE.progress.notify_all();
}

/// The last export error not yet taken. Called on: the telemetry thread.
pub fn take_error() -> Option<String> {
    QUEUE.state.lock().error.take()
}

/// The queue as [`crate::telemetry::flush`] sees it.
pub struct QueueDelivery;

/// The one queue of the process.
pub static DELIVERY: QueueDelivery = QueueDelivery;

impl Delivery for QueueDelivery {
    fn healthy(&self) -> bool {
        HEALTHY.load(Ordering::Relaxed)
    }

    fn wait_exported(&self, seq: u64, deadline: Instant) -> bool {
        let mut q = QUEUE.state.lock();
        while q.done < seq {
            if QUEUE.progress.wait_until(&mut q, deadline).timed_out() {
                return q.done >= seq;
            }
        }
        true
    }
}

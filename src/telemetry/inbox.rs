//! The inbox: the sink that hands summaries from any delivering thread to the telemetry thread's
//! export pipeline, bounded at [`INBOX_CAPACITY`] (the oldest is dropped and counted).
//! Called on: the telemetry thread or a finalizing NCCL thread ([`Inbox`]); the telemetry thread
//! ([`take`]); any thread ([`windows_dropped`]). Never records into OpenTelemetry itself.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::Sink;
use crate::aggregate::WindowSummary;

/// Summaries waiting for the telemetry thread; the oldest is dropped (and counted) beyond this.
pub const INBOX_CAPACITY: usize = 256;

static INBOX: Mutex<VecDeque<WindowSummary>> = Mutex::new(VecDeque::new());
static WINDOWS_DROPPED: AtomicU64 = AtomicU64::new(0);

/// The sink in front of the export pipeline: a short lock and a clone.
pub struct Inbox;

impl Sink for Inbox {
    fn window(&self, summary: &WindowSummary) {
        let mut inbox = INBOX.lock();
        if inbox.len() >= INBOX_CAPACITY {
            inbox.pop_front();
            WINDOWS_DROPPED.fetch_add(1, Ordering::Relaxed);
        }
        inbox.push_back(summary.clone());
    }
}

/// Every summary waiting, oldest first.
pub fn take() -> VecDeque<WindowSummary> {
    std::mem::take(&mut *INBOX.lock())
}

/// Summaries dropped from the full inbox so far.
pub fn windows_dropped() -> u64 {
    WINDOWS_DROPPED.load(Ordering::Relaxed)
}

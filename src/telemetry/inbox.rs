//! The inbox: hands the summaries other threads deliver (a finalizing NCCL thread) to the
//! telemetry thread's export pipeline, bounded at [`INBOX_CAPACITY`] (the oldest is dropped and
//! counted). The telemetry thread's own summaries go to the pipeline directly.
//! Called on: NCCL's init thread (`open`); a finalizing NCCL thread (`push`); the telemetry
//! thread ([`take`]); any thread ([`windows_dropped`]). Never records into OpenTelemetry itself.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::aggregate::WindowSummary;

/// Summaries waiting for the telemetry thread; the oldest is dropped (and counted) beyond this.
pub const INBOX_CAPACITY: usize = 256;

static INBOX: Mutex<VecDeque<WindowSummary>> = Mutex::new(VecDeque::new());
static WINDOWS_DROPPED: AtomicU64 = AtomicU64::new(0);
/// Whether an export pipeline reads the inbox (set once, before the telemetry thread starts).
static OPEN: AtomicBool = AtomicBool::new(false);

/// Opens the inbox: an export pipeline will take what [`push`] puts in.
pub(super) fn open() {
    OPEN.store(true, Ordering::Relaxed);
}

/// Puts clones of `summaries` in the inbox when it is open: a short lock.
pub(super) fn push(summaries: &[WindowSummary]) {
    if summaries.is_empty() || !OPEN.load(Ordering::Relaxed) {
        return;
    }
    let mut inbox = INBOX.lock();
    for summary in summaries {
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

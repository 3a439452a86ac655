//! Loom model of one window: two producers claim and publish in one lane while the consumer
//! scans, closes, seals, reads (giving up on slots not yet published, as `Comm::process` does),
//! drains, resets and reopens it, and a producer may still claim after the reopen. Loom reports
//! any concurrent access to a slot's `UnsafeCell`.
//! Run: `bash .ci/loom.sh`.

use loom::sync::Arc;
use loom::thread;

use super::window::{Claim, Entry, Window, WindowState, Windows};
use crate::record::Body;

/// Pushes the record `id` into lane 0.
fn push(w: &Window, id: u64) -> Option<Claim> {
    w.push(0, Entry::new(0, id, Body::Stop)?, |_| id)
}

/// One window of `capacity` slots per lane, with its consumer lock.
fn one(capacity: u32) -> Arc<Windows<(), 1>> {
    Arc::new(Windows::new([Window::new(capacity).unwrap()], ()))
}

/// Producers 1 and 2 each push one record; returns their handles.
fn producers(w: &Arc<Windows<(), 1>>) -> Vec<thread::JoinHandle<Option<(Claim, u64)>>> {
    (1..=2)
        .map(|id| {
            let w = w.clone();
            thread::spawn(move || push(&w[0], id).map(|c| (c, id)))
        })
        .collect()
}

/// The consumer's cycle with a reader that does not wait: every record it does read is the one
/// its claimer wrote; the window becomes READY only once every claimed slot is published.
fn consume(w: &Windows<(), 1>) -> Vec<Option<u64>> {
    let held = w.lock();
    let [w] = held.windows();
    let _ = w.published(0); // the CLOSING scan, concurrent with producers
    assert!(w.close());
    let n = w.seal().unwrap();
    let seen: Vec<Option<u64>> = w.lane_slots(0, n[0]).map(|s| w.published(s).map(|r| r.id)).collect();
    while !w.reset(n) {
        assert_eq!(
            w.state(),
            WindowState::Processing,
            "draining until every claim is stamped"
        );
        thread::yield_now();
    }
    seen
}

#[test]
fn give_up_drain_reset_and_reopen() {
    loom::model(|| {
        let ws = one(2);
        assert!(ws.lock().windows()[0].open());
        let handles = producers(&ws);
        let seen = consume(&ws);
        let held = ws.lock();
        let [w] = held.windows();
        for (slot, id) in seen.iter().enumerate() {
            assert!(
                id.is_none_or(|id| id == 1 || id == 2),
                "slot {slot} holds a record its claimer wrote"
            );
        }
        assert!(w.open());
        // Both producers may have claimed the two slots after the reopen: then there is no room.
        if let Some(mine) = push(&w, 3) {
            assert_eq!(w.published(mine.slot).map(|r| r.id), Some(3));
        }
        for h in handles {
            if let Some((claim, id)) = h.join().unwrap() {
                // A claim in the first epoch was read above or counted; one after the reopen is
                // readable in the new epoch.
                if claim.epoch == 2 {
                    assert_eq!(w.published(claim.slot).map(|r| r.id), Some(id));
                } else if let Some(read) = seen.get(claim.slot as usize).copied().flatten() {
                    assert_eq!(read, id);
                }
            }
        }
    });
}

#[test]
fn a_full_window_refuses_without_writing() {
    loom::model(|| {
        let ws = one(1);
        assert!(ws.lock().windows()[0].open());
        let handles = producers(&ws);
        let seen = consume(&ws);
        let claims: Vec<_> = handles.into_iter().filter_map(|h| h.join().unwrap()).collect();
        assert!(claims.len() <= 1, "one slot, one claim");
        for (claim, id) in claims {
            assert_eq!(claim.epoch, 1);
            assert!(seen[0].is_none_or(|read| read == id));
        }
    });
}

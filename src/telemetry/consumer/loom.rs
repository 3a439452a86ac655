//! Loom model of a communicator's routing ([`Comm::start`], [`Comm::append`]): NCCL's user thread
//! starts the root that reaches the count trigger and stops it, its proxy thread starts and stops
//! a child of an earlier root, while the consumer's tick switches to the standby window, closes
//! the window it replaced and arms the next. Whatever the interleaving: nothing is dropped while
//! a window has room, every handle names the window and slot holding its start, every stop lands
//! once, and one window is current and FILLING. A second model races a root escalating the
//! level of a window past its trigger with no standby against the consumer arming one.
//! Run: `bash .ci/loom.sh`.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;

use super::tests::{coll, live_with, no_standby, proxy_op};
use crate::comm::{Comm, DropCounts, NONE, WINDOWS};
use crate::buffer::window::WindowState;
use crate::record::Body;
use crate::record::handle::LANES;

/// How many records of the windows' lanes (as claimed so far) have `id` and satisfy `what`.
fn count(comm: &Comm, id: u64, what: impl Fn(&Body) -> bool) -> usize {
    let mut n = 0;
    let held = comm.windows.lock();
    for w in held.windows() {
        for lane in 0..LANES {
            let claimed = w.lane_claimed(lane) as u32;
            n += w
                .lane_slots(lane, claimed)
                .filter_map(|s| w.published(s))
                .filter(|r| r.id == id && what(&r.body))
                .count();
        }
    }
    n
}

#[test]
fn routing_while_the_consumer_switches_windows() {
    loom::model(|| {
        // Windows of 8 slots a lane, switching at 2 claims: the user's root reaches the trigger.
        let (comm, t0) = live_with(8, 2);
        let comm = Arc::new(comm);
        let first = coll(&comm, 1).expect("a window has room");
        let user = {
            let comm = comm.clone();
            thread::spawn(move || {
                let h = coll(&comm, 2).expect("a window has room");
                comm.append(h, 3, Body::Stop);
                h
            })
        };
        let proxy = {
            let comm = comm.clone();
            thread::spawn(move || {
                let h = proxy_op(&comm, first).expect("a window has room");
                comm.append(h, 4, Body::Stop);
                h
            })
        };
        // The telemetry thread's tick, an interval after the first window opened.
        comm.slot().rotate(t0 + Duration::from_secs(2));
        let handles = [first, user.join().unwrap(), proxy.join().unwrap()];

        assert_eq!(comm.drop_counts(), DropCounts::default(), "nothing dropped");
        for h in handles {
            let start = comm.windows.lock().windows()[usize::from(h.window())].published(h.slot());
            assert_eq!(start.map(|r| r.id), Some(h.encode()), "{h:?} names its start");
        }
        for h in &handles[1..] {
            let stops = count(&comm, h.encode(), |b| matches!(b, Body::Stop));
            assert_eq!(stops, 1, "one stop of {h:?}");
        }
        let r = comm.route_now();
        let (cur, standby) = (usize::from(r.current), r.standby);
        assert_eq!(comm.windows[cur].state(), WindowState::Filling);
        if standby != NONE {
            let s = usize::from(standby);
            assert!(s < WINDOWS && s != cur, "standby {s}, current {cur}");
            assert_eq!(comm.windows[s].state(), WindowState::Filling);
            assert_eq!(comm.windows[s].claimed(), 0, "the standby window is empty");
        }
    });
}

#[test]
fn escalation_while_the_consumer_arms() {
    loom::model(|| {
        // Switching at 1 claim, no standby: the second root holds two multiples of the trigger.
        let (comm, _) = live_with(8, 1);
        no_standby(&comm);
        let comm = Arc::new(comm);
        coll(&comm, 1).expect("a window has room");
        let user = {
            let comm = comm.clone();
            thread::spawn(move || coll(&comm, 2).expect("a window has room"))
        };
        let slot = comm.slot();
        slot.arm(&slot.lock());
        let h = user.join().unwrap();

        // The root went to window 0, the current one when it started. Then it found the
        // standby and switched to it (level 0), or found none and escalated window 0 (to 2: the
        // consumer's arming keeps that level), or found none and then the standby armed.
        assert_eq!(h.window(), 0);
        let r = comm.route_now();
        match r.current {
            0 => assert!(r.standby == 1 && matches!(r.level, 0 | 2), "{r:?}"),
            _ => assert_eq!((r.current, r.level, r.standby), (1, 0, NONE), "{r:?}"),
        }
        assert_eq!(comm.windows[usize::from(r.current)].state(), WindowState::Filling);
        assert_eq!(comm.drop_counts(), DropCounts::default(), "nothing dropped");
    });
}

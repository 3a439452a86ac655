//! Unit tests of the producer and consumer rules on one communicator outside the registry:
//! routing of roots, children, states and stops; the admission cap that keeps room for stops;
//! spilled windows and orphans; late stops. The consumer is driven with synthetic times.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::time::{Duration, Instant};

use super::{Comm, ROOT_SHARE, SETTLE};
use crate::aggregate::{CommMeta, WindowSummary};
use crate::config::Config;
use crate::record::handle::{CommId, Handle, Kind};
use crate::record::{Algo, Body, CollStart, Datatype, Func, Proto, ProxyOpStart};

const INTERVAL: Duration = Duration::from_secs(1);
const ID: CommId = CommId { slot: 0, generation: 1 };

/// A live communicator with windows of `capacity` slots, and the time its windows started.
fn live(capacity: u32) -> (Comm, Instant) {
    let config = Config {
        capacity,
        count_trigger: capacity,
        interval: INTERVAL,
        ..Config::default()
    };
    let comm = Comm::new(ID.slot, &config).unwrap();
    let meta = CommMeta {
        hash: 0xC0,
        name: "unit".into(),
        rank: 0,
        nranks: 2,
        nnodes: 2,
    };
    comm.activate(&mut comm.consumer.lock(), u32::from(ID.generation), meta, &config);
    (comm, Instant::now())
}

fn coll(comm: &Comm, ts: u64) -> Option<Handle> {
    let body = Body::Coll(CollStart {
        seq: 0,
        count: 256,
        func: Func::AllReduce,
        algo: Algo::Ring,
        proto: Proto::Simple,
        datatype: Datatype::Float32,
        n_channels: 1,
    });
    comm.start(ID, Kind::Coll, None, ts, body).and_then(Handle::decode)
}

fn proxy_op(comm: &Comm, parent: Handle) -> Option<Handle> {
    let body = Body::ProxyOp(ProxyOpStart {
        parent: parent.encode(),
        rank: 0,
        peer: 1,
        channel: 0,
    });
    comm.start(ID, Kind::ProxyOp, Some(parent), 0, body)
        .and_then(Handle::decode)
}

/// Polls at `t0 + at`; the summaries of the windows processed then.
fn poll(comm: &Comm, t0: Instant, at: Duration) -> Vec<WindowSummary> {
    comm.poll(t0 + at, 1.0)
}

#[test]
fn roots_go_to_the_current_window_children_and_stops_to_their_parents() {
    let (comm, t0) = live(64);
    let c = coll(&comm, 10).unwrap();
    assert_eq!(c.window, 0);
    assert!(
        poll(&comm, t0, INTERVAL).is_empty(),
        "window 0 closes, window 1 takes new roots"
    );
    let later = coll(&comm, 30).unwrap();
    assert_eq!(later.window, 1);

    // A child of the collective in the CLOSING window 0 joins it there; its stop too.
    let op = proxy_op(&comm, c).unwrap();
    assert_eq!(op.window, 0);
    comm.append(op, 20, Body::Stop);
    comm.append(c, 11, Body::Stop);
    // A parent from another communicator is not ours: the child goes to the current window.
    let foreign = Handle {
        comm: CommId { slot: 9, generation: 1 },
        ..c
    };
    assert_eq!(proxy_op(&comm, foreign).unwrap().window, 1);

    let done = poll(&comm, t0, INTERVAL + SETTLE);
    assert_eq!(done.len(), 1, "window 0 settled: every event it holds stopped");
    let ops = &done[0].colls[0].ops;
    assert_eq!((ops.len(), ops[0].duration), (1, Some(10.0)), "start 10 → op stop 20");
    assert_eq!(done[0].stats.orphans, 0);
    assert_eq!(comm.drop_counts(), Default::default());
}

#[test]
fn new_events_leave_room_for_the_stops_of_those_already_in() {
    let capacity = 16;
    let (comm, _) = live(capacity);
    let limit = u64::from(capacity) * ROOT_SHARE.0 / ROOT_SHARE.1;
    let roots: Vec<Handle> = (0..limit).map(|i| coll(&comm, i).unwrap()).collect();
    assert!(coll(&comm, 99).is_none(), "past the root share a new event is refused");
    assert_eq!(comm.drop_counts().full, 1);
    // The rest of the window is for children, states and stops of the events in it.
    assert_eq!(proxy_op(&comm, roots[0]).unwrap().window, 0);
    for r in &roots[..3] {
        comm.append(*r, 100, Body::Stop);
    }
    assert_eq!(comm.drop_counts().full, 1, "every stop found room");
    comm.append(roots[3], 100, Body::Stop);
    assert_eq!(
        comm.drop_counts().full,
        2,
        "a full window drops and counts, never waits"
    );
}

#[test]
fn a_child_that_cannot_join_its_full_parent_window_spills_and_is_an_orphan_elsewhere() {
    let (comm, t0) = live(8);
    let c = coll(&comm, 0).unwrap();
    comm.append(c, 1, Body::Stop);
    assert!(poll(&comm, t0, INTERVAL).is_empty());
    for _ in 0..3 {
        let op = proxy_op(&comm, c).unwrap();
        assert_eq!(op.window, 0);
        comm.append(op, 5, Body::Stop);
    }
    let spilled = proxy_op(&comm, c).unwrap();
    assert_eq!(
        spilled.window, 1,
        "window 0 is full: the child goes to the current window"
    );
    comm.append(spilled, 6, Body::Stop);
    assert_eq!(comm.drop_counts().full, 0);

    let first = poll(&comm, t0, INTERVAL + SETTLE);
    assert_eq!(first.len(), 1);
    assert!(first[0].stats.spilled, "window 0 is marked spilled");
    assert_eq!(
        first[0].colls[0].ops[0].duration, None,
        "its durations are withheld, not short"
    );
    // The spill flag belongs to that window's cycle only.
    let next = coll(&comm, 50).unwrap();
    comm.append(next, 51, Body::Stop);
    assert!(poll(&comm, t0, 2 * INTERVAL).is_empty(), "window 1 closes");
    let second = poll(&comm, t0, 2 * INTERVAL + SETTLE);
    assert_eq!(second.len(), 1);
    assert!(!second[0].stats.spilled);
    assert_eq!(second[0].stats.orphans, 1, "the spilled child is an orphan in window 1");
}

#[test]
fn a_stop_after_its_window_was_recycled_is_counted_late() {
    let (comm, t0) = live(64);
    let c = coll(&comm, 0).unwrap();
    assert!(poll(&comm, t0, INTERVAL).is_empty());
    // Never stopped: window 0 is processed when its grace period (one interval) is over.
    let forced = poll(&comm, t0, 2 * INTERVAL);
    assert_eq!(forced.len(), 1);
    assert!(forced[0].stats.forced);
    assert_eq!(forced[0].stats.unfinished, 1);
    comm.append(c, 1, Body::Stop);
    assert_eq!(comm.drop_counts().late, 1);
    assert_eq!(comm.drop_counts().full, 0);
}

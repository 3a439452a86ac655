//! Loom model of a communicator's routing ([`Comm::start`], [`Comm::append`]): NCCL's user thread
//! starts the root that reaches the count trigger and stops it, its proxy thread starts and stops
//! a child of an earlier root, while the consumer's tick switches to the standby window, closes
//! the window it replaced and arms the next. Whatever the interleaving: nothing is dropped while
//! a window has room, every handle names the window and slot holding its start, every stop lands
//! once, and one window is current and FILLING.
//! Run: `RUSTFLAGS="--cfg nccl_loom" cargo test --release --lib comm::loom`.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::time::{Duration, Instant};

use loom::sync::Arc;
use loom::thread;

use super::{Comm, DropCounts, NONE, Ordering, WINDOWS, split};
use crate::aggregate::CommMeta;
use crate::buffer::window::WindowState;
use crate::config::Config;
use crate::record::handle::{CommId, Handle, Kind, LANES};
use crate::record::{Algo, Body, CollStart, Datatype, Func, Proto, ProxyOpStart};

const ID: CommId = CommId { slot: 0, generation: 1 };

/// A live communicator whose windows have 8 slots a lane, switching at 2 claims.
fn comm() -> Comm {
    let config = Config {
        capacity: 8,
        count_trigger: 2,
        interval: Duration::from_secs(1),
        ..Config::default()
    };
    let comm = Comm::new(ID.slot, &config).unwrap();
    let meta = CommMeta {
        hash: 0xC0,
        name: "loom".into(),
        rank: 0,
        nranks: 2,
        nnodes: 2,
    };
    comm.activate(&mut comm.consumer.lock(), u32::from(ID.generation), meta, &config);
    comm
}

fn coll(comm: &Comm) -> u64 {
    let body = Body::Coll(CollStart {
        seq: 0,
        count: 256,
        func: Func::AllReduce,
        algo: Algo::Ring,
        proto: Proto::Simple,
        datatype: Datatype::Float32,
        n_channels: 1,
        graph: None,
    });
    comm.start(ID, Kind::Coll, None, 1, body).expect("a window has room")
}

/// A send ProxyOp, child of `parent` (untimed, as the hot path starts children).
fn proxy_op(comm: &Comm, parent: u64) -> u64 {
    let body = Body::ProxyOp(ProxyOpStart {
        parent,
        rank: 0,
        peer: 1,
        channel: 0,
        send: true,
        origin: 0,
    });
    let parent = Handle::decode(parent);
    comm.start(ID, Kind::ProxyOp, parent, 0, body)
        .expect("a window has room")
}

/// How many records of the windows' lanes (as claimed so far) have `id` and satisfy `what`.
fn count(comm: &Comm, id: u64, what: impl Fn(&Body) -> bool) -> usize {
    let mut n = 0;
    for w in &comm.windows {
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
        let comm = Arc::new(comm());
        let first = coll(&comm);
        let t0 = Instant::now();
        let user = {
            let comm = comm.clone();
            thread::spawn(move || {
                let h = coll(&comm);
                comm.append(Handle::decode(h).unwrap(), 3, Body::Stop);
                h
            })
        };
        let proxy = {
            let comm = comm.clone();
            thread::spawn(move || {
                let h = proxy_op(&comm, first);
                comm.append(Handle::decode(h).unwrap(), 4, Body::Stop);
                h
            })
        };
        // The telemetry thread's tick, an interval after the first window opened.
        comm.rotate(t0 + Duration::from_secs(2));
        let handles = [first, user.join().unwrap(), proxy.join().unwrap()];

        assert_eq!(comm.drop_counts(), DropCounts::default(), "nothing dropped");
        for &h in &handles {
            let d = Handle::decode(h).unwrap();
            let start = comm.windows[usize::from(d.window)].published(d.slot);
            assert_eq!(start.map(|r| r.id), Some(h), "{d:?} names its start");
        }
        for &h in &handles[1..] {
            assert_eq!(count(&comm, h, |b| matches!(b, Body::Stop)), 1, "one stop of {h:#x}");
        }
        let (cur, standby) = split(comm.route.load(Ordering::Relaxed));
        let cur = usize::from(cur);
        assert_eq!(comm.windows[cur].state(), WindowState::Filling);
        if standby != NONE {
            let s = usize::from(standby);
            assert!(s < WINDOWS && s != cur, "standby {s}, current {cur}");
            assert_eq!(comm.windows[s].state(), WindowState::Filling);
            assert_eq!(comm.windows[s].claimed(), 0, "the standby window is empty");
        }
    });
}

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use super::*;
use crate::record::{Algo, CollStart, Datatype, Proto, ProxyOpStart};

const SEC: Duration = Duration::from_secs(1);

/// Feeds records to a table at chosen times; handles are plain numbers.
struct Feed {
    f: Flight,
    t0: Instant,
}

impl Feed {
    fn new() -> Feed {
        Feed {
            f: Flight::new(2),
            t0: Instant::now(),
        }
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    fn rec(&mut self, ms: u64, id: u64, body: Body) {
        let now = self.at(ms);
        self.f.see(&Record { id, ts: ms, body }, now);
    }

    fn coll(&mut self, ms: u64, id: u64, seq: u64) {
        let c = CollStart {
            seq,
            count: 1 << 20,
            func: Func::AllReduce,
            algo: Algo::Ring,
            proto: Proto::Simple,
            datatype: Datatype::Int8,
            n_channels: 1,
            graph: None,
            sample: crate::record::Sample::ALL,
        };
        self.rec(ms, id, Body::Coll(c));
    }

    fn op(&mut self, ms: u64, id: u64, parent: u64, peer: i32, send: bool) {
        let o = ProxyOpStart {
            parent,
            rank: 0,
            peer,
            channel: 0,
            send,
            origin: 0,
        };
        self.rec(ms, id, Body::ProxyOp(o));
    }

    fn step(&mut self, ms: u64, id: u64, op: u64) {
        self.rec(ms, id, Body::ProxyStep { parent: op, step: 0 });
    }

    fn check(&mut self, ms: u64) -> Option<Hang> {
        let now = self.at(ms);
        self.f.check(now, SEC)
    }

    fn channel(&mut self, ms: u64) -> Stuck {
        self.check(ms).unwrap().channels[0]
    }
}

/// A collective (100) with a send op (10) to peer 1 and a progressing receive (11) from peer 1.
fn ring() -> Feed {
    let mut t = Feed::new();
    t.coll(0, 100, 7);
    t.op(0, 10, 100, 1, true);
    t.op(0, 11, 100, 1, false);
    t.rec(0, 11, Body::InProgress);
    t
}

#[test]
fn an_operation_completes_when_its_children_stopped() {
    let mut t = ring();
    t.step(1, 1, 10);
    t.rec(2, 1, Body::PeerWait);
    t.rec(2, 1, Body::SendWait { bytes: 8 });
    t.rec(3, 1, Body::Stop);
    t.rec(3, 10, Body::Stop);
    assert_eq!(t.f.snapshot(t.at(3)).in_flight, 1, "the receive is still open");
    t.rec(4, 11, Body::Stop);
    let s = t.f.snapshot(t.at(5));
    assert_eq!((s.in_flight, s.oldest, s.hang), (0, None, None));
    assert_eq!(s.completed, vec![(Func::AllReduce, 7)]);
}

#[test]
fn each_wait_kind_and_one_episode_per_stall() {
    let mut t = ring();
    t.step(1, 1, 10);
    assert_eq!(t.check(900), None, "below the threshold");
    assert_eq!(
        t.channel(1001).wait,
        Wait::Recv,
        "sends wait for the GPU, which waits for peer 1's data"
    );
    assert_eq!(t.check(1500), None, "the same episode");
    t.rec(1600, 1, Body::PeerWait);
    assert_eq!(t.check(1700), None, "progress ends the episode");
    assert_eq!(
        t.channel(2600),
        Stuck {
            channel: 0,
            wait: Wait::Peer,
            peer: Some(1)
        }
    );
    t.rec(2700, 1, Body::SendWait { bytes: 8 });
    assert_eq!(t.channel(3700).wait, Wait::Network);
    t.rec(3800, 1, Body::Stop);
    let stuck = t.channel(4800);
    assert_eq!((stuck.wait, stuck.peer), (Wait::Proxy, None), "steps left, none posted");
    let s = t.f.snapshot(t.at(5000));
    assert_eq!(s.episodes, 4);
    let hang = s.hang.unwrap();
    assert_eq!((hang.func, hang.seq, hang.bytes), (Func::AllReduce, Some(7), 1 << 20));
    assert_eq!(hang.idle, Duration::from_millis(1200));
    assert!(hang.to_string().contains("AllReduce seq 7"), "{hang}");
}

#[test]
fn a_send_without_a_receive_waits_for_the_local_gpu() {
    let mut t = Feed::new();
    t.coll(0, 100, 1);
    t.op(0, 10, 100, 1, true);
    assert_eq!(t.channel(1000).wait, Wait::Unknown, "no step events");
    t.step(1100, 1, 10);
    assert_eq!(
        t.channel(2100),
        Stuck {
            channel: 0,
            wait: Wait::Gpu,
            peer: None
        }
    );
}

#[test]
fn a_completion_completes_every_older_operation() {
    let mut t = ring();
    t.coll(10, 200, 8);
    t.op(10, 20, 200, 1, true);
    t.rec(20, 20, Body::Stop);
    let s = t.f.snapshot(t.at(30));
    assert_eq!(s.in_flight, 0, "100's stops were lost, but it finished before 200");
    assert_eq!(s.completed, vec![(Func::AllReduce, 8)]);
    assert!(t.f.ops.is_empty() || t.check(40).is_none());
    assert!(t.f.ops.is_empty());
}

#[test]
fn an_operation_without_children_is_not_followed() {
    let mut t = Feed::new();
    t.coll(0, 100, 1);
    t.rec(0, 100, Body::Stop);
    t.op(10, 11, 100, 1, false); // a receive that never progresses does not count
    assert_eq!(t.check(999), None);
    assert_eq!(t.f.snapshot(t.at(999)).in_flight, 1);
    assert_eq!(t.check(1000), None);
    assert_eq!(t.f.snapshot(t.at(1000)).in_flight, 0);
}

#[test]
fn kernels_count_and_unknown_children_are_ignored() {
    let mut t = Feed::new();
    t.coll(0, 100, 3);
    let k = Body::KernelCh {
        parent: 100,
        channel: 2,
        gpu_start: 5,
    };
    t.rec(0, 30, k);
    t.step(0, 1, 99); // op unknown
    t.rec(0, 1, Body::Stop);
    assert_eq!(
        t.channel(1000),
        Stuck {
            channel: 2,
            wait: Wait::Gpu,
            peer: None
        }
    );
    t.rec(1100, 30, Body::Stop);
    assert_eq!(t.f.snapshot(t.at(1100)).completed, vec![(Func::AllReduce, 3)]);
}

#[test]
fn data_the_gpu_has_not_consumed_names_the_gpu_not_the_peer() {
    let mut t = ring();
    t.step(1, 1, 10);
    let recv_step = |t: &mut Feed, ms, id, step| t.rec(ms, id, Body::RecvStep { parent: 11, step });
    recv_step(&mut t, 1, 20, 0);
    recv_step(&mut t, 1, 21, 1);
    t.rec(2, 20, Body::GpuWait);
    let stuck = t.channel(1002);
    assert_eq!((stuck.wait, stuck.peer), (Wait::Gpu, None), "step 0's data waits for the GPU");
    t.rec(1100, 20, Body::Stop);
    let stuck = t.channel(2100);
    assert_eq!((stuck.wait, stuck.peer), (Wait::Recv, Some(1)), "consumed: waiting for peer 1");
    // A restarted step (no state, no stop) and a lost stop: a later step's stop says the GPU
    // consumed everything before it.
    recv_step(&mut t, 2200, 22, 2);
    recv_step(&mut t, 2200, 23, 2);
    t.rec(2201, 23, Body::GpuWait);
    recv_step(&mut t, 2201, 24, 3);
    t.rec(2202, 24, Body::GpuWait);
    t.rec(2203, 24, Body::Stop);
    assert_eq!(t.channel(3300).wait, Wait::Recv, "step 2's stop was lost, step 3 stopped");
}

#[test]
fn legacy_send_ops_wait_for_their_peer_from_send_rem_fifo_wait() {
    let mut t = ring();
    let mark = |t: &mut Feed, ms, mark| t.rec(ms, 10, Body::OpBytes { mark, total: 0 });
    mark(&mut t, 1, Mark::Base);
    t.rec(2, 10, Body::PeerWait);
    let stuck = t.channel(1002);
    assert_eq!((stuck.wait, stuck.peer), (Wait::Peer, Some(1)), "SendRemFifoWait: peer 1");
    mark(&mut t, 1100, Mark::Sent);
    let stuck = t.channel(2100);
    assert_eq!((stuck.wait, stuck.peer), (Wait::Network, Some(1)), "transmitted, not done");
    mark(&mut t, 2200, Mark::Done);
    assert_eq!(t.channel(3200).wait, Wait::Unknown, "no step events, nothing waits");
}

#[test]
fn legacy_receives_say_whether_data_is_awaited() {
    let mut t = ring();
    let count = |t: &mut Feed, ms, received, steps| t.rec(ms, 11, Body::RecvCount { received, steps });
    count(&mut t, 1, false, 1);
    count(&mut t, 2, true, 1);
    count(&mut t, 3, false, 2);
    let stuck = t.channel(1003);
    assert_eq!((stuck.wait, stuck.peer), (Wait::Recv, Some(1)), "transfer 2 posted, not received");
    count(&mut t, 1100, true, 2);
    let stuck = t.channel(2100);
    assert_eq!((stuck.wait, stuck.peer), (Wait::Unknown, None), "nothing awaited, no step events");
}

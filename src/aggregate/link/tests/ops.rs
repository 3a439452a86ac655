//! One window's operations: collectives and sends with their ops, steps and kernel channels,
//! when a collective ends, host and GPU time, and how long peers kept an operation waiting.

use super::*;

#[test]
fn ring_allreduce_on_two_channels() {
    let mut w = Win::default();
    let c = w.coll(100, Func::AllReduce, 1024, Datatype::Float32);
    w.stop(c, 105); // "enqueued": not the end of the collective
    let a = w.op(110, c, 0, 1, 0);
    let b = w.op(112, c, 0, 1, 1);
    w.step(120, a, 1000, 10);
    w.step(121, b, 512, 5);
    w.step(140, a, 2000, 20);
    w.step(141, b, 1024, 8);
    w.step(160, a, 1096, 15);
    w.step(161, b, 2560, 30);
    w.stop(a, 300);
    let ka = w.kernel(310, c, 0, 1_000);
    w.rec(ka, 311, Body::KernelChStop { gpu_stop: 9_000 });
    w.stop(ka, 311);
    w.stop(b, 350);
    let s = w.sum();

    let (a_t, b_t) = (
        [t(1000, 10), t(2000, 20), t(1096, 15)],
        [t(512, 5), t(1024, 8), t(2560, 30)],
    );
    let all = [a_t[0], b_t[0], a_t[1], b_t[1], a_t[2], b_t[2]];
    assert_eq!(
        s.colls,
        vec![CollGroup {
            key: key(Func::AllReduce, Datatype::Float32, 4096),
            // Host time 100 → 350 ticks; one of two kernel channels: no GPU time.
            ops: vec![OpSample {
                bytes: 4096,
                start: 100.0 / 1024.0,
                duration: Some(250.0 / 1024.0),
                gpu: None,
                transfers: 6,
                waits: Waits::default(),
                sample: crate::record::Sample::ALL,
                bare: false,
            }],
            transfers: all.to_vec(),
        }]
    );
    assert_eq!(no_queue(&s.links), vec![link(0, 1, &all)]);
    assert_eq!(s.links[0].bytes, 8192);
    assert_eq!(s.channels, vec![channel(0, &a_t), channel(1, &b_t)]);
    assert!(s.p2ps.is_empty());
    assert_eq!(s.stats, stats(27, 0, 0));
    assert_eq!(s.comm, meta());
}

#[test]
fn p2p_send() {
    let mut w = Win::default();
    let p = w.start(
        1_000,
        Body::P2p(P2pStart {
            count: 256,
            peer: 5,
            datatype: Datatype::Float64,
            graph: None,
            sample: crate::record::Sample::ALL,
        }),
    );
    w.stop(p, 1_002);
    let op = w.op(1_010, p, 0, 5, 2);
    w.step(1_020, op, 1024, 40);
    w.step(1_030, op, 1024, 44);
    w.stop(op, 1_100);
    let s = w.sum();

    let ts = [t(1024, 40), t(1024, 44)];
    assert_eq!(
        s.p2ps,
        vec![P2pGroup {
            peer: 5,
            datatype: Datatype::Float64,
            size_class: size_class(2048),
            tag: 0,
            graph: None,
            ops: vec![OpSample {
                bytes: 2048,
                start: 1000.0 / 1024.0,
                duration: Some(100.0 / 1024.0),
                gpu: None,
                transfers: 2,
                waits: Waits::default(),
                sample: crate::record::Sample::ALL,
                bare: false,
            }],
            transfers: ts.to_vec(),
        }]
    );
    assert!(s.colls.is_empty());
    assert_eq!(no_queue(&s.links), vec![link(0, 5, &ts)]);
    assert_eq!(s.channels, vec![channel(2, &ts)]);
    assert_eq!(s.stats, stats(10, 0, 0));
}

#[test]
fn child_of_a_parent_in_another_window_is_an_orphan_but_counts_per_link_and_channel() {
    let mut w = Win::default();
    let earlier_window = handle(0, WIN.epoch, Kind::Coll, 0);
    let earlier_epoch = handle(WIN.window, WIN.epoch - 1, Kind::Coll, 0);
    let c = w.coll(10, Func::AllGather, 64, Datatype::Int8); // slot 0: same slot as both parents
    w.stop(c, 11);
    let a = w.op(20, earlier_window, 0, 1, 4);
    w.step(30, a, 300, 3);
    w.stop(a, 40);
    let b = w.op(50, earlier_epoch, 0, 2, 4);
    w.step(60, b, 600, 6);
    w.stop(b, 70);
    // A step whose op started in another window: no rank pair or channel to give it.
    w.step(80, handle(2, WIN.epoch, Kind::ProxyOp, 2), 999, 9);
    // A kernel channel of a collective from an earlier window.
    let k = w.kernel(90, earlier_window, 4, 5);
    w.rec(k, 91, Body::KernelChStop { gpu_stop: 50 });
    w.stop(k, 91);
    let s = w.sum();

    assert_eq!(
        s.colls,
        vec![CollGroup {
            key: key(Func::AllGather, Datatype::Int8, 256),
            ops: vec![OpSample {
                // 64 bytes per rank × 4 ranks.
                bytes: 256,
                start: 10.0 / 1024.0,
                duration: None,
                gpu: None,
                transfers: 0,
                waits: Waits::default(),
                sample: crate::record::Sample::ALL,
                bare: false,
            }],
            transfers: vec![],
        }]
    );
    assert_eq!(
        no_queue(&s.links),
        vec![link(0, 1, &[t(300, 3)]), link(0, 2, &[t(600, 6)])]
    );
    assert_eq!(s.channels, vec![channel(4, &[t(300, 3), t(600, 6)])]);
    assert_eq!(s.stats, stats(18, 0, 4));
}

#[test]
fn op_that_never_stops_leaves_the_collective_without_duration() {
    let mut w = Win::default();
    let c = w.coll(0, Func::ReduceScatter, 100, Datatype::Bfloat16);
    w.stop(c, 1);
    let a = w.op(2, c, 0, 1, 0);
    let b = w.op(3, c, 0, 1, 1);
    w.step(4, a, 100, 2);
    w.step(5, b, 100, 4);
    w.stop(a, 20);
    let s = w.sum();

    let ts = [t(100, 2), t(100, 4)];
    assert_eq!(
        s.colls[0].ops,
        vec![OpSample {
            // 100 bf16 per rank × 4 ranks.
            bytes: 800,
            start: 0.0,
            duration: None,
            gpu: None,
            transfers: 2,
            waits: Waits::default(),
            sample: crate::record::Sample::ALL,
            bare: false,
        }]
    );
    assert_eq!(s.colls[0].transfers, ts.to_vec());
    assert_eq!(no_queue(&s.links), vec![link(0, 1, &ts)]);
    assert_eq!(s.stats, stats(11, 1, 0));
}

#[test]
fn collective_ends_at_its_last_op_stop_of_either_direction() {
    let mut w = Win::default();
    let c = w.coll(0, Func::AllReduce, 256, Datatype::Float32);
    w.stop(c, 1);
    let send = w.op(2, c, 0, 1, 0);
    let recv = w.start(3, recv_body(c, 3, 0));
    w.rec(recv, 4, Body::InProgress);
    w.step(5, send, 1024, 10);
    w.stop(send, 998);
    w.stop(recv, 3000); // the ring's last receive lands last
    // A receive op NCCL never progresses (CollNet, copy-engine proxies) and never stops.
    w.start(6, recv_body(c, 2, 1));
    let s = w.sum();

    assert_eq!(
        s.colls[0].ops,
        vec![OpSample {
            bytes: 1024,
            start: 0.0,
            duration: Some(3000.0 / 1024.0),
            gpu: None,
            transfers: 1,
            waits: Waits::default(),
            sample: crate::record::Sample::ALL,
            bare: false,
        }]
    );
    // Receive ops make no link or channel figures.
    assert_eq!(no_queue(&s.links), vec![link(0, 1, &[t(1024, 10)])]);
    assert_eq!(s.channels, vec![channel(0, &[t(1024, 10)])]);
    assert_eq!(s.stats, stats(11, 0, 0), "the never-progressed op is not unfinished");
}

#[test]
fn receive_op_in_progress_and_unstopped_withholds_the_duration() {
    let mut w = Win::default();
    let c = w.coll(0, Func::AllReduce, 256, Datatype::Float32);
    w.stop(c, 1);
    let send = w.op(2, c, 0, 1, 0);
    w.stop(send, 50);
    let recv = w.start(3, recv_body(c, 3, 0));
    w.rec(recv, 4, Body::InProgress);
    let s = w.sum();
    assert_eq!(s.colls[0].ops[0].duration, None);
    assert_eq!(s.stats.unfinished, 1);
}

#[test]
fn host_and_gpu_time_are_both_kept() {
    let mut w = Win::default();
    let c = w.coll(0, Func::AllReduce, 256, Datatype::Float32);
    w.stop(c, 1);
    let send = w.op(2, c, 0, 1, 0);
    w.stop(send, 512);
    for (ch, start, stop) in [(0, 1_000, 5_000), (1, 1_500, 4_000)] {
        let k = w.kernel(10, c, ch, start);
        w.rec(k, 11, Body::KernelChStop { gpu_stop: stop });
        w.stop(k, 11);
    }
    let s = w.sum();
    assert_eq!(
        s.colls[0].ops,
        vec![OpSample {
            bytes: 1024,
            start: 0.0,
            duration: Some(0.5),
            gpu: Some(4e-6),
            transfers: 0,
            waits: Waits::default(),
            sample: crate::record::Sample::ALL,
            bare: false,
        }]
    );
}

#[test]
fn first_steps_and_initial_syncs_tell_how_long_peers_kept_an_operation_waiting() {
    let mut w = Win::default();
    let c = w.coll(0, Func::AllReduce, 256, Datatype::Float32);
    w.stop(c, 1);
    // Channel 0 to peer 1 waited 40 ticks, channel 1 to peer 2 waited 100; a later step's
    // wait (its data was late, not the peer) does not count.
    for (ch, peer, wait) in [(0u8, 1, 40), (1, 2, 100)] {
        let op = w.op(2, c, 0, peer, ch);
        let first = w.start(10, Body::ProxyStep { parent: op, step: 0 });
        w.rec(first, 20, Body::PeerWait);
        w.rec(first, 20 + wait, Body::SendWait { bytes: 64 });
        w.stop(first, 200);
        let later = w.start(10, Body::ProxyStep { parent: op, step: 1 });
        w.rec(later, 20, Body::PeerWait);
        w.rec(later, 900, Body::SendWait { bytes: 64 });
        w.stop(later, 950);
        w.stop(op, 1000);
        let k = w.kernel(10, c, ch, 1_000);
        let sync = w.start(
            10,
            Body::KernelPhase {
                parent: k,
                phase: 0,
                gpu_start: 1_000,
            },
        );
        w.rec(
            sync,
            11,
            Body::PhaseStop {
                gpu_stop: 1_000 + 700 * u64::from(ch + 1),
            },
        );
        w.rec(k, 11, Body::KernelChStop { gpu_stop: 5_000 });
        w.stop(k, 11);
    }
    let waits = w.sum().colls[0].ops[0].waits;
    assert_eq!(waits.peer, Some((2, 100.0 * SPT)));
    assert_eq!(waits.sync, Some(1.4e-6));
}

/// Under shedding: ProxyOps recorded bare (no steps) still end their collective, which carries
/// its sample (weight 2^k, or 0 for a predecessor); no transfer, link or channel comes of them.
#[test]
fn bare_ops_time_their_root_and_samples_carry_weights() {
    use crate::record::sample::{Role, Sample};
    let mut w = Win::default();
    let sampled = |role, ord| {
        let Body::Coll(c) = coll_body(Func::AllReduce, 256, Datatype::Float32) else {
            unreachable!()
        };
        Body::Coll(CollStart {
            sample: Sample::new(2, role, ord),
            ..c
        })
    };
    let pred = w.start(100, sampled(Role::Predecessor, 9));
    let timed = w.start(110, sampled(Role::Timed, 10));
    w.stop(pred, 111);
    w.stop(timed, 112);
    for (root, stop) in [(pred, 200), (timed, 260)] {
        let id = handle(w.id.window, w.id.epoch, Kind::ProxyOpBare, w.recs.len());
        w.rec(id, 120, op_body(root, 0, 1, 0));
        w.stop(id, stop);
    }
    let s = w.sum();
    // Finished operations leave the table of open ones in no particular order.
    let mut ops = s.colls[0].ops.clone();
    ops.sort_by(|a, b| a.start.total_cmp(&b.start));
    assert_eq!(ops.len(), 2);
    assert_eq!(ops[0].duration, Some(100.0 / 1024.0));
    assert_eq!((ops[0].sample.weight(), ops[1].sample.weight()), (0, 4));
    assert_eq!((ops[1].sample.ord, ops[1].duration), (10, Some(150.0 / 1024.0)));
    assert!(ops.iter().all(|o| o.bare && o.transfers == 0));
    assert!(s.colls[0].transfers.is_empty() && s.links.is_empty() && s.channels.is_empty());
    assert_eq!((s.stats.bare_ops, s.stats.unfinished), (2, 0));
}

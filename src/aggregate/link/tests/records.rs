//! Records of every shape: kernel channels only, intra-node collectives, fillers, PXN ops, stray
//! and foreign records, slot order and deterministic, sorted output.

use super::*;

#[test]
fn collective_with_kernel_channels_only_gets_gpu_time_only() {
    let mut w = Win::default();
    let c = w.coll(0, Func::AllReduce, 4, Datatype::Float16);
    w.stop(c, 1);
    for (ch, start, stop) in [(0, 1_000, 5_000), (1, 1_500, 4_000)] {
        let k = w.kernel(10, c, ch, start);
        w.rec(k, 11, Body::KernelChStop { gpu_stop: stop });
        w.stop(k, 11);
    }
    // A second one whose channel 1 has not reported its GPU stop yet.
    let d = w.coll(20, Func::AllReduce, 4, Datatype::Float16);
    w.stop(d, 21);
    let k = w.kernel(22, d, 0, 6_000);
    w.rec(k, 23, Body::KernelChStop { gpu_stop: 7_000 });
    w.stop(k, 23);
    w.kernel(24, d, 1, 6_000);
    let s = w.sum();

    // The unfinished one is released at once, the finished one held, then released.
    assert_eq!(
        s.colls[0].ops,
        vec![
            OpSample {
                bytes: 8,
                start: 20.0 / 1024.0,
                duration: None,
                gpu: None,
                transfers: 0,
                waits: Waits::default(),
                sample: crate::record::Sample::ALL,
                bare: false,
            },
            OpSample {
                bytes: 8,
                start: 0.0,
                duration: None,
                gpu: Some(4e-6),
                transfers: 0,
                waits: Waits::default(),
                sample: crate::record::Sample::ALL,
                bare: false,
            },
        ]
    );
    assert!(s.links.is_empty() && s.channels.is_empty());
    assert_eq!(s.stats, stats(14, 1, 0));
}

#[test]
fn intra_node_collective_has_no_duration() {
    let mut w = Win::default();
    let c = w.coll(0, Func::Broadcast, 4096, Datatype::Int8);
    w.stop(c, 1);
    let s = w.sum();
    assert_eq!(
        s.colls[0].ops,
        vec![OpSample {
            bytes: 4096,
            start: 0.0,
            duration: None,
            gpu: None,
            transfers: 0,
            waits: Waits::default(),
            sample: crate::record::Sample::ALL,
            bare: false,
        }]
    );
    assert_eq!(s.stats, stats(2, 0, 0));
}

#[test]
fn fillers_are_ignored() {
    let mut plain = Win::default();
    let c = plain.coll(0, Func::AllReduce, 16, Datatype::Float32);
    plain.stop(c, 1);
    let op = plain.op(2, c, 0, 1, 0);
    plain.step(3, op, 64, 5);
    plain.stop(op, 10);

    let mut gaps = Win::default();
    gaps.filler();
    let c = gaps.coll(0, Func::AllReduce, 16, Datatype::Float32);
    gaps.filler();
    gaps.stop(c, 1);
    let op = gaps.op(2, c, 0, 1, 0);
    gaps.filler();
    gaps.step(3, op, 64, 5);
    gaps.stop(op, 10);
    gaps.filler();

    let (a, b) = (plain.sum(), gaps.sum());
    assert_eq!(a, b);
    assert_eq!(
        b.colls[0].ops,
        vec![OpSample {
            bytes: 64,
            start: 0.0,
            duration: Some(10.0 / 1024.0),
            gpu: None,
            transfers: 1,
            waits: Waits::default(),
            sample: crate::record::Sample::ALL,
            bare: false,
        }]
    );
    assert_eq!(b.stats, stats(7, 0, 0));
}

#[test]
fn pxn_op_counts_for_its_originating_rank() {
    let mut w = Win::default();
    let pxn = w.op(0, 0, 3, 1, 5); // parent is foreign: recorded as 0
    w.step(1, pxn, 128, 2);
    w.step(5, pxn, 256, 3);
    w.stop(pxn, 10);
    let s = w.sum();

    let ts = [t(128, 2), t(256, 3)];
    assert!(s.colls.is_empty() && s.p2ps.is_empty());
    assert_eq!(no_queue(&s.links), vec![link(3, 1, &ts)]);
    assert_eq!(s.channels, vec![channel(5, &ts)]);
    assert_eq!(s.stats, stats(8, 0, 0), "no parent is not a missing parent");
}

#[test]
fn stray_and_foreign_records_are_ignored() {
    let mut w = Win::default();
    let c = w.coll(0, Func::AllReduce, 1, Datatype::Int8);
    w.stop(c, 1);
    let op = w.op(2, c, 0, 1, 0);
    w.stop(op, 10);
    w.stop(op, 90); // double stop: the first one counts
    let h = Handle::decode(op).unwrap();
    let other_comm = Handle::new(4, h.window(), h.epoch(), h.kind(), h.slot());
    w.stop(other_comm.encode(), 95);
    w.stop(handle(WIN.window, WIN.epoch, Kind::ProxyOp, 99), 96); // slot out of range
    w.rec(op, 97, Body::SendWait { bytes: 8 }); // SendWait is for steps only
    // A start record carrying another slot's handle is not a start.
    w.rec(c, 98, coll_body(Func::AllReduce, 1, Datatype::Int8));
    let s = w.sum();

    assert_eq!(
        s.colls[0].ops,
        vec![OpSample {
            bytes: 1,
            start: 0.0,
            duration: Some(10.0 / 1024.0),
            gpu: None,
            transfers: 0,
            waits: Waits::default(),
            sample: crate::record::Sample::ALL,
            bare: false,
        }]
    );
    assert!(s.links.is_empty() && s.channels.is_empty());
    assert_eq!(s.stats, stats(9, 0, 0));
}

#[test]
fn links_do_not_depend_on_slot_order() {
    // Causality puts parents before children and starts before their later records; linking
    // must not rely on it.
    let coll = handle(WIN.window, WIN.epoch, Kind::Coll, 4);
    let op = handle(WIN.window, WIN.epoch, Kind::ProxyOp, 2);
    let step = handle(WIN.window, WIN.epoch, Kind::ProxyStep, 1);
    let mut w = Win::default();
    w.stop(op, 50);
    w.rec(step, 10, Body::ProxyStep { parent: op, step: 0 });
    w.rec(op, 5, op_body(coll, 0, 1, 0));
    w.rec(step, 20, Body::SendWait { bytes: 100 });
    w.rec(coll, 0, coll_body(Func::AllReduce, 25, Datatype::Float32));
    w.stop(step, 30);
    w.stop(coll, 1);
    let s = w.sum();

    assert_eq!(
        s.colls,
        vec![CollGroup {
            key: key(Func::AllReduce, Datatype::Float32, 100),
            ops: vec![OpSample {
                bytes: 100,
                start: 0.0,
                duration: Some(50.0 / 1024.0),
                gpu: None,
                transfers: 1,
                waits: Waits::default(),
                sample: crate::record::Sample::ALL,
                bare: false,
            }],
            transfers: vec![t(100, 10)],
        }]
    );
    assert_eq!(no_queue(&s.links), vec![link(0, 1, &[t(100, 10)])]);
    assert_eq!(s.stats, stats(7, 0, 0));
}

#[test]
fn output_is_deterministic_and_sorted() {
    let mut w = Win::default();
    for (i, (func, dt, peer, ch)) in [
        (Func::Reduce, Datatype::Int32, 3, 7),
        (Func::AllReduce, Datatype::Float32, 1, 2),
        (Func::AllReduce, Datatype::Float16, 2, 0),
        (Func::AllGather, Datatype::Int8, 1, 2),
    ]
    .into_iter()
    .enumerate()
    {
        let ts = 100 * i as u64;
        let c = w.coll(ts, func, 10, dt);
        w.stop(c, ts + 1);
        let op = w.op(ts + 2, c, 0, peer, ch);
        w.step(ts + 3, op, 10 * (i as u64 + 1), i as u64 + 1);
        w.stop(op, ts + 9);
        let p = w.start(
            ts + 10,
            Body::P2p(P2pStart {
                count: 1,
                peer: 4 - peer,
                datatype: dt,
                graph: None,
                sample: crate::record::Sample::ALL,
            }),
        );
        w.stop(p, ts + 11);
    }
    let (a, b) = (w.sum(), w.sum());
    assert_eq!(a, b);
    let keys: Vec<_> = a.colls.iter().map(|g| (g.key.func, g.key.datatype)).collect();
    assert_eq!(
        keys,
        [
            (Func::AllGather, Datatype::Int8),
            (Func::AllReduce, Datatype::Float16),
            (Func::AllReduce, Datatype::Float32),
            (Func::Reduce, Datatype::Int32),
        ]
    );
    let p2ps: Vec<_> = a.p2ps.iter().map(|g| (g.peer, g.datatype)).collect();
    assert_eq!(
        p2ps,
        [
            (1, Datatype::Int32),
            (2, Datatype::Float16),
            (3, Datatype::Int8),
            (3, Datatype::Float32)
        ]
    );
    let links: Vec<_> = a.links.iter().map(|g| (g.rank, g.peer, g.bytes)).collect();
    assert_eq!(links, [(0, 1, 20 + 40), (0, 2, 30), (0, 3, 10)]);
    let channels: Vec<_> = a.channels.iter().map(|g| (g.channel, g.transfers.len())).collect();
    assert_eq!(channels, [(0, 1), (2, 2), (7, 1)]);
    let mut open = OpenOps::new(Duration::ZERO);
    let sealed = Sealed {
        forced: true,
        ..w.sealed()
    };
    assert!(
        summarize(sealed, &meta(), SPT, &mut open, at(Instant::now(), false))
            .stats
            .forced
    );
}

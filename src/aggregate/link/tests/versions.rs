//! What particular ABI versions add: tags (v7), kernel phases and invalid GPU intervals (2.31),
//! ProxyOp marks of v1–v3, and API calls that claim (or not) their collectives.

use super::*;

/// A Tag record moves its collective (or send) to the group of its tagged key; untagged ones
/// stay where they were.
#[test]
fn a_tag_moves_its_operation_to_the_tagged_group() {
    let mut w = Win::default();
    let a = w.coll(0, Func::AllReduce, 4, Datatype::Float16);
    w.rec(a, 0, Body::Tag { tag: 7 });
    w.stop(a, 1);
    let b = w.coll(2, Func::AllReduce, 4, Datatype::Float16);
    w.stop(b, 3);
    let s = w.sum();
    let tags: Vec<(u64, usize)> = s.colls.iter().map(|g| (g.key.tag, g.ops.len())).collect();
    assert_eq!(tags, [(0, 1), (7, 1)]);
    assert_eq!(s.stats, stats(5, 0, 0));
}

/// Kernel phases give their GPU durations by phase; a GPU interval that ends before it starts
/// (2.31.2's drift) is left out and counted, and its collective gets no GPU time.
#[test]
fn kernel_phases_and_invalid_gpu_intervals() {
    let mut w = Win::default();
    let c = w.coll(0, Func::AllReduce, 4, Datatype::Float16);
    w.stop(c, 1);
    let k = w.kernel(10, c, 0, 1_000);
    for (phase, start, stop) in [(0, 1_000, 1_500), (1, 1_500, 3_500), (2, 3_500, 3_400)] {
        let p = w.start(
            11,
            Body::KernelPhase {
                parent: k,
                phase,
                gpu_start: start,
            },
        );
        w.rec(p, 11, Body::PhaseStop { gpu_stop: stop });
    }
    w.rec(k, 12, Body::KernelChStop { gpu_stop: 3_400 });
    w.stop(k, 12);
    let k = w.kernel(13, c, 1, 1_200);
    w.rec(k, 14, Body::KernelChStop { gpu_stop: 3_000 });
    w.stop(k, 14);
    // Both channels of the second one reported, one of them with another batch's times.
    let d = w.coll(20, Func::AllReduce, 4, Datatype::Float16);
    w.stop(d, 21);
    for (ch, start, stop) in [(0, 9_000, 8_000), (1, 9_000, 9_500)] {
        let j = w.kernel(22, d, ch, start);
        w.rec(j, 23, Body::KernelChStop { gpu_stop: stop });
        w.stop(j, 23);
    }
    let s = w.sum();
    assert_eq!(s.phases, [vec![500e-9], vec![2_000e-9], vec![]]);
    let gpu: Vec<Option<f64>> = s.colls[0].ops.iter().map(|o| o.gpu).collect();
    assert_eq!(gpu, [None, Some(2.4e-6)], "the drifted one has no GPU time");
    assert_eq!(s.stats.invalid_gpu, 2, "the final sync and the second channel");
}

/// A send op of ABI v1–v3 as its marks describe it: `(mark, total, ts)`.
fn marked_op(w: &mut Win, parent: u64, peer: i32, marks: &[(crate::record::Mark, u64, u64)]) -> u64 {
    let op = w.op(2, parent, 0, peer, 0);
    for &(mark, total, ts) in marks {
        w.rec(op, ts, Body::OpBytes { mark, total });
    }
    op
}

#[test]
fn legacy_transfers_are_differences_of_running_totals() {
    use crate::record::Mark::{Base, Done, Sent, SentBefore};
    let mut w = Win::default();
    let c = w.coll(0, Func::AllReduce, 64, Datatype::Int8);
    w.stop(c, 1);
    // v2/v3: the slot's total starts at leftovers (1000); two transfers in flight, the
    // second one's posting (not the op's first) is not recorded.
    let v2 = marked_op(
        &mut w,
        c,
        1,
        &[
            (Base, 1000, 0),
            (Sent, 1040, 10),
            (Sent, 1064, 12),
            (Done, 1064, 20),
            (Done, 1064, 25),
        ],
    );
    w.stop(v2, 26);
    // v1: SendTransmitted tells the total before its transfer; a Done resolves the last one.
    let v1 = marked_op(
        &mut w,
        c,
        2,
        &[
            (SentBefore, 500, 30),
            (SentBefore, 516, 31),
            (Done, 548, 40),
            (Done, 548, 44),
        ],
    );
    w.stop(v1, 45);
    // A lost Base leaves the first transfer's bytes unknown: unfinished, not zero; one
    // without a Done is unfinished too.
    let lost = marked_op(&mut w, c, 3, &[(Sent, 70, 50), (Sent, 80, 52), (Done, 80, 60)]);
    w.stop(lost, 61);
    let s = w.sum();
    let transfers = |peer: i32| s.links.iter().find(|l| l.peer == peer).map(|l| (l.transfers, l.bytes));
    assert_eq!(transfers(1), Some((2, 64)));
    assert_eq!(transfers(2), Some((2, 48)));
    assert_eq!(transfers(3), None, "its only sized transfer never finished");
    assert_eq!(
        s.channels[0].transfers,
        vec![t(40, 10), t(24, 13), t(16, 10), t(32, 13)]
    );
    assert_eq!(s.stats.unfinished, 2);
    assert_eq!(s.colls[0].ops[0].duration, Some(61.0 / 1024.0));
}

#[test]
fn api_calls_nothing_claims_are_collectives_of_their_own() {
    let call = CollStart {
        seq: 0,
        count: 256,
        func: Func::AllReduce,
        algo: Algo::Unknown,
        proto: Proto::Unknown,
        datatype: Datatype::Float32,
        n_channels: 0,
        graph: Some(false),
        sample: crate::record::Sample::ALL,
    };
    let (mut open, t0) = (OpenOps::new(Duration::from_millis(100)), Instant::now());
    let mut w = Win::default();
    let claimed = w.start(1, Body::Api(call));
    let c = w.coll(2, Func::AllReduce, 256, Datatype::Float32);
    w.rec(c, 2, Body::Claim { api: claimed });
    w.stop(c, 3);
    let _symmetric = w.start(4, Body::Api(call));
    let later = w.start(5, Body::Api(call));
    w.sum_with(&mut open, t0, false);
    assert_eq!(open.apis.len(), 2, "the claimed call is not held");
    // The last call's Coll comes in the next window.
    let mut next = Win::at(WIN2);
    let d = next.coll(6, Func::AllReduce, 256, Datatype::Float32);
    next.rec(d, 6, Body::Claim { api: later });
    next.stop(d, 7);
    next.sum_with(&mut open, t0, false);
    assert_eq!(open.apis.len(), 1);
    // Past the wait (at least the hold time), the unclaimed one is a collective without times; with records dropped
    // meanwhile it would be unfinished instead.
    let due = Frontier {
        drops: 1,
        ..at(t0 + HOLD_PLUS, false)
    };
    let mut unsure = OpenOps::new(Duration::from_millis(100));
    unsure.apis.clone_from(&open.apis);
    let (roots, _, unfinished) = unsure.release(&due);
    assert_eq!((roots.len(), unfinished), (0, 1));
    let s = release(WIN, &meta(), SPT, &mut open, at(t0 + HOLD_PLUS, false)).expect("due");
    let mut ops: Vec<_> = s
        .colls
        .iter()
        .flat_map(|g| g.ops.iter().map(move |o| (g.key.algo, *o)))
        .collect();
    ops.sort_by(|a, b| a.1.start.total_cmp(&b.1.start));
    let sample = |ticks: f64| OpSample {
        bytes: 1024,
        start: ticks * SPT,
        duration: None,
        gpu: None,
        transfers: 0,
        waits: Waits::default(),
        sample: crate::record::Sample::ALL,
        bare: false,
    };
    // The two Colls (no proxy ops: no time), and the call no Coll claimed.
    assert_eq!(
        ops,
        [
            (Algo::Ring, sample(2.0)),
            (Algo::Unknown, sample(4.0)),
            (Algo::Ring, sample(6.0))
        ]
    );
}

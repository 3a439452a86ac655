//! Operations held across windows: late proxy ops and steps in a later window, children that
//! arrive before their operation, orphans on expiry, steps that never stopped.

use super::*;

/// An AllReduce whose one op stopped at tick 100, processed through `open` at `t0`: held.
fn held_allreduce(open: &mut OpenOps, t0: Instant) -> u64 {
    let mut w = Win::default();
    let c = w.coll(0, Func::AllReduce, 256, Datatype::Float32);
    w.stop(c, 1);
    let op = w.op(2, c, 0, 1, 0);
    w.stop(op, 100);
    assert!(w.sum_with(open, t0, false).colls.is_empty(), "held for late children");
    c
}

#[test]
fn a_late_proxy_op_in_a_later_window_extends_the_held_operation() {
    let (mut open, t0) = (OpenOps::new(Duration::from_secs(1)), Instant::now());
    let c = held_allreduce(&mut open, t0);
    // The proxy thread appended a second op after the window closed.
    let mut later = Win::at(WIN2);
    let late = later.op(200, c, 0, 1, 1);
    later.stop(late, 3000);
    let second = later.sum_with(&mut open, t0 + HOLD_PLUS, false);
    assert_eq!(
        second.colls[0].ops[0].duration,
        Some(3000.0 / 1024.0),
        "not 100 ticks: never short"
    );
    assert_eq!(second.stats.orphans, 0);
}

#[test]
fn a_late_proxy_op_that_cannot_finish_releases_the_operation_without_host_time() {
    let (mut open, t0) = (OpenOps::new(Duration::from_secs(1)), Instant::now());
    let c = held_allreduce(&mut open, t0);
    let mut later = Win::at(WIN2);
    later.op(200, c, 0, 1, 1); // never stopped in its window
    let second = later.sum_with(&mut open, t0, false);
    assert_eq!(second.colls[0].ops[0].duration, None, "released at once, not short");
    assert_eq!(open.held(), 0);
}

#[test]
fn a_step_whose_op_is_in_an_earlier_window_counts_for_its_link_channel_and_operation() {
    let mut open = OpenOps::new(Duration::from_secs(1));
    let t0 = Instant::now();
    let mut w = Win::default();
    let c = w.coll(0, Func::AllReduce, 256, Datatype::Float32);
    w.stop(c, 1);
    let op = w.op(2, c, 0, 3, 5);
    w.step(3, op, 1024, 10);
    w.stop(op, 100);
    w.sum_with(&mut open, t0, false);
    let mut later = Win::at(WIN2);
    later.step(50, op, 2048, 20); // could not join its op's full window
    let second = later.sum_with(&mut open, t0 + HOLD_PLUS, false);
    assert_eq!(no_queue(&second.links), vec![link(0, 3, &[t(2048, 20)])]);
    assert_eq!(second.channels, vec![channel(5, &[t(2048, 20)])]);
    assert_eq!(second.colls[0].ops[0].transfers, 2);
    assert_eq!(second.colls[0].transfers, vec![t(2048, 20)]);
    assert_eq!(second.stats.orphans, 0);
}

#[test]
fn children_processed_before_their_operation_are_claimed_by_it() {
    let mut open = OpenOps::new(Duration::from_secs(1));
    let t0 = Instant::now();
    // The operation's window is processed after the window its spilled child went to.
    let mut w = Win::default();
    let c = w.coll(0, Func::AllReduce, 256, Datatype::Float32);
    w.stop(c, 1);
    let mut spill = Win::at(WIN2);
    let op = spill.op(2, c, 0, 1, 0);
    spill.step(3, op, 512, 4);
    spill.stop(op, 700);
    let first = spill.sum_with(&mut open, t0, false);
    assert_eq!(first.stats.orphans, 0, "pending, not orphaned yet");
    assert_eq!(no_queue(&first.links), vec![link(0, 1, &[t(512, 4)])]);
    let second = w.sum_with(&mut open, t0, true);
    let g = &second.colls[0];
    assert_eq!((g.ops[0].duration, g.ops[0].transfers), (Some(700.0 / 1024.0), 1));
    assert_eq!(g.transfers, vec![t(512, 4)]);
}

#[test]
fn children_nothing_claims_become_orphans_when_they_expire() {
    let mut open = OpenOps::new(Duration::ZERO);
    let t0 = Instant::now();
    let mut w = Win::at(WIN2);
    let gone = handle(WIN.window, WIN.epoch, Kind::Coll, 7);
    let op = w.op(2, gone, 0, 1, 0);
    w.stop(op, 9);
    assert_eq!(w.sum_with(&mut open, t0, false).stats.orphans, 0);
    let r = release(WIN2, &meta(), SPT, &mut open, at(t0 + HOLD_PLUS, false)).unwrap();
    assert_eq!(r.stats.orphans, 1);
    assert_eq!(r.stats.windows, 0);
}

#[test]
fn step_with_send_wait_but_no_stop_is_unfinished_not_a_transfer() {
    let mut w = Win::default();
    let c = w.coll(0, Func::AllReduce, 8, Datatype::Int64);
    w.stop(c, 1);
    let op = w.op(2, c, 0, 1, 0);
    w.step(3, op, 32, 7);
    let open = w.start(20, Body::ProxyStep { parent: op, step: 1 });
    w.rec(open, 21, Body::SendWait { bytes: 32 });
    let no_wait = w.start(22, Body::ProxyStep { parent: op, step: 2 });
    w.stop(no_wait, 23);
    // An op whose only step never finished leaves no empty link or channel group behind.
    let idle = w.op(24, c, 0, 2, 1);
    w.start(25, Body::ProxyStep { parent: idle, step: 0 });
    w.stop(idle, 26);
    w.stop(op, 30);
    let s = w.sum();

    assert_eq!(
        s.colls[0].ops,
        vec![OpSample {
            bytes: 64,
            start: 0.0,
            duration: Some(30.0 / 1024.0),
            gpu: None,
            transfers: 1,
            waits: Waits::default(),
            sample: crate::record::Sample::ALL,
            bare: false,
        }]
    );
    assert_eq!(s.colls[0].transfers, vec![t(32, 7)]);
    assert_eq!(no_queue(&s.links), vec![link(0, 1, &[t(32, 7)])]);
    assert_eq!(s.channels, vec![channel(0, &[t(32, 7)])]);
    assert_eq!(s.stats, stats(14, 3, 0));
}

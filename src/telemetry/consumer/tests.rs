//! Unit tests of the producer and consumer rules on one communicator outside the registry:
//! routing of roots, children, states and stops; the admission cap that keeps room for stops;
//! children linked across windows; late stops. The consumer is driven with synthetic times.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::time::{Duration, Instant};

use std::sync::atomic::Ordering;

use parking_lot::Mutex;

use super::{Consumer, SETTLE, Slot};
use crate::aggregate::{CommMeta, WindowSummary};
use crate::comm::{Comm, ROOT_SHARE, Route};
use crate::config::Config;
use crate::record::handle::{CommId, Handle, Kind};
use crate::record::{Algo, Body, CollStart, Datatype, Func, Proto, ProxyOpStart};

const INTERVAL: Duration = Duration::from_secs(1);
pub(super) const ID: CommId = CommId { slot: 0, generation: 1 };

/// A communicator outside the registry, with its consumer state.
pub(super) struct Unit {
    comm: Comm,
    state: Mutex<Consumer>,
}

impl Unit {
    /// The communicator as its consumer sees it.
    pub(super) fn slot(&self) -> Slot<'_> {
        Slot::new(&self.comm, &self.state)
    }
}

impl std::ops::Deref for Unit {
    type Target = Comm;

    fn deref(&self) -> &Comm {
        &self.comm
    }
}

/// A live communicator with windows of `capacity` slots, and the time its windows started.
fn live(capacity: u32) -> (Unit, Instant) {
    live_with(capacity, capacity)
}

/// [`live`], switching windows at `count_trigger` claims.
pub(super) fn live_with(capacity: u32, count_trigger: u32) -> (Unit, Instant) {
    let config = Config {
        capacity,
        count_trigger,
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
        gpu: Default::default(),
    };
    let state = Mutex::new(Consumer::new(&config));
    let level = state.lock().reset(meta.clone(), &config);
    comm.activate(&comm.lock(), u32::from(ID.generation), &meta, level);
    (Unit { comm, state }, Instant::now())
}

/// Takes the armed standby window away, as when every other window is still being processed:
/// the current window then keeps filling.
pub(super) fn no_standby(comm: &Comm) {
    let r = comm.route_now();
    comm.route.store(Route::alone(r.current, r.level).pack(), Ordering::Relaxed);
}

pub(super) fn coll(comm: &Comm, ts: u64) -> Option<Handle> {
    let body = Body::Coll(CollStart {
        seq: 0,
        count: 256,
        func: Func::AllReduce,
        algo: Algo::Ring,
        proto: Proto::Simple,
        datatype: Datatype::Float32,
        n_channels: 1,
        graph: None,
        sample: crate::record::Sample::ALL,
    });
    comm.start(ID, Kind::Coll, None, ts, body).and_then(Handle::decode)
}

pub(super) fn proxy_op(comm: &Comm, parent: Handle) -> Option<Handle> {
    let body = Body::ProxyOp(ProxyOpStart {
        parent: parent.encode(),
        rank: 0,
        peer: 1,
        channel: 0,
        send: true,
        origin: 0,
    });
    comm.start(ID, Kind::ProxyOp, Some(parent), 0, body)
        .and_then(Handle::decode)
}

/// Polls at `t0 + at`; the summaries of the windows processed then.
fn poll(comm: &Unit, t0: Instant, at: Duration) -> Vec<WindowSummary> {
    comm.slot().poll(t0 + at, 1.0)
}

/// Whether no window was processed (operations released from the table aside).
fn no_window(summaries: Vec<WindowSummary>) -> bool {
    summaries.iter().all(|s| s.stats.windows == 0)
}

#[test]
fn roots_go_to_the_current_window_children_and_stops_to_their_parents() {
    let (comm, t0) = live(64);
    let c = coll(&comm, 10).unwrap();
    assert_eq!(c.window(), 0);
    assert!(
        poll(&comm, t0, INTERVAL).is_empty(),
        "window 0 closes, window 1 takes new roots"
    );
    let later = coll(&comm, 30).unwrap();
    assert_eq!(later.window(), 1);

    // A child of the collective in the CLOSING window 0 joins it there; its stop too.
    let op = proxy_op(&comm, c).unwrap();
    assert_eq!(op.window(), 0);
    comm.append(op, 20, Body::Stop);
    comm.append(c, 11, Body::Stop);
    // A parent from another communicator is not ours: the child goes to the current window.
    let foreign = Handle::new(9, c.window(), c.epoch(), c.kind(), c.slot());
    let stray = proxy_op(&comm, foreign).unwrap();
    assert_eq!(stray.window(), 1);
    comm.append(stray, 25, Body::Stop);

    let done = poll(&comm, t0, INTERVAL + SETTLE);
    assert_eq!(done.len(), 1, "window 0 settled: every event it holds stopped");
    assert_eq!(done[0].stats.orphans, 0);
    assert!(
        done[0].colls.is_empty(),
        "held until window 1, filling meanwhile, is processed"
    );
    comm.append(later, 31, Body::Stop);
    assert!(no_window(poll(&comm, t0, 2 * INTERVAL)));
    let released = poll(&comm, t0, 2 * INTERVAL + SETTLE);
    assert_eq!(released.len(), 1, "window 1, and what window 0 held");
    let ops: Vec<_> = released[0].colls[0].ops.iter().map(|o| o.duration).collect();
    assert_eq!(
        ops,
        [Some(10.0)],
        "start 10 → op stop 20; the later one is held in turn"
    );
    assert_eq!(
        released[0].stats.orphans, 1,
        "the child of another communicator's parent"
    );
    assert_eq!(comm.drop_counts(), Default::default());
}

#[test]
fn new_events_leave_room_for_the_stops_of_those_already_in() {
    let capacity = 16;
    let (comm, _) = live(capacity);
    no_standby(&comm);
    let limit = u64::from(capacity) * ROOT_SHARE.0 / ROOT_SHARE.1;
    let roots: Vec<Handle> = (0..limit).map(|i| coll(&comm, i).unwrap()).collect();
    assert!(coll(&comm, 99).is_none(), "past the root share a new event is refused");
    assert_eq!(comm.drop_counts().full, 1);
    // The rest of the lane is for states and stops of the events in it; children have lanes of
    // their own.
    assert_eq!(proxy_op(&comm, roots[0]).unwrap().window(), 0);
    for r in &roots[..4] {
        comm.append(*r, 100, Body::Stop);
    }
    assert_eq!(comm.drop_counts().full, 1, "every stop found room");
    comm.append(roots[4], 100, Body::Stop);
    assert_eq!(
        comm.drop_counts().full,
        2,
        "a full window drops and counts, never waits"
    );
}

/// With no standby armed, a window past its count trigger sheds more instead of filling: its
/// level rises by 2 for every further multiple of the trigger its lanes hold, up to the highest
/// level; the next switch takes the level the consumer armed.
#[test]
fn a_window_past_its_trigger_with_no_standby_escalates_its_level() {
    let (comm, t0) = live_with(64, 4);
    no_standby(&comm);
    let level_after = |roots: u64| {
        (0..roots).for_each(|i| assert!(coll(&comm, i).is_some()));
        comm.level_now()
    };
    assert_eq!(level_after(7), 0, "below twice the trigger");
    assert_eq!(level_after(1), 2, "8 claims: one further multiple");
    assert_eq!(level_after(4), 4);
    assert_eq!(level_after(36), crate::comm::shed::MAX_LEVEL, "48 claims, capped");
    assert_eq!(comm.drop_counts(), Default::default());
    comm.slot().rotate(t0 + 2 * INTERVAL);
    assert_eq!(comm.route_now().current, 1);
    assert_eq!(comm.level_now(), 0, "the standby's level");
}

#[test]
fn a_child_that_cannot_join_its_full_parent_window_is_linked_from_the_current_one() {
    let (comm, t0) = live(8);
    let c = coll(&comm, 0).unwrap();
    comm.append(c, 1, Body::Stop);
    assert!(poll(&comm, t0, INTERVAL).is_empty());
    for _ in 0..4 {
        let op = proxy_op(&comm, c).unwrap();
        assert_eq!(op.window(), 0);
        comm.append(op, 5, Body::Stop);
    }
    let spilled = proxy_op(&comm, c).unwrap();
    assert_eq!(
        spilled.window(),
        1,
        "window 0's proxy lane is full: the child goes to the current window"
    );
    comm.append(spilled, 60, Body::Stop);
    assert_eq!(comm.drop_counts().full, 0);

    let first = poll(&comm, t0, INTERVAL + SETTLE);
    assert_eq!(first.len(), 1);
    assert!(first[0].colls.is_empty(), "the collective is held for late children");
    assert!(no_window(poll(&comm, t0, 2 * INTERVAL)), "window 1 closes");
    let second = poll(&comm, t0, 2 * INTERVAL + SETTLE);
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].stats.orphans, 0, "the spilled child found its collective");
    let ops = &second[0].colls[0].ops;
    assert_eq!(ops[0].duration, Some(60.0), "start 0 → the spilled op's stop at 60");
}

/// A stop whose window cycled between the epoch check and the claim lands in the new cycle's
/// slot as a filler and is counted late, not recorded under the new cycle.
#[test]
fn a_stop_racing_its_window_cycle_is_counted_late() {
    let (comm, t0) = live(64);
    let c = coll(&comm, 0).unwrap();
    comm.append(c, 1, Body::Stop);
    // Four windows later window 0 fills again, in a new epoch.
    for k in 1..=4 {
        let at = INTERVAL * k;
        let got = poll(&comm, t0, at);
        eprintln!("DBG k {k} {:?}", got.iter().map(|s| (s.stats.windows, s.stats.records, s.stats.forced)).collect::<Vec<_>>());
        assert!(no_window(got));
        assert_eq!(
            poll(&comm, t0, at + SETTLE)
                .iter()
                .map(|s| s.stats.windows)
                .sum::<u64>(),
            1
        );
        if k < 4 {
            let r = coll(&comm, 10 * u64::from(k)).unwrap();
            comm.append(r, 10 * u64::from(k) + 1, Body::Stop);
        }
    }
    let reopened = coll(&comm, 50).unwrap();
    assert_eq!(reopened.window(), 0);
    assert_ne!(reopened.epoch(), c.epoch());
    // The write behind `append` after its epoch check passed for `c`.
    comm.write(c, 9, Body::Stop);
    assert_eq!(comm.drop_counts().late, 1);
    comm.append(reopened, 51, Body::Stop);
    let done = comm.slot().finalize(ID, 1.0).unwrap();
    let records: u64 = done.iter().map(|s| s.stats.records).sum();
    assert_eq!(records, 2, "the reopened window holds a start and a stop; no filler");
}

/// A child dropped for lack of room withholds the times of its parent's window in that epoch
/// only: the window's next cycle reports its own operations in full.
#[test]
fn a_lost_child_withholds_its_own_window_cycle_only() {
    let (comm, t0) = live(8);
    no_standby(&comm);
    let c = coll(&comm, 0).unwrap();
    comm.append(c, 1, Body::Stop);
    for _ in 0..4 {
        let op = proxy_op(&comm, c).unwrap();
        comm.append(op, 5, Body::Stop);
    }
    // Windows 0 (the parent's) and the current one are the same, and their proxy lane full.
    assert!(proxy_op(&comm, c).is_none());
    assert_eq!(comm.drop_counts().full, 1);
    let mut ops = Vec::new();
    for k in 1..=4 {
        let at = INTERVAL * k;
        // The drop makes the controller shed detail: a window whose level changes may close
        // on that edge rather than on its time trigger.
        for s in poll(&comm, t0, at).into_iter().chain(poll(&comm, t0, at + SETTLE)) {
            ops.extend(s.colls.iter().flat_map(|g| g.ops.iter().map(|o| o.duration)));
        }
        let r = coll(&comm, 100 * u64::from(k)).unwrap();
        comm.append(r, 100 * u64::from(k) + 1, Body::Stop);
        let op = proxy_op(&comm, r).unwrap();
        comm.append(op, 100 * u64::from(k) + 7, Body::Stop);
    }
    for s in comm.slot().finalize(ID, 1.0).unwrap() {
        ops.extend(s.colls.iter().flat_map(|g| g.ops.iter().map(|o| o.duration)));
    }
    assert_eq!(ops[0], None, "the collective whose child was lost: withheld, not short");
    assert_eq!(ops[1..], [Some(7.0); 4], "later cycles, window 0's next one included");
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

/// The root that fills the current window to the count trigger switches to the standby window
/// itself: new events keep finding room while the telemetry thread is not scheduled, and the
/// consumer closes the old window and arms another when it next looks.
#[test]
fn a_window_filled_to_the_trigger_switches_without_the_consumer() {
    let (comm, t0) = live(16);
    let trigger = 16 * ROOT_SHARE.0 / ROOT_SHARE.1;
    let windows: Vec<u8> = (0..trigger - 2)
        .map(|i| {
            let h = coll(&comm, i).unwrap();
            comm.append(h, i + 1, Body::Stop);
            h.window()
        })
        .collect();
    // Start and stop take two slots: the root that claims slot trigger - 1 switches.
    let first = (trigger as usize).div_ceil(2);
    assert!(windows[..first].iter().all(|&w| w == 0), "{windows:?}");
    assert!(windows[first..].iter().all(|&w| w == 1), "{windows:?}");
    assert_eq!(comm.drop_counts(), Default::default());
    // The consumer notices: window 0 is closed (and processed once settled), 2 is armed.
    assert!(no_window(poll(&comm, t0, Duration::from_millis(1))));
    let done = poll(&comm, t0, SETTLE + Duration::from_millis(1));
    assert_eq!(done.iter().map(|s| s.stats.records).sum::<u64>(), 2 * first as u64);
    assert_eq!(comm.route_now().standby, 2);
}

/// Operations counted without a record reach the first summary of the next pass (a summary of
/// their own when the pass has none), once, and `finalize` drains what is left.
#[test]
fn counted_operations_ride_the_next_summaries() {
    use crate::record::counted::CountKey;
    let (comm, t0) = live(64);
    let key = CountKey {
        func: Func::AllReduce,
        algo: Algo::Ring,
        proto: Proto::Simple,
        class: 20,
        p2p: false,
    };
    comm.counts.add(key, 1 << 20);
    comm.counts.add(key, 1 << 20);
    let first = poll(&comm, t0, Duration::ZERO);
    assert_eq!(first.len(), 1);
    assert_eq!((first[0].stats.windows, first[0].counted.len()), (0, 1));
    assert_eq!((first[0].counted[0].ops, first[0].counted[0].bytes), (2, 2 << 20));
    assert!(poll(&comm, t0, Duration::ZERO).is_empty(), "drained once");
    comm.counts.add(key, 1);
    let last = comm.slot().finalize(ID, 1.0).unwrap();
    assert_eq!(last.iter().map(|s| s.counted.len()).sum::<usize>(), 1);
}

/// An interval after its last window was processed with nothing claimed since, the communicator
/// gives its windows' pages back: READY windows released, the standby disarmed and released, and
/// the current window switched for a released one; records go on as before.
#[test]
fn an_idle_communicator_gives_its_windows_back() {
    use crate::buffer::window::WindowState;
    let (comm, t0) = live(64);
    let c = coll(&comm, 10).unwrap();
    comm.append(c, 11, Body::Stop);
    assert!(no_window(poll(&comm, t0, INTERVAL)), "window 0 closes");
    let done = poll(&comm, t0, INTERVAL + SETTLE);
    assert_eq!(done.iter().map(|s| s.stats.records).sum::<u64>(), 2);
    assert!(!comm.slot().is_idle(), "not an interval yet");
    let before = comm.route_now().current;
    assert!(no_window(poll(&comm, t0, 2 * INTERVAL + SETTLE)));
    assert!(comm.slot().is_idle());
    let Route { current: cur, standby, .. } = comm.route_now();
    assert_ne!(cur, before, "the current window was switched for a released one");
    assert_ne!(standby, crate::comm::NONE, "a standby is armed again");
    let others = (0..4u8).filter(|&i| i != cur && i != standby);
    assert!(others.into_iter().all(|i| comm.windows[usize::from(i)].state() == WindowState::Ready));
    let later = coll(&comm, 40).unwrap();
    assert_eq!(later.window(), cur);
    comm.append(later, 41, Body::Stop);
    assert!(no_window(poll(&comm, t0, 3 * INTERVAL + SETTLE)));
    assert!(!comm.slot().is_idle(), "claims again");
    let done = poll(&comm, t0, 3 * INTERVAL + 2 * SETTLE);
    assert_eq!(done.iter().map(|s| s.stats.records).sum::<u64>(), 2);
}

/// The registry's rules that need a finalize: PXN lookups, a full registry.
mod registry {
    use super::super::{register, slot};
    use crate::comm::{TESTS, all, bucket, find_by_hash_tag, get};
    use crate::config::Config;
    use crate::record::CommMeta;
    use crate::record::handle::{CommId, Context, MAX_COMMS};

    /// Finalizes the live communicator `id`.
    fn finalize(id: CommId) {
        slot(get(id).unwrap()).unwrap().finalize(id, 1e-9).unwrap();
    }

    fn meta(hash: u64) -> CommMeta {
        CommMeta {
            hash,
            name: "pxn".into(),
            rank: 0,
            nranks: 2,
            nnodes: 2,
            gpu: Default::default(),
        }
    }

    #[test]
    fn a_pxn_lookup_finds_its_communicator_when_its_bucket_hints_another() {
        let _serial = TESTS.lock();
        let config = Config::default();
        let h1 = 0x5A5A_0000_0000_1234;
        let tag1 = Context::tag(h1);
        // A second hash in the same bucket: registered after the first, its slot is the hint.
        let h2 = (1..)
            .map(|i| h1 + i)
            .find(|h| bucket(Context::tag(*h)) == bucket(tag1))
            .unwrap();
        let a = register(meta(h1), &config).unwrap();
        let b = register(meta(h2), &config).unwrap();
        assert_eq!(find_by_hash_tag(tag1).map(|(id, _)| id), Some(a));
        assert_eq!(find_by_hash_tag(Context::tag(h2)).map(|(id, _)| id), Some(b));
        for id in [a, b] {
            finalize(id);
        }
        assert!(
            find_by_hash_tag(tag1).is_none(),
            "a finalized communicator is not found"
        );
    }

    /// Virtual memory of this process, in kB.
    fn vm_size_kb() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmSize:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    fn a_full_registry_refuses_without_allocating() {
        let _serial = TESTS.lock();
        let small = Config {
            capacity: 1024,
            count_trigger: 512,
            ..Config::default()
        };
        let ids: Vec<CommId> = (0..MAX_COMMS as u64)
            .map(|h| register(meta(0xF111_0000 + h), &small).unwrap())
            .collect();
        assert_eq!(all().count(), MAX_COMMS);
        // A communicator of the largest windows maps some 330 MB of address space: eight leaked
        // ones would show.
        let large = Config {
            capacity: crate::record::handle::MAX_LANE_SLOTS,
            ..Config::default()
        };
        let before = vm_size_kb();
        assert!(
            (0..8).all(|_| register(meta(0xF222_0000), &large).is_none()),
            "every slot is live"
        );
        let grown = vm_size_kb().saturating_sub(before);
        assert!(grown < 1 << 20, "a refused init maps nothing ({grown} kB more)");
        for id in ids {
            finalize(id);
        }
        let id = register(meta(0xF333_0000), &small).expect("a finalized slot is reused");
        finalize(id);
    }
}

//! The plugin's rules, driven through the real exported `ncclProfiler_v4` table as NCCL calls it:
//! out-parameters, NULL/stale/foreign/unknown inputs, declined events, routing of children to
//! their parent's window, the count and time triggers, the grace period, drops, and finalize with
//! events in flight (init after the last finalize: `tests/lifecycle`).
//!
//! The telemetry thread is disabled here (`NCCL_PROFILER_OTEL_TELEMETRY_ENABLE=0`) so each test
//! drives the consumer itself with `Slot::poll` at chosen instants.

#[path = "support"]
mod support {
    pub mod emulator;
    pub mod process;
}

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use nccl_profiler_otel::aggregate::WindowSummary;
use nccl_profiler_otel::comm::{self, shed};
use nccl_profiler_otel::record::handle::{Context, Handle, Kind};
use nccl_profiler_otel::record::{Algo, Datatype, Func, Proto};
use nccl_profiler_otel::stats::STATS;
use nccl_profiler_otel::telemetry::consumer::{self, SETTLE};
use nccl_profiler_otel::telemetry::{self, Sink};
use nccl_profiler_otel::{clock, config::Config};
use parking_lot::Mutex;
use support::emulator::{self, H, Plugin, Version, pid, ty};

const CAPACITY: u32 = 4096;
const COUNT_TRIGGER: u32 = 1000;
const INTERVAL: Duration = Duration::from_secs(2);

/// Every summary the sinks received (finalize delivers to sinks).
#[derive(Default)]
struct Capture(Mutex<Vec<WindowSummary>>);

impl Sink for Capture {
    fn window(&self, summary: &WindowSummary) {
        self.0.lock().push(summary.clone());
    }
}

fn setup() -> &'static (Plugin, Arc<Capture>) {
    static SETUP: OnceLock<(Plugin, Arc<Capture>)> = OnceLock::new();
    SETUP.get_or_init(|| {
        // SAFETY: runs once, before any test reads the environment through the plugin.
        unsafe {
            std::env::set_var("NCCL_PROFILER_OTEL_TELEMETRY_ENABLE", "0");
            // The mask stays what `init` set on every release (no KernelCh sampling on 2.31).
            std::env::set_var("NCCL_PROFILER_OTEL_KERNEL_CH_EVERY", "1");
            std::env::set_var("NCCL_PROFILER_OTEL_WINDOW_CAPACITY", CAPACITY.to_string());
            std::env::set_var("NCCL_PROFILER_OTEL_WINDOW_COUNT_TRIGGER", COUNT_TRIGGER.to_string());
            std::env::set_var(
                "NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC",
                INTERVAL.as_secs().to_string(),
            );
        }
        let capture = Arc::new(Capture::default());
        telemetry::add_sink(capture.clone());
        (Plugin::in_process(), capture)
    })
}

/// A fresh communicator with a hash no other test uses.
fn new_comm(p: &Plugin, rank: i32, nranks: i32) -> emulator::Comm {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0x5eed_0000_0001);
    let hash = NEXT.fetch_add(0x1_0001, std::sync::atomic::Ordering::Relaxed);
    let (c, mask) = p.init(Some("test"), hash, 2, nranks, rank);
    assert!(!c.context.is_null());
    // The plugin adds CeColl (v6+) and KernelPhase (v7) to what is configured.
    assert_eq!(mask & !emulator::mask::IMPLIED, Config::global().event_mask);
    c
}

/// Summaries delivered for communicator `hash` so far (taken).
fn delivered(hash: u64) -> Vec<WindowSummary> {
    let mut all = setup().1.0.lock();
    let (mine, rest): (Vec<_>, Vec<_>) = all.drain(..).partition(|s| s.comm.hash == hash);
    *all = rest;
    mine
}

/// Polls communicator `hash` as the telemetry thread would at `now`.
fn poll(hash: u64, now: Instant) -> Vec<WindowSummary> {
    let c = consumer::all()
        .find(|c| c.comm.learned_hash() == hash && c.comm.is_live())
        .expect("live communicator");
    c.poll(now, clock::secs_per_tick())
}

fn finalize(p: &Plugin, c: &emulator::Comm) -> Vec<WindowSummary> {
    p.finalize(c.context);
    delivered(c.hash)
}

/// A Coll with one ProxyOp of `steps` send steps of `bytes` each, everything stopped.
fn allreduce(p: &Plugin, c: &emulator::Comm, steps: i32, bytes: u64) -> H {
    let coll = p.coll(c, H::NULL, "AllReduce", "RING", "SIMPLE", "ncclFloat32", 1024, 1, 0);
    p.stop(coll);
    let op = p.proxy_op(c.context, coll, pid(), c.rank, (c.rank + 1) % c.nranks, 0, steps, true);
    p.state(op, ty::OP_IN_PROGRESS, 0);
    (0..steps).for_each(|s| p.send_step(c.context, op, c.rank, s, bytes, 1, Duration::ZERO));
    p.stop(op);
    coll
}

fn sum_transfers(s: &[WindowSummary]) -> usize {
    s.iter().flat_map(|w| &w.colls).map(|g| g.transfers.len()).sum()
}

#[test]
fn table_is_named_otel_and_init_sets_the_mask() {
    let (p, _) = setup();
    assert_eq!(p.name(), "otel");
    let c = new_comm(p, 0, 2);
    assert_eq!(
        Config::global().event_mask,
        0x5E,
        "Coll|P2p|ProxyOp|ProxyStep|KernelCh by default"
    );
    assert_eq!(
        p.mask() & !emulator::mask::IMPLIED,
        0x5E,
        "stored at init (with CeColl, KernelPhase where they exist); KernelCh always on here"
    );
    finalize(p, &c);
}

#[test]
fn comm_name_is_copied_during_init() {
    let (p, _) = setup();
    let (c, _) = p.init(Some("dp-group-7"), 0xC0FF_EE00, 1, 4, 3); // the name's buffer is freed on return
    let s = finalize(p, &c);
    assert_eq!(s.len(), 1);
    assert_eq!(
        (s[0].comm.name.as_str(), s[0].comm.rank, s[0].comm.nranks),
        ("dp-group-7", 3, 4)
    );
}

#[test]
fn null_inputs_are_ignored_and_counted() {
    let (p, _) = setup();
    let before = STATS.null_args.get();
    // NULL context: every callback tolerates it.
    let coll = p.coll(
        &emulator::Comm {
            context: std::ptr::null_mut(),
            hash: 0,
            rank: 0,
            nranks: 2,
        },
        H::NULL,
        "AllReduce",
        "RING",
        "LL",
        "ncclInt8",
        1,
        1,
        0,
    );
    assert!(coll.is_null());
    p.finalize(std::ptr::null_mut());
    // NULL handle to stop and state, NULL args, NULL eHandle pointer, NULL descriptor.
    p.stop(H::NULL);
    p.state(H::NULL, ty::SEND_WAIT, 1);
    let c = new_comm(p, 0, 2);
    let coll = p.coll(&c, H::NULL, "AllReduce", "RING", "LL", "ncclInt8", 1, 1, 0);
    let op = p.proxy_op(c.context, coll, pid(), 0, 1, 0, 1, true);
    let step = p.proxy_step(c.context, op, 0, 0);
    p.state_null(step, ty::SEND_WAIT);
    let table = &nccl_profiler_otel::ffi::ncclProfiler_v7.get().table;
    let mut d = emulator::descr(ty::COLL, H::NULL, 0);
    let mut h = 0x77 as *mut std::ffi::c_void;
    // SAFETY: exercising NCCL-side NULLs through the real entry points.
    unsafe {
        assert_eq!((table.startEvent.unwrap())(c.context, std::ptr::null_mut(), &mut d), 0);
        assert_eq!((table.startEvent.unwrap())(c.context, &mut h, std::ptr::null_mut()), 0);
        assert_eq!(
            (table.init.unwrap())(
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
                std::ptr::null(),
                0,
                0,
                0,
                None
            ),
            0
        );
    }
    assert!(
        h.is_null(),
        "*eHandle is written NULL before the descriptor is looked at"
    );
    assert!(STATS.null_args.get() >= before + 8);
    finalize(p, &c);
}

#[test]
fn unknown_types_and_states_are_counted() {
    let (p, _) = setup();
    let c = new_comm(p, 0, 2);
    let (types, states) = (STATS.unknown_types.get(), STATS.unknown_states.get());
    for t in [0, 3, 0x48] {
        assert!(p.start(c.context, &mut emulator::descr(t, H::NULL, 0)).is_null());
    }
    let coll = p.coll(&c, H::NULL, "AllReduce", "RING", "LL", "ncclInt8", 1, 1, 0);
    let op = p.proxy_op(c.context, coll, pid(), 0, 1, 0, 1, true);
    let step = p.proxy_step(c.context, op, 0, 0);
    p.state(step, 999, 1);
    p.state(coll, ty::SEND_WAIT, 1);
    p.state(op, ty::KERNEL_CH_STOP, 1);
    assert!(STATS.unknown_types.get() >= types + 3);
    assert!(STATS.unknown_states.get() >= states + 3);
    finalize(p, &c);
}

#[test]
fn stale_and_double_stopped_handles_are_safe() {
    let (p, _) = setup();
    let c = new_comm(p, 0, 2);
    let before = STATS.stale.get();
    p.stop(H(0x1234 as *mut _));
    p.state(H(usize::MAX as *mut _), ty::SEND_WAIT, 1);
    let coll = allreduce(p, &c, 2, 4096);
    p.stop(coll); // double stop of a Coll: NCCL does this with stale API handles
    let s = finalize(p, &c);
    assert_eq!(s.iter().flat_map(|w| &w.colls).map(|g| g.ops.len()).sum::<usize>(), 1);
    // Handles of a finalized communicator are stale, also as parents and contexts.
    p.stop(coll);
    assert!(p.proxy_op(c.context, coll, pid(), 0, 1, 0, 1, true).is_null());
    assert!(p.proxy_step(c.context, coll, 0, 0).is_null());
    p.finalize(c.context);
    assert!(STATS.stale.get() >= before + 5);
}

#[test]
fn group_has_a_handle_but_no_record_and_ctrl_and_receives_are_declined() {
    let (p, _) = setup();
    let c = new_comm(p, 0, 2);
    let declined = STATS.declined.get();
    let g = p.group(&c);
    assert!(!g.is_null());
    let coll = p.coll(&c, g, "AllReduce", "RING", "LL", "ncclInt8", 1, 1, 0); // v4: the Group is the parent
    assert!(!coll.is_null());
    p.stop(coll);
    p.stop(g);
    assert!(
        p.start(c.context, &mut emulator::descr(ty::PROXY_CTRL, H::NULL, 0))
            .is_null()
    );
    let p2p_recv = p.p2p(&c, g, "Recv", "ncclInt8", 10, 1);
    assert!(p2p_recv.is_null());
    // A receive op under a declined (NULL) or foreign parent is declined too.
    assert!(p.proxy_op(c.context, p2p_recv, pid(), 0, 1, 0, 2, false).is_null());
    assert!(p.proxy_op(c.context, coll, pid() + 1, 0, 1, 0, 2, false).is_null());
    // One under our collective is recorded (it ends the collective), and so are its steps (for
    // hang diagnosis): a restarted one (its start only), then the step's RecvGPUWait and stop.
    let recv = p.proxy_op(c.context, coll, pid(), 0, 1, 0, 2, false);
    assert!(!recv.is_null());
    p.state(recv, ty::OP_IN_PROGRESS, 0);
    let restarted = p.proxy_step(c.context, recv, 0, 0);
    let s = p.proxy_step(c.context, recv, 0, 0);
    assert!(!restarted.is_null() && !s.is_null());
    for (state, bytes) in [
        (ty::RECV_WAIT, 0),
        (ty::RECV_FLUSH_WAIT, 4096),
        (ty::RECV_GPU_WAIT, 4096),
    ] {
        p.state(s, state, bytes);
    }
    p.stop(s);
    p.stop(recv);
    assert!(STATS.declined.get() >= declined + 5);
    let s = finalize(p, &c);
    assert_eq!(
        s.iter().map(|w| w.stats.records).sum::<u64>(),
        9,
        "the Coll start and stop, the receive op's start, InProgress and stop, two receive step \
         starts, one RecvGPUWait and its step's stop"
    );
    assert_eq!(
        s.iter().map(|w| w.stats.unfinished).sum::<u64>(),
        0,
        "receive steps never count as open"
    );
}

/// A ring collective is complete when its last receive has landed: the host time ends at the
/// last ProxyOp stop of either direction, not at the last send.
#[test]
fn a_collective_ends_at_its_last_receive() {
    let (p, _) = setup();
    let c = new_comm(p, 0, 2);
    // The plugin reads its clock somewhere inside the Coll start and the receive op's stop.
    let before = Instant::now();
    let coll = p.coll(&c, H::NULL, "AllReduce", "RING", "SIMPLE", "ncclFloat32", 1024, 1, 0);
    let after = Instant::now();
    p.stop(coll);
    let send = p.proxy_op(c.context, coll, pid(), 0, 1, 0, 1, true);
    let recv = p.proxy_op(c.context, coll, pid(), 0, 1, 0, 1, false);
    p.state(send, ty::OP_IN_PROGRESS, 0);
    p.state(recv, ty::OP_IN_PROGRESS, 0);
    p.send_step(c.context, send, 0, 0, 4096, 1, Duration::from_micros(100));
    emulator::spin(Duration::from_micros(998).saturating_sub(after.elapsed()));
    p.stop(send);
    let send_done = after.elapsed();
    emulator::spin(Duration::from_micros(3000).saturating_sub(after.elapsed()));
    let stop_from = after.elapsed();
    p.stop(recv);
    let stop_to = before.elapsed();
    let s = finalize(p, &c);
    let d = s
        .iter()
        .flat_map(|w| &w.colls)
        .flat_map(|g| &g.ops)
        .next()
        .unwrap()
        .duration;
    // 1 % for the plugin's clock rate, calibrated at init.
    let d = Duration::from_secs_f64(d.expect("a host time"));
    assert!(
        send_done < stop_from && (stop_from.mul_f64(0.99)..=stop_to.mul_f64(1.01)).contains(&d),
        "{d:?}: want the receive's stop, {stop_from:?}..={stop_to:?}, not the send's ({send_done:?})"
    );
}

#[test]
fn pxn_ops_never_decode_foreign_context_or_parent() {
    let (p, _) = setup();
    let c = new_comm(p, 1, 4);
    let (ops, unmatched) = (STATS.foreign_ops.get(), STATS.foreign_unmatched.get());
    // The originator's context: its own (slot, generation), our communicator's hash bits.
    let ours = Context::decode(c.context as u64).unwrap();
    let foreign_ctx = Context::new(
        nccl_profiler_otel::record::handle::CommId {
            slot: 4000,
            generation: 7,
        },
        c.hash,
    )
    .encode() as *mut _;
    let bogus_parent = H(0xdead_beef_0000 as *mut _);
    let op = p.proxy_op(foreign_ctx, bogus_parent, pid() + 1, 3, 0, 2, 2, true);
    assert!(!op.is_null(), "recorded under our communicator with the same hash");
    (0..2).for_each(|s| p.send_step(foreign_ctx, op, 3, s, 1 << 20, 0, Duration::from_micros(5)));
    p.stop(op);
    // A foreign op for a communicator we do not have is dropped, never decoded.
    let other = Context::new(ours.comm, !c.hash).encode() as *mut _;
    assert!(p.proxy_op(other, bogus_parent, pid() + 1, 3, 0, 2, 2, true).is_null());
    assert_eq!(STATS.foreign_ops.get(), ops + 1);
    assert_eq!(STATS.foreign_unmatched.get(), unmatched + 1);
    let s = finalize(p, &c);
    let link = s
        .iter()
        .flat_map(|w| &w.links)
        .find(|l| l.rank == 3 && l.peer == 0)
        .expect("PXN link under the originating rank");
    assert_eq!((link.bytes, link.transfers), (2 << 20, 2));
    assert_eq!(
        s.iter().map(|w| w.stats.orphans).sum::<u64>(),
        0,
        "a foreign op has no parent to miss"
    );
}

#[test]
fn a_context_another_process_tagged_is_foreign_even_under_our_pid() {
    let (p, _) = setup();
    let c = new_comm(p, 1, 4);
    let ours = Context::decode(c.context as u64).unwrap();
    assert!(ours.is_ours());
    // A process in another PID namespace with our PID: its context may even name our slot and
    // generation; only its process tag differs.
    let theirs = Context {
        process: ours.process.wrapping_add(1),
        ..ours
    }
    .encode() as *mut _;
    let ops = STATS.foreign_ops.get();
    let op = p.proxy_op(theirs, H(0xdead_beef_0000 as *mut _), pid(), 3, 0, 2, 2, true);
    assert!(
        !op.is_null(),
        "recorded as a PXN op under our communicator with the same hash"
    );
    assert_eq!(STATS.foreign_ops.get(), ops + 1, "taken as foreign, not as ours");
    (0..2).for_each(|s| p.send_step(theirs, op, 3, s, 1 << 20, 0, Duration::from_micros(5)));
    p.stop(op);
    let s = finalize(p, &c);
    assert!(
        s.iter()
            .flat_map(|w| &w.links)
            .any(|l| l.rank == 3 && l.peer == 0 && l.transfers == 2),
        "the link is under the originating rank"
    );
}

#[test]
fn trans_size_comes_only_from_send_wait() {
    let (p, _) = setup();
    let c = new_comm(p, 0, 2);
    allreduce(p, &c, 3, 777); // each step also reports a stale 12345 on GPUWait and PeerWait
    let s = finalize(p, &c);
    let t: Vec<u64> = s
        .iter()
        .flat_map(|w| &w.colls)
        .flat_map(|g| &g.transfers)
        .map(|t| t.bytes)
        .collect();
    assert_eq!(t, vec![777; 3]);
}

#[test]
fn kernel_channels_give_gpu_time_without_proxy_ops() {
    let (p, _) = setup();
    let c = new_comm(p, 0, 2);
    let coll = p.coll(&c, H::NULL, "AllGather", "RING", "LL128", "ncclInt8", 1 << 20, 2, 5);
    p.stop(coll);
    for (ch, start, stop) in [(0u8, 1_000_000u64, 1_050_000u64), (1, 1_010_000, 1_080_000)] {
        let k = p.kernel_ch(c.context, coll, ch, start);
        p.state(k, ty::KERNEL_CH_STOP, stop);
        p.stop(k);
    }
    let s = finalize(p, &c);
    let g = s.iter().flat_map(|w| &w.colls).next().unwrap();
    assert_eq!(
        (g.key.func, g.key.algo, g.key.proto, g.key.datatype),
        (Func::AllGather, Algo::Ring, Proto::Ll128, Datatype::Int8)
    );
    // nccl-tests' size: 1 MiB per rank × 2 ranks.
    assert_eq!(g.ops[0].bytes, 2 << 20);
    assert_eq!(g.ops[0].duration, None, "no host time without proxy ops");
    let d = g.ops[0].gpu.unwrap();
    assert!((d - 80e-6).abs() < 1e-12, "max stop - min start = 80 µs, got {d}");
}

#[test]
fn finalize_with_events_in_flight_reports_them_unfinished() {
    let (p, _) = setup();
    let c = new_comm(p, 0, 2);
    let coll = p.coll(
        &c,
        H::NULL,
        "ReduceScatter",
        "RING",
        "SIMPLE",
        "ncclFloat16",
        4096,
        1,
        0,
    );
    let op = p.proxy_op(c.context, coll, pid(), 0, 1, 0, 4, true);
    let step = p.proxy_step(c.context, op, 0, 0);
    p.state(step, ty::SEND_WAIT, 512);
    let s = finalize(p, &c); // nothing was stopped
    assert_eq!(s.len(), 1);
    let w = &s[0];
    assert!(w.stats.forced && w.stats.unfinished == 3, "{:?}", w.stats);
    assert_eq!(w.colls[0].ops[0].duration, None, "no duration rather than a wrong one");
    // Callbacks after finalize are harmless.
    p.stop(step);
    p.stop(op);
}

#[test]
fn count_trigger_rotates_and_children_follow_their_parent() {
    let (p, _) = setup();
    let c = new_comm(p, 0, 2);
    // A collective starts in window A, then enough other traffic to pass the count trigger.
    let coll = p.coll(&c, H::NULL, "AllReduce", "RING", "SIMPLE", "ncclFloat32", 1 << 20, 1, 1);
    p.stop(coll);
    // 8 records per one-step collective: Coll start and stop; op start and stop; step start,
    // SendPeerWait, SendWait and stop.
    let filler = COUNT_TRIGGER as i32 / 8 + 1;
    (0..filler).for_each(|_| {
        allreduce(p, &c, 1, 64);
    });
    let t0 = Instant::now();
    assert!(
        poll(c.hash, t0).is_empty(),
        "A closes but still has an open collective child to come"
    );
    // The collective's proxy op arrives after the rotation: it must still land in A.
    let op = p.proxy_op(c.context, coll, pid(), 0, 1, 3, 2, true);
    (0..2).for_each(|s| p.send_step(c.context, op, 0, s, 1 << 16, 0, Duration::ZERO));
    p.stop(op);
    // A new root goes to the new window B.
    allreduce(p, &c, 1, 64);
    let a = poll(c.hash, t0 + SETTLE);
    assert_eq!(a.len(), 1, "A is processed once settled with nothing open");
    assert_eq!(a[0].stats.orphans, 0);
    // A's collectives are held until B, filling meanwhile, is processed: finalize releases all.
    let b = finalize(p, &c);
    let ops: Vec<_> = a.iter().chain(&b).flat_map(|w| &w.colls).flat_map(|g| &g.ops).collect();
    let seq1 = ops.iter().filter(|o| o.transfers == 2).count();
    assert_eq!(seq1, 1, "the late proxy op was linked to its collective in A");
    assert_eq!(ops.len(), filler as usize + 2, "A's, and B's one");
}

#[test]
fn time_trigger_and_grace_period_bound_a_window() {
    let (p, _) = setup();
    let c = new_comm(p, 0, 2);
    let t0 = Instant::now();
    let coll = p.coll(&c, H::NULL, "Broadcast", "RING", "SIMPLE", "ncclInt8", 100, 1, 0);
    p.stop(coll);
    let _never_stopped = p.proxy_op(c.context, coll, pid(), 0, 1, 0, 1, true);
    assert!(poll(c.hash, t0 + INTERVAL / 2).is_empty(), "no trigger yet");
    assert!(
        poll(c.hash, t0 + INTERVAL + SETTLE).is_empty(),
        "closed by time, waiting for the op"
    );
    let s = poll(c.hash, t0 + 2 * INTERVAL + 2 * SETTLE);
    assert_eq!(s.len(), 1, "the grace period ends CLOSING with the op unfinished");
    assert!(s[0].stats.forced && s[0].stats.unfinished == 1);
    assert_eq!(s[0].colls[0].ops[0].duration, None);
    finalize(p, &c);
}

/// With the telemetry thread off nothing is processed: the first window switches to the standby
/// window armed at `init` when its application lane holds `COUNT_TRIGGER` records, and the second,
/// with no standby left, sheds more for every further multiple of the trigger (level 2, then 4:
/// sampled collectives only) and takes new events up to 3/4 of that lane's capacity; the rest is
/// kept for their stops (children have the proxy lane). Every collective is counted, recorded or
/// not (one that finds no room too); every other record that finds no room is counted as a drop,
/// nothing waits.
#[test]
fn a_full_window_drops_and_counts_without_waiting() {
    let (p, _) = setup();
    let c = new_comm(p, 0, 2);
    let (cap, trigger) = (CAPACITY as usize, COUNT_TRIGGER as usize);
    let roots = cap * 3 / 4;
    let handles: Vec<H> = (0..2 * cap)
        .map(|i| p.coll(&c, H::NULL, "AllReduce", "RING", "LL", "ncclInt8", 1, 1, i as u64))
        .collect();
    assert!(handles.iter().all(|h| !h.is_null()), "every collective has a handle");
    let accepted: Vec<H> = handles.iter().copied().filter(|&h| !shed(h)).collect();
    assert_eq!(accepted.len(), trigger + roots);
    let comm = comm::all().find(|x| x.learned_hash() == c.hash && x.is_live()).unwrap();
    assert_eq!(comm.level_now(), 4, "two further multiples of the trigger");
    assert_eq!(
        counted(comm),
        (2 * cap - accepted.len()) as u64,
        "the others are counted"
    );
    assert_eq!(
        comm.drop_counts().full,
        0,
        "a collective without room is counted, not dropped"
    );
    // Two children per accepted event go to their parent's window, in its proxy lane, up to
    // that lane's capacity; then drops are counted (the current window has no room either).
    let ops: Vec<H> = accepted
        .iter()
        .flat_map(|&coll| [coll, coll])
        .map(|coll| p.proxy_op(c.context, coll, pid(), 0, 1, 0, 1, true))
        .collect();
    let fitted = 2 * trigger + cap;
    assert_eq!(ops.iter().filter(|h| !h.is_null()).count(), fitted);
    // The first window's application lane still has room for its stops, the second for only
    // `cap - roots` of them: the rest are counted.
    accepted.iter().for_each(|&h| p.stop(h));
    let (op_drops, stop_drops) = (ops.len() - fitted, roots - (cap - roots));
    assert_eq!(comm.drop_counts().full, (op_drops + stop_drops) as u64);
    let s = finalize(p, &c);
    assert_eq!(
        s.iter().map(|w| w.stats.records).sum::<u64>(),
        (4 * trigger + 2 * cap) as u64
    );
    // Children that found no room (and ops never stopped): times withheld, not short.
    let ops = s.iter().flat_map(|w| &w.colls).flat_map(|g| &g.ops);
    assert!(ops.clone().count() == accepted.len() && ops.clone().all(|o| o.duration.is_none() && o.gpu.is_none()));
}

/// Whether `h` is the handle of an operation counted without a record.
fn shed(h: H) -> bool {
    Handle::decode(h.0 as u64).is_some_and(|h| h.kind() == Kind::Shed)
}

/// Operations the communicator counted without a record since the last drain (taken).
fn counted(comm: &comm::Comm) -> u64 {
    let mut out = Vec::new();
    comm.counts.drain(&mut out);
    out.iter().map(|c| c.ops).sum()
}

/// The live communicator of `c`.
fn live_comm(c: &emulator::Comm) -> &'static comm::Comm {
    comm::all().find(|x| x.learned_hash() == c.hash && x.is_live()).unwrap()
}

fn kind(h: H) -> Option<Kind> {
    Handle::decode(h.0 as u64).map(|h| h.kind())
}

/// Shed levels, forced (process-wide, hence a process of its own): at level 1 proxy ops start
/// bare and their steps are shed; at the highest level nearly every operation is counted only,
/// with a handle whose children, states and stop are shed without a record; every operation is
/// counted, recorded or not; an empty window takes a new level at the consumer's next look.
#[test]
fn forced_shed_levels_are_obeyed_by_every_callback() {
    if !support::process::own_process(module_path!(), "forced_shed_levels_are_obeyed_by_every_callback") {
        return;
    }
    let (p, _) = setup();
    comm::force_level(Some(shed::DETAIL));
    let c = new_comm(p, 0, 2);
    let x = live_comm(&c);
    assert_eq!(x.level_now(), shed::DETAIL);
    let coll = p.coll(&c, H::NULL, "AllReduce", "RING", "SIMPLE", "ncclFloat32", 256, 1, 0);
    assert_eq!(kind(coll), Some(Kind::Coll));
    let send = p.proxy_op(c.context, coll, pid(), 0, 1, 0, 1, true);
    let recv = p.proxy_op(c.context, coll, pid(), 0, 1, 0, 1, false);
    assert_eq!(
        (kind(send), kind(recv)),
        (Some(Kind::ProxyOpBare), Some(Kind::RecvOpBare))
    );
    let declined = STATS.declined.get();
    assert!(p.proxy_step(c.context, send, 0, 0).is_null() && p.proxy_step(c.context, recv, 0, 0).is_null());
    assert_eq!(
        (x.drop_counts().shed, STATS.declined.get()),
        (2, declined),
        "steps shed, not declined"
    );
    p.state(recv, ty::OP_IN_PROGRESS, 0);
    [send, recv, coll].into_iter().for_each(|h| p.stop(h));
    assert_eq!(x.drop_counts().full + x.drop_counts().late, 0);
    let s = finalize(p, &c);
    assert_eq!(
        s.iter().map(|w| w.stats.records).sum::<u64>(),
        7,
        "3 starts, InProgress, 3 stops"
    );

    comm::force_level(Some(shed::MAX_LEVEL));
    let c = new_comm(p, 0, 2);
    let x = live_comm(&c);
    let colls: Vec<H> = (0..300)
        .map(|i| p.coll(&c, H::NULL, "AllReduce", "RING", "SIMPLE", "ncclFloat32", 256, 1, i))
        .collect();
    let sends: Vec<H> = (0..100)
        .map(|_| p.p2p(&c, H::NULL, "Send", "ncclFloat32", 256, 1))
        .collect();
    let recorded = colls.iter().chain(&sends).filter(|&&h| !shed(h)).count() as u64;
    assert_eq!(counted(x) + recorded, 400, "every operation counted");
    let shed_coll = *colls.iter().find(|&&h| shed(h)).unwrap();
    let op = p.proxy_op(c.context, shed_coll, pid(), 0, 1, 0, 1, true);
    let kernel = p.kernel_ch(c.context, shed_coll, 0, 1);
    assert!(shed(op) && shed(kernel), "children of a shed operation");
    let (before, rejected) = (
        x.drop_counts().shed,
        STATS.stale.get() + STATS.null_args.get() + STATS.unknown_states.get(),
    );
    assert!(p.proxy_step(c.context, op, 0, 0).is_null());
    assert!(p.kernel_phase(c.context, kernel, 0, 1, 2).is_null());
    p.state(kernel, ty::KERNEL_CH_STOP, 3);
    [op, kernel, shed_coll].into_iter().for_each(|h| p.stop(h));
    let phases = u64::from(p.driving() >= Version::V7);
    assert_eq!(
        x.drop_counts().shed,
        before + 1 + phases,
        "the step and the kernel phase"
    );
    assert_eq!(
        STATS.stale.get() + STATS.null_args.get() + STATS.unknown_states.get(),
        rejected,
        "nothing rejected"
    );
    finalize(p, &c);

    let c = new_comm(p, 0, 2);
    comm::force_level(Some(2));
    poll(c.hash, Instant::now());
    assert_eq!(
        live_comm(&c).level_now(),
        2,
        "the empty window switched to the wanted level"
    );
    comm::force_level(None);
    poll(c.hash, Instant::now());
    assert_eq!(live_comm(&c).level_now(), 0);
    finalize(p, &c);
}

#[test]
fn two_threads_on_one_communicator() {
    let (p, _) = setup();
    let c = new_comm(p, 0, 2);
    let colls: Vec<H> = (0..200)
        .map(|i| p.coll(&c, H::NULL, "AllReduce", "RING", "SIMPLE", "ncclFloat32", 256, 1, i))
        .collect();
    let (colls, c) = (&colls, &c);
    std::thread::scope(|s| {
        s.spawn(|| colls.iter().for_each(|&h| p.stop(h))); // user thread stops while the proxy uses them
        s.spawn(move || {
            for &coll in colls {
                let op = p.proxy_op(c.context, coll, pid(), 0, 1, 0, 2, true);
                (0..2).for_each(|st| p.send_step(c.context, op, 0, st, 1024, 0, Duration::ZERO));
                p.stop(op);
            }
        });
    });
    let s = finalize(p, c);
    assert_eq!(sum_transfers(&s), 400);
    assert_eq!(s.iter().map(|w| w.stats.unfinished).sum::<u64>(), 0);
}

/// One scripted window sequence with hand-computed ground truth: a 2-channel ring AllReduce with
/// several step sizes, a P2P send, a window boundary in the middle of a collective, a ProxyOp
/// that never stops and a restarted (declined) receive step.
#[test]
fn scripted_scenario_matches_ground_truth() {
    let (p, _) = setup();
    let c = new_comm(p, 0, 4);
    let t0 = Instant::now();
    let ctx = c.context;
    let sizes: [u64; 6] = [512 << 10, 512 << 10, 256 << 10, 256 << 10, 128 << 10, 64 << 10];
    // Window A: ring AllReduce of 4 MiB on channels 0 (to rank 1) and 1 (to rank 3).
    let ar = p.coll(&c, H::NULL, "AllReduce", "RING", "SIMPLE", "ncclFloat32", 1 << 20, 2, 0);
    p.stop(ar);
    for (channel, peer) in [(0u8, 1), (1, 3)] {
        let op = p.proxy_op(ctx, ar, pid(), 0, peer, channel, 6, true);
        for (s, &bytes) in sizes.iter().enumerate() {
            p.send_step(ctx, op, 0, s as i32, bytes, 2, Duration::from_micros(20));
        }
        p.stop(op);
    }
    // P2P send of 3 MiB to rank 2 in 3 steps, and its (declined) receive side with a restarted step.
    let send = p.p2p(&c, H::NULL, "Send", "ncclInt8", 3 << 20, 2);
    p.stop(send);
    let recv = p.proxy_op(ctx, H::NULL, pid(), 0, 2, 0, 1, false);
    for _ in 0..2 {
        p.stop(p.proxy_step(ctx, recv, 0, 0));
    }
    let op = p.proxy_op(ctx, send, pid(), 0, 2, 0, 3, true);
    (0..3).for_each(|s| p.send_step(ctx, op, 0, s, 1 << 20, 0, Duration::from_micros(20)));
    p.stop(op);
    // A ReduceScatter whose op never stops (its steps complete).
    let rs = p.coll(&c, H::NULL, "ReduceScatter", "RING", "LL", "ncclBfloat16", 1024, 1, 0);
    p.stop(rs);
    let stuck = p.proxy_op(ctx, rs, pid(), 0, 1, 0, 1, true);
    p.send_step(ctx, stuck, 0, 0, 2048, 0, Duration::ZERO);
    // A Broadcast starts in A; its proxy op comes only after A was processed (window boundary).
    let bc = p.coll(&c, H::NULL, "Broadcast", "RING", "SIMPLE", "ncclInt8", 1 << 16, 1, 0);
    p.stop(bc);

    assert!(poll(c.hash, t0 + INTERVAL).is_empty(), "time trigger: A is CLOSING");
    let a = poll(c.hash, t0 + 2 * INTERVAL + SETTLE);
    assert_eq!(a.len(), 1, "grace period over (the stuck op keeps A open)");
    let a = &a[0];
    let late = p.proxy_op(ctx, bc, pid(), 0, 1, 0, 1, true);
    p.send_step(ctx, late, 0, 0, 1 << 16, 0, Duration::from_micros(20));
    p.stop(late);
    let b = finalize(p, &c);

    // Window A's own figures; its finished operations are held and released by finalize.
    let ops = |k: Func| -> Vec<_> {
        let all = std::iter::once(a).chain(&b);
        all.flat_map(|w| &w.colls)
            .filter(|g| g.key.func == k)
            .flat_map(|g| g.ops.clone())
            .collect()
    };
    let group = |k: Func| a.colls.iter().find(|g| g.key.func == k).unwrap();
    let ar = group(Func::AllReduce);
    assert_eq!(
        (ar.key.algo, ar.key.proto, ar.key.datatype),
        (Algo::Ring, Proto::Simple, Datatype::Float32)
    );
    let ar_ops = ops(Func::AllReduce);
    assert_eq!(ar_ops.len(), 1);
    assert_eq!((ar_ops[0].bytes, ar_ops[0].transfers), (4 << 20, 12));
    let d = ar_ops[0].duration.expect("all ops stopped");
    assert!(d >= 12.0 * 20e-6, "duration covers the 12 transfers: {d}");
    let mut got: Vec<u64> = ar.transfers.iter().map(|t| t.bytes).collect();
    let mut want: Vec<u64> = sizes.iter().chain(&sizes).copied().collect();
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got, want);
    assert!(ar.transfers.iter().all(|t| t.secs >= 20e-6));
    let rs = group(Func::ReduceScatter);
    // nccl-tests' size: 1024 bf16 per rank × 4 ranks; released at once (its op never stops).
    assert_eq!(
        (rs.ops[0].bytes, rs.ops[0].duration, rs.ops[0].transfers),
        (8192, None, 1)
    );
    // The Broadcast's op came after A was processed: linked to it through the table.
    let bc = ops(Func::Broadcast);
    assert_eq!((bc.len(), bc[0].bytes, bc[0].transfers), (1, 1 << 16, 1));
    assert!(bc[0].duration.is_some_and(|d| d >= 20e-6), "{bc:?}");
    let sends: Vec<_> = std::iter::once(a)
        .chain(&b)
        .flat_map(|w| &w.p2ps)
        .flat_map(|g| &g.ops)
        .collect();
    assert_eq!(sends.len(), 1);
    assert_eq!((a.p2ps[0].peer, sends[0].bytes, sends[0].transfers), (2, 3 << 20, 3));
    assert!(sends[0].duration.unwrap() >= 3.0 * 20e-6);
    let link = |s: &WindowSummary, peer: i32| {
        s.links
            .iter()
            .find(|l| l.rank == 0 && l.peer == peer)
            .map(|l| (l.bytes, l.transfers))
    };
    let ring_bytes: u64 = sizes.iter().sum();
    assert_eq!(link(a, 1), Some((ring_bytes + 2048, 7)));
    assert_eq!(link(a, 3), Some((ring_bytes, 6)));
    assert_eq!(link(a, 2), Some((3 << 20, 3)));
    let channel = |s: &WindowSummary, ch: u8| s.channels.iter().find(|g| g.channel == ch).map(|g| g.transfers.len());
    assert_eq!((channel(a, 0), channel(a, 1)), (Some(6 + 3 + 1), Some(6)));
    assert!(a.stats.forced);
    assert_eq!((a.stats.unfinished, a.stats.orphans), (1, 0), "only the stuck op");
    // Window B: the Broadcast's late op, no orphan, still counts for its link.
    let b: Vec<_> = b.into_iter().filter(|w| w.stats.windows > 0).collect();
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].stats.orphans, 0);
    assert_eq!(link(&b[0], 1), Some((1 << 16, 1)));
}

/// The suite never exports to a default port of the machine: every `init` through the emulator
/// fails the test when the plugin's configuration would (`support::emulator::ports`).
#[test]
#[should_panic(expected = "would export to http://localhost:4318/v1/metrics, a default port")]
fn a_test_exporting_to_a_default_port_fails() {
    emulator::ports::refuse_default_endpoint(|_| None);
}

/// What a test may export to instead: its own port, which refuses connections when it is the
/// closed one, or no exporter at all.
#[test]
fn a_test_may_export_to_its_own_port_or_nowhere() {
    use emulator::ports::{closed_endpoint, default_endpoint};
    use nccl_profiler_otel::config::{EXPORTER, TELEMETRY_ENABLE, otel};
    let closed = closed_endpoint();
    assert_eq!(
        default_endpoint(|n| (n == otel::ENDPOINT).then(|| closed.clone())),
        None
    );
    assert_eq!(default_endpoint(|n| (n == EXPORTER).then(|| "none".into())), None);
    assert_eq!(default_endpoint(|n| (n == TELEMETRY_ENABLE).then(|| "0".into())), None);
    let prometheus = |n: &str| (n == otel::METRICS_ENDPOINT).then(|| "127.0.0.1:9090/api/v1/otlp".into());
    assert_eq!(
        default_endpoint(prometheus).as_deref(),
        Some("http://127.0.0.1:9090/api/v1/otlp")
    );
    let refused = std::net::TcpStream::connect(closed.trim_start_matches("http://")).map_err(|e| e.kind());
    assert_eq!(refused.err(), Some(std::io::ErrorKind::ConnectionRefused));
}

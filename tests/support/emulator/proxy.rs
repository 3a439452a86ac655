//! The proxy progress thread of one emulated (communicator, rank) (spec 3.1, 3.6–3.9).
//!
//! It receives tasks (a Coll or P2p with its planned ProxyOps and kernel channels) from its user
//! thread and progresses all of them in one loop, like NCCL's `progressOps`:
//!
//! - One stream per communicator: a task's kernel runs after the kernels enqueued before it, so
//!   a collective's kernel channels start, and its ProxyOps progress, once every task before it
//!   finished, and a task after an unfinished collective waits for it (P2P tasks, a group's
//!   sends and receives, run together). Collectives enqueued back to back thus queue, as on a
//!   GPU: their enqueue → completion includes the wait.
//! - ProxyOps start when a task is appended (inside a ProxyCtrl Append burst when the mask has
//!   ProxyCtrl), get `InProgress` when progress begins, and stop after their last step. CollNet
//!   ops (`isSend` 0) are started and never touched again.
//! - Send steps (at most `max_in_flight` started and not stopped per op): start + SendGPUWait
//!   (stale `transSize`); when the GPU produced the data, SendPeerWait; SendWait with the step's
//!   bytes when the network takes it: at once ([`Options::queue`], a NIC queue), or once the
//!   wire is free (then SendPeerWait repeats meanwhile). The wire (the rank's NIC, shared with
//!   its proxies of every communicator, [`Options::nic_fifo`]; else the link, this rank → peer,
//!   all channels) carries one step's bytes at a time, first in, first out: a step's wire time
//!   starts when the wire is free, and it stops `latency` after its `bytes / bandwidth` on the
//!   wire (both × jitter).
//! - Receive steps: start (the first one twice with `restart_recv`) + RecvWait; RecvFlushWait and
//!   RecvGPUWait with the bytes when the data arrived over the inbound link; stop once the GPU
//!   consumed it.
//! - KernelCh per channel: start with the GPU start time when the task is appended; KernelChStop
//!   with the GPU stop time and stop when the channel's ops are done (or after the modelled GPU
//!   time for channels without network ops). From NCCL 2.31 the profiler thread makes these
//!   callbacks ([`super::profiler_thread`]), with the channel's phases: the opening sync lasts
//!   until the channel's first data from a peer arrived (1 µs without network receives) and
//!   its send peer was ready (a late or stalled peer), the closing barrier 1 µs (none under
//!   LL/LL128).
//! - ProxyCtrl: a Sleep/Wakeup burst around waiting for work, Idle/Active edges.
//!
//! Waits are coarse (sleep, also woken by new tasks) except for step stops, which are precise
//! ([`time::wait_until`]): at the end of the progress loop's pass in which the transfer
//! completed, with the other completions of that pass ([`Options::pass`]). The thread pauses now
//! and then as a hypervisor pauses it ([`Options::pauses`]): completions due meanwhile are seen
//! late, together.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::host::{Passes, Paused, Rng};
use super::net::{Jitter, Link, Network};
use super::plugin::{self, Comm, Descr, H, Plugin, Version, descr, mask, net_plugin_descr, proxy_op_descr, ty};
use super::profiler_thread::{self, KernelMsg};
use super::stall::Held;
use super::time::{self, gpu_ns};
use super::truth::{CollTruth, DISTURBED, LinkTruth, Report, StepTruth};
use super::workload::{CommSpec, Done, Func, Options};

/// A callback taking longer than this was preempted in the middle.
const CALL_BUDGET: Duration = Duration::from_micros(5);

/// ProxyOp states of v1–v3 (spec 8.2.2).
const OP_SEND_POSTED: u32 = 0;
const OP_SEND_REM_FIFO_WAIT: u32 = 1;
const OP_SEND_TRANSMITTED: u32 = 2;
const OP_SEND_DONE: u32 = 3;
const OP_RECV_POSTED: u32 = 4;
const OP_RECV_RECEIVED: u32 = 5;
const OP_RECV_TRANSMITTED: u32 = 6;
const OP_RECV_DONE: u32 = 7;

/// What a never-used proxy slot's running `transSize` is not: leftovers of earlier operations
/// (spec 8.2.2), so that a plugin using absolute values is caught.
const LEFTOVER: u64 = 0x5EED_0000;

/// When to look again at a step that waits for another rank ([`Held::Unknown`]) since `since`:
/// after 1 ms at first, then an eighth of the wait so far, at most 20 ms, so that the proxies of
/// a hung job do not poll all the time.
fn poll_at(since: Instant, now: Instant) -> Instant {
    let wait = now.saturating_duration_since(since) / 8;
    now + wait.clamp(Duration::from_millis(1), Duration::from_millis(20))
}

/// A transfer ending sooner than this is waited for before any other work.
const PRECISE_GUARD: Duration = Duration::from_micros(50);

/// How a planned ProxyOp behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpKind {
    /// Network send with steps.
    Send,
    /// Network receive with steps.
    Recv,
    /// Started with `isSend` 0 and never touched again (CollNet).
    Abandoned,
}

/// A ProxyOp the proxy thread will run.
#[derive(Clone, Debug)]
pub(crate) struct OpPlan {
    pub kind: OpKind,
    /// Communicator rank of the remote end, and its world rank.
    pub peer: i32,
    pub world_peer: usize,
    pub channel: u8,
    /// Bytes of each network transfer.
    pub steps: Vec<u64>,
    /// Send: this rank → peer; receive: peer → this rank.
    pub link: Link,
    pub chunk: u64,
    /// Reported as another process's op (spec 4.3).
    pub pxn: bool,
}

/// When a kernel channel finishes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum KernelEnd {
    /// When the channel's network ops are done.
    AfterOps,
    /// This long after launch.
    After(Duration),
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct KernelPlan {
    pub channel: u8,
    pub end: KernelEnd,
    /// LL/LL128: no closing barrier, so no BEFORE_CLOSE phase stamp (spec 7.3.1).
    pub ll: bool,
}

/// How long a kernel channel's closing barrier takes (Simple protocol), and its opening sync
/// when no data from a peer is awaited.
const SYNC: Duration = Duration::from_micros(1);

/// One Coll or P2p handed from the user thread.
pub(crate) struct Task {
    /// The Coll/P2p handle (already stopped), parent of the ProxyOps and KernelCh.
    pub root: H,
    /// The activation mask sampled at the API call (spec 3.2).
    pub mask: i32,
    /// When the kernel was launched.
    pub launch: Instant,
    pub truth: CollTruth,
    pub ops: Vec<OpPlan>,
    pub kernels: Vec<KernelPlan>,
    /// Ring data dependency: send step `k` forwards what receive step `k - d` brought (1 for
    /// AllReduce, AllGather and ReduceScatter, 0 for Broadcast), when the channel has a network
    /// receive; `None` for P2P.
    pub ring_dep: Option<usize>,
    pub done: Arc<Done>,
}

struct Sent {
    t0: Instant,
    /// When the wire took the step's bytes and was done with them.
    wire: (Instant, Instant),
    /// SendWait → stop on an idle wire.
    idle: Duration,
    /// When the transfer completes (the receiver has its data, the wire's next may follow).
    deadline: Instant,
    /// When the proxy thread sees it complete and calls its stop: the end of that pass
    /// ([`Options::pass`]).
    seen: Instant,
    call: Duration,
    net: H,
    /// The SendWait callback is still to come (a preempted proxy thread), just before the stop.
    late_send_wait: bool,
}

struct Step {
    handle: H,
    /// v1: the second NCCL step of the transfer (sliceSteps 2), which gets every call too.
    sibling: H,
    /// Send: index of the receive step whose data this step forwards, until it arrived.
    dep: Option<usize>,
    bytes: u64,
    /// Send: GPU data ready; receive: data arrived.
    ready: Instant,
    peer_waits: u32,
    next_peer_wait: Instant,
    sent: Option<Sent>,
    /// Receive: flushed and handed to the GPU, consumed at this time.
    consumed: Option<Instant>,
    /// Receive: held by the stall ([`Options::stall`]) before the stalled rank stopped: its
    /// arrival is known (and recorded) only once it did.
    stalled: bool,
    /// When it was posted.
    posted: Instant,
}

struct Op {
    plan: OpPlan,
    handle: H,
    context: *mut c_void,
    in_progress: bool,
    started: usize,
    stopped: usize,
    steps: VecDeque<Step>,
    gpu_free: Instant,
    /// Stale `transSize` NCCL reports on states that carry none.
    last_trans: u64,
    /// v1–v3: the ProxyOp's descriptor until the first progress starts it, and the running
    /// `transSize` of its proxy slot (never reset, spec 8.2.2).
    pending: Option<Descr>,
    total: u64,
    /// NCCL steps per transfer as v1 reports them (sliceSteps: 2 for ring AllReduce, AllGather
    /// and ReduceScatter), else 1.
    slice: usize,
    done: bool,
    /// Send: when the peer was ready for its first step, if it kept it waiting ([`Held`]).
    peer_ready: Option<Instant>,
    /// The board's number of its first step ([`Options::board`]).
    first: u64,
}

struct Kernel {
    plan: KernelPlan,
    /// The KernelCh handle (proxy thread), or the key of its KernelCh on the profiler thread.
    handle: H,
    key: u64,
    /// When this channel's work started: the launch plus its skew.
    start: Instant,
    gpu_start: u64,
    done: bool,
}

struct Active {
    task: Task,
    ops: Vec<Op>,
    kernels: Vec<Kernel>,
    /// Per channel with a network receive: when each of its receive steps arrives.
    arrivals: Vec<Option<Vec<Instant>>>,
    /// When its kernel started: at its launch, or once the collectives before it on the
    /// communicator finished (one stream); `None` while it waits for them.
    launched: Option<Instant>,
}

impl Active {
    fn finished(&self) -> bool {
        self.launched.is_some() && self.ops.iter().all(|o| o.done) && self.kernels.iter().all(|k| k.done)
    }

    /// A collective (not a P2P task, which runs together with the rest of its group).
    fn collective(&self) -> bool {
        !matches!(self.task.truth.func, Func::Send | Func::Recv)
    }
}

/// Earliest coarse and precise wake-up times.
#[derive(Default)]
struct Next {
    coarse: Option<Instant>,
    precise: Option<Instant>,
}

impl Next {
    fn coarse(&mut self, t: Instant) {
        self.coarse = Some(self.coarse.map_or(t, |c| c.min(t)));
    }
    fn precise(&mut self, t: Instant) {
        self.precise = Some(self.precise.map_or(t, |c| c.min(t)));
    }
}

/// A NetPlugin socket descriptor (`ncclProfilerNetSockDescr_v1_t`, spec 2.10).
#[repr(C)]
struct SockDescr {
    ty: u8,
    fd: i32,
    op: i32,
    length: usize,
}

pub(crate) struct Proxy<'a> {
    plugin: &'a Plugin,
    comm: Comm,
    name: String,
    hash: u64,
    rank: i32,
    world: usize,
    net: &'a Network,
    opts: &'a Options,
    jitter: Jitter,
    /// The progress loop's passes ([`Options::pass`]).
    passes: Passes,
    /// The hypervisor's pauses of this thread ([`Options::pauses`]).
    paused: Option<Paused>,
    active: Vec<Active>,
    out: Report,
    links: BTreeMap<i32, LinkTruth>,
    /// When each link (peer, is send) is free for the next transfer's bytes: every channel's
    /// operations to one peer share it.
    wires: HashMap<(usize, bool), Instant>,
    /// With [`Options::nic_fifo`]: when this process's NIC is free for the next send's bytes,
    /// shared with the proxies of every communicator of the world rank.
    nic: Arc<Mutex<Option<Instant>>>,
    /// How much before a transfer's end the precise wait ends (learnt: the emulator's own delay
    /// from the end of the wait to the stop call).
    aim: Duration,
    sock: Box<SockDescr>,
    /// Send steps handed to the network so far (for [`Options::preempt_every`]).
    handed: u64,
    /// NCCL 2.31+: the profiler thread that makes the KernelCh and KernelPhase callbacks.
    profiler: Option<mpsc::Sender<KernelMsg>>,
    kernels_posted: u64,
    /// v1–v3: the running `transSize` each proxy slot (peer, channel, direction) keeps across
    /// operations, starting from leftovers.
    slot_totals: HashMap<(usize, u8, bool), u64>,
    /// The board's number of the next op's first step per link direction (peer, channel,
    /// direction), counted across operations ([`Options::board`]).
    board_steps: HashMap<(usize, u8, bool), u64>,
}

// SAFETY: the raw pointers inside are opaque plugin values (context, handles) and a descriptor
// owned by this proxy; NCCL's proxy thread is a different thread from the one that built it.
unsafe impl Send for Proxy<'_> {}

impl<'a> Proxy<'a> {
    pub(crate) fn new(
        plugin: &'a Plugin,
        comm: Comm,
        spec: &CommSpec,
        rank: i32,
        world: usize,
        net: &'a Network,
        opts: &'a Options,
    ) -> Proxy<'a> {
        Proxy {
            plugin,
            comm,
            name: spec.name.clone(),
            hash: spec.hash,
            rank,
            world,
            net,
            opts,
            jitter: Jitter::new(net, spec.hash ^ rank as u64),
            passes: Passes::new(opts.pass, &mut Rng::new(net.seed, spec.hash ^ rank as u64 ^ 0x9A55)),
            paused: opts
                .pauses
                .map(|p| Paused::new(p, Rng::new(net.seed, spec.hash ^ rank as u64 ^ 0x9A05E))),
            active: Vec::new(),
            out: Report::default(),
            links: BTreeMap::new(),
            wires: HashMap::new(),
            nic: Arc::default(),
            aim: Duration::ZERO,
            handed: 0,
            profiler: None,
            kernels_posted: 0,
            slot_totals: HashMap::new(),
            board_steps: HashMap::new(),
            sock: Box::new(SockDescr {
                ty: 1,
                fd: 42,
                op: 0,
                length: 0,
            }),
        }
    }

    /// Sends over `nic`, the NIC of its world rank, with [`Options::nic_fifo`].
    pub(crate) fn on_nic(mut self, nic: &Arc<Mutex<Option<Instant>>>) -> Proxy<'a> {
        self.nic = nic.clone();
        self
    }

    /// When the send wire `wire` (peer, true) is free: the link's own, or the NIC's.
    fn wire_free(&self, wire: (usize, bool)) -> Option<Instant> {
        if self.opts.nic_fifo {
            *self.nic.lock()
        } else {
            self.wires.get(&wire).copied()
        }
    }

    /// Hands `wire_time` of bytes to the send wire `wire` at `t0`: first in, first out, they
    /// occupy it from when it is free; (start, end) on the wire.
    fn take_wire(&mut self, wire: (usize, bool), t0: Instant, wire_time: Duration) -> (Instant, Instant) {
        let place = |free: Option<Instant>| {
            let start = free.map_or(t0, |w| w.max(t0));
            (start, start + wire_time)
        };
        let (start, end) = if self.opts.nic_fifo {
            let mut nic = self.nic.lock();
            let taken = place(*nic);
            *nic = Some(taken.1);
            taken
        } else {
            let taken = place(self.wires.get(&wire).copied());
            self.wires.insert(wire, taken.1);
            taken
        };
        (start, end)
    }

    /// Runs until the user thread closes the queue and every task finished; from NCCL 2.31 with
    /// a profiler thread beside it.
    pub(crate) fn run(mut self, rx: mpsc::Receiver<Task>) -> Report {
        if !self.plugin.release().profiler_thread() {
            return self.progress_loop(rx);
        }
        let plugin = self.plugin;
        let name = format!("emu-profiler-{}-{}", self.name, self.rank);
        std::thread::scope(|s| {
            let (tx, kernels) = mpsc::channel();
            let thread = std::thread::Builder::new()
                .name(name)
                .spawn_scoped(s, move || profiler_thread::run(plugin, kernels))
                .expect("spawn profiler thread");
            self.profiler = Some(tx);
            let mut out = self.progress_loop(rx);
            let truth = thread.join().expect("profiler thread");
            out.callbacks += truth.callbacks;
            out.phases = truth.phases;
            out
        })
    }

    /// The proxy thread's loop.
    fn progress_loop(mut self, rx: mpsc::Receiver<Task>) -> Report {
        time::precise_thread();
        if self.opts.realtime {
            time::realtime_thread();
        }
        if !self.opts.spin {
            time::sleeping_thread();
        }
        let calls_before = plugin::calls_on_this_thread();
        let mut open = true;
        let mut idle = true;
        loop {
            if let Some(p) = &mut self.paused {
                p.maybe();
            }
            if self.active.is_empty() {
                if !idle {
                    self.ctrl_burst(ty::CTRL_IDLE);
                }
                if !open {
                    break;
                }
                let ctrl = self.ctrl_start(ty::CTRL_SLEEP);
                let msg = rx.recv();
                self.ctrl_end(ctrl, ty::CTRL_WAKEUP);
                match msg {
                    Ok(t) => {
                        self.ctrl_burst(ty::CTRL_ACTIVE);
                        idle = false;
                        let mut tasks = vec![t];
                        tasks.extend(rx.try_iter());
                        self.append(tasks);
                    }
                    Err(_) => break,
                }
            } else if open {
                let tasks: Vec<Task> = rx.try_iter().collect();
                if !tasks.is_empty() {
                    self.append(tasks);
                }
            }
            // A transfer about to end goes first: nothing else may delay its stop.
            if let Some((p, ai, oi)) = self.next_seen()
                && p.saturating_duration_since(Instant::now()) <= PRECISE_GUARD
            {
                // Aim early by the usual delay between the end of the wait and the stop call.
                time::wait_until(p.checked_sub(self.aim).unwrap_or(p));
                self.stop_front(ai, oi);
                self.stop_all_due();
                continue;
            }
            let next = self.progress();
            // Wait for the next action, waking early for new tasks (coarse part only).
            let now = Instant::now();
            let wake = match (next.coarse, next.precise) {
                (Some(c), Some(p)) => Some(c.min(p.checked_sub(time::spin_margin()).unwrap_or(p))),
                (Some(c), None) => Some(c),
                (None, Some(p)) => Some(p.checked_sub(time::spin_margin()).unwrap_or(p)),
                (None, None) => None,
            };
            if wake.is_none() && !self.active.is_empty() {
                // Nothing planned yet (cannot happen with the plans above): never spin flat out.
                std::thread::sleep(Duration::from_micros(10));
            }
            if let Some(wake) = wake.filter(|&w| w > now) {
                if open {
                    match rx.recv_timeout(wake - now) {
                        Ok(t) => {
                            let mut tasks = vec![t];
                            tasks.extend(rx.try_iter());
                            self.append(tasks);
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => open = false,
                        Err(RecvTimeoutError::Timeout) => {}
                    }
                } else {
                    std::thread::sleep(wake - now);
                }
            }
            if let Some(p) = next.precise
                && p.saturating_duration_since(Instant::now()) <= time::spin_margin()
            {
                time::wait_until(p);
            }
        }
        let mut out = self.out;
        out.links = self.links.into_values().collect();
        out.callbacks += plugin::calls_on_this_thread() - calls_before;
        out
    }

    /// When the proxy sees the earliest end of a transfer in flight: (that pass's end, task
    /// index, op index).
    fn next_seen(&self) -> Option<(Instant, usize, usize)> {
        let mut best: Option<(Instant, usize, usize)> = None;
        for (ai, a) in self.active.iter().enumerate() {
            for (oi, o) in a.ops.iter().enumerate() {
                if let Some(Step { sent: Some(sent), .. }) = o.steps.front()
                    && best.is_none_or(|b| sent.seen < b.0)
                {
                    best = Some((sent.seen, ai, oi));
                }
            }
        }
        best
    }

    /// Stops every transfer whose time is over, earliest first.
    fn stop_all_due(&mut self) {
        while let Some((d, ai, oi)) = self.next_seen() {
            if d > Instant::now() {
                break;
            }
            self.stop_front(ai, oi);
        }
    }

    fn mask_now(&self) -> i32 {
        self.opts.mask.unwrap_or_else(|| self.plugin.mask())
    }

    /// Start of a ProxyCtrl burst with its first state, when the global mask has ProxyCtrl.
    fn ctrl_start(&self, state: u32) -> H {
        if !mask::proxy_ctrl(self.mask_now()) {
            return H::NULL;
        }
        let h = self
            .plugin
            .start(self.comm.context, &mut descr(ty::PROXY_CTRL, H::NULL, 0));
        if !h.is_null() {
            self.plugin.state(h, state, 0);
        }
        h
    }

    fn ctrl_end(&self, h: H, state: u32) {
        if !h.is_null() {
            self.plugin.state(h, state, 0);
            self.plugin.stop(h);
        }
    }

    /// A zero-length Idle/Active edge burst.
    fn ctrl_burst(&self, state: u32) {
        let h = self.ctrl_start(state);
        if !h.is_null() {
            self.plugin.stop(h);
        }
    }

    /// Appends tasks: their ProxyOps start inside an Append burst, their kernel channels start.
    fn append(&mut self, tasks: Vec<Task>) {
        let ctrl = self.ctrl_start(ty::CTRL_APPEND);
        let mut appended = 0u64;
        let now = Instant::now();
        for task in tasks {
            let m = task.mask;
            let sliced = matches!(task.truth.func, Func::AllReduce | Func::AllGather | Func::ReduceScatter);
            let slice = if sliced && self.plugin.driving() == Version::V1 {
                2
            } else {
                1
            };
            let ops: Vec<Op> = task
                .ops
                .iter()
                .map(|plan| {
                    let (context, pid) = if plan.pxn {
                        // Another process's op: its context (a value that process's plugin
                        // returned: here, one with our communicator's hash) and pid, and its
                        // Coll handle as parent: none of them ours to decode (spec 4.3).
                        (self.comm.context, plugin::pid() + 1)
                    } else {
                        (self.comm.context, plugin::pid())
                    };
                    // v1–v3: only network ops get events, at their first progress (spec 8.1).
                    let legacy = self.plugin.driving().legacy();
                    let wanted = mask::proxy_op(m) && !(legacy && plan.kind == OpKind::Abandoned);
                    let mut pending = None;
                    let handle = if wanted {
                        appended += 1;
                        let d = proxy_op_descr(
                            task.root,
                            pid,
                            self.rank,
                            plan.peer,
                            plan.channel,
                            plan.steps.len() as i32,
                            plan.chunk.min(i32::MAX as u64) as i32,
                            plan.kind == OpKind::Send,
                        );
                        if legacy {
                            pending = Some(d);
                            H::NULL
                        } else {
                            self.plugin.start(context, &mut { d })
                        }
                    } else {
                        H::NULL
                    };
                    let key = (plan.world_peer, plan.channel, plan.kind == OpKind::Send);
                    let total = *self.slot_totals.entry(key).or_insert(LEFTOVER);
                    let next = self.board_steps.entry(key).or_insert(0);
                    let first = *next;
                    *next += plan.steps.len() as u64;
                    Op {
                        plan: plan.clone(),
                        handle,
                        context,
                        in_progress: false,
                        started: 0,
                        stopped: 0,
                        steps: VecDeque::new(),
                        gpu_free: now,
                        last_trans: 0,
                        pending,
                        total,
                        slice,
                        done: plan.kind == OpKind::Abandoned,
                        peer_ready: None,
                        first,
                    }
                })
                .collect();
            let mut arrivals = Vec::new();
            for op in ops.iter().filter(|o| o.plan.kind == OpKind::Recv) {
                let ch = usize::from(op.plan.channel);
                if arrivals.len() <= ch {
                    arrivals.resize(ch + 1, None);
                }
                arrivals[ch] = Some(Vec::new());
            }
            let mut task = task;
            task.truth.pxn = ops
                .iter()
                .any(|o| o.plan.pxn && (!o.handle.is_null() || o.pending.is_some()));
            // One stream per communicator (see `progress`): launched now, or once what is ahead
            // finished.
            let coll = !matches!(task.truth.func, Func::Send | Func::Recv);
            let waits = self.active.iter().any(Active::collective) || (coll && !self.active.is_empty());
            let launched = (!waits).then_some(task.launch);
            let kernels = launched.map_or_else(Vec::new, |at| self.launch_kernels(&task, at));
            self.active.push(Active {
                task,
                ops,
                kernels,
                arrivals,
                launched,
            });
        }
        if !ctrl.is_null() {
            self.plugin.state(ctrl, ty::CTRL_APPEND_END, appended);
            self.plugin.stop(ctrl);
        }
    }

    /// Starts the kernel channels of `task`, its kernel launched at `launch`.
    fn launch_kernels(&mut self, task: &Task, launch: Instant) -> Vec<Kernel> {
        let m = task.mask;
        task.kernels
            .iter()
            .map(|&plan| {
                let start = launch + channel_skew(launch, plan.channel, self.opts.kernel_skew);
                let gpu_start = gpu_ns(start, self.opts.gpu_timer_ns);
                self.kernels_posted += 1;
                let key = self.kernels_posted;
                let handle = match &self.profiler {
                    _ if !mask::kernel_ch(m) => H::NULL,
                    Some(tx) => {
                        let msg = KernelMsg::Start {
                            key,
                            context: self.comm.context,
                            parent: task.root,
                            channel: plan.channel,
                            gpu_start,
                        };
                        tx.send(msg).expect("profiler thread alive");
                        H::NULL
                    }
                    None => self
                        .plugin
                        .kernel_ch(self.comm.context, task.root, plan.channel, gpu_start),
                };
                Kernel {
                    plan,
                    handle,
                    key,
                    start,
                    gpu_start,
                    done: false,
                }
            })
            .collect()
    }

    /// One pass over every active task; returns when something is due next.
    fn progress(&mut self) -> Next {
        let mut next = Next::default();
        self.stop_all_due();
        let mut active = std::mem::take(&mut self.active);
        // The earliest transfer end: when it comes near, the rest of this pass waits.
        let mut near = earliest_seen(&active);
        // One stream per communicator: a collective's kernel starts once every task before it
        // finished, and a task after an unfinished collective waits for it.
        let (mut ahead, mut coll_ahead) = (false, false);
        for a in &mut active {
            let coll = a.collective();
            if coll_ahead || (coll && ahead) {
                (ahead, coll_ahead) = (true, coll_ahead || coll);
                continue;
            }
            if a.launched.is_none() {
                let now = Instant::now();
                a.kernels = self.launch_kernels(&a.task, now);
                a.launched = Some(now);
            }
            let Active {
                task, ops, arrivals, ..
            } = a;
            let m = task.mask;
            for op in ops.iter_mut() {
                if near.is_some_and(|d| d.saturating_duration_since(Instant::now()) <= PRECISE_GUARD) {
                    next.coarse(Instant::now());
                    break;
                }
                let ch = usize::from(op.plan.channel);
                match op.plan.kind {
                    OpKind::Send => {
                        let deps = arrivals.get(ch).and_then(Option::as_deref).zip(task.ring_dep);
                        self.progress_send(op, m, &mut task.truth, deps, &mut next)
                    }
                    OpKind::Recv => {
                        let mut none = Vec::new();
                        let arrived = arrivals.get_mut(ch).and_then(Option::as_mut).unwrap_or(&mut none);
                        self.progress_recv(op, m, &mut task.truth, arrived, &mut next)
                    }
                    OpKind::Abandoned => {}
                }
                if let Some(Step { sent: Some(sent), .. }) = op.steps.front() {
                    near = Some(near.map_or(sent.seen, |d| d.min(sent.seen)));
                }
            }
            let now = Instant::now();
            for k in &mut a.kernels {
                if k.done {
                    continue;
                }
                let finished = match k.plan.end {
                    KernelEnd::AfterOps => a
                        .ops
                        .iter()
                        .filter(|o| o.plan.channel == k.plan.channel)
                        .all(|o| o.done),
                    KernelEnd::After(d) => {
                        let at = k.start + d;
                        if now < at {
                            next.coarse(at);
                        }
                        now >= at
                    }
                };
                if finished {
                    let end = match k.plan.end {
                        KernelEnd::After(d) => k.start + d,
                        KernelEnd::AfterOps => now,
                    };
                    let gpu_stop = gpu_ns(end, self.opts.gpu_timer_ns);
                    match &self.profiler {
                        Some(tx) if mask::kernel_ch(m) => {
                            // The channel waited for its first data from a peer, if any.
                            let first = arrivals
                                .get(usize::from(k.plan.channel))
                                .and_then(|a| a.as_ref()?.first());
                            let open = first.map_or(k.start + SYNC, |&t| t.clamp(k.start, end));
                            // ... and until its send peer was ready for its first data.
                            let ready = a.ops.iter().filter(|o| o.plan.channel == k.plan.channel);
                            let open = ready
                                .filter_map(|o| o.peer_ready)
                                .fold(open, |open, t| open.max(t.clamp(k.start, end)));
                            let close = (!k.plan.ll).then(|| end.checked_sub(SYNC).unwrap_or(end).max(open));
                            let gpu = |t: Instant| gpu_ns(t, self.opts.gpu_timer_ns);
                            let phases = (m & mask::KERNEL_PHASE != 0)
                                .then(|| [k.gpu_start, gpu(open), close.map_or(0, gpu), gpu_stop]);
                            let msg = KernelMsg::Finish {
                                key: k.key,
                                gpu_stop,
                                phases,
                            };
                            tx.send(msg).expect("profiler thread alive");
                        }
                        _ if !k.handle.is_null() => {
                            self.plugin.state(k.handle, ty::KERNEL_CH_STOP, gpu_stop);
                            self.plugin.stop(k.handle);
                        }
                        _ => {}
                    }
                    if mask::kernel_ch(m) {
                        let t = &mut a.task.truth;
                        t.gpu = Some(
                            t.gpu
                                .map_or((k.gpu_start, gpu_stop), |(s, e)| (s.min(k.gpu_start), e.max(gpu_stop))),
                        );
                    }
                    a.task.truth.end = Some(a.task.truth.end.map_or(now, |e| e.max(now)));
                    k.done = true;
                }
            }
            let unfinished = !a.finished();
            (ahead, coll_ahead) = (ahead || unfinished, coll_ahead || (coll && unfinished));
        }
        let now = Instant::now();
        for a in active {
            if a.finished() {
                let mut truth = a.task.truth;
                truth.end.get_or_insert(now);
                self.out.collectives.push(truth);
                a.task.done.add();
            } else {
                self.active.push(a);
            }
        }
        next
    }

    /// Stops the sent front step of op `oi` of task `ai` (its transfer time is over).
    fn stop_front(&mut self, ai: usize, oi: usize) {
        let (p, opts) = (self.plugin, self.opts);
        let a = &mut self.active[ai];
        if let Some(t) = stop_front_op(p, opts, &mut a.ops[oi], a.task.mask, &mut a.task.truth) {
            // The stop call's miss against the model moves `aim` by 50 ns towards it: `aim`
            // settles on the median delay, so the typical stop lands on time.
            if t.miss.abs() < 5e-6 {
                let aim = self.aim.as_secs_f64() + 50e-9 * t.miss.signum();
                self.aim = Duration::from_secs_f64(aim.clamp(0.0, 5e-6));
            }
            self.sample(t);
        }
    }

    /// Stops every step of `op` whose transfer time is over.
    fn stop_due(&mut self, op: &mut Op, m: i32, truth: &mut CollTruth) {
        while let Some(Step { sent: Some(sent), .. }) = op.steps.front() {
            if Instant::now() < sent.seen {
                break;
            }
            if let Some(t) = stop_front_op(self.plugin, self.opts, op, m, truth) {
                self.sample(t);
            }
        }
    }

    /// Whether this is the rank that stops posting ([`Options::stall`]).
    fn stalls(&self) -> bool {
        self.opts.stall.as_ref().is_some_and(|s| s.rank == self.world)
    }

    /// Whether step `k` of `op` in the collective `truth` is held by [`Options::stall`],
    /// [`Options::gpu_stall`], [`Options::late`] or the peer through [`Options::board`].
    fn held(&self, op: &Op, truth: &CollTruth, k: usize) -> Held {
        let (o, peer, it) = (self.opts, op.plan.world_peer, truth.iteration);
        let recv = op.plan.kind == OpKind::Recv;
        [
            o.stall.as_ref().map(|s| s.held(self.world, peer, it, k)),
            o.gpu_stall.as_ref().map(|g| g.held(self.world, peer, it, k, recv)),
            o.late.as_ref().map(|l| l.held(self.world, peer, it)),
            self.coupled(op, k),
        ]
        .into_iter()
        .flatten()
        .find(|h| *h != Held::No)
        .unwrap_or(Held::No)
    }

    /// Through [`Options::board`]: a send step waits until the peer posted its receive, a receive
    /// step until the peer handed its data to the network (then it arrives when the board says).
    fn coupled(&self, op: &Op, k: usize) -> Option<Held> {
        let b = self.opts.board.as_ref()?;
        let (ch, g, me, peer) = (op.plan.channel, op.first + k as u64, self.rank, op.plan.peer);
        Some(match op.plan.kind {
            OpKind::Send if b.is_posted(self.hash, ch, me, peer, g) => Held::No,
            OpKind::Send => Held::Unknown,
            OpKind::Recv => match b.arrival(self.hash, ch, peer, me, g) {
                Some(t) => Held::Arrives(t),
                None => Held::Unknown,
            },
            OpKind::Abandoned => Held::No,
        })
    }

    /// When this rank's GPU consumes receive step `k` of the collective `truth`, arrived now, at
    /// the earliest ([`Options::gpu_stall`]; `None`: as usual).
    fn consumed_after(&self, truth: &CollTruth, k: usize) -> Option<Instant> {
        let g = self.opts.gpu_stall.as_ref()?;
        g.consumed_after(self.world, truth.iteration, k)
    }

    /// The op's InProgress state, once, when the proxy first progresses it (v1–v3: its start).
    fn mark_in_progress(&self, op: &mut Op) {
        if !op.in_progress {
            if let Some(mut d) = op.pending.take() {
                op.handle = self.plugin.start(op.context, &mut d);
            } else if !op.handle.is_null() {
                self.plugin.state(op.handle, ty::OP_IN_PROGRESS, 0);
            }
            op.in_progress = true;
        }
    }

    /// The end of an op: its stop, and (v1–v3) its slot's running total kept for the next op.
    fn finish_op(&mut self, op: &mut Op, truth: &mut CollTruth) {
        let t = Instant::now();
        if !op.handle.is_null() {
            self.plugin.stop(op.handle);
        }
        let call = t.elapsed();
        op.done = true;
        let key = (op.plan.world_peer, op.plan.channel, op.plan.kind == OpKind::Send);
        self.slot_totals.insert(key, op.total);
        if !op.plan.pxn && truth.last_op_stop.is_none_or(|e| t >= e) {
            (truth.last_op_stop, truth.stop_call) = (Some(t), call);
        }
        truth.end = Some(truth.end.map_or(t, |e| e.max(t)));
    }

    /// The ProxyStep start(s) of transfer `k` of `op`, when the mask asks for them: one, or on
    /// v1 one per NCCL step (two with sliceSteps 2, `step` the raw counter). Before 2.28 a step
    /// needs its op's handle (spec 8.1).
    fn start_steps(&self, op: &Op, m: i32, k: usize) -> (H, H) {
        let p = self.plugin;
        if !mask::proxy_step(m) || (op.handle.is_null() && !p.release().api_events()) {
            return (H::NULL, H::NULL);
        }
        let step = |i: usize| p.proxy_step(op.context, op.handle, self.rank, i as i32);
        let first = step(k * op.slice);
        let sibling = if op.slice > 1 { step(k * op.slice + 1) } else { H::NULL };
        (first, sibling)
    }

    /// Transfer `k` of `op` posted with its step handles `steps`: on v1–v3 the op's Posted
    /// state (`states.0`, with the posting count and the running total), then each step's first
    /// state (`states.1`, with the stale size), when the op has a handle.
    fn posted(&self, op: &Op, k: usize, steps: [H; 2], (op_state, step_state): (u32, u32)) {
        if op.handle.is_null() {
            return;
        }
        let p = self.plugin;
        if p.driving().legacy() {
            p.op_state(op.handle, op_state, ((k + 1) * op.slice) as i32, op.total);
        }
        for h in steps.into_iter().filter(|h| !h.is_null()) {
            p.state(h, step_state, op.last_trans);
        }
    }

    /// `deps`: arrival times of the channel's receive steps so far, and the ring dependency.
    fn progress_send(
        &mut self,
        op: &mut Op,
        m: i32,
        truth: &mut CollTruth,
        deps: Option<(&[Instant], usize)>,
        next: &mut Next,
    ) {
        if op.done {
            return;
        }
        let p = self.plugin;
        let legacy = p.driving().legacy();
        self.mark_in_progress(op);
        let nsteps = op.plan.steps.len();
        loop {
            let now = Instant::now();
            while op.started - op.stopped < self.opts.max_in_flight && op.started < nsteps {
                let k = op.started;
                if let (true, Held::Until(t)) = (self.stalls(), self.held(op, truth, k)) {
                    next.coarse(t);
                    break;
                }
                let bytes = op.plan.steps[k];
                let (handle, sibling) = self.start_steps(op, m, k);
                self.posted(op, k, [handle, sibling], (OP_SEND_POSTED, ty::SEND_GPU_WAIT));
                op.gpu_free = op.gpu_free.max(now) + self.net.gpu_time(bytes);
                op.steps.push_back(Step {
                    handle,
                    sibling,
                    dep: deps.and_then(|(_, d)| k.checked_sub(d)),
                    bytes,
                    ready: op.gpu_free,
                    peer_waits: 0,
                    next_peer_wait: op.gpu_free,
                    sent: None,
                    consumed: None,
                    stalled: false,
                    posted: now,
                });
                op.started += 1;
            }
            let states = !op.handle.is_null();
            // The oldest step not yet accepted by the network.
            // A connection completes in order (jitter must not swap two steps).
            let ahead = op
                .steps
                .iter()
                .filter_map(|x| x.sent.as_ref().map(|x| x.deadline))
                .max();
            if let Some(pos) = op.steps.iter().position(|s| s.sent.is_none()) {
                // The peer has not posted this step's receive while the stall holds it.
                let hold = self.held(op, truth, op.stopped + pos);
                if let (0, Held::Until(t)) = (op.stopped + pos, hold) {
                    op.peer_ready = Some(t);
                }
                let s = &mut op.steps[pos];
                let done_after = ((op.stopped + pos + 1) * op.slice) as i32;
                let states = states && !s.handle.is_null();
                if let Some(d) = s.dep {
                    match deps.and_then(|(arrived, _)| arrived.get(d)) {
                        // The forwarded data is on the GPU once received and processed.
                        Some(&t) => {
                            s.ready = s.ready.max(t + self.net.gpu_time(s.bytes));
                            s.next_peer_wait = s.ready;
                            s.dep = None;
                        }
                        // Known at once in this process; from another process's rank, when it
                        // sent it ([`Options::board`]).
                        None if self.opts.board.is_some() => next.coarse(poll_at(s.posted, now)),
                        None => next.coarse(now + Duration::from_micros(20)),
                    }
                }
                // A stopped GPU produces nothing ([`Options::gpu_stall`]).
                let frozen = self
                    .opts
                    .gpu_stall
                    .as_ref()
                    .and_then(|g| g.frozen(self.world, truth.iteration));
                if let Some((_, until)) = frozen.filter(|(since, _)| s.dep.is_none() && s.ready > *since) {
                    s.ready = s.ready.max(until);
                    s.next_peer_wait = s.next_peer_wait.max(s.ready);
                }
                if s.dep.is_some() {
                    // Waiting for the receive this step forwards.
                } else if now < s.ready {
                    next.coarse(s.ready);
                } else {
                    let wire = (op.plan.world_peer, true);
                    let free = self.wire_free(wire);
                    let accept = match free {
                        Some(w) if !self.opts.queue => s.ready.max(w),
                        _ => s.ready,
                    };
                    let accept = match hold {
                        Held::No => accept,
                        Held::Until(t) | Held::Arrives(t) => accept.max(t),
                        Held::Unknown => accept.max(poll_at(s.posted, now)),
                    };
                    let peer_wait = s.peer_waits == 0
                        || (now < accept && now >= s.next_peer_wait && s.peer_waits < self.opts.peer_waits);
                    if peer_wait {
                        if legacy && !op.handle.is_null() {
                            p.op_state(op.handle, OP_SEND_REM_FIFO_WAIT, done_after, op.total);
                        } else if states {
                            p.state(s.handle, ty::SEND_PEER_WAIT, op.last_trans);
                        }
                        s.peer_waits += 1;
                        s.next_peer_wait = now + Duration::from_micros(10);
                    }
                    if now >= accept {
                        let f = self.jitter.factor(self.world, op.plan.world_peer, s.bytes);
                        self.handed += 1;
                        let every = self.opts.preempt_every;
                        // v1–v3: one handle's running total, whose order a late call would break.
                        let late_send_wait = every > 0 && self.handed % every == 0 && !legacy;
                        let t0 = Instant::now();
                        if legacy {
                            // v1 reports the total before the transfer, v2+ after (spec 8.7).
                            let v1 = p.driving() == Version::V1;
                            let before = op.total;
                            op.total += s.bytes;
                            if !op.handle.is_null() {
                                let total = if v1 { before } else { op.total };
                                p.op_state(op.handle, OP_SEND_TRANSMITTED, done_after, total);
                                for h in [s.handle, s.sibling].into_iter().filter(|h| !h.is_null()) {
                                    p.state(h, ty::SEND_WAIT, s.bytes);
                                }
                            }
                        } else if states && !late_send_wait {
                            p.state(s.handle, ty::SEND_WAIT, s.bytes);
                        }
                        let call = t0.elapsed();
                        op.last_trans = s.bytes;
                        let link = op.plan.link;
                        let (start, end) = self.take_wire(wire, t0, link.wire(s.bytes).mul_f64(f));
                        let net = if states && self.opts.net_plugin && mask::net_plugin(m) {
                            let sock = &mut *self.sock as *mut SockDescr as *mut c_void;
                            let mut d = net_plugin_descr(s.handle, self.rank, 0x20001, sock);
                            let h = p.start(op.context, &mut d);
                            p.state(h, ty::NET_PLUGIN_UPDATE, sock as u64); // NCCL does not check for NULL
                            h
                        } else {
                            H::NULL
                        };
                        let mut deadline = (end + link.latency.mul_f64(f)).max(ahead.unwrap_or(t0));
                        let peer = op.plan.world_peer;
                        if let Some(end) = self.opts.nic_hang.and_then(|n| n.completes(self.world, peer, t0)) {
                            deadline = deadline.max(end);
                        }
                        if let Some(b) = &self.opts.board {
                            let g = op.first + (op.stopped + pos) as u64;
                            b.sent(self.hash, op.plan.channel, self.rank, op.plan.peer, g, deadline);
                        }
                        s.sent = Some(Sent {
                            t0,
                            wire: (start, end),
                            idle: link.transfer(s.bytes).mul_f64(f),
                            deadline,
                            seen: self.passes.seen(deadline),
                            call,
                            net,
                            late_send_wait,
                        });
                        continue; // the next step may be ready as well
                    }
                    if s.peer_waits < self.opts.peer_waits {
                        next.coarse(s.next_peer_wait.min(accept));
                    } else {
                        next.coarse(accept);
                    }
                }
            }
            // Completions come in order on one connection.
            let stopped = op.stopped;
            self.stop_due(op, m, truth);
            if op.stopped > stopped {
                continue;
            }
            if let Some(Step { sent: Some(sent), .. }) = op.steps.front() {
                next.precise(sent.seen);
            }
            break;
        }
        if op.stopped == nsteps {
            self.finish_op(op, truth);
        }
    }

    /// `arrived`: this channel's receive arrival times, extended as steps are posted.
    fn progress_recv(
        &mut self,
        op: &mut Op,
        m: i32,
        truth: &mut CollTruth,
        arrived: &mut Vec<Instant>,
        next: &mut Next,
    ) {
        if op.done {
            return;
        }
        let p = self.plugin;
        let legacy = p.driving().legacy();
        self.mark_in_progress(op);
        let nsteps = op.plan.steps.len();
        let now = Instant::now();
        self.arrive_held(op, truth, arrived, next);
        while op.started - op.stopped < self.opts.max_in_flight && op.started < nsteps {
            let k = op.started;
            let hold = self.held(op, truth, k);
            if let (true, Held::Until(t)) = (self.stalls(), hold) {
                next.coarse(t);
                break;
            }
            let bytes = op.plan.steps[k];
            let (mut handle, sibling) = self.start_steps(op, m, k);
            if self.opts.restart_recv && k == 0 && !handle.is_null() {
                // irecv did not post: the next pass starts the same step again and NCCL
                // overwrites the handle; the first one never gets a state or a stop.
                handle = p.proxy_step(op.context, op.handle, self.rank, k as i32);
            }
            self.posted(op, k, [handle, sibling], (OP_RECV_POSTED, ty::RECV_WAIT));
            if let Some(b) = &self.opts.board {
                b.post(
                    self.hash,
                    op.plan.channel,
                    op.plan.peer,
                    self.rank,
                    op.first + k as u64 + 1,
                );
            }
            // Held steps arrive once the stalled rank resumed; in order.
            let stalled = hold == Held::Unknown || op.steps.iter().any(|s| s.stalled);
            let ready = match hold {
                _ if stalled => {
                    next.coarse(poll_at(now, now));
                    now + Duration::from_secs(3600)
                }
                Held::Arrives(t) => {
                    arrived.push(t);
                    t
                }
                Held::Until(t) => self.arrive(op, bytes, t.max(now), arrived),
                _ => self.arrive(op, bytes, now, arrived),
            };
            op.steps.push_back(Step {
                handle,
                sibling,
                dep: None,
                bytes,
                ready,
                peer_waits: 0,
                next_peer_wait: now,
                sent: None,
                consumed: None,
                stalled,
                posted: now,
            });
            op.started += 1;
        }
        // 2.24–2.26 stop only the first receive step the GPU consumed in a pass (spec 8.3).
        let mut consumed_here = 0;
        while !op.steps.is_empty() {
            let k = op.stopped;
            let gpu_until = match op.steps.front() {
                Some(s) if s.consumed.is_none() && Instant::now() >= s.ready => self.consumed_after(truth, k),
                _ => None,
            };
            let Some(s) = op.steps.front_mut() else { break };
            let states = !op.handle.is_null() && !s.handle.is_null();
            let now = Instant::now();
            let done_after = ((op.stopped + 1) * op.slice) as i32;
            match s.consumed {
                None if now >= s.ready && legacy => {
                    op.total += s.bytes;
                    let handles = [s.handle, s.sibling];
                    if !op.handle.is_null() {
                        for (op_state, step_state) in [
                            (OP_RECV_RECEIVED, ty::RECV_FLUSH_WAIT),
                            (OP_RECV_TRANSMITTED, ty::RECV_GPU_WAIT),
                        ] {
                            p.op_state(op.handle, op_state, done_after, op.total);
                            for h in handles.into_iter().filter(|h| !h.is_null()) {
                                p.state(h, step_state, s.bytes);
                            }
                        }
                    }
                    op.last_trans = s.bytes;
                    s.consumed = Some((now + self.net.gpu_time(s.bytes)).max(gpu_until.unwrap_or(now)));
                }
                None if now >= s.ready => {
                    if states {
                        p.state(s.handle, ty::RECV_FLUSH_WAIT, s.bytes);
                        p.state(s.handle, ty::RECV_GPU_WAIT, s.bytes);
                    }
                    op.last_trans = s.bytes;
                    s.consumed = Some((now + self.net.gpu_time(s.bytes)).max(gpu_until.unwrap_or(now)));
                }
                None => {
                    next.coarse(s.ready);
                    break;
                }
                Some(c) if now >= c => {
                    let lost = legacy && p.driving() >= Version::V2 && consumed_here > 0;
                    for h in [s.handle, s.sibling].into_iter().filter(|h| !lost && !h.is_null()) {
                        p.stop(h);
                    }
                    if legacy && !op.handle.is_null() {
                        p.op_state(op.handle, OP_RECV_DONE, done_after, op.total);
                    }
                    consumed_here += 1;
                    op.steps.pop_front();
                    op.stopped += 1;
                }
                Some(c) => {
                    next.coarse(c);
                    break;
                }
            }
        }
        if op.stopped == nsteps {
            self.finish_op(op, truth);
        } else if op.started - op.stopped < self.opts.max_in_flight && op.started < nsteps {
            next.coarse(Instant::now());
        }
    }

    /// Receive step of `bytes` sent at `sent` over `op`'s inbound link: when it arrives, after
    /// the link's earlier steps (recorded in `arrived`).
    fn arrive(&mut self, op: &Op, bytes: u64, sent: Instant, arrived: &mut Vec<Instant>) -> Instant {
        let link = op.plan.link;
        let wire = self.wires.entry((op.plan.world_peer, false)).or_insert(sent);
        *wire = (sent + link.transfer(bytes)).max(*wire + link.wire(bytes));
        arrived.push(*wire);
        *wire
    }

    /// Receive steps held before the stalled rank stopped: their arrival once it did.
    fn arrive_held(&mut self, op: &mut Op, truth: &CollTruth, arrived: &mut Vec<Instant>, next: &mut Next) {
        for i in 0..op.steps.len() {
            if !op.steps[i].stalled {
                continue;
            }
            let bytes = op.steps[i].bytes;
            let ready = match self.held(op, truth, op.stopped + i) {
                Held::Unknown => {
                    next.coarse(poll_at(op.steps[i].posted, Instant::now()));
                    return;
                }
                Held::Arrives(t) => {
                    arrived.push(t);
                    t
                }
                Held::Until(t) => self.arrive(op, bytes, t.max(Instant::now()), arrived),
                Held::No => self.arrive(op, bytes, Instant::now(), arrived),
            };
            let s = &mut op.steps[i];
            (s.ready, s.stalled) = (ready, false);
        }
    }

    /// Records one timed send transfer.
    fn sample(&mut self, t: Timed) {
        let Timed {
            peer,
            world_peer,
            configured,
            step,
            late,
            ..
        } = t;
        let link = self.links.entry(peer).or_insert_with(|| LinkTruth {
            comm: self.name.clone(),
            hash: self.hash,
            rank: self.rank,
            peer,
            src: self.world,
            dst: world_peer,
            configured,
            steps: Vec::new(),
            disturbed: 0,
            late: Duration::ZERO,
            max_late: Duration::ZERO,
            others: Vec::new(),
        });
        let disturbed = late > DISTURBED;
        link.steps.push(step);
        link.disturbed += u64::from(disturbed);
        link.late += late;
        link.max_late = link.max_late.max(late);
        self.out.max_late = self.out.max_late.max(late);
        self.out.steps += 1;
        self.out.disturbed += u64::from(disturbed);
    }
}

/// When the proxy sees the earliest end of a transfer in flight.
fn earliest_seen(active: &[Active]) -> Option<Instant> {
    active
        .iter()
        .flat_map(|a| &a.ops)
        .filter_map(|o| o.steps.front()?.sent.as_ref().map(|s| s.seen))
        .min()
}

/// One finished send transfer as the emulator timed it; `late` is how much later than the model
/// the emulator made its calls.
struct Timed {
    peer: i32,
    world_peer: usize,
    configured: Link,
    step: StepTruth,
    late: Duration,
    /// Stop call time minus the model's end, seconds (negative when early).
    miss: f64,
}

/// Stops the sent front step of `op` and returns its timing. The stop call comes first:
/// bookkeeping must not delay it.
fn stop_front_op(p: &Plugin, opts: &Options, op: &mut Op, m: i32, truth: &mut CollTruth) -> Option<Timed> {
    let states = !op.handle.is_null();
    let Some(Step {
        handle,
        sibling,
        bytes,
        sent: Some(sent),
        ..
    }) = op.steps.front()
    else {
        return None;
    };
    let (handle, sibling, bytes) = (*handle, *sibling, *bytes);
    if opts.net_plugin && mask::net_plugin(m) && states && !handle.is_null() {
        p.stop(sent.net);
    }
    if sent.late_send_wait && states && !handle.is_null() {
        p.state(handle, ty::SEND_WAIT, bytes);
    }
    // v1–v3: the step stops come first, then SendDone, whose time is the transfer's end.
    let legacy = p.driving().legacy();
    if legacy {
        [handle, sibling]
            .into_iter()
            .filter(|h| !h.is_null())
            .for_each(|h| p.stop(h));
    }
    let before = Instant::now();
    if legacy && states {
        p.op_state(op.handle, OP_SEND_DONE, ((op.stopped + 1) * op.slice) as i32, op.total);
    } else if !legacy && !handle.is_null() {
        p.stop(handle);
    }
    let after = Instant::now();
    // A call costs what it costs (both ends pay it); one that took long was preempted.
    let excess = |d: Duration| d.saturating_sub(CALL_BUDGET);
    let miss = if before >= sent.seen {
        (before - sent.seen).as_secs_f64()
    } else {
        -(sent.seen - before).as_secs_f64()
    };
    let late = Duration::from_secs_f64(miss.abs()) + excess(sent.call) + excess(after - before);
    let step = StepTruth {
        bytes,
        sent: sent.t0,
        wire: sent.wire,
        idle: sent.idle,
        stop: before,
        pxn: op.plan.pxn,
    };
    op.steps.pop_front();
    op.stopped += 1;
    if !op.plan.pxn {
        truth.send_steps += 1;
    }
    Some(Timed {
        peer: op.plan.peer,
        world_peer: op.plan.world_peer,
        configured: op.plan.link,
        step,
        late,
        miss,
    })
}

/// When a channel's thread block starts its work after the launch: up to `skew`, different per
/// channel and launch (blocks are scheduled one by one, and some wait for a free SM).
fn channel_skew(launch: Instant, channel: u8, skew: Duration) -> Duration {
    let mixed = (gpu_ns(launch, 1) ^ u64::from(channel).wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let nanos = skew.as_nanos() as u64;
    Duration::from_nanos(if nanos == 0 { 0 } else { (mixed >> 11) % nanos })
}

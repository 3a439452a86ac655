//! The NCCL-like driver: per communicator an application thread and a proxy thread, each with a
//! probe that counts its callbacks by outcome and times a random sample of them; a canary thread
//! that measures the machine's own scheduling noise; the CPU time of every thread.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver as Queue, SyncSender};
use std::time::{Duration, Instant};

use crate::hist::Hist;
use crate::support::emulator::plugin::{coll_descr, p2p_descr};
use crate::support::emulator::{Comm, H, Plugin, pid, ty};
use crate::{NRANKS, SAMPLE_ONE_IN};

/// Callbacks the emulator made, by the outcome the plugin's rules give them (known from the
/// event kind and the handles the plugin returned).
#[derive(Clone, Copy, Default, Debug)]
pub struct Outcomes {
    /// Stored in a window (starts of Coll, send P2p, ProxyOps and ProxySteps under a handle;
    /// SendWait, a first SendPeerWait or RecvGPUWait; stops): recorded or dropped.
    pub record: u64,
    /// Group starts, receive P2p, ProxyOps and ProxySteps without a parent handle.
    pub declined: u64,
    /// States the plugin ignores without a counter (InProgress, SendGPUWait, a repeated PeerWait,
    /// RecvWait) and Group stops.
    pub ignored: u64,
}

/// One thread's measurements: per phase the callbacks made and the timed ones' latencies.
pub struct Probe<'a> {
    pub phase: &'a AtomicUsize,
    pub rng: u64,
    /// Callbacks made, in all phases and per phase.
    pub total: u64,
    pub calls: Vec<u64>,
    pub hists: Vec<Hist>,
    pub outcomes: Outcomes,
}

impl<'a> Probe<'a> {
    pub fn new(phase: &'a AtomicUsize, phases: usize, seed: u64) -> Probe<'a> {
        Probe {
            phase,
            rng: seed | 1,
            total: 0,
            calls: vec![0; phases],
            hists: vec![Hist::new(); phases],
            outcomes: Outcomes::default(),
        }
    }

    /// Makes one callback, timing it with probability 1 / [`SAMPLE_ONE_IN`].
    #[inline]
    pub fn call<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let phase = self.phase.load(Ordering::Relaxed);
        self.calls[phase] += 1;
        self.total += 1;
        // xorshift64: cheap, and decorrelated from the callback sequence's period.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        if self.rng % SAMPLE_ONE_IN != 0 {
            return f();
        }
        let t = Instant::now();
        let r = f();
        self.hists[phase].record(t.elapsed().as_nanos() as u64);
        r
    }

    pub fn random(&mut self, n: u64) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % n
    }
}

/// One operation handed from the application thread to the proxy thread.
pub struct Task {
    /// The Coll or send P2p handle (already stopped; NULL if the plugin dropped it).
    pub root: H,
    pub send_peer: i32,
    pub recv_peer: i32,
    pub channels: u8,
    pub steps: u32,
    pub step_bytes: u64,
}

/// What every driver thread shares.
pub struct Shared {
    pub phase: AtomicUsize,
    pub stop: AtomicBool,
    pub phases: usize,
    /// Callbacks per second per communicator.
    pub rate: f64,
}

/// Operation sizes in bytes (distinct step sizes give the link regression something to fit).
pub const SIZES: [u64; 4] = [64 << 10, 256 << 10, 1 << 20, 4 << 20];
pub const COLLS: [&std::ffi::CStr; 3] = [c"AllReduce", c"AllGather", c"ReduceScatter"];

/// The application thread of communicator `i`: three collectives and one Send/Recv group in
/// four, each handed to the proxy; paced so that this communicator's callbacks (its own and its
/// proxy's, `calls`) follow the rate.
pub fn app<'a>(
    p: &Plugin,
    c: Comm,
    tx: SyncSender<Task>,
    shared: &'a Shared,
    calls: &AtomicU64,
    i: usize,
) -> Probe<'a> {
    let mut probe = Probe::new(
        &shared.phase,
        shared.phases,
        0x9E37_79B9_7F4A_7C15 ^ (i as u64 + 1) << 32,
    );
    let start = Instant::now();
    let (succ, pred) = ((c.rank + 1) % NRANKS, (c.rank + NRANKS - 1) % NRANKS);
    let mut seq = [0u64; COLLS.len()];
    let mut k = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        let before = probe.total;
        let bytes = SIZES[probe.random(SIZES.len() as u64) as usize];
        let steps = 2 + probe.random(5) as u32;
        let group = probe.call(|| p.group(&c));
        probe.outcomes.declined += 1;
        let (root, channels) = if k % 4 == 3 {
            let mut send = p2p_descr(
                c.rank,
                group,
                c"Send".as_ptr(),
                c"ncclFloat32".as_ptr(),
                (bytes / 4) as usize,
                succ,
                1,
            );
            let mut recv = p2p_descr(
                c.rank,
                group,
                c"Recv".as_ptr(),
                c"ncclFloat32".as_ptr(),
                (bytes / 4) as usize,
                pred,
                1,
            );
            let s = probe.call(|| p.start(c.context, &mut send));
            let r = probe.call(|| p.start(c.context, &mut recv));
            probe.outcomes.record += 1;
            probe.outcomes.declined += 1;
            for h in [s, r] {
                if !h.is_null() {
                    probe.call(|| p.stop(h));
                    probe.outcomes.record += 1;
                }
            }
            (s, 1)
        } else {
            let f = probe.random(COLLS.len() as u64) as usize;
            let mut d = coll_descr(
                c.rank,
                group,
                COLLS[f].as_ptr(),
                c"RING".as_ptr(),
                c"SIMPLE".as_ptr(),
                c"ncclFloat32".as_ptr(),
                (bytes / 4) as usize,
                2,
                seq[f],
            );
            seq[f] += 1;
            let h = probe.call(|| p.start(c.context, &mut d));
            probe.outcomes.record += 1;
            if !h.is_null() {
                probe.call(|| p.stop(h));
                probe.outcomes.record += 1;
            }
            (h, 2)
        };
        let task = Task {
            root,
            send_peer: succ,
            recv_peer: pred,
            channels,
            steps,
            step_bytes: bytes / u64::from(channels) / u64::from(steps),
        };
        if !group.is_null() {
            probe.call(|| p.stop(group));
            probe.outcomes.ignored += 1;
        }
        calls.fetch_add(probe.total - before, Ordering::Relaxed);
        if tx.send(task).is_err() {
            break;
        }
        k += 1;
        if k % 16 == 0 {
            let due = start + Duration::from_secs_f64(calls.load(Ordering::Relaxed) as f64 / shared.rate);
            if let Some(ahead) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(ahead);
            }
        }
    }
    probe
}

/// The proxy thread of a communicator: per task and channel a send ProxyOp (InProgress, steps
/// with GPUWait, PeerWait, SendWait, stop) and a receive ProxyOp with its steps, as NCCL's proxy
/// progresses them (states and stops only for handles the plugin returned).
pub fn proxy<'a>(p: &Plugin, c: Comm, rx: Queue<Task>, shared: &'a Shared, calls: &AtomicU64, i: usize) -> Probe<'a> {
    let mut probe = Probe::new(
        &shared.phase,
        shared.phases,
        0xD1B5_4A32_D192_ED03 ^ (i as u64 + 1) << 40,
    );
    let me = pid();
    let mut handles = [H::NULL; 8];
    for t in rx {
        let before = probe.total;
        let n = t.steps as usize;
        for ch in 0..t.channels {
            let op = probe.call(|| p.proxy_op(c.context, t.root, me, c.rank, t.send_peer, ch, n as i32, true));
            probe.outcomes.record += 1;
            if !op.is_null() {
                probe.call(|| p.state(op, ty::OP_IN_PROGRESS, 0));
                probe.outcomes.ignored += 1;
            }
            // GPUWait is ignored; a step's first PeerWait is recorded.
            let states = [
                (ty::SEND_GPU_WAIT, 0),
                (ty::SEND_PEER_WAIT, 0),
                (ty::SEND_WAIT, t.step_bytes),
            ];
            steps(&mut probe, p, &c, op, &mut handles[..n], &states, 1);
            if !op.is_null() {
                probe.call(|| p.stop(op));
                probe.outcomes.record += 1;
            }
            // A receive op is recorded under our collective (declined without one), and so are
            // its steps: their start, first RecvGPUWait (RecvWait is ignored) and stop.
            let recv = probe.call(|| p.proxy_op(c.context, t.root, me, c.rank, t.recv_peer, ch, n as i32, false));
            if t.root.is_null() {
                probe.outcomes.declined += 1;
                assert!(recv.is_null(), "a receive ProxyOp without a collective got a handle");
            } else {
                probe.outcomes.record += 1;
            }
            if !recv.is_null() {
                probe.call(|| p.state(recv, ty::OP_IN_PROGRESS, 0));
                probe.outcomes.record += 1;
            }
            let states = [(ty::RECV_WAIT, 0), (ty::RECV_GPU_WAIT, t.step_bytes)];
            steps(&mut probe, p, &c, recv, &mut handles[..n], &states, 1);
            if !recv.is_null() {
                probe.call(|| p.stop(recv));
                probe.outcomes.record += 1;
            }
        }
        calls.fetch_add(probe.total - before, Ordering::Relaxed);
    }
    probe
}

/// The steps of ProxyOp `op` (declined, with no handle, under a null one), one per entry of
/// `handles`: their starts, then `states` (the first `ignored` of them ignored, the others
/// recorded) and the stop on each step the plugin returned.
fn steps(probe: &mut Probe, p: &Plugin, c: &Comm, op: H, handles: &mut [H], states: &[(u32, u64)], ignored: u64) {
    for (s, h) in handles.iter_mut().enumerate() {
        *h = probe.call(|| p.proxy_step(c.context, op, c.rank, s as i32));
        if op.is_null() {
            probe.outcomes.declined += 1;
            assert!(h.is_null(), "a ProxyStep without a ProxyOp got a handle");
        } else {
            probe.outcomes.record += 1;
        }
    }
    for &h in handles.iter().filter(|h| !h.is_null()) {
        for &(state, value) in states {
            probe.call(|| p.state(h, state, value));
        }
        probe.outcomes.ignored += ignored;
        probe.outcomes.record += states.len() as u64 - ignored;
    }
    for &h in handles.iter().filter(|h| !h.is_null()) {
        probe.call(|| p.stop(h));
        probe.outcomes.record += 1;
    }
}

/// Sleeps 1 ms at a time until `stop`; returns per phase the worst oversleep: how long the
/// machine kept a ready thread from running (the noise the callback latencies also see).
pub fn canary(shared: &Shared) -> Vec<Duration> {
    let mut worst = vec![Duration::ZERO; shared.phases];
    while !shared.stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        std::thread::sleep(Duration::from_millis(1));
        let late = t.elapsed().saturating_sub(Duration::from_millis(1));
        let w = &mut worst[shared.phase.load(Ordering::Relaxed)];
        *w = (*w).max(late);
    }
    worst
}

/// CPU seconds this process's live threads have used, by thread name (numbered driver threads
/// together).
pub fn thread_cpu() -> BTreeMap<String, f64> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut out = BTreeMap::new();
    for task in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close].trim_end_matches(|c: char| c.is_ascii_digit() || c == '-');
        // After the name: state, then utime and stime are the 12th and 13th fields.
        let fields: Vec<f64> = stat[close + 1..]
            .split_whitespace()
            .skip(11)
            .take(2)
            .filter_map(|v| v.parse().ok())
            .collect();
        *out.entry(name.to_owned()).or_default() += fields.iter().sum::<f64>() / hz;
    }
    out
}

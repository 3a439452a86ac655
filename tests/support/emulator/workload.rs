//! Workloads: communicators, the calls each issues per iteration, and the user threads that
//! issue them the way NCCL's blocking communicators do (spec 3.4, 3.5).
//!
//! Threads. Every world rank with at least one emulated (communicator, rank) gets a user thread
//! (standing for that rank's process): it calls `init` for each of its communicators, starts
//! one proxy thread per communicator (spec 3.1, see `proxy.rs`), issues the calls iteration by
//! iteration, waits at the end of each iteration until its proxies finished it (a training
//! step's synchronisation), then closes its proxies, joins them and calls `finalize` (spec 1.5).
//!
//! Per call on the user thread (v4 hierarchy): Group start, Coll (or one P2p per send and
//! receive) start with `parentObj` = Group, `seqNumber` per communicator and function; the
//! Coll/P2p and Group stop; only then the proxy ops are handed to the proxy thread, so the
//! proxy uses an already stopped Coll as parent. Types are started only when NCCL would, from
//! the activation mask read at the call (spec 3.2).
//!
//! Ring collectives (per channel, `n` ranks; every piece sent as full network steps of the
//! protocol's payload and a smaller last one, each step's bytes as on the wire):
//! AllReduce sends and receives `2(n-1)` slices of `bytes / channels / n`; AllGather and
//! ReduceScatter `n-1` slices of the per-rank bytes / channels; Broadcast pipelines
//! `bytes / channels` from the root (the root's predecessor sends nothing). A send step
//! forwards what a network receive brought (the previous step's, the same step's for
//! Broadcast), so it waits for it: a slow inbound link slows a rank's sends too. Receives are
//! timed by the inbound link's model, not by the predecessor's actual sends, so a slow link
//! slows its two ends but does not propagate around the ring. Send/Recv move
//! `bytes / channels`. Only directions between nodes get ProxyOps (spec 3.6); a 1-rank
//! communicator or a zero count emits nothing (spec 3.12).

use std::ffi::CStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::board::Board;
use super::host::Pauses;
use super::net::Network;
use super::plugin::{self, Comm, H, Plugin, coll_descr, mask, p2p_descr, ty};
use super::proxy::{self, KernelEnd, KernelPlan, OpKind, OpPlan, Task};
use super::stall::{GpuStall, Late, NicHang, Pause, Stall};
use super::time;
use super::truth::{CollTruth, Report};

/// Collective and point-to-point functions (descriptor `func`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Func {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Send,
    Recv,
}

impl Func {
    pub const ALL: [Func; 6] = [
        Func::AllReduce,
        Func::AllGather,
        Func::ReduceScatter,
        Func::Broadcast,
        Func::Send,
        Func::Recv,
    ];

    /// The string NCCL passes (and the plugin's `Func::as_str`).
    pub fn name(self) -> &'static str {
        self.cname().to_str().unwrap_or("")
    }

    pub fn cname(self) -> &'static CStr {
        match self {
            Func::AllReduce => c"AllReduce",
            Func::AllGather => c"AllGather",
            Func::ReduceScatter => c"ReduceScatter",
            Func::Broadcast => c"Broadcast",
            Func::Send => c"Send",
            Func::Recv => c"Recv",
        }
    }
}

/// Element types (descriptor `datatype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    Int8,
    Float16,
    Bfloat16,
    Float32,
    Float64,
}

impl Dtype {
    pub fn cname(self) -> &'static CStr {
        match self {
            Dtype::Int8 => c"ncclInt8",
            Dtype::Float16 => c"ncclFloat16",
            Dtype::Bfloat16 => c"ncclBfloat16",
            Dtype::Float32 => c"ncclFloat32",
            Dtype::Float64 => c"ncclFloat64",
        }
    }

    pub fn name(self) -> &'static str {
        self.cname().to_str().unwrap_or("")
    }

    pub fn size(self) -> u64 {
        match self {
            Dtype::Int8 => 1,
            Dtype::Float16 | Dtype::Bfloat16 => 2,
            Dtype::Float32 => 4,
            Dtype::Float64 => 8,
        }
    }
}

/// Algorithms emulated: ring; tree (AllReduce only, as NCCL: reduce up a binary tree, then
/// broadcast down, the tree mirrored on odd channels like NCCL's double binary tree; each
/// connection's steps run free, without the ring's step-by-step dependency); and CollNet
/// (proxy ops that are never stopped, spec 3.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algo {
    Ring,
    Tree,
    CollnetDirect,
}

impl Algo {
    pub fn cname(self) -> &'static CStr {
        match self {
            Algo::Ring => c"RING",
            Algo::Tree => c"TREE",
            Algo::CollnetDirect => c"COLLNET_DIRECT",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Simple,
    Ll,
    Ll128,
}

impl Proto {
    pub fn cname(self) -> &'static CStr {
        match self {
            Proto::Simple => c"SIMPLE",
            Proto::Ll => c"LL",
            Proto::Ll128 => c"LL128",
        }
    }

    /// Payload bytes of one network step: NCCL's buffer per protocol / `NCCL_STEPS` (8), less
    /// the flags (`src/init.cc` `computeBuffSizes`, `src/include/device.h`). Simple: `simple`
    /// (the default 4 MiB buffer / 8 = 512 KiB); LL: 512 KiB buffer / 8 = 64 KiB of 16-byte lines
    /// carrying 8 bytes each, 32 KiB; LL128: 4,915,200 B / 8 = 614,400 B of 128-byte lines
    /// carrying 120 bytes each, 576,000 B.
    pub fn step_payload(self, simple: u64) -> u64 {
        match self {
            Proto::Simple => simple,
            Proto::Ll => 32 << 10,
            Proto::Ll128 => 576_000,
        }
    }

    /// Bytes on the wire (NCCL's SendWait `transSize`) for `payload` bytes: LL sends 16-byte
    /// lines of 8 data bytes (`prims_ll.h`), LL128 2,048-byte units of 1,920 data bytes
    /// (`prims_ll128.h`), Simple the data.
    pub fn wire(self, payload: u64) -> u64 {
        match self {
            Proto::Simple => payload,
            Proto::Ll => payload.div_ceil(8) * 16,
            Proto::Ll128 => payload.div_ceil(1920) * 2048,
        }
    }
}

/// One NCCL call, issued by every emulated rank of a communicator.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Call {
    /// A collective; `count` in `dtype` elements as NCCL reports it (per rank for AllGather
    /// and ReduceScatter).
    Coll {
        func: Func,
        count: u64,
        dtype: Dtype,
        root: i32,
        algo: Algo,
        proto: Proto,
        /// `ncclCollConfig_t.userProfilerTag` (NCCL 2.31+), 0 for a plain call.
        tag: u64,
        /// Run by the copy engines (zero-CTA policy in an NVLink domain, NCCL 2.29+, spec 3.11):
        /// CeColl events instead of Coll, no proxy ops, no kernel.
        ce: bool,
        /// Run by a symmetric-memory kernel (registered windows in an NVLink domain): 2.29 and
        /// 2.30 emit its API events only (spec 3.12), 2.31 a Coll with `isSymColl` and its
        /// kernel's name as algorithm (7.2.6, 7.3.5) and KernelCh; no proxy ops. Earlier
        /// releases run it as usual (what 2.27/2.28 emit for them is unverified, spec 8.9).
        sym: bool,
    },
    /// In one group: send to `rank + shift`, receive from `rank - shift` (a pipeline stage).
    /// Plain `ncclSend`/`ncclRecv` have no tag.
    SendRecv { shift: usize, count: u64, dtype: Dtype },
    /// AlltoAll: decomposed by NCCL into a Send and a Recv per other rank (spec 3.5), each
    /// carrying the call's tag.
    AlltoAll { count: u64, dtype: Dtype, tag: u64 },
}

impl Call {
    fn coll(func: Func, count: u64, dtype: Dtype) -> Call {
        Call::Coll {
            func,
            count,
            dtype,
            root: 0,
            algo: Algo::Ring,
            proto: Proto::Simple,
            tag: 0,
            ce: false,
            sym: false,
        }
    }

    /// Float32 AllReduce of `bytes`.
    pub fn all_reduce(bytes: u64) -> Call {
        Call::coll(Func::AllReduce, bytes / 4, Dtype::Float32)
    }

    /// AllGather of `bytes` per rank (NCCL reports it as int8 bytes).
    pub fn all_gather(bytes: u64) -> Call {
        Call::coll(Func::AllGather, bytes, Dtype::Int8)
    }

    /// Float32 ReduceScatter of `bytes` per rank.
    pub fn reduce_scatter(bytes: u64) -> Call {
        Call::coll(Func::ReduceScatter, bytes / 4, Dtype::Float32)
    }

    /// Broadcast of `bytes` from `root`.
    pub fn broadcast(bytes: u64, root: i32) -> Call {
        let mut c = Call::coll(Func::Broadcast, bytes, Dtype::Int8);
        if let Call::Coll { root: r, .. } = &mut c {
            *r = root;
        }
        c
    }

    /// Send `bytes` to `rank + shift`, receive from `rank - shift`.
    pub fn send_recv(shift: usize, bytes: u64) -> Call {
        Call::SendRecv {
            shift,
            count: bytes / 4,
            dtype: Dtype::Float32,
        }
    }

    /// AlltoAll of `bytes` per peer.
    pub fn all_to_all(bytes: u64) -> Call {
        Call::AlltoAll {
            count: bytes / 4,
            dtype: Dtype::Float32,
            tag: 0,
        }
    }

    /// The same collective on the copy engines (from NCCL 2.29; earlier releases run it as
    /// usual).
    pub fn copy_engine(mut self) -> Call {
        if let Call::Coll { ce, .. } = &mut self {
            *ce = true;
        }
        self
    }

    /// The same collective run by a symmetric-memory kernel.
    pub fn symmetric(mut self) -> Call {
        if let Call::Coll { sym, .. } = &mut self {
            *sym = true;
        }
        self
    }

    /// The same call through its `…Config` variant with `userProfilerTag` = `t` (NCCL 2.31;
    /// v7 events carry it). Send/Recv have no such variant.
    pub fn tagged(mut self, t: u64) -> Call {
        if let Call::Coll { tag, .. } | Call::AlltoAll { tag, .. } = &mut self {
            *tag = t;
        }
        self
    }

    /// The same collective with the CollNet algorithm.
    pub fn collnet(self) -> Call {
        match self {
            Call::Coll { .. } => self.with(|a, _| *a = Algo::CollnetDirect),
            c => c,
        }
    }

    /// The same AllReduce with the tree algorithm (other collectives keep the ring).
    pub fn tree(self) -> Call {
        match self {
            Call::Coll {
                func: Func::AllReduce, ..
            } => self.with(|a, _| *a = Algo::Tree),
            c => c,
        }
    }

    /// The same collective with protocol `p`.
    pub fn proto(self, p: Proto) -> Call {
        self.with(|_, proto| *proto = p)
    }

    fn with(mut self, f: impl FnOnce(&mut Algo, &mut Proto)) -> Call {
        if let Call::Coll { algo, proto, .. } = &mut self {
            f(algo, proto);
        }
        self
    }

    /// Bytes per rank as the plugin computes them (`count × datatype size`).
    pub fn bytes(&self) -> u64 {
        match *self {
            Call::Coll { count, dtype, .. }
            | Call::SendRecv { count, dtype, .. }
            | Call::AlltoAll { count, dtype, .. } => count * dtype.size(),
        }
    }
}

/// A communicator: its members (world ranks; the index is the communicator rank), channels,
/// and the calls it issues each iteration.
#[derive(Clone, Debug)]
pub struct CommSpec {
    pub name: String,
    /// NCCL's `commHash`; unique per `CommSpec::new` in this process unless set.
    pub hash: u64,
    pub members: Vec<usize>,
    pub channels: u8,
    pub calls: Vec<Call>,
    /// Communicator ranks emulated in this process; `None` = all.
    pub local: Option<Vec<i32>>,
}

impl CommSpec {
    pub fn new(name: &str, members: impl IntoIterator<Item = usize>) -> CommSpec {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let unique = NEXT.fetch_add(1, Ordering::Relaxed);
        let fnv = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        CommSpec {
            name: name.to_owned(),
            hash: fnv ^ unique.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(std::process::id()) << 40,
            members: members.into_iter().collect(),
            channels: 1,
            calls: Vec::new(),
            local: None,
        }
    }

    pub fn channels(mut self, n: u8) -> CommSpec {
        assert!(n > 0);
        self.channels = n;
        self
    }

    pub fn call(mut self, c: Call) -> CommSpec {
        self.calls.push(c);
        self
    }

    pub fn calls(mut self, c: impl IntoIterator<Item = Call>) -> CommSpec {
        self.calls.extend(c);
        self
    }

    /// Emulates only these communicator ranks here.
    pub fn emulate(mut self, ranks: impl IntoIterator<Item = i32>) -> CommSpec {
        self.local = Some(ranks.into_iter().collect());
        self
    }

    pub fn with_hash(mut self, hash: u64) -> CommSpec {
        self.hash = hash;
        self
    }

    fn emulates(&self, rank: i32) -> bool {
        self.local.as_ref().is_none_or(|l| l.contains(&rank))
    }

    pub fn nranks(&self) -> i32 {
        self.members.len() as i32
    }
}

/// Knobs of the emulated NCCL.
#[derive(Clone, Debug)]
pub struct Options {
    /// Times every communicator issues its calls.
    pub iterations: usize,
    /// `None`: the activation mask the plugin set in `init`, as NCCL reads it. `Some`: this mask
    /// instead (e.g. every type, to test what the plugin declines).
    pub mask: Option<i32>,
    /// Payload of a Simple-protocol network step (NCCL: its 4 MiB buffer / 8 steps = 512 KiB);
    /// a message goes out as full steps and a smaller last one. LL and LL128 use NCCL's own
    /// ([`Proto::step_payload`]).
    pub chunk_bytes: u64,
    /// Steps are handed to the network as soon as their data is ready (up to `max_in_flight`
    /// per op, NCCL's 8) and queue behind the wire's earlier transfers, as at a NIC;
    /// `false`: a step is handed over only when the link's wire is free, so every
    /// step's SendWait → stop is its own `latency + bytes / bandwidth`.
    pub queue: bool,
    /// Steps in flight per ProxyOp (NCCL: 8).
    pub max_in_flight: usize,
    /// Time each rank spends between iterations without network traffic (computing).
    pub gap: Duration,
    /// Most calls a rank has in flight (enqueued, not yet complete) on all its communicators:
    /// it waits for the oldest before it issues more, as DDP's bucketed AllReduce or FSDP's
    /// prefetch keep several queued (default 8); 1 is a serial network, one call at a time.
    /// Every iteration still ends when all its calls have (the optimizer step).
    pub depth: usize,
    /// One pass of each proxy thread's progress loop: completions are seen in batches, at the
    /// end of the pass they happened in (default 10 µs). Zero: each at its modelled instant.
    pub pass: Duration,
    /// Pauses of every proxy thread, as this VM's hypervisor makes them (seeded by the
    /// network's seed); `None`: none.
    pub pauses: Option<Pauses>,
    /// One send wire per emulated process (world rank), as its NIC (the default, as NCCL's): the
    /// steps of every peer, channel and communicator of the rank take it first in, first out.
    /// `false`: one wire per link (rank → peer), shared by its channels only.
    pub nic_fifo: bool,
    /// Most SendPeerWait states per step (repeated while the link is busy; at least 1).
    pub peer_waits: u32,
    /// The send op of the last channel (of collectives with 2+ channels) is reported as a PXN
    /// op from another process: foreign pid, a context and parent that are not ours to decode.
    pub pxn: bool,
    /// The first receive step of every receive op is started twice; the first handle is
    /// abandoned (spec 3.7).
    pub restart_recv: bool,
    /// NetPlugin events under each send step when the mask asks (NCCL built with
    /// `NET_PROFILER=1`, spec 3.10).
    pub net_plugin: bool,
    /// Broadcast converted to AllGatherV (NCCL 2.29+ unless `NCCL_ALLGATHERV_ENABLE=0`, spec
    /// 3.12): only its API events are emitted, so a v4 plugin sees nothing of it.
    pub broadcast_as_allgatherv: bool,
    /// `%globaltimer` granularity in ns.
    pub gpu_timer_ns: u64,
    /// Most a kernel channel starts after the launch (its own work then follows): channels'
    /// GPU times differ, so a kernel's span is the first start to the last stop.
    pub kernel_skew: Duration,
    /// Proxy threads ask for real-time priority (granted to root or CAP_SYS_NICE), so a busy
    /// host delays their transfer ends less.
    pub realtime: bool,
    /// Precise waits end with a spin (`false`: they only sleep, [`time::sleeping_thread`]).
    pub spin: bool,
    /// Every this many send steps (0: never) the proxy thread is "preempted" between handing
    /// the step to the network and its SendWait callback, which then comes just before the
    /// stop: the plugin sees a transfer far shorter than the network made it (host noise).
    pub preempt_every: u64,
    /// Every call is made while its stream is captured into a CUDA graph, which is replayed
    /// once at once: the API events say `graphCaptured` (2.28+) and the rest comes as usual.
    pub captured: bool,
    /// One rank stops posting in the middle of one collective for a while.
    pub stall: Option<Stall>,
    /// One rank enters every collective late (one call per iteration).
    pub late: Option<Late>,
    /// One rank's GPU stops in the middle of one collective for a while.
    pub gpu_stall: Option<GpuStall>,
    /// One rank's NIC stops for a while.
    pub nic_hang: Option<NicHang>,
    /// One rank stops calling NCCL for a while.
    pub pause: Option<Pause>,
    /// Couples these ranks with those other processes emulate (see [`Board`]).
    pub board: Option<Arc<Board>>,
    /// Runs on each rank's user thread before its first call (e.g. to make its GPU current).
    pub on_rank_thread: Option<RankHook>,
}

/// A function of the world rank, run on that rank's user thread ([`Options::on_rank_thread`]).
#[derive(Clone)]
pub struct RankHook(pub Arc<dyn Fn(usize) + Send + Sync>);

impl std::fmt::Debug for RankHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RankHook")
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            iterations: 1,
            mask: None,
            chunk_bytes: 512 << 10,
            queue: true,
            max_in_flight: 8,
            gap: Duration::ZERO,
            depth: 8,
            pass: Duration::from_micros(10),
            pauses: Some(Pauses::HYPERVISOR),
            nic_fifo: true,
            peer_waits: 2,
            pxn: false,
            restart_recv: false,
            net_plugin: false,
            broadcast_as_allgatherv: super::release::current().allgatherv_broadcast(),
            gpu_timer_ns: 32,
            kernel_skew: Duration::from_micros(4),
            realtime: true,
            spin: true,
            preempt_every: 0,
            captured: false,
            stall: None,
            late: None,
            gpu_stall: None,
            nic_hang: None,
            pause: None,
            board: None,
            on_rank_thread: None,
        }
    }
}

/// A network, communicators and options: [`Workload::run`] drives a plugin with them and
/// returns the emulator's own [`Report`].
#[derive(Clone, Debug)]
pub struct Workload {
    pub net: Network,
    pub comms: Vec<CommSpec>,
    pub options: Options,
}

/// Completed tasks of one user thread, awaited at the end of each iteration. Lock-free: a
/// real-time proxy thread must never wait for a preempted user thread holding a lock.
pub(crate) struct Done {
    count: AtomicU64,
    waiter: std::thread::Thread,
}

impl Done {
    fn new() -> Done {
        Done {
            count: AtomicU64::new(0),
            waiter: std::thread::current(),
        }
    }

    pub(crate) fn add(&self) {
        self.count.fetch_add(1, Ordering::Release);
        self.waiter.unpark();
    }

    /// Called on: the thread that created it.
    fn wait_for(&self, n: u64) {
        // `add` unparks this thread (a token left before the park returns it at once): the
        // timeout is only a safety net.
        while self.count.load(Ordering::Acquire) < n {
            std::thread::park_timeout(Duration::from_millis(50));
        }
    }
}

/// Builds a task's truth: (function, seq, peer, count, datatype, (before, after) its start call).
type TruthOf<'a> = dyn Fn(Func, u64, Option<i32>, u64, Dtype, (Instant, Instant)) -> CollTruth + 'a;

/// One emulated (communicator, rank) on its user thread.
struct Instance<'w> {
    spec: &'w CommSpec,
    comm: Comm,
    rank: i32,
    seq: [u64; Func::ALL.len()],
    /// The communicator's copy-engine collective counter (`ceSeqNum`).
    seq_ce: u64,
    tx: mpsc::Sender<Task>,
}

/// What a user thread hands back.
#[derive(Default)]
struct RankOut {
    report: Report,
}

impl Workload {
    pub fn new(net: Network) -> Workload {
        Workload {
            net,
            comms: Vec::new(),
            options: Options::default(),
        }
    }

    pub fn comm(mut self, spec: CommSpec) -> Workload {
        assert!(
            spec.members.iter().all(|&m| m < self.net.ranks),
            "{} has ranks outside the network",
            spec.name
        );
        self.comms.push(spec);
        self
    }

    pub fn iterations(mut self, n: usize) -> Workload {
        self.options.iterations = n;
        self
    }

    pub fn options(mut self, f: impl FnOnce(&mut Options)) -> Workload {
        f(&mut self.options);
        self
    }

    /// A training-like job on `ranks` ranks, `ranks_per_node` per node: data-parallel gradient
    /// AllReduces of mixed sizes on the world, an AllGather/ReduceScatter pair (sharded
    /// optimizer) on the world, a pipeline Send/Recv on a communicator of every other rank, and
    /// a small AlltoAll (expert routing) that touches every link.
    pub fn training(net: Network, iterations: usize) -> Workload {
        let ranks = net.ranks;
        let world = CommSpec::new("dp", 0..ranks).channels(2).calls([
            Call::all_reduce(64 << 20),
            Call::all_reduce(8 << 20),
            Call::all_reduce(1 << 20),
            Call::all_gather(4 << 20),
            Call::reduce_scatter(4 << 20),
            Call::all_to_all(256 << 10),
            Call::all_to_all(2 << 20),
        ]);
        let pp = CommSpec::new("pp", (0..ranks).step_by(2)).calls([Call::send_recv(1, 2 << 20)]);
        let mut w = Workload::new(net).comm(world).iterations(iterations);
        if ranks >= 4 {
            w = w.comm(pp);
        }
        w
    }

    /// Runs the workload through `plugin` and returns the emulator's measurements.
    pub fn run(&self, plugin: &Plugin) -> Report {
        self.run_with_progress(plugin, &|_, _| {})
    }

    /// [`Workload::run`], calling `progress(done, total)` whenever a rank finishes an iteration.
    pub fn run_with_progress(&self, plugin: &Plugin, progress: &(dyn Fn(usize, usize) + Sync)) -> Report {
        let ranks: Vec<usize> = (0..self.net.ranks)
            .filter(|&w| {
                self.comms.iter().any(|c| {
                    c.members
                        .iter()
                        .position(|&m| m == w)
                        .is_some_and(|r| c.emulates(r as i32))
                })
            })
            .collect();
        let total = ranks.len() * self.options.iterations;
        let finished = AtomicUsize::new(0);
        // NCCL frees the communicators of one process together (spec 1.5); here that also keeps
        // a communicator that serves another rank's PXN ops alive until those are done.
        let all_done = std::sync::Barrier::new(ranks.len());
        let t0 = Instant::now();
        let outs: Vec<RankOut> = std::thread::scope(|s| {
            let handles: Vec<_> = ranks
                .iter()
                .map(|&w| {
                    let (finished, all_done) = (&finished, &all_done);
                    std::thread::Builder::new()
                        .name(format!("emu-user-{w}"))
                        .spawn_scoped(s, move || {
                            self.rank_thread(s, plugin, w, all_done, &|| {
                                progress(finished.fetch_add(1, Ordering::Relaxed) + 1, total)
                            })
                        })
                        .expect("spawn user thread")
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("user thread")).collect()
        });
        let mut report = Report {
            elapsed: t0.elapsed(),
            ..Report::default()
        };
        for o in outs {
            let r = o.report;
            report.collectives.extend(r.collectives);
            report.links.extend(r.links);
            report.callbacks += r.callbacks;
            report.steps += r.steps;
            report.disturbed += r.disturbed;
            report.max_late = report.max_late.max(r.max_late);
            for (all, more) in report.phases.iter_mut().zip(r.phases) {
                all.extend(more);
            }
        }
        report.sort();
        report
    }

    /// The user thread of world rank `w`.
    fn rank_thread<'s, 'w: 's>(
        &'w self,
        s: &'s std::thread::Scope<'s, 'w>,
        plugin: &'w Plugin,
        w: usize,
        all_done: &std::sync::Barrier,
        iteration_done: &dyn Fn(),
    ) -> RankOut {
        time::precise_thread();
        if self.options.realtime {
            // Also the user thread: a preemption between its clock reading and the plugin's
            // (inside `startEvent`) would blur the collective's start.
            time::realtime_thread();
        }
        if !self.options.spin {
            time::sleeping_thread();
        }
        if let Some(hook) = &self.options.on_rank_thread {
            (hook.0)(w);
        }
        let calls_before = plugin::calls_on_this_thread();
        let done = Arc::new(Done::new());
        let mut instances = Vec::new();
        let mut proxies = Vec::new();
        let nic = Arc::new(parking_lot::Mutex::new(None));
        for spec in &self.comms {
            let Some(rank) = spec.members.iter().position(|&m| m == w).map(|r| r as i32) else {
                continue;
            };
            if !spec.emulates(rank) {
                continue;
            }
            let nodes = self.net.nodes(&spec.members) as i32;
            let (comm, _) = plugin.init(Some(&spec.name), spec.hash, nodes, spec.nranks(), rank);
            let (tx, rx) = mpsc::channel();
            let proxy = proxy::Proxy::new(plugin, comm, spec, rank, w, &self.net, &self.options).on_nic(&nic);
            let handle = std::thread::Builder::new()
                .name(format!("emu-proxy-{}-{rank}", spec.name))
                .spawn_scoped(s, move || proxy.run(rx))
                .expect("spawn proxy thread");
            proxies.push(handle);
            instances.push(Instance {
                spec,
                comm,
                rank,
                seq: [0; Func::ALL.len()],
                seq_ce: 0,
                tx,
            });
        }
        let mut issued = 0u64;
        for it in 0..self.options.iterations {
            if let Some(pause) = &self.options.pause {
                pause.before_iteration(w);
            }
            if let Some(late) = self.options.late.as_ref().filter(|l| l.rank == w) {
                late.enter(it);
            }
            for inst in &mut instances {
                for call in &inst.spec.calls {
                    // Room for this call's tasks: the oldest in flight first complete.
                    done.wait_for(issued.saturating_sub(self.options.depth.saturating_sub(1) as u64));
                    issued += self.issue(plugin, inst, w, call, it, &done);
                }
            }
            done.wait_for(issued);
            iteration_done();
            if !self.options.gap.is_zero() {
                std::thread::sleep(self.options.gap);
            }
        }
        let comms: Vec<Comm> = instances.iter().map(|i| i.comm).collect();
        drop(instances); // closes the proxies' queues
        let mut out = RankOut::default();
        for h in proxies {
            let r = h.join().expect("proxy thread");
            out.report.collectives.extend(r.collectives);
            out.report.links.extend(r.links);
            out.report.callbacks += r.callbacks;
            out.report.steps += r.steps;
            out.report.disturbed += r.disturbed;
            out.report.max_late = out.report.max_late.max(r.max_late);
            for (all, more) in out.report.phases.iter_mut().zip(r.phases) {
                all.extend(more);
            }
        }
        all_done.wait();
        for c in comms {
            plugin.finalize(c.context);
        }
        out.report.callbacks += plugin::calls_on_this_thread() - calls_before;
        out
    }

    /// The mask NCCL would sample at an API call now.
    fn mask(&self, plugin: &Plugin) -> i32 {
        self.options.mask.unwrap_or_else(|| plugin.mask())
    }

    /// Issues one call on one instance; returns the number of proxy tasks posted.
    fn issue(
        &self,
        plugin: &Plugin,
        inst: &mut Instance<'_>,
        w: usize,
        call: &Call,
        it: usize,
        done: &Arc<Done>,
    ) -> u64 {
        let n = inst.spec.nranks();
        if n <= 1 || call.bytes() == 0 {
            return 0; // spec 3.12: nothing at all
        }
        let m = self.mask(plugin);
        let (spec, rank) = (inst.spec, inst.rank);
        let truth =
            move |func: Func, seq: u64, peer: Option<i32>, count: u64, dtype: Dtype, start: (Instant, Instant)| {
                CollTruth {
                    comm: spec.name.clone(),
                    hash: spec.hash,
                    rank,
                    world_rank: w,
                    iteration: it,
                    func,
                    seq,
                    peer,
                    count,
                    dtype: dtype.name(),
                    bytes: count * dtype.size(),
                    nranks: n,
                    start: start.0,
                    start_call: start.1 - start.0,
                    stop_call: Duration::ZERO,
                    last_op_stop: None,
                    end: None,
                    gpu: None,
                    send_steps: 0,
                    pxn: false,
                    tag: 0,
                    ce: false,
                    sym: false,
                    captured: self.options.captured,
                }
            };
        match *call {
            Call::Coll {
                func,
                count,
                dtype,
                root,
                algo,
                proto,
                tag,
                ce,
                sym,
            } => {
                // 2.28+: the API events, on the user thread at the call (spec 3.4 steps 1–5).
                let api = plugin.release().api_events();
                let group_api = if api && mask::group_api(m) {
                    plugin.group_api(&inst.comm, 1, self.options.captured)
                } else {
                    H::NULL
                };
                let coll_api = if api && mask::coll_api(m) {
                    plugin.api_call(
                        &inst.comm,
                        ty::COLL_API,
                        group_api,
                        func.cname().as_ptr(),
                        count as usize,
                        dtype.cname().as_ptr(),
                        (tag, self.options.captured),
                    )
                } else {
                    H::NULL
                };
                let api_only = (func == Func::Broadcast && self.options.broadcast_as_allgatherv)
                    || (sym && plugin.release().copy_engine() && !plugin.release().profiler_thread());
                let copy_engine = ce && plugin.release().copy_engine();
                if api_only || copy_engine {
                    if !group_api.is_null() {
                        plugin.group_api_state(group_api, ty::GROUP_END_API_START);
                    }
                    let start = Instant::now();
                    if copy_engine && mask::ce_coll(m) {
                        let seq = inst.seq_ce;
                        inst.seq_ce += 1;
                        plugin.ce_coll(
                            &inst.comm,
                            coll_api,
                            func.cname().as_ptr(),
                            count,
                            dtype.cname().as_ptr(),
                            seq,
                            tag,
                        );
                    }
                    if !group_api.is_null() {
                        plugin.stop(group_api);
                    }
                    // Nothing else reaches the plugin: no task events, proxy ops or kernel channels.
                    let task = Task {
                        root: H::NULL,
                        mask: m,
                        launch: start,
                        truth: CollTruth {
                            tag,
                            ce: copy_engine,
                            sym,
                            ..truth(func, 0, None, count, dtype, (start, start))
                        },
                        ops: Vec::new(),
                        kernels: Vec::new(),
                        ring_dep: None,
                        done: done.clone(),
                    };
                    inst.tx.send(task).expect("proxy alive");
                    return 1;
                }
                let group = launch(plugin, &inst.comm, group_api, m);
                let seq = inst.seq[func as usize];
                inst.seq[func as usize] += 1;
                let mut d = coll_descr(
                    inst.rank,
                    group,
                    func.cname().as_ptr(),
                    algo.cname().as_ptr(),
                    proto.cname().as_ptr(),
                    dtype.cname().as_ptr(),
                    count as usize,
                    inst.spec.channels,
                    seq,
                );
                d.__bindgen_anon_1.coll.root = root;
                d.__bindgen_anon_1.coll.userTag = tag;
                if api {
                    d.parentObj = coll_api.0;
                }
                // 2.31: a symmetric kernel's Coll names the kernel and overwrites the algorithm
                // with the name's tail and the protocol with "" (spec 7.2.6).
                let symmetric = sym && plugin.release().profiler_thread();
                if symmetric {
                    let variant = match func {
                        Func::AllReduce => "AllReduce_AGxLL_R",
                        Func::AllGather => "AllGather_STMC",
                        Func::ReduceScatter => "ReduceScatter_LD",
                        _ => "Broadcast_ST",
                    };
                    let tail = variant.split_once('_').map_or("", |(_, t)| t);
                    // SAFETY: writing the union member that matches `type`.
                    let c = unsafe { &mut d.__bindgen_anon_1.coll };
                    (c.isSymColl, c.kernelVariant) = (true, plugin::cstr(variant));
                    (c.algo, c.proto) = (plugin::cstr(tail), plugin::cstr(""));
                }
                let start = Instant::now();
                // Before 2.28 a task event needs a Group handle (spec 8.1).
                let root_h = if mask::coll(m) && (api || !group.is_null()) {
                    plugin.start(inst.comm.context, &mut d)
                } else {
                    H::NULL
                };
                let started = (start, Instant::now());
                let (ops, kernels) = if symmetric {
                    // NVLink only: no proxy ops; one kernel channel per channel.
                    (Vec::new(), self.plan_kernels(inst, count * dtype.size(), m, |_| false))
                } else {
                    self.plan_coll(inst, w, func, count * dtype.size(), root, (algo, proto), m)
                };
                // 2.23–2.25 stop the plan's tasks without looking at their handles (spec 8.2).
                let unchecked = plugin.release().stops_tasks_unchecked() && !group.is_null() && mask::coll(m);
                if !root_h.is_null() || unchecked {
                    plugin.stop(root_h);
                }
                if !group.is_null() {
                    plugin.stop(group);
                }
                if !group_api.is_null() {
                    plugin.stop(group_api);
                }
                let task = Task {
                    root: root_h,
                    mask: m,
                    launch: start,
                    truth: CollTruth {
                        tag,
                        sym,
                        ..truth(func, seq, None, count, dtype, started)
                    },
                    ops,
                    kernels,
                    ring_dep: match (algo, func) {
                        (Algo::CollnetDirect | Algo::Tree, _) => None,
                        (_, Func::Broadcast) => Some(0),
                        _ => Some(1),
                    },
                    done: done.clone(),
                };
                inst.tx.send(task).expect("proxy alive");
                1
            }
            Call::SendRecv { shift, count, dtype } => {
                let r = inst.rank as usize;
                let n = n as usize;
                let peers = [((r + shift) % n, (r + n - shift % n) % n)];
                self.issue_p2p(plugin, inst, w, &peers, (count, dtype, 0), m, &truth, done)
            }
            Call::AlltoAll { count, dtype, tag } => {
                let r = inst.rank as usize;
                let n = n as usize;
                let peers: Vec<(usize, usize)> = (1..n).map(|k| ((r + k) % n, (r + n - k) % n)).collect();
                self.issue_p2p(plugin, inst, w, &peers, (count, dtype, tag), m, &truth, done)
            }
        }
    }

    /// One group of sends to `peers[i].0` and receives from `peers[i].1`, each of `count`
    /// `dtype` elements, with the call's tag.
    #[allow(clippy::too_many_arguments)]
    fn issue_p2p(
        &self,
        plugin: &Plugin,
        inst: &mut Instance<'_>,
        w: usize,
        peers: &[(usize, usize)],
        (count, dtype, tag): (u64, Dtype, u64),
        m: i32,
        truth: &TruthOf<'_>,
        done: &Arc<Done>,
    ) -> u64 {
        // 2.28+: GroupApi (a user group) and one P2pApi per call, at the calls (spec 3.5).
        let api = plugin.release().api_events();
        let group_api = if api && mask::group_api(m) {
            plugin.group_api(&inst.comm, 2, self.options.captured)
        } else {
            H::NULL
        };
        let calls: Vec<(Func, usize)> = peers
            .iter()
            .flat_map(|&(to, from)| [(Func::Send, to), (Func::Recv, from)])
            .filter(|&(_, peer)| peer != inst.rank as usize)
            .collect();
        let apis: Vec<H> = calls
            .iter()
            .map(|&(func, _)| {
                if api && mask::p2p_api(m) {
                    plugin.api_call(
                        &inst.comm,
                        ty::P2P_API,
                        group_api,
                        func.cname().as_ptr(),
                        count as usize,
                        dtype.cname().as_ptr(),
                        (tag, self.options.captured),
                    )
                } else {
                    H::NULL
                }
            })
            .collect();
        let group = launch(plugin, &inst.comm, group_api, m);
        let nch = inst.spec.channels;
        let mut tasks = Vec::new();
        for (&(func, peer), &p2p_api) in calls.iter().zip(&apis) {
            let mut d = p2p_descr(
                inst.rank,
                group,
                func.cname().as_ptr(),
                dtype.cname().as_ptr(),
                count as usize,
                peer as i32,
                nch,
            );
            d.__bindgen_anon_1.p2p.userTag = tag;
            if api {
                d.parentObj = p2p_api.0;
            }
            let seq = inst.seq[func as usize];
            inst.seq[func as usize] += 1;
            let start = Instant::now();
            let h = if mask::p2p(m) && (api || !group.is_null()) {
                plugin.start(inst.comm.context, &mut d)
            } else {
                H::NULL
            };
            let started = (start, Instant::now());
            let ops = self.plan_p2p(inst, w, func, peer, count * dtype.size());
            let kernels = self.plan_kernels(inst, count * dtype.size(), m, |c| ops.iter().any(|o| o.channel == c));
            tasks.push((
                h,
                Task {
                    root: h,
                    mask: m,
                    launch: start,
                    truth: CollTruth {
                        tag,
                        ..truth(func, seq, Some(peer as i32), count, dtype, started)
                    },
                    ops,
                    kernels,
                    ring_dep: None,
                    done: done.clone(),
                },
            ));
        }
        // 2.23–2.25 stop the plan's tasks without looking at their handles: the receives the
        // plugin declined come back as `stopEvent(NULL)` (spec 8.2).
        let unchecked = plugin.release().stops_tasks_unchecked() && !group.is_null() && mask::coll(m);
        for (h, _) in &tasks {
            if !h.is_null() || unchecked {
                plugin.stop(*h);
            }
        }
        if !group.is_null() {
            plugin.stop(group);
        }
        if !group_api.is_null() {
            plugin.stop(group_api);
        }
        let n = tasks.len() as u64;
        for (_, task) in tasks {
            inst.tx.send(task).expect("proxy alive");
        }
        n
    }

    /// One kernel channel per channel of `inst` when the mask asks: it ends with its network ops
    /// when `networked` says it has some, else after the GPU time of its share of `bytes`.
    fn plan_kernels(&self, inst: &Instance<'_>, bytes: u64, m: i32, networked: impl Fn(u8) -> bool) -> Vec<KernelPlan> {
        if !mask::kernel_ch(m) {
            return Vec::new();
        }
        let nch = inst.spec.channels;
        let per_channel = bytes / u64::from(nch);
        (0..nch)
            .map(|c| KernelPlan {
                channel: c,
                end: if networked(c) {
                    KernelEnd::AfterOps
                } else {
                    KernelEnd::After(self.net.gpu_time(per_channel) + Duration::from_micros(5))
                },
                ll: false,
            })
            .collect()
    }

    /// Proxy ops and kernel channels of a collective on rank `inst.rank`.
    #[allow(clippy::too_many_arguments)]
    fn plan_coll(
        &self,
        inst: &Instance<'_>,
        w: usize,
        func: Func,
        bytes: u64,
        root: i32,
        (algo, proto): (Algo, Proto),
        m: i32,
    ) -> (Vec<OpPlan>, Vec<KernelPlan>) {
        let spec = inst.spec;
        let n = spec.nranks() as usize;
        let r = inst.rank as usize;
        let (succ, pred) = ((r + 1) % n, (r + n - 1) % n);
        let w_succ = spec.members[succ];
        let nch = spec.channels;
        let mut ops = Vec::new();
        let mut kernels = Vec::new();
        for c in 0..nch {
            let share = split_even(bytes, u64::from(nch), u64::from(c));
            let step = proto.step_payload(self.options.chunk_bytes);
            let pieces = |d: u64| {
                split_chunks(d, step)
                    .into_iter()
                    .map(|p| proto.wire(p))
                    .collect::<Vec<u64>>()
            };
            let (send, recv): (Vec<u64>, Vec<u64>) = match func {
                Func::AllReduce => {
                    let p = pieces(share / n as u64);
                    let s = p.repeat(2 * (n - 1));
                    (s.clone(), s)
                }
                Func::AllGather | Func::ReduceScatter => {
                    let s = pieces(share).repeat(n - 1);
                    (s.clone(), s)
                }
                Func::Broadcast => {
                    let p = pieces(share);
                    let send = if succ as i32 != root { p.clone() } else { Vec::new() };
                    let recv = if r as i32 != root { p } else { Vec::new() };
                    (send, recv)
                }
                Func::Send | Func::Recv => unreachable!("P2P is planned by plan_p2p"),
            };
            let mut has_ops = false;
            if algo == Algo::CollnetDirect {
                // CollNet: one send and one receive op on the CollNet connector, isSend 0 for
                // both, never stopped (spec 3.6).
                for _ in 0..2 {
                    ops.push(OpPlan {
                        kind: OpKind::Abandoned,
                        peer: succ as i32,
                        world_peer: w_succ,
                        channel: c,
                        steps: send.clone(),
                        link: self.net.link(w, w_succ),
                        chunk: proto.wire(step),
                        pxn: false,
                    });
                }
            } else {
                // (direction, peer, steps) of every connection of this channel.
                let conns = if algo == Algo::Tree {
                    let (parent, children) = tree_peers(r, n, c);
                    let p = pieces(share);
                    let up = parent.into_iter().flat_map(|q| [(OpKind::Send, q), (OpKind::Recv, q)]);
                    let down = children
                        .into_iter()
                        .flat_map(|q| [(OpKind::Recv, q), (OpKind::Send, q)]);
                    up.chain(down).map(|(kind, q)| (kind, q, p.clone())).collect()
                } else {
                    vec![(OpKind::Send, succ, send.clone()), (OpKind::Recv, pred, recv)]
                };
                for (kind, q, steps) in conns {
                    let w_q = spec.members[q];
                    let (src, dst) = if kind == OpKind::Send { (w, w_q) } else { (w_q, w) };
                    if steps.is_empty() || !self.net.is_net(src, dst) {
                        continue;
                    }
                    has_ops = true;
                    let pxn =
                        kind == OpKind::Send && algo == Algo::Ring && self.options.pxn && nch >= 2 && c == nch - 1;
                    ops.push(OpPlan {
                        kind,
                        peer: q as i32,
                        world_peer: w_q,
                        channel: c,
                        steps,
                        link: self.net.link(src, dst),
                        chunk: proto.wire(step),
                        pxn,
                    });
                }
            }
            if mask::kernel_ch(m) {
                let end = if has_ops {
                    KernelEnd::AfterOps
                } else if algo == Algo::CollnetDirect {
                    KernelEnd::After(self.net.link(w, w_succ).transfer(share))
                } else {
                    let moved: u64 = send.iter().sum();
                    KernelEnd::After(self.net.gpu_time(moved) + Duration::from_micros(5))
                };
                kernels.push(KernelPlan {
                    channel: c,
                    end,
                    ll: proto != Proto::Simple,
                });
            }
        }
        (ops, kernels)
    }

    /// Proxy ops of one send (to `peer`) or receive (from `peer`).
    fn plan_p2p(&self, inst: &Instance<'_>, w: usize, func: Func, peer: usize, bytes: u64) -> Vec<OpPlan> {
        let w_peer = inst.spec.members[peer];
        let (src, dst) = if func == Func::Send { (w, w_peer) } else { (w_peer, w) };
        if !self.net.is_net(src, dst) {
            return Vec::new();
        }
        let nch = inst.spec.channels;
        (0..nch)
            .map(|c| OpPlan {
                kind: if func == Func::Send { OpKind::Send } else { OpKind::Recv },
                peer: peer as i32,
                world_peer: w_peer,
                channel: c,
                steps: split_chunks(
                    split_even(bytes, u64::from(nch), u64::from(c)),
                    self.options.chunk_bytes,
                ),
                link: self.net.link(src, dst),
                chunk: self.options.chunk_bytes,
                pxn: false,
            })
            .collect()
    }
}

/// Parent and children of rank `r` of `n` in channel `c`'s tree: a binary heap over the ranks,
/// mirrored (rank `n - 1 - r`) on odd channels.
/// `ncclGroupEnd` up to the plan's Group start: GroupEndApiStart on the open GroupApi (2.28+),
/// then the Group, when the mask asks for it.
fn launch(plugin: &Plugin, comm: &Comm, group_api: H, m: i32) -> H {
    if !group_api.is_null() {
        plugin.group_api_state(group_api, ty::GROUP_END_API_START);
    }
    if mask::group(m) { plugin.group(comm) } else { H::NULL }
}

fn tree_peers(r: usize, n: usize, c: u8) -> (Option<usize>, Vec<usize>) {
    let flip = |i: usize| if c % 2 == 0 { i } else { n - 1 - i };
    let i = flip(r);
    let parent = (i > 0).then(|| flip((i - 1) / 2));
    let children = [2 * i + 1, 2 * i + 2]
        .into_iter()
        .filter(|&k| k < n)
        .map(flip)
        .collect();
    (parent, children)
}

/// Part `i` of `total` split into `parts` near-equal parts.
fn split_even(total: u64, parts: u64, i: u64) -> u64 {
    total / parts + u64::from(i < total % parts)
}

/// `d` bytes as network steps of `chunk` bytes and a smaller last one (at least one step,
/// possibly empty), as NCCL slices a message.
fn split_chunks(d: u64, chunk: u64) -> Vec<u64> {
    let chunk = chunk.max(1);
    let loops = d.div_ceil(chunk).max(1);
    (0..loops)
        .map(|i| if i + 1 < loops { chunk } else { d - chunk * (loops - 1) })
        .collect()
}

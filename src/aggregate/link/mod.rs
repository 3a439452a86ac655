//! Per-window aggregation: links one sealed window's records (Coll/P2p → ProxyOp → ProxyStep, and
//! Coll/P2p → KernelCh) and summarises them per collective kind, P2P peer, rank pair and channel;
//! children recorded in another window than their parent are linked through the communicator's
//! table of open operations ([`super::open`]).
//!
//! Called on: the telemetry thread (or `finalize`), once the window is sealed; nothing writes the
//! records any more. Pure: no I/O, clocks, atomics or OpenTelemetry types.
//!
//! A handle's slot names its event's start record ([`Lanes::index`]), so every link is an array index into
//! per-slot scratch (a few allocations per call, none per record); only the few group keys and the
//! children of other windows are hashed, and records are never sorted. Phase 1 scans the records
//! once; phases 2 and 3 visit only the slots it listed, in slot order:
//! 1. `track`: register Coll/P2p roots and note each event's later records (SendWait,
//!    InProgress, KernelChStop, PhaseStop, Stop) on its start slot, and chain a send op's
//!    OpBytes marks from it; a root's Tag moves it to the group of its tagged key.
//! 2. `transfers`: turn finished ProxySteps into transfers, grouped by their ProxyOp's rank
//!    pair and channel, and by its root's group when the op has one; on ABI v1–v3, a send op's
//!    chain of OpBytes marks instead (`op_marks`: each transfer's bytes are a difference of the
//!    op's running totals, spec 8.7).
//! 3. `link`: link ProxyOps and KernelCh to their roots (completion, end times; a bare ProxyOp,
//!    recorded without its steps under shedding, times its root but gives no transfers); `kernel_phases`:
//!    the GPU durations of the KernelPhases (v7), by phase. Along the way, each operation's
//!    waits for its peers ([`waits`]: a first send step's SendPeerWait → SendWait, an initial
//!    sync).
//! 4. `build`: hold every finished root in the table, release what is due, groups sorted by key.
//!
//! Invariants: an event "is in this window" iff its handle decodes to this window's communicator,
//! window index and epoch, its slot is in range and that slot holds a start record carrying exactly
//! that handle. A child whose parent is one of this communicator's operations in another window
//! is linked through the table; one whose parent nothing claims in time is an orphan: it links to
//! no root but still counts in per-link and per-channel figures. The first
//! Stop/SendWait/KernelChStop of an event wins; later duplicates and records of events from other
//! windows are ignored.
#![forbid(unsafe_code)]

use std::collections::HashMap;

use super::bandwidth::{UNKNOWN_CLASS, coll_size, size_class};
use super::lifetime::Life;
use super::open::{Frontier, GroupKey, OpInfo, OpenOps, Progress, Root};
use super::queue::{Step, analyze};
use super::summary::{
    ChannelGroup, CollGroup, CollKey, LinkGroup, P2pGroup, WindowId, WindowStats, WindowSummary,
};
use crate::record::handle::{EPOCH_MASK, Handle, Kind};
use crate::record::{Body, CollStart, CommMeta, Record};

/// A sealed window to summarise.
#[derive(Clone, Copy, Debug)]
pub struct Sealed<'a> {
    /// Its records, lane after lane; fillers have `id == 0`.
    pub records: &'a [Record],
    /// Where each lane's slots are in `records`.
    pub lanes: Lanes,
    /// Its identity.
    pub id: WindowId,
    /// Processed with events still open (grace period over, or `finalize`).
    pub forced: bool,
    /// Children of its operations were dropped for lack of room: their times are withheld.
    pub lost_children: bool,
}

/// [`summarize_in`] with a scratch of its own (tests and benches).
#[cfg(any(test, feature = "testing"))]
pub fn summarize(window: Sealed<'_>, meta: &CommMeta, spt: f64, open: &mut OpenOps, at: Frontier) -> WindowSummary {
    summarize_in(&mut Scratch::default(), window, meta, spt, open, at)
}

/// Per-slot scratch of [`summarize_in`], kept by its caller from one window to the next so that
/// a steady stream of windows allocates it once.
#[derive(Default)]
pub struct Scratch {
    slots: Vec<Slot>,
}

impl Scratch {
    /// Gives back the capacity past `slots` slots (what a window bigger than usual left).
    pub fn cap(&mut self, slots: usize) {
        self.slots.clear();
        self.slots.shrink_to(slots);
    }

    /// Slots the scratch holds allocated.
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.slots.capacity()
    }
}

/// Links and summarises the records of one sealed window, with the per-slot scratch of `scratch`
/// (left allocated for the next window). `secs_per_tick` converts record timestamps to seconds.
/// Finished operations go into `open` and come out, with whatever was due there `at`, in this or a
/// later summary.
///
/// Called on: the telemetry thread (or `finalize`).
pub fn summarize_in(
    scratch: &mut Scratch,
    window: Sealed<'_>,
    meta: &CommMeta,
    secs_per_tick: f64,
    open: &mut OpenOps,
    at: Frontier,
) -> WindowSummary {
    scratch.slots.clear();
    scratch.slots.resize(window.records.len(), Slot::EMPTY);
    let mut pass = Pass::new(window, secs_per_tick, meta.nranks, open, at, &mut scratch.slots);
    pass.stats.forced = window.forced;
    pass.stats.windows = 1;
    pass.track();
    pass.transfers();
    pass.link();
    pass.kernel_phases();
    if window.lost_children {
        pass.roots.iter_mut().for_each(|here| here.root.p.lose());
    }
    pass.build(meta)
}

/// What `open` releases `at` without a window (with `at.flush`: everything, for `finalize`);
/// `None` when nothing was released.
pub fn release(
    comm: WindowId,
    meta: &CommMeta,
    secs_per_tick: f64,
    open: &mut OpenOps,
    at: Frontier,
) -> Option<WindowSummary> {
    if !open.due(&at) {
        return None;
    }
    let mut slots = Vec::new();
    let none = Sealed {
        records: &[],
        lanes: Lanes::single(0),
        id: comm,
        forced: false,
        lost_children: false,
    };
    let s = Pass::new(none, secs_per_tick, meta.nranks, open, at, &mut slots).build(meta);
    (!s.colls.is_empty() || !s.p2ps.is_empty() || s.stats.orphans > 0).then_some(s)
}

/// Marks an index field that points nowhere; never a valid index, so `get(NONE as usize)` is `None`.
const NONE: u32 = u32::MAX;

/// Per-slot flags.
const STARTED: u8 = 1;
const STOPPED: u8 = 1 << 1;
const SENT: u8 = 1 << 2;
const GPU_STOPPED: u8 = 1 << 3;
const OP_RESOLVED: u8 = 1 << 4;
/// Receive op: NCCL progresses it (InProgress), so it will stop.
const IN_PROGRESS: u8 = 1 << 5;
/// Send op (v1–v3): has OpBytes marks, chained from `sent` (first) to `value` (last).
const MARKED: u8 = 1 << 6;
/// API call: a Coll or CeColl claimed it.
const CLAIMED: u8 = 1 << 7;

/// Scratch for the event whose start record is at this slot (or, for an OpBytes mark, for the
/// mark itself).
#[derive(Clone, Copy)]
struct Slot {
    /// Ts of the first Stop.
    stop: u64,
    /// ProxyStep: ts of the first SendWait; marked send op: slot of its first mark.
    sent: u64,
    /// ProxyStep: bytes of that SendWait; KernelCh: GPU stop time; marked send op: slot of its
    /// last mark; mark: slot of the op's next mark (`NONE` for the last).
    value: u64,
    /// ProxyStep: ts of its first SendPeerWait (0: none).
    waited: u64,
    /// Coll/P2p: index into `roots`; send ProxyOp (once resolved): its root's index when that
    /// root is in this window, else `NONE`.
    root: u32,
    /// ProxyOp (once resolved): index into `links`.
    link: u32,
    flags: u8,
}

impl Slot {
    const EMPTY: Slot = Slot {
        stop: 0,
        sent: 0,
        value: 0,
        waited: 0,
        root: NONE,
        link: NONE,
        flags: 0,
    };

    fn has(&self, flags: u8) -> bool {
        self.flags & flags == flags
    }
}

/// Group a root belongs to, in this pass.
#[derive(Clone, Copy)]
enum GroupIx {
    Coll(u32),
    P2p(u32),
}

/// A Coll/P2p started in this window.
struct Here {
    handle: u64,
    group: GroupIx,
    root: Root,
}

/// Where a child's operation is.
#[derive(Clone, Copy)]
enum RootRef {
    /// In this window: index into `roots`.
    Here(u32),
    /// Held in the table.
    Held(u64),
    /// Not processed yet (or never: then its children become orphans).
    Pending(u64),
    /// None, or another process's (PXN).
    None,
}

/// A ProxyOp's resolved destinations.
#[derive(Clone, Copy)]
struct OpIx {
    root: RootRef,
    link: u32,
    channel: u32,
}

/// One `summarize` call's state.
struct Pass<'a> {
    records: &'a [Record],
    lanes: Lanes,
    window: WindowId,
    epoch: u32,
    secs_per_tick: f64,
    nranks: i32,
    open: &'a mut OpenOps,
    at: Frontier,
    /// One per record, cleared ([`Scratch`]).
    slots: &'a mut Vec<Slot>,
    roots: Vec<Here>,
    colls: Vec<CollGroup>,
    coll_ix: HashMap<CollKey, u32>,
    p2ps: Vec<P2pGroup>,
    p2p_ix: HashMap<GroupKey, u32>,
    links: Vec<LinkGroup>,
    link_ix: HashMap<(i32, i32), u32>,
    /// Per link: its transfers, for the queue analysis.
    link_steps: Vec<Vec<Step>>,
    channels: Vec<ChannelGroup>,
    channel_ix: [u32; 256],
    /// Slots of the ProxySteps started in this window, in slot order.
    steps: Vec<u32>,
    /// Slots of the send ops with OpBytes marks (v1–v3), in the order of their first mark.
    marked: Vec<u32>,
    /// Slots of the API calls recorded in this window (NCCL 2.29–2.30).
    apis: Vec<u32>,
    /// Slots of the ProxyOps and KernelCh started in this window, in slot order.
    children: Vec<u32>,
    /// Slots of the KernelPhases started in this window, in slot order.
    phases: Vec<u32>,
    /// Their durations, by phase (seconds).
    phase_secs: [Vec<f64>; 3],
    /// Coll, P2p, ProxyOp and KernelCh started here and never stopped. Wrapping: a Stop placed
    /// before its start can take it below zero mid-scan; every Stop counted has its start counted,
    /// so it is exact once phase 1 is done.
    unstopped: u64,
    /// (originating rank, origin) of the PXN ops started here.
    pxn: Vec<(i32, u32)>,
    stats: WindowStats,
}

/// Handle kind a start record must carry.
fn start_kind(body: &Body) -> Option<Kind> {
    match body {
        Body::Coll(_) => Some(Kind::Coll),
        Body::P2p(_) => Some(Kind::P2p),
        Body::ProxyOp(op) if op.send => Some(Kind::ProxyOp),
        Body::ProxyOp(_) => Some(Kind::RecvOp),
        Body::ProxyStep { .. } => Some(Kind::ProxyStep),
        Body::KernelCh { .. } => Some(Kind::KernelCh),
        Body::KernelPhase { .. } => Some(Kind::KernelPhase),
        Body::Api(_) => Some(Kind::ApiCall),
        // Receive steps are read by the operations in flight only.
        Body::RecvStep { .. }
        | Body::GpuWait
        | Body::RecvCount { .. }
        | Body::SendWait { .. }
        | Body::PeerWait
        | Body::Claim { .. }
        | Body::OpBytes { .. }
        | Body::InProgress
        | Body::KernelChStop { .. }
        | Body::Tag { .. }
        | Body::PhaseStop { .. }
        | Body::Stop => None,
    }
}

/// A collective's group key and nccl-tests size (0 when unknown, [`UNKNOWN_CLASS`]).
fn coll_key(c: &CollStart, nranks: i32) -> (GroupKey, u64) {
    let bytes = coll_size(c, nranks);
    let key = GroupKey::Coll(CollKey {
        func: c.func,
        algo: c.algo,
        proto: c.proto,
        datatype: c.datatype,
        size_class: bytes.map_or(UNKNOWN_CLASS, size_class),
        tag: 0,
        graph: c.graph,
    });
    (key, bytes.unwrap_or(0))
}

/// Index into a group vector (groups are few; `u32` keeps the scratch small).
fn ix(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(NONE)
}

impl<'a> Pass<'a> {
    fn new(
        window: Sealed<'a>,
        secs_per_tick: f64,
        nranks: i32,
        open: &'a mut OpenOps,
        at: Frontier,
        slots: &'a mut Vec<Slot>,
    ) -> Self {
        Pass {
            records: window.records,
            lanes: window.lanes,
            window: window.id,
            epoch: window.id.epoch & EPOCH_MASK,
            secs_per_tick,
            nranks,
            open,
            at,
            slots,
            roots: Vec::new(),
            colls: Vec::new(),
            coll_ix: HashMap::new(),
            p2ps: Vec::new(),
            p2p_ix: HashMap::new(),
            links: Vec::new(),
            link_ix: HashMap::new(),
            link_steps: Vec::new(),
            channels: Vec::new(),
            channel_ix: [NONE; 256],
            steps: Vec::new(),
            marked: Vec::new(),
            apis: Vec::new(),
            children: Vec::new(),
            phases: Vec::new(),
            phase_secs: Default::default(),
            unstopped: 0,
            pxn: Vec::new(),
            stats: WindowStats::default(),
        }
    }

    /// Slot of the start record of the event `handle`, if that event is in this window.
    fn slot_of(&self, handle: u64) -> Option<usize> {
        let h = Handle::decode(handle)?;
        let slot = self.lanes.index(h.slot())?;
        let start = self.records.get(slot)?;
        let ours = h.comm_slot() == self.window.comm.slot
            && h.window() == self.window.window
            && h.epoch() == self.epoch
            && start.id == handle
            && start_kind(&start.body) == Some(h.kind().base());
        ours.then_some(slot)
    }

    /// Where the Coll/P2p `handle` is: in this window, held, or (one of this communicator's, in
    /// another window) pending.
    fn root_of(&self, handle: u64) -> RootRef {
        if let Some(s) = self.slot_of(handle)
            && matches!(self.records[s].body, Body::Coll(_) | Body::P2p(_))
        {
            return RootRef::Here(self.slots[s].root);
        }
        if self.open.held.contains_key(&handle) {
            return RootRef::Held(handle);
        }
        let ours = Handle::decode(handle)
            .is_some_and(|h| h.comm_slot() == self.window.comm.slot && matches!(h.kind(), Kind::Coll | Kind::P2p));
        if ours { RootRef::Pending(handle) } else { RootRef::None }
    }

    /// Reads `body`, a record of the event started at slot `s` (before its flags take it in),
    /// into the count of events left open ([`Life`]); ProxySteps are checked on their own.
    fn count_open(&mut self, s: usize, body: &Body) {
        let (start, slot) = (&self.records[s].body, &self.slots[s]);
        if matches!(start, Body::ProxyStep { .. }) {
            return;
        }
        let mut life = Life {
            started: slot.has(STARTED) && start.opens(),
            progressing: slot.has(IN_PROGRESS),
            stopped: slot.has(STOPPED),
        };
        let recv = matches!(start, Body::ProxyOp(op) if !op.send);
        self.unstopped = self.unstopped.wrapping_add_signed(i64::from(life.read(body, recv)));
    }

    /// Phase 1: register roots, note later records on their event's start slot.
    fn track(&mut self) {
        let records = self.records;
        for (i, rec) in records.iter().enumerate() {
            if rec.id == 0 {
                continue;
            }
            self.stats.records += 1;
            match rec.body {
                Body::Api(_) if self.slot_of(rec.id) == Some(i) => self.apis.push(ix(i)),
                Body::Claim { api } => self.claim_api(api),
                _ => {}
            }
            if rec.body.opens() {
                if self.slot_of(rec.id) != Some(i) {
                    continue;
                }
                self.count_open(i, &rec.body);
                self.slots[i].flags |= STARTED;
                match rec.body {
                    Body::Coll(c) => {
                        let (key, bytes) = coll_key(&c, self.nranks);
                        self.add_root(i, rec.ts, key, bytes, u32::from(c.n_channels), c.sample);
                    }
                    Body::P2p(p) => {
                        let bytes = p.count.saturating_mul(p.datatype.size());
                        let key = GroupKey::P2p {
                            peer: p.peer,
                            datatype: p.datatype,
                            size_class: size_class(bytes),
                            tag: 0,
                            graph: p.graph,
                        };
                        self.add_root(i, rec.ts, key, bytes, 0, p.sample);
                    }
                    Body::ProxyStep { .. } => self.steps.push(ix(i)),
                    _ => self.children.push(ix(i)),
                }
                continue;
            }
            if let Body::KernelPhase { .. } = rec.body {
                // Ends with its KernelPhaseStop; NCCL's stop of it is not recorded.
                if self.slot_of(rec.id) == Some(i) {
                    self.slots[i].flags |= STARTED;
                    self.phases.push(ix(i));
                }
                continue;
            }
            let Some(s) = self.slot_of(rec.id) else {
                continue;
            };
            let start = &records[s].body;
            if let Body::Tag { tag } = rec.body {
                self.tag_root(self.slots[s].root, tag);
                continue;
            }
            if let Body::OpBytes { .. } = rec.body {
                if matches!(start, Body::ProxyOp(op) if op.send) {
                    self.chain_mark(s, i);
                }
                continue;
            }
            self.count_open(s, &rec.body);
            let slot = &mut self.slots[s];
            match rec.body {
                Body::Stop if !slot.has(STOPPED) => {
                    slot.stop = rec.ts;
                    slot.flags |= STOPPED;
                }
                Body::InProgress
                    if !slot.has(IN_PROGRESS | STOPPED) && matches!(start, Body::ProxyOp(op) if !op.send) =>
                {
                    slot.flags |= IN_PROGRESS;
                }
                Body::PeerWait if slot.waited == 0 && matches!(start, Body::ProxyStep { .. }) => {
                    slot.waited = rec.ts.max(1);
                }
                Body::SendWait { bytes } if !slot.has(SENT) && matches!(start, Body::ProxyStep { .. }) => {
                    slot.sent = rec.ts;
                    slot.value = bytes;
                    slot.flags |= SENT;
                }
                Body::KernelChStop { gpu_stop } if !slot.has(GPU_STOPPED) && matches!(start, Body::KernelCh { .. }) => {
                    slot.value = gpu_stop;
                    slot.flags |= GPU_STOPPED;
                }
                Body::PhaseStop { gpu_stop } if !slot.has(GPU_STOPPED) && matches!(start, Body::KernelPhase { .. }) => {
                    slot.value = gpu_stop;
                    slot.flags |= GPU_STOPPED;
                }
                _ => {}
            }
        }
    }

    /// The progress record of the root a child names: in this window, held, or pending (which
    /// then counts the child); `None` for no parent or another process's.
    fn progress(&mut self, parent: u64) -> Option<&mut Progress> {
        let root = self.root_of(parent);
        if let RootRef::Pending(h) = root {
            self.open.pending(h, self.at.now).children += 1;
        }
        self.root_progress(root)
    }

    /// Phase 3: link ProxyOps and KernelCh to their roots; count what never stopped.
    fn link(&mut self) {
        self.stats.unfinished += self.unstopped;
        let until = self.at.hold();
        for i in std::mem::take(&mut self.children) {
            let i = i as usize;
            let slot = self.slots[i];
            let stopped = slot.has(STOPPED);
            match self.records[i].body {
                Body::ProxyOp(op) => {
                    if op.origin != 0 {
                        self.pxn.push((op.rank, op.origin));
                    }
                    // Recorded without its steps (detail shed): it times its root, no transfers.
                    let bare = Handle::is_bare(self.records[i].id);
                    self.stats.bare_ops += u64::from(bare);
                    if op.send && !bare {
                        let info = OpInfo {
                            rank: op.rank,
                            peer: op.peer,
                            channel: op.channel,
                            parent: op.parent,
                        };
                        self.open.add_op(self.records[i].id, info, until);
                    }
                    // A receive op NCCL never progressed is one it never stops (CollNet,
                    // copy-engine proxies, spec 3.6): it says nothing about completion.
                    let counts = stopped || op.send || slot.has(IN_PROGRESS);
                    if op.parent == 0 || !counts {
                        continue; // a PXN op (or one whose Coll was declined) has no parent
                    }
                    match self.progress(op.parent) {
                        Some(p) => {
                            p.op(stopped.then_some(slot.stop));
                            p.bare |= bare;
                        }
                        None => self.stats.orphans += 1,
                    }
                }
                Body::KernelCh { parent, gpu_start, .. } => {
                    let mut gpu_stop = slot.has(GPU_STOPPED).then_some(slot.value);
                    if gpu_stop.is_some_and(|stop| stop < gpu_start) {
                        // Another batch's times (spec 7.3.5): the operation gets no GPU time.
                        self.stats.invalid_gpu += 1;
                        gpu_stop = None;
                    }
                    match self.progress(parent) {
                        Some(p) => p.kernel(gpu_start, gpu_stop),
                        None => self.stats.orphans += 1,
                    }
                }
                _ => {}
            }
        }
    }

    /// Phase 3b: each KernelPhase that ended becomes a duration of its phase (GPU clock); one
    /// ending before it starts is left out and counted, one that never ended is unfinished.
    fn kernel_phases(&mut self) {
        for i in std::mem::take(&mut self.phases) {
            let i = i as usize;
            let Body::KernelPhase { phase, gpu_start, .. } = self.records[i].body else {
                continue;
            };
            let slot = self.slots[i];
            match self.phase_secs.get_mut(usize::from(phase)) {
                _ if !slot.has(GPU_STOPPED) => self.stats.unfinished += 1,
                _ if slot.value < gpu_start => self.stats.invalid_gpu += 1,
                Some(secs) => {
                    secs.push((slot.value - gpu_start) as f64 / 1e9);
                    self.sync_wait(i, slot.value - gpu_start);
                }
                None => {} // the hot path declines phases it does not know
            }
        }
    }

    /// Phase 4: roots of this window take the children recorded before it and are held (or,
    /// when some part can no longer finish, reported now); what is due leaves the table; groups
    /// sorted by key. With `at.flush` everything leaves.
    fn build(mut self, meta: &CommMeta) -> WindowSummary {
        let until = self.at.hold();
        if self.at.lost_held {
            self.open.held.values_mut().for_each(|(root, _)| root.p.lose());
        }
        let mut now = Vec::new();
        for mut here in std::mem::take(&mut self.roots) {
            let early = self.open.claim(here.handle, &mut here.root);
            self.push_transfers(here.group, early);
            if here.root.p.open() || self.at.flush {
                now.push((here.group, here.root));
            } else {
                self.open.hold(here.handle, here.root, until);
            }
        }
        self.hold_apis();
        let (released, orphans, unsure) = self.open.release(&self.at);
        self.stats.orphans += orphans;
        self.stats.unfinished += unsure;
        for root in released {
            let group = self.group(root.key);
            now.push((group, root));
        }
        for (group, root) in now {
            let sample = root.sample(self.secs_per_tick);
            match group {
                GroupIx::Coll(g) => self.colls[g as usize].ops.push(sample),
                GroupIx::P2p(g) => self.p2ps[g as usize].ops.push(sample),
            }
        }
        // Groups that got nothing (every root held) are not reported.
        self.colls.retain(|g| !g.ops.is_empty() || !g.transfers.is_empty());
        self.p2ps.retain(|g| !g.ops.is_empty() || !g.transfers.is_empty());
        self.colls.sort_unstable_by_key(|g| g.key);
        self.p2ps.sort_unstable_by_key(|g| (g.peer, g.datatype, g.size_class));
        let channels = &self.channels;
        for (link, steps) in self.links.iter_mut().zip(&mut self.link_steps) {
            link.queue = analyze(steps, self.secs_per_tick, |tag| {
                channels.get(tag as usize).map_or(0, |c| c.channel)
            });
        }
        self.links.sort_unstable_by_key(|g| (g.rank, g.peer));
        self.channels.sort_unstable_by_key(|g| g.channel);
        self.pxn.sort_unstable();
        self.pxn.dedup();
        self.stats.pxn_collectives = self.pxn.len() as u64;
        WindowSummary {
            comm: meta.clone(),
            colls: self.colls,
            p2ps: self.p2ps,
            links: self.links,
            channels: self.channels,
            phases: self.phase_secs,
            stats: self.stats,
            counted: Vec::new(),
        }
    }
}

mod api;
mod groups;
mod lanes;
mod marks;
mod transfers;
mod waits;

pub use lanes::Lanes;
#[cfg(test)]
mod tests;

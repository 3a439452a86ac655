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
//! 3. `link`: link ProxyOps and KernelCh to their roots (completion, end times); `kernel_phases`:
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
    ChannelGroup, CollGroup, CollKey, LinkGroup, P2pGroup, Transfer, WindowId, WindowStats, WindowSummary,
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

/// Links and summarises the records of one sealed window. `secs_per_tick` converts record
/// timestamps to seconds. Finished operations go into `open` and come out, with whatever was due
/// there `at`, in this or a later summary.
///
/// Called on: the telemetry thread (or `finalize`).
pub fn summarize(
    window: Sealed<'_>,
    meta: &CommMeta,
    secs_per_tick: f64,
    open: &mut OpenOps,
    at: Frontier,
) -> WindowSummary {
    let mut pass = Pass::new(
        window.records,
        window.lanes,
        window.id,
        secs_per_tick,
        meta.nranks,
        open,
        at,
    );
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
    let s = Pass::new(&[], Lanes::single(0), comm, secs_per_tick, meta.nranks, open, at).build(meta);
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
    slots: Vec<Slot>,
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
        Body::SendWait { .. }
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
        records: &'a [Record],
        lanes: Lanes,
        window: WindowId,
        secs_per_tick: f64,
        nranks: i32,
        open: &'a mut OpenOps,
        at: Frontier,
    ) -> Self {
        Pass {
            records,
            lanes,
            window,
            epoch: window.epoch & EPOCH_MASK,
            secs_per_tick,
            nranks,
            open,
            at,
            slots: vec![Slot::EMPTY; records.len()],
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
            && start_kind(&start.body) == Some(h.kind());
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
                        self.add_root(i, rec.ts, key, bytes, u32::from(c.n_channels));
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
                        self.add_root(i, rec.ts, key, bytes, 0);
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

    /// Where the transfers of the send ProxyOp `handle` go: from this window (resolved once per
    /// op) or from the table; `None` when the op is unknown.
    fn op(&mut self, handle: u64) -> Option<OpIx> {
        let info = match self.slot_of(handle).map(|p| (p, self.records[p].body)) {
            Some((p, Body::ProxyOp(op))) if op.send => {
                if !self.slots[p].has(OP_RESOLVED) {
                    let link = self.link_group(op.rank, op.peer);
                    let root = match self.root_of(op.parent) {
                        RootRef::Here(r) => r,
                        _ => NONE,
                    };
                    let slot = &mut self.slots[p];
                    (slot.link, slot.root) = (link, root);
                    slot.flags |= OP_RESOLVED;
                }
                let Slot { link, root, .. } = self.slots[p];
                // A root outside this window is looked up again: the table changes as it goes.
                let root = if root == NONE {
                    self.root_of(op.parent)
                } else {
                    RootRef::Here(root)
                };
                return Some(OpIx {
                    root,
                    link,
                    channel: self.channel_group(op.channel),
                });
            }
            Some(_) => return None,
            None => self.open.ops.get(&handle)?.0,
        };
        Some(OpIx {
            root: self.root_of(info.parent),
            link: self.link_group(info.rank, info.peer),
            channel: self.channel_group(info.channel),
        })
    }

    /// Phase 2: finished ProxySteps become transfers of their op's link, channel and root group.
    fn transfers(&mut self) {
        for i in std::mem::take(&mut self.steps) {
            let i = i as usize;
            let Body::ProxyStep { parent, step: index } = self.records[i].body else {
                continue;
            };
            let slot = self.slots[i];
            if !slot.has(SENT | STOPPED) {
                self.stats.unfinished += 1;
                let here = self
                    .slot_of(parent)
                    .is_some_and(|p| matches!(self.records[p].body, Body::ProxyOp(op) if op.send));
                if !here && !self.open.ops.contains_key(&parent) {
                    self.stats.orphans += 1;
                }
                continue;
            }
            let Some(op) = self.op(parent) else {
                self.stats.orphans += 1;
                continue;
            };
            let step = Step {
                sent: slot.sent,
                stop: slot.stop,
                bytes: slot.value,
                tag: op.channel,
            };
            self.add_transfer(op, step);
            self.first_step_wait(op, index, &slot);
        }
        for op in std::mem::take(&mut self.marked) {
            self.op_marks(op as usize);
        }
    }

    fn add_transfer(&mut self, op: OpIx, step: Step) {
        let t = Transfer {
            bytes: step.bytes,
            secs: step.stop.saturating_sub(step.sent) as f64 * self.secs_per_tick,
        };
        if let Some(link) = self.links.get_mut(op.link as usize) {
            link.bytes = link.bytes.saturating_add(t.bytes);
            link.transfers += 1;
            self.link_steps[op.link as usize].push(step);
        }
        if let Some(channel) = self.channels.get_mut(op.channel as usize) {
            channel.transfers.push(t);
        }
        let group = match op.root {
            RootRef::Here(r) => self.roots.get_mut(r as usize).map(|here| {
                here.root.p.transfers = here.root.p.transfers.saturating_add(1);
                here.group
            }),
            RootRef::Held(h) => match self.open.held.get_mut(&h) {
                Some((root, _)) => {
                    root.p.transfers = root.p.transfers.saturating_add(1);
                    let key = root.key;
                    Some(self.group(key))
                }
                None => None,
            },
            RootRef::Pending(h) => {
                let pending = self.open.pending(h, self.at.now);
                pending.p.transfers = pending.p.transfers.saturating_add(1);
                pending.transfers.push(t);
                None
            }
            RootRef::None => None,
        };
        match group {
            Some(GroupIx::Coll(g)) => self.colls[g as usize].transfers.push(t),
            Some(GroupIx::P2p(g)) => self.p2ps[g as usize].transfers.push(t),
            None => {}
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
                    if op.send {
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
                        Some(p) => p.op(stopped.then_some(slot.stop)),
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
        let channels = &mut self.channels;
        for (link, steps) in self.links.iter_mut().zip(&mut self.link_steps) {
            link.queue = analyze(steps, self.secs_per_tick, |step, secs| {
                if let Some(c) = channels.get_mut(step.tag as usize) {
                    c.samples.push(step.bytes, secs);
                }
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
        }
    }
}

mod api;
mod groups;
mod lanes;
mod marks;
mod waits;

pub use lanes::Lanes;
#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::queue::Queue;
    use crate::aggregate::regression::Samples;
    use crate::aggregate::{OpSample, Waits};
    use crate::record::Datatype;
    use crate::record::handle::CommId;
    use std::time::{Duration, Instant};

    /// Past the hold time.
    const HOLD_PLUS: Duration = Duration::from_millis(300);

    /// The consumer at `now`, every window but the one being processed settled.
    fn at(now: Instant, flush: bool) -> Frontier {
        Frontier {
            now,
            filling: 1,
            settled: 1,
            flush,
            lost_held: false,
            drops: 0,
        }
    }
    use crate::record::{Algo, CollStart, Func, P2pStart, Proto, ProxyOpStart};

    const COMM: CommId = CommId { slot: 3, generation: 7 };
    /// The epoch has bits above `EPOCH_MASK`: handles keep only the low ones.
    const WIN: WindowId = WindowId {
        comm: COMM,
        window: 1,
        epoch: 0x100_0005,
    };
    /// A power of two, so every expected value below is exact.
    const SPT: f64 = 1.0 / 1024.0;

    fn meta() -> CommMeta {
        CommMeta {
            hash: 0xabc,
            name: "test".into(),
            rank: 0,
            nranks: 4,
            nnodes: 2,
        }
    }

    fn handle(window: u8, epoch: u32, kind: Kind, slot: usize) -> u64 {
        Handle::new(COMM.slot, window, epoch, kind, slot as u32).encode()
    }

    /// Builds one window's record slice; start records get handles minted for their own slot.
    struct Win {
        id: WindowId,
        recs: Vec<Record>,
    }

    impl Default for Win {
        fn default() -> Self {
            Win::at(WIN)
        }
    }

    /// Groups of `from` added to `to` (operations and transfers), as a consumer merges summaries.
    fn merge(to: &mut WindowSummary, from: WindowSummary) {
        for g in from.colls {
            match to.colls.iter_mut().find(|t| t.key == g.key) {
                Some(t) => {
                    t.ops.extend(g.ops);
                    t.transfers.extend(g.transfers);
                }
                None => to.colls.push(g),
            }
        }
        for g in from.p2ps {
            match to
                .p2ps
                .iter_mut()
                .find(|t| (t.peer, t.datatype, t.size_class) == (g.peer, g.datatype, g.size_class))
            {
                Some(t) => {
                    t.ops.extend(g.ops);
                    t.transfers.extend(g.transfers);
                }
                None => to.p2ps.push(g),
            }
        }
        to.colls.sort_unstable_by_key(|g| g.key);
        to.stats.orphans += from.stats.orphans;
    }

    impl Win {
        fn at(id: WindowId) -> Win {
            Win { id, recs: Vec::new() }
        }
        fn sealed(&self) -> Sealed<'_> {
            Sealed {
                records: &self.recs,
                lanes: Lanes::single(self.recs.len()),
                id: self.id,
                forced: false,
                lost_children: false,
            }
        }
        fn start(&mut self, ts: u64, body: Body) -> u64 {
            let id = handle(
                self.id.window,
                self.id.epoch,
                start_kind(&body).unwrap(),
                self.recs.len(),
            );
            self.recs.push(Record { id, ts, body });
            id
        }
        fn rec(&mut self, id: u64, ts: u64, body: Body) {
            self.recs.push(Record { id, ts, body });
        }
        fn stop(&mut self, id: u64, ts: u64) {
            self.rec(id, ts, Body::Stop);
        }
        fn filler(&mut self) {
            self.recs.push(Record {
                id: 0,
                ts: 0,
                body: Body::Stop,
            });
        }
        fn coll(&mut self, ts: u64, func: Func, count: u64, datatype: Datatype) -> u64 {
            self.start(ts, coll_body(func, count, datatype))
        }
        fn op(&mut self, ts: u64, parent: u64, rank: i32, peer: i32, channel: u8) -> u64 {
            self.start(ts, op_body(parent, rank, peer, channel))
        }
        /// A finished step: start at `ts`, SendWait of `bytes` at `ts + 1`, Stop `ticks` later.
        fn step(&mut self, ts: u64, parent: u64, bytes: u64, ticks: u64) -> u64 {
            let id = self.start(ts, Body::ProxyStep { parent, step: 0 });
            self.rec(id, ts + 1, Body::SendWait { bytes });
            self.stop(id, ts + 1 + ticks);
            id
        }
        fn kernel(&mut self, ts: u64, parent: u64, channel: u8, gpu_start: u64) -> u64 {
            self.start(
                ts,
                Body::KernelCh {
                    parent,
                    channel,
                    gpu_start,
                },
            )
        }
        /// This window's summary with everything the table held released at once.
        fn sum(&self) -> WindowSummary {
            let mut open = OpenOps::new(Duration::ZERO);
            self.sum_with(&mut open, Instant::now(), true)
        }
        /// This window's summary through `open` at `now`; with `flush`, everything held is
        /// released.
        fn sum_with(&self, open: &mut OpenOps, now: Instant, flush: bool) -> WindowSummary {
            let mut s = summarize(self.sealed(), &meta(), SPT, open, at(now, false));
            if let Some(r) = release(self.id, &meta(), SPT, open, at(now, flush)) {
                merge(&mut s, r);
            }
            s
        }
    }

    fn coll_body(func: Func, count: u64, datatype: Datatype) -> Body {
        Body::Coll(CollStart {
            seq: 0,
            count,
            func,
            algo: Algo::Ring,
            proto: Proto::Simple,
            datatype,
            n_channels: 2,
            graph: None,
        })
    }

    fn op_body(parent: u64, rank: i32, peer: i32, channel: u8) -> Body {
        Body::ProxyOp(ProxyOpStart {
            parent,
            rank,
            peer,
            channel,
            send: true,
            origin: 0,
        })
    }

    fn recv_body(parent: u64, peer: i32, channel: u8) -> Body {
        Body::ProxyOp(ProxyOpStart {
            parent,
            rank: 0,
            peer,
            channel,
            send: false,
            origin: 0,
        })
    }

    /// The key of a collective of `bytes` (nccl-tests size).
    fn key(func: Func, datatype: Datatype, bytes: u64) -> CollKey {
        CollKey {
            func,
            algo: Algo::Ring,
            proto: Proto::Simple,
            datatype,
            size_class: size_class(bytes),
            tag: 0,
            graph: None,
        }
    }

    fn t(bytes: u64, ticks: u64) -> Transfer {
        Transfer {
            bytes,
            secs: ticks as f64 / 1024.0,
        }
    }

    fn link(rank: i32, peer: i32, ts: &[Transfer]) -> LinkGroup {
        LinkGroup {
            rank,
            peer,
            bytes: ts.iter().map(|t| t.bytes).sum(),
            transfers: ts.len() as u64,
            queue: Queue::default(),
        }
    }

    /// Links without their queue analysis (`queue.rs` tests it).
    fn no_queue(links: &[LinkGroup]) -> Vec<LinkGroup> {
        let strip = |l: &LinkGroup| LinkGroup {
            queue: Queue::default(),
            ..l.clone()
        };
        links.iter().map(strip).collect()
    }

    fn channel(channel: u8, ts: &[Transfer]) -> ChannelGroup {
        ChannelGroup {
            channel,
            transfers: ts.to_vec(),
            samples: Samples::default(),
        }
    }

    /// Channels without their idle samples (they depend on the link's queue, `queue.rs`).
    fn no_samples(channels: &[ChannelGroup]) -> Vec<ChannelGroup> {
        let strip = |c: &ChannelGroup| ChannelGroup {
            samples: Samples::default(),
            ..c.clone()
        };
        channels.iter().map(strip).collect()
    }

    fn stats(records: u64, unfinished: u64, orphans: u64) -> WindowStats {
        WindowStats {
            records,
            unfinished,
            orphans,
            windows: 1,
            ..WindowStats::default()
        }
    }

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
                    duration: Some(250.0 / 1024.0),
                    gpu: None,
                    transfers: 6,
                    waits: Waits::default(),
                }],
                transfers: all.to_vec(),
            }]
        );
        assert_eq!(no_queue(&s.links), vec![link(0, 1, &all)]);
        assert_eq!(s.links[0].bytes, 8192);
        assert_eq!(no_samples(&s.channels), vec![channel(0, &a_t), channel(1, &b_t)]);
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
                    duration: Some(100.0 / 1024.0),
                    gpu: None,
                    transfers: 2,
                    waits: Waits::default(),
                }],
                transfers: ts.to_vec(),
            }]
        );
        assert!(s.colls.is_empty());
        assert_eq!(no_queue(&s.links), vec![link(0, 5, &ts)]);
        assert_eq!(no_samples(&s.channels), vec![channel(2, &ts)]);
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
                    duration: None,
                    gpu: None,
                    transfers: 0,
                    waits: Waits::default(),
                }],
                transfers: vec![],
            }]
        );
        assert_eq!(
            no_queue(&s.links),
            vec![link(0, 1, &[t(300, 3)]), link(0, 2, &[t(600, 6)])]
        );
        assert_eq!(no_samples(&s.channels), vec![channel(4, &[t(300, 3), t(600, 6)])]);
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
                duration: None,
                gpu: None,
                transfers: 2,
                waits: Waits::default(),
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
                duration: Some(3000.0 / 1024.0),
                gpu: None,
                transfers: 1,
                waits: Waits::default(),
            }]
        );
        // Receive ops make no link or channel figures.
        assert_eq!(no_queue(&s.links), vec![link(0, 1, &[t(1024, 10)])]);
        assert_eq!(no_samples(&s.channels), vec![channel(0, &[t(1024, 10)])]);
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
                duration: Some(0.5),
                gpu: Some(4e-6),
                transfers: 0,
                waits: Waits::default(),
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

    /// Window 2 of the same communicator, a later cycle than `WIN`.
    const WIN2: WindowId = WindowId {
        comm: COMM,
        window: 2,
        epoch: 0x100_0009,
    };

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
        assert_eq!(no_samples(&second.channels), vec![channel(5, &[t(2048, 20)])]);
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
                duration: Some(30.0 / 1024.0),
                gpu: None,
                transfers: 1,
                waits: Waits::default(),
            }]
        );
        assert_eq!(s.colls[0].transfers, vec![t(32, 7)]);
        assert_eq!(no_queue(&s.links), vec![link(0, 1, &[t(32, 7)])]);
        assert_eq!(no_samples(&s.channels), vec![channel(0, &[t(32, 7)])]);
        assert_eq!(s.stats, stats(14, 3, 0));
    }

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
                    duration: None,
                    gpu: None,
                    transfers: 0,
                    waits: Waits::default(),
                },
                OpSample {
                    bytes: 8,
                    duration: None,
                    gpu: Some(4e-6),
                    transfers: 0,
                    waits: Waits::default(),
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
                duration: None,
                gpu: None,
                transfers: 0,
                waits: Waits::default(),
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
                duration: Some(10.0 / 1024.0),
                gpu: None,
                transfers: 1,
                waits: Waits::default(),
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
        assert_eq!(no_samples(&s.channels), vec![channel(5, &ts)]);
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
                duration: Some(10.0 / 1024.0),
                gpu: None,
                transfers: 0,
                waits: Waits::default(),
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
                    duration: Some(50.0 / 1024.0),
                    gpu: None,
                    transfers: 1,
                    waits: Waits::default(),
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
        let ops: Vec<_> = s
            .colls
            .iter()
            .flat_map(|g| g.ops.iter().map(move |o| (g.key.algo, *o)))
            .collect();
        let sample = OpSample {
            bytes: 1024,
            duration: None,
            gpu: None,
            transfers: 0,
            waits: Waits::default(),
        };
        // The two Colls (no proxy ops: no time), and the call no Coll claimed.
        assert_eq!(
            ops,
            [(Algo::Ring, sample), (Algo::Ring, sample), (Algo::Unknown, sample)]
        );
    }
}

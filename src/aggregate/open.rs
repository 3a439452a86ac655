//! Operations still open across windows: one table per communicator, owned by its consumer.
//!
//! A Coll/P2p's children can be recorded in a later window than the operation itself: a ProxyOp
//! the proxy thread appends late, a child that could not join its full parent window, a step
//! whose ProxyOp is in an earlier window. The table links them:
//! - `held`: operations whose window was processed and whose recorded parts all finished. Each is
//!   held until the window that was filling when it was processed has been processed too (a late
//!   or spilled child can only land there or later) and at least [`HOLD`] has passed, so that a
//!   late child still counts (a later ProxyOp stop extends its host time); then it is released
//!   into the summary being built. One whose late child cannot finish any more is released at
//!   once, without the clock that child belongs to: never short.
//! - `pending`: children (and their transfers) of operations whose window is not processed yet;
//!   merged when it is, counted as orphans when nothing claims them in time.
//! - `ops`: ProxyOps of processed windows, kept as long as held operations, so that a step
//!   recorded later still names its rank pair, channel and operation.
//! - `apis`: recorded API calls (NCCL 2.29–2.30) no Coll or CeColl has claimed yet. One still
//!   unclaimed after `pending_ttl` (longer than any launch takes after its call) is a collective
//!   NCCL ran with its API events only, released without times; unless the communicator
//!   dropped records meanwhile (its claim may be among them): then it is counted unfinished.
//! - `flight`: what every operation still running is doing now, read from records as soon as
//!   they are published ([`super::flight`]).
//!
//! Pure: the caller passes the time. Called on: the telemetry thread (or `finalize`).
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::flight::Flight;
use super::summary::{CollKey, OpSample, Transfer, Waits};
use crate::record::{Datatype, Sample};

/// How long a finished operation waits for late children after its window was processed, at
/// least (also when no later window fills up).
pub const HOLD: Duration = Duration::from_millis(250);

/// Where the consumer is when it builds a summary.
#[derive(Clone, Copy, Debug)]
pub struct Frontier {
    /// The time.
    pub now: Instant,
    /// Sequence number of the window filling now (windows are numbered as they open).
    pub filling: u64,
    /// Every window numbered up to this one has been processed (or is being processed, or is
    /// empty).
    pub settled: u64,
    /// Everything leaves (`finalize`).
    pub flush: bool,
    /// Children of held operations were dropped for lack of room: every held operation loses
    /// its times (which ones is not known).
    pub lost_held: bool,
    /// Records the communicator dropped so far (all reasons): an API call whose claim may be
    /// among them is not reported.
    pub drops: u64,
}

/// When a held entry may leave.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Until {
    time: Instant,
    /// The window filling when it was held.
    seq: u64,
}

impl Frontier {
    /// The deadline of an entry held now.
    pub(super) fn hold(&self) -> Until {
        Until {
            time: self.now + HOLD,
            seq: self.filling,
        }
    }

    fn due(&self, until: Until) -> bool {
        self.flush || (until.time <= self.now && until.seq <= self.settled)
    }
}

/// The group an operation is reported in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum GroupKey {
    Coll(CollKey),
    P2p {
        peer: i32,
        datatype: Datatype,
        size_class: u8,
        tag: u64,
        graph: Option<bool>,
    },
}

impl GroupKey {
    /// The same key with the application's tag.
    pub(super) fn tagged(self, tag: u64) -> GroupKey {
        match self {
            GroupKey::Coll(k) => GroupKey::Coll(CollKey { tag, ..k }),
            GroupKey::P2p {
                peer,
                datatype,
                size_class,
                graph,
                ..
            } => GroupKey::P2p {
                peer,
                datatype,
                size_class,
                tag,
                graph,
            },
        }
    }
}

/// What an operation's children said so far.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Progress {
    /// Network ProxyOps that count for completion, and whether one of them has not stopped.
    pub ops: u32,
    pub open_ops: bool,
    /// Latest ProxyOp stop (clock ticks).
    pub last_stop: u64,
    /// KernelCh seen, and whether one of them has no GPU stop.
    pub kernels: u32,
    pub open_kernels: bool,
    /// Earliest KernelCh start and latest stop (GPU ns).
    pub gpu_start: u64,
    pub gpu_stop: u64,
    /// Network transfers under its ProxyOps.
    pub transfers: u32,
    /// The longest wait of a first send step for its peer (ticks), and that peer.
    pub peer_wait: Option<(u64, i32)>,
    /// The longest initial sync of its kernel channels (GPU ns).
    pub sync_wait: Option<u64>,
    /// One of its ProxyOps was recorded without its steps.
    pub bare: bool,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            ops: 0,
            open_ops: false,
            last_stop: 0,
            kernels: 0,
            open_kernels: false,
            gpu_start: u64::MAX,
            gpu_stop: 0,
            transfers: 0,
            peer_wait: None,
            sync_wait: None,
            bare: false,
        }
    }
}

impl Progress {
    /// A ProxyOp that counts: stopped at `stop`, or not stopped.
    pub fn op(&mut self, stop: Option<u64>) {
        self.ops += 1;
        match stop {
            Some(t) => self.last_stop = self.last_stop.max(t),
            None => self.open_ops = true,
        }
    }

    /// A KernelCh: its GPU start and stop, or no stop.
    pub fn kernel(&mut self, gpu_start: u64, gpu_stop: Option<u64>) {
        self.kernels += 1;
        match gpu_stop {
            Some(stop) => {
                self.gpu_start = self.gpu_start.min(gpu_start);
                self.gpu_stop = self.gpu_stop.max(stop);
            }
            None => self.open_kernels = true,
        }
    }

    /// Adds what `other` saw of the same operation.
    fn merge(&mut self, other: &Progress) {
        self.ops += other.ops;
        self.open_ops |= other.open_ops;
        self.last_stop = self.last_stop.max(other.last_stop);
        self.kernels += other.kernels;
        self.open_kernels |= other.open_kernels;
        self.gpu_start = self.gpu_start.min(other.gpu_start);
        self.gpu_stop = self.gpu_stop.max(other.gpu_stop);
        self.transfers = self.transfers.saturating_add(other.transfers);
        self.bare |= other.bare;
        if let Some((ticks, peer)) = other.peer_wait {
            self.waited(peer, ticks);
        }
        if let Some(ns) = other.sync_wait {
            self.synced(ns);
        }
    }

    /// A first send step waited `ticks` for `peer` to be ready to receive.
    pub fn waited(&mut self, peer: i32, ticks: u64) {
        if self.peer_wait.is_none_or(|(t, _)| ticks > t) {
            self.peer_wait = Some((ticks, peer));
        }
    }

    /// A kernel channel's initial sync with its peers took `ns`.
    pub fn synced(&mut self, ns: u64) {
        self.sync_wait = Some(self.sync_wait.map_or(ns, |s| s.max(ns)));
    }

    /// Some child was lost: neither clock can be complete.
    pub fn lose(&mut self) {
        self.open_ops = true;
        self.open_kernels = true;
    }

    /// Whether some recorded part can no longer finish (its stop would be a late record).
    pub fn open(&self) -> bool {
        self.open_ops || self.open_kernels
    }
}

/// A Coll/P2p: where it is reported, when it started, its size and its children's progress.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Root {
    pub key: GroupKey,
    /// Start (clock ticks).
    pub start: u64,
    /// nccl-tests' size.
    pub bytes: u64,
    /// KernelCh it gets (one per channel); 0 when unknown (P2p).
    pub channels: u32,
    /// How the hot path sampled it.
    pub sample: Sample,
    pub p: Progress,
}

impl Root {
    /// Its sample: host time when it has ProxyOps and all stopped; GPU time when every channel
    /// reported.
    pub fn sample(&self, secs_per_tick: f64) -> OpSample {
        let p = &self.p;
        let host = (p.ops > 0 && !p.open_ops).then(|| p.last_stop.checked_sub(self.start));
        let gpu_done = p.kernels > 0 && p.kernels >= self.channels && !p.open_kernels;
        let gpu = gpu_done.then(|| p.gpu_stop.checked_sub(p.gpu_start));
        OpSample {
            bytes: self.bytes,
            start: self.start as f64 * secs_per_tick,
            duration: host.flatten().map(|t| t as f64 * secs_per_tick),
            gpu: gpu.flatten().map(|ns| ns as f64 / 1e9),
            transfers: p.transfers,
            waits: Waits {
                peer: p.peer_wait.map(|(t, peer)| (peer, t as f64 * secs_per_tick)),
                sync: p.sync_wait.map(|ns| ns as f64 / 1e9),
            },
            sample: self.sample,
            bare: p.bare,
        }
    }
}

/// Where a ProxyOp's steps go.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct OpInfo {
    pub rank: i32,
    pub peer: i32,
    pub channel: u8,
    /// Handle of its Coll/P2p (0: none or foreign).
    pub parent: u64,
}

/// Children of an operation not processed yet.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Pending {
    pub p: Progress,
    /// Their transfers, for the operation's group.
    pub transfers: Vec<Transfer>,
    /// Children recorded (orphans if nothing claims them).
    pub children: u64,
    pub until: Instant,
}

/// The table of one communicator; see the module documentation.
#[derive(Debug, Default)]
pub struct OpenOps {
    pub(super) held: HashMap<u64, (Root, Until)>,
    pub(super) pending: HashMap<u64, Pending>,
    pub(super) ops: HashMap<u64, (OpInfo, Until)>,
    /// Unclaimed API calls: the collective each would be, until when, drops when held.
    pub(super) apis: HashMap<u64, (Root, Instant, u64)>,
    /// Operations in flight.
    pub flight: Flight,
    /// How long children wait for their operation's window (at least [`HOLD`]).
    pub(super) pending_ttl: Duration,
    /// The earliest deadline of any entry (none when empty).
    earliest: Option<Instant>,
}

impl OpenOps {
    /// An empty table whose pending children wait `pending_ttl` (at least [`HOLD`]) for their
    /// operation: longer than a window can stay open (the grace period).
    pub fn new(pending_ttl: Duration) -> OpenOps {
        OpenOps {
            pending_ttl: pending_ttl.max(HOLD),
            ..OpenOps::default()
        }
    }

    /// Operations held, waiting for late children.
    #[cfg(any(test, feature = "testing"))]
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Gives back the capacity its tables grew to beyond what they hold (an idle communicator's).
    pub fn shrink(&mut self) {
        self.held.shrink_to_fit();
        self.pending.shrink_to_fit();
        self.ops.shrink_to_fit();
        self.apis.shrink_to_fit();
        self.flight.shrink();
    }

    /// Whether anything may be due at `at` (held operations that can no longer finish are
    /// released by the pass that found it out).
    pub fn due(&self, at: &Frontier) -> bool {
        self.earliest.is_some_and(|e| at.flush || at.lost_held || e <= at.now)
    }

    fn deadline(&mut self, until: Instant) {
        self.earliest = Some(self.earliest.map_or(until, |e| e.min(until)));
    }

    /// Holds the finished operation `handle` until `until`.
    pub(super) fn hold(&mut self, handle: u64, root: Root, until: Until) {
        self.deadline(until.time);
        self.held.insert(handle, (root, until));
    }

    /// Keeps the send ProxyOp `handle` until `until`, for steps recorded in a later window.
    pub(super) fn add_op(&mut self, handle: u64, info: OpInfo, until: Until) {
        self.deadline(until.time);
        self.ops.insert(handle, (info, until));
    }

    /// Children of `parent` recorded before its window was processed.
    pub(super) fn pending(&mut self, parent: u64, now: Instant) -> &mut Pending {
        let until = now + self.pending_ttl;
        if !self.pending.contains_key(&parent) {
            self.deadline(until);
        }
        self.pending.entry(parent).or_insert_with(|| Pending {
            p: Progress::default(),
            transfers: Vec::new(),
            children: 0,
            until,
        })
    }

    /// Holds the unclaimed API call `handle` (the collective `root`) for its Coll or CeColl.
    pub(super) fn hold_api(&mut self, handle: u64, root: Root, at: &Frontier) {
        let until = at.now + self.pending_ttl;
        self.deadline(until);
        self.apis.insert(handle, (root, until, at.drops));
    }

    /// A Coll or CeColl served the API call `handle` (nothing when it is not held).
    pub(super) fn claim_api(&mut self, handle: u64) {
        self.apis.remove(&handle);
    }

    /// Takes the children recorded for `root` before it was processed into it; their transfers.
    pub(super) fn claim(&mut self, handle: u64, root: &mut Root) -> Vec<Transfer> {
        match self.pending.remove(&handle) {
            Some(c) => {
                root.p.merge(&c.p);
                c.transfers
            }
            None => Vec::new(),
        }
    }

    /// Removes what is due at `at`: released operations (API-only collectives included), the
    /// number of children nothing claimed, and of API calls not reported for drops.
    pub(super) fn release(&mut self, at: &Frontier) -> (Vec<Root>, u64, u64) {
        let ready: Vec<u64> = self
            .held
            .iter()
            .filter(|(_, (r, until))| r.p.open() || at.due(*until))
            .map(|(h, _)| *h)
            .collect();
        let mut roots: Vec<Root> = ready
            .iter()
            .filter_map(|h| self.held.remove(h))
            .map(|(r, _)| r)
            .collect();
        let mut unsure = 0;
        self.apis.retain(|_, (root, until, drops)| {
            let keep = !(at.flush || *until <= at.now);
            if !keep && *drops == at.drops {
                roots.push(root.clone());
            } else if !keep {
                unsure += 1;
            }
            keep
        });
        let mut orphans = 0;
        self.pending.retain(|_, c| {
            let keep = !(at.flush || c.until <= at.now);
            if !keep {
                orphans += c.children;
            }
            keep
        });
        self.ops.retain(|_, (_, until)| !at.due(*until));
        let held = self.held.values().map(|(_, until)| until.time);
        let pending = self.pending.values().map(|c| c.until);
        let ops = self.ops.values().map(|(_, until)| until.time);
        let apis = self.apis.values().map(|(_, until, _)| *until);
        self.earliest = held.chain(pending).chain(ops).chain(apis).min();
        (roots, orphans, unsure)
    }
}

//! What one processed window says, ready for export: operations grouped by kind (those the table
//! of open operations released), transfers per link and channel, and the window's bookkeeping.
//! Plain values: built by [`super::link`] on the
//! telemetry thread (or `finalize`), read by the sinks.
#![forbid(unsafe_code)]

use super::queue::Queue;
use crate::record::counted::Counted;
use crate::record::handle::CommId;
use crate::record::{Algo, CommMeta, Datatype, Func, Proto, Sample};

/// Which window of which communicator a record slice is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowId {
    /// The communicator.
    pub comm: CommId,
    /// Window index (0–3), as handles encode it.
    pub window: u8,
    /// The window's epoch while the records were written; handles keep its low 12 bits.
    pub epoch: u32,
}

/// One network transfer (a finished send ProxyStep).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Transfer {
    /// Bytes handed to the network (the step's SendWait).
    pub bytes: u64,
    /// SendWait → Stop, in seconds.
    pub secs: f64,
}

/// One collective or P2P send.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpSample {
    /// nccl-tests' size ([`super::bandwidth::test_size`]).
    pub bytes: u64,
    /// Enqueue (its Coll/P2p start) on the host clock, in seconds.
    pub start: f64,
    /// Host time: start → last linked ProxyOp stop of either direction, in seconds; `None`
    /// without linked ops or when one is unfinished.
    pub duration: Option<f64>,
    /// GPU time: first KernelCh start → last KernelCh stop (GPU clock), in seconds; `None`
    /// without KernelCh or when one is missing or unfinished.
    pub gpu: Option<f64>,
    /// Transfers under its linked ProxyOps.
    pub transfers: u32,
    /// What it waited for its peers.
    pub waits: Waits,
    /// How the hot path sampled it: its weight (the operations its times stand for, 0 for a
    /// predecessor recorded only for its completion) and its place in its communicator's order.
    pub sample: Sample,
    /// Some of its ProxyOps were recorded without their steps (detail shed): `transfers` and
    /// `waits.peer` do not count their transfers.
    pub bare: bool,
}

/// How long an operation waited for its peers (the straggler signals).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Waits {
    /// The longest of its channels' first send transfers waited for the peer to post its receive
    /// (SendPeerWait → SendWait of step 0): (that peer, seconds). `None` without such a step.
    pub peer: Option<(i32, f64)>,
    /// The longest initial synchronisation with its peers among its kernel channels (KernelPhase
    /// `initial_sync`, NCCL 2.31+, GPU clock), seconds.
    pub sync: Option<f64>,
}

/// What collectives are grouped by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CollKey {
    /// Function.
    pub func: Func,
    /// Algorithm.
    pub algo: Algo,
    /// Protocol.
    pub proto: Proto,
    /// Element type.
    pub datatype: Datatype,
    /// Message-size class ([`super::bandwidth::size_class`]).
    pub size_class: u8,
    /// The application's tag (v7 `userTag`), 0 when untagged.
    pub tag: u64,
    /// Made during a CUDA graph capture ([`crate::record::CollStart::graph`]).
    pub graph: Option<bool>,
}

/// Collectives of one kind in the window.
#[derive(Clone, Debug, PartialEq)]
pub struct CollGroup {
    /// The kind.
    pub key: CollKey,
    /// One sample per collective released here (finished, or some part can no longer finish).
    pub ops: Vec<OpSample>,
    /// Transfers of their linked ProxyOps, in step start order.
    pub transfers: Vec<Transfer>,
}

/// P2P sends to one peer with one element type and size class in the window.
#[derive(Clone, Debug, PartialEq)]
pub struct P2pGroup {
    /// Receiving rank.
    pub peer: i32,
    /// Element type.
    pub datatype: Datatype,
    /// Message-size class ([`super::bandwidth::size_class`]).
    pub size_class: u8,
    /// The application's tag (v7 `userTag`), 0 when untagged.
    pub tag: u64,
    /// Made during a CUDA graph capture ([`crate::record::CollStart::graph`]).
    pub graph: Option<bool>,
    /// One sample per send released here.
    pub ops: Vec<OpSample>,
    /// Transfers of their linked ProxyOps, in step start order.
    pub transfers: Vec<Transfer>,
}

/// Transfers from `rank` to `peer`, whatever they served (orphans and PXN ops included).
#[derive(Clone, Debug, PartialEq)]
pub struct LinkGroup {
    /// Sending rank: the ProxyOp's `rank` (ours, or the originator of a PXN op).
    pub rank: i32,
    /// Receiving rank.
    pub peer: i32,
    /// Total bytes transferred.
    pub bytes: u64,
    /// Transfers.
    pub transfers: u64,
    /// The same transfers as a queue: busy periods and their openers, queued transfers' gaps,
    /// busy time; the consumer derives the link's figures with its own mode, after merging.
    pub queue: Queue,
}

/// Transfers on one channel, whatever they served.
#[derive(Clone, Debug, PartialEq)]
pub struct ChannelGroup {
    /// Channel id.
    pub channel: u8,
    /// Transfers, in step start order.
    pub transfers: Vec<Transfer>,
}

/// Bookkeeping of one window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowStats {
    /// Published records (fillers with `id == 0` excluded).
    pub records: u64,
    /// Events started and never stopped; ProxySteps without SendWait or Stop.
    pub unfinished: u64,
    /// ProxyOps, ProxySteps and KernelCh whose parent nothing claimed (see [`super::open`]).
    pub orphans: u64,
    /// The window was processed with events still open (grace period over, or `finalize`).
    pub forced: bool,
    /// Windows this summary covers: 1, or 0 for operations released from the table of open
    /// operations without a window.
    pub windows: u64,
    /// Collectives of other processes whose PXN send ops this window holds (distinct
    /// originating rank and parent): their own process sees their completion only in part.
    pub pxn_collectives: u64,
    /// GPU intervals (KernelCh, KernelPhase) that end before they start, left out: NCCL 2.31.2
    /// can pair a channel's times with another batch's (spec 7.3.5).
    pub invalid_gpu: u64,
    /// ProxyOps recorded without their steps (detail shed): transfers went unseen.
    pub bare_ops: u64,
}

/// Everything one window says, ready for export.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowSummary {
    /// The communicator.
    pub comm: CommMeta,
    /// Sorted by key.
    pub colls: Vec<CollGroup>,
    /// Sorted by (peer, datatype, size class).
    pub p2ps: Vec<P2pGroup>,
    /// Sorted by (rank, peer).
    pub links: Vec<LinkGroup>,
    /// Sorted by channel.
    pub channels: Vec<ChannelGroup>,
    /// GPU durations of the kernel phases that ended in this window, in seconds, by phase
    /// ([`crate::record::PHASES`]).
    pub phases: [Vec<f64>; 3],
    /// Bookkeeping.
    pub stats: WindowStats,
    /// Operations counted without a record (shed under overload) since the communicator's last
    /// drain of its count table, by their count-only attributes.
    pub counted: Vec<Counted>,
}

impl WindowSummary {
    /// A summary of no window (`stats.windows` 0) carrying only operations counted without a
    /// record.
    pub fn counted_only(comm: CommMeta, counted: Vec<Counted>) -> WindowSummary {
        WindowSummary {
            comm,
            colls: Vec::new(),
            p2ps: Vec::new(),
            links: Vec::new(),
            channels: Vec::new(),
            phases: Default::default(),
            stats: WindowStats::default(),
            counted,
        }
    }
}

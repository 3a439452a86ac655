//! Version-neutral records: what the hot path copies out of an NCCL callback into a window slot.
//!
//! Written by NCCL's user and proxy threads (one record per recorded callback), read by the
//! telemetry thread (or `finalize`) once the window is sealed. Every record names the event it
//! belongs to by its handle ([`handle::Handle`] bits); start records also name their parent.
//! Strings from descriptors are classified into small enums during the call ([`names`]): no
//! pointer into NCCL memory survives the callback.
#![forbid(unsafe_code)]

pub mod compact;
pub mod counted;
pub mod handle;
pub mod meta;
pub mod names;
pub mod sample;
pub mod size;

pub use meta::{CommMeta, Gpu, PHASES};
pub use names::{Algo, Datatype, Func, Proto};
pub use sample::Sample;

/// Start of a collective (`Coll` event).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CollStart {
    /// Per-communicator, per-function sequence number.
    pub seq: u64,
    /// Element count as NCCL reports it (bytes for AllGather/Broadcast, see `datatype`).
    pub count: u64,
    /// Function.
    pub func: Func,
    /// Algorithm.
    pub algo: Algo,
    /// Protocol.
    pub proto: Proto,
    /// Element type.
    pub datatype: Datatype,
    /// Channels the collective uses.
    pub n_channels: u8,
    /// Whether the call was made while its stream was being captured into a CUDA graph (v5+
    /// `graphCaptured` of its API event); `None` when NCCL does not say (before 2.28).
    pub graph: Option<bool>,
    /// How the hot path sampled it ([`Sample::ALL`] when nothing is shed).
    pub sample: Sample,
}

/// Start of a point-to-point send (`P2p` event; receives are declined).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct P2pStart {
    /// Element count.
    pub count: u64,
    /// Peer rank in the communicator.
    pub peer: i32,
    /// Element type.
    pub datatype: Datatype,
    /// As [`CollStart::graph`].
    pub graph: Option<bool>,
    /// As [`CollStart::sample`] (P2P sends are numbered apart from collectives).
    pub sample: Sample,
}

/// Start of a proxy operation (`ProxyOp` event): a network send, or a receive of one of our
/// collectives (handle kind [`handle::Kind::RecvOp`]; its steps are [`Body::RecvStep`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProxyOpStart {
    /// Handle of the Coll/P2p this op serves; 0 when NULL or foreign (PXN).
    pub parent: u64,
    /// Rank that created the op: ours, or the originator's for a PXN op.
    pub rank: i32,
    /// Remote rank the data goes to (send) or comes from (receive).
    pub peer: i32,
    /// Channel.
    pub channel: u8,
    /// `isSend`: a network send. Receive ops (`isSend` 0) include CollNet and copy-engine proxy
    /// ops that NCCL never progresses nor stops (spec 3.6): only [`Body::InProgress`] tells a
    /// network receive that will stop (on v1–v3, where only network ops get events and no
    /// InProgress exists, the hot path records one at the start).
    pub send: bool,
    /// For a PXN op, a non-zero digest of the originator's parent handle (never decoded: it only
    /// tells that process's collectives apart); 0 for our own ops.
    pub origin: u32,
}

/// Which edge of a network transfer a legacy ProxyOp state marks (ABI v1–v3, spec 8.2.2, 8.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// The op's first SendPosted (v2, v3): its running total before any of its transfers.
    Base,
    /// SendTransmitted of v2 and v3: the network took a transfer; the total includes it.
    Sent,
    /// SendTransmitted of v1: the network took a transfer; the total is the one before it.
    SentBefore,
    /// SendDone: the network finished the op's oldest unfinished transfer; the total includes
    /// every transfer taken so far.
    Done,
}

/// What one record says about its event.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Body {
    /// A collective started.
    Coll(CollStart),
    /// A point-to-point send started.
    P2p(P2pStart),
    /// A proxy operation started.
    ProxyOp(ProxyOpStart),
    /// A send proxy step (one network transfer) started under the ProxyOp handle `parent`.
    ProxyStep {
        /// Handle of the step's ProxyOp.
        parent: u64,
        /// Transfer index within the op.
        step: i32,
    },
    /// A kernel channel started on the GPU (`pTimer` at start, GPU nanoseconds).
    KernelCh {
        /// Handle of the Coll/P2p the channel works for.
        parent: u64,
        /// Channel.
        channel: u8,
        /// GPU start time (`%globaltimer`, ns).
        gpu_start: u64,
    },
    /// A receive proxy step (v4+) started under the receive ProxyOp handle `parent`. It does not
    /// open an event: NCCL abandons restarted receive steps without a state or a stop (spec 3.7),
    /// so only the operations in flight read it, with its [`Body::GpuWait`] and stop.
    RecvStep {
        /// Handle of the step's receive ProxyOp.
        parent: u64,
        /// Transfer index within the op.
        step: i32,
    },
    /// `ProxyStepRecvGPUWait` of a receive step: its data arrived and was handed to the GPU,
    /// which has not consumed it until the step stops.
    GpuWait,
    /// ABI v1–v3, which have no usable receive steps: a receive ProxyOp's `RecvPosted`
    /// (`received` false) or `RecvReceived` state with its `steps`, the transfers posted or
    /// received so far.
    RecvCount {
        /// `RecvReceived`, not `RecvPosted`.
        received: bool,
        /// `proxyOp.steps`.
        steps: i32,
    },
    /// `ProxyStepSendPeerWait` (v4+), its first call for this step: the GPU produced the step's
    /// data and the proxy tries to hand it to the network (NCCL repeats the state while the
    /// receiver is not ready; the hot path records the first, per thread). On ABI v1–v3, the
    /// first `ProxyOpSendRemFifoWait` of a transfer, recorded on the send ProxyOp: the same wait.
    PeerWait,
    /// `ProxyStepSendWait`: the network accepted `bytes` for this step.
    SendWait {
        /// Bytes handed to the network (`transSize`).
        bytes: u64,
    },
    /// A legacy send ProxyOp's state (v1–v3): a transfer edge with the op's running byte total
    /// (`transSize`, never reset by NCCL: only differences within one op mean anything).
    OpBytes {
        /// Which edge.
        mark: Mark,
        /// `proxyOp.transSize`.
        total: u64,
    },
    /// `ProxyOpInProgress` of a receive op: NCCL progresses it, so it will stop.
    InProgress,
    /// `KernelChStop`: the channel finished on the GPU.
    KernelChStop {
        /// GPU stop time (`%globaltimer`, ns).
        gpu_stop: u64,
    },
    /// The application's tag (v7 `userTag`, non-zero) of the Coll/P2p this record names.
    Tag {
        /// `ncclCollConfig_t.userProfilerTag`.
        tag: u64,
    },
    /// A kernel phase (v7) of the kernel channel `parent` started (GPU time).
    KernelPhase {
        /// Handle of the KernelCh.
        parent: u64,
        /// 0 initial sync, 1 compute, 2 final sync.
        phase: u8,
        /// GPU start time (`%globaltimer`, ns).
        gpu_start: u64,
    },
    /// `KernelPhaseStop`: the phase ended.
    PhaseStop {
        /// GPU stop time (`%globaltimer`, ns).
        gpu_stop: u64,
    },
    /// A collective's API call (CollApi, NCCL 2.29–2.30, not graph-captured): a collective of
    /// its own unless a Coll or CeColl claims it (NCCL runs symmetric-memory collectives with
    /// their API events only).
    Api(CollStart),
    /// The Coll or CeColl this record names serves the API call `api` (an [`Body::Api`]'s
    /// handle).
    Claim {
        /// Handle of the API call.
        api: u64,
    },
    /// The event stopped.
    Stop,
}

impl Body {
    /// Whether this record opens an event that is expected to get a `Stop`.
    pub fn opens(&self) -> bool {
        matches!(
            self,
            Body::Coll(_) | Body::P2p(_) | Body::ProxyOp(_) | Body::ProxyStep { .. } | Body::KernelCh { .. }
        )
    }
}

/// One slot's content: which event (`id`, a handle value), when (`ts`, clock ticks), and what.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Record {
    /// Handle of the event this record is about.
    pub id: u64,
    /// CPU time of the callback, in [`crate::clock`] ticks; 0 where nothing uses it (only
    /// Coll/P2p starts, PeerWait, GpuWait, SendWait, OpBytes but Base, and ProxyOp (both
    /// directions)/ProxyStep stops are timed).
    pub ts: u64,
    /// Payload.
    pub body: Body,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_fits_a_cache_friendly_slot() {
        assert_eq!(std::mem::size_of::<Record>(), 48);
    }
}

//! Operations in flight, for the progress gauges and hang diagnosis: the part of the table of
//! open operations ([`super::open::OpenOps::flight`]) that the consumer feeds with every record as
//! soon as it is published, FILLING and CLOSING windows alike, so that it follows a stuck
//! operation whatever becomes of its window.
//!
//! - A Coll/P2p is in flight from its start until every child it got stopped: network ProxyOps
//!   (receive ones once progressing) and KernelCh. The operations of a communicator complete in
//!   order (one stream): when one completes, every older one has completed too, even if its own
//!   last stops were lost (a window processed with an operation still open drops its later states
//!   and stops as late, never its children's starts).
//! - One with no such child after [`CHILDLESS`] (intra-node without KernelCh, a CollNet or
//!   copy-engine op only) cannot be followed and leaves; at most [`MAX_ROOTS`] are followed.
//! - Progress is any record of the operation or of a child, timed by the consumer's clock when it
//!   reads the record (within a telemetry tick: enough against a threshold of seconds).
//! - A send step is posted (waiting for the GPU's data), waiting for its peer (SendPeerWait), or
//!   on the network (SendWait), until it stops. On ABI v1–v3, which have no send steps, a send
//!   op waits for its peer from the first SendRemFifoWait of a transfer (a PeerWait on the op)
//!   until the network takes the transfer (SendTransmitted), which is on the network until its
//!   SendDone.
//! - A receive step (v4+) holds data the GPU has not consumed from its RecvGPUWait until it
//!   stops. Steps are consumed in order, so the op's GPU holds data while the highest step that
//!   reached RecvGPUWait is above the highest stopped one (a step NCCL restarted, or whose stop
//!   was lost, cannot make it hold). A progressing receive op that has not stopped and holds no
//!   such data is waiting for data from its peer.
//! - Hang: the oldest operation with an open child and no progress for the threshold; one
//!   episode until it progresses or completes. A send op without any step posted says its proxy
//!   stopped once the communicator's ops have been seen posting steps and the op was recorded
//!   with its steps (not shed): else the plugin cannot tell (no step events).
//!
//! Pure: the caller passes the time. Called on: the telemetry thread (or `finalize`).
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::time::{Duration, Instant};

use super::bandwidth::coll_size;
use super::lifetime::Life;
pub use crate::culprit::Wait;
use crate::record::handle::{EPOCH_MASK, Handle};
use crate::record::{Body, Func, Mark, Record};

/// How long an operation may go without a child that tells its completion before it is no longer
/// followed: far longer than NCCL takes to post a launched operation's proxy ops.
pub const CHILDLESS: Duration = Duration::from_secs(1);

/// Operations followed at most per communicator (beyond, new ones are not followed).
pub const MAX_ROOTS: usize = 1 << 16;

/// One channel of a stuck operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stuck {
    /// Channel id.
    pub channel: u8,
    /// What it waits for.
    pub wait: Wait,
    /// The peer it waits on (communicator rank); `None` for a local wait.
    pub peer: Option<i32>,
}

/// The operation a communicator is stuck in, and on what.
#[derive(Clone, Debug, PartialEq)]
pub struct Hang {
    /// Its function (`Send` for a P2P send).
    pub func: Func,
    /// Its sequence number (per function); `None` for P2P.
    pub seq: Option<u64>,
    /// Its size (nccl-tests' for a collective).
    pub bytes: u64,
    /// Time since its last progress.
    pub idle: Duration,
    /// Its channels that have something open, by channel.
    pub channels: Vec<Stuck>,
}

impl fmt::Display for Hang {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.func.as_str())?;
        if let Some(seq) = self.seq {
            write!(f, " seq {seq}")?;
        }
        write!(
            f,
            " ({} bytes) made no progress for {:.1} s",
            self.bytes,
            self.idle.as_secs_f64()
        )?;
        for (i, c) in self.channels.iter().enumerate() {
            let sep = if i == 0 { ":" } else { ";" };
            let peer = c.peer.unwrap_or(-1);
            let what = match c.wait {
                Wait::Network => format!("transfer to peer {peer} on the network (SendWait, not completed)"),
                Wait::Peer => format!("peer {peer} not ready to receive (SendPeerWait, no SendWait)"),
                Wait::Recv => format!("waiting for data from peer {peer} (receive posted, not completed)"),
                Wait::Gpu => "waiting for the local GPU (received data not consumed, or send data not ready)".to_owned(),
                Wait::Proxy => "nothing posted (steps left, none in flight)".to_owned(),
                Wait::Unknown => "unknown (no ProxyStep events)".to_owned(),
            };
            write!(f, "{sep} channel {}: {what}", c.channel)?;
        }
        Ok(())
    }
}

/// The oldest operation in flight.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Oldest {
    /// Its function (`Send` for a P2P send).
    pub func: Func,
    /// Its sequence number; `None` for P2P.
    pub seq: Option<u64>,
    /// Its size.
    pub bytes: u64,
    /// Since its start was read.
    pub age: Duration,
    /// Since its last progress.
    pub idle: Duration,
}

/// A communicator's progress now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CommProgress {
    /// Operations followed in flight.
    pub in_flight: u64,
    /// The oldest of them.
    pub oldest: Option<Oldest>,
    /// The last completed sequence number per function.
    pub completed: Vec<(Func, u64)>,
    /// The current hang episode's diagnosis.
    pub hang: Option<Hang>,
    /// Hang episodes so far.
    pub episodes: u64,
}

/// A Coll/P2p in flight.
#[derive(Clone, Debug)]
struct Live {
    func: Func,
    seq: Option<u64>,
    bytes: u64,
    /// Start (clock ticks): completion order.
    start: u64,
    seen: Instant,
    last: Instant,
    /// Children that tell its completion, and those of them not stopped.
    children: u32,
    open: u32,
}

/// A ProxyOp of an operation in flight, with its send steps by state.
#[derive(Clone, Copy, Debug, Default)]
struct Op {
    root: u64,
    peer: i32,
    channel: u8,
    send: bool,
    /// What was read of it: it counts for its operation's completion while open ([`Life`]).
    life: Life,
    /// Steps started so far, and open ones: posted, waiting for the peer, on the network.
    steps: u32,
    at: [u32; 3],
    /// ABI v1–v3 send op: a transfer waits for the peer (SendRemFifoWait, not yet transmitted),
    /// and transfers on the network (transmitted, not done).
    fifo_wait: bool,
    on_net: u32,
    /// Receive op: the highest step index + 1 that reached RecvGPUWait, and that stopped.
    arrived: i64,
    consumed: i64,
    /// ABI v1–v3 receive op: transfers posted and received so far (RecvPosted, RecvReceived).
    posted: i32,
    received: i32,
    /// Its steps are recorded: the communicator's ops post steps (ProxyStep in the mask, a
    /// release that has them) and it was not recorded bare (detail shed).
    stepped: bool,
}

const POSTED: usize = 0;
const PEER_WAIT: usize = 1;
const SENT: usize = 2;

/// See the module documentation.
#[derive(Debug, Default)]
pub struct Flight {
    roots: HashMap<u64, Live>,
    /// The roots by (start, handle): completion takes every older one in one split, not a pass
    /// over all of them.
    order: BTreeSet<(u64, u64)>,
    ops: HashMap<u64, Op>,
    /// Send step → (its op, its state).
    steps: HashMap<u64, (u64, usize)>,
    /// Receive step → (its op, its index).
    recv_steps: HashMap<u64, (u64, i32)>,
    /// KernelCh → (its operation, channel).
    kernels: HashMap<u64, (u64, u8)>,
    completed: BTreeMap<Func, u64>,
    /// The stuck operation of the current episode, and its last progress then.
    episode: Option<(u64, Instant)>,
    episodes: u64,
    /// For nccl-tests' sizes (0 when unknown).
    nranks: i32,
    /// A send step of this communicator has been read.
    step_events: bool,
}

impl Flight {
    /// An empty table for a communicator of `nranks` ranks.
    pub fn new(nranks: i32) -> Flight {
        Flight {
            nranks,
            ..Flight::default()
        }
    }

    /// Gives back the capacity its tables grew to beyond what they hold.
    pub fn shrink(&mut self) {
        self.roots.shrink_to_fit();
        self.ops.shrink_to_fit();
        self.steps.shrink_to_fit();
        self.recv_steps.shrink_to_fit();
        self.kernels.shrink_to_fit();
    }

    /// Reads one published record (fillers included: ignored).
    pub fn see(&mut self, r: &Record, now: Instant) {
        let id = r.id;
        match r.body {
            Body::Coll(c) => {
                let bytes = coll_size(&c, self.nranks).unwrap_or(0);
                self.add(id, c.func, Some(c.seq), bytes, r.ts, now);
            }
            Body::P2p(p) => self.add(
                id,
                Func::Send,
                None,
                p.count.saturating_mul(p.datatype.size()),
                r.ts,
                now,
            ),
            Body::ProxyOp(o) if self.roots.contains_key(&o.parent) => {
                let op = Op {
                    root: o.parent,
                    peer: o.peer,
                    channel: o.channel,
                    send: o.send,
                    stepped: self.step_events && !Handle::is_bare(id),
                    ..Op::default()
                };
                self.ops.insert(id, op);
                self.read_op(id, &r.body);
            }
            Body::InProgress => self.read_op(id, &r.body),
            Body::ProxyStep { parent, .. } => {
                if let Some(op) = self.ops.get_mut(&parent) {
                    self.step_events = true;
                    op.steps += 1;
                    op.at[POSTED] = op.at[POSTED].saturating_add(1);
                    self.steps.insert(id, (parent, POSTED));
                }
            }
            Body::RecvStep { parent, step } if self.ops.contains_key(&parent) => {
                self.recv_steps.insert(id, (parent, step));
            }
            Body::GpuWait => {
                if let Some((op, step)) = self.recv_steps.get(&id)
                    && let Some(op) = self.ops.get_mut(op)
                {
                    op.arrived = op.arrived.max(i64::from(*step) + 1);
                }
            }
            Body::PeerWait => match self.ops.get_mut(&id) {
                Some(op) => op.fifo_wait = true,
                None => self.step_to(id, PEER_WAIT),
            },
            Body::RecvCount { received, steps } => {
                if let Some(op) = self.ops.get_mut(&id) {
                    let count = if received { &mut op.received } else { &mut op.posted };
                    *count = (*count).max(steps);
                }
            }
            Body::OpBytes { mark, .. } => {
                if let Some(op) = self.ops.get_mut(&id) {
                    match mark {
                        Mark::Sent | Mark::SentBefore => (op.fifo_wait, op.on_net) = (false, op.on_net.saturating_add(1)),
                        Mark::Done => op.on_net = op.on_net.saturating_sub(1),
                        Mark::Base => {}
                    }
                }
            }
            Body::SendWait { .. } => self.step_to(id, SENT),
            Body::KernelCh { parent, channel, .. } => {
                if let Some(root) = self.roots.get_mut(&parent) {
                    root.children += 1;
                    root.open += 1;
                    self.kernels.insert(id, (parent, channel));
                }
            }
            _ => {}
        }
        let subject = match r.body {
            Body::KernelPhase { parent, .. } => parent,
            _ => id,
        };
        if let Some(root) = self.root_of(subject).and_then(|h| self.roots.get_mut(&h)) {
            root.last = now;
        }
        if r.body == Body::Stop {
            self.stop(id);
        }
    }

    fn add(&mut self, id: u64, func: Func, seq: Option<u64>, bytes: u64, start: u64, now: Instant) {
        if self.roots.len() < MAX_ROOTS {
            let live = Live {
                func,
                seq,
                bytes,
                start,
                seen: now,
                last: now,
                children: 0,
                open: 0,
            };
            if let Some(old) = self.roots.insert(id, live) {
                self.order.remove(&(old.start, id));
            }
            self.order.insert((start, id));
        }
    }

    /// Reads `body`, the start or InProgress of op `id`: once the op is open, it counts for its
    /// operation's completion.
    fn read_op(&mut self, id: u64, body: &Body) {
        let Some(op) = self.ops.get_mut(&id) else {
            return;
        };
        if op.life.read(body, !op.send) > 0
            && let Some(root) = self.roots.get_mut(&op.root)
        {
            root.children += 1;
            root.open += 1;
        }
    }

    /// Moves send step `id` forward to state `to` (never back).
    fn step_to(&mut self, id: u64, to: usize) {
        let Some((op, at)) = self.steps.get_mut(&id).filter(|(_, at)| *at < to) else {
            return;
        };
        if let Some(op) = self.ops.get_mut(op) {
            op.at[*at] = op.at[*at].saturating_sub(1);
            op.at[to] = op.at[to].saturating_add(1);
        }
        *at = to;
    }

    /// The operation the event `id` belongs to.
    fn root_of(&self, id: u64) -> Option<u64> {
        if self.roots.contains_key(&id) {
            return Some(id);
        }
        let op = match (self.steps.get(&id), self.recv_steps.get(&id)) {
            (Some((op, _)), _) | (_, Some((op, _))) => *op,
            _ => id,
        };
        self.ops
            .get(&op)
            .map(|o| o.root)
            .or_else(|| self.kernels.get(&id).map(|(root, _)| *root))
    }

    fn stop(&mut self, id: u64) {
        if let Some((op, step)) = self.recv_steps.remove(&id) {
            if let Some(op) = self.ops.get_mut(&op) {
                op.consumed = op.consumed.max(i64::from(step) + 1);
            }
            return;
        }
        if let Some((op, at)) = self.steps.remove(&id) {
            if let Some(op) = self.ops.get_mut(&op) {
                op.at[at] = op.at[at].saturating_sub(1);
            }
            return;
        }
        let root = match (self.ops.remove(&id), self.kernels.remove(&id)) {
            // Its stop closes an open op.
            (Some(op), _) if op.life.is_open(!op.send) => op.root,
            (_, Some((root, _))) => root,
            _ => return,
        };
        let Some(live) = self.roots.get_mut(&root) else {
            return;
        };
        live.open = live.open.saturating_sub(1);
        if live.open == 0 {
            let start = live.start;
            self.complete(start);
        }
    }

    /// The operation that started at `start` completed, and with it every older one.
    fn complete(&mut self, start: u64) {
        let newer = match start.checked_add(1) {
            Some(next) => self.order.split_off(&(next, 0)),
            None => BTreeSet::new(),
        };
        for (_, id) in std::mem::replace(&mut self.order, newer) {
            if let Some(Live {
                func, seq: Some(seq), ..
            }) = self.roots.remove(&id)
            {
                let last = self.completed.entry(func).or_insert(seq);
                *last = (*last).max(seq);
            }
        }
    }

    /// Once per telemetry tick: forgets operations that cannot be followed and children of
    /// operations that left, and returns the diagnosis when a hang episode starts now: the
    /// oldest operation with an open child has made no progress for `threshold`.
    pub fn check(&mut self, now: Instant, threshold: Duration) -> Option<Hang> {
        self.roots
            .retain(|_, r| r.children > 0 || now.saturating_duration_since(r.seen) < CHILDLESS);
        let roots = &self.roots;
        self.order.retain(|(_, id)| roots.contains_key(id));
        self.ops.retain(|_, op| roots.contains_key(&op.root));
        self.kernels.retain(|_, (root, _)| roots.contains_key(root));
        let ops = &self.ops;
        self.steps.retain(|_, (op, _)| ops.contains_key(op));
        self.recv_steps.retain(|_, (op, _)| ops.contains_key(op));
        let stuck = self
            .roots
            .iter()
            .filter(|(_, r)| r.open > 0)
            .min_by_key(|(_, r)| r.start)
            .filter(|(_, r)| now.saturating_duration_since(r.last) >= threshold)
            .map(|(h, r)| (*h, r.last));
        if stuck.is_some() && stuck == self.episode {
            return None;
        }
        self.episode = stuck;
        let hang = self.hang(stuck?.0, now);
        self.episodes += 1;
        hang
    }

    /// Whether an operation recorded in window `window` at `epoch` has an open child and made
    /// progress within `within` of `now`: its stops are still to come to that window.
    pub fn progressing_in(&self, window: u8, epoch: u32, now: Instant, within: Duration) -> bool {
        self.roots.iter().any(|(&id, r)| {
            r.open > 0
                && now.saturating_duration_since(r.last) < within
                && Handle::decode(id).is_some_and(|h| h.window() == window && h.epoch() == epoch & EPOCH_MASK)
        })
    }

    /// The diagnosis of the stuck operation `h` now.
    fn hang(&self, h: u64, now: Instant) -> Option<Hang> {
        let r = self.roots.get(&h)?;
        let mut by_channel: BTreeMap<u8, (Option<&Op>, Option<&Op>, bool)> = BTreeMap::new();
        for op in self.ops.values().filter(|op| op.root == h) {
            let c = by_channel.entry(op.channel).or_default();
            match op.send {
                true => c.0 = Some(op),
                false if op.life.is_open(true) => c.1 = Some(op),
                false => {}
            }
        }
        for (_, channel) in self.kernels.values().filter(|(root, _)| *root == h) {
            by_channel.entry(*channel).or_default().2 = true;
        }
        let channels = by_channel
            .into_iter()
            .filter_map(|(channel, (send, recv, kernel))| {
                let (wait, peer) = wait(send, recv, kernel)?;
                Some(Stuck { channel, wait, peer })
            })
            .collect();
        Some(Hang {
            func: r.func,
            seq: r.seq,
            bytes: r.bytes,
            idle: now.saturating_duration_since(r.last),
            channels,
        })
    }

    /// The communicator's progress at `now`.
    pub fn snapshot(&self, now: Instant) -> CommProgress {
        let oldest = self
            .order
            .first()
            .and_then(|(_, id)| self.roots.get(id))
            .map(|r| Oldest {
                func: r.func,
                seq: r.seq,
                bytes: r.bytes,
                age: now.saturating_duration_since(r.seen),
                idle: now.saturating_duration_since(r.last),
            });
        CommProgress {
            in_flight: self.roots.len() as u64,
            oldest,
            completed: self.completed.iter().map(|(f, s)| (*f, *s)).collect(),
            hang: self.episode.and_then(|(h, _)| self.hang(h, now)),
            episodes: self.episodes,
        }
    }
}

/// What a channel with the open send op `send`, progressing receive `recv` and open kernel
/// (`kernel`) waits for; `None` when nothing of it is open.
fn wait(send: Option<&Op>, recv: Option<&Op>, kernel: bool) -> Option<(Wait, Option<i32>)> {
    // v1–v3: every receive posted has arrived, so the channel waits for nothing from the peer.
    let received = |r: &&Op| r.posted > 0 && r.received >= r.posted;
    let from = recv.filter(|r| !received(r)).map(|r| r.peer);
    // Data the peer sent waits for the GPU: the GPU is stuck, not the peer.
    let gpu_holds = recv.is_some_and(|r| r.arrived > r.consumed);
    // v1–v3 (no send steps): a receive posted and not arrived says what the channel waits for.
    let awaited = recv.is_some_and(|r| r.posted > r.received);
    Some(match send {
        Some(s) if s.at[SENT] > 0 || s.on_net > 0 => (Wait::Network, Some(s.peer)),
        Some(s) if s.at[PEER_WAIT] > 0 || s.fifo_wait => (Wait::Peer, Some(s.peer)),
        Some(s) if s.steps == 0 && !awaited && !s.stepped => (Wait::Unknown, None),
        Some(s) if s.at[POSTED] == 0 && (s.steps > 0 || s.stepped) => (Wait::Proxy, None),
        _ if gpu_holds => (Wait::Gpu, None),
        Some(_) if from.is_some() => (Wait::Recv, from),
        Some(_) => (Wait::Gpu, None),
        None if from.is_some() => (Wait::Recv, from),
        None if kernel => (Wait::Gpu, None),
        None if recv.is_some() => (Wait::Unknown, None),
        None => return None,
    })
}

#[cfg(test)]
mod tests;

//! Ranks that keep their peers waiting: one that stops posting in the middle of one collective for
//! a while ([`Options::stall`]), one that enters every collective late ([`Options::late`]); and
//! what that does to its ring neighbours: the rank sending to it cannot hand it the held steps
//! (their receives are not posted: SendPeerWait repeats, no SendWait; SendRemFifoWait on NCCL
//! 2.23–2.26), the rank receiving from it gets no data for them (its sends that forward that data
//! wait for the GPU).
//!
//! A rank whose GPU stops in the middle of one collective for a while ([`Options::gpu_stall`]):
//! its proxy keeps posting, the data of its receives keeps arriving and is handed to the GPU
//! (RecvGPUWait), but the GPU neither consumes it (no stop) nor produces data to send; the rank
//! receiving from it gets nothing more. The stuck rank is its own: the truth is [`GpuStall::rank`].
//!
//! For a job whose ranks are coupled through a [`Board`] (one process per host), a stall or a GPU
//! stall can begin at a time instead ([`When::At`]), a rank can be late from a time on
//! ([`Late::from`]), a rank's NIC can stop ([`NicHang`]) and a rank can stop calling NCCL for a
//! while or for good ([`Pause`]): the board makes its peers wait, and theirs in turn.
//!
//! [`Board`]: super::board::Board
//! [`Options::stall`]: super::Options::stall
//! [`Options::late`]: super::Options::late
//! [`Options::gpu_stall`]: super::Options::gpu_stall

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// See the module documentation.
#[derive(Clone, Debug)]
pub struct Stall {
    /// World rank that stops posting.
    pub rank: usize,
    /// When it stops.
    pub when: When,
    /// How long it stays stopped.
    pub hold: Duration,
    began: Arc<Mutex<Option<(Instant, SystemTime)>>>,
}

/// When a [`Stall`] or [`GpuStall`] begins.
#[derive(Clone, Copy, Debug)]
pub enum When {
    /// In the collective of `iteration`, after `after` steps of each of its ops (its later steps,
    /// and its peers' steps of the same index on the links to and from it, are held).
    Step { iteration: usize, after: usize },
    /// At this time, in whatever collective runs then (or the next): every step not posted yet.
    /// Only the stalled rank's own steps are held; its peers wait on it through the [`Board`]
    /// of a job whose ranks are coupled.
    ///
    /// [`Board`]: super::board::Board
    At(Instant),
}

impl When {
    /// Whether step `k` of the collective of `iteration` is at or past the trigger.
    fn due(self, iteration: usize, k: usize) -> bool {
        match self {
            When::Step { iteration: i, after } => iteration == i && k >= after,
            When::At(t) => Instant::now() >= t,
        }
    }
}

/// Whether a step is held.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Held {
    No,
    /// Not before this time (the stalled rank resumes, the late rank entered).
    Until(Instant),
    /// The rank that holds it has not stopped (entered) yet: its counterpart of this step comes
    /// later.
    Unknown,
    /// A receive step's data, sent by a rank of another process, arrives at this time
    /// ([`super::board::Board`]).
    Arrives(Instant),
}

/// A rank that enters each collective `delay` late: it waits that long before each iteration's
/// calls, so the others wait for it there.
#[derive(Clone, Debug)]
pub struct Late {
    /// World rank that is late.
    pub rank: usize,
    pub delay: Duration,
    /// Late from this time on (`None`: from the start).
    pub from: Option<Instant>,
    /// When it entered each iteration.
    entered: Arc<Mutex<HashMap<usize, Instant>>>,
    /// The delays it imposed, as measured (a sleep lasts a little longer than asked).
    imposed: Arc<Mutex<Vec<Duration>>>,
}

impl Late {
    pub fn new(rank: usize, delay: Duration) -> Late {
        Late {
            rank,
            delay,
            from: None,
            entered: Arc::default(),
            imposed: Arc::default(),
        }
    }

    /// Late only in the iterations it enters from `from` on.
    pub fn from(rank: usize, delay: Duration, from: Instant) -> Late {
        Late {
            from: Some(from),
            ..Late::new(rank, delay)
        }
    }

    /// The delays imposed so far, in order.
    pub fn imposed(&self) -> Vec<Duration> {
        self.imposed.lock().unwrap().clone()
    }

    /// The late rank's user thread, before issuing iteration `iteration`: waits, then enters.
    pub(crate) fn enter(&self, iteration: usize) {
        let t0 = Instant::now();
        if self.from.is_none_or(|f| t0 >= f) {
            std::thread::sleep(self.delay);
        }
        let now = Instant::now();
        self.imposed.lock().unwrap().push(now - t0);
        self.entered.lock().unwrap().insert(iteration, now);
    }

    /// Whether a step of an op of world rank `world` with the remote world rank `peer`, in the
    /// collective of `iteration`, waits for the late rank.
    pub(crate) fn held(&self, world: usize, peer: usize, iteration: usize) -> Held {
        if peer != self.rank || world == self.rank {
            return Held::No;
        }
        match self.entered.lock().unwrap().get(&iteration) {
            Some(&t) => Held::Until(t),
            None => Held::Unknown,
        }
    }
}

impl Stall {
    pub fn new(rank: usize, iteration: usize, after: usize, hold: Duration) -> Stall {
        Stall::when(rank, When::Step { iteration, after }, hold)
    }

    /// Stops at `at` (see [`When::At`]).
    pub fn at(rank: usize, at: Instant, hold: Duration) -> Stall {
        Stall::when(rank, When::At(at), hold)
    }

    fn when(rank: usize, when: When, hold: Duration) -> Stall {
        Stall {
            rank,
            when,
            hold,
            began: Arc::default(),
        }
    }

    /// When the stalled rank stopped posting (emulator clock and wall clock).
    pub fn began(&self) -> Option<(Instant, SystemTime)> {
        *self.began.lock().unwrap()
    }

    /// Whether step `k` of an op of world rank `world` with the remote world rank `peer`, in
    /// the collective of `iteration`, is held now. The stalled rank's own first held step
    /// starts the stall.
    pub(crate) fn held(&self, world: usize, peer: usize, iteration: usize, k: usize) -> Held {
        let peers = matches!(self.when, When::Step { .. });
        if !self.when.due(iteration, k) || (world != self.rank && (!peers || peer != self.rank)) {
            return Held::No;
        }
        let mut began = self.began.lock().unwrap();
        if world == self.rank && began.is_none() {
            *began = Some((Instant::now(), SystemTime::now()));
        }
        match *began {
            Some((t, _)) if Instant::now() < t + self.hold => Held::Until(t + self.hold),
            Some(_) => Held::No,
            None => Held::Unknown,
        }
    }
}

/// See the module documentation: a [`Stall`] of the GPU (its `after` counts receive steps the
/// GPU consumes before it stops; the stop begins when step `after` arrives).
#[derive(Clone, Debug)]
pub struct GpuStall(pub Stall);

impl GpuStall {
    pub fn new(rank: usize, iteration: usize, after: usize, hold: Duration) -> GpuStall {
        GpuStall(Stall::new(rank, iteration, after, hold))
    }

    /// Stops at `at` (see [`When::At`]): the first receive step that arrives then.
    pub fn at(rank: usize, at: Instant, hold: Duration) -> GpuStall {
        GpuStall(Stall::at(rank, at, hold))
    }

    /// When the GPU stopped (emulator clock and wall clock).
    pub fn began(&self) -> Option<(Instant, SystemTime)> {
        self.0.began()
    }

    /// Receive step `k` of world rank `world` in the collective of `iteration` arrived now: when
    /// its GPU consumes it at the earliest (`None`: as usual). The stalled rank's step `after`
    /// stops the GPU.
    pub(crate) fn consumed_after(&self, world: usize, iteration: usize, k: usize) -> Option<Instant> {
        let s = &self.0;
        if world != s.rank || !s.when.due(iteration, k) {
            return None;
        }
        let mut began = s.began.lock().unwrap();
        let (t, _) = *began.get_or_insert((Instant::now(), SystemTime::now()));
        Some(t + s.hold)
    }

    /// While (or once) world rank `world`'s GPU is stopped in `iteration`: (since, until). Data
    /// it would produce after `since` is ready at `until` at the earliest.
    pub(crate) fn frozen(&self, world: usize, iteration: usize) -> Option<(Instant, Instant)> {
        let s = &self.0;
        let stalled = match s.when {
            When::Step { iteration: i, .. } => iteration == i,
            When::At(_) => true,
        };
        if world != s.rank || !stalled {
            return None;
        }
        let (t, _) = s.began()?;
        Some((t, t + s.hold))
    }

    /// Whether step `k` of a receive (`recv`) op of world rank `world` from world rank `peer`, in
    /// the collective of `iteration`, is held: the stalled rank sends nothing past its step
    /// `after` (which forwards the last data its GPU consumed) until its GPU resumes.
    pub(crate) fn held(&self, world: usize, peer: usize, iteration: usize, k: usize, recv: bool) -> Held {
        let s = &self.0;
        let When::Step { iteration: i, after } = s.when else {
            return Held::No;
        };
        if !recv || world == s.rank || peer != s.rank || iteration != i || k <= after {
            return Held::No;
        }
        match s.began() {
            Some((t, _)) if Instant::now() < t + s.hold => Held::Until(t + s.hold),
            Some(_) => Held::No,
            None => Held::Unknown,
        }
    }
}

/// A rank whose NIC stops (a hung network, [`super::Options::nic_hang`]): every transfer from or
/// to it handed to the network from `at` on completes `hold` after `at` at the earliest. Every
/// process of a coupled job applies it to its own ranks' transfers.
#[derive(Clone, Copy, Debug)]
pub struct NicHang {
    pub rank: usize,
    pub at: Instant,
    pub hold: Duration,
}

impl NicHang {
    /// The earliest completion of a transfer `world → peer` handed to the network at `t0`.
    pub(crate) fn completes(&self, world: usize, peer: usize, t0: Instant) -> Option<Instant> {
        let end = self.at + self.hold;
        ((world == self.rank || peer == self.rank) && t0 >= self.at && t0 < end).then_some(end)
    }
}

/// A rank that stops calling NCCL between two iterations ([`super::Options::pause`]): a
/// checkpoint, or for good (an absent rank). Its peers wait in the collective it does not join.
#[derive(Clone, Copy, Debug)]
pub struct Pause {
    pub rank: usize,
    pub at: Instant,
    pub hold: Duration,
}

impl Pause {
    /// World rank `world` before an iteration: waits out the pause when it is due.
    pub(crate) fn before_iteration(&self, world: usize) {
        let now = Instant::now();
        if world == self.rank && now >= self.at && now < self.at + self.hold {
            std::thread::sleep(self.at + self.hold - now);
        }
    }
}

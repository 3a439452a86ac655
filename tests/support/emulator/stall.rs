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
    /// The iteration whose collective it stops in.
    pub iteration: usize,
    /// Steps of each of its ops in that collective posted before it stops (its later steps, and
    /// its peers' steps of the same index on the links to and from it, are held).
    pub after: usize,
    /// How long it stays stopped.
    pub hold: Duration,
    began: Arc<Mutex<Option<(Instant, SystemTime)>>>,
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
}

/// A rank that enters each collective `delay` late: it waits that long before each iteration's
/// calls, so the others wait for it there.
#[derive(Clone, Debug)]
pub struct Late {
    /// World rank that is late.
    pub rank: usize,
    pub delay: Duration,
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
            entered: Arc::default(),
            imposed: Arc::default(),
        }
    }

    /// The delays imposed so far, in order.
    pub fn imposed(&self) -> Vec<Duration> {
        self.imposed.lock().unwrap().clone()
    }

    /// The late rank's user thread, before issuing iteration `iteration`: waits, then enters.
    pub(crate) fn enter(&self, iteration: usize) {
        let t0 = Instant::now();
        std::thread::sleep(self.delay);
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
        Stall {
            rank,
            iteration,
            after,
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
        if iteration != self.iteration || k < self.after || (world != self.rank && peer != self.rank) {
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

    /// When the GPU stopped (emulator clock and wall clock).
    pub fn began(&self) -> Option<(Instant, SystemTime)> {
        self.0.began()
    }

    /// Receive step `k` of world rank `world` in the collective of `iteration` arrived now: when
    /// its GPU consumes it at the earliest (`None`: as usual). The stalled rank's step `after`
    /// stops the GPU.
    pub(crate) fn consumed_after(&self, world: usize, iteration: usize, k: usize) -> Option<Instant> {
        let s = &self.0;
        if world != s.rank || iteration != s.iteration || k < s.after {
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
        if world != s.rank || iteration != s.iteration {
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
        if !recv || world == s.rank || peer != s.rank || iteration != s.iteration || k <= s.after {
            return Held::No;
        }
        match s.began() {
            Some((t, _)) if Instant::now() < t + s.hold => Held::Until(t + s.hold),
            Some(_) => Held::No,
            None => Held::Unknown,
        }
    }
}

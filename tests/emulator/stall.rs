//! A rank that stops posting in the middle of one collective for a while ([`Options::stall`]),
//! and what that does to its ring neighbours: the rank sending to it cannot hand it the held
//! steps (its receives are not posted: SendPeerWait repeats, no SendWait), the rank receiving
//! from it gets no data for them (its sends that forward that data wait for the GPU).
//!
//! [`Options::stall`]: super::Options::stall

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
    /// Until the stalled rank resumes.
    Until(Instant),
    /// The stalled rank has not stopped yet: it will not post this step's counterpart before
    /// it does.
    Unknown,
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

//! The consumer's state of one communicator slot: its bookkeeping of each window (what was
//! scanned, which events are open) and of the communicator (its table of open operations, the shed
//! controller, when it was last active). Started over by each `register`.
//! Called on: whoever holds the communicator's consumer lock.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use super::pending_ttl;
use crate::aggregate::OpenOps;
use crate::aggregate::flight::Flight;
use crate::comm::shed::Controller;
use crate::comm::{self, WINDOWS};
use crate::config::Config;
use crate::record::CommMeta;
use crate::record::handle::LANES;

/// Consumer-side bookkeeping of one window.
#[derive(Clone)]
pub(super) struct Track {
    /// When it became FILLING or CLOSING.
    pub(super) since: Instant,
    /// Sequence number of this window cycle (windows are numbered as they open).
    pub(super) seq: u64,
    /// Per lane, published records already scanned while FILLING or CLOSING.
    pub(super) scanned: [u32; LANES],
    /// Events started and not yet stopped among the scanned records.
    pub(super) open: i64,
    /// Per start slot (a bit each), what was read of its event ([`Life`]): its start, its first
    /// stop, and (receive ops) its InProgress.
    pub(super) started: Vec<u64>,
    pub(super) stopped: Vec<u64>,
    pub(super) progressing: Vec<u64>,
}

/// The consumer's state of one communicator slot, started over by each `register`.
pub struct Consumer {
    pub(super) meta: CommMeta,
    pub(super) tracks: [Track; WINDOWS],
    pub(super) interval: Duration,
    /// The current window as the consumer last saw it (producers may have switched since).
    pub(super) current: usize,
    /// Operations still open across windows.
    pub(super) open: OpenOps,
    /// Sequence number of the next window to open.
    pub(super) next_seq: u64,
    /// No progress for this long is a hang.
    pub(super) hang: Duration,
    /// The shed level of the windows it arms.
    pub(super) shed: Controller,
    /// The last poll that found a claim in the current window or a window not yet processed.
    pub(super) active: Instant,
    /// What the communicator holds was given back since ([`Slot::release_idle`]).
    pub(super) released: bool,
}

impl Consumer {
    /// The consumer state of a communicator slot before its first `register`.
    pub fn new(config: &Config) -> Consumer {
        Consumer {
            meta: CommMeta {
                hash: 0,
                name: String::new(),
                rank: 0,
                nranks: 0,
                nnodes: 0,
                gpu: Default::default(),
            },
            tracks: std::array::from_fn(|_| Track::new(Instant::now())),
            interval: config.interval,
            current: 0,
            open: OpenOps::new(pending_ttl(config)),
            next_seq: 1,
            hang: config.hang_threshold,
            shed: Controller::default(),
            active: Instant::now(),
            released: false,
        }
    }

    /// The shed level the next window gets: the controller's, unless a test forces one.
    pub(super) fn wanted_level(&self) -> u8 {
        comm::forced().unwrap_or_else(|| self.shed.level())
    }

    /// Starts over for a newly registered communicator, window 0 current; returns the shed level
    /// of its first windows.
    pub fn reset(&mut self, meta: CommMeta, config: &Config) -> u8 {
        self.tracks = std::array::from_fn(|_| Track::new(Instant::now()));
        self.interval = config.interval;
        self.current = 0;
        self.open = OpenOps::new(pending_ttl(config));
        self.open.flight = Flight::new(meta.nranks);
        self.next_seq = 1;
        self.hang = config.hang_threshold;
        self.shed = Controller::default();
        self.active = Instant::now();
        self.released = false;
        self.meta = meta;
        self.wanted_level()
    }
}

impl Track {
    pub(super) fn new(since: Instant) -> Track {
        Track {
            since,
            seq: 0,
            scanned: [0; LANES],
            open: 0,
            started: Vec::new(),
            stopped: Vec::new(),
            progressing: Vec::new(),
        }
    }
}

/// Sets bit `i`.
pub(super) fn set_bit(bits: &mut Vec<u64>, i: u32) {
    let (word, bit) = (i as usize / 64, 1u64 << (i % 64));
    if bits.len() <= word {
        bits.resize(word + 1, 0);
    }
    bits[word] |= bit;
}

pub(super) fn has_bit(bits: &[u64], i: u32) -> bool {
    bits.get(i as usize / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
}

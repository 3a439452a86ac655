//! Per-communicator state: identity, the four windows, routing of records, drop counters, and the
//! consumer side that closes, processes and recycles windows.
//!
//! Communicators live in a fixed registry of [`MAX_COMMS`] slots. A slot's `Comm` is allocated on
//! first use and kept for the life of the process (type-stable), and reused by later
//! communicators with a new generation; handles and contexts carry (slot, generation), so a stale
//! one is recognised by a generation mismatch without touching freed memory.
//!
//! Routing: new events go to the current FILLING window, but only up to [`ROOT_SHARE`] of its
//! capacity, so the events already in it always have room for their children, states and stops.
//! Children go to their parent's window while it takes records (a Coll and its ProxyOps and
//! ProxySteps are processed together); states and stops go to their event's window.
//!
//! Threads: NCCL user and proxy threads call [`Comm::start`] and [`Comm::append`] (lock-free);
//! the telemetry thread and `finalize` call [`Comm::poll`] and [`Comm::finalize`] under the
//! communicator's consumer lock; `init` calls [`register`] under the registry lock.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard};

use crate::aggregate::{CommMeta, WindowId, WindowSummary, summarize};
use crate::config::Config;
use crate::event::{Body, Record};
use crate::handle::{CommId, Context, EPOCH_MASK, GEN_MASK, Handle, Kind, MAX_COMMS};
use crate::window::{Window, WindowState};

/// Windows per communicator.
pub const WINDOWS: usize = 4;
/// A CLOSING window waits at least this long for children of its last roots (a ProxyOp can
/// start just after its Coll stopped), then until nothing is open, at most the grace period.
pub const SETTLE: Duration = Duration::from_millis(20);
/// Share of a window's capacity open to new events (the rest is headroom for their children,
/// states and stops); the count trigger is capped to it too.
pub const ROOT_SHARE: (u64, u64) = (3, 4);
/// How long a sealed window's reader waits for a producer that claimed a slot but has not
/// published it; the record is then counted as unpublished and the window drains later.
const PUBLISH_WAIT: Duration = Duration::from_millis(10);
/// `state` bit of a live communicator.
const LIVE: u32 = 1 << 31;

/// Records that could not be kept, by reason.
#[derive(Default)]
pub struct Drops {
    /// No space: the window was full (or being sealed).
    pub full: AtomicU64,
    /// A state or stop for an event whose window was already processed.
    pub late: AtomicU64,
    /// Claimed but not published in time when the window was read.
    pub unpublished: AtomicU64,
}

impl Drops {
    fn reset(&self) {
        [&self.full, &self.late, &self.unpublished]
            .iter()
            .for_each(|c| c.store(0, Ordering::Relaxed));
    }
}

/// A snapshot of a communicator's drop counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropCounts {
    /// See [`Drops::full`].
    pub full: u64,
    /// See [`Drops::late`].
    pub late: u64,
    /// See [`Drops::unpublished`].
    pub unpublished: u64,
}

/// Consumer-side bookkeeping of one window.
#[derive(Clone)]
struct Track {
    /// When it became FILLING or CLOSING.
    since: Instant,
    /// Published records already scanned while CLOSING.
    scanned: u32,
    /// Events started and not yet stopped among the scanned records, plus KernelCh expected
    /// under scanned collectives.
    open: i64,
    /// Start slots seen (bit per slot), so only real starts count and only their first stop.
    started: Vec<u64>,
    /// Start slots whose stop was seen.
    stopped: Vec<u64>,
    /// KernelCh still expected per collective slot (KernelCh in the mask).
    kernels_due: HashMap<u32, u8>,
}

struct Consumer {
    meta: CommMeta,
    tracks: [Track; WINDOWS],
    interval: Duration,
    count_trigger: u64,
    /// Whether collectives get one KernelCh per channel (KernelCh in the activation mask).
    kernel_ch: bool,
}

/// One communicator's state.
pub struct Comm {
    /// Registry slot.
    index: u16,
    /// `generation | LIVE` while initialised, `generation` after finalize.
    state: AtomicU32,
    /// [`Context::tag`] of the communicator hash, for PXN matching and context checks.
    hash_tag: AtomicU64,
    /// Index of the FILLING window new roots go to.
    current: AtomicU8,
    /// Claims a new event may take in the current window.
    root_limit: u64,
    windows: [Window; WINDOWS],
    /// A child could not join its parent's (full) window: durations there are incomplete.
    spilled: [AtomicBool; WINDOWS],
    /// Drop counters (cumulative since `init`; consumers diff them).
    pub drops: CachePadded<Drops>,
    consumer: Mutex<Consumer>,
}

static COMMS: [OnceLock<&'static Comm>; MAX_COMMS] = [const { OnceLock::new() }; MAX_COMMS];
static REGISTRY: Mutex<()> = Mutex::new(());

/// Registers a communicator and opens its first window; `None` when every slot is live (or still
/// draining) or the windows cannot be allocated. Called on: NCCL's init thread.
pub fn register(meta: CommMeta, config: &Config) -> Option<CommId> {
    let _registry = REGISTRY.lock();
    let (slot, comm, mut c) = free_slot(config)?;
    let generation = (comm.state.load(Ordering::Relaxed) & GEN_MASK) % GEN_MASK + 1;
    c.tracks = std::array::from_fn(|_| Track::new(Instant::now()));
    c.interval = config.interval;
    c.count_trigger = u64::from(config.count_trigger).min(comm.root_limit);
    c.kernel_ch = config.event_mask & crate::bindings::ncclProfileKernelCh as i32 != 0;
    comm.hash_tag.store(Context::tag(meta.hash), Ordering::Relaxed);
    c.meta = meta;
    comm.drops.reset();
    comm.spilled.iter().for_each(|s| s.store(false, Ordering::Relaxed));
    comm.windows[0].open();
    comm.current.store(0, Ordering::Relaxed);
    // Release: everything above is visible to whoever sees the communicator live.
    comm.state.store(generation | LIVE, Ordering::Release);
    Some(CommId {
        slot: slot as u16,
        generation: generation as u16,
    })
}

/// The first slot not live, not being finalized (its consumer lock is free) and whose windows
/// are all READY (after recycling what a disabled communicator left), with its consumer lock;
/// allocates a new `Comm` after the last one in use.
fn free_slot(config: &Config) -> Option<(usize, &'static Comm, MutexGuard<'static, Consumer>)> {
    for (i, cell) in COMMS.iter().enumerate() {
        let comm = match cell.get() {
            Some(comm) => *comm,
            None => {
                let comm: &'static Comm = Box::leak(Box::new(Comm::new(i as u16, config)?));
                *cell.get_or_init(|| comm)
            }
        };
        if comm.state.load(Ordering::Acquire) & LIVE != 0 {
            continue;
        }
        let Some(consumer) = comm.consumer.try_lock() else {
            continue;
        };
        // Recycle every window (no short-circuit), then require all of them READY.
        if comm.windows.iter().filter(|w| !w.recycle()).count() == 0 {
            return Some((i, comm, consumer));
        }
    }
    None
}

/// The live communicator `id`, or `None` when stale. Called on: any thread; lock-free.
#[inline]
pub fn get(id: CommId) -> Option<&'static Comm> {
    let comm = *COMMS.get(usize::from(id.slot))?.get()?;
    // Acquire: pairs with `register`'s Release.
    (comm.state.load(Ordering::Acquire) == u32::from(id.generation) | LIVE).then_some(comm)
}

/// The live communicator a context of ours names: slot, generation and hash tag must all match.
/// Called on: any thread; lock-free.
#[inline]
pub fn get_context(ctx: Context) -> Option<&'static Comm> {
    get(ctx.comm).filter(|c| c.hash_tag.load(Ordering::Relaxed) == ctx.hash_tag)
}

/// The live communicator whose hash has this [`Context::tag`]: the same communicator seen from
/// another process's PXN op. Called on: proxy threads; scans the slots allocated so far.
pub fn find_by_hash_tag(hash_tag: u64) -> Option<(CommId, &'static Comm)> {
    all().enumerate().find_map(|(i, comm)| {
        let state = comm.state.load(Ordering::Acquire);
        (state & LIVE != 0 && comm.hash_tag.load(Ordering::Relaxed) == hash_tag).then_some((
            CommId {
                slot: i as u16,
                generation: (state & GEN_MASK) as u16,
            },
            comm,
        ))
    })
}

/// Every communicator slot allocated so far, live or not (slots are allocated in order).
pub fn all() -> impl Iterator<Item = &'static Comm> {
    COMMS.iter().map_while(|cell| cell.get().copied())
}

impl Track {
    fn new(since: Instant) -> Track {
        Track {
            since,
            scanned: 0,
            open: 0,
            started: Vec::new(),
            stopped: Vec::new(),
            kernels_due: HashMap::new(),
        }
    }
}

/// Sets bit `i`; returns whether it was clear.
fn set_bit(bits: &mut Vec<u64>, i: u32) -> bool {
    let (word, bit) = (i as usize / 64, 1u64 << (i % 64));
    if bits.len() <= word {
        bits.resize(word + 1, 0);
    }
    let fresh = bits[word] & bit == 0;
    bits[word] |= bit;
    fresh
}

fn has_bit(bits: &[u64], i: u32) -> bool {
    bits.get(i as usize / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
}

impl Comm {
    fn new(index: u16, config: &Config) -> Option<Comm> {
        let w = || Window::new(config.capacity);
        Some(Comm {
            index,
            state: AtomicU32::new(0),
            hash_tag: AtomicU64::new(0),
            current: AtomicU8::new(0),
            root_limit: u64::from(config.capacity) * ROOT_SHARE.0 / ROOT_SHARE.1,
            windows: [w()?, w()?, w()?, w()?],
            spilled: std::array::from_fn(|_| AtomicBool::new(false)),
            drops: CachePadded::new(Drops::default()),
            consumer: Mutex::new(Consumer {
                meta: CommMeta {
                    hash: 0,
                    name: String::new(),
                    rank: 0,
                    nranks: 0,
                    nnodes: 0,
                },
                tracks: std::array::from_fn(|_| Track::new(Instant::now())),
                interval: config.interval,
                count_trigger: u64::from(config.count_trigger),
                kernel_ch: false,
            }),
        })
    }

    /// Whether a communicator currently uses this slot.
    pub fn is_live(&self) -> bool {
        self.state.load(Ordering::Acquire) & LIVE != 0
    }

    /// Generation of the slot's current (or last) communicator; changes with every `register`.
    pub fn generation(&self) -> u16 {
        (self.state.load(Ordering::Acquire) & GEN_MASK) as u16
    }

    /// Records the start of a new event of `kind` and returns its handle; `None` (counted) when
    /// no window has space. A child goes to the window of `parent` (one of our handles) while
    /// that window still takes records; otherwise, and for roots, to the current window.
    /// Called on: NCCL user and proxy threads; lock-free, allocation-free.
    #[inline]
    pub fn start(&self, id: CommId, kind: Kind, parent: Option<Handle>, ts: u64, body: Body) -> Option<u64> {
        let push = |w: u8, limit: u64| {
            let window = self.windows.get(usize::from(w)).filter(|win| win.claimed() < limit)?;
            let claim = window.push(|c| Record {
                id: Handle {
                    comm: id,
                    window: w,
                    epoch: c.epoch & EPOCH_MASK,
                    kind,
                    slot: c.slot,
                }
                .encode(),
                ts,
                body,
            })?;
            Some(
                Handle {
                    comm: id,
                    window: w,
                    epoch: claim.epoch & EPOCH_MASK,
                    kind,
                    slot: claim.slot,
                }
                .encode(),
            )
        };
        if let Some(p) = parent.filter(|p| p.comm == id && self.epoch_matches(*p)) {
            if let Some(h) = push(p.window, u64::MAX) {
                return Some(h);
            }
            // The parent's window is full or sealed: the parent's duration there is incomplete.
            if let Some(spilled) = self.spilled.get(usize::from(p.window)) {
                spilled.store(true, Ordering::Relaxed);
            }
        }
        let handle = push(self.current.load(Ordering::Relaxed), self.root_limit);
        if handle.is_none() {
            self.drops.full.fetch_add(1, Ordering::Relaxed);
        }
        handle
    }

    /// Records a state or stop of the event `handle` into its window; counted as late when that
    /// window was already processed, as full when it has no room left.
    /// Called on: NCCL user and proxy threads; lock-free.
    #[inline]
    pub fn append(&self, handle: Handle, ts: u64, body: Body) {
        if !self.epoch_matches(handle) {
            self.drops.late.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let window = self.windows.get(usize::from(handle.window));
        if window
            .and_then(|w| {
                w.push(|_| Record {
                    id: handle.encode(),
                    ts,
                    body,
                })
            })
            .is_none()
        {
            self.drops.full.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn epoch_matches(&self, h: Handle) -> bool {
        self.windows
            .get(usize::from(h.window))
            .is_some_and(|w| w.epoch() & EPOCH_MASK == h.epoch)
    }

    /// Consumer step: finishes draining windows, closes the current window on the count or time
    /// trigger and processes every CLOSING window whose events finished (after [`SETTLE`]) or
    /// whose grace period (one interval) ran out. Called on: the telemetry thread.
    pub fn poll(&self, now: Instant, secs_per_tick: f64) -> Vec<WindowSummary> {
        let mut c = self.consumer.lock();
        for (i, w) in self.windows.iter().enumerate() {
            if w.state() == WindowState::Processing {
                w.reset(c.tracks[i].scanned);
            }
        }
        if self.state.load(Ordering::Acquire) & LIVE == 0 {
            return Vec::new();
        }
        self.rotate_if_due(&mut c, now);
        let grace = c.interval;
        (0..WINDOWS)
            .filter(|&i| self.windows[i].state() == WindowState::Closing)
            .filter_map(|i| {
                self.scan(&mut c, i);
                let t = &c.tracks[i];
                let age = now.saturating_duration_since(t.since);
                let done = age >= SETTLE && t.open <= 0;
                (done || age >= grace).then(|| self.process(&mut c, i, secs_per_tick))?
            })
            .collect()
    }

    /// Marks the communicator finalized (later callbacks with its handles are stale) and
    /// processes every window that holds records, oldest first, unfinished events included.
    /// Returns `None` when `id` is not live. Called on: the thread freeing the communicator.
    pub fn finalize(&self, id: CommId, secs_per_tick: f64) -> Option<Vec<WindowSummary>> {
        let mut c = self.consumer.lock();
        let live = u32::from(id.generation) | LIVE;
        // AcqRel: new lookups fail from here on; the windows below are read after.
        self.state
            .compare_exchange(live, u32::from(id.generation), Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        let mut order: Vec<usize> = (0..WINDOWS)
            .filter(|&i| matches!(self.windows[i].state(), WindowState::Filling | WindowState::Closing))
            .collect();
        order.sort_by_key(|&i| (self.windows[i].state() == WindowState::Filling, c.tracks[i].since));
        let summaries = order
            .into_iter()
            .filter_map(|i| {
                self.scan(&mut c, i);
                self.process(&mut c, i, secs_per_tick)
            })
            .collect();
        self.windows.iter().for_each(Window::release);
        Some(summaries)
    }

    /// Stops profiling communicator `id` without processing its windows (after a caught panic);
    /// its handles become stale and `finalize` finds nothing to do. Called on: any thread.
    pub fn disable(&self, id: CommId) {
        let live = u32::from(id.generation) | LIVE;
        // AcqRel: as in `finalize`.
        let _ = self
            .state
            .compare_exchange(live, u32::from(id.generation), Ordering::AcqRel, Ordering::Acquire);
    }

    fn rotate_if_due(&self, c: &mut Consumer, now: Instant) {
        let cur = usize::from(self.current.load(Ordering::Relaxed)) % WINDOWS;
        let window = &self.windows[cur];
        let claimed = window.claimed();
        let due = now.saturating_duration_since(c.tracks[cur].since) >= c.interval;
        if claimed == 0 && due {
            c.tracks[cur].since = now;
        }
        if !(claimed >= c.count_trigger || claimed > 0 && due) {
            return;
        }
        // Without a READY window the current one keeps filling (until full: drops are counted).
        let Some(next) = (1..WINDOWS)
            .map(|k| (cur + k) % WINDOWS)
            .find(|&i| self.windows[i].open())
        else {
            return;
        };
        c.tracks[next] = Track::new(now);
        self.current.store(next as u8, Ordering::Relaxed);
        window.close();
        c.tracks[cur] = Track::new(now);
    }

    /// This window's identity as handles name it.
    fn window_id(&self, i: usize) -> WindowId {
        let comm = CommId {
            slot: self.index,
            generation: self.generation(),
        };
        WindowId {
            comm,
            window: i as u8,
            epoch: self.windows[i].epoch(),
        }
    }

    /// Counts open events among newly published records of window `i`: a start opens its event
    /// (a collective also its expected KernelCh), the first stop of a start seen here closes it;
    /// records of other windows, epochs or communicators are ignored.
    fn scan(&self, c: &mut Consumer, i: usize) {
        let (window, me) = (&self.windows[i], self.window_id(i));
        let kernel_ch = c.kernel_ch;
        let t = &mut c.tracks[i];
        let end = window.claimed().min(u64::from(window.capacity())) as u32;
        while t.scanned < end {
            let Some(record) = window.published(t.scanned) else {
                break;
            };
            let slot = t.scanned;
            t.scanned += 1;
            let Some(h) = Handle::decode(record.id)
                .filter(|h| h.comm == me.comm && usize::from(h.window) == i && h.epoch == me.epoch & EPOCH_MASK)
            else {
                continue;
            };
            match record.body {
                body if body.opens() && h.slot == slot => {
                    set_bit(&mut t.started, slot);
                    t.open += 1;
                    if let (Body::Coll(coll), true) = (body, kernel_ch) {
                        t.open += i64::from(coll.n_channels);
                        t.kernels_due.insert(slot, coll.n_channels);
                    }
                    let parent = match body {
                        Body::KernelCh { parent, .. } => Handle::decode(parent)
                            .filter(|p| p.comm == h.comm && p.window == h.window && p.epoch == h.epoch),
                        _ => None,
                    };
                    if let Some(due) = parent.and_then(|p| t.kernels_due.get_mut(&p.slot)).filter(|d| **d > 0) {
                        *due -= 1;
                        t.open -= 1;
                    }
                }
                Body::Stop if has_bit(&t.started, h.slot) && set_bit(&mut t.stopped, h.slot) => t.open -= 1,
                _ => {}
            }
        }
    }

    /// Seals window `i`, reads its records (waiting briefly for claimed, unpublished slots),
    /// summarises them and recycles the window once every claimed slot is published.
    fn process(&self, c: &mut Consumer, i: usize, secs_per_tick: f64) -> Option<WindowSummary> {
        let (window, id) = (&self.windows[i], self.window_id(i));
        let forced = c.tracks[i].open > 0;
        let n = window.seal()?;
        let deadline = Instant::now() + PUBLISH_WAIT;
        let filler = Record {
            id: 0,
            ts: 0,
            body: Body::Stop,
        };
        let records: Vec<Record> = (0..n)
            .map(|s| {
                loop {
                    match window.published(s) {
                        Some(r) => break r,
                        None if Instant::now() >= deadline => {
                            self.drops.unpublished.fetch_add(1, Ordering::Relaxed);
                            break filler;
                        }
                        None => std::thread::yield_now(),
                    }
                }
            })
            .collect();
        let mut summary = summarize(&records, id, &c.meta, secs_per_tick, forced);
        if self.spilled[i].swap(false, Ordering::Relaxed) {
            summary.mark_spilled();
        }
        // A slot still unpublished keeps the window draining; `poll` resets it later.
        c.tracks[i] = Track {
            scanned: n,
            ..Track::new(Instant::now())
        };
        window.reset(n);
        Some(summary)
    }

    /// Snapshot of the drop counters.
    pub fn drop_counts(&self) -> DropCounts {
        DropCounts {
            full: self.drops.full.load(Ordering::Relaxed),
            late: self.drops.late.load(Ordering::Relaxed),
            unpublished: self.drops.unpublished.load(Ordering::Relaxed),
        }
    }

    /// Metadata of the communicator (last registered).
    pub fn meta(&self) -> CommMeta {
        self.consumer.lock().meta.clone()
    }
}

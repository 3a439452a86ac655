//! The consumer side of every communicator, owned by the telemetry thread: closing windows on
//! their count or time trigger, tracking which events are still open
//! ([`crate::aggregate::lifetime`] decides) and handing every record to the operations in flight
//! as soon as it is published (with a hang check per poll), sealing and summarising windows, and
//! recycling them. Every consumer edge of the window state machine is taken here, under the
//! communicator's consumer lock ([`Comm::lock`]) and then its [`Consumer`] state's, in that order.
//! One [`Slot::poll`] returns all the interval needs of a communicator: the summaries, a hang
//! episode that started (with its WARN line) and the communicator's state ([`CommState`]).
//! Called on: the telemetry thread (`poll`, `drain`), the thread freeing the communicator
//! (`finalize`), NCCL's init thread ([`register`]).
#![forbid(unsafe_code)]

use std::ops::{Deref, DerefMut};
use std::sync::OnceLock;
#[cfg(any(test, feature = "testing"))]
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};

use super::CommState;
use crate::aggregate::lifetime::Life;
use crate::aggregate::link::summarize_in;
use crate::aggregate::{Frontier, Lanes, Sealed, WindowId, WindowSummary, release};
use crate::buffer::window::{self, Window, WindowState};
use crate::comm::shed::{SLOT_BYTES, Signals};
use crate::comm::{self, Comm, Held, LIVE, LOST, NONE, Route, WINDOWS};
use crate::config::Config;
use crate::record::handle::{CommId, EPOCH_MASK, Handle, Kind, LANES, MAX_COMMS};
use crate::record::{Body, CommMeta, Record};

/// A CLOSING window waits at least this long for children of its last roots (a ProxyOp can
/// start just after its Coll stopped), then until nothing is open, at most the grace period.
pub const SETTLE: Duration = Duration::from_millis(20);
/// Longest a CLOSING window waits (from its closing) for operations of it that still progress
/// after its grace period (a collective longer than the interval): their stops land in it. Then
/// it is processed with them open and their later states and stops are lost (counted late).
pub const HOLD_PROGRESSING: Duration = Duration::from_secs(60);
/// How soon the telemetry thread looks again at a [`Slot::busy`] communicator: between two
/// looks a window may take a quarter of its capacity beyond the count trigger (up to the root
/// share) before new events are dropped, 25,000 records at the default capacity, so 1 ms keeps
/// up with 25 M records/s per communicator where the usual 10 ms tick keeps up with 2.5 M.
pub const BUSY_TICK: Duration = Duration::from_millis(1);

/// How long a sealed window's reader waits for a producer that claimed a slot but has not
/// published it; the record is then counted as unpublished and the window drains later.
const PUBLISH_WAIT: Duration = Duration::from_millis(10);

/// Test seam: nanoseconds `process` sleeps per record read ([`set_throttle`]).
#[cfg(any(test, feature = "testing"))]
static THROTTLE: AtomicU64 = AtomicU64::new(0);

/// Makes every consumer sleep `ns_per_record` nanoseconds per record of each window it processes
/// (0: not at all), so that tests and benches can offer many times what the consumer takes.
#[cfg(any(test, feature = "testing"))]
pub fn set_throttle(ns_per_record: u64) {
    THROTTLE.store(ns_per_record, Ordering::Relaxed);
}

mod memory;
mod state;

#[cfg(all(test, nccl_loom))]
mod loom;
#[cfg(test)]
mod tests;

pub use memory::release_scratch;
pub use state::Consumer;
use state::{Track, has_bit, set_bit};
use memory::{SCRATCH, SCRATCH_WINDOWS, Scratch};

/// Per registry slot, the consumer's state of its communicator.
static STATES: [OnceLock<Mutex<Consumer>>; MAX_COMMS] = [const { OnceLock::new() }; MAX_COMMS];

/// A communicator with the consumer's state of it: what the consumer works on.
#[derive(Clone, Copy)]
pub struct Slot<'a> {
    /// The communicator.
    pub comm: &'a Comm,
    state: &'a Mutex<Consumer>,
}

impl<'a> Slot<'a> {
    /// `comm` with `state` as its consumer state, outside the registry (tests).
    #[cfg(test)]
    pub fn new(comm: &'a Comm, state: &'a Mutex<Consumer>) -> Slot<'a> {
        Slot { comm, state }
    }

    /// Takes the communicator's consumer lock, then its consumer state.
    fn lock(&self) -> Locked<'a> {
        let held = self.comm.lock();
        Locked {
            held,
            c: self.state.lock(),
        }
    }
}

/// The registry's communicator `comm` with its consumer state (every registry slot has one).
pub fn slot(comm: &'static Comm) -> Option<Slot<'static>> {
    let state = STATES.get(usize::from(comm.index))?;
    let state = state.get_or_init(|| Mutex::new(Consumer::new(Config::global())));
    Some(Slot { comm, state })
}

/// Every communicator slot allocated so far ([`comm::all`]), with its consumer state.
pub fn all() -> impl Iterator<Item = Slot<'static>> {
    comm::all().filter_map(slot)
}

/// Registers a communicator ([`comm::register`]), its consumer state started over. Called on:
/// NCCL's init thread.
pub fn register(meta: CommMeta, config: &Config) -> Option<CommId> {
    let reset = |comm| slot(comm).map_or(0, |s| s.state.lock().reset(meta.clone(), config));
    comm::register(&meta, config, reset)
}

/// A communicator's consumer lock and its consumer state, held in that order.
struct Locked<'a> {
    held: Held<'a>,
    c: MutexGuard<'a, Consumer>,
}

impl Locked<'_> {
    /// The windows in the consumer role.
    fn windows(&self) -> [window::Consumer<'_>; WINDOWS] {
        self.held.windows()
    }

    /// The consumer state and the windows in the consumer role, at once.
    fn split(&mut self) -> (&mut Consumer, [window::Consumer<'_>; WINDOWS]) {
        (&mut self.c, self.held.windows())
    }
}

impl Deref for Locked<'_> {
    type Target = Consumer;

    fn deref(&self) -> &Consumer {
        &self.c
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Consumer {
        &mut self.c
    }
}

/// What one poll of a communicator yields: all the telemetry thread's interval needs of it.
#[derive(Debug, Default)]
pub struct Polled {
    /// Windows processed and operations released, oldest first.
    pub summaries: Vec<WindowSummary>,
    /// The WARN line of a hang episode that started in this poll.
    pub hang: Option<String>,
    /// The communicator, its counters and progress now (when the poll was asked for them).
    pub state: Option<CommState>,
}

/// How long children recorded in a later window wait for their operation's window: longer than
/// a window can stay CLOSING ([`longest_closing`]), plus an interval and the settle time.
fn pending_ttl(config: &Config) -> Duration {
    config.interval + longest_closing(config.interval) + SETTLE
}

/// The longest a window stays CLOSING at interval `interval`: its grace period (one interval),
/// held while an operation of it progresses up to [`HOLD_PROGRESSING`].
fn longest_closing(interval: Duration) -> Duration {
    interval.max(HOLD_PROGRESSING)
}

impl Slot<'_> {
    /// [`Slot::poll_loaded`] with an idle telemetry thread, its summaries (tests and benches).
    #[cfg(any(test, feature = "testing"))]
    pub fn poll(&self, now: Instant, secs_per_tick: f64) -> Vec<WindowSummary> {
        self.poll_loaded(now, secs_per_tick, 0.0, false).summaries
    }

    /// Consumer step: finishes draining windows, closes the current window on the count or time
    /// trigger, processes every CLOSING window whose events finished (after [`SETTLE`]) or whose
    /// grace period (one interval, held while an operation of it progresses, up to
    /// [`HOLD_PROGRESSING`]) ran out, oldest first, and releases the operations of the
    /// table of open operations that are due; checks for a hang; then decides the shed level of
    /// the windows armed next from what the pass saw and `busy`, the fraction of recent time the
    /// telemetry thread spent working. With `report`, the communicator's state comes too.
    /// Called on: the telemetry thread.
    pub fn poll_loaded(&self, now: Instant, secs_per_tick: f64, busy: f64, report: bool) -> Polled {
        let mut c = self.lock();
        let mut polled = self.poll_locked(&mut c, now, secs_per_tick, busy);
        polled.state = report.then(|| self.state(&mut c, now));
        polled
    }

    /// [`Slot::poll_loaded`] under the locks, without the state.
    fn poll_locked(&self, c: &mut Locked<'_>, now: Instant, secs_per_tick: f64, busy: f64) -> Polled {
        for (i, w) in c.windows().into_iter().enumerate() {
            if w.state() == WindowState::Processing {
                w.reset(self.keep(c.tracks[i].scanned));
            }
        }
        if self.comm.state.load(Ordering::Acquire) & LIVE == 0 {
            return Polled::default();
        }
        self.rotate_if_due(c, now);
        let current = c.current;
        if self.comm.windows[current].state() == WindowState::Filling {
            self.scan(c, current, now);
        }
        let grace = c.interval;
        let mut closing: Vec<usize> = (0..WINDOWS)
            .filter(|&i| self.comm.windows[i].state() == WindowState::Closing)
            .collect();
        closing.sort_by_key(|&i| c.tracks[i].since);
        let mut summaries: Vec<WindowSummary> = closing
            .into_iter()
            .filter_map(|i| {
                self.scan(c, i, now);
                let t = &c.tracks[i];
                let age = now.saturating_duration_since(t.since);
                let done = age >= SETTLE && t.open <= 0;
                // Past its grace period, held while an operation of it progresses (asked only then).
                let due = || {
                    age >= grace
                        && !(age < longest_closing(grace)
                            && c.open.flight.progressing_in(i as u8, self.comm.windows[i].epoch(), now, grace))
                };
                (done || due()).then(|| self.process(c, i, secs_per_tick, now))?
            })
            .collect();
        summaries.extend(self.release_idle(c, secs_per_tick, now));
        if summaries.is_empty() {
            let at = self.frontier(c, now, None, false);
            let c = &mut **c;
            summaries.extend(release(self.window_id(0), &c.meta, secs_per_tick, &mut c.open, at));
            // Idle: what its operations held when it went idle leaves after it (the hold): the
            // capacity goes with it.
            if c.released {
                c.open.shrink();
            }
        }
        let threshold = c.hang;
        let hang = c.open.flight.check(now, threshold).map(|hang| {
            self.learn_identity(c);
            let m = &c.meta;
            // ABI v1–v3 never tell the communicator's size.
            let of = if m.nranks > 0 { format!("/{}", m.nranks) } else { String::new() };
            format!(
                "hang: communicator {:#x} '{}' rank {}{of}: {hang} (threshold {} s)",
                m.hash,
                m.name,
                m.rank,
                threshold.as_secs_f64()
            )
        });
        let d = self.comm.drop_counts();
        let signals = Signals {
            drops: c.shed.drops_since(d.full + d.late + d.unpublished),
            processed: summaries.iter().map(|s| s.stats.records).sum(),
            windows: summaries.iter().map(|s| s.stats.windows).sum(),
            backlog: (0..WINDOWS)
                .filter(|&i| matches!(self.comm.windows[i].state(), WindowState::Closing | WindowState::Processing))
                .count(),
            busy,
            buffered: self.buffered(),
            elapsed: c.shed.elapsed_since(now),
            interval: c.interval,
        };
        c.shed.observe(signals);
        self.drain_counts(&c.meta, &mut summaries);
        Polled {
            summaries,
            hang,
            ..Polled::default()
        }
    }

    /// The communicator, its counters and its progress at `now`.
    fn state(&self, c: &mut Locked<'_>, now: Instant) -> CommState {
        self.learn_identity(c);
        CommState {
            slot: usize::from(self.comm.index),
            generation: self.comm.generation(),
            meta: c.meta.clone(),
            counts: self.comm.drop_counts(),
            live: self.comm.is_live(),
            progress: c.open.flight.snapshot(now),
        }
    }

    /// Bytes of the records claimed in the FILLING and CLOSING windows.
    fn buffered(&self) -> u64 {
        let windows = self.comm.windows.iter().filter(|w| matches!(w.state(), WindowState::Filling | WindowState::Closing));
        // Capped: a window sealed meanwhile counts as full.
        let lane = |w: &Window, l: usize| w.lane_claimed(l).min(u64::from(w.capacity())) * SLOT_BYTES[l];
        windows.map(|w| (0..LANES).map(|l| lane(w, l)).sum::<u64>()).sum()
    }

    /// The shed level the controller wants for the windows armed next. Called on: the telemetry
    /// thread.
    pub fn shed_level(&self) -> u8 {
        self.state.lock().shed.level()
    }

    /// ABI v1–v3, whose `init` tells neither: takes the communicator's hash and our rank from
    /// its first Coll/P2p once one told them (Release in `identify`), for every summary, hang
    /// line and counter from then on.
    fn learn_identity(&self, c: &mut Consumer) {
        if c.meta.rank < 0
            && let Some((hash, rank)) = self.comm.learned()
        {
            (c.meta.hash, c.meta.rank) = (hash, rank);
        }
    }

    /// Closes the current window if its count or time trigger is due (as [`Slot::poll`] does
    /// first), without processing anything. Called on: the telemetry thread.
    pub fn rotate(&self, now: Instant) {
        let mut c = self.lock();
        if self.comm.is_live() {
            self.rotate_if_due(&mut c, now);
        }
    }

    /// Whether the current window holds half the count trigger or more: records arrive fast
    /// enough that the telemetry thread should look again soon ([`BUSY_TICK`]), before the window
    /// fills past the trigger into the headroom kept for children and stops.
    /// Called on: the telemetry thread.
    pub fn busy(&self) -> bool {
        let cur = self.comm.current_window();
        // Saturating: a sealed window's lanes count as huge (the current one may be sealed by a
        // racing switch).
        self.comm.is_live() && self.comm.windows[cur].claimed().saturating_mul(2) >= self.comm.count_trigger
    }

    /// Marks the communicator finalized (later callbacks with its handles are stale) and
    /// processes every window that holds records, oldest first, unfinished events included, and
    /// every operation still held. Returns `None` when `id` is not live. Called on: the thread
    /// freeing the communicator.
    pub fn finalize(&self, id: CommId, secs_per_tick: f64) -> Option<Vec<WindowSummary>> {
        let mut c = self.lock();
        let live = u32::from(id.generation) | LIVE;
        // AcqRel: new lookups fail from here on; the windows below are read after.
        self.comm.state
            .compare_exchange(live, u32::from(id.generation), Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        let summaries = self.process_all(&mut c, secs_per_tick);
        c.windows().iter().for_each(|w| w.release());
        Some(summaries)
    }

    /// At process exit: processes every window of a live communicator that holds records, and
    /// every operation still held, as `finalize` does, but leaves the communicator live with a
    /// fresh FILLING window (callbacks may still come). Needs no free window. Called on: the
    /// telemetry thread, for the exit flush.
    pub fn drain(&self, secs_per_tick: f64) -> Polled {
        let mut c = self.lock();
        let mut summaries = Vec::new();
        if self.comm.is_live() {
            summaries = self.process_all(&mut c, secs_per_tick);
            if let Some(next) = c.windows().iter().position(|w| w.open()) {
                self.make_current(&mut c, next, Instant::now());
                let level = c.wanted_level();
                self.comm.route.store(Route::alone(next as u8, level).pack(), Ordering::Relaxed);
                self.arm(&c);
            }
        }
        Polled {
            summaries,
            state: Some(self.state(&mut c, Instant::now())),
            ..Polled::default()
        }
    }

    /// Processes every FILLING or CLOSING window, oldest first, then releases the whole table of
    /// open operations.
    fn process_all(&self, c: &mut Locked<'_>, secs_per_tick: f64) -> Vec<WindowSummary> {
        // The armed standby (or an orphan of a race) holds nothing: back to READY, unreported.
        // One atomic step, so that a producer switching at this moment is not undone.
        let none = Route {
            current: 0,
            standby: NONE,
            level: 0,
            standby_level: 0,
        };
        self.comm.route.fetch_or(none.pack(), Ordering::AcqRel);
        let current = self.comm.current_window();
        for (i, w) in c.windows().into_iter().enumerate() {
            if i != current && w.state() == WindowState::Filling && w.claimed() == 0 && w.seal().is_some() {
                w.reset([0; LANES]);
            }
        }
        let mut order: Vec<usize> = (0..WINDOWS)
            .filter(|&i| matches!(self.comm.windows[i].state(), WindowState::Filling | WindowState::Closing))
            .collect();
        order.sort_by_key(|&i| (self.comm.windows[i].state() == WindowState::Filling, c.tracks[i].since));
        let now = Instant::now();
        let mut summaries: Vec<WindowSummary> = order
            .into_iter()
            .filter_map(|i| {
                self.scan(c, i, now);
                self.process(c, i, secs_per_tick, now)
            })
            .collect();
        let at = self.frontier(c, now, None, true);
        let c = &mut **c;
        summaries.extend(release(self.window_id(0), &c.meta, secs_per_tick, &mut c.open, at));
        self.drain_counts(&c.meta, &mut summaries);
        release_scratch();
        summaries
    }


    /// Catches up with switches of the current window, closes it on the count or time trigger
    /// (switching to the standby window), and arms a standby window when there is none. An
    /// empty current window whose shed level is not the wanted one switches too: operations
    /// counted without a record claim nothing, so neither trigger would ever fire.
    fn rotate_if_due(&self, c: &mut Locked<'_>, now: Instant) {
        self.notice(c, now);
        let cur = c.current;
        let claimed = self.comm.windows[cur].claimed();
        let due = now.saturating_duration_since(c.tracks[cur].since) >= c.interval;
        if claimed == 0 && due {
            c.tracks[cur].since = now;
        }
        let relevel = claimed == 0 && self.comm.level_now() != c.wanted_level();
        if claimed >= self.comm.count_trigger || claimed > 0 && due || relevel {
            // Without a standby (no READY window) the current one keeps filling (until full:
            // drops are counted).
            self.arm(c);
            if self.comm.switch_to_standby(cur as u8) {
                self.notice(c, now);
            }
        }
        self.arm(c);
    }

    /// Catches up with a switch of the current window a producer (or [`Slot::rotate_if_due`])
    /// made: numbers the new current window as the next cycle and closes every other FILLING
    /// window that holds records (the one it replaced and, after a race, any skipped one).
    fn notice(&self, c: &mut Locked<'_>, now: Instant) {
        let cur = self.comm.current_window();
        if cur == c.current {
            return;
        }
        self.make_current(c, cur, now);
        let (c, windows) = c.split();
        for (i, window) in windows.into_iter().enumerate() {
            if i != cur && window.state() == WindowState::Filling && window.claimed() > 0 {
                window.close();
                // What was scanned while it filled stays scanned.
                c.tracks[i].since = now;
            }
        }
    }

    /// Arms a standby window at the level the consumer wants ([`Comm::arm`]).
    fn arm(&self, c: &Locked<'_>) {
        self.comm.arm(&c.held, c.current, c.wanted_level());
    }

    /// Makes `next` the window the consumer knows as current, numbered as the next cycle.
    fn make_current(&self, c: &mut Consumer, next: usize, now: Instant) {
        c.tracks[next] = Track {
            seq: c.next_seq,
            ..Track::new(now)
        };
        c.next_seq += 1;
        c.current = next;
    }

    /// Where the consumer is at `now`, window `processing` counted as processed: the FILLING
    /// window's sequence number, and the highest one up to which no window can still bring
    /// records (an empty FILLING window brings none).
    fn frontier(&self, c: &Consumer, now: Instant, processing: Option<usize>, flush: bool) -> Frontier {
        let filling = c.tracks[c.current].seq;
        let unsettled = (0..WINDOWS)
            .filter(|&i| Some(i) != processing)
            .filter(|&i| match self.comm.windows[i].state() {
                WindowState::Closing => true,
                WindowState::Filling => self.comm.windows[i].claimed() > 0,
                WindowState::Ready | WindowState::Processing => false,
            });
        let settled = unsettled
            .map(|i| c.tracks[i].seq)
            .min()
            .map_or(filling, |s| s.saturating_sub(1));
        Frontier {
            now,
            filling,
            settled,
            flush,
            lost_held: self.comm.lost_held.swap(false, Ordering::Relaxed),
            drops: {
                let d = self.comm.drop_counts();
                d.full + d.late + d.unpublished
            },
        }
    }

    /// This window's identity as handles name it.
    fn window_id(&self, i: usize) -> WindowId {
        let comm = CommId {
            slot: self.comm.index,
            generation: self.comm.generation(),
        };
        WindowId {
            comm,
            window: i as u8,
            epoch: self.comm.windows[i].epoch(),
        }
    }

    /// Hands newly published records of window `i` to the operations in flight, and counts open
    /// events among them: a start opens its event
    /// (a receive op only once InProgress, since NCCL never stops receive-side ops it does not
    /// progress), the first stop of a start seen here closes it; records of other windows,
    /// epochs or communicators are ignored. KernelCh that come after their collective's window
    /// closed are linked through the table of open operations: whether a collective gets any
    /// depends on the mask NCCL sampled at its API call, which the plugin cannot see.
    fn scan(&self, c: &mut Locked<'_>, i: usize, now: Instant) {
        let (c, windows) = c.split();
        let (window, me) = (windows[i], self.window_id(i));
        let t = &mut c.tracks[i];
        // A child is published after its parent, which may be in an earlier lane: each lane's
        // published end is found from the last lane to the first, so no child is read before a
        // parent published ahead of it.
        let mut ends = [0; LANES];
        for lane in (0..LANES).rev() {
            let slots = window.lane_slots(lane, window.lane_claimed(lane).min(u64::from(u32::MAX)) as u32);
            ends[lane] = (slots.start + t.scanned[lane]..slots.end)
                .find(|&s| !window.is_published(s))
                .unwrap_or(slots.end);
        }
        for (lane, end) in ends.into_iter().enumerate() {
            let first = window.lane_slots(lane, 0).start;
            for slot in first + t.scanned[lane]..end {
                let Some(record) = window.published(slot) else {
                    break;
                };
                t.scanned[lane] = slot + 1 - first;
                if record.id != 0 {
                    c.open.flight.see(&record, now);
                }
                let Some(h) = Handle::decode(record.id).filter(|h| {
                    h.comm_slot() == me.comm.slot && usize::from(h.window()) == i && h.epoch() == me.epoch & EPOCH_MASK
                }) else {
                    continue;
                };
                // A start counts at its own slot only.
                if record.body.opens() && h.slot() != slot {
                    continue;
                }
                let at = h.slot();
                let before = Life {
                    started: has_bit(&t.started, at),
                    progressing: has_bit(&t.progressing, at),
                    stopped: has_bit(&t.stopped, at),
                };
                let mut life = before;
                t.open += i64::from(life.read(&record.body, h.kind().base() == Kind::RecvOp));
                if life != before {
                    for (bits, set) in [
                        (&mut t.started, life.started),
                        (&mut t.progressing, life.progressing),
                        (&mut t.stopped, life.stopped),
                    ] {
                        if set {
                            set_bit(bits, at);
                        }
                    }
                }
            }
        }
    }

    /// Seals window `i`, reads its records (waiting briefly for claimed, unpublished slots),
    /// summarises them (linking through, and releasing from, the table of open operations at
    /// `now`) and recycles the window once every claimed slot is published.
    fn process(&self, c: &mut Locked<'_>, i: usize, secs_per_tick: f64, now: Instant) -> Option<WindowSummary> {
        let n = c.windows()[i].seal()?;
        Some(self.read(c, i, n, secs_per_tick, now))
    }

    /// [`Slot::process`] of window `i`, sealed with `n` slots claimed per lane, with this thread's
    /// scratch (capped after).
    fn read(&self, c: &mut Locked<'_>, i: usize, n: [u32; LANES], secs_per_tick: f64, now: Instant) -> WindowSummary {
        SCRATCH.with_borrow_mut(|scratch| {
            let summary = self.read_into(scratch, c, i, n, secs_per_tick, now);
            let trigger = usize::try_from(self.comm.count_trigger).unwrap_or(usize::MAX);
            scratch.cap(trigger.saturating_mul(SCRATCH_WINDOWS));
            summary
        })
    }

    fn read_into(
        &self,
        scratch: &mut Scratch,
        c: &mut Locked<'_>,
        i: usize,
        n: [u32; LANES],
        secs_per_tick: f64,
        now: Instant,
    ) -> WindowSummary {
        let (c, windows) = c.split();
        self.learn_identity(c);
        let (window, id) = (windows[i], self.window_id(i));
        let forced = c.tracks[i].open > 0;
        let deadline = Instant::now() + PUBLISH_WAIT;
        let filler = Record {
            id: 0,
            ts: 0,
            body: Body::Stop,
        };
        let records = &mut scratch.records;
        records.clear();
        records.reserve(n.iter().map(|&k| k as usize).sum());
        let mut start = [0; LANES];
        for (lane, &claimed) in n.iter().enumerate() {
            start[lane] = records.len() as u32;
            records.extend(window.lane_slots(lane, claimed).map(|s| {
                loop {
                    match window.published(s) {
                        Some(r) => break r,
                        None if Instant::now() >= deadline => {
                            self.comm.drops.unpublished.fetch_add(1, Ordering::Relaxed);
                            break filler;
                        }
                        None => std::thread::yield_now(),
                    }
                }
            }));
        }
        let lanes = Lanes {
            stride: window.stride(),
            start,
            len: n,
        };
        // Lane by lane, parents ahead of their children, as `scan` reads them.
        for lane in 0..LANES {
            let from = (start[lane] + c.tracks[i].scanned[lane]) as usize;
            let to = (start[lane] + n[lane]) as usize;
            for r in records.get(from..to).unwrap_or_default().iter().filter(|r| r.id != 0) {
                c.open.flight.see(r, now);
            }
        }
        let at = self.frontier(c, now, Some(i), false);
        let lost = self.comm.lost[i].swap(0, Ordering::Relaxed) == LOST | (id.epoch & EPOCH_MASK);
        let sealed = Sealed {
            records,
            lanes,
            id,
            forced,
            lost_children: lost,
        };
        let summary = summarize_in(&mut scratch.link, sealed, &c.meta, secs_per_tick, &mut c.open, at);
        #[cfg(any(test, feature = "testing"))]
        throttle(n);
        // A slot still unpublished keeps the window draining; `poll` resets it later.
        c.tracks[i] = Track {
            scanned: n,
            ..Track::new(Instant::now())
        };
        window.reset(self.keep(n));
        summary
    }

    /// Moves the operations counted without a record since the last drain into the first of
    /// `summaries`, or into a summary of their own when there is none.
    fn drain_counts(&self, meta: &CommMeta, summaries: &mut Vec<WindowSummary>) {
        let mut counted = Vec::new();
        self.comm.counts.drain(&mut counted);
        if counted.is_empty() {
            return;
        }
        match summaries.first_mut() {
            Some(s) => s.counted = counted,
            None => summaries.push(WindowSummary::counted_only(meta.clone(), counted)),
        }
    }

}

/// Sleeps [`THROTTLE`] nanoseconds per record of a window of `n` records per lane.
#[cfg(any(test, feature = "testing"))]
fn throttle(n: [u32; LANES]) {
    let ns = THROTTLE.load(Ordering::Relaxed);
    if ns > 0 {
        let records: u64 = n.iter().map(|&k| u64::from(k)).sum();
        std::thread::sleep(Duration::from_nanos(records.saturating_mul(ns)));
    }
}

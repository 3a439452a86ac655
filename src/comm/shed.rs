//! The shed level a communicator's next window gets (overload): 0 records everything, 1 drops
//! ProxyStep detail, `1 + k` also times only 1 in 2^k operations (`crate::record::sample`),
//! counting the others. Decided by the consumer (telemetry thread or `finalize`) from what it
//! observes; pure policy, no atomics.
//!
//! Raised when the communicator dropped records, when two or more of its windows wait to be
//! processed, when the telemetry thread is busy most of the time, or when its windows buffer
//! more than [`BUDGET`] bytes: from 0 to [`DETAIL`] first, then by `max(1, ⌈log2 pressure⌉)`
//! levels, pressure being how much more was offered than can be kept. Lowered by one level after
//! a calm stretch of one interval (a step down doubles the records, so it is taken slowly), to 0
//! after an interval in which the communicator took nothing, and
//! raised again only once a raise can show: [`HOLD`] later and after the windows filled at the
//! old level were processed ([`RAISE_AFTER`]), so that a backlog at the old level does not drive
//! the level to the top.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

/// Level 1: ProxyStep detail off, every operation timed.
pub const DETAIL: u8 = 1;
/// The highest level: detail off, 1 in 2^[`crate::record::sample::MAX_K`] operations timed.
pub const MAX_LEVEL: u8 = 1 + crate::record::sample::MAX_K;
/// Bytes a communicator's FILLING and CLOSING windows may buffer before that alone raises the
/// level: the memory bound of an active communicator (6 MB) less the telemetry thread's share.
pub const BUDGET: u64 = 3 << 20;
/// Bytes of a window slot per lane (a full record in lane 0, a packed one in the others).
pub const SLOT_BYTES: [u64; crate::record::handle::LANES] = [56, 32, 32];
/// The telemetry thread's busy fraction above which the level rises.
const BUSY_HIGH: f64 = 0.8;
/// ... and below which it may fall.
const BUSY_LOW: f64 = 0.35;
/// Windows waiting to be processed that raise the level (one is the usual closing window).
const BACKLOG_HIGH: usize = 2;
/// Least time between two raises.
pub const HOLD: Duration = Duration::from_millis(50);
/// Windows processed after a raise before the next one: those filled at the old level (the
/// current one and up to two closing).
const RAISE_AFTER: u64 = 3;

/// The sampling exponent `k` of a level (0 at levels 0 and 1).
pub fn k_of(level: u8) -> u8 {
    level.saturating_sub(DETAIL).min(crate::record::sample::MAX_K)
}

/// What the consumer observed since its last observation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Signals {
    /// Records dropped (full, late or unpublished) since the last observation.
    pub drops: u64,
    /// Records the consumer processed since the last observation.
    pub processed: u64,
    /// Windows it processed since the last observation.
    pub windows: u64,
    /// Windows closed and not yet processed.
    pub backlog: usize,
    /// Fraction of recent wall time the telemetry thread spent working (0–1).
    pub busy: f64,
    /// Bytes of records buffered in the communicator's FILLING and CLOSING windows.
    pub buffered: u64,
    /// Time since the last observation.
    pub elapsed: Duration,
    /// The telemetry interval: how long it must stay calm before the level falls.
    pub interval: Duration,
}

impl Signals {
    /// How many times more records were offered than can be kept (1: none too many), or `None`
    /// when nothing presses.
    fn pressure(&self) -> Option<f64> {
        let mut p: Option<f64> = None;
        let mut at_least = |v: f64| p = Some(p.map_or(v, |p| p.max(v)));
        if self.drops > 0 {
            // Nothing processed to compare with: one step.
            at_least(match self.processed {
                0 => 2.0,
                kept => (kept + self.drops) as f64 / kept as f64,
            });
        }
        if self.backlog >= BACKLOG_HIGH {
            at_least(self.backlog as f64);
        }
        if self.busy > BUSY_HIGH {
            at_least(2.0);
        }
        if self.buffered > BUDGET {
            at_least(self.buffered as f64 / BUDGET as f64);
        }
        p
    }

    /// Whether the communicator took nothing: calm, nothing processed, nothing buffered.
    fn idle(&self) -> bool {
        self.calm() && self.processed == 0 && self.windows == 0 && self.buffered == 0
    }

    /// Whether nothing presses and there is room to take twice the records.
    fn calm(&self) -> bool {
        self.drops == 0 && self.backlog < BACKLOG_HIGH && self.busy < BUSY_LOW && self.buffered <= BUDGET / 2
    }
}

/// A communicator's level controller.
#[derive(Clone, Debug, Default)]
pub struct Controller {
    level: u8,
    /// Calm time so far.
    calm: Duration,
    /// Idle time so far ([`Signals::idle`]).
    idle: Duration,
    /// Time since the last raise (saturating), and windows processed since.
    since_raise: Duration,
    windows_since_raise: u64,
    /// Signals gathered since the last raise: drops and processed records add up, the rest is
    /// the worst seen.
    pending: Signals,
    /// Drops the communicator had counted at the last observation ([`Controller::drops_since`]).
    drops_seen: u64,
    /// When it last observed ([`Controller::elapsed_since`]).
    seen_at: Option<Instant>,
}

impl Controller {
    /// The level the next window gets.
    pub fn level(&self) -> u8 {
        self.level
    }

    /// Drops since the last call, from the communicator's cumulative `total`.
    pub fn drops_since(&mut self, total: u64) -> u64 {
        let delta = total.saturating_sub(self.drops_seen);
        self.drops_seen = total;
        delta
    }

    /// Time since the last call (zero at the first).
    pub fn elapsed_since(&mut self, now: Instant) -> Duration {
        let last = self.seen_at.replace(now).unwrap_or(now);
        now.saturating_duration_since(last)
    }

    /// Takes in what the consumer observed, raising or lowering the level.
    pub fn observe(&mut self, s: Signals) {
        self.since_raise = self.since_raise.saturating_add(s.elapsed);
        self.windows_since_raise = self.windows_since_raise.saturating_add(s.windows);
        let settled = self.since_raise >= HOLD && self.windows_since_raise >= RAISE_AFTER;
        let p = &mut self.pending;
        p.drops += s.drops;
        p.processed += s.processed;
        p.backlog = p.backlog.max(s.backlog);
        p.busy = p.busy.max(s.busy);
        p.buffered = p.buffered.max(s.buffered);
        self.calm = if s.calm() { self.calm.saturating_add(s.elapsed) } else { Duration::ZERO };
        if let Some(pressure) = s.pressure() {
            if settled || self.level == 0 {
                let pressure = self.pending.pressure().unwrap_or(pressure);
                self.level = if self.level == 0 {
                    DETAIL
                } else {
                    let steps = pressure.log2().ceil().clamp(1.0, f64::from(MAX_LEVEL)) as u8;
                    self.level.saturating_add(steps).min(MAX_LEVEL)
                };
                (self.since_raise, self.windows_since_raise) = (Duration::ZERO, 0);
                self.pending = Signals::default();
            }
        } else if settled {
            self.pending = Signals::default();
        }
        self.idle = if s.idle() { self.idle.saturating_add(s.elapsed) } else { Duration::ZERO };
        if self.idle >= s.interval.max(HOLD) {
            // Nothing offered for an interval: no overload left to shed.
            self.level = 0;
        } else if self.level > 0 && self.calm >= s.interval.max(HOLD) {
            self.level -= 1;
            self.calm = Duration::ZERO;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(10);
    const INTERVAL: Duration = Duration::from_millis(100);

    fn quiet() -> Signals {
        Signals {
            processed: 1000,
            windows: 1,
            busy: 0.1,
            buffered: 1 << 20,
            elapsed: TICK,
            interval: INTERVAL,
            ..Signals::default()
        }
    }

    /// The level after `ticks` observations of `s` from level `from`.
    fn after(from: u8, s: Signals, ticks: usize) -> u8 {
        let mut c = Controller {
            level: from,
            since_raise: HOLD,
            windows_since_raise: RAISE_AFTER,
            ..Controller::default()
        };
        (0..ticks).for_each(|_| c.observe(s));
        c.level()
    }

    #[test]
    fn each_pressure_raises_from_zero_to_detail_first() {
        let cases = [
            ("quiet", quiet(), 0),
            ("drops", Signals { drops: 100_000, ..quiet() }, DETAIL),
            ("backlog", Signals { backlog: 2, ..quiet() }, DETAIL),
            ("one window closing", Signals { backlog: 1, ..quiet() }, 0),
            ("busy", Signals { busy: 0.9, ..quiet() }, DETAIL),
            ("half busy", Signals { busy: 0.5, ..quiet() }, 0),
            ("memory", Signals { buffered: BUDGET + 1, ..quiet() }, DETAIL),
            ("memory at budget", Signals { buffered: BUDGET, ..quiet() }, 0),
        ];
        for (name, s, want) in cases {
            assert_eq!(after(0, s, 1), want, "{name}");
        }
    }

    #[test]
    fn above_detail_the_level_rises_by_the_log2_of_the_pressure() {
        let cases = [
            // (offered ÷ kept) → levels up.
            (1000, 1, 1),
            (1000, 1000, 1),
            (1000, 3000, 2),
            (1000, 7000, 3),
            (1000, 15_000, 4),
            (0, 5, 1),
        ];
        for (processed, drops, up) in cases {
            let s = Signals { processed, drops, ..quiet() };
            assert_eq!(after(DETAIL, s, 1), DETAIL + up, "{processed} kept, {drops} dropped");
        }
        let s = Signals { buffered: 4 * BUDGET, ..quiet() };
        assert_eq!(after(3, s, 1), 5, "4× the memory budget: 2 levels");
        let s = Signals { backlog: 3, ..quiet() };
        assert_eq!(after(3, s, 1), 5, "3 windows waiting: 2 levels");
        let s = Signals { drops: u64::MAX / 2, processed: 1, ..quiet() };
        assert_eq!(after(MAX_LEVEL - 1, s, 1), MAX_LEVEL, "capped");
    }

    #[test]
    fn raises_wait_for_the_previous_one_to_show() {
        let s = Signals { drops: 1, ..quiet() };
        let ticks = (HOLD.as_millis() / TICK.as_millis()) as usize;
        // 0 → 1 at once, then one raise per HOLD.
        assert_eq!(after(0, s, 1), 1);
        assert_eq!(after(0, s, ticks), 1);
        assert_eq!(after(0, s, ticks + 1), 2);
        assert_eq!(after(0, s, 2 * ticks + 1), 3);
        // Nor before the windows of the old level were processed.
        let slow = Signals { windows: 0, ..s };
        assert_eq!(after(0, slow, 3 * ticks), 1);
        let mut c = Controller::default();
        c.observe(slow);
        (0..ticks).for_each(|_| c.observe(slow));
        (0..RAISE_AFTER - 1).for_each(|_| c.observe(Signals { windows: 1, ..s }));
        assert_eq!(c.level(), 1, "{} windows processed", RAISE_AFTER - 1);
        c.observe(Signals { windows: 1, ..s });
        assert_eq!(c.level(), 2);
    }

    #[test]
    fn an_interval_without_records_ends_the_shedding() {
        let idle = Signals {
            processed: 0,
            windows: 0,
            buffered: 0,
            ..quiet()
        };
        let ticks = (INTERVAL.as_millis() / TICK.as_millis()) as usize;
        assert_eq!(after(MAX_LEVEL, idle, ticks - 1), MAX_LEVEL, "not a whole interval yet");
        assert_eq!(after(MAX_LEVEL, idle, ticks), 0);
        assert_eq!(after(MAX_LEVEL, quiet(), ticks), MAX_LEVEL - 1, "calm but busy: one level");
    }

    #[test]
    fn the_pressure_over_the_hold_decides_the_step() {
        let mut c = Controller {
            level: DETAIL,
            ..Controller::default()
        };
        // Drops while the last raise settles add up: 8,000 dropped against 1,000 kept in all.
        for _ in 0..4 {
            c.observe(Signals { drops: 2000, processed: 250, ..quiet() });
        }
        assert_eq!(c.level(), DETAIL);
        c.observe(Signals { drops: 0, processed: 0, backlog: 2, ..quiet() });
        assert_eq!(c.level(), DETAIL + 4, "⌈log2 9⌉");
    }

    #[test]
    fn the_level_falls_by_one_per_calm_interval() {
        let per_interval = (INTERVAL.as_millis() / TICK.as_millis()) as usize;
        assert_eq!(after(4, quiet(), per_interval - 1), 4);
        assert_eq!(after(4, quiet(), per_interval), 3);
        assert_eq!(after(4, quiet(), 2 * per_interval), 2);
        assert_eq!(after(1, quiet(), 10 * per_interval), 0);
        // Not calm: busy between the thresholds, a backlog of one is fine, half the budget.
        assert_eq!(after(4, Signals { busy: 0.5, ..quiet() }, 3 * per_interval), 4);
        assert_eq!(after(4, Signals { backlog: 1, ..quiet() }, per_interval), 3);
        assert_eq!(after(4, Signals { buffered: BUDGET, ..quiet() }, 3 * per_interval), 4);
    }

    #[test]
    fn a_pressure_interrupts_the_calm() {
        let mut c = Controller {
            level: 3,
            since_raise: Duration::ZERO,
            ..Controller::default()
        };
        let per_interval = (INTERVAL.as_millis() / TICK.as_millis()) as usize;
        (0..per_interval - 1).for_each(|_| c.observe(quiet()));
        c.observe(Signals { backlog: 2, ..quiet() });
        (0..per_interval - 1).for_each(|_| c.observe(quiet()));
        assert_eq!(c.level(), 4, "raised once, not yet lowered");
    }

    #[test]
    fn drops_since_diffs_the_cumulative_count() {
        let mut c = Controller::default();
        assert_eq!(c.drops_since(5), 5);
        assert_eq!(c.drops_since(5), 0);
        assert_eq!(c.drops_since(12), 7);
        assert_eq!(c.drops_since(0), 0, "a fresh communicator's counters");
    }

    #[test]
    fn k_of_levels() {
        assert_eq!((k_of(0), k_of(DETAIL), k_of(DETAIL + 3), k_of(u8::MAX)), (0, 0, 3, crate::record::sample::MAX_K));
    }
}

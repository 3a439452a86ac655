//! The CPU clock of every record: raw TSC ticks when `quanta` finds the TSC usable (invariant,
//! synchronised), else `quanta`'s monotonic fallback. When it is the TSC, [`now`] reads it inline
//! (one `rdtsc`, no call, no syscall).
//!
//! Ticks become seconds through a rate measured against `Instant` over the process's whole
//! lifetime (from [`init`] to each [`secs_per_tick`] call), not through a calibration done once:
//! one preemption during a short calibration at NCCL's busy start-up would skew every duration
//! for the rest of the job, while here its error shrinks as the job runs.
//! Called on: NCCL threads ([`now`], only in the callbacks whose time is used; [`secs_per_tick`]
//! in `finalize`), the telemetry thread ([`secs_per_tick`]). [`init`] runs in the plugin's `init`;
//! before it `now` returns 0.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The raw clock, and one instant read on both it and `Instant`.
struct Base {
    clock: quanta::Clock,
    ticks: u64,
    at: Instant,
}

static BASE: OnceLock<Base> = OnceLock::new();
/// quanta's raw reads are TSC reads: [`now`] may read the TSC itself.
static TSC: AtomicBool = AtomicBool::new(false);

/// Shortest time between the base and the first rate measurement: bracketing error over it stays
/// below 1e-4 even with microsecond-wide brackets.
const MIN_SPAN: Duration = Duration::from_millis(20);

/// Sets the clock up once per process (tens of milliseconds the first time).
pub fn init() {
    BASE.get_or_init(|| {
        let clock = quanta::Clock::new();
        TSC.store(raw_is_tsc(&clock), Ordering::Relaxed);
        let (ticks, at) = pair(&clock);
        std::thread::sleep(MIN_SPAN);
        Base { clock, ticks, at }
    });
}

/// Current time in raw ticks; 0 before [`init`].
#[inline]
pub fn now() -> u64 {
    if TSC.load(Ordering::Relaxed) {
        return tsc();
    }
    BASE.get().map_or(0, |b| b.clock.raw())
}

/// Seconds per raw tick, measured from [`init`] to now (1e-9 before `init`).
pub fn secs_per_tick() -> f64 {
    let Some(base) = BASE.get() else {
        return 1e-9;
    };
    let (ticks, at) = pair(&base.clock);
    let ticks = ticks.saturating_sub(base.ticks);
    if ticks == 0 {
        return 1e-9;
    }
    at.saturating_duration_since(base.at).as_secs_f64() / ticks as f64
}

/// One instant on both clocks: the narrowest of a few `raw, Instant, raw` brackets (a preempted
/// bracket is wide), its raw value taken at the middle.
fn pair(clock: &quanta::Clock) -> (u64, Instant) {
    let raw = || {
        if TSC.load(Ordering::Relaxed) {
            tsc()
        } else {
            clock.raw()
        }
    };
    let mut best = (u64::MAX, 0, Instant::now());
    for _ in 0..8 {
        let before = raw();
        let at = Instant::now();
        let width = raw().saturating_sub(before);
        if width < best.0 {
            best = (width, before + width / 2, at);
        }
    }
    (best.1, best.2)
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn tsc() -> u64 {
    // SAFETY: `rdtsc` has no preconditions on x86_64 (it only reads the time-stamp counter).
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn tsc() -> u64 {
    BASE.get().map_or(0, |b| b.clock.raw())
}

/// Whether quanta's raw reads come from the TSC: they then match `rdtsc` read right before and
/// after, at two instants a millisecond apart (its monotonic fallback counts nanoseconds since
/// boot, which drift apart from TSC ticks).
fn raw_is_tsc(clock: &quanta::Clock) -> bool {
    let close = || {
        let (before, raw, after) = (tsc(), clock.raw(), tsc());
        before <= raw && raw <= after && after - before < 1_000_000
    };
    let first = close();
    std::thread::sleep(Duration::from_millis(1));
    cfg!(target_arch = "x86_64") && first && close()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_convert_to_wall_seconds() {
        init();
        let (t0, w0) = (now(), Instant::now());
        std::thread::sleep(Duration::from_millis(50));
        let secs = (now() - t0) as f64 * secs_per_tick();
        let wall = w0.elapsed().as_secs_f64();
        assert!((secs - wall).abs() < 0.005, "clock {secs} vs wall {wall}");
    }
}

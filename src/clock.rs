//! The CPU clock of every record: raw TSC ticks, calibrated by `quanta` (which also decides
//! whether the TSC is usable: invariant, synchronised), or `quanta`'s monotonic fallback.
//! When quanta chose the TSC, [`now`] reads it inline (one `rdtsc`, no call, no syscall).
//! Called on: NCCL threads ([`now`], only in the callbacks whose time is used), the telemetry
//! thread ([`secs_per_tick`]). [`init`] runs in the plugin's `init`; before it `now` returns 0.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

static CLOCK: OnceLock<quanta::Clock> = OnceLock::new();
/// quanta's raw reads are TSC reads: [`now`] may read the TSC itself.
static TSC: AtomicBool = AtomicBool::new(false);

/// Calibrates the clock once per process (tens of milliseconds the first time).
pub fn init() {
    CLOCK.get_or_init(|| {
        let clock = quanta::Clock::new();
        TSC.store(raw_is_tsc(&clock), Ordering::Relaxed);
        clock
    });
}

/// Current time in raw ticks; 0 before [`init`].
#[inline]
pub fn now() -> u64 {
    if TSC.load(Ordering::Relaxed) {
        return tsc();
    }
    CLOCK.get().map_or(0, quanta::Clock::raw)
}

/// Seconds per raw tick.
pub fn secs_per_tick() -> f64 {
    const SPAN: u64 = 1 << 40;
    CLOCK
        .get()
        .map_or(1e-9, |c| c.delta_as_nanos(0, SPAN) as f64 / SPAN as f64 * 1e-9)
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn tsc() -> u64 {
    // SAFETY: `rdtsc` has no preconditions on x86_64 (it only reads the time-stamp counter).
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn tsc() -> u64 {
    CLOCK.get().map_or(0, quanta::Clock::raw)
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
    std::thread::sleep(std::time::Duration::from_millis(1));
    cfg!(target_arch = "x86_64") && first && close()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_convert_to_wall_seconds() {
        init();
        let (t0, w0) = (now(), std::time::Instant::now());
        std::thread::sleep(std::time::Duration::from_millis(50));
        let secs = (now() - t0) as f64 * secs_per_tick();
        let wall = w0.elapsed().as_secs_f64();
        assert!((secs - wall).abs() < 0.005, "clock {secs} vs wall {wall}");
    }
}

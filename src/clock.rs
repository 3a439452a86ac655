//! The CPU clock of every record: raw TSC ticks through `quanta` (a few ns, no syscall), or the
//! monotonic clock where the TSC is not usable. Called on: every NCCL thread (`now`), the telemetry
//! thread (`secs_per_tick`). `init` must run (in the plugin's `init`) before `now` is meaningful;
//! before that `now` returns 0.
#![forbid(unsafe_code)]

use std::sync::OnceLock;

static CLOCK: OnceLock<quanta::Clock> = OnceLock::new();

/// Calibrates the clock once per process (tens of milliseconds the first time).
pub fn init() {
    CLOCK.get_or_init(quanta::Clock::new);
}

/// Current time in raw ticks; 0 before [`init`].
#[inline]
pub fn now() -> u64 {
    CLOCK.get().map_or(0, quanta::Clock::raw)
}

/// Seconds per raw tick.
pub fn secs_per_tick() -> f64 {
    const SPAN: u64 = 1 << 40;
    CLOCK
        .get()
        .map_or(1e-9, |c| c.delta_as_nanos(0, SPAN) as f64 / SPAN as f64 * 1e-9)
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

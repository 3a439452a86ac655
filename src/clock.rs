//! The CPU clock of every record: the CPU's own counter read inline when it is usable (x86_64: the
//! TSC when `quanta` finds it invariant and synchronised, one `rdtsc`; aarch64: the virtual
//! counter `cntvct_el0`, constant-rate and synchronised by the architecture and readable from user
//! space on Linux, one `isb; mrs`), no call, no syscall; else `quanta`'s monotonic fallback
//! (`clock_gettime`). The choice is [`direct_counter`]. The aarch64 path cannot be built here (no
//! such target installed): the function deciding it is unit-tested, the read is two instructions.
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
/// [`now`] reads the CPU counter itself ([`direct_counter`]).
static DIRECT: AtomicBool = AtomicBool::new(false);

/// Shortest time between the base and the first rate measurement: bracketing error over it stays
/// below 1e-4 even with microsecond-wide brackets.
const MIN_SPAN: Duration = Duration::from_millis(20);

/// The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`): what its work cost, without the
/// time the host kept it waiting for a core. Zero if the clock cannot be read.
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `clock_gettime` writes the calling thread's CPU time into `ts`, a valid timespec.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(u64::try_from(ts.tv_sec).unwrap_or(0), u32::try_from(ts.tv_nsec).unwrap_or(0))
}

/// Sets the clock up once per process (tens of milliseconds the first time).
pub fn init() {
    BASE.get_or_init(|| {
        let clock = quanta::Clock::new();
        let tsc_usable = cfg!(target_arch = "x86_64") && raw_is_tsc(&clock);
        DIRECT.store(direct_counter(std::env::consts::ARCH, tsc_usable), Ordering::Relaxed);
        let (ticks, at) = pair(&clock);
        std::thread::sleep(MIN_SPAN);
        Base { clock, ticks, at }
    });
}

/// Current time in raw ticks; 0 before [`init`].
#[inline]
pub fn now() -> u64 {
    if DIRECT.load(Ordering::Relaxed) {
        return counter();
    }
    BASE.get().map_or(0, |b| b.clock.raw())
}

/// Whether [`now`] reads the CPU counter of `arch` directly: x86_64's TSC when `tsc_usable`
/// (quanta found it invariant and synchronised), aarch64's virtual counter always; elsewhere
/// quanta.
fn direct_counter(arch: &str, tsc_usable: bool) -> bool {
    match arch {
        "x86_64" => tsc_usable,
        "aarch64" => true,
        _ => false,
    }
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
        if DIRECT.load(Ordering::Relaxed) {
            counter()
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

/// The CPU counter: the TSC.
#[cfg(target_arch = "x86_64")]
#[inline]
fn counter() -> u64 {
    // SAFETY: `rdtsc` has no preconditions on x86_64 (it only reads the time-stamp counter).
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// The CPU counter: the virtual counter, after an `isb` so that it is not read early.
#[cfg(target_arch = "aarch64")]
#[inline]
fn counter() -> u64 {
    let ticks: u64;
    // SAFETY: reading CNTVCT_EL0 has no side effects; Linux lets user space read it (and
    // emulates the read where a CPU erratum makes it trap); `isb` only orders instructions.
    unsafe {
        core::arch::asm!(
            "isb",
            "mrs {ticks}, cntvct_el0",
            ticks = out(reg) ticks,
            options(nomem, nostack, preserves_flags)
        );
    }
    ticks
}

/// No CPU counter read here: quanta's.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn counter() -> u64 {
    BASE.get().map_or(0, |b| b.clock.raw())
}

/// Whether quanta's raw reads come from the TSC: they then match `rdtsc` read right before and
/// after, at two instants a millisecond apart (its monotonic fallback counts nanoseconds since
/// boot, which drift apart from TSC ticks).
fn raw_is_tsc(clock: &quanta::Clock) -> bool {
    let close = || {
        let (before, raw, after) = (counter(), clock.raw(), counter());
        before <= raw && raw <= after && after - before < 1_000_000
    };
    let first = close();
    std::thread::sleep(Duration::from_millis(1));
    first && close()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_counter_is_read_directly_where_it_is_usable() {
        assert!(direct_counter("x86_64", true));
        assert!(!direct_counter("x86_64", false), "an unusable TSC: quanta's fallback");
        assert!(
            direct_counter("aarch64", false),
            "cntvct_el0, whatever the TSC probe says"
        );
        assert!(!direct_counter("riscv64", true));
    }

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

//! Emulated time: precise waits the plugin's clock sees, and the GPU's `%globaltimer`.
//!
//! Transfers last tens of microseconds to milliseconds, below what `sleep` can hit reliably
//! (here: ~10 µs late typically, 50 µs at p99, milliseconds when the host is busy). A precise
//! wait sleeps until [`spin_margin`] before its deadline and spins the rest, with the thread's
//! timer slack at 1 ns; a coarse wait only sleeps.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long before a precise deadline a wait stops sleeping and starts spinning: a real-time
/// thread wakes up promptly, others need more room.
const SPIN_MARGIN_RT: Duration = Duration::from_micros(30);
const SPIN_MARGIN: Duration = Duration::from_micros(80);

thread_local! {
    static MARGIN: std::cell::Cell<Duration> = const { std::cell::Cell::new(SPIN_MARGIN) };
}

/// This thread's spin margin.
pub fn spin_margin() -> Duration {
    MARGIN.with(|m| m.get())
}

/// Makes this thread's sleeps as precise as the kernel allows (`PR_SET_TIMERSLACK` = 1 ns).
pub fn precise_thread() {
    // SAFETY: `prctl(PR_SET_TIMERSLACK)` only changes this thread's timer slack.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
}

/// Makes this thread's precise waits sleep only, never spin: for jobs of more emulated threads
/// than cores, where spinning would starve the others; a deadline is then met within a sleep's
/// precision.
pub fn sleeping_thread() {
    MARGIN.with(|m| m.set(Duration::ZERO));
}

/// Asks for real-time (SCHED_FIFO) priority for this thread, so that a busy host does not
/// preempt it in the middle of a precise wait; returns whether it was granted (root or
/// CAP_SYS_NICE). The kernel's RT throttling keeps 5 % of each CPU for other threads.
pub fn realtime_thread() -> bool {
    let param = libc::sched_param { sched_priority: 10 };
    // SAFETY: changes the scheduling policy of the calling thread only.
    let granted = unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) == 0 };
    if granted {
        MARGIN.with(|m| m.set(SPIN_MARGIN_RT));
    }
    granted
}

/// Busy-waits `d` (sleep is too coarse for microsecond transfers).
pub fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Returns at `deadline` or as soon after as the host allows: sleeps, then spins the last
/// [`spin_margin`].
pub fn wait_until(deadline: Instant) {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        let left = deadline - now;
        let margin = spin_margin();
        if left > margin {
            std::thread::sleep(left - margin);
        } else {
            std::hint::spin_loop();
        }
    }
}

/// The process's emulated GPU `%globaltimer`: nanoseconds on the GPU's own clock (an arbitrary
/// epoch far from the CPU clock's), advancing with the CPU clock, read with a granularity.
pub fn gpu_ns(t: Instant, granularity_ns: u64) -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    const BASE: u64 = 1_700_000_000_000_000_000;
    let epoch = *EPOCH.get_or_init(|| Instant::now() - Duration::from_secs(1));
    let ns = BASE + t.saturating_duration_since(epoch).as_nanos() as u64;
    ns - ns % granularity_ns.max(1)
}

//! Memory under overload: (peak RSS − peak RSS with the plugin disabled) ÷ communicators while
//! 10× the ceiling is offered, and the same for the resident memory a few intervals after the
//! burst. Each (communicators, plugin on or off) pair is a child process (the configuration is
//! read once per process); the disabled child drives at the rate the enabled one used. The
//! 64-communicator peak is asserted; the 4-communicator peak and the idle figures are printed
//! (docs/benchmarks.md, overload: they are above the bounds of 6 MB and 256 KiB today).

use std::time::Duration;

use nccl_profiler_otel::telemetry::consumer;

use crate::drive::{self, Load};
use crate::support::emulator::{self, Plugin};
use crate::support::process;
use crate::{Calibration, THREADS, comms, skip};

/// Selects the child's case: `<communicators>:on` or `<communicators>:off:<rate per thread>`.
const CASE: &str = "OVERLOAD_MEMORY";
/// The burst.
const BURST: Duration = Duration::from_millis(1000);
/// Bounds per communicator.
const PEAK_BOUND: f64 = 6e6;

/// What a child measured.
#[derive(Debug)]
struct Measured {
    peak: u64,
    idle: u64,
    rate: f64,
}

fn run_child(case: &str) -> Measured {
    let out = process::child(module_path!(), "memory_child", CASE, case)
        .output()
        .expect("run the child");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child {case}: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let field = |name: &str| -> f64 {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(name)?.parse().ok())
            .unwrap_or_else(|| panic!("child {case}: no {name} in {text}"))
    };
    Measured {
        peak: field("peak=") as u64,
        idle: field("idle=") as u64,
        rate: field("rate="),
    }
}

/// Runs the on and off children for `n` communicators, prints per-communicator figures and, with
/// `assert_peak`, asserts the peak bound.
fn bounds(n: usize, assert_peak: bool) {
    if skip() {
        return;
    }
    // The children share the machine's cores: one test at a time.
    let _serial = crate::setup().0;
    let on = run_child(&format!("{n}:on"));
    let off = run_child(&format!("{n}:off:{}", on.rate));
    let peak = on.peak.saturating_sub(off.peak) as f64 / n as f64;
    let idle = on.idle.saturating_sub(off.idle) as f64 / n as f64;
    println!(
        "{n} communicators: peak {:.2} MB per communicator (bound 6), idle {:.0} KiB per communicator (bound 256); on {on:?}, off {off:?}",
        peak / 1e6,
        idle / 1024.0
    );
    if assert_peak {
        assert!(peak <= PEAK_BOUND, "{n} communicators: peak {:.2} MB each", peak / 1e6);
    }
}

#[test]
fn four_communicators() {
    bounds(4, false);
}

#[test]
fn sixty_four_communicators() {
    bounds(64, true);
}

/// The child: communicators driven at 10× the ceiling (or, disabled, at the enabled child's
/// rate) from [`THREADS`] threads; prints `peak=` (VmHWM from just before the burst to the end) `idle=`
/// (resident a few intervals after) and `rate=` (collectives/s per thread).
#[test]
#[ignore = "child of the memory tests"]
fn memory_child() {
    let Ok(case) = std::env::var(CASE) else { return };
    let mut parts = case.split(':');
    let n: usize = parts.next().and_then(|v| v.parse().ok()).expect("communicators");
    let on = parts.next() == Some("on");
    // SAFETY: this process runs this test alone; set before the plugin reads its configuration.
    unsafe {
        std::env::set_var(
            "NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC",
            crate::INTERVAL.as_secs_f64().to_string(),
        );
        std::env::set_var("NCCL_PROFILER_OTEL_EXPORTER", "file");
        std::env::set_var("NCCL_PROFILER_OTEL_EXPORT_FILE", "/dev/null");
        if !on {
            std::env::set_var("NCCL_PROFILER_OTEL_ENABLE", "0");
        }
    }
    let p = Plugin::in_process();
    let rate = if on {
        let capture = std::sync::Arc::new(drive::Capture::default());
        nccl_profiler_otel::telemetry::add_sink(capture.clone());
        let cal = Calibration::measure(&p, &capture, 0x0F00_0000);
        capture.stop();
        cal.throttle();
        10.0 * cal.ceiling() / THREADS as f64
    } else {
        parts.next().and_then(|v| v.parse().ok()).expect("rate")
    };
    let cs = comms(&p, 0x0F10_0000, n);
    std::thread::sleep(2 * crate::INTERVAL);
    std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM");
    drive::run(&p, &cs, THREADS, Load::paced(rate, BURST));
    // The consumer works off what it holds, throttled a little longer.
    std::thread::sleep(3 * crate::INTERVAL);
    consumer::set_throttle(0);
    // The backlog processed, the level back to 0 and what the communicators hold given back
    // (`Slot::is_idle`), then the telemetry thread's trim.
    let deadline = std::time::Instant::now() + 50 * crate::INTERVAL;
    while !consumer::all().all(|s| s.is_idle()) && std::time::Instant::now() < deadline {
        std::thread::sleep(crate::INTERVAL / 2);
    }
    std::thread::sleep(2 * crate::INTERVAL);
    let (peak, idle) = (emulator::peak_rss(), emulator::rss());
    println!("peak={peak} idle={idle} rate={rate}");
    cs.iter().for_each(|c| p.finalize(c.context));
}

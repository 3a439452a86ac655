//! Overload: collectives offered at 3× and 10× the drop-free ceiling of a throttled consumer
//! (`consumer::set_throttle`, calibrated to what the drivers reach on this machine), on the plugin
//! linked into the test. Every operation stays counted, a sample stays timed without bias, memory
//! stays bounded. Skipped under a sanitizer (`SANITIZER`): the rates mean nothing there.
//!
//! Modules: `drive` (the driver and its truth), `bias` (counts, timed fraction, weighted mean;
//! nested samples of two ranks; graph replays; an overwritten mask), `memory` (child processes
//! with the plugin on and off).

#[path = "../support"]
mod support {
    pub mod emulator;
    pub mod process;
}

mod bias;
mod drive;
mod memory;

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use drive::Capture;
use nccl_profiler_otel::comm;
use nccl_profiler_otel::telemetry::{self, consumer};
use support::emulator::{Comm, Plugin};

/// The telemetry interval of these tests.
pub const INTERVAL: Duration = Duration::from_millis(100);
/// Driving threads (the machine has 2 cores).
pub const THREADS: usize = 4;
/// The ceiling is this fraction of the collectives/s the drivers reach when nothing is recorded.
pub const CEILING_SHARE: f64 = 1.0 / 20.0;

/// The process-wide setup (once): environment, sink; and the lock that runs these tests one at a
/// time (the throttle and the level are process-wide).
pub fn setup() -> (MutexGuard<'static, ()>, &'static Arc<Capture>) {
    static SETUP: OnceLock<(Arc<Capture>, Mutex<()>)> = OnceLock::new();
    let (capture, serial) = SETUP.get_or_init(|| {
        // SAFETY: runs once, before the first `init` reads the environment.
        unsafe {
            std::env::set_var(
                "NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC",
                INTERVAL.as_secs_f64().to_string(),
            );
            std::env::set_var("NCCL_PROFILER_OTEL_EXPORTER", "none");
        }
        let capture = Arc::new(Capture::default());
        telemetry::add_sink(capture.clone());
        (capture, Mutex::new(()))
    });
    (serial.lock().unwrap_or_else(|e| e.into_inner()), capture)
}

/// A test's start: `None` under a sanitizer (skipped), else the lock of [`setup`], the capture and
/// the plugin linked into the test.
pub fn begin() -> Option<(MutexGuard<'static, ()>, &'static Arc<Capture>, Plugin)> {
    if skip() {
        return None;
    }
    let (serial, capture) = setup();
    Some((serial, capture, Plugin::in_process()))
}

/// Whether to skip: under a sanitizer the rates mean nothing.
pub fn skip() -> bool {
    let skip = std::env::var_os("SANITIZER").is_some();
    if skip {
        eprintln!("skipped under a sanitizer");
    }
    skip
}

/// `n` fresh communicators (hashes `base + i`), rank 0 of 16 on 2 nodes.
pub fn comms(p: &Plugin, base: u64, n: usize) -> Vec<Comm> {
    (0..n)
        .map(|i| p.init(Some("overload"), base + i as u64, 2, 16, 0).0)
        .collect()
}

/// The calibration: records a collective of the driver's shape leaves at level 0, and the
/// collectives/s [`THREADS`] drivers reach on 4 communicators when the plugin records none of
/// them (the level forced to the top).
#[derive(Clone, Copy, Debug)]
pub struct Calibration {
    pub records_per_coll: f64,
    pub max_rate: f64,
}

impl Calibration {
    /// The process's calibration, measured at the first call.
    pub fn get(p: &Plugin, capture: &Capture) -> Calibration {
        static CAL: OnceLock<Calibration> = OnceLock::new();
        *CAL.get_or_init(|| Calibration::measure(p, capture, 0x0E10_0000))
    }

    /// Measures it (about 0.5 s), with fresh communicators from hash `base` on.
    pub fn measure(p: &Plugin, capture: &Capture, base: u64) -> Calibration {
        consumer::set_throttle(0);
        let shape = comms(p, base, 1);
        let tally = drive::run(p, &shape, 1, drive::Load::paced(200.0, Duration::from_millis(100)));
        shape.iter().for_each(|c| p.finalize(c.context));
        let seen = capture.seen(base);
        let records_per_coll = seen.records as f64 / tally[0].issued as f64;
        comm::force_level(Some(comm::shed::MAX_LEVEL));
        let fast = comms(p, base + 1, 4);
        let time = Duration::from_millis(200);
        let tallies = drive::run(p, &fast, THREADS, drive::Load::paced(0.0, time));
        fast.iter().for_each(|c| p.finalize(c.context));
        comm::force_level(None);
        let max_rate = tallies.iter().map(|t| t.issued).sum::<u64>() as f64 / time.as_secs_f64();
        let c = Calibration {
            records_per_coll,
            max_rate,
        };
        println!("calibration: {c:?}");
        c
    }

    /// The ceiling, collectives/s of the whole process: [`CEILING_SHARE`] of what the drivers
    /// reach.
    pub fn ceiling(&self) -> f64 {
        self.max_rate * CEILING_SHARE
    }

    /// Throttles the consumer so that it takes [`Calibration::ceiling`] collectives/s.
    pub fn throttle(&self) {
        let records_per_sec = self.ceiling() * self.records_per_coll;
        consumer::set_throttle((1e9 / records_per_sec) as u64);
    }
}

//! KernelCh sampled where it is expensive: this test binary's emulator claims NCCL 2.31.2, whose
//! KernelCh costs 4–13 % of GPU time (spec 7.3.6), so the default mask's KernelCh bit is
//! requested for one part in ten of each telemetry interval (here 100 ms of every 500 ms, the
//! shortest stretch). The Coll/P2p bits never change; the operations NCCL started with KernelCh
//! get exact GPU times, the others none. The release is process-wide, hence a binary of its own.

#[path = "support"]
mod support {
    pub mod emulator;
}

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nccl_profiler_otel::activation;
use nccl_profiler_otel::aggregate::WindowSummary;
use nccl_profiler_otel::telemetry::{self, Sink};
use support::emulator::{Call, CommSpec, Link, Network, Plugin, Workload, logger, release};

#[derive(Default)]
struct Capture(Mutex<Vec<WindowSummary>>);

impl Sink for Capture {
    fn window(&self, summary: &WindowSummary) {
        self.0.lock().unwrap().push(summary.clone());
    }
}

#[test]
fn kernel_ch_is_sampled_on_nccl_2_31() {
    release::set(release::Release::V2_31_2);
    // SAFETY: the only test of this binary, before the first `init` reads the environment.
    unsafe {
        std::env::set_var("NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC", "0.5");
        std::env::set_var("NCCL_PROFILER_OTEL_EXPORTER", "none");
    }
    let capture = Arc::new(Capture::default());
    telemetry::add_sink(capture.clone());
    let plugin = Arc::new(Plugin::in_process());

    // What NCCL would read at each API call, sampled every millisecond while the job runs.
    let running = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (plugin, running) = (plugin.clone(), running.clone());
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            while running.load(Ordering::Relaxed) {
                seen.push(plugin.mask());
                std::thread::sleep(Duration::from_millis(1));
            }
            seen
        })
    };
    // A tensor-parallel pair inside one node: GPU time is its only time.
    let w = Workload::new(Network::new(2, 2, Link::new_us(10.0, 20.0)))
        .comm(CommSpec::new("tp", 0..2).channels(2).calls([Call::all_reduce(1 << 20)]));
    let w = w.iterations(50);
    let start = Instant::now();
    let mut reports = Vec::new();
    while start.elapsed() < Duration::from_millis(2600) {
        reports.push(w.run(&plugin));
    }
    running.store(false, Ordering::Relaxed);
    // Before the first `init` NCCL's mask is 0.
    let masks: Vec<i32> = sampler.join().unwrap().into_iter().skip_while(|&m| m == 0).collect();

    let line =
        "NCCL 2.31.2 chose profiler ABI v7: activation mask 0x905e, KernelCh (GPU times) requested 20 % of the time";
    assert!(
        logger::lines().iter().any(|l| l.text.contains(line)),
        "{:?}",
        logger::lines()
    );
    assert_eq!(activation::duty(), Some(0.2));
    // Only KernelCh (with KernelPhase, on v7) toggles; it is on about a fifth of the time (wide
    // bounds: a loaded host delays the sampler, not the toggles).
    assert!(masks.iter().all(|&m| m == 0x905e || m == 0x101e), "{masks:x?}");
    assert!(masks.len() > 1000, "{} samples", masks.len());
    let on = masks.iter().filter(|&&m| m == 0x905e).count() as f64 / masks.len() as f64;
    assert!((0.1..=0.35).contains(&on), "KernelCh on {on:.2} of the time");

    // GPU times exactly for the operations NCCL started with KernelCh, and only those.
    let mut want: Vec<f64> = Vec::new();
    let mut without = 0;
    for c in reports.iter().flat_map(|r| &r.collectives) {
        match c.gpu_duration() {
            Some(d) => want.push(d.as_secs_f64()),
            None => without += 1,
        }
    }
    assert!(!want.is_empty() && without > 0, "{} sampled, {without} not", want.len());
    let total = want.len() + without;
    let deadline = Instant::now() + Duration::from_secs(5);
    let ops = loop {
        let ops: Vec<_> = capture
            .0
            .lock()
            .unwrap()
            .iter()
            .flat_map(|w| &w.colls)
            .flat_map(|g| g.ops.clone())
            .collect();
        if ops.len() >= total || Instant::now() > deadline {
            break ops;
        }
        std::thread::sleep(telemetry::TICK);
    };
    assert_eq!(ops.len(), total, "every collective counted");
    let mut got: Vec<f64> = ops.iter().filter_map(|o| o.gpu).collect();
    got.sort_by(f64::total_cmp);
    want.sort_by(f64::total_cmp);
    assert_eq!(got.len(), want.len(), "one GPU time per sampled collective");
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-12, "plugin {g} s, emulator {w} s");
    }
    eprintln!(
        "KernelCh on {:.0} % of the time; {} of {total} collectives sampled",
        on * 100.0,
        want.len()
    );
}

//! Soak with faults: the built plugin, loaded like NCCL loads it, takes a
//! sustained high event rate from several communicators while its OTLP/HTTP collector cycles
//! healthy → hung → healthy → down → healthy … (the run always ends healthy).
//!
//! Per communicator an application thread (Group, Coll or P2p start and stop, as a blocking NCCL
//! call makes them) hands each operation to its proxy thread (send ProxyOps with InProgress and
//! ProxySteps with GPUWait, PeerWait, SendWait and stop; receive ProxyOps and steps, which the
//! plugin declines), paced to `SOAK_RATE` callbacks per second in total. A random eighth of all
//! callbacks is timed into per-phase histograms. "Hung" answers nothing (the export timeout
//! fires, the queue fills and drops); "down" closes the listening socket (connections refused).
//!
//! Checked at the end, from the emulator's own counts and the self-telemetry the plugin exports:
//! - callbacks: p50, p99, p99.9 of the hung and down phases stay within a ratio of the healthy
//!   phases of the same run, and no callback takes [`GROSS`] plus the worst scheduling stall a
//!   canary thread saw in its phase (the machine's own noise) or more;
//! - memory: RSS after the first cycle (warm-up) stays within [`RSS_BOUND`] of the warm-up's peak;
//! - no window wedges: every communicator's `windows.processed` grows across every phase, and no
//!   record is dropped for lack of room while the collector is faulty;
//! - every drop is counted: each callback the plugin records is recorded or dropped (exactly;
//!   when the consumer fell behind and shed records, at most that: a shed step counts once),
//!   each declined one is counted declined, nothing is rejected; export requests made = requests
//!   received + `export.failures` + `export.dropped` (within the interval timing's tolerance), and
//!   requests received = `export.sent` (less those in flight at the last collection);
//! - exports resume: a request with fresh data arrives within [`RESUME_BOUND`] of each healthy
//!   phase that follows a fault.
//!
//! `SOAK_SECONDS` (default 90) sets the length, phases scale with it. Run by `.ci/soak.sh` in
//! release; ignored by a plain `cargo test`. The per-phase table goes to stdout (`--nocapture`).
//!
//! The run's phases, one function or module each: [`start`] (environment, load, `init`), [`run`]
//! (the drivers of [`driver`] while the collector cycles, requests reduced by [`received`]),
//! [`finish`] (the last `finalize` and the final totals), [`report`] (the table) and [`checks`].

#[path = "../support"]
mod support {
    pub mod emulator;
    pub mod otlp_receiver;
}

mod checks;
mod driver;
mod hist;
mod received;
mod report;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::sync_channel;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use checks::Checks;
use driver::{Outcomes, Probe, Shared, Task, app, canary, proxy, thread_cpu};
use hist::Hist;
use received::{Phase, Snap, Totals, bracket, harvest};
use support::emulator::{Comm, Plugin, rss};
use support::otlp_receiver::{Fault, Receiver};

/// Export interval, seconds (`NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC`).
const INTERVAL: f64 = 0.25;
/// Export timeout, milliseconds (`NCCL_PROFILER_OTEL_TELEMETRY_BATCH_TIMEOUT_MS`).
const TIMEOUT_MS: u64 = 400;
/// Export requests that may wait (`NCCL_PROFILER_OTEL_EXPORT_QUEUE`).
const QUEUE: u64 = 4;
/// Record slots per window: four windows hold ~2 s of one communicator's records at the default
/// rate, so a telemetry thread stalled for longer than that would show as `full` drops.
const CAPACITY: u64 = 65536;
/// Communicators, each with an application and a proxy thread.
const COMMS: usize = 4;
/// Ranks per communicator (the emulated process is rank `i` of communicator `i`).
const NRANKS: i32 = 8;
/// Callbacks per second over all communicators, unless `SOAK_RATE` says otherwise.
const DEFAULT_RATE: u64 = 1_000_000;
/// One callback in this many is timed.
const SAMPLE_ONE_IN: u64 = 8;
/// No callback may take this long (beyond the canary's worst stall in its phase), whatever the
/// collector does: well under the export timeout, so a callback waiting for export would show.
const GROSS: Duration = Duration::from_millis(100);
/// Allowed growth of the peak RSS after the warm-up cycle over the warm-up's peak.
const RSS_BOUND: u64 = 16 << 20;
/// Longest wait for fresh data after the collector comes back: an interval, a hung request's
/// timeout, the queued stale requests, and slack for a loaded machine.
const RESUME_BOUND: Duration = Duration::from_millis(3000);
/// Allowed latency ratios of a faulty phase kind to the healthy phases: p50, p99, p99.9.
const RATIOS: [f64; 3] = [1.5, 2.0, 3.0];

/// What the collector does during a phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Healthy,
    Hung,
    Down,
}

impl Kind {
    fn fault(self) -> Fault {
        match self {
            Kind::Healthy => Fault::Healthy,
            Kind::Hung => Fault::Hang,
            Kind::Down => Fault::Refuse,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Kind::Healthy => "healthy",
            Kind::Hung => "hung",
            Kind::Down => "down",
        }
    }
}

/// The phases of a run of `secs` seconds: 4k + 1 phases (healthy, hung, healthy, down, …,
/// healthy) of 4 to 15 s each; the first cycle (4 phases) is the warm-up.
fn schedule(secs: f64) -> (Vec<Kind>, Duration) {
    let target = (secs / 9.0).clamp(4.0, 15.0);
    let cycles = ((secs / target - 1.0) / 4.0).round().max(1.0) as usize;
    let n = 4 * cycles + 1;
    let kinds = (0..n)
        .map(|i| match i % 4 {
            1 => Kind::Hung,
            3 => Kind::Down,
            _ => Kind::Healthy,
        })
        .collect();
    (kinds, Duration::from_secs_f64(secs / n as f64))
}

/// Environment variable `name` as a number, else `default`.
fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Nanoseconds since the Unix epoch (the clock of OTLP timestamps).
fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// What a run measured, per phase (indices of [`Run::phases`]) where not said otherwise.
struct Run {
    phases: Vec<Phase>,
    /// The requests received, reduced; by collection time once [`finish`] returns.
    snaps: Vec<Snap>,
    /// RSS samples: (phase, bytes).
    rss: Vec<(usize, u64)>,
    /// CPU seconds by thread at the end of the last phase.
    cpu: BTreeMap<String, f64>,
    /// Wall time of the phases, seconds.
    secs: f64,
    /// Callback latencies and callbacks, merged over the driver threads.
    hists: Vec<Hist>,
    calls: Vec<u64>,
    /// The canary's worst oversleep.
    stalls: Vec<Duration>,
    /// What the emulator's callbacks should have given, by outcome.
    emitted: Outcomes,
}

impl Run {
    /// Per phase, the totals of the requests that bound what it changed.
    fn deltas(&self) -> Vec<Option<(&Totals, &Totals)>> {
        self.phases
            .iter()
            .map(|ph| bracket(&self.snaps, ph).map(|(a, b)| (&a.totals, &b.totals)))
            .collect()
    }
}

#[test]
#[ignore = "soak: run by .ci/soak.sh (release, SOAK_SECONDS, default 90)"]
fn soak_with_a_faulty_collector() {
    let secs: f64 = env_or("SOAK_SECONDS", 90.0);
    let rate: u64 = env_or("SOAK_RATE", DEFAULT_RATE);
    let (kinds, phase_len) = schedule(secs);
    let rx = Receiver::start();
    let (plugin, comms) = start(&rx);
    println!(
        "soak: {secs} s, {} phases of {:.1} s, {COMMS} communicators, target {rate} callbacks/s, interval {INTERVAL} s, \
         timeout {TIMEOUT_MS} ms, queue {QUEUE}, window capacity {CAPACITY}",
        kinds.len(),
        phase_len.as_secs_f64()
    );
    let mut run = run(&plugin, &comms, &rx, &kinds, phase_len, rate);
    let last = finish(plugin, &comms, &rx, &mut run.snaps);
    report::table(&run, &last.totals);

    let mut checks = Checks::default();
    checks::latency(&mut checks, &run);
    checks::memory(&mut checks, &run);
    checks::windows(&mut checks, &run, phase_len);
    checks::accounting(&mut checks, &run.emitted, &last.totals);
    checks::export(&mut checks, &run, &last);
    assert!(
        checks.0.is_empty(),
        "{} checks failed:\n{}",
        checks.0.len(),
        checks.0.join("\n")
    );
}

/// Points the plugin at `rx` through the environment, loads the built library like NCCL and
/// makes one `init` per communicator.
fn start(rx: &Receiver) -> (Plugin, Vec<Comm>) {
    let vars = [
        ("NCCL_PROFILER_OTEL_TELEMETRY_ENDPOINT", rx.endpoint()),
        ("NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC", INTERVAL.to_string()),
        ("NCCL_PROFILER_OTEL_TELEMETRY_BATCH_TIMEOUT_MS", TIMEOUT_MS.to_string()),
        ("NCCL_PROFILER_OTEL_EXPORT_QUEUE", QUEUE.to_string()),
        ("NCCL_PROFILER_OTEL_WINDOW_CAPACITY", CAPACITY.to_string()),
    ];
    for (k, v) in &vars {
        // SAFETY: the only test of this binary that runs here; no other thread reads the
        // environment (the receiver's does not, and the plugin is not loaded yet).
        unsafe { std::env::set_var(k, v) };
    }
    let plugin = Plugin::load_built().expect("the built plugin");
    let comms: Vec<Comm> = (0..COMMS)
        .map(|i| {
            let name = format!("soak{i}");
            let (c, mask) = plugin.init(Some(&name), 0x50A4_0000_0000 + i as u64, 2, NRANKS, i as i32);
            assert!(!c.context.is_null(), "init gave no context");
            assert_eq!(
                mask, 0x105e,
                "default activation mask and CeColl (NCCL 2.30.7: KernelCh always on)"
            );
            c
        })
        .collect();
    (plugin, comms)
}

/// The run: drivers and the canary in the background, phases switched and requests and RSS
/// sampled here; then the drivers' probes merged.
fn run(plugin: &Plugin, comms: &[Comm], rx: &Receiver, kinds: &[Kind], phase_len: Duration, rate: u64) -> Run {
    let shared = Shared {
        phase: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        phases: kinds.len(),
        rate: rate as f64 / COMMS as f64,
    };
    let counters: Vec<AtomicU64> = (0..COMMS).map(|_| AtomicU64::new(0)).collect();
    let mut snaps: Vec<Snap> = Vec::new();
    let mut phases: Vec<Phase> = Vec::new();
    let mut rss_samples: Vec<(usize, u64)> = Vec::new();
    let mut cpu = BTreeMap::new();
    let run_start = Instant::now();
    let (probes, stalls) = std::thread::scope(|s| {
        let mut threads = Vec::new();
        for (i, &c) in comms.iter().enumerate() {
            let (tx, queue) = sync_channel::<Task>(256);
            let (p, sh, n) = (plugin, &shared, &counters[i]);
            let app = std::thread::Builder::new()
                .name(format!("soak-app-{i}"))
                .spawn_scoped(s, move || app(p, c, tx, sh, n, i));
            let proxy = std::thread::Builder::new()
                .name(format!("soak-proxy-{i}"))
                .spawn_scoped(s, move || proxy(p, c, queue, sh, n, i));
            threads.extend([app.expect("spawn"), proxy.expect("spawn")]);
        }
        let canary = s.spawn(|| canary(&shared));
        for (i, &kind) in kinds.iter().enumerate() {
            rx.set_fault(kind.fault());
            let start = Instant::now();
            shared.phase.store(i, Ordering::Relaxed);
            phases.push(Phase {
                kind,
                start,
                start_ns: wall_ns(),
                end_ns: 0,
                secs: 0.0,
                received: 0,
                rss_max: 0,
                resume: None,
            });
            let ph = phases.last_mut().expect("a phase");
            let mut next_rss = start;
            while start.elapsed() < phase_len {
                std::thread::sleep(Duration::from_millis(50));
                harvest(rx, &mut snaps, Some(&mut *ph));
                if Instant::now() >= next_rss {
                    let r = rss();
                    rss_samples.push((i, r));
                    ph.rss_max = ph.rss_max.max(r);
                    next_rss += Duration::from_millis(250);
                }
            }
            ph.end_ns = wall_ns();
            ph.secs = start.elapsed().as_secs_f64();
        }
        cpu = thread_cpu();
        shared.stop.store(true, Ordering::Relaxed);
        let probes: Vec<Probe<'_>> = threads.into_iter().map(|t| t.join().expect("driver thread")).collect();
        (probes, canary.join().expect("canary thread"))
    });
    let secs = run_start.elapsed().as_secs_f64();

    // Per-phase latencies and callbacks, merged over threads; what the emulator emitted.
    let mut hists = vec![Hist::new(); phases.len()];
    let mut calls = vec![0u64; phases.len()];
    let mut emitted = Outcomes::default();
    for p in &probes {
        for (i, h) in p.hists.iter().enumerate() {
            hists[i].merge(h);
            calls[i] += p.calls[i];
        }
        emitted.record += p.outcomes.record;
        emitted.declined += p.outcomes.declined;
        emitted.ignored += p.outcomes.ignored;
    }
    Run {
        phases,
        snaps,
        rss: rss_samples,
        cpu,
        secs,
        hists,
        calls,
        stalls,
        emitted,
    }
}

/// Finalizes every communicator, waits for a request collected after the last finalize (the
/// final totals) and unloads the plugin; sorts `snaps` by collection time and returns the last.
fn finish(plugin: Plugin, comms: &[Comm], rx: &Receiver, snaps: &mut Vec<Snap>) -> Snap {
    for c in comms {
        plugin.finalize(c.context);
    }
    let finalized = wall_ns();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !snaps.iter().any(|s| s.collected >= finalized) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        harvest(rx, snaps, None);
    }
    plugin.close();
    snaps.sort_by_key(|s| s.collected);
    let last = snaps.last().expect("no request arrived").clone();
    assert!(
        last.collected >= finalized,
        "no request collected after the last finalize"
    );
    last
}

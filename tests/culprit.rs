//! The culprit benchmark's CI variant (`support::job`): jobs of 32 ranks on 4 hosts, one process
//! per host, coupled through shared memory, exporting at the plugin's defaults into a real
//! Prometheus fed by remote write that evaluates the repository's rules (the native-histogram
//! variant: the plugin's default histograms), NCCL 2.31.2 and 2.27.7 (alternate cases), one job per
//! case, in two waves of four jobs at once (so that two cores keep each job's timing): a rank
//! hung inside NCCL on its proxy, its GPU and its NIC, and a host whose NIC is 2× slower; then an
//! absent rank, a healthy job whose rank 0 pauses 45 s outside NCCL (a checkpoint) while the
//! others wait in a collective, a link 2× slower and a rank late by 20 % of the iteration. Each
//! faulty case must fire exactly one culprit alert, naming its culprit and kind, within twice the
//! target (hangs 15 s; absent ranks the 60 s threshold plus 10 s; slow links, hosts and ranks
//! 30 s); the healthy job none. In a release build only, as the benchmark runs: in a debug build
//! the plugin and the emulator of 16 host processes starve two cores, and the ranks of a starved
//! process enter every collective late, a straggler in each of their communicators.

#[path = "support"]
mod support {
    pub mod cuda;
    pub mod emulator;
    pub mod job;
    pub mod otlp_receiver;
    #[allow(dead_code)]
    pub mod prom;
    pub mod shipped;
}

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use support::emulator::release::Release;
use support::job::live::Live;
use support::job::score::{self, INTERVAL};
use support::job::{self as job, Case, Fault, Where};
use support::prom::native::RULES;
use support::prom::server::have_prometheus;

/// A host process of a case (started by the test below; inert alone).
#[test]
#[ignore = "a host process of the culprit cases"]
fn host() {
    job::host_main();
}

/// This binary's host entry.
fn host_command() -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "host", "--include-ignored", "--test-threads=1", "--quiet"]);
    c
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing: a release build only (cargo test --release --test culprit; .ci/run does)"
)]
fn each_incident_names_its_culprit_and_no_victim() {
    if !have_prometheus() {
        return;
    }
    let live = Live::start(Path::new(RULES)).unwrap_or_else(|e| panic!("{e}"));
    let dir = std::env::temp_dir().join(format!("nccl-culprit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let case = |id, fault, hold: u64, target: f64| {
        let c = Case {
            id,
            fault,
            seed: id,
            // Both releases the benchmark reports: 2.31.2 (KernelCh sampled), 2.27.7.
            release: if id % 2 == 0 {
                Release::V2_27_7
            } else {
                Release::V2_31_2
            },
            warmup: Duration::from_secs(20),
            hold: Duration::from_secs(hold),
            tail: Duration::from_secs(10),
        };
        (c, target)
    };
    let hangs = [
        case(
            1,
            Fault::Hung {
                rank: 9,
                at: Where::Proxy,
            },
            30,
            15.0,
        ),
        case(
            2,
            Fault::Hung {
                rank: 18,
                at: Where::Gpu,
            },
            30,
            15.0,
        ),
        case(
            3,
            Fault::Hung {
                rank: 27,
                at: Where::Network,
            },
            30,
            15.0,
        ),
    ];
    let slow_nic = case(4, Fault::SlowNic { host: 2, factor: 2.0 }, 40, 30.0);
    let quiet = [
        case(5, Fault::Absent { rank: 12 }, 80, 70.0),
        case(6, Fault::Checkpoint { rank: 0, secs: 45 }, 60, 0.0),
        case(
            7,
            Fault::SlowLink {
                src: 21,
                dst: 29,
                factor: 2.0,
            },
            40,
            30.0,
        ),
        case(8, Fault::Straggler { rank: 6, share: 0.2 }, 40, 30.0),
    ];
    let started = Instant::now();
    let mut failures = Vec::new();
    let first: Vec<_> = hangs.into_iter().chain([slow_nic]).collect();
    for wave in [&first[..], &quiet[..]] {
        failures.extend(run_wave(&live, &dir, wave));
    }
    let errors = live.errors();
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "{} s in all; remote write / API errors: {errors:?}",
        started.elapsed().as_secs()
    );
    assert!(
        failures.is_empty(),
        "{failures:#?}\nprometheus log:\n{}",
        live.server.log()
    );
}

/// Runs `cases` at once (each with its latency target, seconds) and scores them; what failed.
fn run_wave(live: &Live, dir: &Path, cases: &[(Case, f64)]) -> Vec<String> {
    let runs: Vec<_> = cases
        .iter()
        .map(|(c, _)| c.spawn(host_command, &live.receiver.endpoint(), dir))
        .collect();
    let longest = cases.iter().map(|(c, _)| c.length()).max().unwrap();
    std::thread::sleep(longest + 2 * INTERVAL + Duration::from_secs(2));
    let mut failures = Vec::new();
    for ((c, target), run) in cases.iter().zip(&runs) {
        let at = run.start + c.warmup;
        let firing = live.firing(&c.job());
        let o = score::score(&c.fault, c.id, &firing, at, at + c.hold, run.start);
        let fps: Vec<String> = o
            .false_positives
            .iter()
            .map(|(n, t)| format!("{n} at {t:+.1} s"))
            .collect();
        eprintln!(
            "case {} ({}): detected after {:?}, false positives: {fps:?}",
            c.id, c.fault, o.latency
        );
        if !fps.is_empty() {
            failures.push(format!("{}: false positives {fps:?}", c.fault));
        }
        for q in [
            "nccl_progress_hang_stuck_seconds",
            "nccl:export:live",
            "nccl_profiler_events_dropped_total",
            "nccl_profiler_events_shed_total",
        ] {
            let rows = live
                .server
                .query(&format!("{q}{{job=\"{}\"}}", c.job()), None)
                .unwrap_or_default();
            eprintln!("  {q}: {} series", rows.len());
            for r in rows.iter().filter(|r| r.1 > 0.0).take(8) {
                eprintln!(
                    "    {:?} {}",
                    r.0.iter()
                        .filter(|(k, _)| k.starts_with("nccl_") || *k == "instance")
                        .collect::<Vec<_>>(),
                    r.1
                );
            }
        }
        match (c.fault.healthy(), o.latency) {
            (true, _) => {}
            (false, None) => failures.push(format!("{}: not detected", c.fault)),
            (false, Some(l)) if l.as_secs_f64() > 2.0 * target => {
                failures.push(format!("{}: detected after {l:?}, target {target} s", c.fault))
            }
            _ => {}
        }
    }
    failures
}

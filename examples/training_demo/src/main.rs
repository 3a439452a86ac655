//! The README's main job: `cargo run --release -p training-demo`.
//!
//! Loads the built plugin the way NCCL does (`dlopen` of `libnccl_profiler_otel.so`, then the
//! newest `ncclProfiler_vN` the emulated NCCL release knows; `--nccl 2.31.2` picks the release,
//! 2.30.7 by default, `--abi v4` one table through that release's adapter), drives it with a short training-like workload on 8 emulated ranks over 2
//! nodes whose network is modelled (one inter-node link is made 4× slower), and exports real
//! OTLP/HTTP to a collector inside this program. Then it prints what the collector received: per
//! function and size, counts, latency, service time and bus bandwidth as nccl-tests computes it
//! (host and GPU), and the per-link latency/bandwidth matrix from the
//! plugin's regression (`MIN` mode unless set), where the slow link stands out. No collector or
//! GPU needed.
//!
//! `--save FILE` also writes what the collector received to FILE as the file exporter's
//! OTLP-JSON lines (what `nccl_report` reads); `--ranks A-B` emulates only those of the 8 ranks,
//! so that several runs make a multi-process file set. With `NCCL_PROFILER_OTEL_EXPORTER=file`
//! the plugin writes its own file instead, and the demo prints where rather than a report.

#[path = "../../../tests/support/emulator/mod.rs"]
mod emulator;
#[path = "../../../tests/support/otlp_receiver.rs"]
mod otlp_receiver;
mod report;

use std::io::Write as _;
use std::ops::RangeInclusive;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use emulator::release::{self, Release};
use emulator::{Link, Network, Plugin, Version, Workload};
use otlp_receiver::{Receiver, find};

const RANKS: usize = 8;
const PER_NODE: usize = 4;
const SLOW: (usize, usize) = (3, 4);
const ITERATIONS: usize = 20;
/// The first communicator's hash, the same in every run, as NCCL's ranks agree on it: the runs
/// of a file set made with `--ranks` are one job.
const COMM_HASH: u64 = 0x6e63_636c_0000_0001;

/// What the command line asks for.
struct Args {
    /// `--nccl X.Y.Z`.
    nccl: Release,
    /// `--abi vN`.
    abi: Option<Version>,
    /// `--ranks A-B` (or `A`): the ranks this run emulates.
    ranks: RangeInclusive<usize>,
    /// `--save FILE`.
    save: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut out = Args {
        nccl: Release::V2_30_7,
        abi: None,
        ranks: 0..=RANKS - 1,
        save: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--nccl" => {
                out.nccl = Release::parse(&value).ok_or_else(|| format!("--nccl {value}: not a release like 2.31.2"))?
            }
            "--abi" => {
                out.abi = Some(Version::parse(&value).ok_or_else(|| format!("--abi {value}: not a version like v7"))?)
            }
            "--ranks" => {
                let (a, b) = value.split_once('-').unwrap_or((&value, &value));
                out.ranks = match (a.parse::<usize>(), b.parse::<usize>()) {
                    (Ok(a), Ok(b)) if a <= b && b < RANKS => a..=b,
                    _ => return Err(format!("--ranks {value}: not ranks A-B with A ≤ B < {RANKS}")),
                };
            }
            "--save" => out.save = Some(value),
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    Ok(out)
}

/// Whether the plugin writes its own file (`NCCL_PROFILER_OTEL_EXPORTER=file`).
fn file_exporter() -> bool {
    std::env::var("NCCL_PROFILER_OTEL_EXPORTER").is_ok_and(|e| e.trim().eq_ignore_ascii_case("file"))
}

/// Writes `requests` to `path`, one OTLP-JSON line each, as the plugin's file exporter does.
fn save(path: &str, requests: &[otlp_receiver::ExportMetricsServiceRequest]) -> Result<(), String> {
    let mut out = Vec::new();
    for r in requests {
        serde_json::to_writer(&mut out, r).map_err(|e| e.to_string())?;
        out.push(b'\n');
    }
    std::fs::write(path, out).map_err(|e| format!("cannot write {path}: {e}"))
}

/// A one-line progress bar on stderr, redrawn every 5 %.
fn progress(done: usize, total: usize) {
    static SHOWN: AtomicUsize = AtomicUsize::new(usize::MAX);
    let (width, step) = (40, done * 20 / total.max(1));
    if SHOWN.swap(step, Ordering::Relaxed) == step {
        return;
    }
    let filled = done * width / total.max(1);
    eprint!(
        "\r  [{}{}] {done}/{total} rank iterations",
        "#".repeat(filled),
        " ".repeat(width - filled)
    );
    let _ = std::io::stderr().flush();
}

fn main() -> ExitCode {
    let started = Instant::now();
    let receiver = Receiver::start();
    // SAFETY: set before any other thread exists and before the plugin reads its configuration.
    unsafe {
        std::env::set_var("NCCL_PROFILER_OTEL_TELEMETRY_ENDPOINT", receiver.endpoint());
        std::env::set_var("NCCL_PROFILER_OTEL_TELEMETRY_INTERVAL_SEC", "1");
        // A link here sees a few dozen transfers per interval, and a VM's hypervisor can pause the
        // emulator for milliseconds: one such pause in a mean-based fit skews a link's figures.
        // A low percentile of each size's times ignores it (a user's setting wins).
        if std::env::var_os("NCCL_PROFILER_LINEAR_REGRESSION_MODE").is_none() {
            std::env::set_var("NCCL_PROFILER_LINEAR_REGRESSION_MODE", "MIN");
        }
    }
    let Args {
        nccl,
        abi,
        ranks,
        save: save_to,
    } = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!(
                "{e}\nusage: training_demo [--nccl 2.23.4 … 2.31.2] [--abi v1 … v7]\n       \
                 [--ranks A-B] [--save FILE]"
            );
            return ExitCode::FAILURE;
        }
    };
    release::set(nccl);
    let loaded = emulator::built_library().and_then(|path| {
        match abi {
            Some(v) => Plugin::load_version(&path, v),
            None => Plugin::load(&path),
        }
        .map_err(|e| e.to_string())
    });
    let plugin = match loaded {
        Ok(p) => p,
        Err(e) => {
            eprintln!("cannot load the plugin: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "emulating NCCL {nccl}: loaded ncclProfiler_{} ({})",
        plugin.driving(),
        if plugin.native() {
            "called directly"
        } else {
            "through NCCL's adapter"
        }
    );
    let net = Network::new(RANKS, PER_NODE, Link::new_us(20.0, 12.0))
        .slow_link(SLOW.0, SLOW.1, 4.0)
        .with_jitter(0.02);
    println!(
        "nccl-profiler-otel demo: {RANKS} ranks on {} nodes, inter-node links 20 µs and\n\
         12 GB/s, link {}→{} 4× slower",
        RANKS / PER_NODE,
        SLOW.0,
        SLOW.1
    );
    if file_exporter() {
        println!("OTLP-JSON lines to the plugin's file (NCCL_PROFILER_OTEL_EXPORTER=file)\n");
    } else {
        println!("OTLP/HTTP to the in-process collector at {}\n", receiver.endpoint());
    }
    // One rank at a time, as on a real cluster where each rank has its own cores: all 8 ranks'
    // threads on this machine's cores at once would measure the host, not the modelled network.
    let workload = Workload::training(net, ITERATIONS);
    let mut issued = 0;
    let emulated = ranks.clone().count();
    for (nth, rank) in ranks.enumerate() {
        let mut w = workload.clone();
        w.comms = workload
            .comms
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let local = c.members.iter().position(|&m| m == rank).map(|r| r as i32);
                c.clone().emulate(local).with_hash(COMM_HASH + i as u64)
            })
            .collect();
        let report = w.run_with_progress(&plugin, &|done, total| {
            progress(nth * total + done, emulated * total);
        });
        issued += report.collectives.len();
    }
    eprintln!();
    drop(plugin); // every communicator was finalized; NCCL would dlclose now
    if file_exporter() {
        let file = std::env::var("NCCL_PROFILER_OTEL_EXPORT_FILE").unwrap_or("nccl-otel-%h-%p.jsonl".into());
        println!(
            "emulator: {issued} collectives and P2P operations issued; the plugin's export\n\
             is in {file}\n(%h host, %p pid): cargo run --release -p nccl-report -- FILE..."
        );
        return ExitCode::SUCCESS;
    }
    let complete = |r: &[_]| find(r, "nccl.link.latency").is_some() && find(r, "nccl.coll.duration").is_some();
    if !receiver.wait_for(Duration::from_secs(10), complete) {
        eprintln!("the collector received no link or collective metrics");
        return ExitCode::FAILURE;
    }
    let requests = receiver.requests();
    if let Err(e) = save_to.map_or(Ok(()), |path| save(&path, &requests)) {
        eprintln!("{e}");
        return ExitCode::FAILURE;
    }
    report::print_collectives(&requests);
    let mode = std::env::var("NCCL_PROFILER_LINEAR_REGRESSION_MODE")
        .unwrap_or_default()
        .to_uppercase();
    report::print_links(&report::link_cells(&requests), RANKS, Some(&mode));
    println!(
        "\nemulator: {issued} collectives and P2P operations issued;\n{} OTLP requests received; {:.1} s in all",
        requests.len(),
        started.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}

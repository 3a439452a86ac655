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

#[path = "../../../tests/support/emulator/mod.rs"]
mod emulator;
#[path = "../../../tests/support/otlp_receiver.rs"]
mod otlp_receiver;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use emulator::release::{self, Release};
use emulator::{Link, Network, Plugin, Version, Workload};
use otlp_receiver::{Receiver, find, points};

const RANKS: usize = 8;
const PER_NODE: usize = 4;
const SLOW: (usize, usize) = (3, 4);
const ITERATIONS: usize = 20;

/// `--nccl X.Y.Z` and `--abi vN` from the command line.
fn parse_args() -> Result<(Release, Option<Version>), String> {
    let (mut nccl, mut abi) = (Release::V2_30_7, None);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--nccl" => {
                nccl = Release::parse(&value).ok_or_else(|| format!("--nccl {value}: not a release like 2.31.2"))?
            }
            "--abi" => {
                abi = Some(Version::parse(&value).ok_or_else(|| format!("--abi {value}: not a version like v7"))?)
            }
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    Ok((nccl, abi))
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
    let (nccl, abi) = match parse_args() {
        Ok(choice) => choice,
        Err(e) => {
            eprintln!("{e}\nusage: training_demo [--nccl 2.23.4 … 2.31.2] [--abi v1 … v7]");
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
    println!("OTLP/HTTP to the in-process collector at {}\n", receiver.endpoint());
    // One rank at a time, as on a real cluster where each rank has its own cores: all 8 ranks'
    // threads on this machine's cores at once would measure the host, not the modelled network.
    let workload = Workload::training(net, ITERATIONS);
    let mut issued = 0;
    for rank in 0..RANKS {
        let mut w = workload.clone();
        w.comms = workload
            .comms
            .iter()
            .map(|c| {
                let local = c.members.iter().position(|&m| m == rank).map(|r| r as i32);
                c.clone().emulate(local)
            })
            .collect();
        let report = w.run_with_progress(&plugin, &|done, total| {
            progress(rank * total + done, RANKS * total);
        });
        issued += report.collectives.len();
    }
    eprintln!();
    drop(plugin); // every communicator was finalized; NCCL would dlclose now
    let complete = |r: &[_]| find(r, "nccl.link.latency").is_some() && find(r, "nccl.coll.duration").is_some();
    if !receiver.wait_for(Duration::from_secs(10), complete) {
        eprintln!("the collector received no link or collective metrics");
        return ExitCode::FAILURE;
    }
    let requests = receiver.requests();
    print_collectives(&requests);
    print_links(&requests);
    println!(
        "\nemulator: {issued} collectives and P2P operations issued;\n{} OTLP requests received; {:.1} s in all",
        requests.len(),
        started.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}

/// Latest cumulative value per attribute set of a metric.
fn latest(
    requests: &[otlp_receiver::ExportMetricsServiceRequest],
    name: &str,
) -> BTreeMap<Vec<(String, String)>, otlp_receiver::Point> {
    let mut out = BTreeMap::new();
    for r in requests {
        for m in otlp_receiver::metrics(std::slice::from_ref(r))
            .into_iter()
            .filter(|m| m.name == name)
        {
            for p in points(m) {
                out.insert(p.attrs.clone().into_iter().collect(), p);
            }
        }
    }
    out
}

/// Per (function, size class): operations; (count, sum) of latencies and of service times; the
/// summed bus bytes and seconds of the host's (service) and the GPU's bus bandwidth.
#[derive(Default)]
struct Row {
    ops: u64,
    latency: (u64, f64),
    service: (u64, f64),
    bus: [(f64, f64); 2],
}

/// A size class's bytes (`1KiB` … `4GiB`), to sort by; `unknown` last.
fn class_bytes(class: &str) -> u64 {
    let (n, unit) = class.split_at(class.find(|c: char| !c.is_ascii_digit()).unwrap_or(class.len()));
    let shift = match unit {
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        _ => return u64::MAX,
    };
    n.parse::<u64>().map_or(u64::MAX, |n| n << shift)
}

/// Prints the collectives table: 70 columns. busBw is nccl-tests': the bus bytes over the
/// service time, summed (a ratio of sums); GPU busBw the same over the kernels' time
/// (collectives only).
fn print_collectives(requests: &[otlp_receiver::ExportMetricsServiceRequest]) {
    println!("Collectives and P2P sends (all ranks; means; busBw as nccl-tests computes it)");
    println!(
        "{:<13} {:<7} {:>6} {:>9} {:>9} {:>10} {:>10}",
        "function", "size", "ops", "latency", "service", "busBw", "GPU busBw"
    );
    let mut rows: BTreeMap<(String, u64, String), Row> = BTreeMap::new();
    let key = |attrs: &[(String, String)]| {
        let get = |k: &str| {
            attrs
                .iter()
                .find(|(n, _)| n == k)
                .map_or("-".to_string(), |(_, v)| v.clone())
        };
        let class = get("nccl.size_class");
        (get("nccl.func"), class_bytes(&class), class)
    };
    for family in ["coll", "p2p"] {
        let series = |what: &str| latest(requests, &format!("nccl.{family}.{what}"));
        for (attrs, p) in series("transfers") {
            rows.entry(key(&attrs)).or_default().ops += p.count;
        }
        for (what, service) in [("duration", false), ("service.duration", true)] {
            for (attrs, p) in series(what) {
                let row = rows.entry(key(&attrs)).or_default();
                let h = if service { &mut row.service } else { &mut row.latency };
                *h = (h.0 + p.count, h.1 + p.value);
            }
        }
        // Collectives only: a group's P2P sends run together, their times do not add up.
        for (i, clock) in ["service", "kernel"].into_iter().enumerate() {
            for (attrs, p) in series(&format!("{clock}.bus_bytes")) {
                rows.entry(key(&attrs)).or_default().bus[i].0 += p.value;
            }
            for (attrs, p) in series(&format!("{clock}.time")) {
                rows.entry(key(&attrs)).or_default().bus[i].1 += p.value;
            }
        }
    }
    let mean = |(n, sum): (u64, f64)| if n > 0 { sum / n as f64 } else { f64::NAN };
    let rate = |(bytes, secs): (f64, f64)| if secs > 0.0 { bytes / secs } else { f64::NAN };
    for ((func, _, class), row) in rows.into_iter().filter(|(_, r)| r.ops > 0) {
        println!(
            "{func:<13} {class:<7} {:>6} {:>9} {:>9} {:>10} {:>10}",
            row.ops,
            human_secs(mean(row.latency)),
            human_secs(mean(row.service)),
            format!("{}/s", human_bytes(rate(row.bus[0]))),
            format!("{}/s", human_bytes(rate(row.bus[1])))
        );
    }
    println!("latency: enqueue → completion, includes queueing behind earlier operations");
}

fn print_links(requests: &[otlp_receiver::ExportMetricsServiceRequest]) {
    let latency = latest(requests, "nccl.link.latency");
    let bandwidth = latest(requests, "nccl.link.bandwidth");
    let mut cells: BTreeMap<(usize, usize), (f64, f64)> = BTreeMap::new();
    for (key, lat) in &latency {
        let a: BTreeMap<_, _> = key.iter().cloned().collect();
        let (Some(src), Some(dst)) = (a.get("nccl.rank"), a.get("nccl.peer")) else {
            continue;
        };
        let (Ok(src), Ok(dst)) = (src.parse(), dst.parse()) else {
            continue;
        };
        let bw = bandwidth.get(key).map_or(f64::NAN, |p| p.value);
        cells.insert((src, dst), (lat.value, bw));
    }
    let slowest = cells.iter().min_by(|a, b| a.1.1.total_cmp(&b.1.1)).map(|(k, _)| *k);
    let mode = std::env::var("NCCL_PROFILER_LINEAR_REGRESSION_MODE")
        .unwrap_or_default()
        .to_uppercase();
    println!(
        "\nPer-link latency (µs) / bandwidth (GB/s), sender → receiver, from the\n\
         plugin's regression (mode {mode})"
    );
    // 7 + 8 × 9 = 79 columns.
    print!("{:>7}", "src\\dst");
    (0..RANKS).for_each(|d| print!("{d:>9}"));
    println!();
    for s in 0..RANKS {
        print!("{s:>7}");
        for d in 0..RANKS {
            match cells.get(&(s, d)) {
                Some((lat, bw)) => {
                    let mark = if slowest == Some((s, d)) { "*" } else { " " };
                    print!("{:>9}", format!("{:.0}/{:.1}{mark}", lat * 1e6, bw / 1e9));
                }
                None => print!("{:>9}", "·"),
            }
        }
        println!();
    }
    if let Some((s, d)) = slowest {
        let (lat, bw) = cells[&(s, d)];
        println!(
            "* slowest link: {s} → {d} at {:.1} GB/s (latency {:.0} µs)",
            bw / 1e9,
            lat * 1e6
        );
    }
    println!("· no transfer measured (same node, or not a ring/all-to-all neighbour)");
}

/// Bytes in decimal units (kB, MB, GB: the units of bandwidths).
fn human_bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = b;
    let mut unit = 0;
    while v >= 1000.0 && unit + 1 < UNITS.len() {
        v /= 1000.0;
        unit += 1;
    }
    if !v.is_finite() {
        return "-".into();
    }
    format!("{v:.1} {}", UNITS[unit])
}

fn human_secs(s: f64) -> String {
    if !s.is_finite() {
        "-".into()
    } else if s < 1e-3 {
        format!("{:.1} µs", s * 1e6)
    } else {
        format!("{:.2} ms", s * 1e3)
    }
}

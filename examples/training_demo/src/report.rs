//! The report both `training_demo` and `nccl_report` print from OTLP export requests: per
//! function and size, counts, latency, service time and bus bandwidth as nccl-tests computes it
//! (host and GPU); the per-link latency/bandwidth matrix from the plugin's regression, with the
//! slowest link marked. Every line fits 80 columns. Single-threaded (the caller's main thread).

use std::collections::BTreeMap;

use crate::otlp_receiver::{ExportMetricsServiceRequest, Point, metric, metrics, points};

/// A point's attributes, sorted: the key of [`latest`].
pub type Attrs = Vec<(String, String)>;

/// Per (sender, receiver) rank: the link's latency (s) and bandwidth (B/s).
pub type Cells = BTreeMap<(usize, usize), (f64, f64)>;

/// A metric's value per attribute set, at the end of the requests: the latest point of a
/// cumulative metric or a gauge; the points of a delta sum or histogram (explicit or exponential)
/// added up.
pub fn latest(requests: &[ExportMetricsServiceRequest], name: &str) -> BTreeMap<Attrs, Point> {
    let mut out: BTreeMap<Attrs, Point> = BTreeMap::new();
    for m in metrics(requests).into_iter().filter(|m| m.name == name) {
        let delta = match &m.data {
            Some(metric::Data::Sum(s)) => s.aggregation_temporality == DELTA,
            Some(metric::Data::Histogram(h)) => h.aggregation_temporality == DELTA,
            Some(metric::Data::ExponentialHistogram(h)) => h.aggregation_temporality == DELTA,
            _ => false,
        };
        for p in points(m) {
            let key = p.attrs.clone().into_iter().collect();
            match out.get_mut(&key) {
                Some(sum) if delta => {
                    sum.value += p.value;
                    sum.count += p.count;
                    sum.buckets.iter_mut().zip(&p.buckets).for_each(|(a, b)| *a += b);
                }
                _ => {
                    out.insert(key, p);
                }
            }
        }
    }
    out
}

/// OTLP's `AGGREGATION_TEMPORALITY_DELTA`.
const DELTA: i32 = 1;

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
pub fn print_collectives(requests: &[ExportMetricsServiceRequest]) {
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
        // Every operation's size is recorded once, whether it was timed or only counted.
        for (attrs, p) in series("bytes") {
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

/// The latest latency and bandwidth of every link, by (`nccl.rank`, `nccl.peer`): a pair that
/// several communicators measure shows one of them.
pub fn link_cells(requests: &[ExportMetricsServiceRequest]) -> Cells {
    let latency = latest(requests, "nccl.link.latency");
    let bandwidth = latest(requests, "nccl.link.bandwidth");
    let mut cells = Cells::new();
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
    cells
}

/// Prints the link matrix of ranks `0..ranks` (up to 8, the most that fit 80 columns) and the
/// slowest link; `mode` is the regression mode, when known.
pub fn print_links(cells: &Cells, ranks: usize, mode: Option<&str>) {
    let slowest = cells.iter().min_by(|a, b| a.1.1.total_cmp(&b.1.1)).map(|(k, _)| *k);
    let mode = mode.map_or(String::new(), |m| format!(" (mode {m})"));
    println!(
        "\nPer-link latency (µs) / bandwidth (GB/s), sender → receiver, from the\n\
         plugin's regression{mode}"
    );
    if ranks > 8 {
        println!("({ranks} ranks: a matrix would not fit 80 columns)");
    } else {
        // 7 + 8 × 9 = 79 columns.
        print!("{:>7}", "src\\dst");
        (0..ranks).for_each(|d| print!("{d:>9}"));
        println!();
        for s in 0..ranks {
            print!("{s:>7}");
            for d in 0..ranks {
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
    }
    if let Some((s, d)) = slowest {
        let (lat, bw) = cells[&(s, d)];
        println!(
            "* slowest link: {s} → {d} at {:.1} GB/s (latency {:.0} µs)",
            bw / 1e9,
            lat * 1e6
        );
    }
    if ranks <= 8 {
        println!("· no transfer measured (same node, or not a ring/all-to-all neighbour)");
    }
}

/// Bytes in decimal units (kB, MB, GB: the units of bandwidths).
pub fn human_bytes(b: f64) -> String {
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

/// Seconds as µs below a millisecond, else ms; `-` when not a number.
pub fn human_secs(s: f64) -> String {
    if !s.is_finite() {
        "-".into()
    } else if s < 1e-3 {
        format!("{:.1} µs", s * 1e6)
    } else {
        format!("{:.2} ms", s * 1e3)
    }
}

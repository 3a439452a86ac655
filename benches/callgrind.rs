//! Instructions per callback, counted by valgrind's callgrind: a guard no noisy machine can flake.
//! Wall-clock figures stay in `hot_path` (criterion, as ratios).
//!
//! `cargo bench --bench callgrind` runs this binary twice under
//! `valgrind --tool=callgrind`, once driving the plugin's `ncclProfiler_v7` table and once a table
//! of empty callbacks, with the same calls in the same order through the function pointers, as
//! NCCL calls them. Only the calls inside [`callgrind_measured`] are counted, one profile dump per
//! batch of [`BATCH`] callbacks of one kind. The plugin's instructions per callback minus the
//! empty table's are what the plugin adds; each kind has a ceiling ([`CEILINGS`]): a change that
//! adds instructions fails here and either goes or raises the ceiling on purpose. Counts are of
//! the optimised build with the pinned toolchain; the debug build (`cargo test --benches`) runs
//! the measurement without checking ceilings. Without valgrind it says so and fails.
//!
//! A clock read (`rdtsc` on x86_64) is one instruction here: the ceilings count work, the
//! `hot_path` bench its time.

#[path = "../tests/support/emulator/mod.rs"]
mod emulator;
#[path = "support/table.rs"]
mod table;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use emulator::{H, pid, ty};
use nccl_profiler_otel::comm::{self, shed};
use table::{Bench, Table, kernel_descr, step_descr};

/// Callbacks of one kind per measured batch: fewer than the per-thread memory of recorded
/// SendPeerWait steps (64), as in NCCL, where a few steps per channel are in flight at once.
const BATCH: usize = 32;
/// Measured batches per kind.
const BATCHES: usize = 16;

/// Most instructions the plugin may add per callback, by kind, over the empty table (release
/// build, rustc 1.95, x86_64). Measured values are in docs/benchmarks.md.
const CEILINGS: [(&str, u64); 23] = [
    ("coll start", 585),
    ("coll stop", 100),
    ("send op start", 285),
    ("send op in progress (declined)", 55),
    ("step start", 195),
    ("step gpu wait (declined)", 55),
    ("step peer wait, first", 160),
    ("step peer wait, repeat", 70),
    ("step send wait", 145),
    ("step stop", 105),
    ("send op stop", 105),
    ("kernel start", 205),
    ("kernel stop state", 140),
    ("kernel stop", 100),
    ("recv op start", 285),
    ("recv step start", 180),
    ("recv step gpu wait", 150),
    ("recv step stop", 100),
    ("recv op stop", 105),
    ("coll start (counted)", 595),
    ("coll start (sampled)", 575),
    ("send op start (bare)", 260),
    ("step start (shed)", 97),
];

/// Counted by callgrind (`--toggle-collect`), then dumped (`--dump-after`): one dump per call.
#[inline(never)]
#[unsafe(no_mangle)]
fn callgrind_measured(batch: &mut dyn FnMut()) {
    batch()
}

/// Runs `f`, under callgrind's count when `measure` (its `kind` noted in `kinds`).
fn measured(measure: bool, kinds: &mut Vec<&'static str>, kind: &'static str, f: &mut dyn FnMut()) {
    if measure {
        kinds.push(kind);
        callgrind_measured(f);
    } else {
        f();
    }
}

/// Runs the callbacks of one batch per kind, in NCCL's order, over [`BATCH`] collectives
/// (each: Coll, one send ProxyOp with one step, one kernel channel, one receive ProxyOp with one
/// step); measured or not. Returns the kinds of the measured calls, in order.
fn batch(t: &Table, seq: u64, measure: bool, kinds: &mut Vec<&'static str>) {
    let mut run = |kind, f: &mut dyn FnMut()| measured(measure, kinds, kind, f);
    let mut colls = [std::ptr::null_mut(); BATCH];
    let mut ops = colls;
    let mut steps = colls;
    let mut kernels = colls;
    let mut recvs = colls;
    let mut recv_steps = colls;
    let mut descrs: Vec<_> = (seq..seq + BATCH as u64).map(table::allreduce_descr).collect();
    run("coll start", &mut || {
        (0..BATCH).for_each(|i| colls[i] = t.start(&mut descrs[i]));
    });
    run("coll stop", &mut || colls.iter().for_each(|&h| t.stop(h)));
    let op = |parent, send| emulator::plugin::proxy_op_descr(H(parent), pid(), 0, 1, 0, 1, 1 << 20, send);
    let mut descrs: Vec<_> = colls.iter().map(|&c| op(c, true)).collect();
    run("send op start", &mut || {
        (0..BATCH).for_each(|i| ops[i] = t.start(&mut descrs[i]));
    });
    run("send op in progress (declined)", &mut || {
        ops.iter().for_each(|&h| t.state(h, ty::OP_IN_PROGRESS, 0));
    });
    let mut descrs: Vec<_> = ops.iter().map(|&op| step_descr(op, 0)).collect();
    run("step start", &mut || {
        (0..BATCH).for_each(|i| steps[i] = t.start(&mut descrs[i]));
    });
    for (kind, state, bytes) in [
        ("step gpu wait (declined)", ty::SEND_GPU_WAIT, 0),
        ("step peer wait, first", ty::SEND_PEER_WAIT, 0),
        ("step peer wait, repeat", ty::SEND_PEER_WAIT, 0),
        ("step send wait", ty::SEND_WAIT, 1 << 20),
    ] {
        run(kind, &mut || steps.iter().for_each(|&h| t.state(h, state, bytes)));
    }
    run("step stop", &mut || steps.iter().for_each(|&h| t.stop(h)));
    run("send op stop", &mut || ops.iter().for_each(|&h| t.stop(h)));
    let mut descrs: Vec<_> = colls.iter().map(|&c| kernel_descr(c, 0)).collect();
    run("kernel start", &mut || {
        (0..BATCH).for_each(|i| kernels[i] = t.start(&mut descrs[i]));
    });
    run("kernel stop state", &mut || {
        kernels.iter().for_each(|&h| t.state(h, ty::KERNEL_CH_STOP, 2_000_000));
    });
    run("kernel stop", &mut || kernels.iter().for_each(|&h| t.stop(h)));
    let mut descrs: Vec<_> = colls.iter().map(|&c| op(c, false)).collect();
    run("recv op start", &mut || {
        (0..BATCH).for_each(|i| recvs[i] = t.start(&mut descrs[i]));
    });
    let mut descrs: Vec<_> = recvs.iter().map(|&op| step_descr(op, 0)).collect();
    run("recv step start", &mut || {
        (0..BATCH).for_each(|i| recv_steps[i] = t.start(&mut descrs[i]));
    });
    run("recv step gpu wait", &mut || {
        recv_steps.iter().for_each(|&h| t.state(h, ty::RECV_GPU_WAIT, 1 << 20));
    });
    run("recv step stop", &mut || recv_steps.iter().for_each(|&h| t.stop(h)));
    run("recv op stop", &mut || recvs.iter().for_each(|&h| t.stop(h)));
}

/// The shedding paths, after [`batch`], at levels forced through the test seam (the consumer
/// steps between them switch the plugin's window to the level): collectives counted without a
/// record (the highest level), sampled (level 2: 1 in 2 timed, and predecessors), then bare send
/// ops and their shed steps (level 1). The empty table runs the same calls.
fn shedding(b: &mut Bench, plugin: bool, seq: u64, measure: bool, kinds: &mut Vec<&'static str>) {
    let level = |b: &mut Bench, l: Option<u8>| {
        if plugin {
            comm::force_level(l);
            b.consume();
        }
    };
    let table = |b: &Bench| if plugin { b.plugin_table() } else { b.empty_table() };
    let mut run = |kind, f: &mut dyn FnMut()| measured(measure, kinds, kind, f);
    let mut colls = [std::ptr::null_mut(); BATCH];
    for (kind, l) in [("coll start (counted)", shed::MAX_LEVEL), ("coll start (sampled)", 2)] {
        level(b, Some(l));
        let t = table(b);
        let mut descrs: Vec<_> = (seq..seq + BATCH as u64).map(table::allreduce_descr).collect();
        run(kind, &mut || {
            (0..BATCH).for_each(|i| colls[i] = t.start(&mut descrs[i]))
        });
        colls.iter().for_each(|&h| t.stop(h));
    }
    level(b, Some(shed::DETAIL));
    let t = table(b);
    let mut descrs: Vec<_> = (seq..seq + BATCH as u64).map(table::allreduce_descr).collect();
    (0..BATCH).for_each(|i| colls[i] = t.start(&mut descrs[i]));
    let mut ops = [std::ptr::null_mut(); BATCH];
    let mut steps = ops;
    let op = |parent| emulator::plugin::proxy_op_descr(H(parent), pid(), 0, 1, 0, 1, 1 << 20, true);
    let mut descrs: Vec<_> = colls.iter().map(|&c| op(c)).collect();
    run("send op start (bare)", &mut || {
        (0..BATCH).for_each(|i| ops[i] = t.start(&mut descrs[i]))
    });
    let mut descrs: Vec<_> = ops.iter().map(|&op| step_descr(op, 0)).collect();
    run("step start (shed)", &mut || {
        (0..BATCH).for_each(|i| steps[i] = t.start(&mut descrs[i]))
    });
    ops.iter().chain(&colls).for_each(|&h| t.stop(h));
    level(b, None);
}

/// Under valgrind: one warm-up pass, then [`BATCHES`] measured ones; prints each measured
/// call's kind, one per line, in order.
fn child(plugin: bool) {
    let mut b = Bench::new(0xCA11_6127);
    let mut kinds = Vec::new();
    for (i, measure) in std::iter::once(false).chain([true; BATCHES]).enumerate() {
        let t = if plugin { b.plugin_table() } else { b.empty_table() };
        let seq = (i * BATCH) as u64;
        batch(&t, seq, measure, &mut kinds);
        if plugin {
            b.consume();
        }
        shedding(&mut b, plugin, seq, measure, &mut kinds);
    }
    kinds.iter().for_each(|k| println!("{k}"));
}

/// Instructions per callback by kind for one table, from one run under callgrind.
fn measure(plugin: bool, dir: &Path) -> BTreeMap<&'static str, f64> {
    let name = if plugin { "plugin" } else { "empty" };
    let out = dir.join(format!("{name}.out"));
    let exe = std::env::current_exe().expect("own path");
    let run = Command::new("valgrind")
        .args([
            "--tool=callgrind",
            "--collect-atstart=no",
            "--toggle-collect=callgrind_measured",
        ])
        .arg("--dump-after=callgrind_measured")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(&exe)
        .args(["--child", name])
        .output()
        .expect("valgrind runs");
    assert!(
        run.status.success(),
        "valgrind: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    let mut per_kind: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
    for (i, kind) in stdout.lines().enumerate() {
        let (&(name, _), part) = CEILINGS
            .iter()
            .find(|(n, _)| *n == kind)
            .zip(Some(dir.join(format!("{name}.out.{}", i + 1))))
            .unwrap_or_else(|| panic!("unknown kind {kind:?}"));
        let text = std::fs::read_to_string(&part).unwrap_or_else(|e| panic!("{}: {e}", part.display()));
        let ir = text
            .lines()
            .find_map(|l| l.strip_prefix("totals: ").or_else(|| l.strip_prefix("summary: ")))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{}: no totals line", part.display()));
        let e = per_kind.entry(name).or_default();
        *e = (e.0 + ir, e.1 + BATCH as u64);
    }
    per_kind
        .into_iter()
        .map(|(k, (ir, n))| (k, ir as f64 / n as f64))
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        return child(args.get(i + 1).is_some_and(|t| t == "plugin"));
    }
    if Command::new("valgrind").arg("--version").output().is_err() {
        eprintln!(
            "FAILED: valgrind is not installed (apt-get install valgrind): instructions per callback not counted"
        );
        std::process::exit(1);
    }
    let dir = std::env::temp_dir().join(format!("nccl-callgrind-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (empty, plugin) = (measure(false, &dir), measure(true, &dir));
    let _ = std::fs::remove_dir_all(&dir);
    let check = !cfg!(debug_assertions);
    println!("instructions per callback (callgrind; {BATCHES} batches of {BATCH} per kind)");
    println!(
        "{:<32} {:>8} {:>8} {:>8} {:>8}",
        "callback", "empty", "plugin", "added", "ceiling"
    );
    let mut over = Vec::new();
    for (kind, ceiling) in CEILINGS {
        let (e, p) = (empty[kind], plugin[kind]);
        let added = p - e;
        println!("{kind:<32} {e:>8.1} {p:>8.1} {added:>8.1} {ceiling:>8}");
        if check && added > ceiling as f64 {
            over.push(kind);
        }
    }
    if !check {
        println!("debug build: ceilings not checked (they are for `cargo bench --bench callgrind`)");
    }
    assert!(over.is_empty(), "over the ceiling: {over:?}");
}

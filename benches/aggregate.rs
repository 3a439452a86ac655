//! Aggregation throughput: one full window of 100,000 records through `aggregate::summarize`,
//! against a plain pass over the same records (read every record, branch on its kind) in the
//! same run; then the cost of recording that window's summary into the export pipeline's SDK
//! instruments (the telemetry thread's other per-window work).
//!
//! The window is what the plugin records for ring AllReduces on 8 ranks over 2 channels: per
//! collective a Coll start and stop, and per channel a ProxyOp (start, InProgress is not
//! recorded, stop) with 14 send steps of 3 records each (start, SendWait, stop), the two
//! channels' steps interleaved as one proxy thread progresses them. Handles are minted the way
//! the plugin mints them (the slot of the start record).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use nccl_profiler_otel::aggregate::{CommMeta, Frontier, Lanes, OpenOps, Sealed, WindowId, WindowSummary, summarize};
use nccl_profiler_otel::config::{Config, Export, Exporter};
use nccl_profiler_otel::export::pipeline::Pipeline;
use nccl_profiler_otel::record::handle::{CommId, Handle, Kind};
use nccl_profiler_otel::record::{Algo, Body, CollStart, Datatype, Func, Proto, ProxyOpStart, Record};
use nccl_profiler_otel::telemetry::report::Reporter;
use nccl_profiler_otel::telemetry::{self, Report};

const RECORDS: usize = 100_000;
const WINDOW: WindowId = WindowId {
    comm: CommId { slot: 1, generation: 1 },
    window: 2,
    epoch: 7,
};

/// Builds one window's records.
struct Win {
    recs: Vec<Record>,
    ts: u64,
}

impl Win {
    fn push(&mut self, id: u64, body: Body) {
        self.ts += 37;
        self.recs.push(Record { id, ts: self.ts, body });
    }

    fn start(&mut self, kind: Kind, body: Body) -> u64 {
        let slot = self.recs.len() as u32;
        let id = Handle::new(WINDOW.comm.slot, WINDOW.window, WINDOW.epoch, kind, slot).encode();
        self.push(id, body);
        id
    }
}

fn window() -> Vec<Record> {
    let mut w = Win {
        recs: Vec::with_capacity(RECORDS),
        ts: 1,
    };
    let (ranks, channels, steps) = (8, 2u8, 14);
    let mut seq = 0;
    while w.recs.len() + 2 + 2 * (2 + 3 * steps) <= RECORDS {
        let coll = w.start(
            Kind::Coll,
            Body::Coll(CollStart {
                seq,
                count: 1 << 22,
                func: Func::AllReduce,
                algo: Algo::Ring,
                proto: Proto::Simple,
                datatype: Datatype::Float32,
                n_channels: channels,
                graph: None,
                sample: nccl_profiler_otel::record::Sample::ALL,
            }),
        );
        w.push(coll, Body::Stop);
        let ops: Vec<u64> = (0..channels)
            .map(|channel| {
                w.start(
                    Kind::ProxyOp,
                    Body::ProxyOp(ProxyOpStart {
                        parent: coll,
                        rank: 3,
                        peer: 4,
                        channel,
                        send: true,
                        origin: 0,
                    }),
                )
            })
            .collect();
        for step in 0..steps {
            let s: Vec<u64> = ops
                .iter()
                .map(|&op| {
                    w.start(
                        Kind::ProxyStep,
                        Body::ProxyStep {
                            parent: op,
                            step: step as i32,
                        },
                    )
                })
                .collect();
            for &h in &s {
                w.push(
                    h,
                    Body::SendWait {
                        bytes: (1 << 19) + 4096 * (seq % 64),
                    },
                );
            }
            for &h in &s {
                w.push(h, Body::Stop);
            }
        }
        for op in ops {
            w.push(op, Body::Stop);
        }
        seq += 1;
        let _ = ranks;
    }
    // Fill the rest with collectives without children, as a busy user thread would add.
    while w.recs.len() + 2 <= RECORDS {
        let c = w.start(
            Kind::Coll,
            Body::Coll(CollStart {
                seq,
                count: 1024,
                func: Func::AllGather,
                algo: Algo::Ring,
                proto: Proto::Ll,
                datatype: Datatype::Int8,
                n_channels: 1,
                graph: None,
                sample: nccl_profiler_otel::record::Sample::ALL,
            }),
        );
        w.push(c, Body::Stop);
        seq += 1;
    }
    while w.recs.len() < RECORDS {
        w.recs.push(Record {
            id: 0,
            ts: 0,
            body: Body::Stop,
        });
    }
    w.recs
}

/// The baseline: one pass reading every record and branching on its kind.
fn plain_pass(records: &[Record]) -> (u64, u64, u64) {
    let (mut starts, mut bytes, mut ts) = (0u64, 0u64, 0u64);
    for r in records {
        ts = ts.wrapping_add(r.ts ^ r.id);
        match r.body {
            Body::SendWait { bytes: b } => bytes += b,
            Body::Stop => {}
            _ => starts += 1,
        }
    }
    (starts, bytes, ts)
}

/// The window through a fresh table of open operations, everything released (as `finalize`).
fn summarize_all(records: &[Record], meta: &CommMeta) -> WindowSummary {
    let sealed = Sealed {
        records,
        lanes: Lanes::single(records.len()),
        id: WINDOW,
        forced: false,
        lost_children: false,
    };
    let at = Frontier {
        now: std::time::Instant::now(),
        filling: 1,
        settled: 1,
        flush: true,
        lost_held: false,
        drops: 0,
    };
    summarize(sealed, meta, 1e-9, &mut OpenOps::new(Duration::ZERO), at)
}

fn bench(c: &mut Criterion) {
    let records = window();
    let meta = CommMeta {
        hash: 0xA66,
        name: "bench".into(),
        rank: 3,
        nranks: 8,
        nnodes: 8,
        gpu: Default::default(),
    };
    let s = summarize_all(&records, &meta);
    assert_eq!(s.stats.records, RECORDS as u64);
    assert_eq!((s.stats.orphans, s.stats.unfinished), (0, 0), "{:?}", s.stats);
    assert!(s.links.iter().map(|l| l.transfers).sum::<u64>() > 30_000);

    let mut g = c.benchmark_group("aggregate");
    g.throughput(Throughput::Elements(RECORDS as u64));
    g.bench_function("plain_pass", |b| b.iter(|| black_box(plain_pass(black_box(&records)))));
    g.bench_function("summarize", |b| {
        b.iter(|| black_box(summarize_all(black_box(&records), &meta)))
    });
    g.finish();

    // Own median of 30 runs each, for the ratio.
    let median = |f: &dyn Fn()| {
        let mut v: Vec<f64> = (0..30)
            .map(|_| {
                let t = std::time::Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .collect();
        v.sort_by(f64::total_cmp);
        v[15]
    };
    let base = median(&|| {
        black_box(plain_pass(black_box(&records)));
    });
    let sum = median(&|| {
        black_box(summarize_all(black_box(&records), &meta));
    });
    // The same window's summary added to the interval and recorded into the export pipeline's
    // SDK instruments, as the telemetry thread does next (file exporter; no interval ends, so
    // nothing is collected).
    let pipeline = std::cell::RefCell::new(export_pipeline());
    let summary = summarize_all(&records, &meta);
    let record = median(&|| {
        let (p, r) = &mut *pipeline.borrow_mut();
        let windows = r.add([summary.clone()]);
        telemetry::Pipeline::export(p, Report { windows, end: None });
    });
    println!();
    println!(
        "aggregate: {RECORDS} records: summarize {:.2} ms = {:.1} M records/s; plain pass {:.3} ms = {:.0} M records/s; ratio {:.1}x",
        sum * 1e3,
        RECORDS as f64 / sum / 1e6,
        base * 1e3,
        RECORDS as f64 / base / 1e6,
        sum / base
    );
    println!(
        "aggregate: recording its summary into the SDK {:.2} ms = {:.1} M records/s; summarize and record {:.1} M records/s",
        record * 1e3,
        RECORDS as f64 / record / 1e6,
        RECORDS as f64 / (sum + record) / 1e6
    );
}

/// An export pipeline writing OTLP-JSON lines to `/dev/null`, with the telemetry thread's
/// reporter.
fn export_pipeline() -> (Pipeline, Reporter) {
    let config: &'static Config = Box::leak(Box::new(Config {
        export: Export {
            exporter: Exporter::File,
            file: "/dev/null".into(),
            ..Config::default().export
        },
        ..Config::default()
    }));
    let pipeline = Pipeline::new(config).expect("the file exporter makes a pipeline");
    (pipeline, Reporter::new(config, Instant::now()))
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench
}
criterion_main!(benches);

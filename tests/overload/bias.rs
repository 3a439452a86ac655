//! Counts, the timed sample and its weighted mean under overload; two ranks at adjacent levels;
//! graph replays; a mask overwritten with every bit.

use std::time::Duration;

use nccl_profiler_otel::comm;
use nccl_profiler_otel::telemetry::consumer;

use crate::drive::{self, Capture, Load, Seen, Tally};
use crate::support::emulator::{Plugin, logger};
use crate::{Calibration, THREADS, begin, comms};

/// How long each load runs.
const RUN: Duration = Duration::from_millis(1000);

/// One load: 4 communicators at `factor` × the ceiling for [`RUN`]; returns each one's tally and
/// what the plugin reported.
fn overload(
    p: &Plugin,
    capture: &Capture,
    cal: &Calibration,
    base: u64,
    factor: f64,
    load: Load,
) -> Vec<(Tally, Seen)> {
    let cs = comms(p, base, 4);
    let rate = factor * cal.ceiling() / THREADS as f64;
    cal.throttle();
    let tallies = drive::run(p, &cs, THREADS, Load { rate, ..load });
    // What is left is processed at full speed.
    consumer::set_throttle(0);
    cs.iter().for_each(|c| p.finalize(c.context));
    tallies
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t, capture.seen(base + i as u64)))
        .collect()
}

/// Prints a load's figures; asserts every operation counted, at least `timed_share` of them
/// timed, and (when `unbiased`) the weighted mean of the timed ones within 5 % of the mean over
/// all of them.
fn check(name: &str, runs: &[(Tally, Seen)], timed_share: f64, unbiased: bool) {
    for (i, (t, s)) in runs.iter().enumerate() {
        let error = s.mean() / t.mean() - 1.0;
        let timed = s.timed as f64 / t.issued as f64;
        println!(
            "{name} comm {i}: issued {}, recorded {}, counted {}, timed {:.1} %, weighted mean {:.1} µs vs {:.1} µs ({:+.1} %)",
            t.issued,
            s.recorded,
            s.counted,
            100.0 * timed,
            s.mean() * 1e6,
            t.mean() * 1e6,
            100.0 * error
        );
        assert_eq!(
            s.recorded + s.counted,
            t.issued,
            "{name} comm {i}: every operation counted"
        );
        assert!(timed >= timed_share, "{name} comm {i}: {:.1} % timed", 100.0 * timed);
        if unbiased {
            assert!(
                error.abs() <= 0.05,
                "{name} comm {i}: weighted mean off by {:+.1} %",
                100.0 * error
            );
        }
    }
}

#[test]
fn counted_timed_unbiased_at_3x_and_10x() {
    let Some((_serial, capture, p)) = begin() else { return };
    // Keeps NCCL's logger with the plugin while the others come and go.
    let keeper = comms(&p, 0x0E00_0000, 1);
    let cal = Calibration::get(&p, capture);
    let three = overload(&p, capture, &cal, 0x0E20_0000, 3.0, Load::paced(0.0, RUN));
    check("3×", &three, 0.10, true);
    std::thread::sleep(4 * crate::INTERVAL);
    let ten = overload(&p, capture, &cal, 0x0E30_0000, 10.0, Load::paced(0.0, RUN));
    check("10×", &ten, 0.10, true);
    // Larger weights: every window at k = 4 (1 in 16 timed).
    comm::force_level(Some(1 + 4));
    let forced = overload(&p, capture, &cal, 0x0E40_0000, 3.0, Load::paced(0.0, RUN / 2));
    comm::force_level(None);
    check("k = 4", &forced, 0.0, true);
    std::thread::sleep(3 * crate::INTERVAL);
    let lines: Vec<String> = logger::lines().into_iter().map(|l| l.text).collect();
    let said = |what: &str| lines.iter().any(|l| l.contains(what));
    println!(
        "INFO lines: shedding {}, over {}",
        said("overload: shedding"),
        said("overload over")
    );
    assert!(said("overload: shedding records"), "the start of shedding is logged");
    assert!(said("overload over after"), "its end is logged");
    keeper.iter().for_each(|c| p.finalize(c.context));
}

/// Two ranks of one communicator (the same hash), one at level `1 + k`, the other at `2 + k`,
/// through the same sequence of collectives: the second times a subset of what the first times.
#[test]
fn ranks_at_adjacent_levels_keep_nested_samples() {
    let Some((_serial, capture, p)) = begin() else { return };
    let load = Load {
        unique_sizes: true,
        ..Load::paced(2000.0, Duration::from_millis(300))
    };
    let mut runs = Vec::new();
    for (rank, level) in [(0, 3), (1, 4)] {
        comm::force_level(Some(level));
        let (c, _) = p.init(Some("nested"), 0x0E50_0000, 1, 2, rank);
        let tally = drive::run(&p, &[c], 1, load);
        p.finalize(c.context);
        comm::force_level(None);
        runs.push((tally[0].issued, capture.seen_rank(0x0E50_0000, Some(rank)).samples));
    }
    // Both ranks ran for the same time: compare the collectives both issued (sizes name them).
    let both = runs[0].0.min(runs[1].0);
    let issued_by_both = |b: &u64| *b < (64 << 10) + 4 * both;
    let mut sets = runs.iter().map(|r| {
        let mut set: Vec<u64> = r.1.iter().copied().filter(issued_by_both).collect();
        set.sort_unstable();
        set.dedup();
        set
    });
    let (lower, higher) = (sets.next().unwrap_or_default(), sets.next().unwrap_or_default());
    let outside = higher.iter().filter(|b| lower.binary_search(b).is_err()).count();
    println!(
        "nested: of {both} collectives, {} timed at k = 2, {} at k = 3, {outside} of those not at k = 2",
        lower.len(),
        higher.len()
    );
    assert_eq!(outside, 0, "the higher level's sample is within the lower one's");
    let share = lower.len() as f64 / both as f64;
    assert!((share - 0.25).abs() < 0.1, "k = 2: about 1 in 4 timed, got {share:.2}");
    assert!(!higher.is_empty(), "k = 3 times some");
}

/// CUDA graph replays: every Coll start of a replay carries the captured sequence number (0 here),
/// so sampling by seqNumber would time all or none; the plugin's own count keeps both the count
/// and the sample.
#[test]
fn graph_replays_are_counted_and_sampled_by_count() {
    let Some((_serial, capture, p)) = begin() else { return };
    comm::force_level(Some(1 + 2));
    let load = Load {
        frozen_seq: true,
        ..Load::paced(1000.0, Duration::from_millis(400))
    };
    let cs = comms(&p, 0x0E60_0000, 1);
    let tally = drive::run(&p, &cs, 1, load);
    p.finalize(cs[0].context);
    comm::force_level(None);
    let seen = capture.seen(0x0E60_0000);
    let share = seen.timed as f64 / tally[0].issued as f64;
    println!(
        "graph replays: issued {}, recorded {}, counted {}, timed {:.1} %",
        tally[0].issued,
        seen.recorded,
        seen.counted,
        100.0 * share
    );
    assert_eq!(seen.recorded + seen.counted, tally[0].issued, "every replay counted");
    assert!(
        (share - 0.25).abs() < 0.1,
        "k = 2 on frozen sequence numbers: about 1 in 4 timed"
    );
}

/// NCCL's RAS may set every bit of the activation mask: every event type still arrives (here:
/// ProxyCtrl too, and the mask the plugin sets is ignored), so the plugin must shed on its own.
#[test]
fn an_overwritten_mask_still_sheds() {
    let Some((_serial, capture, p)) = begin() else { return };
    let cal = Calibration::get(&p, capture);
    cal.throttle();
    let cs = comms(&p, 0x0E80_0000, 2);
    let rate = 10.0 * cal.ceiling() / 2.0;
    let load = Load {
        proxy_ctrl: true,
        ..Load::paced(rate, Duration::from_millis(800))
    };
    let mut top = 0;
    let tallies = std::thread::scope(|s| {
        let run = s.spawn(|| drive::run(&p, &cs, 2, load));
        while !run.is_finished() {
            top = top.max(consumer::all().map(|s| s.shed_level()).max().unwrap_or(0));
            std::thread::sleep(Duration::from_millis(20));
        }
        run.join().expect("drivers")
    });
    consumer::set_throttle(0);
    cs.iter().for_each(|c| p.finalize(c.context));
    for (i, t) in tallies.iter().enumerate() {
        let seen = capture.seen(0x0E80_0000 + i as u64);
        println!(
            "mask all bits, comm {i}: issued {}, recorded {}, counted {}, highest level {top}",
            t.issued, seen.recorded, seen.counted
        );
        assert_eq!(seen.recorded + seen.counted, t.issued, "every operation counted");
    }
    assert!(top > 0, "the controller raised the level");
}

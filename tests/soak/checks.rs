//! The checks of a run, each group collecting its failures into [`Checks`] so that one run
//! reports all of them.

use std::time::Duration;

use crate::driver::Outcomes;
use crate::hist::Hist;
use crate::received::{Snap, Totals};
use crate::{COMMS, GROSS, INTERVAL, Kind, QUEUE, RATIOS, RESUME_BOUND, RSS_BOUND, Run};

/// Failed checks.
#[derive(Default)]
pub struct Checks(pub Vec<String>);

impl Checks {
    pub fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            let what = what();
            println!("FAILED: {what}");
            self.0.push(what);
        }
    }
}

/// Callback latency: the faulty phases against the healthy ones, and a gross bound.
pub fn latency(checks: &mut Checks, run: &Run) {
    let (phases, hists, stalls) = (&run.phases, &run.hists, &run.stalls);
    // Callback latency: each faulty kind's phases pooled against the healthy phases after the
    // first (warm-up); no callback slower than the gross bound plus the machine's own stalls.
    let pooled = |kind: Kind| {
        let mut h = Hist::new();
        (1..phases.len())
            .filter(|&i| phases[i].kind == kind)
            .for_each(|i| h.merge(&hists[i]));
        h
    };
    let healthy = pooled(Kind::Healthy);
    let qs = [0.5, 0.99, 0.999];
    for kind in [Kind::Hung, Kind::Down] {
        let h = pooled(kind);
        let ratios: Vec<f64> = qs
            .iter()
            .map(|&q| h.quantile(q) as f64 / healthy.quantile(q).max(1) as f64)
            .collect();
        println!(
            "latency {} / healthy: p50 {:.2}, p99 {:.2}, p99.9 {:.2} (allowed {RATIOS:?})",
            kind.name(),
            ratios[0],
            ratios[1],
            ratios[2]
        );
        for ((r, allowed), q) in ratios.iter().zip(RATIOS).zip(qs) {
            checks.check(*r <= allowed, || {
                format!(
                    "{} phases: latency quantile {q} is {r:.2}x the healthy one",
                    kind.name()
                )
            });
        }
    }
    for (i, h) in hists.iter().enumerate() {
        checks.check(h.n > 1000, || format!("phase {i}: only {} callbacks timed", h.n));
        let bound = GROSS + stalls[i];
        checks.check(Duration::from_nanos(h.max) < bound, || {
            format!(
                "phase {i} ({}): a callback took {} ns (bound {bound:?})",
                phases[i].kind.name(),
                h.max
            )
        });
    }
}

/// Memory stays flat after the warm-up cycle.
pub fn memory(checks: &mut Checks, run: &Run) {
    let rss_samples = &run.rss;
    let peak = |warm: bool| {
        rss_samples
            .iter()
            .filter(|(i, _)| (*i < 4) == warm)
            .map(|(_, r)| *r)
            .max()
            .unwrap_or(0)
    };
    let (warm, after) = (peak(true), peak(false));
    println!(
        "RSS: warm-up peak {:.1} MiB, later peak {:.1} MiB (allowed +{} MiB)",
        warm as f64 / (1 << 20) as f64,
        after as f64 / (1 << 20) as f64,
        RSS_BOUND >> 20
    );
    checks.check(after <= warm + RSS_BOUND, || {
        format!("RSS grew from {warm} to {after} bytes after the warm-up")
    });
}

/// No window wedges, and no record is dropped for lack of room while the collector is faulty.
pub fn windows(checks: &mut Checks, run: &Run, phase_len: Duration) {
    let (phases, deltas) = (&run.phases, run.deltas());
    let full = |t: &Totals| t.dropped.get("full").copied().unwrap_or(0);
    // No wedged window: every communicator's windows advance in every phase, and no record is
    // dropped for lack of room while the collector is faulty.
    let min_windows = (phase_len.as_secs_f64() / INTERVAL / 4.0) as u64;
    for (i, ph) in phases.iter().enumerate() {
        let Some((a, b)) = deltas[i] else {
            checks.check(false, || format!("phase {i}: no requests bound it"));
            continue;
        };
        checks.check(b.windows_by_comm.len() == COMMS, || {
            format!("phase {i}: windows of {} communicators", b.windows_by_comm.len())
        });
        for (hash, &w) in &b.windows_by_comm {
            let moved = w - a.windows_by_comm.get(hash).copied().unwrap_or(0);
            checks.check(moved >= min_windows, || {
                format!("phase {i}: communicator {hash} processed {moved} windows (< {min_windows})")
            });
        }
        if ph.kind != Kind::Healthy {
            let dropped = full(b) - full(a);
            checks.check(dropped == 0, || {
                format!(
                    "phase {i} ({}): {dropped} records dropped for lack of room",
                    ph.kind.name()
                )
            });
        }
    }
}

/// Every callback the emulator made is accounted for by the plugin's counters.
pub fn accounting(checks: &mut Checks, emitted: &Outcomes, total: &Totals) {
    // Every drop is counted: each recordable callback recorded or dropped, each declined one
    // counted (exact: the totals were collected after the last finalize).
    checks.check(total.windows_dropped == 0, || {
        format!(
            "{} window summaries dropped: their records are in no counter",
            total.windows_dropped
        )
    });
    // Shedding (the consumer fell behind: a machine loaded by something else) counts a shed
    // ProxyStep once for all its callbacks, so the sum is exact only without it.
    let accounted = total.recorded + total.drops();
    let exact = if total.shed == 0 {
        emitted.record == accounted
    } else {
        println!("{} records shed: the consumer fell behind", total.shed);
        emitted.record >= accounted
    };
    checks.check(exact, || {
        format!(
            "{} recordable callbacks, {} recorded + {:?} dropped, {} shed",
            emitted.record, total.recorded, total.dropped, total.shed
        )
    });
    checks.check(emitted.declined == total.declined, || {
        format!("{} declined callbacks, {} counted", emitted.declined, total.declined)
    });
    checks.check((total.rejected, total.panics, total.overflow) == (0, 0, 0), || {
        format!(
            "rejected {}, panics {}, overflow {}",
            total.rejected, total.panics, total.overflow
        )
    });
}

/// Export requests are accounted for, faults are counted and exports resume after each.
pub fn export(checks: &mut Checks, run: &Run, last: &Snap) {
    let (phases, snaps, total, deltas) = (&run.phases, &run.snaps, &last.totals, run.deltas());
    // Export requests: one per interval plus the last finalize's; each received, failed or
    // dropped. The period is the mean gap between consecutive healthy collections (the
    // telemetry thread's 10 ms tick rounds the interval up); QUEUE + 1 requests may still wait or
    // be in flight when the totals were collected.
    let gaps: Vec<u64> = snaps
        .windows(2)
        .map(|w| w[1].collected.saturating_sub(w[0].collected))
        .filter(|&g| g > 0 && g < 2 * (INTERVAL * 1e9) as u64)
        .collect();
    let period = gaps.iter().sum::<u64>() as f64 / 1e9 / gaps.len().max(1) as f64;
    let made = (last.collected - phases[0].start_ns) as f64 / 1e9 / period;
    let accounted = (snaps.len() as u64 + total.failures + total.export_dropped) as f64;
    println!(
        "export requests: ~{made:.0} made (period {period:.3} s), {accounted} accounted for ({} received, {} failed, {} \
         dropped)",
        snaps.len(),
        total.failures,
        total.export_dropped
    );
    checks.check(
        accounted >= made * 0.97 - (QUEUE + 2) as f64 && accounted <= made * 1.03 + 2.0,
        || format!("export requests: ~{made:.0} made, {accounted} received, failed or dropped"),
    );
    // Requests the plugin counts as accepted (`export.sent`) are the ones the collector kept: the
    // last request's count covers every earlier one, less those still in flight or queued when it
    // was collected.
    let received = snaps.len() as u64;
    println!(
        "export requests: {received} received, {} counted sent before the last",
        total.sent
    );
    checks.check(total.sent < received && total.sent + QUEUE + 2 >= received, || {
        format!(
            "{received} requests received, but the last one counts {} sent before it",
            total.sent
        )
    });
    checks.check(total.export_dropped > 0, || {
        "a hung collector never made the queue drop".to_owned()
    });

    // Faults are counted, and exports resume after each.
    for (i, ph) in phases.iter().enumerate() {
        if let (Kind::Hung | Kind::Down, Some((a, b))) = (ph.kind, deltas[i]) {
            let failed = b.failures + b.export_dropped - a.failures - a.export_dropped;
            let least = (ph.secs / period * 0.5) as u64;
            checks.check(failed >= least, || {
                format!(
                    "phase {i} ({}): {failed} failed or dropped requests (< {least})",
                    ph.kind.name()
                )
            });
        }
        if i > 0 && ph.kind == Kind::Healthy {
            checks.check(ph.resume.is_some_and(|r| r <= RESUME_BOUND), || {
                format!(
                    "phase {i}: exports resumed after {:?} (bound {RESUME_BOUND:?})",
                    ph.resume
                )
            });
        }
    }
}

//! The per-phase table and the totals of a run, on stdout.

use crate::received::Totals;
use crate::{Run, SAMPLE_ONE_IN};

/// Prints one line per phase (callbacks, latency quantiles, stalls, RSS, windows, export
/// outcomes, resume time), the totals and the CPU time by thread.
pub fn table(run: &Run, total: &Totals) {
    let (phases, hists, calls, stalls, cpu, emitted) =
        (&run.phases, &run.hists, &run.calls, &run.stalls, &run.cpu, &run.emitted);
    let (run_secs, received) = (run.secs, run.snaps.len());
    let all_calls: u64 = calls.iter().sum();
    let deltas = run.deltas();
    println!(
        "\n{:>3} {:<7} {:>5} {:>10} {:>5} {:>5} {:>5} {:>6} {:>9} {:>6} {:>7} {:>7} {:>5} {:>5} {:>5} {:>6} {:>6}",
        "#",
        "phase",
        "s",
        "callbacks",
        "M/s",
        "p50",
        "p99",
        "p99.9",
        "max ns",
        "stall",
        "RSS MiB",
        "windows",
        "recv",
        "fail",
        "qdrop",
        "evdrop",
        "resume"
    );
    for (i, ph) in phases.iter().enumerate() {
        let h = &hists[i];
        let d = |f: fn(&Totals) -> u64| deltas[i].map_or("?".to_owned(), |(a, b)| (f(b) - f(a)).to_string());
        println!(
            "{:>3} {:<7} {:>5.1} {:>10} {:>5.2} {:>5} {:>5} {:>6} {:>9} {:>6.1} {:>7.1} {:>7} {:>5} {:>5} {:>5} {:>6} {:>6}",
            i,
            ph.kind.name(),
            ph.secs,
            calls[i],
            calls[i] as f64 / ph.secs / 1e6,
            h.quantile(0.5),
            h.quantile(0.99),
            h.quantile(0.999),
            h.max,
            stalls[i].as_secs_f64() * 1e3,
            ph.rss_max as f64 / (1 << 20) as f64,
            d(|t| t.windows),
            ph.received,
            d(|t| t.failures),
            d(|t| t.export_dropped),
            d(Totals::drops),
            ph.resume.map_or("-".to_owned(), |r| format!("{:.2}s", r.as_secs_f64())),
        );
    }
    println!(
        "\np50…max: callback latency in ns (one callback in {SAMPLE_ONE_IN} timed); stall: the canary's worst 1 ms \
         oversleep in ms (machine noise); windows, fail (export.failures), qdrop (export.dropped), evdrop \
         (events.dropped): change from the first to the last request collected within a healthy phase, from the \
         last before to the first after a faulty one; recv: requests arrived; resume: phase start to the first \
         request with fresh data"
    );
    println!(
        "totals: {all_calls} callbacks in {run_secs:.1} s ({:.2} M/s), {} timed; emitted: {} recordable, {} declined, \
         {} ignored; plugin: {} recorded, dropped {:?}, {} declined, {} rejected, {} panics; windows {} processed, \
         {} forced, {} dropped; {} unfinished, {} orphaned; export: {} requests received, {} failures, {} dropped; \
         overflow {}",
        all_calls as f64 / run_secs / 1e6,
        hists.iter().map(|h| h.n).sum::<u64>(),
        emitted.record,
        emitted.declined,
        emitted.ignored,
        total.recorded,
        total.dropped,
        total.declined,
        total.rejected,
        total.panics,
        total.windows,
        total.windows_forced,
        total.windows_dropped,
        total.unfinished,
        total.orphaned,
        received,
        total.failures,
        total.export_dropped,
        total.overflow,
    );
    let cpu: Vec<String> = cpu
        .iter()
        .filter(|(_, secs)| **secs >= 0.05)
        .map(|(name, secs)| format!("{name} {secs:.1} s ({:.1} %)", 100.0 * secs / run_secs))
        .collect();
    println!("CPU time by thread (share of one core): {}", cpu.join(", "));
}

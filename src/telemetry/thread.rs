//! The telemetry thread: one per process, started by the first `init`, never stopped. Every
//! [`TICK`] (or at once on a flush request) it applies KernelCh's duty cycle to the activation
//! mask, polls every communicator, delivers the summaries to the sinks, logs the hangs that
//! started, and hands the export [`Pipeline`] one [`Report`] (the interval's end when it ends or
//! a flush asks; a hang that starts makes the next pass follow at once and end the interval). While no communicator is live it is parked (no wake-ups: cores pinned for
//! training see no jitter from it) until an `init` ([`super::flush::wake`]) or a flush, once one
//! interval's export made after the last communicator went has gone through (the final totals
//! reach the collector; while it fails, every interval tries again). It measures the share of
//! time it works (a shed level input, [`Load`]) and logs one INFO line when communicators start
//! shedding records and one when all stopped ([`Episode`]).
//! Called on: NCCL's init thread ([`start`]); any thread (`passes`, a test seam).
#![forbid(unsafe_code)]

use std::panic::{AssertUnwindSafe, catch_unwind};
#[cfg(any(test, feature = "testing"))]
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use super::consumer::{self, BUSY_TICK, Polled, Slot};
use super::report::{Now, Report, Reporter};
use super::{Backend, BuildPipeline, CommState, flush, inbox, process, sink};
use crate::comm::shed::k_of;
use crate::config::Config;
use crate::stats::STATS;
use crate::{activation, clock};

/// How often the thread looks at the windows (close triggers are checked at this granularity),
/// every [`BUSY_TICK`] while a communicator fills its window fast.
pub const TICK: Duration = Duration::from_millis(10);

/// Passes the thread made (wake-ups), for tests of its parking.
#[cfg(any(test, feature = "testing"))]
static PASSES: AtomicU64 = AtomicU64::new(0);

/// Passes the telemetry thread has made so far.
#[cfg(any(test, feature = "testing"))]
pub fn passes() -> u64 {
    PASSES.load(Ordering::Relaxed)
}

/// Starts the telemetry thread once per process, with the export back end `backend` builds
/// (called once, before the thread exists; `None` when export is off). Failure to spawn is logged
/// and leaves windows to be processed at `finalize` only. Returns whether the thread runs.
/// Called on: NCCL's init thread.
pub fn start(backend: impl FnOnce() -> Option<Backend>) -> bool {
    process::claim(|| {
        let pipeline = backend().map(|b| {
            inbox::open();
            flush::set_delivery(b.delivery);
            b.pipeline
        });
        let spawned = std::thread::Builder::new()
            .name("nccl-otel-telemetry".into())
            .spawn(move || run(pipeline));
        if let Err(e) = &spawned {
            tracing::warn!("cannot start the telemetry thread ({e}); windows are processed at finalize only");
        }
        spawned.is_ok()
    })
}

/// The thread's loop: wait a tick (or a flush request), poll, export. A panic in one pass is
/// counted and the loop goes on.
fn run(build: Option<BuildPipeline>) {
    let mut pipeline = build.and_then(|build| build());
    let mut reporter = pipeline.as_ref().map(|_| Reporter::new(Config::global(), Instant::now()));
    let mut busy = false;
    // A hang started in the last pass: this one follows at once and reports.
    let mut hang = false;
    // The latest interval export since no communicator was live (its number), and whether one
    // went through.
    let (mut idle_export, mut exported) = (None, false);
    let mut load = Load::new(Instant::now());
    let mut episode: Option<Episode> = None;
    let mut trimmed = false;
    loop {
        let live = consumer::all().any(|s| s.comm.is_live());
        if live {
            (idle_export, exported) = (None, false);
        } else if idle_export.is_some_and(flush::exported) {
            (idle_export, exported) = (None, true);
        }
        let tick = match (busy, live) {
            _ if hang => Some(Duration::ZERO),
            (_, false) if exported || pipeline.is_none() => None,
            (true, _) => Some(BUSY_TICK),
            (false, _) => Some(TICK),
        };
        let request = flush::next_request(tick);
        #[cfg(any(test, feature = "testing"))]
        PASSES.fetch_add(1, Ordering::Relaxed);
        let mut seq = None;
        let cpu = clock::thread_cpu();
        let pass = catch_unwind(AssertUnwindSafe(|| {
            let now = Instant::now();
            activation::tick(SystemTime::now());
            let hung = std::mem::take(&mut hang);
            let ends = reporter.as_ref().is_some_and(|r| request.is_some() || hung || r.due(now));
            let mut polled;
            (busy, polled) = poll_all(now, load.busy(), ends);
            for line in polled.iter_mut().filter_map(|p| p.hang.take()) {
                tracing::warn!("{line}");
                hang = true;
            }
            Episode::follow(&mut episode, now);
            trim_when_idle(&mut trimmed);
            if request.is_some_and(|r| r.drain_live) {
                // The exit flush processes every window of the live communicators that holds
                // records, and every operation they still hold (open events counted unfinished).
                drain_all(&mut polled, pipeline.as_mut().zip(reporter.as_mut()));
            }
            // What other threads left in the inbox comes first, then this pass's windows.
            let mut summaries = inbox::take();
            summaries.extend(polled.iter_mut().flat_map(|p| std::mem::take(&mut p.summaries)));
            let (Some(pipeline), Some(reporter)) = (pipeline.as_mut(), reporter.as_mut()) else {
                return;
            };
            let windows = reporter.add(summaries);
            let end = ends.then(|| reporter.close(now, process(polled.into_iter().filter_map(|p| p.state))));
            seq = pipeline.export(Report { windows, end });
        }));
        if pass.is_err() {
            STATS.panics.incr();
        }
        load.worked(clock::thread_cpu().saturating_sub(cpu), Instant::now());
        match request {
            Some(r) => flush::serve(r, seq),
            // The latest interval export counts (an earlier one may have failed).
            None if !live && !exported && seq.is_some() => idle_export = seq,
            None => {}
        }
    }
}

/// One pass over every communicator, their states with it when the pass `ends` the interval;
/// returns whether one of them is [`Slot::busy`], and what each poll yielded (its summaries
/// already handed to the sinks).
/// Processing a full window takes milliseconds: after each communicator that processed one,
/// every communicator's window is closed if due, so that a fast one does not fill its window's
/// headroom meanwhile.
fn poll_all(now: Instant, load: f64, ends: bool) -> (bool, Vec<Polled>) {
    let secs_per_tick = clock::secs_per_tick();
    let (mut busy, mut all) = (false, Vec::new());
    for slot in consumer::all() {
        let polled = slot.poll_loaded(now, secs_per_tick, load, ends);
        if polled.summaries.iter().any(|s| s.stats.records > 0) {
            let now = Instant::now();
            consumer::all().for_each(|s| s.rotate(now));
        }
        sink::to_sinks(&polled.summaries);
        all.push(polled);
        busy |= slot.busy();
    }
    (busy, all)
}

/// At the exit flush: drains every communicator ([`Slot::drain`]), in slot order, its summaries and
/// state in place of its poll's. A drain takes a while, and other threads' finalizes may meanwhile
/// fill the bounded inbox: what waits there goes to the pipeline before each drain.
fn drain_all(polled: &mut Vec<Polled>, mut export: Option<(&mut Box<dyn super::Pipeline>, &mut Reporter)>) {
    let secs_per_tick = clock::secs_per_tick();
    for (i, slot) in consumer::all().enumerate() {
        if let Some((pipeline, reporter)) = export.as_mut() {
            let windows = reporter.add(inbox::take());
            pipeline.export(Report { windows, end: None });
        }
        let drained = slot.drain(secs_per_tick);
        sink::to_sinks(&drained.summaries);
        if polled.len() <= i {
            polled.resize_with(i + 1, Polled::default);
        }
        let p = &mut polled[i];
        p.summaries.extend(drained.summaries);
        p.state = drained.state;
    }
}

/// How long the thread's busy fraction is measured over.
const LOAD_SPAN: Duration = Duration::from_millis(100);

/// The fraction of wall time the thread spends working in its passes (its CPU time: a host whose
/// other threads keep this one waiting for a core does not make it busy; a backlog of windows
/// says when it falls behind), over the last whole [`LOAD_SPAN`].
struct Load {
    since: Instant,
    work: Duration,
    last: f64,
}

impl Load {
    fn new(now: Instant) -> Load {
        Load {
            since: now,
            work: Duration::ZERO,
            last: 0.0,
        }
    }

    /// The busy fraction of the last whole span (0 before one ended).
    fn busy(&self) -> f64 {
        self.last
    }

    /// Counts a pass that ended at `end` and took `work` of CPU time; a span that ended closes.
    fn worked(&mut self, work: Duration, end: Instant) {
        self.work += work;
        let span = end.saturating_duration_since(self.since);
        if span >= LOAD_SPAN {
            self.last = (self.work.as_secs_f64() / span.as_secs_f64()).min(1.0);
            (self.since, self.work) = (end, Duration::ZERO);
        }
    }
}

/// A shedding episode: from the first communicator whose controller wants a level above 0 to a
/// whole interval with every communicator at 0. Process-wide: one INFO line at each end.
struct Episode {
    start: Instant,
    /// Since when every communicator is back at 0.
    calm_since: Option<Instant>,
    /// Per communicator slot, its generation and records not taken (drops for lack of room and
    /// ProxyStep detail shed) when the episode started.
    not_taken: Vec<(u16, u64)>,
}

/// Records a communicator did not take (its counters since its `init`).
fn not_taken(s: Slot<'_>) -> u64 {
    let d = s.comm.drop_counts();
    d.full + d.shed
}

impl Episode {
    /// Starts or ends the episode from the communicators' levels at `now`, logging each edge.
    fn follow(episode: &mut Option<Episode>, now: Instant) {
        let levels = consumer::all().filter(|s| s.comm.is_live()).map(|s| s.shed_level());
        let (shedding, top) = levels.fold((0, 0), |(n, top), l| (n + usize::from(l > 0), top.max(l)));
        match episode {
            None if shedding > 0 => {
                let k = k_of(top);
                let timed = if k > 0 { format!(", 1 in {} operations timed", 1u64 << k) } else { String::new() };
                tracing::info!(
                    "overload: shedding records on {shedding} communicator(s) (highest level {top}: ProxyStep detail \
                     off{timed}); every operation is still counted"
                );
                let not_taken = consumer::all().map(|s| (s.comm.generation(), not_taken(s))).collect();
                *episode = Some(Episode {
                    start: now,
                    calm_since: None,
                    not_taken,
                });
            }
            Some(e) if shedding > 0 => e.calm_since = None,
            Some(e) => {
                let calm = *e.calm_since.get_or_insert(now);
                if now.saturating_duration_since(calm) >= Config::global().interval {
                    let records: u64 = consumer::all()
                        .enumerate()
                        .map(|(i, s)| match e.not_taken.get(i) {
                            Some(&(generation, at)) if generation == s.comm.generation() => not_taken(s).saturating_sub(at),
                            _ => not_taken(s),
                        })
                        .sum();
                    let secs = now.saturating_duration_since(e.start).as_secs_f64();
                    tracing::info!(
                        "overload over after {secs:.1} s: {records} records not taken (ProxyStep detail and \
                         records without room); every operation was counted"
                    );
                    *episode = None;
                }
            }
            None => {}
        }
    }
}

/// Gives the heap's free memory back to the kernel once every communicator is idle
/// ([`Slot::is_idle`]): once per idle spell, after the pass that made the last one idle.
fn trim_when_idle(trimmed: &mut bool) {
    let idle = consumer::all().all(|s| s.is_idle());
    if idle && !*trimmed {
        consumer::release_scratch();
        crate::buffer::heap::trim();
    }
    *trimmed = idle;
}

/// What the process reports at an interval's end, with the communicators' states `comms`.
fn process(comms: impl Iterator<Item = CommState>) -> Now {
    Now {
        stats: STATS.snapshot(),
        windows_dropped: inbox::windows_dropped(),
        kernel_ch_duty: activation::duty(),
        comms: comms.collect(),
        config_problems: Config::problems(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_is_the_busy_share_of_the_last_whole_span() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let mut load = Load::new(t0);
        load.worked(ms(30), t0 + ms(30));
        assert_eq!(load.busy(), 0.0, "no whole span yet");
        load.worked(ms(40), t0 + ms(100));
        assert!((load.busy() - 0.7).abs() < 1e-9, "{}", load.busy());
        load.worked(ms(50), t0 + ms(200));
        assert!((load.busy() - 0.5).abs() < 1e-9, "{}", load.busy());
        load.worked(ms(300), t0 + ms(500));
        assert_eq!(load.busy(), 1.0, "a pass longer than the span");
    }
}

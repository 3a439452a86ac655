//! Lifecycle: communicators created and finalized in waves from several threads with events in
//! flight, slot reuse through a full generation wrap, `init` after the last `finalize`, unload and
//! reload of the built library, and a job started with every variable set to a bad value. Two
//! modules run in processes of their own (`support::process`): `disabled` (`ENABLE=0`) and
//! `telemetry_idle` (no wake-ups while no communicator is live).
//!
//! Every other test here first runs [`setup`]: the in-process plugin's first `init` runs on defaults
//! (window capacity 100,000: real page use) with export off; then the built library, loaded like
//! NCCL loads it, starts with every variable of [`VARS`] bad, and what it logged is kept for
//! [`bad_configuration_end_to_end`]. Tests take [`SERIAL`]: they measure process-wide RSS and
//! threads.
//!
//! `LIFECYCLE_EVENTS` sets the callbacks per communicator of the churn (default 2000); under a
//! sanitizer (`SANITIZER` set by `.ci/sanitizers.sh`) the RSS bound is reported, not asserted
//! (shadow memory and ASan's quarantine are not the plugin's).

#[path = "../support"]
mod support {
    pub mod emulator;
    pub mod process;
}

mod disabled;
mod telemetry_idle;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nccl_profiler_otel::aggregate::WindowSummary;
use nccl_profiler_otel::comm;
use nccl_profiler_otel::config::{self, Config};
use nccl_profiler_otel::record::handle::{Context, GEN_MASK};
use nccl_profiler_otel::stats::STATS;
use nccl_profiler_otel::telemetry::{self, Sink};
use parking_lot::{Mutex, MutexGuard};
use support::emulator::{self, H, Plugin, logger, pid, rss, ty};

/// What a variable accepts; the end-to-end check reads whether its values are secret or free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Bool,
    /// Integer or decimal in a range.
    Number,
    /// One of a few words.
    Word,
    Url,
    /// `k=v,…` list whose values are secrets (never echoed).
    SecretPairs,
    Pairs,
    /// A file path pattern (`%h`, `%p`, `%r`, `%j`, `%%`).
    PathPattern,
    /// Any string is valid.
    Free,
}

/// Every variable the plugin reads: its kind and the bad value the end-to-end run gives it (`None`
/// for [`Kind::Free`]). Adding a variable to `config::ALL` or `config::STANDARD` needs one row here.
const VARS: &[(&str, Kind, Option<&str>)] = &[
    (config::ENABLE, Kind::Bool, Some("maybe")),
    (config::TELEMETRY_ENABLE, Kind::Bool, Some("-1")),
    (config::TELEMETRY_INTERVAL_SEC, Kind::Number, Some("1e999")),
    (config::HANG_THRESHOLD_SEC, Kind::Number, Some("0.05")),
    (config::LINEAR_REGRESSION_MODE, Kind::Word, Some("AVERAGE")),
    (config::EVENT_MASK, Kind::Number, Some("0x10000")),
    (config::KERNEL_CH_EVERY, Kind::Word, Some("0")),
    (config::V7_EXTENSIONS, Kind::Word, Some("sometimes")),
    (config::WINDOW_CAPACITY, Kind::Number, Some("99999999999999999999")),
    (config::WINDOW_COUNT_TRIGGER, Kind::Number, Some("12abc")),
    (config::EXPORTER, Kind::Word, Some("otlp2")),
    (config::TELEMETRY_ENDPOINT, Kind::Url, Some("localhost:4318")),
    (config::TELEMETRY_BATCH_TIMEOUT_MS, Kind::Number, Some("-100")),
    (config::EXPORT_FILE, Kind::PathPattern, Some("out-%d.jsonl")),
    (config::EXPORT_QUEUE, Kind::Number, Some("0")),
    (config::CARDINALITY_LIMIT, Kind::Number, Some("1e6")),
    (config::DROP_METRICS, Kind::Word, Some("profiler")),
    (config::otel::ENDPOINT, Kind::Url, Some("ftp://collector:4318")),
    (config::otel::METRICS_ENDPOINT, Kind::Url, Some("http://")),
    (config::otel::HEADERS, Kind::SecretPairs, Some("authorization")),
    (config::otel::METRICS_HEADERS, Kind::SecretPairs, Some("x=%zz")),
    (config::otel::TIMEOUT, Kind::Number, Some("NaN")),
    (config::otel::METRICS_TIMEOUT, Kind::Number, Some("60001")),
    (config::otel::PROTOCOL, Kind::Word, Some("http/xml")),
    (config::otel::METRICS_PROTOCOL, Kind::Word, Some("-1")),
    (config::otel::TEMPORALITY, Kind::Word, Some("sometimes")),
    (config::otel::RESOURCE_ATTRIBUTES, Kind::Pairs, Some("a b=c")),
    (config::otel::SERVICE_NAME, Kind::Free, None),
    (config::otel::COMPRESSION, Kind::Word, Some("zstd")),
    (config::otel::METRICS_COMPRESSION, Kind::Word, Some("deflate")),
    (config::otel::METRIC_EXPORT_INTERVAL, Kind::Number, Some("5s")),
    (config::otel::SDK_DISABLED, Kind::Bool, Some("disabled")),
    (config::otel::HISTOGRAM_AGGREGATION, Kind::Word, Some("exponential")),
];

/// RSS may exceed the post-warm-up baseline by this much after 1,000 communicators.
const RSS_BOUND: u64 = 16 << 20;

/// Taken by every test: they measure process-wide RSS and threads, and `telemetry_idle`'s own
/// process times its thread's wake-ups.
static SERIAL: Mutex<()> = Mutex::new(());

/// Records delivered to sinks, per communicator hash of interest.
#[derive(Default)]
struct Capture {
    records: AtomicU64,
    windows: Mutex<Vec<WindowSummary>>,
    watch: Mutex<Vec<u64>>,
}

impl Sink for Capture {
    fn window(&self, summary: &WindowSummary) {
        self.records.fetch_add(summary.stats.records, Ordering::Relaxed);
        if self.watch.lock().contains(&summary.comm.hash) {
            self.windows.lock().push(summary.clone());
        }
    }
}

struct Setup {
    plugin: Plugin,
    capture: Arc<Capture>,
    /// Config WARNs the loaded library logged at its first `init` (prefix stripped).
    warnings: Vec<String>,
    /// The configuration line it logged at that `init` (INFO, rank 0; prefix stripped).
    described: Option<String>,
    /// Activation mask and context that `init` produced.
    first_mask: i32,
    first_context_ok: bool,
}

const PREFIX: &str = "NCCL_PROFILER_OTEL: ";

/// Runs once per process, before anything else here: the in-process plugin's first `init` reads
/// an environment with export off (`NCCL_PROFILER_OTEL_EXPORTER=none`, everything else default);
/// then the built library, loaded like NCCL loads it (a separate instance with its own
/// configuration), makes its first `init` with every variable of [`VARS`] bad.
fn setup() -> (MutexGuard<'static, ()>, &'static Setup) {
    // A parking_lot mutex rather than a `OnceLock`: ThreadSanitizer sees its synchronisation.
    static SETUP: Mutex<Option<&'static Setup>> = Mutex::new(None);
    let serial = SERIAL.lock();
    let mut slot = SETUP.lock();
    let s = *slot.get_or_insert_with(|| {
        let set = |vars: &mut dyn Iterator<Item = (&str, Option<&str>)>| {
            for (name, value) in vars {
                // SAFETY: only while no plugin instance reads the environment (each reads it at
                // its first `init`, below, on this thread).
                unsafe {
                    match value {
                        Some(value) => std::env::set_var(name, value),
                        None => std::env::remove_var(name),
                    }
                }
            }
        };
        set(&mut VARS.iter().map(|(n, ..)| (*n, None)));
        set(&mut [(config::EXPORTER, Some("none"))].into_iter());
        let capture = Arc::new(Capture::default());
        telemetry::add_sink(capture.clone());
        let plugin = Plugin::in_process();
        let (c, _) = plugin.init(Some("lifecycle"), 0x11FE_C0F1, 1, 2, 0);
        plugin.finalize(c.context);

        set(&mut VARS.iter().map(|(n, _, v)| (*n, *v)));
        let loaded = Plugin::load_built().expect("the built library");
        let before = logger::lines().len();
        let (c, first_mask) = loaded.init(Some("bad-config"), 0xBAD_C0F1, 1, 2, 0);
        let lines: Vec<logger::Line> = logger::lines().into_iter().skip(before).collect();
        let text = |l: &logger::Line| l.text.strip_prefix(PREFIX).unwrap_or(&l.text).to_owned();
        let warnings = lines.iter().filter(|l| l.level == 2).map(text).collect();
        let described = lines
            .iter()
            .filter(|l| l.level == 3)
            .map(text)
            .find(|t| t.starts_with("nccl-profiler-otel "));
        let first_context_ok = !c.context.is_null();
        loaded.finalize(c.context);
        loaded.close();
        // The bad values stay set: the loaded copy's export thread may read the environment
        // (proxy variables) from now on, and `setenv` races with `getenv`.
        Box::leak(Box::new(Setup {
            plugin,
            capture,
            warnings,
            described,
            first_mask,
            first_context_ok,
        }))
    });
    drop(slot);
    (serial, s)
}

/// Peak RSS of the process so far (`VmHWM`), bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Threads of this process, with their names.
fn threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .expect("task")
        .filter_map(Result::ok)
        .map(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .unwrap_or_default()
                .trim()
                .to_owned()
        })
        .collect()
}

fn under_sanitizer() -> bool {
    std::env::var_os("SANITIZER").is_some()
}

fn events_per_comm() -> u64 {
    std::env::var("LIFECYCLE_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

fn next_hash() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0x11fe_0000_0001);
    NEXT.fetch_add(0x1_0003, Ordering::Relaxed)
}

/// About `n` callbacks of collectives with proxy ops and send steps; the last collective and its
/// op are left unstopped (events in flight at finalize).
fn traffic(p: &Plugin, c: &emulator::Comm, n: u64) {
    let mut calls = 0;
    let mut seq = 0;
    while calls < n {
        let coll = p.coll(
            c,
            H::NULL,
            "AllReduce",
            "RING",
            "SIMPLE",
            "ncclFloat32",
            1 << 16,
            2,
            seq,
        );
        let op = p.proxy_op(c.context, coll, pid(), c.rank, (c.rank + 1) % c.nranks, 0, 4, true);
        p.state(op, ty::OP_IN_PROGRESS, 0);
        for s in 0..4 {
            p.send_step(c.context, op, c.rank, s, 1 << 14, 1, Duration::ZERO);
        }
        calls += 2 + 4 * 5;
        seq += 1;
        if calls < n {
            p.stop(op);
            p.stop(coll);
            calls += 2;
        }
    }
}

/// Churn: `threads` threads, each creating `per_thread` communicators per wave, driving traffic
/// on them while a racing "proxy" thread keeps sending events to them, then finalizing them with
/// events in flight and the racer still running. Returns the communicators created.
fn waves(p: &Plugin, waves: usize, threads: usize, per_thread: usize, events: u64) -> usize {
    let created = AtomicU64::new(0);
    for _ in 0..waves {
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        let comms: Vec<emulator::Comm> = (0..per_thread)
                            .map(|i| p.init(None, next_hash(), 2, 4, 1 + i as i32 % 3).0)
                            .collect();
                        assert!(comms.iter().all(|c| !c.context.is_null()), "init gives a context");
                        created.fetch_add(comms.len() as u64, Ordering::Relaxed);
                        let stop = AtomicBool::new(false);
                        std::thread::scope(|inner| {
                            // NCCL joins a communicator's proxy thread before its finalize; an
                            // application bug or a shared proxy may not: this one races finalize.
                            let racer = inner.spawn(|| {
                                while !stop.load(Ordering::Relaxed) {
                                    for c in &comms {
                                        let op = p.proxy_op(c.context, H::NULL, pid(), c.rank, 0, 1, 1, true);
                                        p.send_step(c.context, op, c.rank, 0, 512, 0, Duration::ZERO);
                                        p.stop(op);
                                    }
                                    std::thread::sleep(Duration::from_micros(200));
                                }
                            });
                            for c in &comms {
                                traffic(p, c, events);
                            }
                            for c in &comms {
                                p.finalize(c.context);
                            }
                            stop.store(true, Ordering::Relaxed);
                            racer.join().expect("racer");
                        });
                    })
                })
                .collect();
            // Joined explicitly (pthread_join), not by the scope's end: ThreadSanitizer sees that.
            workers.into_iter().for_each(|w| w.join().expect("worker"));
        });
    }
    created.load(Ordering::Relaxed) as usize
}

#[test]
fn a_thousand_communicators_in_waves_leak_neither_memory_nor_threads() {
    let (_serial, s) = setup();
    let p = &s.plugin;
    let events = events_per_comm();
    // Warm-up wave: allocates the communicator slots (type-stable, kept for the process's life),
    // starts the telemetry thread, grows the allocator's arenas.
    let warm = waves(p, 2, 4, 10, events);
    std::thread::sleep(Duration::from_millis(50));
    let (rss0, threads0, slots0) = (rss(), threads(), comm::all().count());
    let stale0 = STATS.stale.get();
    let t0 = Instant::now();
    let created = warm + waves(p, 24, 4, 10, events);
    let elapsed = t0.elapsed();
    std::thread::sleep(Duration::from_millis(50));
    let (rss1, threads1, slots1) = (rss(), threads(), comm::all().count());
    eprintln!(
        "lifecycle: {created} communicators ({events} callbacks each), churn {elapsed:?}; RSS baseline {} KiB, \
         after {} KiB (bound +{} KiB), peak {} KiB; threads {} -> {} {:?}; stale callbacks {}; slots {slots0} -> {slots1}",
        rss0 >> 10,
        rss1 >> 10,
        RSS_BOUND >> 10,
        peak_rss() >> 10,
        threads0.len(),
        threads1.len(),
        threads1,
        STATS.stale.get() - stale0,
    );
    assert!(created >= 1000, "{created} communicators");
    // A slot is allocated only while every allocated one is live or draining: at most the 40
    // communicators live at once, plus one per thread that found every free slot draining.
    assert!(
        slots1 <= 4 * 10 + 4,
        "{slots1} slots allocated for at most 40 live communicators"
    );
    assert_eq!(
        threads1.len(),
        threads0.len(),
        "no thread leaked: {threads0:?} -> {threads1:?}"
    );
    assert_eq!(
        threads1.iter().filter(|t| t.starts_with("nccl-otel")).count(),
        threads0.iter().filter(|t| t.starts_with("nccl-otel")).count(),
        "the plugin's threads are started once"
    );
    if under_sanitizer() {
        eprintln!("lifecycle: RSS bound not asserted under a sanitizer");
    } else {
        assert!(
            rss1 <= rss0 + RSS_BOUND,
            "RSS grew from {} KiB to {} KiB over {created} communicators",
            rss0 >> 10,
            rss1 >> 10
        );
    }
}

#[test]
fn churn_from_several_threads_keeps_the_registry_bounded() {
    let (_serial, s) = setup();
    let p = &s.plugin;
    // Six threads each keep one communicator live at a time and replace it as fast as they can
    // (each finalize holds its slot's lock while it reads the windows): a register that finds
    // every other slot live or being finalized waits for one instead of allocating another
    // communicator, so no more slots than communicators live at once are ever allocated.
    let slots0 = comm::all().count();
    std::thread::scope(|scope| {
        for _ in 0..6 {
            scope.spawn(|| {
                for _ in 0..500 {
                    let (c, _) = p.init(None, next_hash(), 1, 2, 1);
                    assert!(!c.context.is_null(), "init gives a context");
                    traffic(p, &c, 500);
                    p.finalize(c.context);
                }
            });
        }
    });
    let slots1 = comm::all().count();
    eprintln!("lifecycle: 3000 communicators from 6 threads: slots {slots0} -> {slots1}");
    assert!(
        slots1 <= slots0.max(6),
        "{slots0} -> {slots1} slots for at most 6 live communicators"
    );
}

#[test]
fn slot_reuse_wraps_generations_and_stale_contexts_and_handles_stay_stale() {
    let (_serial, s) = setup();
    let p = &s.plugin;
    // Every init takes the lowest free slot, with that slot's next generation: cycle init/finalize
    // until one slot has gone through all 4095 generations and wrapped. A keeper communicator
    // stays live so that no finalize is the last one (that one flushes the exporter, 10-100 ms).
    // `register` skips a slot the telemetry thread is polling (its consumer lock is taken) or whose
    // windows are still draining, so the slot may vary.
    let (keeper, _) = p.init(None, next_hash(), 1, 2, 1);
    let slots0 = comm::all().count();
    let mut last_generation: HashMap<u16, u16> = HashMap::new();
    let mut uses: HashMap<u16, usize> = HashMap::new();
    let mut previous: Option<emulator::Comm> = None;
    let mut open: Option<(u16, H, H)> = None;
    let mut stale_checks = 0;
    let mut wrapped = None;
    let mut i = 0;
    while wrapped.is_none() {
        assert!(
            i < 3 * (GEN_MASK as usize + 1),
            "no slot wrapped in {i} cycles: {uses:?}"
        );
        let (c, _) = p.init(None, next_hash(), 1, 2, 1);
        let ctx = Context::decode(c.context as u64).expect("a context of ours");
        let generation = ctx.comm.generation;
        assert_ne!(generation, 0, "generation 0 is never handed out");
        if let Some(last) = last_generation.insert(ctx.comm.slot, generation) {
            let expected = (u32::from(last) % GEN_MASK + 1) as u16;
            assert_eq!(
                generation, expected,
                "slot {} advances by one generation",
                ctx.comm.slot
            );
            if generation == 1 {
                wrapped = Some(ctx.comm.slot);
            }
        }
        *uses.entry(ctx.comm.slot).or_default() += 1;
        if let Some(old) = previous.take() {
            // The previous communicator (finalized) is stale, also as a context for new events.
            let stale = STATS.stale.get();
            let h = p.coll(&old, H::NULL, "AllReduce", "RING", "LL", "ncclInt8", 1, 1, 0);
            assert!(h.is_null(), "a finalized communicator's context is stale");
            p.finalize(old.context);
            assert!(STATS.stale.get() >= stale + 2);
        }
        if let Some((slot, coll, op)) = open.take().filter(|(slot, ..)| *slot == ctx.comm.slot) {
            // Events the previous communicator in this slot left open: their handles name epochs
            // its windows have left, so they are stale for the new one, not late records of it.
            let stale = STATS.stale.get();
            p.stop(coll);
            assert!(
                p.proxy_step(c.context, op, c.rank, 0).is_null(),
                "a stale parent takes no child"
            );
            assert_eq!(STATS.stale.get(), stale + 2, "slot {slot}: stale, not late");
            let now = comm::get(ctx.comm).expect("live");
            assert_eq!(now.drop_counts().late, 0);
            stale_checks += 1;
        }
        if i % 512 == 0 {
            let coll = p.coll(&c, H::NULL, "AllReduce", "RING", "LL", "ncclInt8", 1, 1, 0);
            assert!(!coll.is_null(), "recorded at generation {generation}");
            p.stop(coll);
        }
        if i % 64 == 0 {
            let coll = p.coll(&c, H::NULL, "AllReduce", "RING", "LL", "ncclInt8", 1, 1, 0);
            let op = p.proxy_op(c.context, coll, pid(), c.rank, 0, 1, 1, true);
            assert!(!op.is_null());
            open = Some((ctx.comm.slot, coll, op));
        }
        p.finalize(c.context);
        previous = Some(c);
        i += 1;
    }
    let slots1 = comm::all().count();
    eprintln!(
        "lifecycle: slot {wrapped:?} wrapped after {i} init/finalize cycles; uses per slot {uses:?}; \
         {stale_checks} stale handles of a slot's earlier communicator"
    );
    assert!(
        stale_checks > 0,
        "no slot was reused right after a communicator left events open"
    );
    assert!(
        slots1 <= slots0 + 2,
        "slots allocated grew from {slots0} to {slots1}: {uses:?}"
    );
    p.finalize(keeper.context);
}

#[test]
fn init_works_after_the_last_finalize() {
    let (_serial, s) = setup();
    let p = &s.plugin;
    for round in 0..3 {
        let (c, mask) = p.init(Some("again"), next_hash(), 1, 2, 0);
        assert!(!c.context.is_null(), "round {round}");
        assert_eq!(mask & !emulator::mask::IMPLIED, Config::global().event_mask);
        s.capture.watch.lock().push(c.hash);
        traffic(p, &c, 200);
        p.finalize(c.context);
        let got: u64 = s
            .capture
            .windows
            .lock()
            .iter()
            .filter(|w| w.comm.hash == c.hash)
            .map(|w| w.stats.records)
            .sum();
        assert!(
            got >= 100,
            "round {round}: {got} records delivered after a full finalize"
        );
    }
}

#[test]
fn unload_and_reload_of_the_built_library() {
    let (_serial, _s) = setup();
    let path = emulator::built_library().expect("cargo test builds the cdylib");
    let library_threads = || threads().iter().filter(|t| t.starts_with("nccl-otel")).count();
    let before = library_threads();
    let p = Plugin::load(&path).expect("dlopen");
    let table = p.table_address();
    let (c, mask) = p.init(Some("dl"), next_hash(), 1, 2, 0);
    assert!(!c.context.is_null() && mask != 0);
    traffic(&p, &c, 100);
    p.finalize(c.context);
    let with_library = library_threads();
    p.close(); // dlclose after the last finalize, as NCCL does (spec 1.4)
    let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
    assert!(
        maps.contains(path.to_str().expect("utf-8 path")),
        "-z nodelete keeps the library mapped after dlclose"
    );
    for round in 0..3 {
        let p = Plugin::load(&path).expect("dlopen again");
        assert_eq!(p.table_address(), table, "the same instance comes back");
        let (c, _) = p.init(Some("dl"), next_hash(), 1, 2, 0);
        assert!(!c.context.is_null(), "init after dlclose, round {round}");
        let coll = p.coll(&c, H::NULL, "AllReduce", "RING", "LL", "ncclInt8", 1, 1, 0);
        assert!(!coll.is_null());
        traffic(&p, &c, 100);
        p.finalize(c.context);
        p.close();
    }
    assert_eq!(library_threads(), with_library, "reloading starts no new thread");
    assert!(
        with_library <= before + 2,
        "at most the loaded copy's telemetry and export threads"
    );
}

/// Every variable of `config::ALL` and `config::STANDARD` has a row in [`VARS`], and no row is stale.
#[test]
fn every_variable_has_a_row() {
    let _serial = SERIAL.lock(); // no test may end while another counts threads
    let read: Vec<&str> = config::ALL.iter().chain(config::STANDARD.iter()).copied().collect();
    for name in &read {
        assert!(
            VARS.iter().any(|(n, ..)| n == name),
            "{name} has no row in VARS: add one"
        );
    }
    for (name, ..) in VARS {
        assert!(read.contains(name), "{name} is no longer read: remove its row");
    }
}

/// End to end through the built library and NCCL's logger: every variable bad, `init` succeeds
/// with the default mask, one WARN per variable naming it, its value (unless secret) and what is
/// used instead, and the configuration line shows every default.
#[test]
fn bad_configuration_end_to_end() {
    let (_serial, s) = setup();
    assert!(s.first_context_ok, "init succeeds whatever the configuration");
    assert_eq!(
        s.first_mask & !emulator::mask::IMPLIED,
        Config::default().event_mask,
        "the default activation mask (and what the ABI version adds)"
    );
    // What a process gets with our variables unset (launcher variables still count).
    let ours = |name: &str| VARS.iter().any(|(n, ..)| *n == name);
    let expected = Config::from_lookup(|name| if ours(name) { None } else { std::env::var(name).ok() }).0;
    assert_eq!(
        s.described.as_deref(),
        Some(expected.describe().as_str()),
        "every setting at its default"
    );
    for &(name, kind, value) in VARS {
        let hits: Vec<&String> = s
            .warnings
            .iter()
            .filter(|w| w.starts_with(&format!("{name}=")))
            .collect();
        let Some(value) = value else {
            assert!(hits.is_empty(), "{name}: {hits:?}");
            continue;
        };
        assert_eq!(
            hits.len(),
            1,
            "one WARN through NCCL's logger for {name}: {:?}",
            s.warnings
        );
        let w = hits[0];
        if kind != Kind::SecretPairs {
            assert!(w.starts_with(&format!("{name}='{value}'")), "names the value: {w}");
        }
        assert!(
            w.contains("using default ") || w.contains("ignoring it"),
            "says what is used: {w}"
        );
    }
}

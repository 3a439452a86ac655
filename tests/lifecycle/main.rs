//! Lifecycle: communicators created and finalized in waves from several threads with events in
//! flight, `init` after the last `finalize`, unload and reload, and a job started with every
//! variable set to a bad value, all through the shipped library (`support::shipped`: built
//! without test features, loaded with `dlopen` as NCCL loads it) and checked by what a process
//! sees of it: contexts, threads, memory, NCCL's logger and its export. Two modules run in
//! processes of their own (`support::process`): `disabled` (`ENABLE=0`) and `telemetry_idle` (no
//! wake-ups while no communicator is live). `internals` tests the registry's slot reuse through
//! a generation wrap on the plugin linked into this binary: it reads counters no export carries.
//!
//! Every other test here first runs [`setup`], which loads three instances of the shipped library
//! (two from copies of its file: `dlopen` of another file is another instance, with its own
//! configuration): the churn instance on defaults (window capacity 100,000: real page use) with
//! export off; the observed instance, exporting to an in-test OTLP receiver; and the library
//! itself, started with every variable bad ([`vars`]), what it logged kept for
//! [`bad_configuration_end_to_end`]. Tests take [`SERIAL`]: they measure process-wide RSS and
//! threads.
//!
//! `LIFECYCLE_EVENTS` sets the callbacks per communicator of the churn (default 2000); under a
//! sanitizer (`SANITIZER` set by `.ci/sanitizers.sh`) the RSS bound is reported, not asserted
//! (shadow memory and ASan's quarantine are not the plugin's).

#[path = "../support"]
mod support {
    pub mod emulator;
    pub mod otlp_receiver;
    pub mod process;
    pub mod shipped;
}

mod disabled;
mod internals;
mod telemetry_idle;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nccl_profiler_otel::config::{self, Config};
use nccl_profiler_otel::record::handle::Context;
use parking_lot::{Mutex, MutexGuard};
use support::emulator::{self, H, Plugin, logger, peak_rss, pid, rss, ty};
use support::otlp_receiver::{self as rx, Receiver};
use support::shipped;

/// The standard variables the plugin reads, each with the bad value the end-to-end run gives it
/// (`None`: any value is valid, or, for the metrics endpoint, the run's own closed port, so that
/// it never exports to the machine's default port) and whether its values are secrets (never
/// echoed). Ours come from their rows (`config::rejected`). Adding a variable to
/// `config::STANDARD` needs one row here.
const STANDARD_VARS: &[(&str, Option<&str>, bool)] = &[
    (config::otel::ENDPOINT, Some("ftp://collector:4318"), false),
    (config::otel::METRICS_ENDPOINT, None, false),
    (config::otel::HEADERS, Some("authorization"), true),
    (config::otel::METRICS_HEADERS, Some("x=%zz"), true),
    (config::otel::TIMEOUT, Some("NaN"), false),
    (config::otel::METRICS_TIMEOUT, Some("60001"), false),
    (config::otel::PROTOCOL, Some("http/xml"), false),
    (config::otel::METRICS_PROTOCOL, Some("-1"), false),
    (config::otel::TEMPORALITY, Some("sometimes"), false),
    (config::otel::RESOURCE_ATTRIBUTES, Some("a b=c"), false),
    (config::otel::SERVICE_NAME, None, false),
    (config::otel::COMPRESSION, Some("zstd"), false),
    (config::otel::METRICS_COMPRESSION, Some("deflate"), false),
    (config::otel::METRIC_EXPORT_INTERVAL, Some("5s"), false),
    (config::otel::SDK_DISABLED, Some("disabled"), false),
    (config::otel::HISTOGRAM_AGGREGATION, Some("exponential"), false),
];

/// Every variable the plugin reads, with its bad value and whether it is secret: ours from their
/// rows, then [`STANDARD_VARS`].
fn vars() -> impl Iterator<Item = (&'static str, Option<&'static str>, bool)> {
    config::rejected()
        .map(|(name, value)| (name, Some(value), false))
        .chain(STANDARD_VARS.iter().copied())
}

/// RSS may exceed the post-warm-up baseline by this much after 1,000 communicators.
const RSS_BOUND: u64 = 16 << 20;

/// Taken by every test: they measure process-wide RSS and threads, and `telemetry_idle`'s own
/// process times its thread's wake-ups.
static SERIAL: Mutex<()> = Mutex::new(());

struct Setup {
    /// The churn instance: defaults, export off.
    plugin: Plugin,
    /// The observed instance and the receiver it exports to, with the event mask it was
    /// configured with.
    observed: Plugin,
    receiver: Receiver,
    observed_mask: i32,
    /// The plugin linked into this binary, on defaults with export off (`internals`).
    internal: Plugin,
    /// INFO lines the loaded library logged at its first `init` (prefix stripped): the
    /// configuration's warnings and its description.
    warnings: Vec<String>,
    /// WARN lines it logged then (prefix stripped).
    warns: Vec<String>,
    /// The configuration line it logged at that `init` (INFO, rank 0; prefix stripped).
    described: Option<String>,
    /// Activation mask and context that `init` produced.
    first_mask: i32,
    first_context_ok: bool,
}

const PREFIX: &str = "NCCL_PROFILER_OTEL: ";

/// Runs once per process, before anything else here. Each instance reads the environment at its
/// first `init`: the churn instance and the plugin linked into this binary with export off
/// (`NCCL_PROFILER_OTEL_EXPORTER=none`, everything else default); the observed instance with
/// export to an in-test receiver; then the shipped library itself with every variable of
/// bad ([`vars`]).
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
        let first_init = |p: &Plugin, hash: u64| {
            let c = init(p, Some("lifecycle"), hash, 1, 2, 0);
            p.finalize(c.context);
        };
        set(&mut vars().map(|(n, ..)| (n, None)));
        set(&mut [(config::EXPORTER, Some("none"))].into_iter());
        let plugin = Plugin::load_shipped_copy("lifecycle-churn");
        first_init(&plugin, 0x11FE_C0F1);
        let internal = Plugin::in_process();
        let (c, _) = internal.init(Some("lifecycle"), 0x11FE_C0F2, 1, 2, 0);
        internal.finalize(c.context);

        let receiver = Receiver::start();
        let endpoint = receiver.endpoint();
        set(&mut [
            (config::EXPORTER, None),
            (config::TELEMETRY_ENDPOINT, Some(endpoint.as_str())),
        ]
        .into_iter());
        let observed_mask = Config::from_lookup(|name| std::env::var(name).ok()).0.event_mask;
        let observed = Plugin::load_shipped_copy("lifecycle-observed");
        first_init(&observed, 0x11FE_C0F3);

        set(&mut vars().map(|(n, v, _)| (n, v)));
        let closed = emulator::ports::closed_endpoint();
        set(&mut [(config::otel::METRICS_ENDPOINT, Some(closed.as_str()))].into_iter());
        let loaded = Plugin::load_shipped();
        let before = logger::lines().len();
        let (c, first_mask) = loaded.init(Some("bad-config"), 0xBAD_C0F1, 1, 2, 0);
        let lines: Vec<logger::Line> = logger::lines().into_iter().skip(before).collect();
        let text = |l: &logger::Line| l.text.strip_prefix(PREFIX).unwrap_or(&l.text).to_owned();
        let warnings = lines.iter().filter(|l| l.level == 3).map(text).collect();
        let warns = lines.iter().filter(|l| l.level == 2).map(text).collect();
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
            observed,
            receiver,
            observed_mask,
            internal,
            warnings,
            warns,
            described,
            first_mask,
            first_context_ok,
        }))
    });
    drop(slot);
    (serial, s)
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

/// Registry slots the churn instance handed out, read from the contexts its `init` returned (a
/// slot is allocated by the `init` that first takes it, and is kept for the process's life).
static SLOTS: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// `init` through `p`, keeping the registry slot of the context it returns in [`SLOTS`].
fn init(p: &Plugin, name: Option<&str>, hash: u64, n_nodes: i32, nranks: i32, rank: i32) -> emulator::Comm {
    let (c, _) = p.init(name, hash, n_nodes, nranks, rank);
    if let Some(ctx) = Context::decode(c.context as u64) {
        SLOTS.lock().insert(ctx.comm.slot);
    }
    c
}

/// Registry slots the churn instance has allocated so far.
fn slots() -> usize {
    SLOTS.lock().len()
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
                            .map(|i| init(p, None, next_hash(), 2, 4, 1 + i as i32 % 3))
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
    let (rss0, threads0, slots0) = (rss(), threads(), slots());
    let t0 = Instant::now();
    let created = warm + waves(p, 24, 4, 10, events);
    let elapsed = t0.elapsed();
    std::thread::sleep(Duration::from_millis(50));
    let (rss1, threads1, slots1) = (rss(), threads(), slots());
    eprintln!(
        "lifecycle: {created} communicators ({events} callbacks each), churn {elapsed:?}; RSS baseline {} KiB, \
         after {} KiB (bound +{} KiB), peak {} KiB; threads {} -> {} {:?}; slots {slots0} -> {slots1}",
        rss0 >> 10,
        rss1 >> 10,
        RSS_BOUND >> 10,
        peak_rss() >> 10,
        threads0.len(),
        threads1.len(),
        threads1,
    );
    assert!(created >= 1000, "{created} communicators");
    // A slot is allocated only while every allocated one is live or draining: at most the 40
    // communicators live at once, plus one per thread that found every free slot draining.
    assert!(
        slots1 <= 4 * 10 + 4,
        "{slots1} slots allocated for at most 40 live communicators"
    );
    // A thread an earlier test started may still be ending (slowly under a sanitizer): a leak
    // is a name more often alive after the waves than before them.
    let started: Vec<&String> = threads1
        .iter()
        .filter(|t| threads1.iter().filter(|u| u == t).count() > threads0.iter().filter(|u| u == t).count())
        .collect();
    assert!(started.is_empty(), "no thread leaked: {threads0:?} -> {threads1:?}");
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
    let slots0 = slots();
    std::thread::scope(|scope| {
        for _ in 0..6 {
            scope.spawn(|| {
                for _ in 0..500 {
                    let c = init(p, None, next_hash(), 1, 2, 1);
                    assert!(!c.context.is_null(), "init gives a context");
                    traffic(p, &c, 500);
                    p.finalize(c.context);
                }
            });
        }
    });
    let slots1 = slots();
    eprintln!("lifecycle: 3000 communicators from 6 threads: slots {slots0} -> {slots1}");
    assert!(
        slots1 <= slots0.max(6),
        "{slots0} -> {slots1} slots for at most 6 live communicators"
    );
}

#[test]
fn init_works_after_the_last_finalize() {
    let (_serial, s) = setup();
    let p = &s.observed;
    for round in 0..3 {
        let (c, mask) = p.init(Some("again"), next_hash(), 1, 2, 0);
        assert!(!c.context.is_null(), "round {round}");
        assert_eq!(mask & !emulator::mask::IMPLIED, s.observed_mask);
        traffic(p, &c, 200);
        // The last finalize exports before it returns.
        p.finalize(c.context);
        let got = recorded(&s.receiver.requests(), c.hash);
        assert!(
            got >= 100,
            "round {round}: {got} records delivered after a full finalize"
        );
    }
}

/// `nccl.profiler.events.recorded` of the communicator `hash` (cumulative: its latest total).
fn recorded(reqs: &[rx::ExportMetricsServiceRequest], hash: u64) -> u64 {
    let hash = format!("{hash:#x}");
    rx::metrics(reqs)
        .into_iter()
        .filter(|m| m.name == "nccl.profiler.events.recorded")
        .flat_map(rx::points)
        .filter(|p| p.attrs.get("nccl.comm.hash") == Some(&hash))
        .map(|p| p.value as u64)
        .max()
        .unwrap_or(0)
}

#[test]
fn unload_and_reload_of_the_shipped_library() {
    let (_serial, _s) = setup();
    let path = shipped::shipped_library();
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

/// Every variable of `config::STANDARD` has a row in [`STANDARD_VARS`], and no row is stale.
#[test]
fn every_standard_variable_has_a_row() {
    let _serial = SERIAL.lock(); // no test may end while another counts threads
    for name in config::STANDARD {
        assert!(
            STANDARD_VARS.iter().any(|(n, ..)| *n == name),
            "{name} has no row in STANDARD_VARS: add one"
        );
    }
    for (name, ..) in STANDARD_VARS {
        assert!(
            config::STANDARD.contains(name),
            "{name} is no longer read: remove its row"
        );
    }
}

/// End to end through the built library and NCCL's logger: every variable bad, `init` succeeds
/// with the default mask, one INFO line (never a WARN: that would become `ncclGetLastError()`'s
/// text) per variable naming it, its value (unless secret) and what is
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
    // What a process gets with our bad values unset (launcher variables and the closed endpoint
    // still count).
    let ours = |name: &str| vars().any(|(n, v, _)| n == name && v.is_some());
    let expected = Config::from_lookup(|name| if ours(name) { None } else { std::env::var(name).ok() }).0;
    assert_eq!(
        s.described.as_deref(),
        Some(expected.describe().as_str()),
        "every setting at its default"
    );
    for (name, value, secret) in vars() {
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
            "one INFO line through NCCL's logger for {name}: {:?}",
            s.warnings
        );
        let w = hits[0];
        if !secret {
            assert!(w.starts_with(&format!("{name}='{value}'")), "names the value: {w}");
        }
        assert!(
            w.contains("using default ") || w.contains("ignoring it"),
            "says what is used: {w}"
        );
    }
    let config_warns = s.warns.iter().filter(|w| vars().any(|(n, ..)| w.starts_with(n)));
    assert_eq!(config_warns.count(), 0, "configuration lines at WARN: {:?}", s.warns);
}

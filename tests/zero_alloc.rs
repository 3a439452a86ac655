//! The hot path allocates nothing: 1,000,000 start/state/stop callbacks through the exported table,
//! counted by a global allocator that watches only the calling thread; then the shedding paths
//! (bare ops and shed steps, operations counted without a record).

#[path = "support"]
mod support {
    pub mod emulator;
}

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nccl_profiler_otel::comm::{self, shed};
use support::emulator::{self, H, Plugin, pid, ty};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static WATCHED: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: forwards every call to `System` unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if WATCHED.with(Cell::get) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if WATCHED.with(Cell::get) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn a_million_hot_path_callbacks_allocate_nothing() {
    // SAFETY: the only test of this binary, before the plugin reads the environment.
    unsafe { std::env::set_var("NCCL_PROFILER_OTEL_EXPORTER", "none") };
    let p = Plugin::in_process();
    let (c, _) = p.init(Some("alloc"), 0xA110C, 2, 2, 0);
    // Static C strings: `Plugin::coll` would leak new ones per call (an allocation).
    let coll_descr = |seq| {
        let (f, a, pr, dt) = (c"AllReduce", c"RING", c"SIMPLE", c"ncclFloat32");
        emulator::plugin::coll_descr(
            0,
            H::NULL,
            f.as_ptr(),
            a.as_ptr(),
            pr.as_ptr(),
            dt.as_ptr(),
            1 << 20,
            1,
            seq,
        )
    };
    let mut callbacks = 0u64;
    WATCHED.with(|w| w.set(true));
    while callbacks < 1_000_000 {
        let coll = p.start(c.context, &mut coll_descr(callbacks));
        p.stop(coll);
        let op = p.proxy_op(c.context, coll, pid(), 0, 1, 0, 4, true);
        for s in 0..4 {
            let step = p.proxy_step(c.context, op, 0, s);
            p.state(step, ty::SEND_GPU_WAIT, 0);
            p.state(step, ty::SEND_WAIT, 1 << 18);
            p.stop(step);
        }
        p.stop(op);
        p.stop(H(0x42 as *mut _)); // stale
        callbacks += 20;
    }
    WATCHED.with(|w| w.set(false));
    assert_eq!(ALLOCATIONS.load(Ordering::Relaxed), 0, "allocations on the hot path");
    // Shedding: at level 1 ops start bare and their steps are shed; at the highest level nearly
    // every collective is counted only (the count table), its children shed.
    comm::force_level(Some(shed::DETAIL));
    let (bare, _) = p.init(Some("alloc-bare"), 0xA110D, 2, 2, 0);
    // The first communicator's windows take it too from their next switch: it is done.
    comm::force_level(Some(shed::MAX_LEVEL));
    let (counted, _) = p.init(Some("alloc-counted"), 0xA110E, 2, 2, 0);
    WATCHED.with(|w| w.set(true));
    for i in 0..20_000 {
        let coll = p.start(bare.context, &mut coll_descr(i));
        let op = p.proxy_op(bare.context, coll, pid(), 0, 1, 0, 1, true);
        let step = p.proxy_step(bare.context, op, 0, 0);
        [step, op, coll].into_iter().for_each(|h| p.stop(h));
        let coll = p.start(counted.context, &mut coll_descr(i));
        let op = p.proxy_op(counted.context, coll, pid(), 0, 1, 0, 1, true);
        let step = p.proxy_step(counted.context, op, 0, 0);
        [step, op, coll].into_iter().for_each(|h| p.stop(h));
    }
    WATCHED.with(|w| w.set(false));
    comm::force_level(None);
    assert_eq!(ALLOCATIONS.load(Ordering::Relaxed), 0, "allocations while shedding");
    std::thread::sleep(Duration::from_millis(1));
    [c, bare, counted].iter().for_each(|c| p.finalize(c.context));
}

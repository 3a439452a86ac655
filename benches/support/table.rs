//! What the hot-path benches share: a table of empty callbacks (the baseline), the plugin's
//! table called through its function pointers as NCCL calls it, one communicator and the
//! consumer steps a bench drives between batches in place of the telemetry thread.
// Each bench that includes this module uses part of it.
#![allow(dead_code)]

use std::ffi::{c_char, c_int, c_void};
use std::hint::black_box;
use std::time::Instant;

use crate::emulator::{self, H, Plugin, descr, pid, ty};
use nccl_profiler_otel::bindings::*;
use nccl_profiler_otel::clock;
use nccl_profiler_otel::config::Config;
use nccl_profiler_otel::telemetry::consumer;

unsafe extern "C" fn empty_init(
    context: *mut *mut c_void,
    _: u64,
    mask: *mut c_int,
    _: *const c_char,
    _: c_int,
    _: c_int,
    _: c_int,
    _: ncclDebugLogger_t,
) -> ncclResult_t {
    // SAFETY: the emulator passes valid out-parameters.
    unsafe {
        *context = std::ptr::dangling_mut::<c_void>();
        *mask = 0x1e;
    }
    ncclSuccess
}

#[inline(never)]
unsafe extern "C" fn empty_start(
    _: *mut c_void,
    h: *mut *mut c_void,
    d: *mut ncclProfilerEventDescr_v7_t,
) -> ncclResult_t {
    black_box(d);
    // SAFETY: the emulator passes a valid handle slot.
    unsafe { *h = std::ptr::dangling_mut::<c_void>() };
    ncclSuccess
}

#[inline(never)]
unsafe extern "C" fn empty_stop(h: *mut c_void) -> ncclResult_t {
    black_box(h);
    ncclSuccess
}

#[inline(never)]
unsafe extern "C" fn empty_state(
    h: *mut c_void,
    s: ncclProfilerEventState_t,
    a: *mut ncclProfilerEventStateArgs_v7_t,
) -> ncclResult_t {
    black_box((h, s, a));
    ncclSuccess
}

unsafe extern "C" fn empty_finalize(_: *mut c_void) -> ncclResult_t {
    ncclSuccess
}

/// A table of callbacks that do nothing but write `*eHandle`.
fn empty_table() -> ncclProfiler_v7_t {
    ncclProfiler_v7_t {
        name: c"empty".as_ptr(),
        init: Some(empty_init),
        startEvent: Some(empty_start),
        stopEvent: Some(empty_stop),
        recordEventState: Some(empty_state),
        finalize: Some(empty_finalize),
    }
}

/// One table, called exactly as NCCL does (through the function pointers).
#[derive(Clone, Copy)]
pub struct Table {
    t: &'static ncclProfiler_v7_t,
    pub context: *mut c_void,
    /// A live ProxyOp handle (plugin) to parent steps.
    pub op: *mut c_void,
    /// A live Coll handle (plugin) to parent kernel channels.
    pub coll: *mut c_void,
}

// SAFETY: opaque values handed between threads as NCCL does.
unsafe impl Send for Table {}
// SAFETY: as above.
unsafe impl Sync for Table {}

impl Table {
    #[inline(always)]
    pub fn start(&self, d: &mut ncclProfilerEventDescr_v7_t) -> *mut c_void {
        let mut h = std::ptr::null_mut();
        // SAFETY: valid handle slot and descriptor for the call.
        unsafe { (self.t.startEvent.unwrap_unchecked())(self.context, &mut h, d) };
        h
    }

    #[inline(always)]
    pub fn stop(&self, h: *mut c_void) {
        // SAFETY: any handle value is allowed.
        unsafe { (self.t.stopEvent.unwrap_unchecked())(h) };
    }

    #[inline(always)]
    pub fn state(&self, h: *mut c_void, s: u32, bytes: u64) {
        let mut a = ncclProfilerEventStateArgs_v7_t {
            proxyStep: ncclProfilerEventStateArgs_v5_t__bindgen_ty_1 {
                transSize: bytes as usize,
            },
        };
        // SAFETY: any handle value is allowed; `a` lives across the call.
        unsafe { (self.t.recordEventState.unwrap_unchecked())(h, s, &mut a) };
    }
}

/// The plugin's communicator and the consumer steps the bench drives between batches.
pub struct Bench {
    plugin: Plugin,
    empty: &'static ncclProfiler_v7_t,
    comm: emulator::Comm,
    /// Virtual time of the consumer (moved forward by whole intervals).
    now: Instant,
}

impl Bench {
    pub fn new(hash: u64) -> Bench {
        // SAFETY: set before the first `init` reads the environment; single-threaded here.
        unsafe {
            std::env::set_var("NCCL_PROFILER_OTEL_TELEMETRY_ENABLE", "0");
            std::env::set_var("NCCL_PROFILER_OTEL_EXPORTER", "none");
        }
        let plugin = Plugin::in_process();
        let (comm, mask) = plugin.init(Some("bench"), hash, 2, 2, 0);
        assert!(!comm.context.is_null() && mask != 0);
        Bench {
            plugin,
            empty: Box::leak(Box::new(empty_table())),
            comm,
            now: Instant::now(),
        }
    }

    /// The plugin's table with a fresh Coll and ProxyOp to parent steps.
    pub fn plugin_table(&self) -> Table {
        let p = &self.plugin;
        let coll = p.coll(
            &self.comm,
            H::NULL,
            "AllReduce",
            "RING",
            "SIMPLE",
            "ncclFloat32",
            1 << 20,
            1,
            0,
        );
        p.stop(coll);
        let op = p.proxy_op(self.comm.context, coll, pid(), 0, 1, 0, 1 << 20, true);
        assert!(!op.is_null());
        Table {
            t: &nccl_profiler_otel::ffi::ncclProfiler_v7.get().table,
            context: self.comm.context,
            op: op.0,
            coll: coll.0,
        }
    }

    pub fn empty_table(&self) -> Table {
        Table {
            t: self.empty,
            context: std::ptr::dangling_mut::<c_void>(),
            op: std::ptr::dangling_mut::<c_void>(),
            coll: std::ptr::dangling_mut::<c_void>(),
        }
    }

    /// Closes the current window and processes it, as the telemetry thread would (untimed).
    pub fn consume(&mut self) {
        let interval = Config::global().interval;
        let c = consumer::all()
            .find(|c| c.comm.is_live() && c.comm.learned_hash() == self.comm.hash)
            .expect("bench communicator");
        for _ in 0..3 {
            self.now += interval + consumer::SETTLE;
            black_box(c.poll(self.now, clock::secs_per_tick()));
        }
    }
}

pub fn step_descr(op: *mut c_void, step: i32) -> ncclProfilerEventDescr_v7_t {
    let mut d = descr(ty::PROXY_STEP, H(op), 0);
    d.__bindgen_anon_1.proxyStep.step = step;
    d
}

pub fn kernel_descr(coll: *mut c_void, channel: u8) -> ncclProfilerEventDescr_v7_t {
    let mut d = descr(ty::KERNEL_CH, H(coll), 0);
    d.__bindgen_anon_1.kernelCh.channelId = channel;
    d.__bindgen_anon_1.kernelCh.pTimer = 1_000_000;
    d
}

/// The descriptor of a 1 MiB ring AllReduce with sequence number `seq`, from the application.
pub fn allreduce_descr(seq: u64) -> ncclProfilerEventDescr_v7_t {
    emulator::plugin::coll_descr(
        0,
        H::NULL,
        c"AllReduce".as_ptr(),
        c"RING".as_ptr(),
        c"SIMPLE".as_ptr(),
        c"ncclFloat32".as_ptr(),
        1 << 20,
        1,
        seq,
    )
}

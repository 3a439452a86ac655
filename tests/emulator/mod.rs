//! The NCCL host emulator: calls a profiler table the way NCCL 2.30 does (spec section 3).
//!
//! Shared by the integration tests, the examples and the benchmarks (`#[path]`-included). The
//! table is either the plugin linked into this process ([`Plugin::in_process`]) or the built
//! `.so` loaded like NCCL loads it ([`Plugin::load`]). Descriptors are built zeroed, as NCCL's v6
//! path does; the v4 adapter's garbage fields are emulated where a test asks for it.
#![allow(dead_code)]
// The event builders take NCCL's descriptor fields one to one, as NCCL fills them.
#![allow(clippy::too_many_arguments)]

use std::ffi::{CString, c_char, c_int, c_void};
use std::ptr;

use nccl_profiler_otel::bindings::*;

/// A loaded profiler table.
pub struct Plugin {
    table: &'static ncclProfiler_v4_t,
    // Keeps a dlopen'ed library mapped while the table is used.
    _lib: Option<libloading::Library>,
}

// SAFETY: the table is immutable (function pointers and a static name string); NCCL calls it from
// any thread, and so do we.
unsafe impl Sync for Plugin {}
unsafe impl Send for Plugin {}

/// NCCL's event type bits and state values used by the emulator.
pub mod ty {
    use nccl_profiler_otel::bindings::*;
    pub const GROUP: u8 = ncclProfileGroup as u8;
    pub const COLL: u8 = ncclProfileColl as u8;
    pub const P2P: u8 = ncclProfileP2p as u8;
    pub const PROXY_OP: u8 = ncclProfileProxyOp as u8;
    pub const PROXY_STEP: u8 = ncclProfileProxyStep as u8;
    pub const PROXY_CTRL: u8 = ncclProfileProxyCtrl as u8;
    pub const KERNEL_CH: u8 = ncclProfileKernelCh as u8;
    pub const SEND_GPU_WAIT: u32 = ncclProfilerProxyStepSendGPUWait;
    pub const SEND_PEER_WAIT: u32 = ncclProfilerProxyStepSendPeerWait_v4;
    pub const SEND_WAIT: u32 = ncclProfilerProxyStepSendWait;
    pub const RECV_WAIT: u32 = ncclProfilerProxyStepRecvWait;
    pub const RECV_FLUSH_WAIT: u32 = ncclProfilerProxyStepRecvFlushWait;
    pub const RECV_GPU_WAIT: u32 = ncclProfilerProxyStepRecvGPUWait;
    pub const OP_IN_PROGRESS: u32 = ncclProfilerProxyOpInProgress_v4;
    pub const KERNEL_CH_STOP: u32 = ncclProfilerKernelChStop;
}

/// A communicator as NCCL sees it: its context value and identity.
#[derive(Clone, Copy, Debug)]
pub struct Comm {
    pub context: *mut c_void,
    pub hash: u64,
    pub rank: i32,
    pub nranks: i32,
}

// SAFETY: the context is an opaque value the plugin gave us, never dereferenced here; NCCL passes
// it to callbacks on any thread.
unsafe impl Send for Comm {}
unsafe impl Sync for Comm {}

/// An event handle as NCCL stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct H(pub *mut c_void);

// SAFETY: as for `Comm::context`: an opaque value NCCL hands between its threads.
unsafe impl Send for H {}
unsafe impl Sync for H {}

impl H {
    pub const NULL: H = H(ptr::null_mut());
    pub fn is_null(self) -> bool {
        self.0.is_null()
    }
}

/// The zero-initialised v4 descriptor of an event type.
pub fn descr(ty: u8, parent: H, rank: i32) -> ncclProfilerEventDescr_v4_t {
    // SAFETY: all-zero is a valid descriptor (integers and NULL pointers), as NCCL builds them.
    let mut d: ncclProfilerEventDescr_v4_t = unsafe { std::mem::zeroed() };
    d.type_ = ty;
    d.parentObj = parent.0;
    d.rank = rank;
    d
}

/// NUL-terminated static strings as NCCL passes them.
pub fn cstr(s: &'static str) -> *const c_char {
    let leaked: &'static CString = Box::leak(Box::new(CString::new(s).unwrap()));
    leaked.as_ptr()
}

impl Plugin {
    /// The plugin linked into this test binary.
    pub fn in_process() -> Plugin {
        Plugin {
            table: &nccl_profiler_otel::ffi::ncclProfiler_v4.0,
            _lib: None,
        }
    }

    /// Loads a built plugin the way NCCL does: `dlopen(path, RTLD_NOW | RTLD_LOCAL)`, then the
    /// data symbol `ncclProfiler_v4`.
    pub fn load(path: &std::path::Path) -> Result<Plugin, libloading::Error> {
        use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
        // SAFETY: loading our own plugin runs no initialisers with preconditions.
        let lib = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL)? };
        // SAFETY: the symbol is a `ncclProfiler_v4_t` static that lives as long as the library.
        let table: &'static ncclProfiler_v4_t = unsafe {
            let sym = lib.get::<*const ncclProfiler_v4_t>(b"ncclProfiler_v4\0")?;
            &**sym
        };
        Ok(Plugin {
            table,
            _lib: Some(lib.into()),
        })
    }

    /// The table's `name`.
    pub fn name(&self) -> String {
        // SAFETY: the plugin's name is a static C string.
        unsafe { std::ffi::CStr::from_ptr(self.table.name) }
            .to_string_lossy()
            .into_owned()
    }

    /// `init` for a communicator; returns the comm and the activation mask the plugin set.
    pub fn init(&self, name: Option<&str>, hash: u64, n_nodes: i32, nranks: i32, rank: i32) -> (Comm, i32) {
        let mut context: *mut c_void = 0xdead as *mut c_void;
        let mut mask: c_int = 0;
        let name = name.map(|n| CString::new(n).unwrap());
        let rc = unsafe {
            (self.table.init.unwrap())(
                &mut context,
                &mut mask,
                name.as_ref().map_or(ptr::null(), |n| n.as_ptr()),
                hash,
                n_nodes,
                nranks,
                rank,
                None,
            )
        };
        assert_eq!(rc, ncclSuccess, "init must never fail");
        drop(name); // NCCL does not keep commName alive: the plugin must have copied it.
        (
            Comm {
                context,
                hash,
                rank,
                nranks,
            },
            mask,
        )
    }

    /// `startEvent`; returns the handle the plugin wrote (the slot is pre-filled with garbage to
    /// check that it is always written).
    pub fn start(&self, context: *mut c_void, d: &mut ncclProfilerEventDescr_v4_t) -> H {
        let mut h: *mut c_void = 0xbad as *mut c_void;
        let rc = unsafe { (self.table.startEvent.unwrap())(context, &mut h, d) };
        assert_eq!(rc, ncclSuccess);
        assert_ne!(h, 0xbad as *mut c_void, "*eHandle must always be written");
        H(h)
    }

    /// `stopEvent`.
    pub fn stop(&self, h: H) {
        assert_eq!(unsafe { (self.table.stopEvent.unwrap())(h.0) }, ncclSuccess);
    }

    /// `recordEventState` with args whose `transSize`/`pTimer` is `value`.
    pub fn state(&self, h: H, state: u32, value: u64) {
        let mut args = ncclProfilerEventStateArgs_v4_t {
            kernelCh: ncclProfilerEventStateArgs_v4_t__bindgen_ty_4 { pTimer: value },
        };
        assert_eq!(
            unsafe { (self.table.recordEventState.unwrap())(h.0, state, &mut args) },
            ncclSuccess
        );
    }

    /// `recordEventState` with NULL args.
    pub fn state_null(&self, h: H, state: u32) {
        assert_eq!(
            unsafe { (self.table.recordEventState.unwrap())(h.0, state, ptr::null_mut()) },
            ncclSuccess
        );
    }

    /// `finalize`.
    pub fn finalize(&self, context: *mut c_void) {
        assert_eq!(unsafe { (self.table.finalize.unwrap())(context) }, ncclSuccess);
    }

    /// Group start.
    pub fn group(&self, c: &Comm) -> H {
        self.start(c.context, &mut descr(ty::GROUP, H::NULL, 0))
    }

    /// Coll start with the given strings and sizes.
    pub fn coll(
        &self,
        c: &Comm,
        parent: H,
        func: &'static str,
        algo: &'static str,
        proto: &'static str,
        dtype: &'static str,
        count: usize,
        n_channels: u8,
        seq: u64,
    ) -> H {
        let mut d = descr(ty::COLL, parent, c.rank);
        // SAFETY: writing the union member that matches `type`.
        unsafe {
            let k = &mut d.__bindgen_anon_1.coll;
            k.seqNumber = seq;
            k.func = cstr(func);
            k.algo = cstr(algo);
            k.proto = cstr(proto);
            k.datatype = cstr(dtype);
            k.count = count;
            k.nChannels = n_channels;
        }
        self.start(c.context, &mut d)
    }

    /// P2p start.
    pub fn p2p(&self, c: &Comm, parent: H, func: &'static str, dtype: &'static str, count: usize, peer: i32) -> H {
        let mut d = descr(ty::P2P, parent, c.rank);
        // SAFETY: writing the union member that matches `type`.
        unsafe {
            let p = &mut d.__bindgen_anon_1.p2p;
            p.func = cstr(func);
            p.datatype = cstr(dtype);
            p.count = count;
            p.peer = peer;
        }
        self.start(c.context, &mut d)
    }

    /// ProxyOp start from process `pid` (ours unless a PXN test says otherwise).
    pub fn proxy_op(
        &self,
        context: *mut c_void,
        parent: H,
        pid: i32,
        rank: i32,
        peer: i32,
        channel: u8,
        n_steps: i32,
        is_send: bool,
    ) -> H {
        let mut d = descr(ty::PROXY_OP, parent, rank);
        // SAFETY: writing the union member that matches `type`.
        unsafe {
            let p = &mut d.__bindgen_anon_1.proxyOp;
            p.pid = pid;
            p.peer = peer;
            p.channelId = channel;
            p.nSteps = n_steps;
            p.chunkSize = 1 << 20;
            p.isSend = is_send as c_int;
        }
        self.start(context, &mut d)
    }

    /// ProxyStep start.
    pub fn proxy_step(&self, context: *mut c_void, op: H, rank: i32, step: i32) -> H {
        let mut d = descr(ty::PROXY_STEP, op, rank);
        d.__bindgen_anon_1.proxyStep.step = step;
        self.start(context, &mut d)
    }

    /// KernelCh start with the GPU start time.
    pub fn kernel_ch(&self, context: *mut c_void, parent: H, channel: u8, gpu_start: u64) -> H {
        let mut d = descr(ty::KERNEL_CH, parent, 0);
        d.__bindgen_anon_1.kernelCh.channelId = channel;
        d.__bindgen_anon_1.kernelCh.pTimer = gpu_start;
        self.start(context, &mut d)
    }

    /// One send step as NCCL's send proxy makes it (spec 3.7): start, GPUWait (stale size),
    /// `peer_waits` × PeerWait, SendWait with `bytes`, then `transfer` later the stop.
    pub fn send_step(
        &self,
        context: *mut c_void,
        op: H,
        rank: i32,
        step: i32,
        bytes: u64,
        peer_waits: u32,
        transfer: std::time::Duration,
    ) {
        let s = self.proxy_step(context, op, rank, step);
        self.state(s, ty::SEND_GPU_WAIT, 12345);
        (0..peer_waits).for_each(|_| self.state(s, ty::SEND_PEER_WAIT, 12345));
        self.state(s, ty::SEND_WAIT, bytes);
        spin(transfer);
        self.stop(s);
    }
}

/// Busy-waits `d` (sleep is too coarse for microsecond transfers).
pub fn spin(d: std::time::Duration) {
    let t = std::time::Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Our pid as NCCL compares it for PXN.
pub fn pid() -> i32 {
    std::process::id() as i32
}

//! Loading the plugin like NCCL (spec 1.2–1.3) and calling its table (spec 2.4).
//!
//! Every call checks what NCCL relies on: `init`, start, state, stop and finalize return
//! `ncclSuccess`, and `startEvent` always writes `*eHandle`.
// The event builders take NCCL's descriptor fields one to one, as NCCL fills them.
#![allow(clippy::too_many_arguments)]

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::fmt;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::atomic::{AtomicI32, Ordering};

use nccl_profiler_otel::bindings::*;
use parking_lot::Mutex;

use super::logger;

/// NCCL's event type bits and state values used by the emulator (spec 2.2, 2.3).
pub mod ty {
    use nccl_profiler_otel::bindings::*;
    pub const GROUP: u8 = ncclProfileGroup as u8;
    pub const COLL: u8 = ncclProfileColl as u8;
    pub const P2P: u8 = ncclProfileP2p as u8;
    pub const PROXY_OP: u8 = ncclProfileProxyOp as u8;
    pub const PROXY_STEP: u8 = ncclProfileProxyStep as u8;
    pub const PROXY_CTRL: u8 = ncclProfileProxyCtrl as u8;
    pub const KERNEL_CH: u8 = ncclProfileKernelCh as u8;
    pub const NET_PLUGIN: u8 = ncclProfileNetPlugin as u8;
    pub const SEND_GPU_WAIT: u32 = ncclProfilerProxyStepSendGPUWait;
    pub const SEND_PEER_WAIT: u32 = ncclProfilerProxyStepSendPeerWait_v4;
    pub const SEND_WAIT: u32 = ncclProfilerProxyStepSendWait;
    pub const RECV_WAIT: u32 = ncclProfilerProxyStepRecvWait;
    pub const RECV_FLUSH_WAIT: u32 = ncclProfilerProxyStepRecvFlushWait;
    pub const RECV_GPU_WAIT: u32 = ncclProfilerProxyStepRecvGPUWait;
    pub const CTRL_IDLE: u32 = ncclProfilerProxyCtrlIdle;
    pub const CTRL_ACTIVE: u32 = ncclProfilerProxyCtrlActive;
    pub const CTRL_SLEEP: u32 = ncclProfilerProxyCtrlSleep;
    pub const CTRL_WAKEUP: u32 = ncclProfilerProxyCtrlWakeup;
    pub const CTRL_APPEND: u32 = ncclProfilerProxyCtrlAppend;
    pub const CTRL_APPEND_END: u32 = ncclProfilerProxyCtrlAppendEnd;
    pub const OP_IN_PROGRESS: u32 = ncclProfilerProxyOpInProgress_v4;
    pub const NET_PLUGIN_UPDATE: u32 = ncclProfilerNetPluginUpdate;
    pub const KERNEL_CH_STOP: u32 = ncclProfilerKernelChStop;
}

/// Which event types NCCL starts for an activation mask (spec 3.2: parents are started whenever
/// a descendant is wanted).
pub mod mask {
    pub const GROUP: i32 = 0x1;
    pub const COLL: i32 = 0x2;
    pub const P2P: i32 = 0x4;
    pub const PROXY_OP: i32 = 0x8;
    pub const PROXY_STEP: i32 = 0x10;
    pub const PROXY_CTRL: i32 = 0x20;
    pub const KERNEL_CH: i32 = 0x40;
    pub const NET_PLUGIN: i32 = 0x80;
    /// Every type a v4 plugin can receive.
    pub const ALL_V4: i32 = 0xFF;

    pub fn group(m: i32) -> bool {
        m & (GROUP | COLL | P2P | PROXY_OP | PROXY_STEP | KERNEL_CH | NET_PLUGIN) != 0
    }
    pub fn coll(m: i32) -> bool {
        m & (COLL | PROXY_OP | PROXY_STEP | KERNEL_CH | NET_PLUGIN) != 0
    }
    pub fn p2p(m: i32) -> bool {
        m & (P2P | PROXY_OP | PROXY_STEP | KERNEL_CH | NET_PLUGIN) != 0
    }
    pub fn proxy_op(m: i32) -> bool {
        m & (PROXY_OP | PROXY_STEP | NET_PLUGIN) != 0
    }
    pub fn proxy_step(m: i32) -> bool {
        m & (PROXY_STEP | NET_PLUGIN) != 0
    }
    pub fn kernel_ch(m: i32) -> bool {
        m & KERNEL_CH != 0
    }
    pub fn proxy_ctrl(m: i32) -> bool {
        m & PROXY_CTRL != 0
    }
    pub fn net_plugin(m: i32) -> bool {
        m & NET_PLUGIN != 0
    }
}

/// A profiler API version, by its exported symbol `ncclProfiler_vN`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    V4 = 4,
    V5 = 5,
    V6 = 6,
}

impl Version {
    /// The order NCCL 2.30 looks the symbols up in (spec 1.3; v3–v1 are not emulated).
    pub const NCCL_ORDER: [Version; 3] = [Version::V6, Version::V5, Version::V4];

    /// The versions the emulator can drive.
    pub const DRIVABLE: [Version; 1] = [Version::V4];

    pub fn symbol(self) -> &'static CStr {
        match self {
            Version::V4 => c"ncclProfiler_v4",
            Version::V5 => c"ncclProfiler_v5",
            Version::V6 => c"ncclProfiler_v6",
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", *self as u8)
    }
}

/// Why a plugin could not be loaded.
#[derive(Debug)]
pub enum LoadError {
    /// `dlopen` failed.
    Open(String),
    /// None of the symbols looked up exists (NCCL would mark the plugin failed).
    NoSymbol { path: PathBuf, looked_up: Vec<Version> },
    /// Only versions the emulator cannot drive yet were found.
    Unsupported { path: PathBuf, found: Vec<Version> },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |v: &[Version]| {
            v.iter()
                .map(|v| v.symbol().to_string_lossy())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            LoadError::Open(e) => write!(f, "dlopen failed: {e}"),
            LoadError::NoSymbol { path, looked_up } => {
                write!(f, "{} exports none of {}", path.display(), list(looked_up))
            }
            LoadError::Unsupported { path, found } => write!(
                f,
                "{} exports only {} and the emulator drives only {}; NCCL would use {}",
                path.display(),
                list(found),
                list(&Version::DRIVABLE),
                found.first().map_or("nothing".into(), |v| v.to_string())
            ),
        }
    }
}

impl std::error::Error for LoadError {}

/// The built plugin next to the running test, example or bench executable:
/// `target/<profile>/{deps/,}libnccl_profiler_otel.so` (`cargo test`, `cargo bench` and
/// `cargo run --example` build the cdylib with the library).
pub fn built_library() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // Tests run from target/<profile>/deps, examples from target/<profile>/examples; cargo
    // uplifts the cdylib to target/<profile> only on `cargo build`, so deps/ comes first.
    let candidates: Vec<PathBuf> = exe
        .ancestors()
        .skip(1)
        .take(2)
        .flat_map(|dir| [dir.join("deps"), dir.to_path_buf()])
        .map(|dir| dir.join("libnccl_profiler_otel.so"))
        .collect();
    candidates.iter().find(|p| p.exists()).cloned().ok_or_else(|| {
        format!(
            "libnccl_profiler_otel.so not found next to {} (looked at {:?}); build it with `cargo build`",
            exe.display(),
            candidates
        )
    })
}

/// A loaded profiler table, driven as v4.
pub struct Plugin {
    table: &'static ncclProfiler_v4_t,
    found: Vec<Version>,
    /// NCCL's process-wide activation mask: every `init` gets its address (spec 3.2).
    mask: Box<AtomicI32>,
    // Keeps a dlopen'ed library mapped while the table is used (`table` points into it).
    lib: Option<libloading::Library>,
}

// SAFETY: the table is immutable (function pointers and a static name string) and the mask is an
// atomic; NCCL calls the table from any thread, and so do we.
unsafe impl Sync for Plugin {}
// SAFETY: as above; the library handle may be closed from any thread.
unsafe impl Send for Plugin {}

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
// SAFETY: as above.
unsafe impl Sync for Comm {}

/// An event handle as NCCL stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct H(pub *mut c_void);

// SAFETY: as for `Comm::context`: an opaque value NCCL hands between its threads.
unsafe impl Send for H {}
// SAFETY: as above.
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

/// A NUL-terminated copy of `s` that lives for the rest of the process (one per distinct string).
pub fn cstr(s: &'static str) -> *const c_char {
    static INTERNED: Mutex<BTreeMap<&'static str, &'static CStr>> = Mutex::new(BTreeMap::new());
    let mut m = INTERNED.lock();
    m.entry(s)
        .or_insert_with(|| Box::leak(CString::new(s).expect("no NUL").into_boxed_c_str()))
        .as_ptr()
}

thread_local! {
    static CALLS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Plugin callbacks this thread made through [`Plugin`] so far.
pub fn calls_on_this_thread() -> u64 {
    CALLS.with(|c| c.get())
}

fn count_call() {
    CALLS.with(|c| c.set(c.get() + 1));
}

/// Our pid as NCCL compares it for PXN.
pub fn pid() -> i32 {
    std::process::id() as i32
}

impl Plugin {
    fn new(table: &'static ncclProfiler_v4_t, found: Vec<Version>, lib: Option<libloading::Library>) -> Plugin {
        Plugin {
            table,
            found,
            mask: Box::new(AtomicI32::new(0)),
            lib,
        }
    }

    /// The plugin linked into this binary (its exported `ncclProfiler_v4`).
    pub fn in_process() -> Plugin {
        Plugin::new(&nccl_profiler_otel::ffi::ncclProfiler_v4.0, vec![Version::V4], None)
    }

    /// Loads a built plugin the way NCCL does: `dlopen(path, RTLD_NOW | RTLD_LOCAL)`, then the
    /// data symbols `ncclProfiler_v6`, `_v5`, `_v4`, newest first. NCCL would use the newest one
    /// found ([`Plugin::nccl_would_use`]); the emulator drives v4 when it is exported and
    /// reports [`LoadError::Unsupported`] when only newer versions are.
    pub fn load(path: &Path) -> Result<Plugin, LoadError> {
        Self::open(path, &Version::NCCL_ORDER)
    }

    /// Like [`Plugin::load`], but looks up `version` only (NCCL has no such switch; the flag
    /// exists to test one table of a plugin that exports several).
    pub fn load_version(path: &Path, version: Version) -> Result<Plugin, LoadError> {
        Self::open(path, &[version])
    }

    /// The built plugin next to this executable ([`built_library`]), loaded like NCCL.
    pub fn load_built() -> Result<Plugin, String> {
        let path = built_library()?;
        Plugin::load(&path).map_err(|e| e.to_string())
    }

    fn open(path: &Path, versions: &[Version]) -> Result<Plugin, LoadError> {
        use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
        // SAFETY: loading the plugin runs its initialisers, which have no preconditions.
        let lib =
            unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }.map_err(|e| LoadError::Open(e.to_string()))?;
        let lookup = |v: Version| {
            // SAFETY: the symbol, when present, is a `ncclProfiler_vN_t` static (48 bytes of
            // pointers for every version) that lives as long as the library.
            unsafe { lib.get::<*const ncclProfiler_v4_t>(v.symbol().to_bytes_with_nul()) }
                .ok()
                .map(|sym| *sym)
        };
        let found: Vec<Version> = versions.iter().copied().filter(|&v| lookup(v).is_some()).collect();
        if found.is_empty() {
            return Err(LoadError::NoSymbol {
                path: path.to_owned(),
                looked_up: versions.to_vec(),
            });
        }
        let Some(table) = found.contains(&Version::V4).then(|| lookup(Version::V4)).flatten() else {
            return Err(LoadError::Unsupported {
                path: path.to_owned(),
                found,
            });
        };
        // SAFETY: non-NULL symbol address of a static in a library we keep open in `lib`.
        let table: &'static ncclProfiler_v4_t = unsafe { &*table };
        Ok(Plugin::new(table, found, Some(lib.into())))
    }

    /// The versions found, newest first.
    pub fn found(&self) -> &[Version] {
        &self.found
    }

    /// What NCCL 2.30 would use: the newest version found.
    pub fn nccl_would_use(&self) -> Version {
        self.found.first().copied().unwrap_or(Version::V4)
    }

    /// The version the emulator drives.
    pub fn driving(&self) -> Version {
        Version::V4
    }

    /// Whether the table came from `dlopen`.
    pub fn is_loaded(&self) -> bool {
        self.lib.is_some()
    }

    /// `dlclose`, as NCCL does after the last communicator's `finalize` (spec 1.4).
    pub fn close(self) {
        drop(self);
    }

    /// The table's `name`.
    pub fn name(&self) -> String {
        // SAFETY: the plugin's name is a static C string.
        unsafe { CStr::from_ptr(self.table.name) }
            .to_string_lossy()
            .into_owned()
    }

    /// The raw table, for benchmarks that call it directly.
    pub fn table(&self) -> &'static ncclProfiler_v4_t {
        self.table
    }

    /// The activation mask as NCCL would read it now.
    pub fn mask(&self) -> i32 {
        self.mask.load(Ordering::Relaxed)
    }

    /// `init` for a communicator with NCCL's arguments and the emulator's logger; returns the
    /// comm and the activation mask the plugin set.
    pub fn init(&self, name: Option<&str>, hash: u64, n_nodes: i32, nranks: i32, rank: i32) -> (Comm, i32) {
        let name = name.map(|n| CString::new(n).expect("no NUL in a comm name"));
        let mut context: *mut c_void = 0xdead as *mut c_void;
        count_call();
        // SAFETY: the arguments are what NCCL passes: the address of a context slot, of the
        // process-wide mask, a C string valid for the call, and a logger (or NULL).
        let rc = unsafe {
            (self.table.init.expect("init"))(
                &mut context,
                self.mask.as_ptr(),
                name.as_ref().map_or(ptr::null(), |n| n.as_ptr()),
                hash,
                n_nodes,
                nranks,
                rank,
                logger::logfn(),
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
            self.mask(),
        )
    }

    /// `startEvent`; returns the handle the plugin wrote (the slot is pre-filled with garbage to
    /// check that it is always written).
    pub fn start(&self, context: *mut c_void, d: &mut ncclProfilerEventDescr_v4_t) -> H {
        let mut h: *mut c_void = 0xbad as *mut c_void;
        count_call();
        // SAFETY: a handle slot and a descriptor valid for the call, as NCCL passes them.
        let rc = unsafe { (self.table.startEvent.expect("startEvent"))(context, &mut h, d) };
        assert_eq!(rc, ncclSuccess);
        assert_ne!(h, 0xbad as *mut c_void, "*eHandle must always be written");
        H(h)
    }

    /// `stopEvent`.
    pub fn stop(&self, h: H) {
        count_call();
        // SAFETY: any handle value is allowed; the plugin validates it.
        assert_eq!(unsafe { (self.table.stopEvent.expect("stopEvent"))(h.0) }, ncclSuccess);
    }

    /// `recordEventState` with args whose first 8 bytes are `value`: `transSize`, `pTimer`,
    /// `netPlugin.data`, or (low 32 bits) `appendedProxyOps`.
    pub fn state(&self, h: H, state: u32, value: u64) {
        let mut args = ncclProfilerEventStateArgs_v4_t {
            kernelCh: ncclProfilerEventStateArgs_v4_t__bindgen_ty_4 { pTimer: value },
        };
        count_call();
        // SAFETY: any handle value is allowed; `args` is valid for the call.
        let rc = unsafe { (self.table.recordEventState.expect("recordEventState"))(h.0, state, &mut args) };
        assert_eq!(rc, ncclSuccess);
    }

    /// `recordEventState` with NULL args.
    pub fn state_null(&self, h: H, state: u32) {
        count_call();
        // SAFETY: NULL args are allowed (NCCL passes NULL for GroupApi states).
        let rc = unsafe { (self.table.recordEventState.expect("recordEventState"))(h.0, state, ptr::null_mut()) };
        assert_eq!(rc, ncclSuccess);
    }

    /// `finalize`.
    pub fn finalize(&self, context: *mut c_void) {
        count_call();
        // SAFETY: any context value is allowed; the plugin validates it.
        assert_eq!(
            unsafe { (self.table.finalize.expect("finalize"))(context) },
            ncclSuccess
        );
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
        let mut d = coll_descr(
            c.rank,
            parent,
            cstr(func),
            cstr(algo),
            cstr(proto),
            cstr(dtype),
            count,
            n_channels,
            seq,
        );
        self.start(c.context, &mut d)
    }

    /// P2p start.
    pub fn p2p(&self, c: &Comm, parent: H, func: &'static str, dtype: &'static str, count: usize, peer: i32) -> H {
        let mut d = p2p_descr(c.rank, parent, cstr(func), cstr(dtype), count, peer, 1);
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
        let mut d = proxy_op_descr(parent, pid, rank, peer, channel, n_steps, 1 << 20, is_send);
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
        super::time::spin(transfer);
        self.stop(s);
    }
}

/// A Coll descriptor (v4: `parentObj` is the Group handle).
pub fn coll_descr(
    rank: i32,
    parent: H,
    func: *const c_char,
    algo: *const c_char,
    proto: *const c_char,
    dtype: *const c_char,
    count: usize,
    n_channels: u8,
    seq: u64,
) -> ncclProfilerEventDescr_v4_t {
    let mut d = descr(ty::COLL, parent, rank);
    // SAFETY: writing the union member that matches `type`.
    unsafe {
        let k = &mut d.__bindgen_anon_1.coll;
        k.seqNumber = seq;
        k.func = func;
        k.algo = algo;
        k.proto = proto;
        k.datatype = dtype;
        k.count = count;
        k.nChannels = n_channels;
        k.nWarps = 16;
    }
    d
}

/// A P2p descriptor.
pub fn p2p_descr(
    rank: i32,
    parent: H,
    func: *const c_char,
    dtype: *const c_char,
    count: usize,
    peer: i32,
    n_channels: u8,
) -> ncclProfilerEventDescr_v4_t {
    let mut d = descr(ty::P2P, parent, rank);
    // SAFETY: writing the union member that matches `type`.
    unsafe {
        let p = &mut d.__bindgen_anon_1.p2p;
        p.func = func;
        p.datatype = dtype;
        p.count = count;
        p.peer = peer;
        p.nChannels = n_channels;
    }
    d
}

/// A ProxyOp descriptor.
pub fn proxy_op_descr(
    parent: H,
    pid: i32,
    rank: i32,
    peer: i32,
    channel: u8,
    n_steps: i32,
    chunk_size: i32,
    is_send: bool,
) -> ncclProfilerEventDescr_v4_t {
    let mut d = descr(ty::PROXY_OP, parent, rank);
    // SAFETY: writing the union member that matches `type`.
    unsafe {
        let p = &mut d.__bindgen_anon_1.proxyOp;
        p.pid = pid;
        p.peer = peer;
        p.channelId = channel;
        p.nSteps = n_steps;
        p.chunkSize = chunk_size;
        p.isSend = c_int::from(is_send);
    }
    d
}

/// A NetPlugin descriptor (spec 3.10): `parent` is the ProxyStep handle NCCL gave the network
/// plugin, `data` its own descriptor.
pub fn net_plugin_descr(parent: H, rank: i32, id: i64, data: *mut c_void) -> ncclProfilerEventDescr_v4_t {
    let mut d = descr(ty::NET_PLUGIN, parent, rank);
    // SAFETY: writing the union member that matches `type`.
    unsafe {
        let n = &mut d.__bindgen_anon_1.netPlugin;
        n.id = id;
        n.data = data;
    }
    d
}

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
use super::release::{self, Release};

/// NCCL's event type bits and state values used by the emulator (spec 2.2, 2.3, 7.2.1).
pub mod ty {
    use nccl_profiler_otel::bindings::*;
    pub const GROUP: u64 = ncclProfileGroup as u64;
    pub const COLL: u64 = ncclProfileColl as u64;
    pub const P2P: u64 = ncclProfileP2p as u64;
    pub const PROXY_OP: u64 = ncclProfileProxyOp as u64;
    pub const PROXY_STEP: u64 = ncclProfileProxyStep as u64;
    pub const PROXY_CTRL: u64 = ncclProfileProxyCtrl as u64;
    pub const KERNEL_CH: u64 = ncclProfileKernelCh as u64;
    pub const NET_PLUGIN: u64 = ncclProfileNetPlugin as u64;
    pub const GROUP_API: u64 = ncclProfileGroupApi as u64;
    pub const COLL_API: u64 = ncclProfileCollApi as u64;
    pub const P2P_API: u64 = ncclProfileP2pApi as u64;
    pub const KERNEL_LAUNCH: u64 = ncclProfileKernelLaunch as u64;
    pub const CE_COLL: u64 = ncclProfileCeColl as u64;
    pub const CE_SYNC: u64 = ncclProfileCeSync as u64;
    pub const CE_BATCH: u64 = ncclProfileCeBatch as u64;
    pub const KERNEL_PHASE: u64 = ncclProfileKernelPhase as u64;
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
    pub const GROUP_START_API_STOP: u32 = ncclProfilerGroupStartApiStop;
    pub const GROUP_END_API_START: u32 = ncclProfilerGroupEndApiStart;
    pub const KERNEL_PHASE_STOP: u32 = ncclProfilerKernelPhaseStop;
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
    pub const GROUP_API: i32 = 0x100;
    pub const COLL_API: i32 = 0x200;
    pub const P2P_API: i32 = 0x400;
    pub const KERNEL_LAUNCH: i32 = 0x800;
    pub const CE: i32 = 0x7000;
    pub const CE_COLL: i32 = 0x1000;
    pub const KERNEL_PHASE: i32 = 0x8000;
    /// Bits the plugin adds to the configured mask, by ABI version: CeColl with Coll (v6+),
    /// KernelPhase with KernelCh (v7 on NCCL 2.31).
    pub const IMPLIED: i32 = CE_COLL | KERNEL_PHASE;
    /// Every type a v4 plugin can receive.
    pub const ALL_V4: i32 = 0xFF;

    pub fn group_api(m: i32) -> bool {
        m & !PROXY_CTRL != 0
    }
    pub fn coll_api(m: i32) -> bool {
        m & (COLL_API | COLL | PROXY_OP | PROXY_STEP | KERNEL_CH | NET_PLUGIN | CE) != 0
    }
    pub fn p2p_api(m: i32) -> bool {
        m & (P2P_API | P2P | PROXY_OP | PROXY_STEP | KERNEL_CH | NET_PLUGIN) != 0
    }
    pub fn ce_coll(m: i32) -> bool {
        m & CE != 0
    }
    /// Before 2.26 the Group bit alone starts nothing and P2p events follow the Coll bit (spec
    /// 8.2.5); 2.26 and 2.27 start P2p without NetPlugin (8.4.3).
    fn early() -> bool {
        super::release::current() < super::Release::V2_26_6
    }
    pub fn group(m: i32) -> bool {
        if early() {
            return m & (COLL | P2P | PROXY_OP | PROXY_STEP) != 0;
        }
        m & (GROUP | COLL | P2P | PROXY_OP | PROXY_STEP | KERNEL_CH | NET_PLUGIN) != 0
    }
    pub fn coll(m: i32) -> bool {
        if early() {
            return m & (COLL | PROXY_OP | PROXY_STEP) != 0;
        }
        m & (COLL | PROXY_OP | PROXY_STEP | KERNEL_CH | NET_PLUGIN) != 0
    }
    pub fn p2p(m: i32) -> bool {
        if early() {
            return coll(m);
        }
        m & (P2P | PROXY_OP | PROXY_STEP | KERNEL_CH | NET_PLUGIN) != 0
    }
    pub fn proxy_op(m: i32) -> bool {
        if early() {
            return m & (PROXY_OP | PROXY_STEP) != 0;
        }
        m & (PROXY_OP | PROXY_STEP | NET_PLUGIN) != 0
    }
    pub fn proxy_step(m: i32) -> bool {
        if early() {
            return m & PROXY_STEP != 0;
        }
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
    V1 = 1,
    V2 = 2,
    V3 = 3,
    V4 = 4,
    V5 = 5,
    V6 = 6,
    V7 = 7,
}

impl Version {
    /// Every version, oldest first.
    pub const ALL: [Version; 7] = [
        Version::V1,
        Version::V2,
        Version::V3,
        Version::V4,
        Version::V5,
        Version::V6,
        Version::V7,
    ];

    /// v1–v3: no identity at `init`, bytes in ProxyOp states (spec 8).
    pub fn legacy(self) -> bool {
        self <= Version::V3
    }

    pub fn symbol(self) -> &'static CStr {
        match self {
            Version::V1 => c"ncclProfiler_v1",
            Version::V2 => c"ncclProfiler_v2",
            Version::V3 => c"ncclProfiler_v3",
            Version::V4 => c"ncclProfiler_v4",
            Version::V5 => c"ncclProfiler_v5",
            Version::V6 => c"ncclProfiler_v6",
            Version::V7 => c"ncclProfiler_v7",
        }
    }

    /// `v7` or `7` → [`Version::V7`].
    pub fn parse(s: &str) -> Option<Version> {
        let n: u8 = s.trim().trim_start_matches('v').parse().ok()?;
        Version::ALL.iter().copied().find(|&v| v as u8 == n)
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
    /// The newest version found is v1–v3 and the emulated release is not the one that uses it
    /// natively: it would go through that release's adapter, which the emulator drives only from
    /// v4.
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
                "{} exports only {}; NCCL {} would use {} through its adapter, which the emulator drives only from v4",
                path.display(),
                list(found),
                release::current(),
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

/// A loaded profiler table of one version, driven the way the emulated NCCL release drives it:
/// natively when it is the newest table the release knows, else through that release's adapter.
pub struct Plugin {
    table: Table,
    found: Vec<Version>,
    release: Release,
    /// NCCL's process-wide activation mask: every `init` gets its address (spec 3.2).
    mask: Box<AtomicI32>,
    /// Communicator hash by context value: v1–v3 put it in Coll/P2p descriptors.
    hashes: Mutex<BTreeMap<usize, u64>>,
    // Keeps a dlopen'ed library mapped while the table is used (`table` points into it).
    lib: Option<libloading::Library>,
}

/// `$body` with `$t` bound to the driven table, whatever its version (the six entries have the
/// same names in every version).
macro_rules! each_table {
    ($table:expr, $t:ident => $body:expr) => {
        match $table {
            Table::V1($t) => $body,
            Table::V2($t) => $body,
            Table::V3($t) => $body,
            Table::V4($t) => $body,
            Table::V5($t) => $body,
            Table::V6($t) => $body,
            Table::V7($t) => $body,
        }
    };
}

/// The table being driven, typed by its version.
#[derive(Clone, Copy)]
enum Table {
    V1(&'static ncclProfiler_v1_t),
    V2(&'static ncclProfiler_v2_t),
    V3(&'static ncclProfiler_v3_t),
    V4(&'static ncclProfiler_v4_t),
    V5(&'static ncclProfiler_v5_t),
    V6(&'static ncclProfiler_v6_t),
    V7(&'static ncclProfiler_v7_t),
}

impl Table {
    /// # Safety
    /// `p` is the address of a live `ncclProfiler_vN_t` of `version` (the layout of 2.4: six
    /// pointers), valid as long as the returned value is used.
    unsafe fn from_raw(version: Version, p: *const c_void) -> Option<Table> {
        // SAFETY: per this function's contract.
        unsafe {
            Some(match version {
                Version::V1 => Table::V1(&*p.cast()),
                Version::V2 => Table::V2(&*p.cast()),
                Version::V3 => Table::V3(&*p.cast()),
                Version::V4 => Table::V4(&*p.cast()),
                Version::V5 => Table::V5(&*p.cast()),
                Version::V6 => Table::V6(&*p.cast()),
                Version::V7 => Table::V7(&*p.cast()),
            })
        }
    }

    fn version(self) -> Version {
        match self {
            Table::V1(_) => Version::V1,
            Table::V2(_) => Version::V2,
            Table::V3(_) => Version::V3,
            Table::V4(_) => Version::V4,
            Table::V5(_) => Version::V5,
            Table::V6(_) => Version::V6,
            Table::V7(_) => Version::V7,
        }
    }

    fn name(self) -> *const c_char {
        each_table!(self, t => t.name)
    }
}

/// A v1, v2 or v3 descriptor (the largest is v2's, 128 bytes).
#[repr(C)]
union LegacyDescr {
    v1: ncclProfilerEventDescr_v1_t,
    v2: ncclProfilerEventDescr_v2_t,
    v3: ncclProfilerEventDescr_v3_t,
}

/// A name string as v2/v3 carry it.
fn same(s: *const c_char) -> *const c_char {
    s
}

/// A name string as v1's numeric code (`ncclFunc_t`, `ncclDataType_t`, `NCCL_ALGO_*`,
/// `NCCL_PROTO_*`, by their NCCL 2.23 values); 0 for a NULL or unknown string.
fn code(s: *const c_char) -> u8 {
    const TABLES: [&[&str]; 4] = [
        &[
            "Broadcast",
            "Reduce",
            "AllGather",
            "ReduceScatter",
            "AllReduce",
            "SendRecv",
            "Send",
            "Recv",
        ],
        &[
            "ncclInt8",
            "ncclUint8",
            "ncclInt32",
            "ncclUint32",
            "ncclInt64",
            "ncclUint64",
            "ncclFloat16",
            "ncclFloat32",
            "ncclFloat64",
            "ncclBfloat16",
            "ncclFloat8e4m3",
            "ncclFloat8e5m2",
        ],
        &[
            "TREE",
            "RING",
            "COLLNET_DIRECT",
            "COLLNET_CHAIN",
            "NVLS",
            "NVLS_TREE",
            "PAT",
        ],
        &["LL", "LL128", "SIMPLE"],
    ];
    if s.is_null() {
        return 0;
    }
    // SAFETY: the emulator's names are interned NUL-terminated strings.
    let name = unsafe { CStr::from_ptr(s) }.to_str().unwrap_or("");
    TABLES
        .iter()
        .find_map(|t| t.iter().position(|&n| n == name))
        .map_or(0, |i| i as u8)
}

/// Fills the common part of a v1–v3 descriptor `$out` from the emulator's `$d`: the header,
/// Coll and P2p (names through `$name`), ProxyOp and ProxyStep.
macro_rules! fill_legacy {
    ($out:expr, $d:expr, $hash:expr, $name:ident) => {{
        let (out, d) = ($out, $d);
        out.type_ = d.type_ as u8;
        out.parentObj = d.parentObj;
        out.rank = d.rank;
        let (from, to) = (&d.__bindgen_anon_1, &mut out.__bindgen_anon_1);
        match d.type_ {
            ty::COLL => {
                let (f, t) = (&from.coll, &mut to.coll);
                t.commHash = $hash;
                t.seqNumber = f.seqNumber;
                t.func = $name(f.func);
                t.sendBuff = f.sendBuff;
                t.recvBuff = f.recvBuff;
                t.count = f.count;
                t.root = f.root;
                t.datatype = $name(f.datatype);
                t.nMaxChannels = f.nChannels;
                t.nWarps = f.nWarps;
                t.algo = $name(f.algo);
                t.proto = $name(f.proto);
            }
            ty::P2P => {
                let (f, t) = (&from.p2p, &mut to.p2p);
                t.commHash = $hash;
                t.func = $name(f.func);
                t.buff = f.buff;
                t.datatype = $name(f.datatype);
                t.count = f.count;
                t.peer = f.peer;
            }
            ty::PROXY_OP => {
                let (f, t) = (&from.proxyOp, &mut to.proxyOp);
                (t.pid, t.channelId, t.peer) = (f.pid, f.channelId, f.peer);
                (t.nSteps, t.chunkSize, t.isSend) = (f.nSteps, f.chunkSize, f.isSend);
            }
            ty::PROXY_STEP => to.proxyStep.step = from.proxyStep.step,
            _ => {}
        }
    }};
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

/// The emulator's descriptor: NCCL 2.31.2's v7 layout, the richest; [`Plugin::start`] turns it
/// into the driven version's, as the emulated release or its adapter does.
pub type Descr = ncclProfilerEventDescr_v7_t;

/// The zero-initialised descriptor of an event type, as NCCL builds them.
pub fn descr(ty: u64, parent: H, rank: i32) -> Descr {
    // SAFETY: all-zero is a valid descriptor (integers and NULL pointers).
    let mut d: Descr = unsafe { std::mem::zeroed() };
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

/// The table `EMU_PROFILER_ABI` (`4` or `v4` … `7`) asks to drive instead of the release's
/// newest; panics on anything else (a test setting must not be silently ignored).
fn forced_version() -> Option<Version> {
    let s = std::env::var("EMU_PROFILER_ABI").ok()?;
    Some(Version::parse(&s).unwrap_or_else(|| panic!("EMU_PROFILER_ABI={s:?} is not a version like v7")))
}

/// Our pid as NCCL compares it for PXN.
pub fn pid() -> i32 {
    std::process::id() as i32
}

impl Plugin {
    fn new(table: Table, found: Vec<Version>, release: Release, lib: Option<libloading::Library>) -> Plugin {
        Plugin {
            table,
            found,
            release,
            mask: Box::new(AtomicI32::new(0)),
            hashes: Mutex::new(BTreeMap::new()),
            lib,
        }
    }

    /// The plugin linked into this binary, as the emulated release ([`release::current`]) finds
    /// it: its newest table that release knows, or the one `EMU_PROFILER_ABI` names (driven
    /// through the release's adapter when older).
    pub fn in_process() -> Plugin {
        use nccl_profiler_otel::ffi;
        let release = release::current();
        let found = release.lookup_order();
        let version = forced_version()
            .or(found.first().copied())
            .expect("every release looks up v1 at least");
        let table = match version {
            Version::V1 => Table::V1(ffi::ncclProfiler_v1.get()),
            Version::V2 => Table::V2(ffi::ncclProfiler_v2.get()),
            Version::V3 => Table::V3(ffi::ncclProfiler_v3.get()),
            Version::V4 => Table::V4(ffi::ncclProfiler_v4.get()),
            Version::V5 => Table::V5(ffi::ncclProfiler_v5.get()),
            Version::V6 => Table::V6(ffi::ncclProfiler_v6.get()),
            Version::V7 => Table::V7(&ffi::ncclProfiler_v7.get().table),
        };
        assert!(
            Self::native_or_v4(version, release),
            "NCCL {release} would never drive this plugin's {version}: set EMU_NCCL to the release that uses it natively"
        );
        Plugin::new(table, found, release, None)
    }

    /// v1–v3 are driven only by the releases that use them natively: a newer NCCL finds this
    /// plugin's newer tables first, so its v1–v3 adapters (spec 4.8) never run for it.
    fn native_or_v4(version: Version, release: Release) -> bool {
        !version.legacy() || version == release.newest_abi()
    }

    /// Loads a built plugin the way the emulated release does: `dlopen(path, RTLD_NOW |
    /// RTLD_LOCAL)`, then the data symbols `ncclProfiler_vN` it knows, newest first, and drives
    /// the first one found (or the one `EMU_PROFILER_ABI` names); [`LoadError::Unsupported`]
    /// when the emulator cannot drive it.
    pub fn load(path: &Path) -> Result<Plugin, LoadError> {
        match forced_version() {
            Some(v) => Self::open(path, &[v]),
            None => Self::open(path, &release::current().lookup_order()),
        }
    }

    /// Like [`Plugin::load`], but looks up `version` only (NCCL has no such switch; it tests one
    /// table of a plugin that exports several, through the release's adapter when older).
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
            // SAFETY: the symbol, when present, is a `ncclProfiler_vN_t` static that lives as
            // long as the library.
            unsafe { lib.get::<*const c_void>(v.symbol().to_bytes_with_nul()) }
                .ok()
                .map(|sym| *sym)
        };
        let found: Vec<Version> = versions.iter().copied().filter(|&v| lookup(v).is_some()).collect();
        let Some(&newest) = found.first() else {
            return Err(LoadError::NoSymbol {
                path: path.to_owned(),
                looked_up: versions.to_vec(),
            });
        };
        // SAFETY: the symbol of `newest` in a library kept open in `lib`.
        let table = lookup(newest).and_then(|p| unsafe { Table::from_raw(newest, p) });
        let Some(table) = table.filter(|_| Self::native_or_v4(newest, release::current())) else {
            return Err(LoadError::Unsupported {
                path: path.to_owned(),
                found,
            });
        };
        Ok(Plugin::new(table, found, release::current(), Some(lib.into())))
    }

    /// The versions found, newest first.
    pub fn found(&self) -> &[Version] {
        &self.found
    }

    /// The version the emulator drives.
    pub fn driving(&self) -> Version {
        self.table.version()
    }

    /// The NCCL release emulated.
    pub fn release(&self) -> Release {
        self.release
    }

    /// Whether the release calls the table directly (its newest known version), not through an
    /// adapter.
    pub fn native(&self) -> bool {
        self.driving() == self.release.newest_abi()
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
        unsafe { CStr::from_ptr(self.table.name()) }
            .to_string_lossy()
            .into_owned()
    }

    /// The address of the driven table (the same static while the library stays mapped).
    pub fn table_address(&self) -> usize {
        each_table!(self.table, t => ptr::from_ref(t) as usize)
    }

    /// The activation mask as NCCL would read it now.
    pub fn mask(&self) -> i32 {
        self.mask.load(Ordering::Relaxed)
    }

    /// `init` for a communicator with NCCL's arguments (in the driven version's order) and the
    /// emulator's logger; returns the comm and the activation mask as NCCL then reads it (after
    /// its adapter and its own rules, spec 4.8, 7.3.4, 7.4).
    pub fn init(&self, name: Option<&str>, hash: u64, n_nodes: i32, nranks: i32, rank: i32) -> (Comm, i32) {
        #[cfg(feature = "testing")]
        super::ports::refuse_default_endpoint(|name| std::env::var(name).ok());
        let name = name.map(|n| CString::new(n).expect("no NUL in a comm name"));
        let name_ptr = name.as_ref().map_or(ptr::null(), |n| n.as_ptr());
        let mut context: *mut c_void = 0xdead as *mut c_void;
        let mask = self.mask.as_ptr();
        let log = logger::logfn();
        count_call();
        // SAFETY: the arguments are what NCCL passes: the address of a context slot, of the
        // process-wide mask, a C string valid for the call, and a logger (or NULL).
        let rc = unsafe {
            match self.table {
                Table::V1(t) => (t.init.expect("init"))(&mut context, mask),
                Table::V2(t) => (t.init.expect("init"))(&mut context, mask),
                Table::V3(t) => (t.init.expect("init"))(&mut context, mask),
                Table::V4(t) => (t.init.expect("init"))(&mut context, mask, name_ptr, hash, n_nodes, nranks, rank, log),
                Table::V5(t) => (t.init.expect("init"))(&mut context, hash, mask, name_ptr, n_nodes, nranks, rank, log),
                Table::V6(t) => (t.init.expect("init"))(&mut context, hash, mask, name_ptr, n_nodes, nranks, rank, log),
                Table::V7(t) => (t.init.expect("init"))(&mut context, hash, mask, name_ptr, n_nodes, nranks, rank, log),
            }
        };
        assert_eq!(rc, ncclSuccess, "init must never fail");
        drop(name); // NCCL does not keep commName alive: the plugin must have copied it.
        // Only v1–v3 need it; other tables never take the lock (a test that forks while another
        // thread is in `init` must not leave its child a lock held forever).
        let (release, version) = (self.release, self.driving());
        if version.legacy() {
            self.hashes.lock().insert(context as usize, hash);
        }
        // The v5 adapter clears the copy-engine bits (2.29+) and KernelPhase (2.31); the v6
        // adapter of 2.31 clears KernelPhase; 2.31 then forces KernelCh under KernelPhase.
        let mut cleared = 0;
        if version == Version::V5 && release >= Release::V2_30_7 {
            cleared |= mask::CE;
        }
        if release >= Release::V2_31_2 && version < Version::V7 && version >= Version::V5 {
            cleared |= mask::KERNEL_PHASE;
        }
        let mut m = self.mask.fetch_and(!cleared, Ordering::Relaxed) & !cleared;
        if release >= Release::V2_31_2 && m & mask::KERNEL_PHASE != 0 && m & mask::KERNEL_CH == 0 {
            m = self.mask.fetch_or(mask::KERNEL_CH, Ordering::Relaxed) | mask::KERNEL_CH;
        }
        (
            Comm {
                context,
                hash,
                rank,
                nranks,
            },
            m,
        )
    }

    /// `startEvent` with `d` as the driven version receives it; returns the handle the plugin
    /// wrote (the slot is pre-filled with garbage to check that it is always written), or NULL
    /// when the release's adapter answers without calling the plugin.
    pub fn start(&self, context: *mut c_void, d: &mut Descr) -> H {
        let mut h: *mut c_void = 0xbad as *mut c_void;
        let slot: *mut *mut c_void = &mut h;
        count_call();
        // SAFETY: a handle slot and a descriptor of the table's version valid for the call, as
        // NCCL passes them.
        let rc = unsafe {
            match self.table {
                Table::V1(t) => match self.as_legacy(context, d, Version::V1) {
                    Some(mut v) => (t.startEvent.expect("startEvent"))(context, slot, (&raw mut v).cast()),
                    None => return H::NULL,
                },
                Table::V2(t) => match self.as_legacy(context, d, Version::V2) {
                    Some(mut v) => (t.startEvent.expect("startEvent"))(context, slot, (&raw mut v).cast()),
                    None => return H::NULL,
                },
                Table::V3(t) => match self.as_legacy(context, d, Version::V3) {
                    Some(mut v) => (t.startEvent.expect("startEvent"))(context, slot, (&raw mut v).cast()),
                    None => return H::NULL,
                },
                Table::V7(t) => (t.startEvent.expect("startEvent"))(context, slot, d),
                Table::V6(t) => match self.as_v6(d) {
                    Some(mut v6) => (t.startEvent.expect("startEvent"))(context, slot, &mut v6),
                    None => return H::NULL,
                },
                Table::V5(t) => match self.as_v6(d) {
                    Some(mut v6) => (t.startEvent.expect("startEvent"))(context, slot, (&raw mut v6).cast()),
                    None => return H::NULL,
                },
                Table::V4(t) => match self.as_v4(d) {
                    Some(mut v4) => (t.startEvent.expect("startEvent"))(context, slot, &mut v4),
                    None => return H::NULL,
                },
            }
        };
        assert_eq!(rc, ncclSuccess);
        assert_ne!(h, 0xbad as *mut c_void, "*eHandle must always be written");
        H(h)
    }

    /// `d` in the v5/v6 layout (the same bytes up to 112, without v7's tags), or `None` for
    /// what the adapter answers itself: KernelPhase (v5, v6 on 2.31) and the copy-engine events
    /// (v5 on 2.29+).
    fn as_v6(&self, d: &Descr) -> Option<ncclProfilerEventDescr_v6_t> {
        if d.type_ == ty::KERNEL_PHASE || (self.driving() == Version::V5 && d.type_ & mask::CE as u64 != 0) {
            return None;
        }
        let mut v6 = ncclProfilerEventDescr_v6_t::default();
        // SAFETY: both are plain-data C structs; every v6 field has the same offset in v7 (spec
        // 7.2.2), and the v6 struct is the shorter.
        unsafe {
            ptr::copy_nonoverlapping(
                ptr::from_ref(d).cast::<u8>(),
                (&raw mut v6).cast::<u8>(),
                std::mem::size_of_val(&v6),
            );
            // v7's tags inside the first 112 bytes: padding or other members in v6.
            let u = &mut v6.__bindgen_anon_1;
            match d.type_ {
                ty::COLL_API => ptr::write_bytes((&raw mut u.collApi).cast::<u8>().add(48), 0, 8),
                ty::P2P_API => ptr::write_bytes((&raw mut u.p2pApi).cast::<u8>().add(40), 0, 8),
                ty::P2P => ptr::write_bytes((&raw mut u.p2p).cast::<u8>().add(48), 0, 8),
                _ => {}
            }
        }
        Some(v6)
    }

    /// `d` as NCCL 2.23–2.26 build it for `version` (spec 2.8, 8): zeroed; Coll/P2p with the
    /// communicator's hash, a NULL `name` and `nMaxChannels`; v1 names as numeric codes; `None`
    /// for types the version does not have (KernelCh and NetPlugin before v3, everything newer).
    fn as_legacy(&self, context: *mut c_void, d: &Descr, version: Version) -> Option<LegacyDescr> {
        let newest = if version == Version::V3 {
            ty::NET_PLUGIN
        } else {
            ty::PROXY_CTRL
        };
        if d.type_ > newest {
            return None;
        }
        let hash = self.hashes.lock().get(&(context as usize)).copied().unwrap_or(0);
        // SAFETY: all-zero is a valid value of every member (integers and NULL pointers).
        let mut out: LegacyDescr = unsafe { std::mem::zeroed() };
        // SAFETY: writing the member of `version`, reading `d`'s member that matches `type`.
        unsafe {
            match version {
                Version::V1 => fill_legacy!(&mut out.v1, d, hash, code),
                Version::V2 => fill_legacy!(&mut out.v2, d, hash, same),
                _ => {
                    fill_legacy!(&mut out.v3, d, hash, same);
                    if d.type_ == ty::KERNEL_CH {
                        out.v3.__bindgen_anon_1.kernelCh.channelId = d.__bindgen_anon_1.kernelCh.channelId;
                    } else if d.type_ == ty::NET_PLUGIN {
                        let n = &mut out.v3.__bindgen_anon_1.netPlugin;
                        (n.id, n.data) = (d.__bindgen_anon_1.netPlugin.id, d.__bindgen_anon_1.netPlugin.data);
                    }
                }
            }
        }
        Some(out)
    }

    /// `d` in the v4 layout, or `None` for types v4 does not know (the adapter returns without
    /// calling the plugin, spec 4.8). Natively (2.27) the descriptor is zeroed and Coll/P2p hang
    /// under the Group handle already; through the adapter of 2.28+ it is not zeroed (garbage
    /// here), `p2p.nChannels` is not copied and `parentObj` is taken from `parentGroup`.
    fn as_v4(&self, d: &Descr) -> Option<ncclProfilerEventDescr_v4_t> {
        if d.type_ > ty::NET_PLUGIN {
            return None;
        }
        let adapter = !self.native();
        // SAFETY: any bit pattern is a valid descriptor value (integers and raw pointers).
        let mut v4: ncclProfilerEventDescr_v4_t =
            unsafe { std::mem::transmute([if adapter { 0xA5u8 } else { 0 }; 104]) };
        v4.type_ = d.type_ as u8;
        v4.rank = d.rank;
        v4.parentObj = d.parentObj;
        // SAFETY: reading the member that matches `type`, writing the same member.
        unsafe {
            let (from, to) = (&d.__bindgen_anon_1, &mut v4.__bindgen_anon_1);
            match d.type_ {
                ty::COLL => {
                    let (f, t) = (&from.coll, &mut to.coll);
                    if self.release.api_events() {
                        v4.parentObj = f.parentGroup;
                    }
                    t.seqNumber = f.seqNumber;
                    t.func = f.func;
                    t.sendBuff = f.sendBuff;
                    t.recvBuff = f.recvBuff;
                    t.count = f.count;
                    t.root = f.root;
                    t.datatype = f.datatype;
                    t.nChannels = f.nChannels;
                    t.nWarps = f.nWarps;
                    t.algo = f.algo;
                    t.proto = f.proto;
                }
                ty::P2P => {
                    let (f, t) = (&from.p2p, &mut to.p2p);
                    if self.release.api_events() {
                        v4.parentObj = f.parentGroup;
                    }
                    t.func = f.func;
                    t.buff = f.buff;
                    t.datatype = f.datatype;
                    t.count = f.count;
                    t.peer = f.peer;
                    if !adapter {
                        t.nChannels = f.nChannels;
                    }
                }
                ty::PROXY_OP => {
                    let (f, t) = (&from.proxyOp, &mut to.proxyOp);
                    (t.pid, t.channelId, t.peer) = (f.pid, f.channelId, f.peer);
                    (t.nSteps, t.chunkSize, t.isSend) = (f.nSteps, f.chunkSize, f.isSend);
                }
                ty::PROXY_STEP => to.proxyStep.step = from.proxyStep.step,
                ty::KERNEL_CH => {
                    to.kernelCh.channelId = from.kernelCh.channelId;
                    to.kernelCh.pTimer = from.kernelCh.pTimer;
                }
                ty::NET_PLUGIN => {
                    to.netPlugin.id = from.netPlugin.id;
                    to.netPlugin.data = from.netPlugin.data;
                }
                _ => {}
            }
        }
        Some(v4)
    }

    /// `stopEvent`.
    pub fn stop(&self, h: H) {
        count_call();
        let stop = each_table!(self.table, t => t.stopEvent);
        // SAFETY: any handle value is allowed; the plugin validates it.
        assert_eq!(unsafe { (stop.expect("stopEvent"))(h.0) }, ncclSuccess);
    }

    /// `recordEventState` with args whose first 8 bytes are `value`: `transSize`, `pTimer`,
    /// `netPlugin.data`, or (low 32 bits) `appendedProxyOps`. States the driven version does not
    /// know (KernelPhaseStop before v7) are dropped by the adapter.
    /// On v1–v3 (NCCL 2.23–2.26) states 19–22 do not exist and ProxyStep states carry no
    /// arguments (spec 8.2.2).
    pub fn state(&self, h: H, state: u32, value: u64) {
        if state == ty::KERNEL_PHASE_STOP && self.driving() < Version::V7 {
            return;
        }
        if self.driving().legacy() {
            match state {
                19..=22 => {}
                8..=12 => self.state_null(h, state),
                // ProxyCtrl: `appendedProxyOps` shares the first bytes with `transSize`.
                13..=18 => self.op_state(h, state, 0, value),
                _ => panic!("state {state} has no v1–v3 arguments here: use Plugin::op_state"),
            }
            return;
        }
        let mut args = ncclProfilerEventStateArgs_v5_t {
            kernelCh: ncclProfilerEventStateArgs_v5_t__bindgen_ty_4 { pTimer: value },
        };
        self.record(h, state, &mut args);
    }

    /// A ProxyOp state 0–7 of v1–v3 (spec 8.2.2) with its `steps` and running `transSize`.
    pub fn op_state(&self, h: H, state: u32, steps: i32, total: u64) {
        let mut args = ncclProfilerEventStateArgs_v1_t {
            proxyOp: ncclProfilerEventStateArgs_v1_t__bindgen_ty_1 {
                transSize: total as usize,
                steps,
            },
        };
        self.record(h, state, (&raw mut args).cast());
    }

    /// A GroupApi state (23, 24): NULL args when the table is called directly (2.28+ natively),
    /// an args union otherwise (the v5 adapter's is not even initialised: garbage here).
    pub fn group_api_state(&self, h: H, state: u32) {
        if self.native() {
            self.state_null(h, state);
        } else {
            // SAFETY: any bit pattern is a valid args union (integers and a raw pointer).
            let mut args: ncclProfilerEventStateArgs_v5_t = unsafe { std::mem::transmute([0xA5u8; 8]) };
            self.record(h, state, &mut args);
        }
    }

    /// `recordEventState` with NULL args.
    pub fn state_null(&self, h: H, state: u32) {
        self.record(h, state, ptr::null_mut());
    }

    fn record(&self, h: H, state: u32, args: *mut ncclProfilerEventStateArgs_v5_t) {
        count_call();
        // SAFETY: any handle value is allowed; `args` is NULL or valid for the call, and the v4
        // args union has the v5 one's layout (spec 2.9).
        let rc = unsafe {
            each_table!(self.table, t => (t.recordEventState.expect("recordEventState"))(h.0, state, args.cast()))
        };
        assert_eq!(rc, ncclSuccess);
    }

    /// `finalize`.
    pub fn finalize(&self, context: *mut c_void) {
        count_call();
        let finalize = each_table!(self.table, t => t.finalize);
        // SAFETY: any context value is allowed; the plugin validates it.
        assert_eq!(unsafe { (finalize.expect("finalize"))(context) }, ncclSuccess);
    }

    /// GroupApi start (2.28+: the first call of an outermost group, `depth` 1 for an implicit
    /// group, 2 inside `ncclGroupStart`; `captured` during a CUDA graph capture) and its
    /// GroupStartApiStop state.
    pub fn group_api(&self, c: &Comm, depth: i32, captured: bool) -> H {
        let mut d = descr(ty::GROUP_API, H::NULL, 0);
        d.__bindgen_anon_1.groupApi.groupDepth = depth;
        d.__bindgen_anon_1.groupApi.graphCaptured = captured;
        let h = self.start(c.context, &mut d);
        if !h.is_null() {
            self.group_api_state(h, ty::GROUP_START_API_STOP);
        }
        h
    }

    /// A CollApi (`ty::COLL_API`) or P2pApi event of one API call under the GroupApi `parent`,
    /// with the call's tag (2.31) and whether its stream is being captured: started and stopped
    /// within the call (2.28+); returns its (stopped) handle, the parent of the call's Coll/P2p.
    #[allow(clippy::too_many_arguments)]
    pub fn api_call(
        &self,
        c: &Comm,
        ty: u64,
        parent: H,
        func: *const c_char,
        count: usize,
        dtype: *const c_char,
        (tag, captured): (u64, bool),
    ) -> H {
        let mut d = descr(ty, parent, 0);
        // SAFETY: writing the union member that matches `type`.
        unsafe {
            if ty == self::ty::COLL_API {
                let a = &mut d.__bindgen_anon_1.collApi;
                (a.func, a.count, a.datatype, a.userTag) = (func, count, dtype, tag);
                a.graphCaptured = captured;
            } else {
                let a = &mut d.__bindgen_anon_1.p2pApi;
                (a.func, a.count, a.datatype, a.userTag) = (func, count, dtype, tag);
                a.graphCaptured = captured;
            }
        }
        let h = self.start(c.context, &mut d);
        if !h.is_null() {
            self.stop(h);
        }
        h
    }

    /// A copy-engine collective as its launch makes it (spec 3.11): CeColl start under the
    /// CollApi `parent`, its syncs and batches (when their bits are on), CeColl stop.
    #[allow(clippy::too_many_arguments)]
    pub fn ce_coll(
        &self,
        c: &Comm,
        parent: H,
        func: *const c_char,
        count: u64,
        dtype: *const c_char,
        seq: u64,
        tag: u64,
    ) {
        let mut d = descr(ty::CE_COLL, parent, c.rank);
        // SAFETY: writing the union member that matches `type`.
        let k = unsafe { &mut d.__bindgen_anon_1.ceColl };
        (k.seqNumber, k.func, k.count, k.datatype) = (seq, func, count as usize, dtype);
        (k.syncStrategy, k.ceSeqNum, k.userTag) = (cstr("UC"), seq as u32, tag);
        let h = self.start(c.context, &mut d);
        let m = self.mask();
        if !h.is_null() {
            for (ty, bit) in [(ty::CE_SYNC, mask::CE_COLL << 1), (ty::CE_BATCH, mask::CE_COLL << 2)] {
                if m & bit != 0 {
                    let s = self.start(c.context, &mut descr(ty, h, c.rank));
                    if !s.is_null() {
                        self.stop(s);
                    }
                }
            }
            self.stop(h);
        }
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

    /// KernelPhase start (v7): phase `phase` of the kernel channel `parent` from `gpu_start`.
    pub fn kernel_phase(&self, context: *mut c_void, parent: H, channel: u8, phase: u8, gpu_start: u64) -> H {
        const NAMES: [&str; 3] = ["initial_sync", "compute", "final_sync"];
        let mut d = descr(ty::KERNEL_PHASE, parent, 0);
        // SAFETY: writing the union member that matches `type`.
        let p = unsafe { &mut d.__bindgen_anon_1.kernelPhase };
        (p.channelId, p.phaseId, p.pTimer) = (channel, phase, gpu_start);
        p.phaseName = NAMES.get(usize::from(phase)).map_or(ptr::null(), |n| cstr(n));
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

/// A Coll descriptor under the Group handle `parent` (`parentGroup`; also `parentObj`, as before
/// NCCL 2.28; from 2.28 the caller sets `parentObj` to the CollApi handle).
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
) -> Descr {
    let mut d = descr(ty::COLL, parent, rank);
    // SAFETY: writing the union member that matches `type`.
    unsafe {
        let k = &mut d.__bindgen_anon_1.coll;
        k.parentGroup = parent.0;
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

/// A P2p descriptor under the Group handle `parent` (as [`coll_descr`]).
pub fn p2p_descr(
    rank: i32,
    parent: H,
    func: *const c_char,
    dtype: *const c_char,
    count: usize,
    peer: i32,
    n_channels: u8,
) -> Descr {
    let mut d = descr(ty::P2P, parent, rank);
    // SAFETY: writing the union member that matches `type`.
    unsafe {
        let p = &mut d.__bindgen_anon_1.p2p;
        p.parentGroup = parent.0;
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
) -> Descr {
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
pub fn net_plugin_descr(parent: H, rank: i32, id: i64, data: *mut c_void) -> Descr {
    let mut d = descr(ty::NET_PLUGIN, parent, rank);
    // SAFETY: writing the union member that matches `type`.
    unsafe {
        let n = &mut d.__bindgen_anon_1.netPlugin;
        n.id = id;
        n.data = data;
    }
    d
}

//! Arbitrary NCCL callback streams decoded from bytes and run through the real exported
//! `ncclProfiler_v1` … `ncclProfiler_v7` table (one per run, as NCCL uses one per process), with
//! every robustness invariant of docs/reliability.md checked on the way and an exact account
//! kept of what happened to each callback.
//!
//! Shared by the property-test fuzzer (`tests/fuzz_callbacks.rs`: several threads run their own
//! byte strings at once, the telemetry thread runs) and the libFuzzer target
//! (`tests/fuzz/fuzz_targets/callbacks.rs`: one thread, telemetry thread off, the consumer driven
//! by `Poll` ops). Both include this file with `#[path]`.
//!
//! Per callback: it returns `ncclSuccess`; `*eHandle` / `*context` is always written (pre-filled
//! with a sentinel that is never a valid value); a non-NULL handle decodes to the requested kind on
//! a live communicator.
//!
//! Account (checked by [`Run::balance`] once every thread finished and every communicator was
//! finalized): each callback has exactly one outcome, and
//!
//! ```text
//! callbacks = records delivered in summaries (sinks and polls)
//!           + STATS deltas (null_args, stale, unknown_types, unknown_states, declined (Group
//!                           handles included), foreign_unmatched, panics)
//!           + communicator drops (full, late, unpublished, shed), read before each finalize
//!           + operations counted without a record (shed: a record-less handle) and their
//!             ops and kernel channels
//!           + silently ignored calls (Group stops; states NCCL defines for the event's type
//!             that the plugin does not use; a repeated SendPeerWait of a step, or on v1–v3
//!             SendRemFifoWait of an op's transfer, which the calling
//!             thread already recorded)
//!           + successful inits + successful finalizes
//!           − the records starts add (InProgress at v1–v3 receive ops, NCCL has no such state
//!             there; Claim at a Coll/P2p under a recorded API call)
//! ```
//!
//! The last three terms have no counter in the plugin: the runner tallies them from the handle
//! and from the state value. Drop counters are per communicator
//! slot and reset when the slot is reused, so they are read under the entry's write lock just
//! before `finalize`.
//!
//! Locking (test side only, it never serialises the plugin against itself): every communicator
//! the test created ("entry") has an `RwLock`. A callback holds read locks on the entries the plugin
//! may touch for it (the context's entry and every entry sharing its hash, the parent's or
//! handle's entry); `init` and `finalize` of an entry hold its write lock. This mirrors NCCL
//! (spec 4.5: a communicator's proxy thread is joined before its `finalize`) and makes the drop
//! counts exact. Everything else runs concurrently: callbacks of different communicators, `init`
//! of one while another's events flow, stale handles of finalized or recycled communicators, the
//! telemetry thread's polls. Test-side locks are `parking_lot`'s: std's lock and `Once` slow
//! paths are not instrumented for ThreadSanitizer (std is precompiled), parking_lot is.
#![allow(dead_code, clippy::undocumented_unsafe_blocks)]

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use nccl_profiler_otel::aggregate::WindowSummary;
use nccl_profiler_otel::bindings::{
    ncclDebugLogger_t, ncclProfilerEventDescr_v1_t, ncclProfilerEventDescr_v2_t, ncclProfilerEventDescr_v3_t,
    ncclProfilerEventDescr_v4_t, ncclProfilerEventDescr_v7_t, ncclProfilerEventStateArgs_v1_t,
    ncclProfilerEventStateArgs_v1_t__bindgen_ty_1, ncclProfilerEventStateArgs_v4_t,
    ncclProfilerEventStateArgs_v4_t__bindgen_ty_4, ncclResult_t, ncclSuccess,
};
use nccl_profiler_otel::comm;
use nccl_profiler_otel::config::Config;
use nccl_profiler_otel::ffi::{
    ncclProfiler_v1, ncclProfiler_v2, ncclProfiler_v3, ncclProfiler_v4, ncclProfiler_v5, ncclProfiler_v6,
    ncclProfiler_v7,
};
use nccl_profiler_otel::record::handle::{CommId, Context, GEN_MASK, Handle, Kind, MAX_SLOTS};
use nccl_profiler_otel::stats::STATS;
use nccl_profiler_otel::telemetry::consumer::{self, SETTLE};
use nccl_profiler_otel::telemetry::{self, Sink};
use parking_lot::{Mutex, RwLock, RwLockReadGuard};

/// Never a valid handle (bit 63 clear) or context (generation bits 0): shows whether the plugin
/// wrote the slot.
const SENTINEL: u64 = 0xBAD0_BAD0;
/// Communicator hashes; entries `i` and `i + 3` share one (one process driving several GPUs has
/// several communicators with the same hash), so PXN matching has a choice to make.
const HASHES: [u64; 3] = [0x0123_4567_89ab_cdef, 0x0fed_cba9_8765_4321, 0x1357_9bdf_0246_8ace];
/// A hash no entry uses (low 38 bits differ from all of `HASHES`).
const UNUSED_HASH: u64 = 0x2222_2222_2222_2222;
/// First communicator slot used for foreign contexts: far above any slot these tests occupy.
const FOREIGN_SLOT: u16 = 4000;
/// Pool of handles the plugin returned, shared by all threads of a run.
const POOL: usize = 256;

// ---------------------------------------------------------------------------------------------
// Records delivered to sinks (finalize, telemetry thread)

static DELIVERED: AtomicU64 = AtomicU64::new(0);

struct CountingSink;

impl Sink for CountingSink {
    fn window(&self, summary: &WindowSummary) {
        DELIVERED.fetch_add(summary.stats.records, Relaxed);
    }
}

/// Registers the counting sink once per process.
pub fn install_sink() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| telemetry::add_sink(Arc::new(CountingSink)));
}

// ---------------------------------------------------------------------------------------------
// Counters

/// The plugin's process-wide counters that take one callback each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub null_args: u64,
    pub stale: u64,
    pub unknown_types: u64,
    pub unknown_states: u64,
    pub declined: u64,
    pub foreign_unmatched: u64,
    pub panics: u64,
}

impl Counters {
    pub fn now() -> Counters {
        Counters {
            null_args: STATS.null_args.get(),
            stale: STATS.stale.get(),
            unknown_types: STATS.unknown_types.get(),
            unknown_states: STATS.unknown_states.get(),
            declined: STATS.declined.get(),
            foreign_unmatched: STATS.foreign_unmatched.get(),
            panics: STATS.panics.get(),
        }
    }

    fn since(self, base: Counters) -> Counters {
        Counters {
            null_args: self.null_args - base.null_args,
            stale: self.stale - base.stale,
            unknown_types: self.unknown_types - base.unknown_types,
            unknown_states: self.unknown_states - base.unknown_states,
            declined: self.declined - base.declined,
            foreign_unmatched: self.foreign_unmatched - base.foreign_unmatched,
            panics: self.panics - base.panics,
        }
    }

    fn sum(self) -> u64 {
        self.null_args
            + self.stale
            + self.unknown_types
            + self.unknown_states
            + self.declined
            + self.foreign_unmatched
            + self.panics
    }
}

/// What the runner tallied itself.
#[derive(Default)]
struct Tally {
    callbacks: AtomicU64,
    polled_records: AtomicU64,
    drops: AtomicU64,
    group_handles: AtomicU64,
    silent: AtomicU64,
    inits: AtomicU64,
    finalizes: AtomicU64,
    recorded_starts: AtomicU64,
    /// Records the plugin adds to a start: InProgress at v1–v3 receive-op starts, Claim at a
    /// Coll/P2p under a recorded API call.
    added: AtomicU64,
}

/// The account of a finished run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Balance {
    /// Callbacks made.
    pub callbacks: u64,
    /// Sum of all outcomes; equals `callbacks` when every callback is accounted for.
    pub accounted: u64,
    pub delivered_records: u64,
    pub polled_records: u64,
    pub counters: Counters,
    pub drops: u64,
    pub group_handles: u64,
    pub silent: u64,
    pub inits: u64,
    pub finalizes: u64,
    /// Starts that returned a record's handle (not Group).
    pub recorded_starts: u64,
    /// Records the plugin added without a callback of their own (v1–v3 receive-op starts).
    pub added: u64,
}

// ---------------------------------------------------------------------------------------------
// Input decoding

/// Bytes consumed front to back; reads past the end give zeros.
pub struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Input { data, pos: 0 }
    }

    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }

    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | u64::from(self.u32()) << 32
    }
}

/// splitmix64: garbage for the descriptor bytes NCCL's v4 adapter leaves uninitialised.
struct Garbage(u64);

impl Garbage {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// A value that is never one of ours: not a handle (bit 63 clear, or no valid kind) nor a context
/// (no valid generation, or bit 62 or 63 set).
fn invalid_value(input: &mut Input<'_>) -> u64 {
    let v = input.u64() & !(1 << 63);
    match input.u8() % 5 {
        0 => v & 0xFFFF_FFFF,                  // small integer: generation bits are 0
        1 => v | 1 << 62,                      // bit 62 without bit 63
        2 => v & !(u64::from(GEN_MASK) << 38), // generation cleared
        3 => u64::MAX,                         // all ones: kind 15
        _ => 1,                                // tiny non-NULL
    }
}

/// How an op names a context.
#[derive(Clone, Copy, Debug)]
enum CtxSel {
    /// The entry's live context (its last one, stale, if it is not live; NULL if never inited).
    Live(usize),
    Null,
    /// A context the entry had before (stale).
    Stale(usize),
    /// Never ours.
    Invalid(u64),
    /// Another process's context for the same communicator (same hash, other slot/generation).
    Foreign(usize, u16, u16),
    /// Another process's context for a communicator we do not have.
    ForeignUnknown(u16, u16),
}

fn ctx_sel(input: &mut Input<'_>, entries: usize) -> CtxSel {
    let b = input.u8();
    let e = usize::from(b >> 4) % entries;
    match b & 15 {
        0..=9 => CtxSel::Live(e),
        10 => CtxSel::Null,
        11 => CtxSel::Stale(e),
        12 => CtxSel::Invalid(invalid_value(input)),
        13 | 14 => CtxSel::Foreign(e, input.u16(), input.u16()),
        _ => CtxSel::ForeignUnknown(input.u16(), input.u16()),
    }
}

fn foreign_context(slot: u16, generation: u16, hash: u64) -> u64 {
    let generation = (u32::from(generation) % GEN_MASK + 1) as u16;
    Context::new(
        CommId {
            slot: FOREIGN_SLOT + slot % (4096 - FOREIGN_SLOT),
            generation,
        },
        hash,
    )
    .encode()
}

/// How an op names a handle (event handle or parent).
#[derive(Clone, Copy, Debug)]
enum HdSel {
    Null,
    /// Any handle from the pool.
    Pool(u16),
    /// A pool handle of the kind that makes sense here (a ProxyOp for a ProxyStep's parent...).
    Natural(u16),
    /// The newest pool handle of that kind.
    Newest,
    /// A pool handle with its event bits (slot, kind, epoch, window) scrambled.
    Forged(u16, u64),
    /// Never ours.
    Invalid(u64),
}

fn hd_sel(input: &mut Input<'_>) -> HdSel {
    let b = input.u8();
    let i = u16::from(b >> 3);
    match b & 7 {
        0 => HdSel::Null,
        1 => HdSel::Pool(i),
        2 | 3 => HdSel::Natural(i),
        4 | 5 => HdSel::Newest,
        6 => HdSel::Forged(i, input.u64()),
        _ => HdSel::Invalid(invalid_value(input)),
    }
}

/// One handle the plugin returned, and which entry it belongs to.
#[derive(Clone, Copy, Debug)]
struct Pooled {
    value: u64,
    entry: usize,
    kind: Kind,
}

/// C strings as NCCL passes them in descriptors: NULL, the names NCCL uses, unknown ones, empty,
/// non-UTF-8, and one longer than the 64 bytes the plugin reads at most.
fn c_string(b: u8) -> *const c_char {
    const NAMES: [&CStr; 22] = [
        c"AllReduce",
        c"AllGather",
        c"ReduceScatter",
        c"Broadcast",
        c"Reduce",
        c"Send",
        c"Recv",
        c"SendRecv",
        c"RING",
        c"TREE",
        c"NVLS",
        c"PAT",
        c"SIMPLE",
        c"LL",
        c"LL128",
        c"ncclFloat32",
        c"ncclInt8",
        c"ncclBfloat16",
        c"Unknown",
        c"",
        c"\xff\xfe\x80garbage",
        c"ncclFloat32 ",
    ];
    static LONG: OnceLock<CString> = OnceLock::new();
    match usize::from(b) % (NAMES.len() + 2) {
        i if i < NAMES.len() => NAMES[i].as_ptr(),
        i if i == NAMES.len() => LONG
            .get_or_init(|| CString::new("AllReduce".repeat(40)).unwrap_or_default())
            .as_ptr(),
        _ => std::ptr::null(),
    }
}

// Event type bits and states (spec 2.2, 2.3).
const GROUP: u8 = 0x1;
const COLL: u8 = 0x2;
const P2P: u8 = 0x4;
const PROXY_OP: u8 = 0x8;
const PROXY_STEP: u8 = 0x10;
const PROXY_CTRL: u8 = 0x20;
const KERNEL_CH: u8 = 0x40;
const NET_PLUGIN: u8 = 0x80;
/// Types of the v5+ tables only (a v4 descriptor's `type` is a `u8`).
const COLL_API: u64 = 0x200;
const P2P_API: u64 = 0x400;
const CE_COLL: u64 = 0x1000;
const KERNEL_PHASE: u64 = 0x8000;
const KERNEL_PHASE_STOP: u32 = 31;
/// Mask bits the plugin adds to the configured mask by ABI version (CeColl, KernelPhase).
const IMPLIED: c_int = 0x1000 | 0x8000;
const SEND_GPU_WAIT: u32 = 8;
const SEND_WAIT: u32 = 9;
const SEND_PEER_WAIT: u32 = 20;
const OP_IN_PROGRESS: u32 = 19;
const KERNEL_CH_STOP: u32 = 22;

/// Whether the plugin ignores `state` for an event of `kind` without counting it: the states NCCL
/// defines for that type that the plugin has no use for (send ProxyStep 8, 10–12; receive
/// ProxyStep 10, 11; send ProxyOp 0–7, 19; receive ProxyOp 0–7).
fn silently_ignored_state(kind: Kind, state: u32) -> bool {
    matches!(
        (kind, state),
        (Kind::ProxyStep, 8 | 10..=12)
            | (Kind::RecvStep, 10 | 11)
            | (Kind::ProxyOp, 0..=7 | 19)
            | (Kind::RecvOp, 0..=7)
    )
}

thread_local! {
    /// The plugin's per-thread memory of recorded SendPeerWaits (direct-mapped by slot), mirrored.
    static PEER_WAITED: [std::cell::Cell<u64>; 64] = const { [const { std::cell::Cell::new(0) }; 64] };
}

/// Whether a SendPeerWait of step `h` on this thread repeats one the plugin recorded (it then
/// ignores it), as the plugin decides it.
fn repeated_peer_wait(h: Handle) -> bool {
    let id = h.encode();
    PEER_WAITED.with(|seen| seen[h.slot() as usize % 64].replace(id) == id)
}

thread_local! {
    /// The plugin's per-thread memory of recorded SendRemFifoWaits (v1–v3), mirrored.
    static FIFO_WAITED: [std::cell::Cell<(u64, i32)>; 16] = const { [const { std::cell::Cell::new((0, 0)) }; 16] };
}

/// Whether a v1–v3 send op's state with args (`steps`) of op `h` is silently ignored: all but
/// SendTransmitted, SendDone, (v2, v3) the op's first SendPosted and the first SendRemFifoWait of
/// a transfer on this thread become records (spec 8.7).
fn legacy_op_state_ignored(abi: Abi, h: Handle, state: u32, steps: i32) -> bool {
    match state {
        2 | 3 => false,
        0 => abi == Abi::V1 || steps != 1,
        1 => {
            let key = (h.encode(), steps);
            FIFO_WAITED.with(|seen| seen[h.slot() as usize % 16].replace(key) == key)
        }
        _ => true,
    }
}

/// The kind of a natural parent for a start of type `ty` (v4: Coll/P2p hang under the Group).
fn natural_parent(ty: u64) -> Option<Kind> {
    if ty == KERNEL_PHASE {
        return Some(Kind::KernelCh);
    }
    match u8::try_from(ty).ok()? {
        COLL | P2P => Some(Kind::Group),
        PROXY_OP | KERNEL_CH => Some(Kind::Coll),
        PROXY_STEP => Some(Kind::ProxyOp),
        _ => None,
    }
}

/// The kind of handle a state value is meant for.
fn natural_target(state: u32) -> Option<Kind> {
    match state {
        8..=12 | 20 => Some(Kind::ProxyStep),
        0..=7 | 19 => Some(Kind::ProxyOp),
        22 => Some(Kind::KernelCh),
        KERNEL_PHASE_STOP => Some(Kind::KernelPhase),
        _ => None,
    }
}

fn kind_of(ty: u64) -> Option<Kind> {
    match ty {
        // A CollApi is a Coll when it is a Broadcast on NCCL's AllGatherV path, else an Api.
        COLL_API | CE_COLL => return Some(Kind::Coll),
        P2P_API => return Some(Kind::Api),
        KERNEL_PHASE => return Some(Kind::KernelPhase),
        _ => {}
    }
    Some(match u8::try_from(ty).ok()? {
        GROUP => Kind::Group,
        COLL => Kind::Coll,
        P2P => Kind::P2p,
        PROXY_OP => Kind::ProxyOp,
        PROXY_STEP => Kind::ProxyStep,
        KERNEL_CH => Kind::KernelCh,
        _ => return None,
    })
}

// ---------------------------------------------------------------------------------------------
// The table

/// Which exported table a run drives: NCCL uses one per process, the newest it knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Abi {
    V1,
    V2,
    V3,
    V4,
    V5,
    V6,
    V7,
}

impl Abi {
    /// The table a byte picks.
    pub fn pick(byte: u8) -> Abi {
        // v4 first: byte 0 keeps the table the fixed streams were written for.
        const ALL: [Abi; 7] = [Abi::V4, Abi::V5, Abi::V6, Abi::V7, Abi::V1, Abi::V2, Abi::V3];
        ALL[usize::from(byte % 7)]
    }

    /// v1–v3: no identity at `init`, bytes in ProxyOp states.
    fn legacy(self) -> bool {
        self <= Abi::V3
    }
}

/// A v1, v2 or v3 descriptor.
#[repr(C)]
union LegacyDescr {
    v1: ncclProfilerEventDescr_v1_t,
    v2: ncclProfilerEventDescr_v2_t,
    v3: ncclProfilerEventDescr_v3_t,
}

/// Copies the fields NCCL 2.23–2.26 fill from a v4 descriptor into a v1–v3 one of garbage:
/// header, Coll/P2p (names as v1 codes from the pointer's low bits, or as strings), ProxyOp,
/// ProxyStep; `$hash` as the communicator hash.
macro_rules! legacy_fields {
    ($out:expr, $d:expr, $hash:expr, $name:expr) => {{
        let (out, d) = ($out, $d);
        out.type_ = d.type_;
        out.parentObj = d.parentObj;
        out.rank = d.rank;
        let (from, to) = (&d.__bindgen_anon_1, &mut out.__bindgen_anon_1);
        match d.type_ {
            COLL => {
                let (f, t) = (&from.coll, &mut to.coll);
                (t.commHash, t.seqNumber, t.count) = ($hash, f.seqNumber, f.count);
                (t.func, t.algo, t.proto, t.datatype) =
                    ($name(f.func), $name(f.algo), $name(f.proto), $name(f.datatype));
                t.nMaxChannels = f.nChannels;
            }
            P2P => {
                let (f, t) = (&from.p2p, &mut to.p2p);
                (t.commHash, t.count, t.peer) = ($hash, f.count, f.peer);
                (t.func, t.datatype) = ($name(f.func), $name(f.datatype));
            }
            PROXY_OP => {
                let (f, t) = (&from.proxyOp, &mut to.proxyOp);
                (t.pid, t.channelId, t.peer, t.nSteps, t.chunkSize, t.isSend) =
                    (f.pid, f.channelId, f.peer, f.nSteps, f.chunkSize, f.isSend);
            }
            PROXY_STEP => to.proxyStep.step = from.proxyStep.step,
            _ => {}
        }
    }};
}

/// A v4 descriptor in the layout of the v1–v3 table `abi` (garbage elsewhere).
fn in_legacy(d: &ncclProfilerEventDescr_v4_t, abi: Abi, seed: u64) -> LegacyDescr {
    // SAFETY: any byte pattern is a valid descriptor value (integers and raw pointers).
    let mut out: LegacyDescr = unsafe { std::mem::zeroed() };
    fill_garbage(&mut out, seed);
    let code = |p: *const c_char| (p as usize % 13) as u8;
    let same = |p: *const c_char| p;
    // SAFETY: writing the member of `abi`, reading `d`'s member that matches its type.
    unsafe {
        match abi {
            Abi::V1 => legacy_fields!(&mut out.v1, d, seed, code),
            Abi::V2 => legacy_fields!(&mut out.v2, d, seed, same),
            _ => {
                legacy_fields!(&mut out.v3, d, seed, same);
                if d.type_ == KERNEL_CH {
                    out.v3.__bindgen_anon_1.kernelCh.channelId = d.__bindgen_anon_1.kernelCh.channelId;
                }
            }
        }
    }
    out
}

/// A v4 descriptor in the layout of `abi`'s table: as is for v4; otherwise copied into a v7-sized
/// garbage buffer (v5/v6 read its first 112 bytes) with the same header and union bytes (every
/// v4 member keeps its offset up to v7), `type` widened to `ty`.
fn in_layout(d: &ncclProfilerEventDescr_v4_t, ty: u64, seed: u64) -> ncclProfilerEventDescr_v7_t {
    // SAFETY: any byte pattern is a valid descriptor value (integers and raw pointers).
    let mut wide: ncclProfilerEventDescr_v7_t = unsafe { std::mem::zeroed() };
    fill_garbage(&mut wide, seed);
    wide.type_ = ty;
    wide.parentObj = d.parentObj;
    wide.rank = d.rank;
    // SAFETY: both unions start at offset 24; the v4 union (80 bytes) fits in the v7 one (112).
    unsafe {
        std::ptr::copy_nonoverlapping(
            (&raw const d.__bindgen_anon_1).cast::<u8>(),
            (&raw mut wide.__bindgen_anon_1).cast::<u8>(),
            std::mem::size_of_val(&d.__bindgen_anon_1),
        );
    }
    wide
}

impl Abi {
    /// `startEvent` of the table; `descr` points to a descriptor in its layout, or is NULL.
    unsafe fn start(self, context: *mut c_void, handle: *mut *mut c_void, descr: *mut c_void) -> ncclResult_t {
        // SAFETY: the caller's arguments, as NCCL passes them to this table.
        unsafe {
            match self {
                Abi::V1 => (ncclProfiler_v1.get().startEvent.expect("startEvent"))(context, handle, descr.cast()),
                Abi::V2 => (ncclProfiler_v2.get().startEvent.expect("startEvent"))(context, handle, descr.cast()),
                Abi::V3 => (ncclProfiler_v3.get().startEvent.expect("startEvent"))(context, handle, descr.cast()),
                Abi::V4 => (ncclProfiler_v4.get().startEvent.expect("startEvent"))(context, handle, descr.cast()),
                Abi::V5 => (ncclProfiler_v5.get().startEvent.expect("startEvent"))(context, handle, descr.cast()),
                Abi::V6 => (ncclProfiler_v6.get().startEvent.expect("startEvent"))(context, handle, descr.cast()),
                Abi::V7 => (ncclProfiler_v7.get().table.startEvent.expect("startEvent"))(context, handle, descr.cast()),
            }
        }
    }

    /// `recordEventState` of the table; `args` points to the version's args union (v1–v3: 16
    /// bytes; v5 = v6 = v7 have the v4 one's layout, spec 2.9).
    unsafe fn state(self, handle: *mut c_void, state: u32, args: *mut c_void) -> ncclResult_t {
        // SAFETY: the caller's arguments, as NCCL passes them to this table.
        unsafe {
            match self {
                Abi::V1 => (ncclProfiler_v1.get().recordEventState.expect("state"))(handle, state, args.cast()),
                Abi::V2 => (ncclProfiler_v2.get().recordEventState.expect("state"))(handle, state, args.cast()),
                Abi::V3 => (ncclProfiler_v3.get().recordEventState.expect("state"))(handle, state, args.cast()),
                Abi::V4 => (ncclProfiler_v4.get().recordEventState.expect("state"))(handle, state, args.cast()),
                Abi::V5 => (ncclProfiler_v5.get().recordEventState.expect("state"))(handle, state, args.cast()),
                Abi::V6 => (ncclProfiler_v6.get().recordEventState.expect("state"))(handle, state, args.cast()),
                Abi::V7 => (ncclProfiler_v7.get().table.recordEventState.expect("state"))(handle, state, args.cast()),
            }
        }
    }

    /// `stopEvent` of the table.
    fn stop(self) -> unsafe extern "C" fn(*mut c_void) -> ncclResult_t {
        match self {
            Abi::V1 => ncclProfiler_v1.get().stopEvent,
            Abi::V2 => ncclProfiler_v2.get().stopEvent,
            Abi::V3 => ncclProfiler_v3.get().stopEvent,
            Abi::V4 => ncclProfiler_v4.get().stopEvent,
            Abi::V5 => ncclProfiler_v5.get().stopEvent,
            Abi::V6 => ncclProfiler_v6.get().stopEvent,
            Abi::V7 => ncclProfiler_v7.get().table.stopEvent,
        }
        .expect("stopEvent")
    }

    /// `finalize` of the table.
    fn finalize(self) -> unsafe extern "C" fn(*mut c_void) -> ncclResult_t {
        match self {
            Abi::V1 => ncclProfiler_v1.get().finalize,
            Abi::V2 => ncclProfiler_v2.get().finalize,
            Abi::V3 => ncclProfiler_v3.get().finalize,
            Abi::V4 => ncclProfiler_v4.get().finalize,
            Abi::V5 => ncclProfiler_v5.get().finalize,
            Abi::V6 => ncclProfiler_v6.get().finalize,
            Abi::V7 => ncclProfiler_v7.get().table.finalize,
        }
        .expect("finalize")
    }

    /// `init` with the version's argument order.
    #[allow(clippy::too_many_arguments)]
    unsafe fn init(
        self,
        context: *mut *mut c_void,
        mask: *mut c_int,
        name: *const c_char,
        hash: u64,
        n_nodes: c_int,
        nranks: c_int,
        rank: c_int,
        logfn: ncclDebugLogger_t,
    ) -> ncclResult_t {
        // SAFETY: the caller's arguments, as NCCL passes them, in the version's order.
        unsafe {
            match self {
                Abi::V1 => (ncclProfiler_v1.get().init.expect("init"))(context, mask),
                Abi::V2 => (ncclProfiler_v2.get().init.expect("init"))(context, mask),
                Abi::V3 => (ncclProfiler_v3.get().init.expect("init"))(context, mask),
                Abi::V4 => {
                    (ncclProfiler_v4.get().init.expect("init"))(context, mask, name, hash, n_nodes, nranks, rank, logfn)
                }
                Abi::V5 => {
                    (ncclProfiler_v5.get().init.expect("init"))(context, hash, mask, name, n_nodes, nranks, rank, logfn)
                }
                Abi::V6 => {
                    (ncclProfiler_v6.get().init.expect("init"))(context, hash, mask, name, n_nodes, nranks, rank, logfn)
                }
                Abi::V7 => (ncclProfiler_v7.get().table.init.expect("init"))(
                    context, hash, mask, name, n_nodes, nranks, rank, logfn,
                ),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The run

/// What the test knows about one communicator it created.
#[derive(Default)]
struct EntryState {
    /// Context of the live communicator.
    live: Option<u64>,
    /// Contexts it had before (most recent last).
    old: Vec<u64>,
}

struct Entry {
    hash: u64,
    state: RwLock<EntryState>,
}

/// One fuzz run: a few communicator entries, a pool of returned handles, the tally.
pub struct Run {
    abi: Abi,
    entries: Vec<Entry>,
    pool: Mutex<Vec<Pooled>>,
    tally: Tally,
    base: Counters,
    delivered0: u64,
    seed: AtomicU64,
}

/// Read guards of the locked entries, by entry index.
type Guards<'a> = Vec<(usize, RwLockReadGuard<'a, EntryState>)>;

impl Run {
    /// A run with `entries` communicator entries (at most this many are live at once), through
    /// the table of `abi`.
    pub fn new(entries: usize, abi: Abi) -> Run {
        install_sink();
        Run {
            abi,
            entries: (0..entries.max(1))
                .map(|i| Entry {
                    hash: HASHES[i % HASHES.len()],
                    state: RwLock::default(),
                })
                .collect(),
            pool: Mutex::new(Vec::with_capacity(POOL)),
            tally: Tally::default(),
            base: Counters::now(),
            delivered0: DELIVERED.load(Relaxed),
            seed: AtomicU64::new(0x5EED),
        }
    }

    /// Callbacks made so far.
    pub fn callbacks(&self) -> u64 {
        self.tally.callbacks.load(Relaxed)
    }

    /// Decodes `bytes` into ops and runs them on the calling thread.
    pub fn execute(&self, bytes: &[u8]) {
        let mut input = Input::new(bytes);
        while !input.done() {
            let op = input.u8();
            match op {
                0..=7 => self.op_init(&mut input),
                8..=13 => self.op_finalize(&mut input),
                14..=109 => self.op_start(&mut input),
                110..=159 => self.op_state(&mut input),
                160..=209 => self.op_stop(&mut input),
                210..=221 => self.op_poll(&mut input),
                _ => self.op_script(&mut input),
            }
        }
    }

    /// Inits every entry that is not live (start of a run, so that most ops meet a live context).
    pub fn prelude(&self) {
        for e in 0..self.entries.len() {
            self.execute(&[0, e as u8, e as u8 + 1, 0, 2, 8, e as u8]);
        }
    }

    /// Finalizes every live entry (end of a run).
    pub fn finish(&self) {
        for e in 0..self.entries.len() {
            let _ = self.finalize_entry(e);
        }
    }

    /// The account of the run so far (see the module docs); exact once every thread has finished,
    /// [`Run::finish`] ran and every summary has reached the sinks.
    pub fn balance(&self) -> Balance {
        let t = &self.tally;
        let delivered_records = DELIVERED.load(Relaxed) - self.delivered0;
        let counters = Counters::now().since(self.base);
        let mut b = Balance {
            callbacks: t.callbacks.load(Relaxed),
            accounted: 0,
            delivered_records,
            polled_records: t.polled_records.load(Relaxed),
            counters,
            drops: t.drops.load(Relaxed),
            group_handles: t.group_handles.load(Relaxed),
            silent: t.silent.load(Relaxed),
            inits: t.inits.load(Relaxed),
            finalizes: t.finalizes.load(Relaxed),
            recorded_starts: t.recorded_starts.load(Relaxed),
            added: t.added.load(Relaxed),
        };
        b.accounted =
            (b.delivered_records + b.polled_records + counters.sum() + b.drops + b.silent + b.inits + b.finalizes)
                .saturating_sub(b.added);
        b
    }

    /// Waits (at most `timeout`) for summaries still on their way from the telemetry thread,
    /// then returns the balance.
    pub fn settle(&self, timeout: Duration) -> Balance {
        let deadline = Instant::now() + timeout;
        loop {
            let b = self.balance();
            if b.accounted >= b.callbacks || Instant::now() >= deadline {
                return b;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    // -- locking ------------------------------------------------------------------------------

    /// Read-locks the given entries and every entry sharing a hash with them, in index order.
    fn lock(&self, entries: &[usize]) -> Guards<'_> {
        let mut set: Vec<usize> = (0..self.entries.len())
            .filter(|&i| entries.iter().any(|&e| self.entries[e].hash == self.entries[i].hash))
            .collect();
        set.dedup();
        set.into_iter().map(|i| (i, self.entries[i].state.read())).collect()
    }

    /// The state of a locked entry (never locks again: a second read lock can deadlock behind a
    /// waiting writer).
    fn locked<'g>(guards: &'g Guards<'_>, e: usize) -> &'g EntryState {
        guards
            .iter()
            .find(|(i, _)| *i == e)
            .map(|(_, g)| &**g)
            .expect("entry is locked")
    }

    /// The live context of an entry, locking it briefly (call without holding its lock).
    fn live_context(&self, e: usize) -> Option<u64> {
        self.entries[e].state.read().live
    }

    /// The entry a context selection refers to (for locking).
    fn ctx_entry(sel: CtxSel) -> Option<usize> {
        match sel {
            CtxSel::Live(e) | CtxSel::Stale(e) | CtxSel::Foreign(e, ..) => Some(e),
            _ => None,
        }
    }

    /// The context value of a selection, its entry locked in `guards`.
    fn resolve_ctx(&self, guards: &Guards<'_>, sel: CtxSel) -> u64 {
        let state = |e: usize| Self::locked(guards, e);
        match sel {
            CtxSel::Live(e) => {
                let s = state(e);
                s.live.or(s.old.last().copied()).unwrap_or(0)
            }
            CtxSel::Null => 0,
            CtxSel::Stale(e) => {
                let s = state(e);
                s.old.last().copied().unwrap_or(0)
            }
            CtxSel::Invalid(v) => v,
            CtxSel::Foreign(e, slot, generation) => foreign_context(slot, generation, self.entries[e].hash),
            CtxSel::ForeignUnknown(slot, generation) => foreign_context(slot, generation, UNUSED_HASH),
        }
    }

    /// Picks the pool handle a selection means (before locking: the entry is fixed by the pick).
    fn pick(&self, sel: HdSel, natural: Option<Kind>) -> (u64, Option<usize>) {
        let pool = self.pool.lock();
        let of_kind = |k: Option<Kind>| -> Vec<Pooled> {
            pool.iter().filter(|p| k.is_none_or(|k| p.kind == k)).copied().collect()
        };
        let nth = |v: &[Pooled], i: u16| v.get(usize::from(i) % v.len().max(1)).copied();
        let chosen = match sel {
            HdSel::Null | HdSel::Invalid(_) => None,
            HdSel::Pool(i) | HdSel::Forged(i, _) => nth(&pool, i),
            HdSel::Natural(i) => nth(&of_kind(natural), i),
            HdSel::Newest => of_kind(natural).last().copied(),
        };
        match (sel, chosen) {
            (HdSel::Invalid(v), _) => (v, None),
            (HdSel::Forged(_, bits), Some(p)) => (p.value ^ (bits & ((1 << 38) - 1)), Some(p.entry)),
            (_, Some(p)) => (p.value, Some(p.entry)),
            (_, None) => (0, None),
        }
    }

    fn remember(&self, value: u64, entry: usize, kind: Kind) {
        let mut pool = self.pool.lock();
        if pool.len() == POOL {
            pool.remove(0);
        }
        pool.push(Pooled { value, entry, kind });
    }

    /// The entry whose live communicator `value` (a handle or context) names, if any.
    fn entry_of(guards: &Guards<'_>, value: u64) -> Option<usize> {
        // A handle has bit 63 set, which no context has.
        let live = |c: Context| match Handle::decode(value) {
            Some(h) => c.comm.slot == h.comm_slot(),
            None => Context::decode(value).is_some_and(|v| v.comm == c.comm),
        };
        guards
            .iter()
            .find(|(_, s)| s.live.and_then(Context::decode).is_some_and(live))
            .map(|(e, _)| *e)
    }

    // -- raw callbacks (the caller holds the locks) --------------------------------------------

    fn call(&self) {
        self.tally.callbacks.fetch_add(1, Relaxed);
    }

    /// `startEvent` of a v4 descriptor in the table's layout (type `ty`); returns the handle.
    /// Checks the return code, that `*eHandle` was written and that a non-NULL handle is a live
    /// handle of the requested kind.
    fn raw_start(&self, context: u64, descr: Option<&mut ncclProfilerEventDescr_v4_t>, null_handle: bool) -> u64 {
        let ty = descr.as_ref().map(|d| u64::from(d.type_));
        let mut wide = descr
            .as_ref()
            .map(|d| in_layout(d, u64::from(d.type_), d.parentObj as u64 ^ 0x5EED));
        self.raw_start_in(context, descr, wide.as_mut(), ty, null_handle)
    }

    /// `startEvent` with `descr` (v4) or `wide` (v5+) as the table takes it; `ty` its type.
    fn raw_start_in(
        &self,
        context: u64,
        descr: Option<&mut ncclProfilerEventDescr_v4_t>,
        wide: Option<&mut ncclProfilerEventDescr_v7_t>,
        ty: Option<u64>,
        null_handle: bool,
    ) -> u64 {
        self.call();
        let parent = descr.as_ref().map(|d| d.parentObj as u64);
        let mut legacy = descr
            .as_ref()
            .filter(|_| self.abi.legacy())
            .map(|d| in_legacy(d, self.abi, d.parentObj as u64 ^ 0x1E6A));
        let descr_ptr: *mut c_void = match (self.abi, descr, wide, legacy.as_mut()) {
            (_, _, _, Some(l)) => (l as *mut LegacyDescr).cast(),
            (Abi::V4, Some(d), _, _) => (d as *mut ncclProfilerEventDescr_v4_t).cast(),
            (abi, _, Some(w), _) if abi >= Abi::V5 => (w as *mut ncclProfilerEventDescr_v7_t).cast(),
            _ => std::ptr::null_mut(),
        };
        let mut handle = SENTINEL as *mut c_void;
        let handle_ptr = if null_handle {
            std::ptr::null_mut()
        } else {
            &mut handle as *mut _
        };
        let rc = unsafe { self.abi.start(context as *mut c_void, handle_ptr, descr_ptr) };
        assert_eq!(rc, ncclSuccess, "startEvent must return ncclSuccess");
        if null_handle {
            return 0;
        }
        let h = handle as u64;
        assert_ne!(h, SENTINEL, "*eHandle must always be written (type {ty:?})");
        if h != 0 {
            let decoded = Handle::decode(h).expect("a handle we were given decodes");
            // A receive ProxyOp and its steps get kinds of their own, as do ops without steps.
            let kind = Some(match decoded.kind() {
                Kind::RecvOp | Kind::ProxyOpBare | Kind::RecvOpBare => Kind::ProxyOp,
                Kind::RecvStep => Kind::ProxyStep,
                k => k,
            });
            let api = ty == Some(COLL_API) && matches!(kind, Some(Kind::Api | Kind::ApiCall));
            // An operation counted without a record (shed, or no room), and its ops and kernel
            // channels.
            let shed = kind == Some(Kind::Shed)
                && matches!(
                    ty.and_then(kind_of),
                    Some(Kind::Coll | Kind::P2p | Kind::ProxyOp | Kind::KernelCh)
                );
            assert!(
                api || shed || kind == ty.and_then(kind_of),
                "handle kind {kind:?} matches the event type {ty:?}"
            );
            assert!(
                comm::get_slot(decoded.comm_slot()).is_some(),
                "a new handle names a live communicator"
            );
            if matches!(decoded.kind(), Kind::Group | Kind::Api) {
                self.tally.group_handles.fetch_add(1, Relaxed);
            } else if shed && decoded.slot() == MAX_SLOTS {
                // Counted in the communicator's table, or (ops, channels) nothing at all. A shed
                // operation under a recorded API call has its claim as its record instead.
                self.tally.silent.fetch_add(1, Relaxed);
            } else {
                self.tally.recorded_starts.fetch_add(1, Relaxed);
            }
            if self.abi.legacy() && matches!(decoded.kind(), Kind::RecvOp | Kind::RecvOpBare) {
                self.tally.added.fetch_add(1, Relaxed);
            }
            // A Coll or P2p under a recorded API call claims it with a record of its own.
            let claims = parent
                .and_then(Handle::decode)
                .is_some_and(|p| p.kind() == Kind::ApiCall);
            if claims && matches!(decoded.kind(), Kind::Coll | Kind::P2p) {
                self.tally.added.fetch_add(1, Relaxed);
            }
        }
        h
    }

    fn raw_state(&self, handle: u64, state: u32, args: Option<u64>) {
        self.call();
        // v1–v3: `transSize` is the value, `steps` its high half.
        let steps = (args.unwrap_or(0) >> 32) as i32;
        let ignored = |h: Handle| match h.kind() {
            Kind::ProxyOp if self.abi.legacy() && state <= 7 => {
                args.is_some() && legacy_op_state_ignored(self.abi, h, state, steps)
            }
            Kind::ProxyStep if state == SEND_PEER_WAIT => repeated_peer_wait(h),
            // v1–v3: a receive op's RecvPosted and RecvReceived are recorded (or, without args,
            // counted).
            Kind::RecvOp if self.abi.legacy() && matches!(state, 4 | 5) => false,
            // Ops without steps: their v1–v3 transfer states are shed (counted), a receive's
            // InProgress recorded, the rest ignored; anything of a shed event ignored.
            Kind::ProxyOpBare if self.abi.legacy() && state <= 7 => false,
            Kind::RecvOpBare if self.abi.legacy() && matches!(state, 4 | 5) => false,
            Kind::ProxyOpBare => silently_ignored_state(Kind::ProxyOp, state),
            Kind::RecvOpBare => silently_ignored_state(Kind::RecvOp, state),
            Kind::Shed => true,
            kind => silently_ignored_state(kind, state),
        };
        // Ignored states are ignored before the communicator is looked up: live or stale alike.
        if Handle::decode(handle).is_some_and(ignored) {
            self.tally.silent.fetch_add(1, Relaxed);
        }
        let mut a = ncclProfilerEventStateArgs_v4_t {
            kernelCh: ncclProfilerEventStateArgs_v4_t__bindgen_ty_4 {
                pTimer: args.unwrap_or(0),
            },
        };
        let mut legacy = ncclProfilerEventStateArgs_v1_t {
            proxyOp: ncclProfilerEventStateArgs_v1_t__bindgen_ty_1 {
                transSize: args.unwrap_or(0) as usize,
                steps,
            },
        };
        let args_ptr: *mut c_void = match args {
            None => std::ptr::null_mut(),
            Some(_) if self.abi.legacy() => (&raw mut legacy).cast(),
            Some(_) => (&raw mut a).cast(),
        };
        let rc = unsafe { self.abi.state(handle as *mut c_void, state, args_ptr) };
        assert_eq!(rc, ncclSuccess, "recordEventState must return ncclSuccess");
    }

    fn raw_stop(&self, handle: u64) {
        self.call();
        // Ignored before the communicator is looked up: live or stale alike (a check of the slot
        // here could see it live and the plugin, a moment later, finalized).
        if Handle::decode(handle).is_some_and(|h| {
            matches!(
                h.kind(),
                Kind::Group | Kind::Api | Kind::ApiCall | Kind::KernelPhase | Kind::Shed
            )
        }) {
            self.tally.silent.fetch_add(1, Relaxed);
        }
        let rc = unsafe { (self.abi.stop())(handle as *mut c_void) };
        assert_eq!(rc, ncclSuccess, "stopEvent must return ncclSuccess");
    }

    /// `finalize` of a context that is not live (NULL, stale, invalid, foreign): counted.
    fn raw_finalize_dead(&self, context: u64) {
        self.call();
        assert!(
            Context::decode(context).and_then(|c| comm::get(c.comm)).is_none(),
            "only entries' own contexts are live"
        );
        let rc = unsafe { (self.abi.finalize())(context as *mut c_void) };
        assert_eq!(rc, ncclSuccess, "finalize must return ncclSuccess");
    }

    // -- ops ------------------------------------------------------------------------------------

    fn op_init(&self, input: &mut Input<'_>) {
        let e = usize::from(input.u8()) % self.entries.len();
        let name = c_string(input.u8());
        let flags = input.u8();
        let (n_nodes, nranks, rank) = (input.u8() as i8, input.u8() as i8, input.u8() as i8);
        let mut state = self.entries[e].state.write();
        if state.live.is_some() {
            return; // NCCL inits a communicator once
        }
        self.call();
        let mut context = SENTINEL as *mut c_void;
        let mut mask: c_int = -12345;
        let null_context = flags == 0xFF;
        let null_mask = flags & 0x3F == 0x3F;
        let rc = unsafe {
            self.abi.init(
                if null_context {
                    std::ptr::null_mut()
                } else {
                    &mut context
                },
                if null_mask { std::ptr::null_mut() } else { &mut mask },
                name,
                self.entries[e].hash,
                c_int::from(n_nodes),
                c_int::from(nranks),
                c_int::from(rank),
                None,
            )
        };
        assert_eq!(rc, ncclSuccess, "init must return ncclSuccess");
        if null_context {
            return; // counted as a NULL argument
        }
        self.tally.inits.fetch_add(1, Relaxed);
        let context = context as u64;
        assert_ne!(context, SENTINEL, "*context must always be written");
        if context != 0 {
            assert!(Context::decode(context).and_then(|c| comm::get(c.comm)).is_some());
            if !null_mask {
                // v1–v3: ProxyOp instead of ProxyStep, no KernelCh (spec 8.7). The process's
                // first `init` decides (NCCL uses one table per process; these runs do not).
                let configured = Config::global().event_mask;
                let legacy = if configured & 0x10 != 0 {
                    (configured | 0x8) & !(0x10 | 0x40)
                } else {
                    configured & !0x40
                };
                assert!(
                    [configured, legacy].contains(&(mask & !IMPLIED)),
                    "init stores the activation mask (and what the ABI version adds or takes): {mask:#x}"
                );
            }
            state.live = Some(context);
        }
    }

    /// Finalizes the entry's live communicator (write lock: nothing of it is in flight), after
    /// reading its drop counters, which the next `init` on that slot resets.
    /// Returns whether the entry was live.
    fn finalize_entry(&self, e: usize) -> bool {
        let mut state = self.entries[e].state.write();
        let Some(context) = state.live.take() else {
            return false;
        };
        let comm = Context::decode(context)
            .and_then(|c| comm::get(c.comm))
            .expect("a live entry's communicator is live");
        let d = comm.drop_counts();
        self.tally
            .drops
            .fetch_add(d.full + d.late + d.unpublished + d.shed, Relaxed);
        self.call();
        self.tally.finalizes.fetch_add(1, Relaxed);
        let rc = unsafe { (self.abi.finalize())(context as *mut c_void) };
        assert_eq!(rc, ncclSuccess, "finalize must return ncclSuccess");
        state.old.push(context);
        if state.old.len() > 8 {
            state.old.remove(0);
        }
        true
    }

    fn op_finalize(&self, input: &mut Input<'_>) {
        let mut sel = ctx_sel(input, self.entries.len());
        if let CtxSel::Live(e) = sel {
            if self.finalize_entry(e) {
                return;
            }
            sel = CtxSel::Stale(e); // not live: NCCL would not call, but a stale context may come
        }
        let entries: Vec<usize> = Self::ctx_entry(sel).into_iter().collect();
        let guards = self.lock(&entries);
        let context = self.resolve_ctx(&guards, sel);
        self.raw_finalize_dead(context);
    }

    fn op_start(&self, input: &mut Input<'_>) {
        let ctx = ctx_sel(input, self.entries.len());
        let wide_types = self.abi >= Abi::V5;
        let ty: u64 = match input.u8() % 16 {
            0 => GROUP.into(),
            1 | 2 => COLL.into(),
            15 if !wide_types => COLL.into(),
            3 => P2P.into(),
            4 | 5 => PROXY_OP.into(),
            6 | 7 => PROXY_STEP.into(),
            8 => PROXY_CTRL.into(),
            9 => KERNEL_CH.into(),
            10 => NET_PLUGIN.into(),
            11 => 0,
            12 if wide_types => P2P_API,
            12 => 0x3,
            13 if wide_types => COLL_API,
            14 if wide_types => CE_COLL,
            15 => KERNEL_PHASE,
            _ => input.u8().into(),
        };
        let parent_sel = hd_sel(input);
        let flags = input.u8();
        let seed = u64::from(input.u32());
        let fields = [input.u8(), input.u8(), input.u8(), input.u8(), input.u8()];
        let wide = input.u32();
        let (parent, parent_entry) = self.pick(parent_sel, natural_parent(ty));
        let mut entries: Vec<usize> = Self::ctx_entry(ctx).into_iter().collect();
        entries.extend(parent_entry);
        let guards = self.lock(&entries);
        let context = self.resolve_ctx(&guards, ctx);
        let seed = seed ^ self.seed.fetch_add(1, Relaxed);
        let mut d = garbage_descr(seed);
        d.type_ = ty as u8;
        d.parentObj = parent as *mut c_void;
        fill_fields(&mut d, ty as u8, fields, wide);
        let mut w = in_layout(&d, ty, !seed);
        fill_wide_fields(&mut w, ty, fields, wide);
        let null_descr = flags == 0xFF;
        let null_handle = flags == 0xFE;
        let (d, w) = if null_descr {
            (None, None)
        } else {
            (Some(&mut d), Some(&mut w))
        };
        let h = self.raw_start_in(context, d, w, Some(ty), null_handle);
        if let Some(kind) = Handle::decode(h).map(|h| h.kind()) {
            let entry = Self::entry_of(&guards, h).expect("a new handle belongs to a locked entry");
            self.remember(h, entry, kind);
        }
    }

    fn op_state(&self, input: &mut Input<'_>) {
        let sel = hd_sel(input);
        let state = match input.u8() {
            b @ 0..=30 => u32::from(b),
            31..=120 => SEND_WAIT,
            121..=160 => SEND_GPU_WAIT,
            161..=180 => SEND_PEER_WAIT,
            181..=200 => KERNEL_CH_STOP,
            201..=215 => OP_IN_PROGRESS,
            _ => input.u32(),
        };
        let args = match input.u8() % 8 {
            0 => None,
            1 => Some(0),
            _ => Some(input.u64()),
        };
        let (handle, entry) = self.pick(sel, natural_target(state));
        let _guards = self.lock(&entry.into_iter().collect::<Vec<_>>());
        self.raw_state(handle, state, args);
    }

    fn op_stop(&self, input: &mut Input<'_>) {
        let sel = hd_sel(input);
        let (handle, entry) = self.pick(sel, None);
        let _guards = self.lock(&entry.into_iter().collect::<Vec<_>>());
        self.raw_stop(handle);
    }

    /// The consumer at a chosen instant (the fuzz target has no telemetry thread).
    fn op_poll(&self, input: &mut Input<'_>) {
        let interval = Config::global().interval;
        let ahead = match input.u8() % 6 {
            0 => Duration::ZERO,
            1 => Duration::from_millis(5),
            2 => SETTLE,
            3 => interval,
            4 => interval * 2 + SETTLE,
            _ => Duration::from_secs(3600),
        };
        let now = Instant::now() + ahead;
        let spt = nccl_profiler_otel::clock::secs_per_tick();
        for c in consumer::all() {
            let records: u64 = c.poll(now, spt).iter().map(|s| s.stats.records).sum();
            self.tally.polled_records.fetch_add(records, Relaxed);
        }
    }

    /// A well-formed operation as NCCL emits it (spec 3.4–3.8), with optional irregularities:
    /// the root stopped before its children, ops or steps never stopped, a restarted step,
    /// receive ops, PXN ops.
    fn op_script(&self, input: &mut Input<'_>) {
        let e = usize::from(input.u8()) % self.entries.len();
        let flags = input.u16();
        let n_ops = input.u8() % 4;
        let n_steps = input.u8() % 6;
        let n_kernels = input.u8() % 3;
        let bytes = u64::from(input.u16()) << (input.u8() % 12);
        let seed = u64::from(input.u32()) ^ self.seed.fetch_add(1, Relaxed);
        let guards = self.lock(&[e]);
        let Some(context) = Self::locked(&guards, e).live else {
            return;
        };
        let bit = |i: u32| flags & (1 << i) != 0;
        let mut g = Garbage(seed);
        let mut start = |ty: u8, parent: u64, ctx: u64, fields: [u8; 5], wide: u32| {
            let mut d = garbage_descr(g.next());
            d.type_ = ty;
            d.parentObj = parent as *mut c_void;
            fill_fields(&mut d, ty, fields, wide);
            let h = self.raw_start(ctx, Some(&mut d), false);
            if let Some(kind) = Handle::decode(h).map(|h| h.kind()) {
                // PXN ops land on any live entry with the same hash.
                let entry = Self::entry_of(&guards, h).expect("a new handle belongs to a locked entry");
                self.remember(h, entry, kind);
            }
            h
        };
        let group = if bit(0) { start(GROUP, 0, context, [0; 5], 0) } else { 0 };
        let root_ty = if bit(1) { P2P } else { COLL };
        // Coll: func AllReduce, algo RING, proto SIMPLE, datatype ncclFloat32; P2p: Send, ncclInt8.
        let root = start(root_ty, group, context, [0, 8, 12, 15, 1], 4096);
        if bit(2) {
            self.raw_stop(root);
        }
        let pxn = bit(3);
        for o in 0..n_ops {
            let ctx = if pxn {
                foreign_context(u16::from(o), 7, self.entries[e].hash)
            } else {
                context
            };
            let send = !bit(4) || o > 0;
            let pid_sel = if pxn { 1 } else { 0 };
            let op = start(PROXY_OP, root, ctx, [pid_sel, u8::from(send), o, 1, n_steps], 1 << 20);
            self.raw_state(op, OP_IN_PROGRESS, Some(0));
            for s in 0..n_steps {
                let step = start(PROXY_STEP, op, ctx, [s, 0, 0, 0, 0], 0);
                if bit(5) && s == 0 {
                    // A restarted step: the first handle never gets a state or a stop (spec 3.7).
                    let _ = start(PROXY_STEP, op, ctx, [s, 0, 0, 0, 0], 0);
                }
                self.raw_state(step, SEND_GPU_WAIT, Some(12345));
                (0..u32::from(flags >> 12)).for_each(|_| self.raw_state(step, SEND_PEER_WAIT, Some(12345)));
                self.raw_state(step, SEND_WAIT, Some(bytes + u64::from(s)));
                if !bit(6) || s + 1 < n_steps {
                    self.raw_stop(step);
                }
            }
            if !bit(7) {
                self.raw_stop(op);
            }
        }
        for k in 0..n_kernels {
            let kernel = start(KERNEL_CH, root, context, [k, 0, 0, 0, 0], 1000);
            self.raw_state(kernel, KERNEL_CH_STOP, Some(if bit(8) { 10 } else { 50_000 }));
            self.raw_stop(kernel);
        }
        if !bit(2) && !bit(9) {
            self.raw_stop(root);
        }
        if bit(10) {
            self.raw_stop(root); // double stop (spec 4.2)
        }
        if group != 0 {
            self.raw_stop(group);
        }
    }
}

/// A v4 descriptor full of garbage, as NCCL's v4 adapter passes it (spec 4.8: not
/// zero-initialised); the caller sets the fields NCCL does fill.
fn garbage_descr(seed: u64) -> ncclProfilerEventDescr_v4_t {
    // SAFETY: all-zero is a valid descriptor (integers, raw pointers, unions of those).
    let mut d: ncclProfilerEventDescr_v4_t = unsafe { std::mem::zeroed() };
    fill_garbage(&mut d, seed);
    d
}

/// Overwrites a descriptor with garbage.
fn fill_garbage<T>(d: &mut T, seed: u64) {
    let size = std::mem::size_of_val(d);
    // SAFETY: only called on descriptors, whose every field is an integer, a raw pointer or a
    // union of those: any byte pattern is a valid value; the slice covers exactly `d`.
    let bytes = unsafe { std::slice::from_raw_parts_mut((d as *mut T).cast::<u8>(), size) };
    let mut g = Garbage(seed);
    for chunk in bytes.chunks_mut(8) {
        let v = g.next().to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

/// Sets the fields NCCL fills for the v5+ types `ty` (CollApi, CeColl, KernelPhase) from input
/// bytes, as [`fill_fields`] does for the others.
fn fill_wide_fields(d: &mut ncclProfilerEventDescr_v7_t, ty: u64, f: [u8; 5], wide: u32) {
    // SAFETY: writing union members of plain data.
    unsafe {
        let u = &mut d.__bindgen_anon_1;
        match ty {
            COLL_API => {
                let a = &mut u.collApi;
                (a.func, a.datatype) = (c_string(f[0]), c_string(f[3]));
                if f[4] & 1 == 1 {
                    a.count = wide as usize;
                }
            }
            CE_COLL => {
                let c = &mut u.ceColl;
                (c.func, c.datatype, c.syncStrategy) = (c_string(f[0]), c_string(f[3]), c_string(f[2]));
                if f[4] & 1 == 1 {
                    c.count = wide as usize;
                }
            }
            KERNEL_PHASE => {
                let k = &mut u.kernelPhase;
                (k.channelId, k.phaseId, k.phaseName) = (f[0], f[1] % 4, c_string(f[2]));
                k.pTimer = u64::from(wide);
            }
            _ => {}
        }
    }
}

/// Sets the fields NCCL fills for `ty` from input bytes; pointer fields NCCL always sets get NULL
/// or a valid C string, never a wild pointer. Other fields keep their garbage.
fn fill_fields(d: &mut ncclProfilerEventDescr_v4_t, ty: u8, f: [u8; 5], wide: u32) {
    d.rank = i32::from(f[4] as i8);
    // SAFETY: writing union members of plain data.
    unsafe {
        let u = &mut d.__bindgen_anon_1;
        match ty {
            COLL => {
                let c = &mut u.coll;
                c.func = c_string(f[0]);
                c.algo = c_string(f[1]);
                c.proto = c_string(f[2]);
                c.datatype = c_string(f[3]);
                if f[4] & 1 == 1 {
                    c.count = wide as usize;
                }
            }
            P2P => {
                let p = &mut u.p2p;
                p.func = c_string(if f[0] == 0 { 5 } else { f[0] });
                p.datatype = c_string(f[3]);
                p.peer = i32::from(f[1] as i8);
                if f[4] & 1 == 1 {
                    p.count = wide as usize;
                }
            }
            PROXY_OP => {
                let p = &mut u.proxyOp;
                // Ours most of the time; otherwise another process's (PXN).
                p.pid = match f[0] % 4 {
                    1 => std::process::id() as i32 + 1,
                    2 => i32::from_le_bytes(wide.to_le_bytes()),
                    _ => std::process::id() as i32,
                };
                p.isSend = match f[1] % 4 {
                    0 => 0,
                    1 | 2 => 1,
                    _ => i32::from(f[1] as i8),
                };
                p.channelId = f[2];
                p.peer = i32::from(f[3] as i8);
                p.nSteps = i32::from(f[4]);
                if f[4] & 1 == 1 {
                    p.chunkSize = wide as i32;
                }
            }
            PROXY_STEP => u.proxyStep.step = i32::from(f[0]),
            KERNEL_CH => {
                u.kernelCh.channelId = f[0];
                u.kernelCh.pTimer = u64::from(wide);
            }
            _ => {}
        }
    }
}

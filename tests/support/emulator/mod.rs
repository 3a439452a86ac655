//! The NCCL host emulator: loads the profiler plugin and calls it the way NCCL 2.30 does
//! (the NCCL profiler API, spec sections 1, 3 and 4), with a modelled network whose
//! truth is known.
//!
//! One implementation, shared by the integration tests (`support::emulator`), the examples and the
//! benchmarks (`#[path = "../tests/support/emulator/mod.rs"] mod emulator;`).
//!
//! - [`plugin`]: [`Plugin::in_process`] (the table linked into this binary) or [`Plugin::load`]
//!   (`dlopen(RTLD_NOW | RTLD_LOCAL)` of the built `.so`, symbols looked up v6 → v5 → v4 like
//!   NCCL), `init` with NCCL's arguments and a logger, and one method per callback.
//! - [`net`]: the modelled network: a latency and a bandwidth per rank pair, optionally with
//!   jitter. A send step occupies its wire for `bytes / bandwidth` (its link's) once the wire is
//!   free (steps queue on it, up to 8 in flight per op, as NCCL's are) and stops `latency` later;
//!   steps are NCCL's fixed-size chunks per protocol. The wire is the emulated process's NIC
//!   ([`Options::nic_fifo`], the default): one first-in, first-out queue for every peer, channel
//!   and communicator of the world rank; without it, one wire per link. Each transfer's
//!   truth ([`truth::StepTruth`]) says when the wire took it, its time on an idle wire and its
//!   wait in the queue.
//! - [`workload`]: communicators, the calls each one issues per iteration, and the threads
//!   that issue them: per emulated rank one user thread (init, Group/Coll/P2p, finalize), per
//!   communicator and rank one proxy thread (ProxyOp, ProxyStep, KernelCh, ProxyCtrl; from
//!   2.31 KernelCh and KernelPhase come from a profiler thread of their own). Ring
//!   and tree patterns, Simple/LL/LL128 steps; kernel channels start up to `kernel_skew` after
//!   the launch, each with its own GPU times.
//! - [`board`]: couples ranks that different processes emulate (one process per host, the
//!   culprit benchmark's job, `support::job`): a send waits for its receive to be posted, a
//!   receive for the data its sender handed to the network, through shared memory.
//! - [`release`]: the NCCL release it claims to be (`ncclGetVersion`), 2.30.7 unless a test
//!   sets another.
//! - [`truth`]: what the emulator itself measured and configured, to compare with what the
//!   plugin reports.
//! - `ports` (the package's tests and benches): every `init` fails the test when the plugin
//!   would export to a default port of the machine (4317, 4318, 9090).
//!
//! ```ignore
//! let plugin = Plugin::load_built()?; // or Plugin::in_process()
//! let net = Network::new(4, 1, Link::new_us(100.0, 5.0)).slow_link(1, 2, 4.0).with_jitter(0.02);
//! let report = Workload::new(net)
//!     .comm(CommSpec::new("dp", 0..4).channels(2).calls([Call::all_reduce(16 << 20), Call::all_to_all(1 << 20)]))
//!     .iterations(10)
//!     .run_with_progress(&plugin, &|done, total| eprint!("\r{done}/{total}"));
//! for l in report.world_links() {
//!     // l.configured (latency, bandwidth), l.transfers, l.disturbed per (src, dst)
//! }
//! for c in &report.collectives {
//!     // c.func, c.bytes, c.duration() (start → last network op stop), c.gpu_duration(), c.full_duration()
//! }
//! plugin.close(); // dlclose, as NCCL does after the last finalize
//! ```
//! [`Workload::training`] is a ready-made training-like job (gradient AllReduces of mixed
//! sizes, AllGather/ReduceScatter, a pipeline Send/Recv, an AlltoAll over every pair).
//!
//! A process running this emulates several NCCL processes at once: each (communicator, rank)
//! it emulates is a separate `init` with its own rank, as if every rank were its own process
//! (with its own user and proxy threads). That is how one process covers a whole matrix of
//! links: rank `r` of a ring sends to its successor, so its link figures are for `(r → r+1)`;
//! Send/Recv and AlltoAll cover any pair. [`CommSpec::emulate`] restricts a run to some ranks
//! (one rank at a time is the most precise: fewer threads compete for the cores).
//!
//! Time is real: a transfer ends when its proxy thread calls `stopEvent` at the modelled
//! instant (sleep, then spin; proxy and user threads ask for real-time priority, granted to
//! root). A host that preempts the emulator at that moment makes the transfer longer than the
//! model; the emulator times every call itself and reports such transfers ([`LinkTruth`]:
//! `disturbed`, `late`, `max_late`), so tests can tell a busy host from a plugin error.
//!
//! Descriptors are built zeroed, as NCCL's v6 path does.
#![allow(dead_code)]

pub mod board;
pub mod host;
pub mod logger;
pub mod net;
pub mod plugin;
#[cfg(feature = "testing")]
pub mod ports;
mod profiler_thread;
mod proxy;
pub mod release;
pub mod stall;
pub mod time;
pub mod truth;
pub mod workload;

#[allow(unused_imports)]
pub use host::Pauses;
#[allow(unused_imports)]
pub use net::{Degrade, Link, Links, Network};
#[allow(unused_imports)]
pub use plugin::{Comm, H, LoadError, Plugin, Version, built_library, cstr, descr, mask, pid, ty};
#[allow(unused_imports)]
pub use stall::{GpuStall, Late, NicHang, Pause, Stall, When};
#[allow(unused_imports)]
pub use time::spin;
#[allow(unused_imports)]
pub use truth::{CollTruth, LinkTruth, Report, WorldLink};
#[allow(unused_imports)]
pub use workload::{Algo, Call, CommSpec, Dtype, Func, Options, Proto, RankHook, Workload};

/// Peak resident memory of this process so far (`VmHWM`), bytes; writing `5` to
/// `/proc/self/clear_refs` resets it to the current resident memory.
#[allow(dead_code)]
pub fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Resident memory of this process in bytes (`/proc/self/statm`, second field): what the
/// memory bench and the churn test measure.
#[allow(dead_code)]
pub fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("resident pages");
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}

//! Couples ranks that different processes emulate (one process per host, as a job runs): a file
//! every process maps shared keeps, per link direction of each communicator channel (sender →
//! receiver), how many receive steps the receiver has posted and when each step the sender handed
//! to the network arrives. A send step waits until its receive is posted (SendPeerWait meanwhile),
//! a receive step's data arrives when the sender's step does; so a late, stopped or hung rank holds
//! its neighbours, and through them its whole ring, as NCCL's ranks do.
//!
//! Steps are numbered per link direction across the collectives of the communicator (both ends
//! run the same collectives in the same order, so they agree on the numbers). Times are
//! `CLOCK_MONOTONIC` nanoseconds, one clock for every process of the machine.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Arrival times kept per link direction: more than the steps a sender can have in flight ahead
/// of its receiver's consumption (NCCL's 8).
const RING: usize = 32;

/// One link direction.
#[repr(C)]
struct Slot {
    /// Receive steps the receiver has posted.
    posted: AtomicU64,
    /// Per step `g` at `g % RING`: `g + 1` once its arrival is written, and the arrival.
    step: [AtomicU64; RING],
    arrival: [AtomicU64; RING],
}

/// The shared board of one job (see the module documentation).
#[derive(Debug)]
pub struct Board {
    base: *mut Slot,
    len: usize,
    comms: Vec<u64>,
    channels: usize,
    nranks: usize,
}

// SAFETY: the mapping is only accessed through atomics, and it lives as long as the board.
unsafe impl Send for Board {}
// SAFETY: as above.
unsafe impl Sync for Board {}

impl Board {
    /// Creates (or truncates) the board file at `path` and maps it: `comms` the communicators'
    /// hashes, each with at most `channels` channels and `nranks` ranks. Every process of the job
    /// opens the same file with the same arguments.
    pub fn open(path: &Path, comms: Vec<u64>, channels: usize, nranks: usize) -> std::io::Result<Board> {
        let slots = comms.len() * channels * nranks * nranks;
        let len = slots * std::mem::size_of::<Slot>();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        file.set_len(len as u64)?;
        use std::os::fd::AsRawFd as _;
        // SAFETY: a fresh shared mapping of `len` bytes of an open file; checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Board {
            base: base.cast(),
            len,
            comms,
            channels,
            nranks,
        })
    }

    /// The slot of `src → dst` on `channel` of communicator `hash`, if the board has it.
    fn slot(&self, hash: u64, channel: u8, src: i32, dst: i32) -> Option<&Slot> {
        let c = self.comms.iter().position(|&h| h == hash)?;
        let (ch, s, d) = (
            usize::from(channel),
            usize::try_from(src).ok()?,
            usize::try_from(dst).ok()?,
        );
        if ch >= self.channels || s >= self.nranks || d >= self.nranks {
            return None;
        }
        let i = ((c * self.channels + ch) * self.nranks + s) * self.nranks + d;
        // SAFETY: `i` is below the slot count the mapping was sized for; a zeroed file is a
        // valid `Slot` (atomics), and the mapping lives as long as `self`.
        Some(unsafe { &*self.base.add(i) })
    }

    /// The receiver `dst` has posted its receive steps up to `posted` (exclusive).
    pub fn post(&self, hash: u64, channel: u8, src: i32, dst: i32, posted: u64) {
        if let Some(s) = self.slot(hash, channel, src, dst) {
            s.posted.fetch_max(posted, Ordering::Release);
        }
    }

    /// Whether receive step `g` is posted.
    pub fn is_posted(&self, hash: u64, channel: u8, src: i32, dst: i32, g: u64) -> bool {
        self.slot(hash, channel, src, dst)
            .is_none_or(|s| s.posted.load(Ordering::Acquire) > g)
    }

    /// The sender `src` handed step `g` to the network; its data arrives at `arrival`.
    pub fn sent(&self, hash: u64, channel: u8, src: i32, dst: i32, g: u64, arrival: Instant) {
        if let Some(s) = self.slot(hash, channel, src, dst) {
            let i = (g % RING as u64) as usize;
            s.arrival[i].store(mono_ns(arrival), Ordering::Relaxed);
            s.step[i].store(g + 1, Ordering::Release);
        }
    }

    /// When step `g` arrives, once its sender handed it to the network.
    pub fn arrival(&self, hash: u64, channel: u8, src: i32, dst: i32, g: u64) -> Option<Instant> {
        let s = self.slot(hash, channel, src, dst)?;
        let i = (g % RING as u64) as usize;
        (s.step[i].load(Ordering::Acquire) == g + 1).then(|| instant(s.arrival[i].load(Ordering::Relaxed)))
    }
}

impl Drop for Board {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `open` made.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// `CLOCK_MONOTONIC` now, in nanoseconds.
fn mono_now() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes the current time into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `t` as `CLOCK_MONOTONIC` nanoseconds (Rust's `Instant` is that clock on Linux).
pub fn mono_ns(t: Instant) -> u64 {
    let (now, mono) = (Instant::now(), mono_now());
    if t >= now {
        mono + (t - now).as_nanos() as u64
    } else {
        mono.saturating_sub((now - t).as_nanos() as u64)
    }
}

/// The `Instant` of `CLOCK_MONOTONIC` nanoseconds `ns`.
pub fn instant(ns: u64) -> Instant {
    let (now, mono) = (Instant::now(), mono_now());
    if ns >= mono {
        now + Duration::from_nanos(ns - mono)
    } else {
        now - Duration::from_nanos(mono - ns)
    }
}

//! The culprit benchmark's job: [`HOSTS`] hosts of [`PER_HOST`] ranks, one process per host with
//! its own identity (`host.name`, `job.node_name`), as a job runs one process per host when it
//! launches one per GPU group. Local rank `l` of every host forms the rail communicator `rail{l}`
//! (a ring over the hosts, every link over the network, as data parallelism across nodes runs),
//! so each host has one rank in each of the [`PER_HOST`] rings; local rank `l` drives GPU `l` (the
//! CUDA driver's stand-in, `support::cuda`) and sends on a wire of its own (its NIC, the
//! emulator's wire per rank), and a slow host NIC slows the wires of all of them.
//! The ranks are coupled through a [`Board`] in shared memory: a send waits for its receive to be
//! posted, a receive for the data its sender handed to the network, so a late, hung or absent rank
//! holds its ring, as NCCL's ranks do. Every process exports through the plugin at its defaults
//! (interval, hang threshold) to the benchmark's OTLP receiver.
//!
//! A [`Case`] injects one [`Fault`] at a known time after steady state, for a known time; the
//! host processes learn it from the environment ([`Case::spawn`], [`host_main`]) and apply what
//! concerns their ranks: a slow link or host NIC (every process: the sender's wire is slower), a
//! straggler or a rank hung on its proxy or GPU (its own process), a hung NIC (every process: the
//! transfers from and to it stop), an absent rank or a checkpoint pause (its own process).
//!
//! Modules: `live` (Prometheus fed by remote write as requests arrive; the alerts it fires),
//! `score` (alerts against the injected truth).
#![allow(dead_code)]

pub mod live;
pub mod score;

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cuda;
use super::emulator::board::{self, Board};
use super::emulator::release::Release;
use super::emulator::{
    Call, CommSpec, Degrade, GpuStall, Late, Link, Links, Network, NicHang, Pause, Plugin, RankHook, Stall, Workload,
};

/// Hosts of the job.
pub const HOSTS: usize = 4;
/// Ranks (GPUs) per host, one rail communicator each.
pub const PER_HOST: usize = 8;
/// Channels of every collective.
pub const CHANNELS: u8 = 1;
/// Each iteration's AllReduce, per rank.
pub const BYTES: u64 = 32 << 20;
/// Each iteration's AllReduce in the long-collectives run: about 6.4 s on the wire, longer than
/// the plugin's 5 s hang threshold, progressing all the time.
pub const LONG_BYTES: u64 = 4 << 30;
/// A network step's payload: each ring slice of a channel is one step.
pub const CHUNK: u64 = 4 << 20;
/// The compute between two iterations.
pub const GAP: Duration = Duration::from_millis(300);
/// Every link: 50 µs, 1 GB/s (a step takes 4 ms on the wire).
pub fn link() -> Link {
    Link::new_us(50.0, 1.0)
}

/// World ranks.
pub const RANKS: usize = HOSTS * PER_HOST;

/// The hash of communicator `rail{local}` of job `job`.
pub fn comm_hash(job: u64, local: usize) -> u64 {
    0x7261_696c_0000_0000 | (job & 0xffff) << 16 | local as u64
}

/// World rank `w`'s host, and its rank in its rail communicator (the host's index).
pub fn host_of(w: usize) -> usize {
    w / PER_HOST
}

/// The host's name in the resource.
pub fn host_name(h: usize) -> String {
    format!("host{h}")
}

/// Where a hung rank hangs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Where {
    /// Its proxy stops posting.
    Proxy,
    /// Its GPU stops consuming and producing.
    Gpu,
    /// Its NIC stops: transfers from and to it do not complete.
    Network,
}

/// One injected fault (world ranks, host indices).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fault {
    /// Nothing.
    None,
    /// `src → dst` `factor` times slower.
    SlowLink { src: usize, dst: usize, factor: f64 },
    /// Every link from or to the host's ranks `factor` times slower.
    SlowNic { host: usize, factor: f64 },
    /// The rank enters every collective late by `share` of the healthy iteration.
    Straggler { rank: usize, share: f64 },
    /// `src → dst` 2× slower for 10 s of every 30 s.
    Flapping { src: usize, dst: usize },
    /// The rank hangs inside NCCL, in an operation in flight.
    Hung { rank: usize, at: Where },
    /// The rank stops calling NCCL for good.
    Absent { rank: usize },
    /// The rank stops calling NCCL for `secs` (a checkpoint), the others wait: healthy.
    Checkpoint { rank: usize, secs: u64 },
    /// Every proxy thread is preempted every [`PREEMPT_EVERY`] send steps (host noise): healthy.
    Preempted,
    /// Every AllReduce is [`LONG_BYTES`]: healthy.
    LongCollectives,
}

/// How often a proxy thread of the [`Fault::Preempted`] run is preempted, in send steps.
pub const PREEMPT_EVERY: u64 = 10;

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Fault::None => write!(f, "none"),
            Fault::SlowLink { src, dst, factor } => write!(f, "slow-link {src} {dst} {factor}"),
            Fault::SlowNic { host, factor } => write!(f, "slow-nic {host} {factor}"),
            Fault::Straggler { rank, share } => write!(f, "straggler {rank} {share}"),
            Fault::Flapping { src, dst } => write!(f, "flapping {src} {dst}"),
            Fault::Hung { rank, at } => write!(f, "hung-{} {rank}", format!("{at:?}").to_lowercase()),
            Fault::Absent { rank } => write!(f, "absent {rank}"),
            Fault::Checkpoint { rank, secs } => write!(f, "checkpoint {rank} {secs}"),
            Fault::Preempted => write!(f, "preempted"),
            Fault::LongCollectives => write!(f, "long-collectives"),
        }
    }
}

impl Fault {
    /// The form [`Display`](fmt::Display) writes.
    pub fn parse(s: &str) -> Option<Fault> {
        let w: Vec<&str> = s.split_whitespace().collect();
        let n = |i: usize| w.get(i)?.parse::<usize>().ok();
        let x = |i: usize| w.get(i)?.parse::<f64>().ok();
        Some(match *w.first()? {
            "none" => Fault::None,
            "slow-link" => Fault::SlowLink {
                src: n(1)?,
                dst: n(2)?,
                factor: x(3)?,
            },
            "slow-nic" => Fault::SlowNic {
                host: n(1)?,
                factor: x(2)?,
            },
            "straggler" => Fault::Straggler {
                rank: n(1)?,
                share: x(2)?,
            },
            "flapping" => Fault::Flapping { src: n(1)?, dst: n(2)? },
            "hung-proxy" => Fault::Hung {
                rank: n(1)?,
                at: Where::Proxy,
            },
            "hung-gpu" => Fault::Hung {
                rank: n(1)?,
                at: Where::Gpu,
            },
            "hung-network" => Fault::Hung {
                rank: n(1)?,
                at: Where::Network,
            },
            "absent" => Fault::Absent { rank: n(1)? },
            "checkpoint" => Fault::Checkpoint {
                rank: n(1)?,
                secs: n(2)? as u64,
            },
            "preempted" => Fault::Preempted,
            "long-collectives" => Fault::LongCollectives,
            _ => return None,
        })
    }

    /// Whether a run with it is healthy (no culprit to name).
    pub fn healthy(&self) -> bool {
        matches!(
            self,
            Fault::None | Fault::Checkpoint { .. } | Fault::Preempted | Fault::LongCollectives
        )
    }

    /// Each iteration's AllReduce, per rank.
    pub fn bytes(&self) -> u64 {
        if *self == Fault::LongCollectives {
            LONG_BYTES
        } else {
            BYTES
        }
    }
}

/// One run of the job with one fault.
#[derive(Clone, Debug)]
pub struct Case {
    /// Its job label's suffix: unique in a benchmark run.
    pub id: u64,
    pub fault: Fault,
    /// The jitter's seed.
    pub seed: u64,
    pub release: Release,
    /// Steady state before the fault.
    pub warmup: Duration,
    /// How long the fault lasts (an absent rank stays absent).
    pub hold: Duration,
    /// How long the job runs after the fault ends.
    pub tail: Duration,
}

/// The environment a host process reads.
const ENV_HOST: &str = "NCCL_JOB_HOST";
const ENV_FAULT: &str = "NCCL_JOB_FAULT";
const ENV_START: &str = "NCCL_JOB_START";
const ENV_HOLD: &str = "NCCL_JOB_HOLD_MS";
const ENV_SEED: &str = "NCCL_JOB_SEED";
const ENV_ID: &str = "NCCL_JOB_ID";
const ENV_BOARD: &str = "NCCL_JOB_BOARD";
const ENV_ITERATIONS: &str = "NCCL_JOB_ITERATIONS";
const ENV_CUDA: &str = "NCCL_JOB_CUDA_STUB";

/// The healthy iteration's length with AllReduces of `bytes`, about (their time on the wire
/// plus [`GAP`]).
pub fn iteration(bytes: u64) -> Duration {
    let per_channel = bytes / u64::from(CHANNELS);
    let steps = 2 * (HOSTS as u64 - 1) * (per_channel / HOSTS as u64).div_ceil(CHUNK);
    GAP + link().transfer(CHUNK) * steps as u32
}

impl Case {
    /// The job label of its processes (`service.namespace/service.name`).
    pub fn job(&self) -> String {
        format!("culprit/case{}", self.id)
    }

    /// How long it runs.
    pub fn length(&self) -> Duration {
        self.warmup + self.hold + self.tail
    }

    /// Starts its host processes: `command()` runs this binary's host entry (it must call
    /// [`host_main`]), `endpoint` is the OTLP receiver. The fault starts `warmup` after now.
    pub fn spawn(&self, command: impl Fn() -> Command, endpoint: &str, dir: &Path) -> Running {
        let board = dir.join(format!("board-{}", self.id));
        let start = Instant::now();
        let iterations =
            (self.length().as_secs_f64() / iteration(self.fault.bytes()).as_secs_f64()).ceil() as usize + 10;
        let children = (0..HOSTS)
            .map(|h| {
                let resource = format!(
                    "service.namespace=culprit,service.name=case{},host.name={},job.node_name=node{h}",
                    self.id,
                    host_name(h)
                );
                command()
                    .env(ENV_HOST, h.to_string())
                    .env(ENV_FAULT, self.fault.to_string())
                    .env(ENV_START, board::mono_ns(start + self.warmup).to_string())
                    .env(ENV_HOLD, self.hold.as_millis().to_string())
                    .env(ENV_SEED, self.seed.to_string())
                    .env(ENV_ID, self.id.to_string())
                    .env(ENV_BOARD, &board)
                    .env(ENV_ITERATIONS, iterations.to_string())
                    .env(ENV_CUDA, cuda::build())
                    .env("EMU_NCCL", self.release.to_string())
                    .env("OTEL_RESOURCE_ATTRIBUTES", resource)
                    .env("NCCL_PROFILER_OTEL_TELEMETRY_ENDPOINT", endpoint)
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .expect("a host process")
            })
            .collect();
        Running { children, start, board }
    }
}

/// A case's host processes; killed when dropped.
pub struct Running {
    children: Vec<Child>,
    /// When they were started (the fault starts `warmup` later).
    pub start: Instant,
    board: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(&self.board);
    }
}

/// The host side: in a process [`Case::spawn`] started, runs that host's ranks until the end
/// and returns `true`; `false` in any other process.
pub fn host_main() -> bool {
    let Some(host) = std::env::var(ENV_HOST).ok().and_then(|h| h.parse::<usize>().ok()) else {
        return false;
    };
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
    let num = |name: &str| {
        var(name)
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("{name} is a number"))
    };
    let fault = Fault::parse(&var(ENV_FAULT)).expect("a fault");
    let at = board::instant(num(ENV_START));
    let hold = Duration::from_millis(num(ENV_HOLD));
    let id = num(ENV_ID);
    let hashes: Vec<u64> = (0..PER_HOST).map(|l| comm_hash(id, l)).collect();
    let board =
        Board::open(Path::new(&var(ENV_BOARD)), hashes.clone(), usize::from(CHANNELS), HOSTS).expect("the job's board");
    let mut net = Network::new(RANKS, PER_HOST, link())
        .with_jitter(0.05)
        .with_seed(num(ENV_SEED));
    let until = at + hold;
    let slow = |links, factor, flap| Degrade {
        links,
        factor,
        from: at,
        until,
        flap,
    };
    match fault {
        Fault::SlowLink { src, dst, factor } => net = net.degrade(slow(Links::One(src, dst), factor, None)),
        Fault::SlowNic { host, factor } => net = net.degrade(slow(Links::Node(host), factor, None)),
        Fault::Flapping { src, dst } => {
            let flap = Some((Duration::from_secs(10), Duration::from_secs(30)));
            net = net.degrade(slow(Links::One(src, dst), 2.0, flap));
        }
        _ => {}
    }
    let mine = |rank: usize| host_of(rank) == host;
    let mut w = Workload::new(net).iterations(num(ENV_ITERATIONS) as usize);
    for (l, &hash) in hashes.iter().enumerate() {
        let members = (0..HOSTS).map(|h| h * PER_HOST + l);
        let spec = CommSpec::new(&format!("rail{l}"), members)
            .with_hash(hash)
            .channels(CHANNELS)
            .call(Call::all_reduce(fault.bytes()))
            .emulate([host as i32]);
        w = w.comm(spec);
    }
    let board = Arc::new(board);
    let driver = cuda::Driver::open(Path::new(&var(ENV_CUDA)));
    let w = w.options(|o| {
        o.on_rank_thread = Some(RankHook(Arc::new(move |rank| {
            driver.set_device(Some((rank % PER_HOST) as u8))
        })));
        o.chunk_bytes = CHUNK;
        o.gap = GAP;
        o.realtime = false;
        o.spin = false;
        o.board = Some(board);
        match fault {
            Fault::Straggler { rank, share } if mine(rank) => {
                o.late = Some(Late::from(rank, iteration(BYTES).mul_f64(share), at));
            }
            Fault::Hung { rank, at: Where::Proxy } if mine(rank) => o.stall = Some(Stall::at(rank, at, hold)),
            Fault::Hung { rank, at: Where::Gpu } if mine(rank) => o.gpu_stall = Some(GpuStall::at(rank, at, hold)),
            Fault::Hung {
                rank,
                at: Where::Network,
            } => o.nic_hang = Some(NicHang { rank, at, hold }),
            Fault::Absent { rank } if mine(rank) => {
                o.pause = Some(Pause {
                    rank,
                    at,
                    hold: Duration::from_secs(86400),
                })
            }
            Fault::Checkpoint { rank, secs } if mine(rank) => {
                o.pause = Some(Pause {
                    rank,
                    at,
                    hold: Duration::from_secs(secs),
                })
            }
            Fault::Preempted => o.preempt_every = PREEMPT_EVERY,
            _ => {}
        }
    });
    let p = Plugin::in_process();
    w.run(&p);
    true
}

//! One export interval, the second stage of aggregation: the window summaries of the interval
//! merged per link and per channel, and every figure made from them — each link's queue fit
//! (latency, bandwidth, R², throughput), each channel's regression, each operation's queue wait
//! and service time (split in enqueue order per communicator, across intervals:
//! [`super::service`]), each communicator's sampling ratio under overload, and the nccl-tests
//! bandwidths and bus bytes of an operation group ([`Scale`]). Plain values out, keyed by what their attributes name; the
//! exporter only maps them onto instruments.
//! Pure; called on the telemetry thread only.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use super::bandwidth::{UNKNOWN_CLASS, bus_factor};
use super::idle::{Check, Timeline};
use super::queue::{Gap, Opener, Queue};
use super::regression::{Mode, Samples};
use super::service::{Order, Split};
use super::summary::{CollKey, WindowSummary};
use crate::record::{CommMeta, Func, Gpu};

pub use super::bandwidth::size_class_name;
pub use super::queue::LinkFit;

/// A communicator as the figures' attributes name it, with the rank they are about.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CommKey {
    /// NCCL's communicator hash.
    pub hash: u64,
    /// Communicator name, possibly empty.
    pub name: String,
    /// The rank the figures are about (a link's sending rank, else ours).
    pub rank: i32,
    /// Number of ranks; 0 when unknown (ABI v1–v3).
    pub nranks: i32,
}

impl CommKey {
    /// `meta`'s key, about `rank`.
    pub fn new(meta: &CommMeta, rank: i32) -> CommKey {
        CommKey {
            hash: meta.hash,
            name: meta.name.clone(),
            rank,
            nranks: meta.nranks.max(0),
        }
    }
}

/// Queued transfers per link and interval checked for a clean gap: enough for a wire rate.
const MAX_GAPS: usize = 1024;

/// The NIC a communicator's transfers go through: its GPU's (a rail-optimised node gives each
/// GPU its own NIC), or the process's one when the GPU is unknown. Idle and clean are judged
/// per NIC ([`Timeline`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Nic(Option<String>);

impl Nic {
    fn of(gpu: &Gpu) -> Nic {
        Nic(gpu.uuid.clone().or_else(|| gpu.pci_bus_id.clone()))
    }
}

/// A link's transfers in the interval so far.
#[derive(Clone, Debug, Default)]
struct LinkTotals {
    bytes: u64,
    transfers: u64,
    queue: Queue,
    /// The NIC of the communicator that saw it.
    nic: Nic,
    /// Openers of its busy periods, with the rank of the communicator that saw them (their
    /// channel's).
    openers: Vec<(Opener, i32)>,
    /// Its queued transfers' gaps, the first [`MAX_GAPS`].
    gaps: Vec<Gap>,
}

/// A link's figures for the interval.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkFigures {
    /// The sending side.
    pub comm: CommKey,
    /// The receiving rank.
    pub peer: i32,
    /// Transfers in the interval.
    pub transfers: u64,
    /// What they say about the link.
    pub fit: LinkFit,
}

/// A channel's figures for the interval.
#[derive(Clone, Debug, PartialEq)]
pub struct ChannelFigures {
    /// The communicator, about our rank.
    pub comm: CommKey,
    /// Channel id.
    pub channel: u8,
    /// Latency of its idle transfers' fit, seconds; `None` without a fit.
    pub latency: Option<f64>,
}

/// Why a link has no latency in an interval whose ProxyStep detail was shed (overload): a
/// transfer the plugin did not see may have been in flight, so no transfer is known idle.
pub const SHED: &str = "shed";

/// The figures of one closed interval.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Figures {
    /// Every link with transfers in the interval, sorted by key.
    pub links: Vec<LinkFigures>,
    /// Every channel with transfers in the interval, sorted by key.
    pub channels: Vec<ChannelFigures>,
    /// Every communicator with operations in the interval: the fraction of them timed (in the
    /// sample), sorted by key.
    pub sampling: Vec<(CommKey, f64)>,
}

/// The interval being collected: each link's and channel's transfers merged across windows.
#[derive(Debug)]
pub struct Interval {
    mode: Mode,
    links: BTreeMap<(CommKey, i32), LinkTotals>,
    channels: BTreeMap<(CommKey, u8), Samples>,
    /// Each communicator's queue (by hash and our rank), kept across intervals.
    orders: BTreeMap<(u64, i32), Order>,
    timelines: BTreeMap<Nic, Timeline>,
    /// Per communicator: operations timed (in the sample) and operations counted.
    sampling: BTreeMap<CommKey, (u64, u64)>,
}

impl Interval {
    /// An empty interval whose fits use `mode`.
    pub fn new(mode: Mode) -> Interval {
        Interval {
            mode,
            links: BTreeMap::new(),
            channels: BTreeMap::new(),
            orders: BTreeMap::new(),
            timelines: BTreeMap::new(),
            sampling: BTreeMap::new(),
        }
    }

    /// The queue wait and service time of each of `s`'s operations ([`Order::split`]), in
    /// enqueue order after every operation of its communicator split before.
    pub fn split(&mut self, s: &WindowSummary) -> Vec<Split> {
        self.orders.entry((s.comm.hash, s.comm.rank)).or_default().split(s)
    }

    /// Merges one window's links, channels and operation counts into the interval.
    pub fn add(&mut self, s: &WindowSummary) {
        let ops = s.colls.iter().flat_map(|g| &g.ops).chain(s.p2ps.iter().flat_map(|g| &g.ops));
        let (timed, recorded) = ops.fold((0, 0), |(t, n), o| (t + u64::from(o.sample.weight() > 0), n + 1));
        let all = recorded + s.counted.iter().map(|c| c.ops).sum::<u64>();
        if all > 0 {
            let entry = self.sampling.entry(CommKey::new(&s.comm, s.comm.rank)).or_default();
            (entry.0, entry.1) = (entry.0 + timed, entry.1 + all);
        }
        let nic = Nic::of(&s.comm.gpu);
        let timeline = self.timelines.entry(nic.clone()).or_default();
        for l in &s.links {
            let link = self.links.entry((CommKey::new(&s.comm, l.rank), l.peer)).or_default();
            link.bytes = link.bytes.saturating_add(l.bytes);
            link.transfers += l.transfers;
            link.queue.merge(&l.queue);
            link.nic.clone_from(&nic);
            if timeline.add(&l.queue.spans, &l.queue.stops) {
                let t = &*timeline;
                let openers = l.queue.openers.iter().filter(|o| t.candidate(o.sent, o.sent));
                link.openers.extend(openers.map(|&o| (o, s.comm.rank)));
                let room = MAX_GAPS.saturating_sub(link.gaps.len());
                link.gaps.extend(l.queue.gaps.iter().filter(|g| t.candidate(g.around.0, g.around.1)).take(room));
            }
        }
        for c in &s.channels {
            let key = (CommKey::new(&s.comm, s.comm.rank), c.channel);
            self.channels.entry(key).or_default();
        }
    }

    /// Ends the interval: its figures, and an empty interval in its place. With `shed` (ProxyStep
    /// detail was shed during the interval: some transfers went unrecorded), its links and
    /// channels get no latency, bandwidth or R² (reason [`SHED`]).
    pub fn close(&mut self, shed: bool) -> Figures {
        let mode = self.mode;
        let checks: BTreeMap<Nic, Check> = self.timelines.iter_mut().map(|(n, t)| (n.clone(), t.close())).collect();
        let links = std::mem::take(&mut self.links)
            .into_iter()
            .map(|((comm, peer), mut link)| {
                let check = &checks[&link.nic];
                // Idle transfers only are latency samples, of their link and their channel.
                for (o, rank) in link.openers.iter().filter(|(o, _)| check.idle(o.sent)) {
                    link.queue.idle.push(o.bytes, o.secs);
                    let key = (CommKey { rank: *rank, ..comm.clone() }, o.channel);
                    self.channels.entry(key).or_default().push(o.bytes, o.secs);
                }
                for g in link.gaps.iter().filter(|g| check.clean(g.around, g.own)) {
                    link.queue.clean.add(g);
                }
                let mut fit = link.queue.fit(link.bytes, link.transfers, mode);
                if shed {
                    (fit.latency, fit.bandwidth, fit.r2, fit.missing) = (None, None, None, Some(SHED));
                }
                LinkFigures {
                    fit,
                    comm,
                    peer,
                    transfers: link.transfers,
                }
            })
            .collect();
        let channels = std::mem::take(&mut self.channels)
            .into_iter()
            .map(|((comm, channel), samples)| ChannelFigures {
                comm,
                channel,
                latency: samples.fit(mode).and_then(|f| f.latency()).filter(|_| !shed),
            })
            .collect();
        let sampling = std::mem::take(&mut self.sampling)
            .into_iter()
            .map(|(comm, (timed, all))| (comm, timed as f64 / all as f64))
            .collect();
        Figures {
            links,
            channels,
            sampling,
        }
    }
}

/// How a group of operations' sizes turn into bandwidths, as nccl-tests defines them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scale {
    /// Whether their size is known (else no bytes and no bandwidth).
    pub sized: bool,
    /// Algorithm to bus bandwidth; `None` when the communicator's size is unknown.
    bus_factor: Option<f64>,
}

impl Scale {
    /// Collectives of kind `key` in a communicator of `nranks`.
    pub fn coll(key: &CollKey, nranks: i32) -> Scale {
        Scale {
            sized: key.size_class != UNKNOWN_CLASS,
            bus_factor: bus_factor(key.func, nranks),
        }
    }

    /// Sends in a communicator of `nranks`.
    pub fn send(nranks: i32) -> Scale {
        Scale {
            sized: true,
            bus_factor: bus_factor(Func::Send, nranks),
        }
    }

    /// Algorithm and bus bandwidth (bytes per second) of `bytes` moved in `secs`; `None` without
    /// a size or a time (a zero time is clock granularity), no bus bandwidth without its factor.
    pub fn bandwidths(&self, bytes: u64, secs: f64) -> Option<(f64, Option<f64>)> {
        if !self.sized || secs <= 0.0 {
            return None;
        }
        let alg = bytes as f64 / secs;
        Some((alg, self.bus_factor.map(|f| alg * f)))
    }

    /// nccl-tests' bus bytes of an operation of `bytes` (`bytes` × bus factor): what, summed and
    /// divided by the summed time of back-to-back operations, is nccl-tests' busBw; `None`
    /// without a size or a factor.
    pub fn bus_bytes(&self, bytes: u64) -> Option<f64> {
        self.bus_factor.filter(|_| self.sized).map(|f| bytes as f64 * f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::{LinkGroup, WindowStats};

    fn summary(rank: i32, links: Vec<LinkGroup>) -> WindowSummary {
        WindowSummary {
            comm: CommMeta {
                hash: 7,
                name: "c".into(),
                rank,
                nranks: 4,
                nnodes: 1,
                gpu: Default::default(),
            },
            colls: Vec::new(),
            p2ps: Vec::new(),
            links,
            channels: Vec::new(),
            phases: Default::default(),
            stats: WindowStats::default(),
            counted: Vec::new(),
        }
    }

    fn key() -> CollKey {
        CollKey {
            func: Func::AllReduce,
            algo: crate::record::Algo::Ring,
            proto: crate::record::Proto::Simple,
            datatype: crate::record::Datatype::Float32,
            size_class: 10,
            tag: 0,
            graph: None,
        }
    }

    fn link(rank: i32, bytes: u64) -> LinkGroup {
        let mut queue = Queue::default();
        queue.idle.push(bytes, 1e-5);
        queue.busy = 1e-5;
        LinkGroup {
            rank,
            peer: 1,
            bytes,
            transfers: 1,
            queue,
        }
    }

    /// Windows of one link merge, whichever local communicator saw them: a link is named by its
    /// sending rank, not by ours.
    #[test]
    fn windows_of_one_link_merge_and_the_interval_starts_over() {
        let mut interval = Interval::new(Mode::Avg);
        interval.add(&summary(0, vec![link(5, 1024)]));
        interval.add(&summary(2, vec![link(5, 2048)]));
        let figures = interval.close(false);
        assert_eq!(figures.links.len(), 1);
        let l = &figures.links[0];
        assert_eq!((l.comm.rank, l.peer, l.transfers), (5, 1, 2));
        assert_eq!(l.fit.throughput, Some(3072.0 / 2e-5));
        assert_eq!(interval.close(false), Figures::default());
    }

    /// A link's transfer that found its own link idle is no latency sample while another
    /// communicator's link on the same NIC (GPU) had one in flight; one on another GPU's NIC
    /// does not count.
    #[test]
    fn idle_means_idle_across_communicators_of_one_nic() {
        use crate::aggregate::queue::{Step, analyze};
        // 5 ticks of latency, 10 bytes per tick.
        let step = |sent, stop| Step {
            sent,
            stop,
            bytes: 10 * (stop - sent - 5),
            tag: 0,
        };
        let queue = |steps: &mut [Step]| analyze(steps, 1e-6, |_| 3);
        let with = |rank, hash, queue| {
            let mut s = summary(rank, vec![LinkGroup {
                rank,
                peer: 1,
                bytes: 0,
                transfers: 2,
                queue,
            }]);
            s.comm.hash = hash;
            s
        };
        let mut interval = Interval::new(Mode::Avg);
        // Communicator 7: its link idle at 0 and at 100, when 8's transfer sent at 90 is in
        // flight: one idle size, no fit. Without 8, two sizes fit.
        interval.add(&with(0, 7, queue(&mut [step(0, 30), step(100, 140)])));
        interval.add(&with(0, 8, queue(&mut [step(90, 150)])));
        let figures = interval.close(false);
        let missing = |hash| figures.links.iter().find(|l| l.comm.hash == hash).unwrap().fit.missing;
        assert_eq!((missing(7), missing(8)), (Some("one_size"), Some("one_size")));
        assert_eq!(figures.channels.len(), 2, "channel 3 of each");
        interval.add(&with(0, 7, queue(&mut [step(1000, 1030), step(1100, 1140)])));
        let alone = interval.close(false);
        assert_eq!(alone.links[0].fit.missing, None, "{alone:?}");
        // 8 on another GPU: its transfer shares no NIC with 7's.
        interval.add(&with(0, 7, queue(&mut [step(2000, 2030), step(2100, 2140)])));
        let mut other = with(0, 8, queue(&mut [step(2090, 2150)]));
        other.comm.gpu.uuid = Some("GPU-other".into());
        interval.add(&other);
        let apart = interval.close(false);
        let seven = apart.links.iter().find(|l| l.comm.hash == 7).unwrap();
        assert_eq!(seven.fit.missing, None, "{apart:?}");
    }

    /// An interval whose ProxyStep detail was shed: links keep their throughput, lose their
    /// latency, bandwidth and R² (reason `shed`), and only for that interval; the sampling ratio
    /// is timed operations over every operation, counted-only ones included.
    #[test]
    fn shed_detail_hides_link_fits_and_the_ratio_counts_every_operation() {
        use crate::aggregate::summary::{CollGroup, OpSample, Waits};
        use crate::record::counted::Counted;
        use crate::record::sample::{Role, Sample};
        let op = |role| OpSample {
            bytes: 1024,
            start: 0.0,
            duration: Some(1.0),
            gpu: None,
            transfers: 0,
            waits: Waits::default(),
            sample: Sample::new(2, role, 0),
            bare: true,
        };
        let mut interval = Interval::new(Mode::Avg);
        let mut s = summary(0, vec![link(0, 1024)]);
        s.stats.bare_ops = 1;
        s.colls = vec![CollGroup {
            key: key(),
            ops: vec![op(Role::Predecessor), op(Role::Timed)],
            transfers: Vec::new(),
        }];
        s.counted = vec![Counted {
            key: None,
            ops: 6,
            bytes: 60,
        }];
        interval.add(&s);
        let f = interval.close(true);
        let fit = f.links[0].fit;
        assert_eq!((fit.latency, fit.bandwidth, fit.r2, fit.missing), (None, None, None, Some(SHED)));
        assert!(fit.throughput.is_some());
        assert_eq!(f.sampling, vec![(CommKey::new(&s.comm, 0), 0.125)]);
        interval.add(&summary(0, vec![link(0, 1024)]));
        let f = interval.close(false);
        assert_ne!(f.links[0].fit.missing, Some(SHED));
        assert!(f.sampling.is_empty(), "no operations: no ratio");
    }

    #[test]
    fn bandwidths_need_a_size_and_a_time() {
        let sized = Scale::send(2);
        assert_eq!(sized.bandwidths(1000, 0.5), Some((2000.0, Some(2000.0))));
        assert_eq!(sized.bandwidths(1000, 0.0), None);
        let unknown = Scale {
            sized: false,
            bus_factor: Some(1.0),
        };
        assert_eq!(unknown.bandwidths(1000, 0.5), None);
        let no_factor = Scale {
            sized: true,
            bus_factor: None,
        };
        assert_eq!(no_factor.bandwidths(1000, 0.5), Some((2000.0, None)));
        assert_eq!((no_factor.bus_bytes(1000), unknown.bus_bytes(1000)), (None, None));
        assert_eq!(Scale::coll(&key(), 4).bus_bytes(1000), Some(1500.0), "AllReduce: 2(n−1)/n");
    }
}

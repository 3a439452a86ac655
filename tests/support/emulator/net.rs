//! The modelled network: a latency and a bandwidth per ordered rank pair (world ranks), nodes of
//! `ranks_per_node` consecutive ranks, and optional jitter.
//!
//! A send step takes `bytes / bandwidth` on the wire (once the wire is free) and stops `latency`
//! after, both times `1 + jitter·u`
//! with `u` uniform in [-1, 1]. Jitter is antithetic: per (link, size) every second draw is the
//! negation of the one before, so the mean error of equal-sized transfers on a link cancels
//! exactly and fits stay unbiased with a few dozen samples. Links between ranks of one node
//! carry no network transfers (no ProxyOps, spec 3.12); work there takes `bytes /
//! gpu_bandwidth` on the GPU.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use super::host::Rng;

/// One direction of a rank pair.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// Time of a zero-byte transfer.
    pub latency: Duration,
    /// Bytes per second.
    pub bandwidth: f64,
}

impl Link {
    pub fn new(latency: Duration, bandwidth: f64) -> Link {
        assert!(bandwidth > 0.0 && bandwidth.is_finite(), "bandwidth {bandwidth}");
        Link { latency, bandwidth }
    }

    /// A link from microseconds and gigabytes (10^9 bytes) per second.
    pub fn new_us(latency_us: f64, gbytes_per_s: f64) -> Link {
        Link::new(Duration::from_secs_f64(latency_us * 1e-6), gbytes_per_s * 1e9)
    }

    /// `latency + bytes / bandwidth`.
    pub fn transfer(&self, bytes: u64) -> Duration {
        self.latency + self.wire(bytes)
    }

    /// `bytes / bandwidth`: how long the transfer occupies the link after its latency.
    pub fn wire(&self, bytes: u64) -> Duration {
        Duration::from_secs_f64(bytes as f64 / self.bandwidth)
    }

    /// The same link `factor` times slower: latency × factor, bandwidth / factor.
    pub fn slower(&self, factor: f64) -> Link {
        Link::new(self.latency.mul_f64(factor), self.bandwidth / factor)
    }
}

/// Ranks, nodes and links.
#[derive(Clone, Debug)]
pub struct Network {
    /// World size.
    pub ranks: usize,
    /// Consecutive world ranks per node; transfers between nodes go over the network.
    pub ranks_per_node: usize,
    /// Link of every pair not in `links`.
    pub default_link: Link,
    /// Per ordered (src, dst) world rank pair.
    pub links: BTreeMap<(usize, usize), Link>,
    /// Relative jitter of each transfer time, 0 = none.
    pub jitter: f64,
    /// Seed of the jitter draws.
    pub seed: u64,
    /// GPU copy/reduce speed, bytes per second: intra-node work and step production.
    pub gpu_bandwidth: f64,
    /// Links slower for a while ([`Network::degrade`]).
    pub degraded: Vec<Degrade>,
}

/// Links made slower for a while: a link, or every link from or to a node's ranks (its NIC).
/// An operation planned while it holds runs at the slower speed throughout.
#[derive(Clone, Copy, Debug)]
pub struct Degrade {
    pub links: Links,
    pub factor: f64,
    pub from: Instant,
    pub until: Instant,
    /// Flapping: slow for the first `.0` of every `.1` from `from` on.
    pub flap: Option<(Duration, Duration)>,
}

/// Which links a [`Degrade`] slows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Links {
    /// `src → dst` (world ranks).
    One(usize, usize),
    /// Every link from or to a rank of this node.
    Node(usize),
}

impl Degrade {
    /// Whether it slows `src → dst` of `net` at `t`.
    fn holds(&self, net: &Network, src: usize, dst: usize, t: Instant) -> bool {
        let on = match self.flap {
            _ if t < self.from || t >= self.until => false,
            Some((on, period)) => {
                let into = (t - self.from).as_nanos() % period.as_nanos().max(1);
                into < on.as_nanos()
            }
            None => true,
        };
        on && match self.links {
            Links::One(s, d) => (s, d) == (src, dst),
            Links::Node(n) => net.node(src) == n || net.node(dst) == n,
        }
    }
}

impl Network {
    pub fn new(ranks: usize, ranks_per_node: usize, link: Link) -> Network {
        assert!(ranks > 0 && ranks_per_node > 0);
        Network {
            ranks,
            ranks_per_node,
            default_link: link,
            links: BTreeMap::new(),
            jitter: 0.0,
            seed: 0x5eed,
            gpu_bandwidth: 200e9,
            degraded: Vec::new(),
        }
    }

    /// Sets the link `src → dst`.
    pub fn with_link(mut self, src: usize, dst: usize, link: Link) -> Network {
        self.links.insert((src, dst), link);
        self
    }

    /// Makes `src → dst` `factor` times slower than it is now.
    pub fn slow_link(self, src: usize, dst: usize, factor: f64) -> Network {
        let link = self.link(src, dst).slower(factor);
        self.with_link(src, dst, link)
    }

    /// Sets every link with `f(src, dst)`.
    pub fn with_links(mut self, f: impl Fn(usize, usize) -> Link) -> Network {
        for s in 0..self.ranks {
            for d in (0..self.ranks).filter(|&d| d != s) {
                self.links.insert((s, d), f(s, d));
            }
        }
        self
    }

    /// Relative jitter (0.05 = ±5 %) of every transfer time.
    pub fn with_jitter(mut self, fraction: f64) -> Network {
        assert!((0.0..1.0).contains(&fraction));
        self.jitter = fraction;
        self
    }

    pub fn with_seed(mut self, seed: u64) -> Network {
        self.seed = seed;
        self
    }

    /// Adds `d`: its links are slower while it holds.
    pub fn degrade(mut self, d: Degrade) -> Network {
        self.degraded.push(d);
        self
    }

    /// The link `src → dst` now: as configured, slower while a [`Degrade`] holds.
    pub fn link(&self, src: usize, dst: usize) -> Link {
        let link = self.links.get(&(src, dst)).copied().unwrap_or(self.default_link);
        let now = Instant::now();
        self.degraded
            .iter()
            .filter(|d| d.holds(self, src, dst, now))
            .fold(link, |l, d| l.slower(d.factor))
    }

    pub fn node(&self, rank: usize) -> usize {
        rank / self.ranks_per_node
    }

    /// Whether `src → dst` goes over the network (different nodes).
    pub fn is_net(&self, src: usize, dst: usize) -> bool {
        self.node(src) != self.node(dst)
    }

    /// Number of distinct nodes among `ranks` (NCCL's `nNodes` of a communicator).
    pub fn nodes(&self, ranks: &[usize]) -> usize {
        let mut nodes: Vec<usize> = ranks.iter().map(|&r| self.node(r)).collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes.len()
    }

    /// GPU time to produce or consume `bytes`.
    pub fn gpu_time(&self, bytes: u64) -> Duration {
        Duration::from_secs_f64(bytes as f64 / self.gpu_bandwidth)
    }
}

/// Jitter draws of one proxy thread.
pub struct Jitter {
    fraction: f64,
    rng: Rng,
    pending: HashMap<(usize, usize, u64), f64>,
}

impl Jitter {
    pub fn new(net: &Network, stream: u64) -> Jitter {
        Jitter {
            fraction: net.jitter,
            rng: Rng::new(net.seed, stream),
            pending: HashMap::new(),
        }
    }

    /// The factor for the next transfer of `bytes` on `src → dst`.
    pub fn factor(&mut self, src: usize, dst: usize, bytes: u64) -> f64 {
        if self.fraction == 0.0 {
            return 1.0;
        }
        let u = match self.pending.remove(&(src, dst, bytes)) {
            Some(u) => -u,
            None => {
                let u = self.uniform();
                self.pending.insert((src, dst, bytes), u);
                u
            }
        };
        1.0 + self.fraction * u
    }

    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f64 {
        self.rng.unit() * 2.0 - 1.0
    }
}

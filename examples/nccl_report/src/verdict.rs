//! The culprits the Prometheus rules' alerts name (`docs/prometheus/nccl-rules.yml`), named over
//! a whole run with the same mapping and thresholds (`src/culprit.rs`):
//!
//! - hangs, from every `nccl.progress.hang.stuck` sample: a rank stuck on itself, the waiting end
//!   of crossed waits and the common end of [`NIC_LINKS`] stuck links are hung ranks, another
//!   link stuck on the network a hung link, and a rank waited on for [`ABSENT_SECS`] that
//!   reported no hang meanwhile an absent rank; ranks waiting on a peer are victims;
//! - slow links and hosts, from each link's median `nccl.link.throughput` against its
//!   communicator's fast links ([`FAST_LINKS`]);
//! - stragglers, from the median of the waits for each rank (`nccl.progress.peer_wait`, every
//!   sender and function), their share of the collectives' service time and the communicator's
//!   median rank.
//!
//! Where the rules read the last 15 s, this reads the run: a communicator that hung is left to
//! its hang culprits (the rules skip it for a minute after a hang). Included by `nccl_report` and
//! by `tests/signals/`, which checks that it names what the alerts name; it reaches the OTLP
//! reader and the vocabulary as `super::otlp_receiver` and `super::culprit`. Single-threaded.

use std::collections::{BTreeMap, BTreeSet};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest as Request;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::metrics::v1::{AggregationTemporality, metric::Data};

use super::culprit::*;
use super::otlp_receiver::{attrs, metrics, points};

/// A point's attributes.
type Attrs = BTreeMap<String, String>;

/// A culprit, as its alert names it.
#[derive(Clone, Debug, PartialEq)]
pub struct Culprit {
    /// The alert that names it.
    pub alert: Alert,
    /// Its communicator (`nccl.comm.hash`); empty for a host.
    pub hash: String,
    /// The communicator's name (`nccl.comm.name`).
    pub comm: String,
    /// Its rank in the communicator (a link's sender); empty for a host.
    pub rank: String,
    /// A link's receiving rank.
    pub peer: Option<String>,
    /// Where a hung rank hangs.
    pub wait: Option<Wait>,
    /// A slow host.
    pub host: Option<String>,
    /// What names it.
    pub figure: Figure,
}

/// The figure an alert names a culprit by.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Figure {
    /// Hung or absent: the longest time without progress, or waited on, seconds.
    Stuck(f64),
    /// A straggler: the median wait for it (s), its share of the collective time, and how many
    /// times the communicator's median rank's wait it is.
    Waits { median: f64, share: f64, times: f64 },
    /// A slow link: its throughput over its communicator's fast links.
    Ratio(f64),
    /// A slow host: its slow link ends, and all of them.
    Ends { slow: usize, of: usize },
}

/// One `nccl.progress.hang.stuck` sample.
#[derive(Clone, Debug)]
pub struct Stuck {
    /// The reporting rank's communicator (hash and name) and rank.
    pub hash: String,
    pub comm: String,
    pub rank: String,
    /// What it waits for, and on which peer.
    pub wait: Wait,
    pub peer: Option<String>,
    /// Seconds without progress (0: the episode ended).
    pub secs: f64,
    /// When it was collected (ns since the epoch).
    pub time: u64,
}

/// Every culprit the alerts would name over the run of `requests`: hangs first, then slow hosts,
/// slow links and stragglers.
pub fn culprits(requests: &[Request]) -> Vec<Culprit> {
    let stuck = stuck(requests);
    let mut out = hung(&stuck);
    let hung: BTreeSet<&str> = stuck.iter().filter(|s| s.secs > 0.0).map(|s| s.hash.as_str()).collect();
    let members = members(requests);
    let links = links(requests, &hung);
    out.extend(slow(&links, &members));
    out.extend(stragglers(requests, &hung, &links, &members));
    out
}

/// Every stuck sample of the requests.
pub fn stuck(requests: &[Request]) -> Vec<Stuck> {
    let mut out = Vec::new();
    for m in metrics(requests)
        .into_iter()
        .filter(|m| m.name == "nccl.progress.hang.stuck")
    {
        for p in points(m) {
            let Some(wait) = p.attrs.get("nccl.wait").and_then(|w| Wait::parse(w)) else {
                continue;
            };
            out.push(Stuck {
                hash: get(&p.attrs, "nccl.comm.hash"),
                comm: get(&p.attrs, "nccl.comm.name"),
                rank: get(&p.attrs, "nccl.rank"),
                wait,
                peer: p.attrs.get("nccl.peer").cloned(),
                secs: p.value,
                time: p.time,
            });
        }
    }
    out
}

fn get(attrs: &Attrs, key: &str) -> String {
    attrs.get(key).cloned().unwrap_or_default()
}

/// A stuck sample's (communicator, rank, wait, peer).
type Key<'a> = (&'a str, &'a str, Wait, Option<&'a str>);

/// The hang culprits of `stuck` (`nccl:culprit:hung_rank`, `hung_link`, `absent_rank`).
pub fn hung(stuck: &[Stuck]) -> Vec<Culprit> {
    // (hash, rank, wait, peer) → (communicator name, longest time).
    let mut longest: BTreeMap<Key, (&str, f64)> = BTreeMap::new();
    for s in stuck.iter().filter(|s| s.secs > 0.0) {
        let e = longest
            .entry((&s.hash, &s.rank, s.wait, s.peer.as_deref()))
            .or_insert((&s.comm, 0.0));
        e.1 = e.1.max(s.secs);
    }
    let culprit = |alert, (hash, comm): (&str, &str), rank: &str, figure| Culprit {
        alert,
        hash: hash.to_owned(),
        comm: comm.to_owned(),
        rank: rank.to_owned(),
        peer: None,
        wait: None,
        host: None,
        figure: Figure::Stuck(figure),
    };
    // Hung ranks by (hash, rank, where), the longest time.
    let mut ranks: BTreeMap<(&str, &str, Wait), (&str, f64)> = BTreeMap::new();
    let mut hang = |hash, rank, wait, comm, secs: f64| {
        let e = ranks.entry((hash, rank, wait)).or_insert((comm, 0.0));
        e.1 = e.1.max(secs);
    };
    let mut ends: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for (&(hash, rank, wait, peer), &(comm, secs)) in &longest {
        match (wait.blame(), peer) {
            (Blame::Itself, _) => hang(hash, rank, wait, comm, secs),
            (Blame::Peer, Some(p)) if wait == CROSSED.0 && longest.contains_key(&(hash, p, CROSSED.1, Some(rank))) => {
                hang(hash, rank, CROSSED_WHERE, comm, secs)
            }
            (Blame::Link, Some(p)) => {
                *ends.entry((hash, rank)).or_default() += 1;
                *ends.entry((hash, p)).or_default() += 1;
            }
            _ => {}
        }
    }
    let nic = |hash, rank| ends.get(&(hash, rank)).is_some_and(|n| *n >= NIC_LINKS);
    let mut links = Vec::new();
    for (&(hash, rank, wait, peer), &(comm, secs)) in &longest {
        let Some(p) = peer.filter(|_| wait.blame() == Blame::Link) else {
            continue;
        };
        for end in [rank, p].into_iter().filter(|&end| nic(hash, end)) {
            hang(hash, end, Wait::Network, comm, secs);
        }
        if !nic(hash, rank) && !nic(hash, p) {
            links.push(Culprit {
                peer: Some(p.to_owned()),
                ..culprit(Alert::LinkHung, (hash, comm), rank, secs)
            });
        }
    }
    let mut out: Vec<Culprit> = ranks
        .into_iter()
        .map(|((hash, rank, wait), (comm, secs))| Culprit {
            wait: Some(wait),
            ..culprit(Alert::RankHung, (hash, comm), rank, secs)
        })
        .collect();
    out.extend(links);
    // Absent: the longest wait on each peer, when it reported no hang while waited on.
    let mut waited: BTreeMap<(&str, &str), &Stuck> = BTreeMap::new();
    for s in stuck.iter().filter(|s| s.wait.blame() == Blame::Peer) {
        if let Some(p) = s.peer.as_deref() {
            let e = waited.entry((&s.hash, p)).or_insert(s);
            if s.secs > e.secs {
                *e = s;
            }
        }
    }
    for ((hash, peer), s) in waited.into_iter().filter(|(_, s)| s.secs >= ABSENT_SECS) {
        let since = s.time.saturating_sub((s.secs * 1e9) as u64);
        let reported = stuck
            .iter()
            .any(|o| o.hash == hash && o.rank == peer && (since..=s.time).contains(&o.time));
        if !reported {
            out.push(culprit(Alert::RankAbsent, (hash, &s.comm), peer, s.secs));
        }
    }
    out
}

/// Where each (communicator, rank) runs: its `host.name` (`nccl.comm.member`).
fn members(requests: &[Request]) -> BTreeMap<(String, String), String> {
    let mut out = BTreeMap::new();
    for m in metrics(requests).into_iter().filter(|m| m.name == "nccl.comm.member") {
        for p in points(m) {
            let key = (get(&p.attrs, "nccl.comm.hash"), get(&p.attrs, "nccl.rank"));
            out.insert(key, get(&p.attrs, "host.name"));
        }
    }
    out
}

/// A link of a communicator that did not hang, with its ratio to the communicator's fast links.
#[derive(Debug)]
struct Link {
    hash: String,
    comm: String,
    rank: String,
    peer: String,
    ratio: f64,
}

/// Each link's median throughput over the run against its communicator's fast links
/// (`nccl:link_throughput:ratio`), the communicators in `hung` left out.
fn links(requests: &[Request], hung: &BTreeSet<&str>) -> Vec<Link> {
    let mut samples: BTreeMap<(String, String, String), (String, Vec<f64>)> = BTreeMap::new();
    for m in metrics(requests)
        .into_iter()
        .filter(|m| m.name == "nccl.link.throughput")
    {
        for p in points(m).into_iter().filter(|p| p.value.is_finite()) {
            let hash = get(&p.attrs, "nccl.comm.hash");
            if hung.contains(hash.as_str()) {
                continue;
            }
            let key = (hash, get(&p.attrs, "nccl.rank"), get(&p.attrs, "nccl.peer"));
            let e = samples
                .entry(key)
                .or_insert_with(|| (get(&p.attrs, "nccl.comm.name"), Vec::new()));
            e.1.push(p.value);
        }
    }
    let medians: Vec<((String, String, String), String, f64)> = samples
        .into_iter()
        .map(|(key, (comm, values))| (key, comm, quantile(MEDIAN, values)))
        .collect();
    let mut fast: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for ((hash, ..), _, median) in &medians {
        fast.entry(hash).or_default().push(*median);
    }
    let fast: BTreeMap<&str, f64> = fast.into_iter().map(|(h, v)| (h, quantile(FAST_LINKS, v))).collect();
    medians
        .iter()
        .map(|((hash, rank, peer), comm, median)| Link {
            ratio: median / fast[hash.as_str()],
            hash: hash.clone(),
            comm: comm.clone(),
            rank: rank.clone(),
            peer: peer.clone(),
        })
        .collect()
}

/// Slow hosts and slow links (`nccl:culprit:slow_host`, `slow_link`).
fn slow(links: &[Link], members: &BTreeMap<(String, String), String>) -> Vec<Culprit> {
    // Per host: link ends, slow ones, communicators with slow ones.
    let mut hosts: BTreeMap<&str, (usize, usize, BTreeSet<&str>)> = BTreeMap::new();
    for l in links {
        for end in [&l.rank, &l.peer] {
            let Some(host) = members.get(&(l.hash.clone(), end.clone())) else {
                continue;
            };
            let h = hosts.entry(host.as_str()).or_default();
            h.0 += 1;
            if l.ratio < SLOW_LINK {
                h.1 += 1;
                h.2.insert(&l.hash);
            }
        }
    }
    let mut out: Vec<Culprit> = hosts
        .iter()
        .filter(|(_, (ends, slow, _))| *slow as f64 > SLOW_HOST_SHARE * *ends as f64 && *slow >= SLOW_HOST_ENDS)
        .map(|(host, (ends, slow, _))| Culprit {
            alert: Alert::SlowHost,
            hash: String::new(),
            comm: String::new(),
            rank: String::new(),
            peer: None,
            wait: None,
            host: Some((*host).to_owned()),
            figure: Figure::Ends { slow: *slow, of: *ends },
        })
        .collect();
    let nic = |hash: &str, rank: &str| {
        members
            .get(&(hash.to_owned(), rank.to_owned()))
            .and_then(|host| hosts.get(host.as_str()))
            .is_some_and(|h| h.2.len() >= SLOW_HOST_COMMS)
    };
    for l in links.iter().filter(|l| l.ratio < SLOW_LINK) {
        if !nic(&l.hash, &l.rank) && !nic(&l.hash, &l.peer) {
            out.push(Culprit {
                alert: Alert::SlowLink,
                hash: l.hash.clone(),
                comm: l.comm.clone(),
                rank: l.rank.clone(),
                peer: Some(l.peer.clone()),
                wait: None,
                host: None,
                figure: Figure::Ratio(l.ratio),
            });
        }
    }
    out
}

/// A histogram's buckets: (lower, upper] by their bounds' bits (positive: ordered) → count.
type Buckets = BTreeMap<(u64, u64), u64>;

/// Each histogram `name`'s sum and buckets at the end of the run, per attribute set: the latest
/// point of a cumulative one, the points of a delta one added up.
/// A counter's value per attribute set at the end of `requests`: a cumulative one's latest
/// point, a delta one's points added up.
fn counters(requests: &[Request], name: &str) -> BTreeMap<Attrs, f64> {
    let mut out: BTreeMap<Attrs, f64> = BTreeMap::new();
    for m in metrics(requests).into_iter().filter(|m| m.name == name) {
        let Some(Data::Sum(sum)) = &m.data else {
            continue;
        };
        let delta = sum.aggregation_temporality == AggregationTemporality::Delta as i32;
        for p in points(m) {
            let e = out.entry(p.attrs).or_default();
            *e = if delta { *e + p.value } else { p.value };
        }
    }
    out
}

fn histograms(requests: &[Request], name: &str) -> BTreeMap<Attrs, (f64, Buckets)> {
    let delta = AggregationTemporality::Delta as i32;
    let mut out: BTreeMap<Attrs, (f64, Buckets)> = BTreeMap::new();
    let mut put = |a: &[KeyValue], sum: Option<f64>, buckets: Vec<(f64, f64, u64)>, add: bool| {
        let e = out.entry(attrs(a)).or_default();
        if !add {
            *e = Default::default();
        }
        e.0 += sum.unwrap_or(0.0);
        for (lo, hi, n) in buckets {
            *e.1.entry((lo.to_bits(), hi.to_bits())).or_default() += n;
        }
    };
    for m in metrics(requests).into_iter().filter(|m| m.name == name) {
        match &m.data {
            Some(Data::Histogram(h)) => {
                for p in &h.data_points {
                    let upper = p.explicit_bounds.iter().copied().chain([f64::INFINITY]);
                    let lower = [0.0].into_iter().chain(p.explicit_bounds.iter().copied());
                    let b = lower.zip(upper).zip(&p.bucket_counts).map(|((lo, hi), n)| (lo, hi, *n));
                    put(&p.attributes, p.sum, b.collect(), h.aggregation_temporality == delta);
                }
            }
            Some(Data::ExponentialHistogram(h)) => {
                for p in &h.data_points {
                    let bound = |i: i32| 2f64.powf(f64::from(i) * 2f64.powi(-p.scale));
                    let mut b = vec![(0.0, p.zero_threshold, p.zero_count)];
                    if let Some(pos) = &p.positive {
                        b.extend(pos.bucket_counts.iter().enumerate().map(|(k, n)| {
                            let i = pos.offset + k as i32;
                            (bound(i), bound(i + 1), *n)
                        }));
                    }
                    put(&p.attributes, p.sum, b, h.aggregation_temporality == delta);
                }
            }
            _ => {}
        }
    }
    out
}

/// `histogram_quantile(q, …)` of `buckets`: linear within the bucket of rank `q` × count; the
/// lower bound when that is the `+Inf` bucket; NaN without counts.
pub fn histogram_quantile(q: f64, buckets: &Buckets) -> f64 {
    let total: u64 = buckets.values().sum();
    let rank = q * total as f64;
    let mut sorted: Vec<(f64, f64, u64)> = buckets
        .iter()
        .map(|(&(lo, hi), &n)| (f64::from_bits(lo), f64::from_bits(hi), n))
        .collect();
    sorted.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut below = 0.0;
    for (lo, hi, n) in sorted.into_iter().filter(|b| b.2 > 0) {
        if below + n as f64 >= rank {
            return match hi.is_finite() {
                true => lo + (hi - lo) * (rank - below) / n as f64,
                false => lo,
            };
        }
        below += n as f64;
    }
    f64::NAN
}

/// `quantile(q, …)` of `values`: linear between the two nearest ranks; NaN without values.
pub fn quantile(q: f64, mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let Some(last) = values.len().checked_sub(1) else {
        return f64::NAN;
    };
    let rank = q * last as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    values[lo] + (values[hi] - values[lo]) * (rank - lo as f64)
}

/// Stragglers (`nccl:culprit:straggler`), over the communicators that did not hang, among the
/// ranks with a member series that are no end of a slow link.
fn stragglers(
    requests: &[Request],
    hung: &BTreeSet<&str>,
    links: &[Link],
    members: &BTreeMap<(String, String), String>,
) -> Vec<Culprit> {
    // (hash, peer) → (communicator name, waits' buckets over every sender and function, seconds
    // waited in collectives).
    let mut waits: BTreeMap<(String, String), (String, Buckets, f64)> = BTreeMap::new();
    for (a, (sum, buckets)) in histograms(requests, "nccl.progress.peer_wait") {
        let key = (get(&a, "nccl.comm.hash"), get(&a, "nccl.peer"));
        let e = waits
            .entry(key)
            .or_insert_with(|| (get(&a, "nccl.comm.name"), Buckets::new(), 0.0));
        for (b, n) in buckets {
            *e.1.entry(b).or_default() += n;
        }
        if get(&a, "nccl.func") != "Send" {
            e.2 += sum;
        }
    }
    // hash → each rank's collective service time.
    let mut busy: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for (a, secs) in counters(requests, "nccl.coll.service.time") {
        *busy
            .entry(get(&a, "nccl.comm.hash"))
            .or_default()
            .entry(get(&a, "nccl.rank"))
            .or_default() += secs;
    }
    let medians: BTreeMap<&(String, String), f64> = waits
        .iter()
        .map(|(key, (_, buckets, _))| (key, histogram_quantile(MEDIAN, buckets)))
        .filter(|(_, m)| !m.is_nan())
        .collect();
    let mut per_comm: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for ((hash, _), m) in &medians {
        per_comm.entry(hash).or_default().push(*m);
    }
    let comm_median: BTreeMap<&str, f64> = per_comm.into_iter().map(|(h, v)| (h, quantile(MEDIAN, v))).collect();
    let slow_end = |hash: &str, rank: &str| {
        links
            .iter()
            .any(|l| l.hash == hash && l.ratio < SLOW_LINK && (l.rank == rank || l.peer == rank))
    };
    let mut out = Vec::new();
    for (key @ (hash, peer), median) in medians {
        let Some(ranks) = busy.get(hash).filter(|r| !r.is_empty()) else {
            continue;
        };
        let mean_busy = ranks.values().sum::<f64>() / ranks.len() as f64;
        let share = waits[key].2 / mean_busy;
        let mid = comm_median[hash.as_str()];
        if median > STRAGGLER_WAIT
            && share > STRAGGLER_SHARE
            && median > STRAGGLER_FACTOR * mid
            && members.contains_key(key)
            && !hung.contains(hash.as_str())
            && !slow_end(hash, peer)
        {
            out.push(Culprit {
                alert: Alert::Straggler,
                hash: hash.clone(),
                comm: waits[key].0.clone(),
                rank: peer.clone(),
                peer: None,
                wait: None,
                host: None,
                figure: Figure::Waits {
                    median,
                    share,
                    times: median / mid,
                },
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(rank: &str, wait: Wait, peer: Option<&str>, secs: f64) -> Stuck {
        Stuck {
            hash: "0x1".into(),
            comm: "ring".into(),
            rank: rank.into(),
            wait,
            peer: peer.map(str::to_owned),
            secs,
            time: 100_000_000_000,
        }
    }

    fn named(c: &[Culprit]) -> Vec<(Alert, &str, Option<&str>, Option<Wait>)> {
        c.iter()
            .map(|c| (c.alert, c.rank.as_str(), c.peer.as_deref(), c.wait))
            .collect()
    }

    /// A rank stopped posting: its sender waits on it (`peer`), its receiver for its data
    /// (`recv`), it reports `proxy`: one culprit, the victims none.
    #[test]
    fn a_hung_rank_and_its_victims() {
        let stuck = [
            s("0", Wait::Peer, Some("1"), 3.0),
            s("2", Wait::Recv, Some("1"), 3.0),
            s("1", Wait::Proxy, None, 3.0),
        ];
        assert_eq!(named(&hung(&stuck)), [(Alert::RankHung, "1", None, Some(Wait::Proxy))]);
    }

    /// Crossed waits name the waiting end hung at its proxy; two stuck links of one rank name
    /// its NIC; a lone stuck link names the link.
    #[test]
    fn crossed_waits_common_ends_and_lone_links() {
        let crossed = [s("0", Wait::Peer, Some("1"), 2.0), s("1", Wait::Recv, Some("0"), 2.0)];
        assert_eq!(
            named(&hung(&crossed)),
            [(Alert::RankHung, "0", None, Some(CROSSED_WHERE))]
        );
        let nic = [
            s("0", Wait::Network, Some("1"), 2.0),
            s("1", Wait::Network, Some("2"), 2.0),
        ];
        assert_eq!(named(&hung(&nic)), [(Alert::RankHung, "1", None, Some(Wait::Network))]);
        let link = [s("0", Wait::Network, Some("1"), 2.0)];
        assert_eq!(named(&hung(&link)), [(Alert::LinkHung, "0", Some("1"), None)]);
    }

    /// A rank waited on for the absent threshold that reported nothing meanwhile is absent;
    /// shorter, or reporting a hang itself, it is not.
    #[test]
    fn absent_ranks() {
        let waited = [s("0", Wait::Peer, Some("1"), ABSENT_SECS)];
        assert_eq!(named(&hung(&waited)), [(Alert::RankAbsent, "1", None, None)]);
        let short = [s("0", Wait::Peer, Some("1"), ABSENT_SECS - 1.0)];
        assert!(hung(&short).is_empty());
        let mut reporting = waited.to_vec();
        reporting.push(s("1", Wait::Gpu, None, 1.0));
        assert_eq!(
            named(&hung(&reporting)),
            [(Alert::RankHung, "1", None, Some(Wait::Gpu))]
        );
    }

    /// Prometheus' interpolations.
    #[test]
    fn quantiles() {
        assert_eq!(quantile(0.5, vec![3.0, 1.0, 2.0, 10.0]), 2.5);
        assert_eq!(quantile(0.75, vec![1.0, 2.0, 3.0]), 2.5);
        assert!(quantile(0.5, vec![]).is_nan());
        let b = |lo: f64, hi: f64| (lo.to_bits(), hi.to_bits());
        let buckets = Buckets::from([(b(0.0, 1.0), 2), (b(1.0, 2.0), 2), (b(2.0, f64::INFINITY), 0)]);
        assert_eq!(histogram_quantile(0.75, &buckets), 1.5);
        let inf = Buckets::from([(b(0.0, 1.0), 1), (b(1.0, f64::INFINITY), 3)]);
        assert_eq!(histogram_quantile(0.5, &inf), 1.0);
    }
}

//! Who is behind the figures: the slowest links, hangs and stragglers, each with the rank and
//! host to look at, found by joining `nccl.comm.member` on (communicator, rank). Every line fits
//! 80 columns. Single-threaded.

use std::collections::BTreeMap;

use crate::Request;
use crate::otlp_receiver::{metrics, points};
use crate::report::{Attrs, human_bytes, human_secs, latest};

/// Links listed under the matrix.
const SLOWEST: usize = 3;
/// A straggler keeps its senders waiting longer than this on average (s) …
const STRAGGLER_MIN: f64 = 1e-3;
/// … and this many times the communicator's median rank (as the `NcclStraggler` rule).
const STRAGGLER_FACTOR: f64 = 4.0;

/// Prints `text` line by line, each cut to 80 columns.
pub fn say(text: String) {
    for line in text.lines() {
        match line.char_indices().nth(80) {
            Some((end, _)) => println!("{}…", &line[..line.char_indices().nth(79).map_or(end, |c| c.0)]),
            None => println!("{line}"),
        }
    }
}

fn get<'a>(attrs: &'a Attrs, key: &str) -> &'a str {
    attrs.iter().find(|(k, _)| k == key).map_or("", |(_, v)| v)
}

/// A communicator as `0x… (name)`, from a point's attributes.
fn comm(attrs: &Attrs) -> String {
    match get(attrs, "nccl.comm.name") {
        "" => get(attrs, "nccl.comm.hash").to_owned(),
        name => format!("{} ({name})", get(attrs, "nccl.comm.hash")),
    }
}

/// Where each (communicator hash, rank) runs: its node and global rank.
struct Members(BTreeMap<(String, String), (String, String)>);

impl Members {
    fn new(requests: &[Request]) -> Members {
        let mut out = BTreeMap::new();
        for attrs in latest(requests, "nccl.comm.member").into_keys() {
            let node = match get(&attrs, "job.node_name") {
                "" => get(&attrs, "host.name"),
                node => node,
            };
            let key = (
                get(&attrs, "nccl.comm.hash").to_owned(),
                get(&attrs, "nccl.rank").to_owned(),
            );
            out.insert(key, (node.to_owned(), get(&attrs, "job.rank").to_owned()));
        }
        Members(out)
    }

    /// `rank R (global G) on NODE`, as far as known.
    fn who(&self, hash: &str, rank: &str) -> String {
        match self.0.get(&(hash.to_owned(), rank.to_owned())) {
            Some((node, global)) if !global.is_empty() && global != rank => {
                format!("rank {rank} (global {global}) on {node}")
            }
            Some((node, _)) => format!("rank {rank} on {node}"),
            None => format!("rank {rank} (host unknown: no nccl.comm.member)"),
        }
    }

    fn host(&self, hash: &str, rank: &str) -> String {
        self.0
            .get(&(hash.to_owned(), rank.to_owned()))
            .map_or("?".into(), |(node, _)| node.clone())
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The [`SLOWEST`] links by bandwidth, against the median link, with the hosts at either end:
/// among the links with a latency too, as in the matrix (a bandwidth alone may come from queued
/// transfers that shared the NIC with another link's).
pub fn print_slowest_links(requests: &[Request]) {
    let members = Members::new(requests);
    let latency = latest(requests, "nccl.link.latency");
    let mut links: Vec<(Attrs, f64)> = latest(requests, "nccl.link.bandwidth")
        .into_iter()
        .filter(|(a, p)| p.value.is_finite() && p.value > 0.0 && latency.contains_key(a))
        .map(|(a, p)| (a, p.value))
        .collect();
    if links.is_empty() {
        return;
    }
    let mid = median(links.iter().map(|l| l.1).collect());
    links.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut text = format!(
        "\nSlowest links (of {} measured; median {}/s)\n",
        links.len(),
        human_bytes(mid)
    );
    for (attrs, bw) in links.iter().take(SLOWEST) {
        let (hash, src, dst) = (
            get(attrs, "nccl.comm.hash"),
            get(attrs, "nccl.rank"),
            get(attrs, "nccl.peer"),
        );
        text += &format!(
            "  {src} → {dst}: {}/s, {:.2}× the median, comm {}\n    {} → {}\n",
            human_bytes(*bw),
            bw / mid,
            comm(attrs),
            members.host(hash, src),
            members.host(hash, dst)
        );
    }
    say(text);
}

/// Hang episodes per communicator rank, the longest time stuck on each (wait, peer), and whom
/// that points at.
pub fn print_hangs(requests: &[Request]) {
    let members = Members::new(requests);
    let mut stuck: BTreeMap<Attrs, f64> = BTreeMap::new();
    for m in metrics(requests)
        .into_iter()
        .filter(|m| m.name == "nccl.progress.hang.stuck")
    {
        for p in points(m) {
            let longest = stuck.entry(p.attrs.into_iter().collect()).or_insert(0.0);
            *longest = longest.max(p.value);
        }
    }
    let episodes = latest(requests, "nccl.progress.hang.episodes");
    let mut text = String::from("\nHangs (nccl.progress.hang.*)\n");
    let mut any = false;
    for (attrs, p) in episodes.iter().filter(|(_, p)| p.value > 0.0) {
        any = true;
        let (hash, rank) = (get(attrs, "nccl.comm.hash"), get(attrs, "nccl.rank"));
        text += &format!(
            "  comm {}: {:.0} hang episode(s) on {}\n",
            comm(attrs),
            p.value,
            members.who(hash, rank)
        );
        let mine = stuck
            .iter()
            .filter(|(a, _)| get(a, "nccl.comm.hash") == hash && get(a, "nccl.rank") == rank);
        for (a, secs) in mine.filter(|(_, s)| **s > 0.0) {
            let (wait, peer) = (get(a, "nccl.wait"), get(a, "nccl.peer"));
            let culprit = match wait {
                "network" => format!("the network to {}, or its NIC", members.who(hash, peer)),
                "peer" => format!("{}: behind or stuck", members.who(hash, peer)),
                "recv" => format!("{}: its data does not come", members.who(hash, peer)),
                "proxy" => format!("{} itself: its proxy stopped posting", members.who(hash, rank)),
                "gpu" => format!("{} itself: its GPU", members.who(hash, rank)),
                _ => "unknown (no step events)".into(),
            };
            text += &format!("    stuck up to {secs:.0} s waiting on {wait}\n    culprit: {culprit}\n");
        }
    }
    if !any {
        text += "  none: no communicator reported a hang\n";
    }
    say(text);
}

/// Ranks that keep their senders waiting (`nccl.progress.peer_wait` by `nccl.peer`) longer
/// than [`STRAGGLER_MIN`] on average and [`STRAGGLER_FACTOR`] times their communicator's median
/// rank (3 ranks or more).
pub fn print_stragglers(requests: &[Request]) {
    let members = Members::new(requests);
    // (comm, peer) → (waits, seconds), over every sender and function.
    let mut waits: BTreeMap<(String, String), BTreeMap<String, (u64, f64)>> = BTreeMap::new();
    for (attrs, p) in latest(requests, "nccl.progress.peer_wait") {
        let key = (get(&attrs, "nccl.comm.hash").to_owned(), comm(&attrs));
        let w = waits
            .entry(key)
            .or_default()
            .entry(get(&attrs, "nccl.peer").to_owned())
            .or_default();
        *w = (w.0 + p.count, w.1 + p.value);
    }
    let mut text = String::from("\nStragglers (nccl.progress.peer_wait: how long a rank's senders wait for it)\n");
    let mut any = false;
    for ((hash, name), peers) in &waits {
        let means: BTreeMap<&String, f64> = peers
            .iter()
            .filter(|(_, (n, _))| *n > 0)
            .map(|(peer, (n, secs))| (peer, secs / *n as f64))
            .collect();
        if means.len() < 3 {
            continue;
        }
        let mid = median(means.values().copied().collect());
        for (peer, mean) in means {
            if mean > STRAGGLER_MIN && mean > STRAGGLER_FACTOR * mid {
                any = true;
                text += &format!(
                    "  comm {name}: senders waited {} on average for\n    \
                     {} ({:.1}× the median rank's {})\n",
                    human_secs(mean),
                    members.who(hash, peer),
                    mean / mid,
                    human_secs(mid)
                );
            }
        }
    }
    if !any {
        text += &format!(
            "  none: no rank kept its senders waiting over {} and {STRAGGLER_FACTOR}× the\n  \
             median rank\n",
            human_secs(STRAGGLER_MIN)
        );
    }
    say(text);
}

//! Who is behind the figures: the slowest links, hangs with what each rank waits for, and the
//! culprits the alerts would name ([`verdict`]), each with the rank and host to look at, found by
//! joining `nccl.comm.member` on (communicator, rank). Every line fits 80 columns.
//! Single-threaded.

use std::collections::BTreeMap;

use crate::Request;
use crate::culprit::{Alert, Blame, MEDIAN, SLOW_LINK, STRAGGLER_FACTOR, STRAGGLER_SHARE, STRAGGLER_WAIT, Wait};
use crate::report::{Attrs, human_bytes, human_secs, latest};
use crate::verdict::{self, Culprit, Figure};

/// Links listed under the matrix.
const SLOWEST: usize = 3;

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
    let mid = verdict::quantile(MEDIAN, links.iter().map(|l| l.1).collect());
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
    let stuck = verdict::stuck(requests);
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
        let mut longest: BTreeMap<(Wait, &str), f64> = BTreeMap::new();
        for s in stuck
            .iter()
            .filter(|s| s.hash == hash && s.rank == rank && s.secs > 0.0)
        {
            let e = longest.entry((s.wait, s.peer.as_deref().unwrap_or(""))).or_default();
            *e = e.max(s.secs);
        }
        for ((wait, peer), secs) in longest {
            let blames = match wait.blame() {
                Blame::Peer => format!("{} (this rank is a victim)", members.who(hash, peer)),
                Blame::Itself => format!("{} itself", members.who(hash, rank)),
                Blame::Link => format!("the link to {}, or a NIC", members.who(hash, peer)),
            };
            text += &format!(
                "    stuck up to {secs:.0} s waiting on {}\n    points at {blames}\n",
                wait.as_str()
            );
        }
    }
    if !any {
        text += "  none: no communicator reported a hang\n";
    }
    say(text);
}

/// The culprits the alerts would name over the run ([`verdict::culprits`]).
pub fn print_culprits(requests: &[Request]) {
    let members = Members::new(requests);
    let mut text = String::from("\nCulprits (what the alerts of docs/prometheus name, over the run)\n");
    let culprits = verdict::culprits(requests);
    for c in &culprits {
        text += &format!("  {}: {}\n", c.alert.name(), culprit(c, &members));
    }
    if culprits.is_empty() {
        text += &format!(
            "  none: no hang; no link below {:.0} % of its communicator's fast\n  links; \
             no rank kept its senders waiting over {} (median),\n  {:.0} % of their \
             service time and {STRAGGLER_FACTOR}× the median rank\n",
            SLOW_LINK * 100.0,
            human_secs(STRAGGLER_WAIT),
            STRAGGLER_SHARE * 100.0,
        );
    }
    say(text);
}

/// One culprit in words, on two lines.
fn culprit(c: &Culprit, members: &Members) -> String {
    let comm = match c.comm.as_str() {
        "" => c.hash.clone(),
        name => format!("{} ({name})", c.hash),
    };
    let who = members.who(&c.hash, &c.rank);
    let peer = || members.who(&c.hash, c.peer.as_deref().unwrap_or("?"));
    match c.figure {
        Figure::Ends { slow, of } => {
            let host = c.host.as_deref().unwrap_or("?");
            format!("host {host}\n    {slow} of its {of} link ends are slow (its NIC)")
        }
        Figure::Waits { median, share, times } => format!(
            "{who}, comm {comm}\n    its senders wait {} (median), {:.0} % of their\n    \
             collective time, {times:.1}× the communicator's median rank",
            human_secs(median),
            share * 100.0
        ),
        Figure::Ratio(ratio) => format!(
            "{who} → {}, comm {comm}\n    {ratio:.2}× its communicator's fast links",
            peer()
        ),
        Figure::Stuck(secs) => match c.alert {
            Alert::LinkHung => format!(
                "{who} → {}, comm {comm}\n    stuck on the network up to {secs:.0} s",
                peer()
            ),
            Alert::RankAbsent => format!("{who}, comm {comm}\n    waited on up to {secs:.0} s, no hang of its own"),
            _ => format!(
                "{who}, comm {comm}\n    hung ({}) up to {secs:.0} s",
                c.wait.map_or("?", Wait::as_str)
            ),
        },
    }
}

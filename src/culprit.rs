//! The culprit vocabulary, defined once: what a stuck channel waits for (the `nccl.wait` values
//! the plugin exports and its hang diagnosis names), whom each wait blames, the alerts that name
//! culprits and the thresholds the Prometheus rules (`docs/prometheus/`) name them with.
//!
//! The plugin's hang diagnosis (`aggregate/flight.rs`) and its exported labels use [`Wait`];
//! `nccl_report` includes this file (`#[path]`, it does not depend on the plugin) and names
//! culprits with the same mapping and thresholds; `tests/signals/vocabulary.rs` fails when the
//! rules files say otherwise. Plain values and no dependency, so that both can include it.
//! Called on: any thread (constants and pure functions).
#![forbid(unsafe_code)]

/// What a channel of a stuck operation waits for: the `nccl.wait` attribute (`nccl_wait` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Wait {
    /// A transfer to the peer was handed to the network and has not completed (SendWait, no stop).
    Network,
    /// The GPU's data is ready but the peer is not ready to receive (SendPeerWait, no SendWait;
    /// ABI v1–v3: SendRemFifoWait, not transmitted).
    Peer,
    /// Data from the peer: a progressing receive from it has not completed, nothing it sent is
    /// waiting for the GPU, and the channel's sends wait for the GPU (which waits for that data).
    Recv,
    /// The local GPU: data a receive step brought is not consumed (RecvGPUWait, no stop), or
    /// send steps are posted and their data is not ready with nothing expected from a peer.
    Gpu,
    /// Nothing posted: the send op has steps left but none in flight (the proxy stopped posting).
    Proxy,
    /// Unknown: no step events (ProxyStep not in the activation mask).
    Unknown,
}

impl Wait {
    /// Every wait, in the order of the enum.
    pub const ALL: [Wait; 6] = [
        Wait::Network,
        Wait::Peer,
        Wait::Recv,
        Wait::Gpu,
        Wait::Proxy,
        Wait::Unknown,
    ];

    /// The name used in the `nccl.wait` attribute, the rules' `nccl_wait` and `nccl_where`
    /// labels, and the log.
    pub const fn as_str(self) -> &'static str {
        match self {
            Wait::Network => "network",
            Wait::Peer => "peer",
            Wait::Recv => "recv",
            Wait::Gpu => "gpu",
            Wait::Proxy => "proxy",
            Wait::Unknown => "unknown",
        }
    }

    /// The wait named `name` ([`Wait::as_str`]).
    pub fn parse(name: &str) -> Option<Wait> {
        Wait::ALL.into_iter().find(|w| w.as_str() == name)
    }

    /// Whom a rank reporting this wait blames.
    pub const fn blame(self) -> Blame {
        match self {
            Wait::Peer | Wait::Recv => Blame::Peer,
            Wait::Gpu | Wait::Proxy | Wait::Unknown => Blame::Itself,
            Wait::Network => Blame::Link,
        }
    }
}

/// Whom a wait blames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blame {
    /// The peer it names: the waiting rank is a victim, never alerted on; the culprit is where
    /// the waits end ([`CROSSED`] waits, a rank hung itself, or a rank waited on that reports no
    /// hang: [`Alert::RankAbsent`]).
    Peer,
    /// The waiting rank: hung where it waits ([`Alert::RankHung`], the wait its `nccl_where`).
    Itself,
    /// The link to the peer ([`Alert::LinkHung`]), or the NIC of the common end of
    /// [`NIC_LINKS`] stuck links or more ([`Alert::RankHung`] at [`Wait::Network`]).
    Link,
}

/// Crossed waits: rank R waits `.0` on peer P while P waits `.1` on R. P posted, so R's own view
/// stopped moving: R is hung at [`CROSSED_WHERE`] (its proxy stopped after posting the send).
pub const CROSSED: (Wait, Wait) = (Wait::Peer, Wait::Recv);

/// Where the waiting end of [`CROSSED`] waits is hung.
pub const CROSSED_WHERE: Wait = Wait::Proxy;

/// The alerts that name a culprit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Alert {
    /// A rank hung inside NCCL: on itself, the waiting end of crossed waits, or a NIC.
    RankHung,
    /// A link stuck on the network (the sender named, the receiver its peer).
    LinkHung,
    /// A rank waited on for [`ABSENT_SECS`] or more that reports no hang (outside NCCL, or gone).
    RankAbsent,
    /// A rank its senders wait for: [`STRAGGLER_WAIT`], [`STRAGGLER_SHARE`], [`STRAGGLER_FACTOR`].
    Straggler,
    /// A link below [`SLOW_LINK`] of its communicator's fast links, not a slow host's.
    SlowLink,
    /// A host (its NIC) with more than [`SLOW_HOST_SHARE`] of its link ends slow, and
    /// [`SLOW_HOST_ENDS`] or more.
    SlowHost,
}

impl Alert {
    /// Every alert, in the order of the rules file.
    pub const ALL: [Alert; 6] = [
        Alert::RankHung,
        Alert::LinkHung,
        Alert::RankAbsent,
        Alert::Straggler,
        Alert::SlowLink,
        Alert::SlowHost,
    ];

    /// Its name in the rules.
    pub const fn name(self) -> &'static str {
        match self {
            Alert::RankHung => "NcclRankHung",
            Alert::LinkHung => "NcclLinkHung",
            Alert::RankAbsent => "NcclRankAbsent",
            Alert::Straggler => "NcclStraggler",
            Alert::SlowLink => "NcclSlowLink",
            Alert::SlowHost => "NcclSlowHost",
        }
    }

    /// How long its condition must hold before it fires (`for:`), seconds: the two ends of a
    /// link may report it an export apart.
    pub const fn held_secs(self) -> u64 {
        match self {
            Alert::LinkHung | Alert::SlowLink => 5,
            _ => 0,
        }
    }
}

/// A process counts as exporting while its last export is younger than this many of its export
/// intervals (one lost export is tolerated).
pub const LIVE_INTERVALS: f64 = 2.0;

/// A rank that is an end of this many links stuck on the network or more is hung at its NIC.
pub const NIC_LINKS: usize = 2;

/// A rank waited on for this long (seconds) that reports no hang is absent: longer than a
/// checkpoint pause of the ranks waiting on it.
pub const ABSENT_SECS: f64 = 60.0;

/// A median: of a link's throughput, of the waits for a rank, of a communicator's ranks.
pub const MEDIAN: f64 = 0.5;

/// A communicator's fast links: this quantile of its links' throughput (a slow NIC slows two
/// links of every ring it is in).
pub const FAST_LINKS: f64 = 0.75;

/// A link is slow below this ratio of its communicator's fast links.
pub const SLOW_LINK: f64 = 0.8;

/// A link slow right now: this ratio in the last interval alone (a straggler's end is not).
pub const SLOW_NOW: f64 = 0.6;

/// A slow host has more than this share of its link ends slow …
pub const SLOW_HOST_SHARE: f64 = 0.5;

/// … and this many or more.
pub const SLOW_HOST_ENDS: usize = 2;

/// A link with an end on a host with slow link ends in this many communicators or more is that
/// host's (its NIC), not a slow link of its own.
pub const SLOW_HOST_COMMS: usize = 2;

/// A straggler's senders wait for it longer than this (median, seconds): healthy ranks of a busy
/// host wait up to about 1 ms …
pub const STRAGGLER_WAIT: f64 = 0.002;

/// … more than this share of their collective service time (a collective's enqueue → completion
/// also holds its wait behind those queued before it) …
pub const STRAGGLER_SHARE: f64 = 0.1;

/// … and more than this many times what the communicator's median rank makes them wait.
pub const STRAGGLER_FACTOR: f64 = 4.0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct_and_parse_back() {
        for w in Wait::ALL {
            assert_eq!(Wait::parse(w.as_str()), Some(w));
        }
        assert_eq!(Wait::parse("elsewhere"), None);
        let mut names: Vec<_> = Alert::ALL.iter().map(|a| a.name()).collect();
        names.dedup();
        assert_eq!(names.len(), Alert::ALL.len());
    }
}

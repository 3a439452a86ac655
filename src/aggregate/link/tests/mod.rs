//! Unit tests of the linking phase: one window's records (or several windows' through the table
//! of open operations) built slot by slot, summarised, and compared with the expected groups.
//! This module holds the record builders and expectations the themed files share. Test-only;
//! runs on the test harness's threads.

use super::*;
use crate::aggregate::queue::Queue;
use crate::aggregate::summary::Transfer;
use crate::aggregate::{OpSample, Waits};
use crate::record::Datatype;
use crate::record::handle::CommId;
use std::time::{Duration, Instant};

mod held;
mod ops;
mod records;
mod versions;

/// Past the hold time.
const HOLD_PLUS: Duration = Duration::from_millis(300);

/// The consumer at `now`, every window but the one being processed settled.
fn at(now: Instant, flush: bool) -> Frontier {
    Frontier {
        now,
        filling: 1,
        settled: 1,
        flush,
        lost_held: false,
        drops: 0,
    }
}
use crate::record::{Algo, CollStart, Func, P2pStart, Proto, ProxyOpStart};

const COMM: CommId = CommId { slot: 3, generation: 7 };
/// The epoch has bits above `EPOCH_MASK`: handles keep only the low ones.
const WIN: WindowId = WindowId {
    comm: COMM,
    window: 1,
    epoch: 0x100_0005,
};
/// A power of two, so every expected value below is exact.
const SPT: f64 = 1.0 / 1024.0;

fn meta() -> CommMeta {
    CommMeta {
        hash: 0xabc,
        name: "test".into(),
        rank: 0,
        nranks: 4,
        nnodes: 2,
        gpu: Default::default(),
    }
}

fn handle(window: u8, epoch: u32, kind: Kind, slot: usize) -> u64 {
    Handle::new(COMM.slot, window, epoch, kind, slot as u32).encode()
}

/// Builds one window's record slice; start records get handles minted for their own slot.
struct Win {
    id: WindowId,
    recs: Vec<Record>,
}

impl Default for Win {
    fn default() -> Self {
        Win::at(WIN)
    }
}

/// Groups of `from` added to `to` (operations and transfers), as a consumer merges summaries.
fn merge(to: &mut WindowSummary, from: WindowSummary) {
    for g in from.colls {
        match to.colls.iter_mut().find(|t| t.key == g.key) {
            Some(t) => {
                t.ops.extend(g.ops);
                t.transfers.extend(g.transfers);
            }
            None => to.colls.push(g),
        }
    }
    for g in from.p2ps {
        match to
            .p2ps
            .iter_mut()
            .find(|t| (t.peer, t.datatype, t.size_class) == (g.peer, g.datatype, g.size_class))
        {
            Some(t) => {
                t.ops.extend(g.ops);
                t.transfers.extend(g.transfers);
            }
            None => to.p2ps.push(g),
        }
    }
    to.colls.sort_unstable_by_key(|g| g.key);
    to.stats.orphans += from.stats.orphans;
}

impl Win {
    fn at(id: WindowId) -> Win {
        Win { id, recs: Vec::new() }
    }
    fn sealed(&self) -> Sealed<'_> {
        Sealed {
            records: &self.recs,
            lanes: Lanes::single(self.recs.len()),
            id: self.id,
            forced: false,
            lost_children: false,
        }
    }
    fn start(&mut self, ts: u64, body: Body) -> u64 {
        let id = handle(
            self.id.window,
            self.id.epoch,
            start_kind(&body).unwrap(),
            self.recs.len(),
        );
        self.recs.push(Record { id, ts, body });
        id
    }
    fn rec(&mut self, id: u64, ts: u64, body: Body) {
        self.recs.push(Record { id, ts, body });
    }
    fn stop(&mut self, id: u64, ts: u64) {
        self.rec(id, ts, Body::Stop);
    }
    fn filler(&mut self) {
        self.recs.push(Record {
            id: 0,
            ts: 0,
            body: Body::Stop,
        });
    }
    fn coll(&mut self, ts: u64, func: Func, count: u64, datatype: Datatype) -> u64 {
        self.start(ts, coll_body(func, count, datatype))
    }
    fn op(&mut self, ts: u64, parent: u64, rank: i32, peer: i32, channel: u8) -> u64 {
        self.start(ts, op_body(parent, rank, peer, channel))
    }
    /// A finished step: start at `ts`, SendWait of `bytes` at `ts + 1`, Stop `ticks` later.
    fn step(&mut self, ts: u64, parent: u64, bytes: u64, ticks: u64) -> u64 {
        let id = self.start(ts, Body::ProxyStep { parent, step: 0 });
        self.rec(id, ts + 1, Body::SendWait { bytes });
        self.stop(id, ts + 1 + ticks);
        id
    }
    fn kernel(&mut self, ts: u64, parent: u64, channel: u8, gpu_start: u64) -> u64 {
        self.start(
            ts,
            Body::KernelCh {
                parent,
                channel,
                gpu_start,
            },
        )
    }
    /// This window's summary with everything the table held released at once.
    fn sum(&self) -> WindowSummary {
        let mut open = OpenOps::new(Duration::ZERO);
        self.sum_with(&mut open, Instant::now(), true)
    }
    /// This window's summary through `open` at `now`; with `flush`, everything held is
    /// released.
    fn sum_with(&self, open: &mut OpenOps, now: Instant, flush: bool) -> WindowSummary {
        let mut s = summarize(self.sealed(), &meta(), SPT, open, at(now, false));
        if let Some(r) = release(self.id, &meta(), SPT, open, at(now, flush)) {
            merge(&mut s, r);
        }
        s
    }
}

fn coll_body(func: Func, count: u64, datatype: Datatype) -> Body {
    Body::Coll(CollStart {
        seq: 0,
        count,
        func,
        algo: Algo::Ring,
        proto: Proto::Simple,
        datatype,
        n_channels: 2,
        graph: None,
        sample: crate::record::Sample::ALL,
    })
}

fn op_body(parent: u64, rank: i32, peer: i32, channel: u8) -> Body {
    Body::ProxyOp(ProxyOpStart {
        parent,
        rank,
        peer,
        channel,
        send: true,
        origin: 0,
    })
}

fn recv_body(parent: u64, peer: i32, channel: u8) -> Body {
    Body::ProxyOp(ProxyOpStart {
        parent,
        rank: 0,
        peer,
        channel,
        send: false,
        origin: 0,
    })
}

/// The key of a collective of `bytes` (nccl-tests size).
fn key(func: Func, datatype: Datatype, bytes: u64) -> CollKey {
    CollKey {
        func,
        algo: Algo::Ring,
        proto: Proto::Simple,
        datatype,
        size_class: size_class(bytes),
        tag: 0,
        graph: None,
    }
}

fn t(bytes: u64, ticks: u64) -> Transfer {
    Transfer {
        bytes,
        secs: ticks as f64 / 1024.0,
    }
}

fn link(rank: i32, peer: i32, ts: &[Transfer]) -> LinkGroup {
    LinkGroup {
        rank,
        peer,
        bytes: ts.iter().map(|t| t.bytes).sum(),
        transfers: ts.len() as u64,
        queue: Queue::default(),
    }
}

/// Links without their queue analysis (`queue.rs` tests it).
fn no_queue(links: &[LinkGroup]) -> Vec<LinkGroup> {
    let strip = |l: &LinkGroup| LinkGroup {
        queue: Queue::default(),
        ..l.clone()
    };
    links.iter().map(strip).collect()
}

fn channel(channel: u8, ts: &[Transfer]) -> ChannelGroup {
    ChannelGroup {
        channel,
        transfers: ts.to_vec(),
    }
}

fn stats(records: u64, unfinished: u64, orphans: u64) -> WindowStats {
    WindowStats {
        records,
        unfinished,
        orphans,
        windows: 1,
        ..WindowStats::default()
    }
}

/// Window 2 of the same communicator, a later cycle than `WIN`.
const WIN2: WindowId = WindowId {
    comm: COMM,
    window: 2,
    epoch: 0x100_0009,
};

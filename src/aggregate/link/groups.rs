//! The groups a window's figures go to: operations by kind (collective key, or P2P peer, type,
//! size class and tag), transfers by link (rank, peer) and by channel; each created on first use
//! and addressed by index. Called on: the telemetry thread, inside one window's pass.

use super::{GroupIx, Here, NONE, Pass, ix};
use crate::aggregate::open::{GroupKey, Progress, Root};
use crate::aggregate::queue::Queue;
use crate::aggregate::summary::{ChannelGroup, CollGroup, LinkGroup, P2pGroup, Transfer};
use crate::record::Sample;

impl Pass<'_> {
    /// The application's tag of the root `root` (an index into `roots`; `NONE` for an event that
    /// is not one): it moves to the group of its tagged key. Transfers join groups later.
    pub(super) fn tag_root(&mut self, root: u32, tag: u64) {
        let Some(key) = self.roots.get(root as usize).map(|here| here.root.key.tagged(tag)) else {
            return;
        };
        let group = self.group(key);
        let here = &mut self.roots[root as usize];
        (here.root.key, here.group) = (key, group);
    }

    pub(super) fn add_root(&mut self, slot: usize, start: u64, key: GroupKey, bytes: u64, channels: u32, sample: Sample) {
        self.slots[slot].root = ix(self.roots.len());
        let group = self.group(key);
        self.roots.push(Here {
            handle: self.records[slot].id,
            group,
            root: Root {
                key,
                start,
                bytes,
                channels,
                sample,
                p: Progress::default(),
            },
        });
    }

    /// The group of `key` in this summary, created on first use.
    pub(super) fn group(&mut self, key: GroupKey) -> GroupIx {
        match key {
            GroupKey::Coll(key) => {
                let colls = &mut self.colls;
                GroupIx::Coll(*self.coll_ix.entry(key).or_insert_with(|| {
                    colls.push(CollGroup {
                        key,
                        ops: Vec::new(),
                        transfers: Vec::new(),
                    });
                    ix(colls.len() - 1)
                }))
            }
            GroupKey::P2p {
                peer,
                datatype,
                size_class,
                tag,
                graph,
            } => {
                let p2ps = &mut self.p2ps;
                GroupIx::P2p(*self.p2p_ix.entry(key).or_insert_with(|| {
                    p2ps.push(P2pGroup {
                        peer,
                        datatype,
                        size_class,
                        tag,
                        graph,
                        ops: Vec::new(),
                        transfers: Vec::new(),
                    });
                    ix(p2ps.len() - 1)
                }))
            }
        }
    }

    pub(super) fn link_group(&mut self, rank: i32, peer: i32) -> u32 {
        let (links, steps) = (&mut self.links, &mut self.link_steps);
        *self.link_ix.entry((rank, peer)).or_insert_with(|| {
            links.push(LinkGroup {
                rank,
                peer,
                bytes: 0,
                transfers: 0,
                queue: Queue::default(),
            });
            steps.push(Vec::new());
            ix(links.len() - 1)
        })
    }

    pub(super) fn channel_group(&mut self, channel: u8) -> u32 {
        let entry = &mut self.channel_ix[usize::from(channel)];
        if *entry == NONE {
            *entry = ix(self.channels.len());
            self.channels.push(ChannelGroup {
                channel,
                transfers: Vec::new(),
            });
        }
        *entry
    }

    pub(super) fn push_transfers(&mut self, group: GroupIx, transfers: Vec<Transfer>) {
        match group {
            GroupIx::Coll(g) => self.colls[g as usize].transfers.extend(transfers),
            GroupIx::P2p(g) => self.p2ps[g as usize].transfers.extend(transfers),
        }
    }
}

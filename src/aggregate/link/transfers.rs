//! Phase 2 of a window's pass: finished ProxySteps become transfers of their op's link, channel
//! and operation group (ABI v4+: a step's SendWait → stop; v1–v3: [`super::marks`]), each send
//! op's destinations resolved once. Called on: the telemetry thread, inside one window's pass.

use super::{NONE, OP_RESOLVED, OpIx, Pass, RootRef, SENT, STOPPED, Slot, GroupIx};
use crate::aggregate::queue::Step;
use crate::aggregate::summary::Transfer;
use crate::record::Body;

impl Pass<'_> {
    /// Where the transfers of the send ProxyOp `handle` go: from this window (resolved once per
    /// op) or from the table; `None` when the op is unknown.
    pub(super) fn op(&mut self, handle: u64) -> Option<OpIx> {
        let info = match self.slot_of(handle).map(|p| (p, self.records[p].body)) {
            Some((p, Body::ProxyOp(op))) if op.send => {
                if !self.slots[p].has(OP_RESOLVED) {
                    let link = self.link_group(op.rank, op.peer);
                    let root = match self.root_of(op.parent) {
                        RootRef::Here(r) => r,
                        _ => NONE,
                    };
                    let slot = &mut self.slots[p];
                    (slot.link, slot.root) = (link, root);
                    slot.flags |= OP_RESOLVED;
                }
                let Slot { link, root, .. } = self.slots[p];
                // A root outside this window is looked up again: the table changes as it goes.
                let root = if root == NONE {
                    self.root_of(op.parent)
                } else {
                    RootRef::Here(root)
                };
                return Some(OpIx {
                    root,
                    link,
                    channel: self.channel_group(op.channel),
                });
            }
            Some(_) => return None,
            None => self.open.ops.get(&handle)?.0,
        };
        Some(OpIx {
            root: self.root_of(info.parent),
            link: self.link_group(info.rank, info.peer),
            channel: self.channel_group(info.channel),
        })
    }

    /// Phase 2: finished ProxySteps become transfers of their op's link, channel and root group.
    pub(super) fn transfers(&mut self) {
        for i in std::mem::take(&mut self.steps) {
            let i = i as usize;
            let Body::ProxyStep { parent, step: index } = self.records[i].body else {
                continue;
            };
            let slot = self.slots[i];
            if !slot.has(SENT | STOPPED) {
                self.stats.unfinished += 1;
                let here = self
                    .slot_of(parent)
                    .is_some_and(|p| matches!(self.records[p].body, Body::ProxyOp(op) if op.send));
                if !here && !self.open.ops.contains_key(&parent) {
                    self.stats.orphans += 1;
                }
                continue;
            }
            let Some(op) = self.op(parent) else {
                self.stats.orphans += 1;
                continue;
            };
            let step = Step {
                sent: slot.sent,
                stop: slot.stop,
                bytes: slot.value,
                tag: op.channel,
            };
            self.add_transfer(op, step);
            self.first_step_wait(op, index, &slot);
        }
        for op in std::mem::take(&mut self.marked) {
            self.op_marks(op as usize);
        }
    }

    pub(super) fn add_transfer(&mut self, op: OpIx, step: Step) {
        let t = Transfer {
            bytes: step.bytes,
            secs: step.stop.saturating_sub(step.sent) as f64 * self.secs_per_tick,
        };
        if let Some(link) = self.links.get_mut(op.link as usize) {
            link.bytes = link.bytes.saturating_add(t.bytes);
            link.transfers += 1;
            self.link_steps[op.link as usize].push(step);
        }
        if let Some(channel) = self.channels.get_mut(op.channel as usize) {
            channel.transfers.push(t);
        }
        let group = match op.root {
            RootRef::Here(r) => self.roots.get_mut(r as usize).map(|here| {
                here.root.p.transfers = here.root.p.transfers.saturating_add(1);
                here.group
            }),
            RootRef::Held(h) => match self.open.held.get_mut(&h) {
                Some((root, _)) => {
                    root.p.transfers = root.p.transfers.saturating_add(1);
                    let key = root.key;
                    Some(self.group(key))
                }
                None => None,
            },
            RootRef::Pending(h) => {
                let pending = self.open.pending(h, self.at.now);
                pending.p.transfers = pending.p.transfers.saturating_add(1);
                pending.transfers.push(t);
                None
            }
            RootRef::None => None,
        };
        match group {
            Some(GroupIx::Coll(g)) => self.colls[g as usize].transfers.push(t),
            Some(GroupIx::P2p(g)) => self.p2ps[g as usize].transfers.push(t),
            None => {}
        }
    }
}

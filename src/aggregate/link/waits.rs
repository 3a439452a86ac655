//! The straggler signals of one window's operations: how long each first send step waited for
//! its peer to post the receive (SendPeerWait → SendWait of step 0, host clock; only the rank
//! sending to a late peer sees it), and how long each kernel channel's initial synchronisation
//! with its peers took (KernelPhase `initial_sync`, NCCL 2.31+, GPU clock). Each goes to the
//! operation the step or channel serves, which keeps the longest. Called on: the telemetry
//! thread, inside one window's pass.

use super::{OpIx, Pass, RootRef, Slot};
use crate::aggregate::open::Progress;
use crate::record::Body;

impl Pass<'_> {
    /// The progress record of an operation, wherever it is; `None` for none or another
    /// process's. Unlike [`Pass::progress`], a pending operation does not count a child.
    pub(super) fn root_progress(&mut self, root: RootRef) -> Option<&mut Progress> {
        match root {
            RootRef::Here(r) => self.roots.get_mut(r as usize).map(|h| &mut h.root.p),
            RootRef::Held(h) => self.open.held.get_mut(&h).map(|(root, _)| &mut root.p),
            RootRef::Pending(h) => Some(&mut self.open.pending(h, self.at.now).p),
            RootRef::None => None,
        }
    }

    /// Send step `index` of `op`, finished with `slot`: step 0 tells how long the peer kept the
    /// operation waiting.
    pub(super) fn first_step_wait(&mut self, op: OpIx, index: i32, slot: &Slot) {
        if index != 0 || slot.waited == 0 {
            return;
        }
        let Some(peer) = self.links.get(op.link as usize).map(|l| l.peer) else {
            return;
        };
        let ticks = slot.sent.saturating_sub(slot.waited);
        if let Some(p) = self.root_progress(op.root) {
            p.waited(peer, ticks);
        }
    }

    /// The KernelPhase at slot `i`, which ended `ns` after it started: an initial sync's
    /// duration goes to the operation of its KernelCh, when that channel is in this window.
    pub(super) fn sync_wait(&mut self, i: usize, ns: u64) {
        let Body::KernelPhase { parent, phase: 0, .. } = self.records[i].body else {
            return;
        };
        let Some(Body::KernelCh { parent: root, .. }) = self.slot_of(parent).map(|k| self.records[k].body) else {
            return;
        };
        let root = self.root_of(root);
        if let Some(p) = self.root_progress(root) {
            p.synced(ns);
        }
    }
}

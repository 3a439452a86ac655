//! The transfers of ABI v1–v3 send ops (NCCL 2.23–2.26), whose ProxyOp states carry the bytes
//! (spec 8.2.2, 8.7): phase 1 chains each op's OpBytes marks through the slot scratch, phase 2
//! turns a chain into transfers. Called on: the telemetry thread, inside one window's pass.

use super::{MARKED, NONE, Pass, ix};
use crate::aggregate::queue::Step;
use crate::record::{Body, Mark};

impl Pass<'_> {
    /// Appends the OpBytes mark at slot `mark` to the chain of the send op at slot `op`.
    pub(super) fn chain_mark(&mut self, op: usize, mark: usize) {
        self.slots[mark].value = u64::from(NONE);
        let slot = &mut self.slots[op];
        let last = std::mem::replace(&mut slot.value, mark as u64);
        if slot.has(MARKED) {
            self.slots[last as usize].value = mark as u64;
        } else {
            slot.sent = mark as u64;
            slot.flags |= MARKED;
            self.marked.push(ix(op));
        }
    }

    /// The transfers of the send op at slot `op` from its chain of OpBytes marks (v1–v3, spec
    /// 8.7): the network takes them in order (Sent, SentBefore) and finishes them in order
    /// (Done); a transfer's bytes are the difference of the op's running totals around it
    /// (v2/v3: Sent's total minus the previous one, the first minus the op's Base; v1: the next
    /// SentBefore's or any later Done's total minus its own). A transfer without a Done or whose
    /// bytes cannot be told (its Base was lost) counts as unfinished.
    pub(super) fn op_marks(&mut self, op: usize) {
        /// A transfer taken by the network: when, its bytes once known, the total before it
        /// (v1), and when it finished.
        struct Taken {
            sent: u64,
            bytes: Option<u64>,
            before: Option<u64>,
            stop: Option<u64>,
        }
        let mut taken: Vec<Taken> = Vec::new();
        let (mut total, mut done) = (None, 0);
        let mut at = self.slots[op].sent as usize;
        while let Some(rec) = self.records.get(at) {
            if let Body::OpBytes { mark, total: t } = rec.body {
                // v1: the latest transfer's bytes end where the next total begins.
                let resolve = |taken: &mut Vec<Taken>| {
                    if let Some(last) = taken.last_mut().filter(|l| l.bytes.is_none()) {
                        last.bytes = last.before.and_then(|b| t.checked_sub(b));
                    }
                };
                match mark {
                    Mark::Base => {
                        total.get_or_insert(t);
                    }
                    Mark::Sent => {
                        let bytes = total.and_then(|b| t.checked_sub(b));
                        taken.push(Taken {
                            sent: rec.ts,
                            bytes,
                            before: None,
                            stop: None,
                        });
                        total = Some(t);
                    }
                    Mark::SentBefore => {
                        resolve(&mut taken);
                        taken.push(Taken {
                            sent: rec.ts,
                            bytes: None,
                            before: Some(t),
                            stop: None,
                        });
                    }
                    Mark::Done => {
                        resolve(&mut taken);
                        if let Some(x) = taken.get_mut(done) {
                            x.stop = Some(rec.ts);
                            done += 1;
                        }
                    }
                }
            }
            at = self.slots[at].value as usize;
        }
        let finished = taken.iter().filter(|x| x.stop.is_some() && x.bytes.is_some()).count();
        self.stats.unfinished += (taken.len() - finished) as u64;
        // An op without a finished transfer leaves no empty link or channel group behind.
        let Some(dest) = (finished > 0).then(|| self.op(self.records[op].id)).flatten() else {
            return;
        };
        for x in taken {
            if let (Some(stop), Some(bytes)) = (x.stop, x.bytes) {
                let step = Step {
                    sent: x.sent,
                    stop,
                    bytes,
                    tag: dest.channel,
                };
                self.add_transfer(dest, step);
            }
        }
    }
}

//! API calls NCCL 2.29 and 2.30 record no task events for (symmetric-memory collectives, spec
//! 3.12): each recorded CollApi is a collective unless a Coll or CeColl claims it, in its window
//! or a later one; one unclaimed when its window is built waits in the table of open operations
//! ([`super::super::open`]). Called on: the telemetry thread, inside one window's pass.

use super::{CLAIMED, Pass, coll_key};
use crate::aggregate::open::{Progress, Root};
use crate::record::Body;

impl Pass<'_> {
    /// A Coll or CeColl names the API call `api` it serves: in this window, or held.
    pub(super) fn claim_api(&mut self, api: u64) {
        match self.slot_of(api) {
            Some(s) => self.slots[s].flags |= CLAIMED,
            None => self.open.claim_api(api),
        }
    }

    /// This window's API calls nothing claimed yet wait in the table for a later claim.
    pub(super) fn hold_apis(&mut self) {
        for i in std::mem::take(&mut self.apis) {
            let i = i as usize;
            let Body::Api(call) = self.records[i].body else {
                continue;
            };
            if self.slots[i].has(CLAIMED) {
                continue;
            }
            let (key, bytes) = coll_key(&call, self.nranks);
            let root = Root {
                key,
                start: self.records[i].ts,
                bytes,
                channels: 0,
                sample: call.sample,
                p: Progress::default(),
            };
            self.open.hold_api(self.records[i].id, root, &self.at);
        }
    }
}

//! The cardinality limiter: at most `limit` attribute sets per metric family are recorded as
//! themselves; later ones go to the overflow series ([`super::catalogue::keys::OVERFLOW`]) and
//! are counted. Called on: the telemetry thread (through the pipeline).
#![forbid(unsafe_code)]

use std::collections::{HashMap, HashSet};

use opentelemetry::KeyValue;

/// Metric families: the instruments of one family share their attribute sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Family {
    Coll,
    P2p,
    Link,
    Channel,
    Kernel,
    Profiler,
    Progress,
}

impl Family {
    pub(super) fn prefix(self) -> &'static str {
        match self {
            Family::Coll => "nccl.coll",
            Family::P2p => "nccl.p2p",
            Family::Link => "nccl.link",
            Family::Channel => "nccl.channel",
            Family::Kernel => "nccl.kernel",
            Family::Profiler => "nccl.profiler",
            Family::Progress => "nccl.progress",
        }
    }
}

/// Admits at most `limit` attribute sets per family: forever under cumulative temporality,
/// per interval under delta (the SDK forgets what was not updated in an interval).
pub(super) struct Limiter {
    pub(super) limit: usize,
    pub(super) per_interval: bool,
    pub(super) seen: HashMap<Family, HashSet<Vec<KeyValue>>>,
}

impl Limiter {
    pub(super) fn admit(&mut self, family: Family, attrs: &[KeyValue]) -> bool {
        let seen = self.seen.entry(family).or_default();
        if seen.contains(attrs) {
            return true;
        }
        if seen.len() >= self.limit {
            return false;
        }
        seen.insert(attrs.to_vec());
        true
    }

    pub(super) fn end_interval(&mut self) {
        if self.per_interval {
            self.seen.values_mut().for_each(HashSet::clear);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limiter_admits_up_to_the_limit() {
        let mut l = Limiter {
            limit: 2,
            per_interval: true,
            seen: HashMap::new(),
        };
        let set = |i: i64| vec![KeyValue::new("k", i)];
        assert!(l.admit(Family::Coll, &set(1)));
        assert!(l.admit(Family::Coll, &set(2)));
        assert!(l.admit(Family::Coll, &set(1)));
        assert!(!l.admit(Family::Coll, &set(3)));
        assert!(l.admit(Family::Link, &set(3)));
        l.end_interval();
        assert!(l.admit(Family::Coll, &set(3)));
    }
}

//! Each operation's time split into queue wait and service, per communicator. Operations of a
//! communicator run one after the other: one enqueued while earlier ones are still in flight
//! waits behind them, so its enqueue → completion (its latency) includes their time. Its
//! service time is what it took once the communicator was free:
//! completion − max(enqueue, the latest completion of any earlier-enqueued operation), clamped
//! at 0; its queue wait is the rest of its latency. Summed over back-to-back operations, service
//! times add up to the elapsed time, which is what nccl-tests divides by.
//!
//! Host completions arrive out of order (a send op stops at network completion, a receive op
//! when the GPU consumed the data), and the table of open operations releases a batch at a time:
//! each batch is taken in enqueue order, and the latest completion is a maximum, not the last
//! one seen. A service time is absent, and counted by reason, when the operation's own
//! completion is unknown, when the operation enqueued just before it has no known completion
//! (dropped, unsampled, PXN-partial), or when a later-enqueued operation was already split.
//!
//! P2P sends take part as earlier operations (their completions); their own splits mean little,
//! since a group's sends run together in one kernel, and the exporter uses the collectives' only.
//!
//! Under sampling (overload), an operation timed at rate 2^-k (k > 0) is recorded with its
//! predecessor, the one enqueued just before it on its communicator (collectives and P2P sends
//! numbered apart). It gets a service time only when the operation of its kind split just before
//! it is that predecessor ([`Sample::follows`]) with a known completion; else it is counted
//! `predecessor_unknown` (the predecessor's record was lost, or the rate fell between the two).
//! A predecessor recorded only for its completion takes part as an earlier operation, but its
//! own split is empty (its weight is 0). The latest completion is then the maximum over the
//! recorded operations only: back to back, the predecessor's completion is the latest (a
//! communicator's operations serialize on its stream), but an unrecorded operation completing
//! after it (a P2P send between the pair, a host completion of an earlier operation later than
//! the predecessor's) is missed.
//!
//! Pure; called on the telemetry thread only.
#![forbid(unsafe_code)]

use super::summary::{OpSample, WindowSummary};
use crate::record::Sample;
use crate::record::sample::Role;

/// The operation's own completion is unknown.
const NO_COMPLETION: &str = "no_completion";
/// The operation enqueued just before it has no known completion.
const PREDECESSOR_UNKNOWN: &str = "predecessor_unknown";
/// A later-enqueued operation was split before it.
const OUT_OF_ORDER: &str = "out_of_order";
/// Every reason a service time can be missing ([`Split::missing`]).
pub const SERVICE_MISSING: [&str; 3] = [NO_COMPLETION, PREDECESSOR_UNKNOWN, OUT_OF_ORDER];

/// One operation's latency split.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Split {
    /// Seconds from the communicator becoming free (or the enqueue, if later) to completion.
    pub service: Option<f64>,
    /// Seconds from enqueue until the communicator was free: latency − service.
    pub queue: Option<f64>,
    /// Why there is no service time: one of [`SERVICE_MISSING`].
    pub missing: Option<&'static str>,
}

impl Split {
    fn missing(reason: &'static str) -> Split {
        Split {
            missing: Some(reason),
            ..Split::default()
        }
    }
}

/// Where one communicator's queue stands after the operations split so far.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Order {
    /// Enqueue of the latest-enqueued operation split so far (seconds).
    last: Option<f64>,
    /// Whether that operation's completion is known.
    last_known: bool,
    /// The latest known completion of the operations split so far (seconds).
    horizon: f64,
    /// Per kind (collectives, P2P sends): the sample of the latest-enqueued operation split so
    /// far, and whether its completion is known.
    prev: [Option<(Sample, bool)>; 2],
}

impl Order {
    /// The splits of `s`'s operations: its collectives' operations group by group, then its
    /// P2P sends', in the summary's order.
    pub fn split(&mut self, s: &WindowSummary) -> Vec<Split> {
        let colls = s.colls.iter().flat_map(|g| &g.ops).map(|o| (o, 0));
        let ops: Vec<(&OpSample, usize)> = colls.chain(s.p2ps.iter().flat_map(|g| &g.ops).map(|o| (o, 1))).collect();
        let mut order: Vec<usize> = (0..ops.len()).collect();
        order.sort_by(|&a, &b| ops[a].0.start.total_cmp(&ops[b].0.start));
        let mut out = vec![Split::default(); ops.len()];
        for i in order {
            out[i] = self.next(ops[i].0, ops[i].1);
        }
        out
    }

    /// Splits `op`, the next operation in enqueue order, of kind `kind` (0 collective, 1 P2P).
    fn next(&mut self, op: &OpSample, kind: usize) -> Split {
        let end = op.duration.map(|d| op.start + d);
        let late = self.last.is_some_and(|l| op.start < l);
        let paired = op.sample.k() == 0
            || self.prev[kind].is_some_and(|(prev, known)| known && op.sample.follows(prev));
        let split = match end {
            _ if op.sample.role() == Role::Predecessor => Split::default(),
            None => Split::missing(NO_COMPLETION),
            Some(_) if late => Split::missing(OUT_OF_ORDER),
            Some(_) if self.last.is_some() && !self.last_known || !paired => Split::missing(PREDECESSOR_UNKNOWN),
            Some(end) => {
                let free = if self.last.is_some() {
                    op.start.max(self.horizon)
                } else {
                    op.start
                };
                let service = (end - free).max(0.0);
                Split {
                    service: Some(service),
                    queue: Some((end - op.start - service).max(0.0)),
                    missing: None,
                }
            }
        };
        if let Some(end) = end {
            self.horizon = self.horizon.max(end);
        }
        if !late {
            self.last = Some(op.start);
            self.last_known = end.is_some();
            self.prev[kind] = Some((op.sample, end.is_some()));
        }
        split
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::summary::{CollGroup, CollKey, P2pGroup, Waits};
    use crate::aggregate::{CommMeta, WindowStats};
    use crate::record::{Algo, Datatype, Func, Proto};

    fn op(start: f64, duration: Option<f64>) -> OpSample {
        OpSample {
            bytes: 1 << 20,
            start,
            duration,
            gpu: None,
            transfers: 0,
            waits: Waits::default(),
            sample: crate::record::Sample::ALL,
            bare: false,
        }
    }

    fn summary(colls: Vec<OpSample>, sends: Vec<OpSample>) -> WindowSummary {
        let key = CollKey {
            func: Func::AllReduce,
            algo: Algo::Ring,
            proto: Proto::Simple,
            datatype: Datatype::Float32,
            size_class: 20,
            tag: 0,
            graph: None,
        };
        WindowSummary {
            comm: CommMeta {
                hash: 7,
                name: "c".into(),
                rank: 0,
                nranks: 2,
                nnodes: 1,
                gpu: Default::default(),
            },
            colls: vec![CollGroup {
                key,
                ops: colls,
                transfers: Vec::new(),
            }],
            p2ps: vec![P2pGroup {
                peer: 1,
                datatype: Datatype::Float32,
                size_class: 20,
                tag: 0,
                graph: None,
                ops: sends,
                transfers: Vec::new(),
            }],
            links: Vec::new(),
            channels: Vec::new(),
            phases: Default::default(),
            stats: WindowStats::default(),
            counted: Vec::new(),
        }
    }

    fn services(splits: &[Split]) -> Vec<Option<f64>> {
        splits.iter().map(|s| s.service).collect()
    }

    /// Four operations enqueued at once, each taking 10 s once the one before completed: each
    /// serves 10 s and waits for the ones before; the services add up to the elapsed time.
    #[test]
    fn back_to_back_operations_serve_one_after_the_other() {
        let ops = (1..=4).map(|k| op(0.0, Some(10.0 * f64::from(k)))).collect();
        let splits = Order::default().split(&summary(ops, Vec::new()));
        assert_eq!(services(&splits), vec![Some(10.0); 4]);
        let queues: Vec<Option<f64>> = splits.iter().map(|s| s.queue).collect();
        assert_eq!(queues, vec![Some(0.0), Some(10.0), Some(20.0), Some(30.0)]);
    }

    /// Host completions out of order (a send op of the next operation stops before a receive op
    /// of this one): taken in enqueue order, with the latest completion, never negative.
    #[test]
    fn out_of_order_completions_take_the_latest_and_clamp_at_zero() {
        // Enqueued at 0, 1, 2; completing at 10, 8, 15: the second is served nothing.
        let s = summary(vec![op(2.0, Some(13.0)), op(0.0, Some(10.0))], vec![op(1.0, Some(7.0))]);
        let splits = Order::default().split(&s);
        assert_eq!(services(&splits), vec![Some(5.0), Some(10.0), Some(0.0)]);
        assert_eq!(splits[2].queue, Some(7.0));
    }

    #[test]
    fn an_idle_communicator_serves_from_the_enqueue() {
        let mut order = Order::default();
        order.split(&summary(vec![op(0.0, Some(1.0))], Vec::new()));
        let splits = order.split(&summary(vec![op(5.0, Some(2.0))], Vec::new()));
        assert_eq!((splits[0].service, splits[0].queue), (Some(2.0), Some(0.0)));
    }

    #[test]
    fn unknown_completions_are_counted_not_guessed() {
        let mut order = Order::default();
        let s = summary(vec![op(0.0, None), op(1.0, Some(5.0)), op(2.0, Some(9.0))], Vec::new());
        let splits = order.split(&s);
        assert_eq!(splits[0].missing, Some("no_completion"));
        assert_eq!(splits[1].missing, Some("predecessor_unknown"));
        assert_eq!(splits[2].service, Some(5.0), "after a known predecessor");
        // Released after a later-enqueued one was split.
        let late = order.split(&summary(vec![op(1.5, Some(3.0))], Vec::new()));
        assert_eq!(late[0].missing, Some("out_of_order"));
        let next = order.split(&summary(vec![op(3.0, Some(10.0))], Vec::new()));
        assert_eq!(next[0].service, Some(2.0), "the late one's completion is no later");
    }

    fn sampled(start: f64, duration: f64, role: Role, ord: u8) -> OpSample {
        OpSample {
            sample: Sample::new(3, role, ord),
            ..op(start, Some(duration))
        }
    }

    /// At rate 2^-3: a timed operation is served from its predecessor's completion when that
    /// predecessor (ord − 1) was split just before it; the predecessor's own split is empty.
    #[test]
    fn sampled_operations_are_timed_in_pairs() {
        let mut order = Order::default();
        let pair = vec![sampled(0.0, 10.0, Role::Predecessor, 255), sampled(1.0, 15.0, Role::Timed, 0)];
        let splits = order.split(&summary(pair, Vec::new()));
        assert_eq!(splits[0], Split::default(), "a predecessor only: nothing exported");
        assert_eq!((splits[1].service, splits[1].queue), (Some(6.0), Some(9.0)));
        // A timed operation whose predecessor is not the operation split before it (a gap: its
        // predecessor's record was lost), and one after it (ord 1 follows 0: paired).
        let gap = vec![sampled(20.0, 5.0, Role::Timed, 7), sampled(21.0, 6.0, Role::Timed, 8)];
        let splits = order.split(&summary(gap, Vec::new()));
        assert_eq!(splits[0].missing, Some("predecessor_unknown"));
        assert_eq!(splits[1].service, Some(2.0));
        // A predecessor without a completion pairs with nothing.
        let open = OpSample {
            duration: None,
            ..sampled(30.0, 0.0, Role::Predecessor, 20)
        };
        let splits = order.split(&summary(vec![open, sampled(31.0, 4.0, Role::Timed, 21)], Vec::new()));
        assert_eq!((splits[0], splits[1].missing), (Split::default(), Some("predecessor_unknown")));
        // A P2P send between the pair (numbered apart) does not break it.
        let splits = order.split(&summary(
            vec![sampled(40.0, 2.0, Role::Predecessor, 40), sampled(42.0, 3.0, Role::Timed, 41)],
            vec![sampled(41.0, 1.0, Role::Timed, 9)],
        ));
        assert_eq!(splits[1].service, Some(3.0));
    }
}

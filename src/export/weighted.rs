//! How a group of operations is recorded into the catalogue's instruments, with the weights of
//! sampling (overload): a timed operation's figures stand for 2^k operations, so its histogram
//! values are recorded 2^k times and its sums multiplied by 2^k; a predecessor recorded only for
//! its completion (weight 0) and every recorded operation count once in `*.bytes`; operations
//! counted without a record ([`Counted`]) are counted and sized there too, under count-only
//! attributes. Also the sampling instruments: each communicator's ratio of timed operations and
//! the events not recorded under overload. Called on: the telemetry thread (through the
//! pipeline).
#![forbid(unsafe_code)]

use opentelemetry::KeyValue;
use opentelemetry::metrics::{BoundHistogram, Histogram};

use super::catalogue::{OpInstruments, keys};
use super::limiter::Family;
use crate::aggregate::interval::{Scale, size_class_name};
use crate::aggregate::{OpSample, SERVICE_MISSING, Split, Transfer};
use crate::record::counted::Counted;
use crate::record::size::{UNKNOWN_CLASS, test_size};
use crate::record::Func;

/// The attribute value of every count-only attribute the hot path does not keep (and of every
/// attribute of the table's overflow entry).
const OTHER: &str = "other";

/// Records `value` `weight` times (the SDK has no weighted record).
pub(super) fn record_n(h: &BoundHistogram<f64>, value: f64, weight: u32) {
    (0..weight).for_each(|_| h.record(value));
}

impl OpInstruments {
    /// Bound once per group: the attribute lookup is paid per call, not per measurement. Only
    /// instruments that get a value are bound (binding alone creates the series). Records a
    /// group's operations and transfers, with the bytes and bandwidths `scale` gives them: every
    /// operation's size and transfers once (no transfers for one whose steps were shed), its
    /// times and GPU bandwidths (over its own kernel time) its weight times. With `split`
    /// (collectives: each operation's split, and the attributes of the sums), the summed
    /// service and GPU times and bus bytes (× weight) and the missing service times (+ weight)
    /// are counted: the host's bandwidth is their ratio, never a per-operation figure (a service
    /// time is only as long as the gap to the completion before it, which clusters when
    /// completions are seen in batches).
    pub(super) fn record(
        &self,
        ops: &[OpSample],
        transfers: &[Transfer],
        scale: Scale,
        attrs: &[KeyValue],
        split: Option<(&[Split], &[KeyValue])>,
    ) {
        let weight = |o: &OpSample| o.sample.weight();
        if !ops.is_empty() {
            let bytes = self.bytes.bind(attrs);
            let count = ops.iter().any(|o| !o.bare).then(|| self.transfers.bind(attrs));
            for op in ops {
                if scale.sized {
                    bytes.record(op.bytes as f64);
                }
                count.iter().filter(|_| !op.bare).for_each(|c| c.record(u64::from(op.transfers)));
            }
        }
        if ops.iter().any(|o| o.duration.is_some() && weight(o) > 0) {
            let duration = self.duration.bind(attrs);
            for o in ops {
                o.duration.inspect(|&d| record_n(&duration, d, weight(o)));
            }
        }
        let served = self.served.as_ref().zip(split);
        if let Some((served, (splits, _))) = served.filter(|(_, (s, _))| s.iter().any(|s| s.service.is_some())) {
            let (service, queue) = (served.service.bind(attrs), served.queue.bind(attrs));
            for (s, o) in splits.iter().zip(ops) {
                s.service.inspect(|&v| record_n(&service, v, weight(o)));
                s.queue.inspect(|&v| record_n(&queue, v, weight(o)));
            }
        }
        let none = Split::default();
        let split_of = |i: usize| split.and_then(|(s, _)| s.get(i)).unwrap_or(&none);
        let clocks = [
            (false, served.map(|(s, _)| (&s.service_time, &s.service_bus_bytes))),
            (true, served.map(|(s, _)| (&s.kernel_time, &s.kernel_bus_bytes))),
        ];
        for (gpu, sums) in clocks {
            let time_of = |i: usize, o: &OpSample| match (gpu, split) {
                _ if weight(o) == 0 => None,
                (true, _) => o.gpu,
                (false, Some(_)) => split_of(i).service,
                (false, None) => None,
            };
            if !ops.iter().enumerate().any(|(i, o)| time_of(i, o).is_some()) {
                continue;
            }
            // The GPU's: per operation, over its own kernel time.
            let per_op = gpu.then(|| {
                let bind = |h: &Histogram<f64>| h.bind(attrs);
                (bind(&self.kernel_duration), bind(&self.kernel_algbw), bind(&self.kernel_busbw))
            });
            let (mut secs, mut bus, mut summed) = (0.0, 0.0, false);
            for (op, t) in ops.iter().enumerate().filter_map(|(i, o)| Some((o, time_of(i, o)?))) {
                let w = weight(op);
                if let Some((duration, algbw, busbw)) = &per_op {
                    record_n(duration, t, w);
                    if let Some((alg, bus)) = scale.bandwidths(op.bytes, t) {
                        record_n(algbw, alg, w);
                        bus.inspect(|&b| record_n(busbw, b, w));
                    }
                }
                if let Some(b) = scale.bus_bytes(op.bytes) {
                    (secs, bus, summed) = (secs + t * f64::from(w), bus + b * f64::from(w), true);
                }
            }
            if let (Some((time, bus_bytes)), Some((_, totals)), true) = (sums, split, summed) {
                time.add(secs, totals);
                bus_bytes.add(bus, totals);
            }
        }
        if let Some((served, (splits, totals))) = served {
            for reason in SERVICE_MISSING {
                let missing = splits.iter().zip(ops).filter(|(s, _)| s.missing == Some(reason));
                let n = missing.map(|(_, o)| u64::from(weight(o))).sum::<u64>();
                if n > 0 {
                    let mut attrs = totals.to_vec();
                    attrs.push(KeyValue::new(keys::REASON, reason));
                    served.missing.add(n, &attrs);
                }
            }
        }
        if !transfers.is_empty() {
            let (size, secs) = (self.transfer_size.bind(attrs), self.transfer_duration.bind(attrs));
            for t in transfers {
                size.record(t.bytes as f64);
                secs.record(t.secs);
            }
        }
    }

    /// Measurements [`OpInstruments::record`] makes under the group's attributes (at most),
    /// weighted values counted as many times as they are recorded.
    pub(super) fn measurements(ops: &[OpSample], splits: &[Split], transfers: &[Transfer]) -> u64 {
        let w = |o: &OpSample| u64::from(o.sample.weight());
        let once = ops.iter().map(|o| 2 - u64::from(o.bare)).sum::<u64>();
        let host = ops.iter().map(|o| w(o) * u64::from(o.duration.is_some())).sum::<u64>();
        let served = splits.iter().zip(ops).map(|(s, o)| 2 * w(o) * u64::from(s.service.is_some()));
        let gpu = ops.iter().map(|o| 3 * w(o) * u64::from(o.gpu.is_some())).sum::<u64>();
        once + host + served.sum::<u64>() + gpu + 2 * transfers.len() as u64
    }

    /// Records `c`'s operations, counted without a record, into `*.bytes`: `c.ops` values at
    /// their mean nccl-tests size (exact sum and bucket counts, the size class being a bucket;
    /// not min and max), none when their size is unknown (as for recorded operations).
    pub(super) fn record_counted(&self, c: &Counted, nranks: i32, attrs: &[KeyValue]) {
        let sized = c.key.is_none_or(|k| k.class != UNKNOWN_CLASS);
        let func = c.key.map_or(Func::Unknown, |k| k.func);
        let Some(bytes) = test_size(func, c.bytes, nranks).filter(|_| sized && c.ops > 0) else {
            return;
        };
        let h = self.bytes.bind(attrs);
        record_n(&h, bytes as f64 / c.ops as f64, u32::try_from(c.ops).unwrap_or(u32::MAX));
    }
}

/// The family and attributes of `c`, operations counted without a record, on top of their
/// communicator's `base`: a collective's function, algorithm, protocol and size class with
/// `nccl.datatype` = `other`; a P2P send's with `nccl.peer` = `other`; the table's overflow entry
/// with every attribute `other` (as collectives). No tag, no graph attribute.
pub(super) fn counted_attrs(base: &[KeyValue], c: &Counted) -> (Family, Vec<KeyValue>) {
    let mut attrs = base.to_vec();
    let class = |k: u8| KeyValue::new(keys::SIZE_CLASS, size_class_name(k));
    match c.key {
        Some(k) if k.p2p => {
            attrs.extend([
                KeyValue::new(keys::FUNC, k.func.as_str()),
                KeyValue::new(keys::PEER, OTHER),
                KeyValue::new(keys::DATATYPE, OTHER),
                class(k.class),
            ]);
            (Family::P2p, attrs)
        }
        Some(k) => {
            attrs.extend([
                KeyValue::new(keys::FUNC, k.func.as_str()),
                KeyValue::new(keys::ALGO, k.algo.as_str()),
                KeyValue::new(keys::PROTO, k.proto.as_str()),
                KeyValue::new(keys::DATATYPE, OTHER),
                class(k.class),
            ]);
            (Family::Coll, attrs)
        }
        None => {
            let keys = [keys::FUNC, keys::ALGO, keys::PROTO, keys::DATATYPE, keys::SIZE_CLASS];
            attrs.extend(keys.map(|k| KeyValue::new(k, OTHER)));
            (Family::Coll, attrs)
        }
    }
}


//! Prometheus remote write of exported OTLP requests: every float sample of the translation of
//! `prom` (same names and labels), and every exponential histogram point as a native histogram,
//! in one `WriteRequest` (Prometheus' `prompb` messages, written out below for prost),
//! snappy-compressed, each series' samples in time order at its request's collection time.
//! OpenMetrics backfill cannot carry native histograms; a Prometheus with
//! `--enable-feature=native-histograms --web.enable-remote-write-receiver` stores what this sends
//! (`server::Server::remote_write`).
//!
//! An OTLP exponential histogram of scale `s` is a native histogram of schema `s`: the same
//! base 2^(2^-s). Prometheus schemas stop at 8, so a finer scale is merged down to 8 (bucket `i`
//! becomes `i >> (s - 8)`). OTLP bucket `i` is (base^i, base^(i+1)], Prometheus' bucket `i`
//! (base^(i-1), base^i]: Prometheus' index is OTLP's plus one. Counts go as deltas, each from the
//! bucket before. Called on: the test's thread.

use std::collections::BTreeMap;
use std::time::UNIX_EPOCH;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::exponential_histogram_data_point::Buckets;
use opentelemetry_proto::tonic::metrics::v1::{ExponentialHistogramDataPoint, metric};
use prost::Message;

/// Prometheus' finest native-histogram schema.
const MAX_SCHEMA: i32 = 8;
/// Its coarsest.
const MIN_SCHEMA: i32 = -4;

/// `prometheus.WriteRequest`.
#[derive(Clone, PartialEq, Message)]
pub struct WriteRequest {
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
}

/// `prometheus.TimeSeries`: labels sorted by name, `__name__` among them.
#[derive(Clone, PartialEq, Message)]
pub struct TimeSeries {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
    #[prost(message, repeated, tag = "4")]
    pub histograms: Vec<Histogram>,
}

/// `prometheus.Label`.
#[derive(Clone, PartialEq, Message)]
pub struct Label {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `prometheus.Sample`: a float at a time in milliseconds.
#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    #[prost(double, tag = "1")]
    pub value: f64,
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

/// `prometheus.Histogram` with integer counts (`count_int`, `zero_count_int`, deltas); the reset
/// hint left unknown.
#[derive(Clone, PartialEq, Message)]
pub struct Histogram {
    #[prost(uint64, tag = "1")]
    pub count: u64,
    #[prost(double, tag = "3")]
    pub sum: f64,
    #[prost(sint32, tag = "4")]
    pub schema: i32,
    #[prost(double, tag = "5")]
    pub zero_threshold: f64,
    #[prost(uint64, tag = "6")]
    pub zero_count: u64,
    #[prost(message, repeated, tag = "8")]
    pub negative_spans: Vec<BucketSpan>,
    #[prost(sint64, repeated, tag = "9")]
    pub negative_deltas: Vec<i64>,
    #[prost(message, repeated, tag = "11")]
    pub positive_spans: Vec<BucketSpan>,
    #[prost(sint64, repeated, tag = "12")]
    pub positive_deltas: Vec<i64>,
    #[prost(int64, tag = "15")]
    pub timestamp: i64,
}

/// `prometheus.BucketSpan`: `length` buckets from `offset` buckets past the previous span's end
/// (the first span's from index 0).
#[derive(Clone, PartialEq, Message)]
pub struct BucketSpan {
    #[prost(sint32, tag = "1")]
    pub offset: i32,
    #[prost(uint32, tag = "2")]
    pub length: u32,
}

/// The requests as one remote-write request: a series per name and label set, its samples
/// (or histograms) in the requests' order, which must be their collection order.
pub fn request(reqs: &[ExportMetricsServiceRequest]) -> WriteRequest {
    let times: Vec<i64> = reqs.iter().map(millis).collect();
    let mut series: BTreeMap<BTreeMap<String, String>, TimeSeries> = BTreeMap::new();
    let key = |name: &str, mut labels: BTreeMap<String, String>| {
        labels.insert("__name__".into(), name.into());
        labels
    };
    super::samples(
        reqs,
        |_| true,
        |step, name, labels, value| {
            let timestamp = times[step];
            let samples = &mut series.entry(key(name, labels)).or_default().samples;
            samples.push(Sample { value, timestamp });
        },
    );
    for (req, &timestamp) in reqs.iter().zip(&times) {
        for rm in &req.resource_metrics {
            let resource = rm.resource.as_ref().map_or(&[][..], |r| &r.attributes[..]);
            for m in rm.scope_metrics.iter().flat_map(|s| &s.metrics) {
                let Some(metric::Data::ExponentialHistogram(h)) = &m.data else {
                    continue;
                };
                for p in &h.data_points {
                    let labels = key(&super::name(m), super::labels(resource, &p.attributes, None));
                    let histograms = &mut series.entry(labels).or_default().histograms;
                    histograms.push(native(p, timestamp));
                }
            }
        }
    }
    let timeseries = series
        .into_iter()
        .map(|(labels, mut s)| {
            s.labels = labels.into_iter().map(|(name, value)| Label { name, value }).collect();
            s
        })
        .collect();
    WriteRequest { timeseries }
}

/// When a request was collected, in milliseconds since the epoch.
fn millis(req: &ExportMetricsServiceRequest) -> i64 {
    let t = super::collected(req).duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(t.as_millis()).unwrap_or(i64::MAX)
}

/// One exponential histogram point as a native histogram at `timestamp` (ms).
pub fn native(p: &ExponentialHistogramDataPoint, timestamp: i64) -> Histogram {
    assert!(
        p.scale >= MIN_SCHEMA,
        "scale {} is coarser than Prometheus' schema {MIN_SCHEMA}",
        p.scale
    );
    let shift = u32::try_from(p.scale - MAX_SCHEMA).unwrap_or(0);
    let (positive_spans, positive_deltas) = buckets(p.positive.as_ref(), shift);
    let (negative_spans, negative_deltas) = buckets(p.negative.as_ref(), shift);
    Histogram {
        count: p.count,
        sum: p.sum.unwrap_or(0.0),
        schema: p.scale.min(MAX_SCHEMA),
        zero_threshold: p.zero_threshold,
        zero_count: p.zero_count,
        negative_spans,
        negative_deltas,
        positive_spans,
        positive_deltas,
        timestamp,
    }
}

/// One side's OTLP buckets, merged `2^shift` to one, as a span and deltas: one span over the
/// contiguous buckets (empty ones inside it kept at 0).
fn buckets(b: Option<&Buckets>, shift: u32) -> (Vec<BucketSpan>, Vec<i64>) {
    let Some(b) = b.filter(|b| !b.bucket_counts.is_empty()) else {
        return (Vec::new(), Vec::new());
    };
    let mut merged: Vec<(i32, u64)> = Vec::new();
    for (i, &n) in (b.offset..).zip(&b.bucket_counts) {
        match merged.last_mut() {
            Some((j, count)) if *j == i >> shift => *count += n,
            _ => merged.push((i >> shift, n)),
        }
    }
    let span = BucketSpan {
        offset: merged[0].0 + 1,
        length: u32::try_from(merged.len()).expect("fewer than 2^32 buckets"),
    };
    let mut previous = 0i64;
    let deltas = merged
        .iter()
        .map(|&(_, n)| {
            let n = i64::try_from(n).expect("a count below 2^63");
            let delta = n - previous;
            previous = n;
            delta
        })
        .collect();
    (vec![span], deltas)
}

/// `request`'s body as remote write sends it: protobuf, snappy-compressed (block format).
pub fn body(request: &WriteRequest) -> Vec<u8> {
    snap::raw::Encoder::new()
        .compress_vec(&request.encode_to_vec())
        .expect("snappy compresses any input")
}

/// POSTs `request` to the remote-write endpoint `url` (`…/api/v1/write`); `Err` has the answer of
/// a server that refused it.
pub fn send(url: &str, request: &WriteRequest) -> Result<(), String> {
    let answer = reqwest::blocking::Client::new()
        .post(url)
        .header("Content-Encoding", "snappy")
        .header("Content-Type", "application/x-protobuf")
        .header("X-Prometheus-Remote-Write-Version", "0.1.0")
        .body(body(request))
        .send()
        .map_err(|e| format!("{url}: {e}"))?;
    let status = answer.status();
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("{url}: {status}: {}", answer.text().unwrap_or_default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(scale: i32, offset: i32, counts: &[u64]) -> ExponentialHistogramDataPoint {
        ExponentialHistogramDataPoint {
            scale,
            count: counts.iter().sum::<u64>() + 2,
            zero_count: 2,
            sum: Some(10.0),
            positive: Some(Buckets {
                offset,
                bucket_counts: counts.to_vec(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn buckets_shift_by_one_and_go_as_deltas() {
        let h = native(&point(3, -2, &[4, 0, 1]), 7);
        assert_eq!((h.schema, h.count, h.zero_count, h.timestamp), (3, 7, 2, 7));
        assert_eq!(h.positive_spans, vec![BucketSpan { offset: -1, length: 3 }]);
        assert_eq!(h.positive_deltas, vec![4, -4, 1]);
        assert!(h.negative_spans.is_empty() && h.negative_deltas.is_empty());
    }

    #[test]
    fn finer_scales_merge_down_to_schema_8() {
        // Scale 10 → 8: OTLP buckets -5..=2 become -2 (-5), -1 (-4..=-1), 0 (0..=2).
        let h = native(&point(10, -5, &[1, 1, 1, 1, 1, 1, 1, 1]), 0);
        assert_eq!(h.schema, 8);
        assert_eq!(h.positive_spans, vec![BucketSpan { offset: -1, length: 3 }]);
        assert_eq!(h.positive_deltas, vec![1, 3, -1]);
    }
}

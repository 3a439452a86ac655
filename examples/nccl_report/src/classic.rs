//! Exponential (native) histograms as classic ones, for the OpenMetrics output: its text format
//! has no native histograms, so each exponential point becomes an explicit-bucket point with the
//! same count, sum, min and max, its buckets merged to powers of two (scale 0: the same bounds for
//! every point, rank and time, as `_bucket{le}` series need; coarser scales keep their own).
//! Single-threaded.

use opentelemetry_proto::tonic::metrics::v1::{
    ExponentialHistogramDataPoint, Histogram, HistogramDataPoint, metric::Data,
};

use crate::otlp_receiver::ExportMetricsServiceRequest as Request;

/// Replaces every exponential histogram of `requests` by its classic form.
pub fn classic(requests: &mut [Request]) {
    let metrics = requests
        .iter_mut()
        .flat_map(|r| &mut r.resource_metrics)
        .flat_map(|r| &mut r.scope_metrics)
        .flat_map(|s| &mut s.metrics);
    for m in metrics {
        if let Some(Data::ExponentialHistogram(h)) = &m.data {
            m.data = Some(Data::Histogram(Histogram {
                data_points: h.data_points.iter().map(point).collect(),
                aggregation_temporality: h.aggregation_temporality,
            }));
        }
    }
}

/// One point: a bucket `(0, zero threshold]` for the zero (and negative) counts, then each power
/// of two from the lowest populated one to the highest, and `+Inf` (empty).
fn point(p: &ExponentialHistogramDataPoint) -> HistogramDataPoint {
    let negative: u64 = p.negative.as_ref().map_or(0, |b| b.bucket_counts.iter().sum());
    let mut bounds = vec![p.zero_threshold];
    let mut counts = vec![p.zero_count + negative];
    if let Some(b) = p.positive.as_ref().filter(|b| !b.bucket_counts.is_empty()) {
        // Bucket `i` at scale `s` ≥ 0 is (2^(i / 2^s), 2^((i + 1) / 2^s)], within
        // (2^(i >> s), 2^((i >> s) + 1)]; at `s` < 0 it is (2^(i << -s), 2^((i + 1) << -s)], kept.
        let power = |k: usize| (b.offset + k as i32) >> p.scale.max(0);
        let width = 1 << (-p.scale).max(0);
        let (low, high) = (power(0), power(b.bucket_counts.len() - 1));
        let mut merged = vec![0; (high - low + 1) as usize];
        for (k, n) in b.bucket_counts.iter().enumerate() {
            merged[(power(k) - low) as usize] += n;
        }
        bounds.extend((low..=high).map(|i| 2f64.powi((i + 1) * width)));
        counts.extend(merged);
    }
    counts.push(0);
    HistogramDataPoint {
        attributes: p.attributes.clone(),
        start_time_unix_nano: p.start_time_unix_nano,
        time_unix_nano: p.time_unix_nano,
        count: p.count,
        sum: p.sum,
        bucket_counts: counts,
        explicit_bounds: bounds,
        exemplars: Vec::new(),
        flags: p.flags,
        min: p.min,
        max: p.max,
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::metrics::v1::exponential_histogram_data_point::Buckets;

    use super::*;

    /// Scale 2 buckets 0..8 (1 to 4) merge into (1, 2] and (2, 4]; the zero count stays apart.
    #[test]
    fn buckets_merge_to_powers_of_two() {
        let p = ExponentialHistogramDataPoint {
            count: 12,
            sum: Some(30.0),
            scale: 2,
            zero_count: 1,
            positive: Some(Buckets {
                offset: 0,
                bucket_counts: vec![1, 2, 0, 1, 3, 0, 4, 0],
            }),
            ..Default::default()
        };
        let c = point(&p);
        assert_eq!(c.explicit_bounds, [0.0, 2.0, 4.0]);
        assert_eq!(c.bucket_counts, [1, 4, 7, 0]);
        assert_eq!((c.count, c.sum), (12, Some(30.0)));
    }
}

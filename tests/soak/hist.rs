//! Callback latency histograms: log-linear buckets, merged over threads, read by quantile.

/// Linear below 16 ns, then 16 sub-buckets per power of two (≤ 6.25 % error), up to 2^63 ns.
const BUCKETS: usize = 61 * 16;

fn bucket(ns: u64) -> usize {
    if ns < 16 {
        return ns as usize;
    }
    let e = 63 - ns.leading_zeros() as usize;
    (e - 3) * 16 + ((ns >> (e - 4)) & 15) as usize
}

/// Smallest value of bucket `b`.
fn bucket_low(b: usize) -> u64 {
    if b < 16 {
        return b as u64;
    }
    (16 + b as u64 % 16) << (b / 16 - 1)
}

/// Largest value of bucket `b`.
fn bucket_high(b: usize) -> u64 {
    if b + 1 >= BUCKETS {
        return u64::MAX;
    }
    bucket_low(b + 1) - 1
}

/// Callback latencies of one phase.
#[derive(Clone)]
pub struct Hist {
    counts: Vec<u64>,
    pub n: u64,
    pub max: u64,
}

impl Hist {
    pub fn new() -> Hist {
        Hist {
            counts: vec![0; BUCKETS],
            n: 0,
            max: 0,
        }
    }

    pub fn record(&mut self, ns: u64) {
        self.counts[bucket(ns).min(BUCKETS - 1)] += 1;
        self.n += 1;
        self.max = self.max.max(ns);
    }

    pub fn merge(&mut self, o: &Hist) {
        self.counts.iter_mut().zip(&o.counts).for_each(|(a, b)| *a += b);
        self.n += o.n;
        self.max = self.max.max(o.max);
    }

    /// The `q` quantile (bucket upper bound, at most the maximum); 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        let rank = ((q * self.n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return bucket_high(b).min(self.max);
            }
        }
        0
    }
}

#[test]
fn latency_buckets_cover_every_value_once() {
    for b in 0..BUCKETS - 1 {
        assert_eq!(bucket(bucket_low(b)), b);
        assert_eq!(bucket(bucket_high(b)), b);
        assert_eq!(bucket_high(b) + 1, bucket_low(b + 1));
    }
    assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    let mut h = Hist::new();
    (1..=1000).for_each(|ns| h.record(ns));
    let p50 = h.quantile(0.5);
    assert!((500..=500 + 500 / 16).contains(&p50), "{p50}");
    assert_eq!(h.quantile(1.0), 1000);
}

//! Least-squares fit of transfer time against transfer size: `secs = latency + bytes / bandwidth`.
//!
//! Owns [`fit`] (ordinary least squares over a slice) and [`Samples`], mergeable sufficient
//! statistics for one rank pair, so per-window results combine across windows and sources.
//! Pure arithmetic: no I/O, clocks, atomics or locks. Used on the telemetry thread only; nothing
//! here is reachable from an NCCL callback.
//!
//! Invariants: sums are centred on the means, so `x ~ 1e9` bytes against `y ~ 1e-6` seconds does
//! not cancel; a returned [`Fit`] has finite fields, `slope > 0` and `0 <= r2 <= 1`.
#![forbid(unsafe_code)]

pub use crate::config::Mode;

/// A fitted line `secs = intercept + slope * bytes`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fit {
    /// Seconds per byte (inverse bandwidth); `> 0` for every fit made here.
    pub slope: f64,
    /// Seconds at zero bytes; may be slightly negative from noise, see [`Fit::latency`].
    pub intercept: f64,
    /// Coefficient of determination, `1 - SSres / SStot`, in `[0, 1]`.
    pub r2: f64,
    /// Points used: samples for [`Mode::Avg`] and [`fit`], distinct sizes for [`Mode::Min`].
    pub n: u64,
}

impl Fit {
    /// Latency in seconds: the intercept when it is positive. Noise can push a near-zero
    /// intercept to or below zero, and a latency of zero is as meaningless as a negative one: the
    /// fit cannot tell it.
    pub fn latency(&self) -> Option<f64> {
        (self.intercept > 0.0).then_some(self.intercept)
    }

    /// Bandwidth in bytes per second, `1 / slope`.
    pub fn bandwidth(&self) -> f64 {
        self.slope.recip()
    }
}

/// Ordinary least squares of `secs` (y) on `bytes` (x) over `(bytes, secs)` points.
///
/// Two passes: means first, then centred sums. `None` when there are fewer than 2 points or
/// distinct sizes, any input or result is non-finite, or the slope is not positive (time that
/// does not grow with size has no bandwidth). A constant time is slope 0, hence `None`, so a
/// returned fit always has `SStot > 0` and a defined `r2`.
pub fn fit(points: &[(f64, f64)]) -> Option<Fit> {
    fit_iter(points.iter().copied())
}

/// Most distinct sizes a [`Samples`] tracks for [`Mode::Min`].
pub const MAX_SIZES: usize = 256;
/// The percentile of each size's times that [`Mode::Min`] fits (nearest rank, `⌊q·n⌋ + 1`, at
/// least the second fastest): one sample in ten may be too short without moving it.
pub const MIN_QUANTILE: f64 = 0.1;
/// Mantissa bits a time bucket keeps: buckets are 2⁻⁹ of their octave wide (0.1–0.2 %), so the
/// percentile found is a sample within 0.2 % below the exact one.
const BUCKET_MANTISSA_BITS: u32 = 9;
/// Lowest buckets kept per size (at least 6 % of range above its fastest time); slower times
/// are only counted.
const MAX_BUCKETS: usize = 64;

/// Mergeable sufficient statistics of `(bytes, secs)` samples for both [`Mode`]s.
///
/// [`Mode::Avg`] keeps centred moments (Welford per sample, Chan et al. per merge), so a merged
/// fit equals the fit of all samples up to float rounding, in any order. [`Mode::Min`] keeps,
/// per distinct size (at most [`MAX_SIZES`]; once full, a new size is not tracked), a sparse
/// histogram of its lowest times in logarithmic buckets with each bucket's count and fastest
/// sample. Below those bounds merging is exact and order-independent.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Samples {
    moments: Moments,
    /// Sorted by bytes, unique bytes, at most `MAX_SIZES` entries.
    sizes: Vec<SizeTimes>,
}

/// The lowest times of one transfer size.
#[derive(Clone, Debug, PartialEq)]
struct SizeTimes {
    bytes: u64,
    /// Samples of this size, kept or not.
    n: u64,
    /// `(bucket, count, fastest time in it)`, sorted by bucket, all below `cutoff`.
    buckets: Vec<(i32, u64, f64)>,
    /// Buckets from here up were not kept (`i32::MAX`: none dropped).
    cutoff: i32,
}

impl SizeTimes {
    fn new(bytes: u64) -> SizeTimes {
        SizeTimes {
            bytes,
            n: 0,
            buckets: Vec::new(),
            cutoff: i32::MAX,
        }
    }

    /// Adds `count` samples in `secs`' bucket, the fastest of them `secs`.
    fn add(&mut self, bucket: i32, count: u64, secs: f64) {
        self.n += count;
        if bucket >= self.cutoff {
            return;
        }
        match self.buckets.binary_search_by_key(&bucket, |b| b.0) {
            Ok(i) => {
                if let Some(b) = self.buckets.get_mut(i) {
                    b.1 += count;
                    b.2 = b.2.min(secs);
                }
            }
            Err(i) => {
                self.buckets.insert(i, (bucket, count, secs));
                if self.buckets.len() > MAX_BUCKETS
                    && let Some(dropped) = self.buckets.pop()
                {
                    self.cutoff = dropped.0;
                }
            }
        }
    }

    fn merge(&mut self, other: &SizeTimes) {
        self.n += other.n - other.buckets.iter().map(|b| b.1).sum::<u64>();
        self.cutoff = self.cutoff.min(other.cutoff);
        let cutoff = self.cutoff;
        self.buckets.retain(|b| b.0 < cutoff);
        for &(bucket, count, secs) in &other.buckets {
            self.add(bucket, count, secs);
        }
    }

    /// The [`MIN_QUANTILE`] time, at least the second fastest of two or more (one sample in a
    /// few may be too short): the fastest sample of the bucket holding that rank; `None` when the
    /// rank lies among the times not kept.
    fn quantile(&self) -> Option<f64> {
        let rank = ((MIN_QUANTILE * self.n as f64) as u64).max(u64::from(self.n >= 2));
        let mut below = 0;
        for &(_, count, secs) in &self.buckets {
            below += count;
            if rank < below {
                return Some(secs);
            }
        }
        None
    }
}

/// Logarithmic bucket of a time (`secs >= 0`); 0 s has the lowest bucket.
fn bucket(secs: f64) -> i32 {
    // A positive finite double's bits grow with its value: exponent and top mantissa bits are a
    // logarithmic bucket without computing a logarithm.
    if secs > 0.0 {
        (secs.to_bits() >> (f64::MANTISSA_DIGITS - 1 - BUCKET_MANTISSA_BITS)) as i32
    } else {
        i32::MIN
    }
}

impl Samples {
    /// Adds one transfer; ignores a `secs` that is negative or not finite.
    pub fn push(&mut self, bytes: u64, secs: f64) {
        if !(secs.is_finite() && secs >= 0.0) {
            return;
        }
        self.moments.push(bytes as f64, secs);
        if let Some(size) = self.size(bytes) {
            size.add(bucket(secs), 1, secs);
        }
    }

    /// Adds every sample of `other`, as if each had been pushed here.
    pub fn merge(&mut self, other: &Samples) {
        self.moments.merge(&other.moments);
        for o in &other.sizes {
            if let Some(size) = self.size(o.bytes) {
                size.merge(o);
            }
        }
    }

    /// Number of accepted samples.
    #[cfg(any(test, feature = "testing"))]
    pub fn len(&self) -> u64 {
        self.moments.n
    }

    /// Whether no sample was accepted.
    pub fn is_empty(&self) -> bool {
        self.moments.n == 0
    }

    /// Fits the samples in `mode`, with the same `None` cases as [`fit`].
    pub fn fit(&self, mode: Mode) -> Option<Fit> {
        match mode {
            Mode::Avg => self.moments.fit(),
            Mode::Min => {
                let points: Vec<(f64, f64)> = self
                    .sizes
                    .iter()
                    .filter_map(|s| Some((s.bytes as f64, s.quantile()?)))
                    .collect();
                fit(&points)
            }
        }
    }

    /// Distinct sizes tracked.
    pub fn sizes(&self) -> usize {
        self.sizes.len()
    }

    /// The latency these samples imply at a known `bandwidth` (bytes/s): the mean over samples
    /// ([`Mode::Avg`]) or over sizes of their percentile ([`Mode::Min`]) of `secs - bytes /
    /// bandwidth`; `None` without samples (or a percentile kept), and when it is not positive
    /// (the transfers took no longer than their bytes at that rate: no latency can be told).
    pub fn latency_at(&self, mode: Mode, bandwidth: f64) -> Option<f64> {
        let excess = |bytes: f64, secs: f64| secs - bytes / bandwidth;
        let l = match mode {
            Mode::Avg => (self.moments.n > 0).then(|| excess(self.moments.mean_x, self.moments.mean_y))?,
            Mode::Min => {
                let per_size: Vec<f64> = self
                    .sizes
                    .iter()
                    .filter_map(|s| Some(excess(s.bytes as f64, s.quantile()?)))
                    .collect();
                (!per_size.is_empty()).then(|| per_size.iter().sum::<f64>() / per_size.len() as f64)?
            }
        };
        (l.is_finite() && l > 0.0).then_some(l)
    }

    /// The entry of `bytes`, tracking it if the table has room.
    fn size(&mut self, bytes: u64) -> Option<&mut SizeTimes> {
        let i = match self.sizes.binary_search_by_key(&bytes, |s| s.bytes) {
            Ok(i) => i,
            Err(i) if self.sizes.len() < MAX_SIZES => {
                self.sizes.insert(i, SizeTimes::new(bytes));
                i
            }
            Err(_) => return None,
        };
        self.sizes.get_mut(i)
    }
}

/// Count, means and centred sums of squares and cross-products of `(x, y)`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Moments {
    n: u64,
    mean_x: f64,
    mean_y: f64,
    sxx: f64,
    sxy: f64,
    syy: f64,
}

impl Moments {
    /// Welford's update. Exact for constant `x` or `y`: the mean stays equal and its sums stay 0.
    fn push(&mut self, x: f64, y: f64) {
        self.n += 1;
        let n = self.n as f64;
        let dx = x - self.mean_x;
        let dy = y - self.mean_y;
        self.mean_x += dx / n;
        self.mean_y += dy / n;
        let ry = y - self.mean_y;
        self.sxx += dx * (x - self.mean_x);
        self.sxy += dx * ry;
        self.syy += dy * ry;
    }

    /// Chan, Golub and LeVeque's pairwise combination.
    fn merge(&mut self, other: &Moments) {
        if other.n == 0 {
            return;
        }
        if self.n == 0 {
            *self = *other;
            return;
        }
        let (na, nb) = (self.n as f64, other.n as f64);
        let n = na + nb;
        let dx = other.mean_x - self.mean_x;
        let dy = other.mean_y - self.mean_y;
        let w = na * nb / n;
        self.n += other.n;
        self.mean_x += dx * (nb / n);
        self.mean_y += dy * (nb / n);
        self.sxx += other.sxx + dx * dx * w;
        self.sxy += other.sxy + dx * dy * w;
        self.syy += other.syy + dy * dy * w;
    }

    /// The least-squares line; `None` as documented on [`fit`].
    ///
    /// `SSres = Syy - Sxy²/Sxx`, so `r2 = Sxy² / (Sxx·Syy)`, computed without the subtraction.
    fn fit(&self) -> Option<Fit> {
        let Moments {
            n,
            mean_x,
            mean_y,
            sxx,
            sxy,
            syy,
        } = *self;
        // Written positively so that NaN fails every comparison.
        let usable = n >= 2 && sxx > 0.0 && syy > 0.0 && sxx.is_finite() && syy.is_finite();
        if !usable {
            return None;
        }
        let slope = sxy / sxx;
        if !(slope > 0.0 && slope.is_finite()) {
            return None;
        }
        let intercept = mean_y - slope * mean_x;
        let r = sxy / (sxx.sqrt() * syy.sqrt());
        let r2 = (r * r).clamp(0.0, 1.0);
        (intercept.is_finite() && r2.is_finite()).then_some(Fit {
            slope,
            intercept,
            r2,
            n,
        })
    }
}

/// Two-pass [`fit`] over a re-iterable sequence of points.
fn fit_iter<I: Iterator<Item = (f64, f64)> + Clone>(points: I) -> Option<Fit> {
    let mut n = 0u64;
    let (mut sum_x, mut sum_y) = (0.0, 0.0);
    let (mut min_x, mut max_x) = (f64::INFINITY, f64::NEG_INFINITY);
    let (mut min_y, mut max_y) = (f64::INFINITY, f64::NEG_INFINITY);
    for (x, y) in points.clone() {
        if !(x.is_finite() && y.is_finite()) {
            return None;
        }
        n += 1;
        sum_x += x;
        sum_y += y;
        (min_x, max_x) = (min_x.min(x), max_x.max(x));
        (min_y, max_y) = (min_y.min(y), max_y.max(y));
    }
    if n < 2 || min_x == max_x || !sum_x.is_finite() || !sum_y.is_finite() {
        return None;
    }
    // A constant column keeps its exact value as mean, so its centred sums are exactly 0.
    let mean = |sum: f64, lo: f64, hi: f64| {
        if lo == hi { lo } else { (sum / n as f64).clamp(lo, hi) }
    };
    let (mean_x, mean_y) = (mean(sum_x, min_x, max_x), mean(sum_y, min_y, max_y));
    let (mut sxx, mut sxy, mut syy) = (0.0, 0.0, 0.0);
    for (x, y) in points {
        let (dx, dy) = (x - mean_x, y - mean_y);
        sxx += dx * dx;
        sxy += dx * dy;
        syy += dy * dy;
    }
    Moments {
        n,
        mean_x,
        mean_y,
        sxx,
        sxy,
        syy,
    }
    .fit()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KIB: u64 = 1 << 10;
    const GIB: u64 = 1 << 30;

    fn rel(a: f64, b: f64) -> f64 {
        (a - b).abs() / b.abs()
    }

    /// Asserts two AVG fits agree to `1e-9`: slope relative, intercept relative to the time scale.
    fn assert_close(got: Option<Fit>, want: Option<Fit>, y_scale: f64) {
        match (got, want) {
            (Some(g), Some(w)) => {
                assert_eq!(g.n, w.n);
                assert!(rel(g.slope, w.slope) < 1e-9, "{g:?} vs {w:?}");
                assert!((g.intercept - w.intercept).abs() <= 1e-9 * y_scale, "{g:?} vs {w:?}");
                assert!((g.r2 - w.r2).abs() < 1e-9, "{g:?} vs {w:?}");
            }
            (g, w) => assert_eq!(g.is_some(), w.is_some(), "{g:?} vs {w:?}"),
        }
    }

    fn samples(points: &[(u64, f64)]) -> Samples {
        let mut s = Samples::default();
        for &(b, t) in points {
            s.push(b, t);
        }
        s
    }

    fn as_f64(points: &[(u64, f64)]) -> Vec<(f64, f64)> {
        points.iter().map(|&(b, t)| (b as f64, t)).collect()
    }

    /// Distinct power-of-two sizes from 1 KiB to 1 GiB, at least `min` of them, in random order.
    fn pow2_sizes(min: usize) -> impl Strategy<Value = Vec<u64>> {
        proptest::sample::subsequence((10..=30).map(|k| 1u64 << k).collect::<Vec<_>>(), min..=21).prop_shuffle()
    }

    /// Samples at power-of-two sizes, each size 1..4 times, with up to 50% queueing delay on the
    /// bandwidth term: sizes at least 2x apart keep their time ranges ordered, so the slope is
    /// clearly positive.
    fn noisy_points() -> impl Strategy<Value = Vec<(u64, f64)>> {
        (pow2_sizes(2), 1e-6..1e-3f64, 1e-11..1e-8f64).prop_flat_map(|(sizes, a, b)| {
            let per_size = sizes.into_iter().map(move |x| {
                proptest::collection::vec(0.0..0.5f64, 1..4).prop_map(move |us| {
                    us.into_iter()
                        .map(|u| (x, a + b * x as f64 * (1.0 + u)))
                        .collect::<Vec<_>>()
                })
            });
            per_size.collect::<Vec<_>>().prop_map(|v| v.concat()).prop_shuffle()
        })
    }

    fn y_scale(points: &[(u64, f64)]) -> f64 {
        points.iter().fold(0.0, |m, &(_, t)| m.max(t.abs()))
    }

    proptest! {
        #[test]
        fn exact_line_comes_back(sizes in pow2_sizes(2), a in 1e-6..1e-3f64, b in 1e-11..1e-8f64,
                                 reps in 1usize..4) {
            let points: Vec<(u64, f64)> =
                sizes.iter().flat_map(|&x| std::iter::repeat_n((x, a + b * x as f64), reps)).collect();
            let s = samples(&points);
            for (f, n) in [
                (fit(&as_f64(&points)), points.len()),
                (s.fit(Mode::Avg), points.len()),
                (s.fit(Mode::Min), sizes.len()),
            ] {
                let f = f.expect("an exact line fits");
                prop_assert!(rel(f.slope, b) < 1e-6, "{f:?} a={a} b={b}");
                prop_assert!(rel(f.intercept, a) < 1e-6, "{f:?} a={a} b={b}");
                prop_assert!(rel(f.latency().unwrap(), a) < 1e-6);
                prop_assert!(rel(f.bandwidth(), 1.0 / b) < 1e-6);
                prop_assert!(f.r2 > 1.0 - 1e-9 && f.r2 <= 1.0, "{f:?}");
                prop_assert_eq!(f.n, n as u64);
            }
        }

        /// Arbitrary distinct sizes can be close together, which makes the intercept ill-conditioned;
        /// the slope and the fitted times must still match.
        #[test]
        fn exact_line_any_sizes(sizes in proptest::collection::btree_set(KIB..=GIB, 2..40),
                                a in 1e-6..1e-3f64, b in 1e-11..1e-8f64) {
            let points: Vec<(f64, f64)> = sizes.iter().map(|&x| (x as f64, a + b * x as f64)).collect();
            let f = fit(&points).expect("an exact line fits");
            prop_assert!(rel(f.slope, b) < 1e-6, "{f:?} a={a} b={b}");
            for &(x, y) in &points {
                prop_assert!(rel(f.intercept + f.slope * x, y) < 1e-9, "{f:?} at {x}");
            }
            prop_assert!(f.r2 > 1.0 - 1e-9 && f.r2 <= 1.0);
        }

        #[test]
        fn one_distinct_size_is_none(x in KIB..=GIB, ts in proptest::collection::vec(1e-6..1e-1f64, 0..50)) {
            let points: Vec<(u64, f64)> = ts.iter().map(|&t| (x, t)).collect();
            prop_assert_eq!(fit(&as_f64(&points)), None);
            let s = samples(&points);
            prop_assert_eq!(s.len(), points.len() as u64);
            prop_assert_eq!(s.fit(Mode::Avg), None);
            prop_assert_eq!(s.fit(Mode::Min), None);
        }

        #[test]
        fn merge_of_any_split_equals_fit_of_all(points in noisy_points(), mask in any::<u64>()) {
            let (mut a, mut b) = (Samples::default(), Samples::default());
            for (i, &(x, t)) in points.iter().enumerate() {
                if mask >> (i % 64) & 1 == 1 { a.push(x, t) } else { b.push(x, t) }
            }
            let all = samples(&points);
            let mut merged = a.clone();
            merged.merge(&b);
            prop_assert_eq!(merged.len(), points.len() as u64);
            prop_assert_eq!(&merged.sizes, &all.sizes);
            prop_assert_eq!(merged.fit(Mode::Min), all.fit(Mode::Min));
            prop_assert!(merged.fit(Mode::Avg).is_some());
            assert_close(merged.fit(Mode::Avg), fit(&as_f64(&points)), y_scale(&points));
            assert_close(merged.fit(Mode::Avg), all.fit(Mode::Avg), y_scale(&points));
            b.merge(&a);
            prop_assert_eq!(b.fit(Mode::Min), all.fit(Mode::Min));
            assert_close(b.fit(Mode::Avg), all.fit(Mode::Avg), y_scale(&points));
        }

        #[test]
        fn order_does_not_matter((points, shuffled) in noisy_points()
            .prop_flat_map(|p| (Just(p.clone()), Just(p).prop_shuffle()))) {
            let scale = y_scale(&points);
            assert_close(fit(&as_f64(&shuffled)), fit(&as_f64(&points)), scale);
            let (s, t) = (samples(&points), samples(&shuffled));
            assert_close(t.fit(Mode::Avg), s.fit(Mode::Avg), scale);
            prop_assert_eq!(t.fit(Mode::Min), s.fit(Mode::Min));
        }

        #[test]
        fn non_positive_slope_is_none(sizes in pow2_sizes(2), a in 2.0..3.0f64, b in 0.0..1e-9f64,
                                      zero in any::<bool>()) {
            let b = if zero { 0.0 } else { b };
            let points: Vec<(u64, f64)> = sizes.iter().map(|&x| (x, a - b * x as f64)).collect();
            prop_assert_eq!(fit(&as_f64(&points)), None);
            let s = samples(&points);
            prop_assert_eq!(s.fit(Mode::Avg), None);
            prop_assert_eq!(s.fit(Mode::Min), None);
        }

        #[test]
        fn r2_stays_in_unit_interval(points in proptest::collection::vec((KIB..=GIB, 0.0..1e-1f64), 0..60)) {
            let s = samples(&points);
            for f in [fit(&as_f64(&points)), s.fit(Mode::Avg), s.fit(Mode::Min)].into_iter().flatten() {
                prop_assert!((0.0..=1.0).contains(&f.r2), "{f:?}");
                prop_assert!(f.slope > 0.0 && f.slope.is_finite() && f.intercept.is_finite());
            }
        }

        #[test]
        fn noisy_fit_is_valid(points in noisy_points()) {
            let s = samples(&points);
            for mode in [Mode::Avg, Mode::Min] {
                let f = s.fit(mode).expect("sizes are distinct and the slope positive");
                prop_assert!((0.0..=1.0).contains(&f.r2), "{f:?}");
                prop_assert!(f.latency().is_none_or(|l| l > 0.0));
            }
        }
    }

    #[test]
    fn latency_at_a_known_bandwidth_needs_one_size_only() {
        let (a, bw) = (20e-6, 12e9);
        let s = samples(&[
            (1 << 19, a + (1 << 19) as f64 / bw),
            (1 << 19, a + (1 << 19) as f64 / bw),
        ]);
        assert_eq!(s.fit(Mode::Avg), None, "one size: no fit");
        for mode in [Mode::Avg, Mode::Min] {
            assert!(rel(s.latency_at(mode, bw).unwrap(), a) < 1e-9);
        }
        assert_eq!(Samples::default().latency_at(Mode::Avg, bw), None);
        assert_eq!(s.sizes(), 1);
    }

    #[test]
    fn mode_parses_case_insensitively() {
        assert_eq!(Mode::parse("AVG"), Some(Mode::Avg));
        assert_eq!(Mode::parse("min"), Some(Mode::Min));
        assert_eq!(Mode::parse(" Min "), Some(Mode::Min));
        assert_eq!(Mode::parse(""), None);
        assert_eq!(Mode::parse("mean"), None);
        for m in [Mode::Avg, Mode::Min] {
            assert_eq!(Mode::parse(m.as_str()), Some(m));
        }
    }

    #[test]
    fn too_few_points_or_bad_input_is_none() {
        assert_eq!(fit(&[]), None);
        assert_eq!(fit(&[(1024.0, 1e-5)]), None);
        assert_eq!(fit(&[(1024.0, 1e-5), (2048.0, f64::NAN)]), None);
        assert_eq!(fit(&[(f64::INFINITY, 1e-5), (2048.0, 2e-5)]), None);
        assert_eq!(fit(&[(1e308, 1.0), (1.7e308, 2.0)]), None);
        assert!(fit(&[(1024.0, 1e-5), (2048.0, 2e-5)]).is_some());
    }

    #[test]
    fn push_ignores_negative_and_non_finite_secs() {
        let mut s = Samples::default();
        assert!(s.is_empty());
        for t in [-1e-6, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            s.push(1024, t);
        }
        assert!(s.is_empty());
        assert_eq!(s, Samples::default());
        s.push(1024, 0.0);
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn min_fits_a_low_percentile_per_size() {
        let (a, b) = (5e-6, 1e-10);
        let mut s = Samples::default();
        for x in [KIB, 1 << 20, 1 << 25, GIB] {
            let best = a + b * x as f64;
            // Nine samples: the rank is 1, the second fastest.
            for slow in [3.0, 1.0, 1.0, 2.0, 2.5, 1.25, 1.75, 2.25, 2.75] {
                s.push(x, best * slow);
            }
        }
        let f = s.fit(Mode::Min).unwrap();
        assert_eq!(f.n, 4);
        assert!(rel(f.slope, b) < 1e-9 && rel(f.intercept, a) < 1e-9, "{f:?}");
        assert_eq!(s.fit(Mode::Avg).unwrap().n, 36);
    }

    /// 1 % of transfers timed far too short (a proxy thread preempted between posting a send
    /// and its SendWait callback) move no MIN figure by more than 2 %.
    #[test]
    fn min_ignores_one_percent_of_impossible_samples() {
        let (a, b) = (20e-6, 1.0 / 12e9);
        let (mut clean, mut noisy) = (Samples::default(), Samples::default());
        let mut state = 7u64;
        let mut uniform = || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for x in [64 * KIB, 128 * KIB, 256 * KIB, 512 * KIB] {
            for i in 0..400 {
                let t = (a + b * x as f64) * (1.0 + 0.02 * (2.0 * uniform() - 1.0));
                clean.push(x, t);
                noisy.push(x, if i % 100 == 7 { 0.13e-6 } else { t });
            }
        }
        let (c, n) = (clean.fit(Mode::Min).unwrap(), noisy.fit(Mode::Min).unwrap());
        assert!(rel(n.latency().unwrap(), c.latency().unwrap()) < 0.02, "{n:?} vs {c:?}");
        assert!(rel(n.bandwidth(), c.bandwidth()) < 0.02, "{n:?} vs {c:?}");
        assert!(
            rel(c.latency().unwrap(), a) < 0.05 && rel(c.bandwidth(), 1.0 / b) < 0.05,
            "{c:?}"
        );
    }

    #[test]
    fn min_table_is_bounded() {
        let mut s = Samples::default();
        for i in 1..=MAX_SIZES as u64 {
            s.push(i * KIB, 1e-3 + i as f64 * 1e-6);
        }
        assert_eq!(s.sizes.len(), MAX_SIZES);
        s.push(0, 1e-3);
        s.push(10_000 * KIB, 1.0);
        assert_eq!(s.sizes.len(), MAX_SIZES, "a full table tracks no new size");
        assert_eq!(s.len(), MAX_SIZES as u64 + 2);
        // A tracked size still takes new times.
        s.push(KIB, 1e-4);
        assert_eq!(s.sizes[0].quantile(), Some(1e-3 + 1e-6), "the second fastest of two");
        assert_eq!(s.fit(Mode::Min).unwrap().n, MAX_SIZES as u64);

        let mut other = Samples::default();
        other.push(KIB, 1e-5);
        other.push(20_000 * KIB, 1.0);
        other.push(30_000 * KIB, 1.0);
        s.merge(&other);
        assert_eq!(s.sizes[0].quantile(), Some(1e-4));
        assert_eq!(s.sizes.len(), MAX_SIZES);
        let mut more = Samples::default();
        more.merge(&s);
        assert_eq!(more, s);
    }

    #[test]
    fn time_buckets_are_bounded_and_merge_exactly() {
        // 1,000 distinct times 1 % apart: only the lowest buckets are kept, every sample counted.
        let times: Vec<f64> = (0..1000).map(|i| 1e-5 * 1.01f64.powi(i)).collect();
        let mut all = Samples::default();
        let (mut a, mut b) = (Samples::default(), Samples::default());
        for (i, &t) in times.iter().enumerate() {
            all.push(KIB, t);
            if i % 3 == 0 { a.push(KIB, t) } else { b.push(KIB, t) }
        }
        assert!(all.sizes[0].buckets.len() <= MAX_BUCKETS);
        assert_eq!(all.sizes[0].n, 1000);
        a.merge(&b);
        assert_eq!(a.sizes[0].n, 1000);
        // The 10th percentile (rank 100) lies among the slower times not kept.
        assert_eq!(a.sizes[0].quantile(), None);
        assert_eq!(all.sizes[0].quantile(), None);
        let few: Vec<f64> = times[..40].to_vec();
        let mut f = Samples::default();
        few.iter().for_each(|&t| f.push(KIB, t));
        assert_eq!(f.sizes[0].quantile(), Some(few[4]));
    }

    #[test]
    fn merging_empty_changes_nothing() {
        let s = samples(&[(KIB, 1e-5), (2 * KIB, 2e-5), (4 * KIB, 3e-5)]);
        let mut t = s.clone();
        t.merge(&Samples::default());
        assert_eq!(t, s);
        let mut e = Samples::default();
        e.merge(&s);
        assert_eq!(e, s);
    }

    #[test]
    fn no_latency_from_an_intercept_at_or_below_zero() {
        let f = Fit {
            slope: 0.5f64.powi(30),
            intercept: -1e-9,
            r2: 1.0,
            n: 2,
        };
        assert_eq!(f.latency(), None);
        assert_eq!(f.bandwidth(), GIB as f64);
        let f = fit(&[(1e6, 1e-3 - 1e-9), (2e6, 2e-3 - 1e-9)]).unwrap();
        assert!(f.intercept < 0.0 && f.latency().is_none(), "{f:?}");
    }

    #[test]
    fn constant_time_is_none_without_rounding_slope() {
        // 0.1 has no exact sum; the mean must still equal 0.1 so the slope is exactly 0.
        let points = [(1e3, 0.1), (1e6, 0.1), (1e9, 0.1)];
        assert_eq!(fit(&points), None);
        let s = samples(&[(1000, 0.1), (1_000_000, 0.1), (1_000_000_000, 0.1)]);
        assert_eq!(s.fit(Mode::Avg), None);
        assert_eq!(s.fit(Mode::Min), None);
    }
}

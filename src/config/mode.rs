//! The regression mode ([`LINEAR_REGRESSION_MODE`](super::LINEAR_REGRESSION_MODE)): which transfer
//! times the bandwidth/latency fit of `aggregate::regression` uses. A plain value, read once with
//! the configuration and then shared by any thread.
#![forbid(unsafe_code)]

/// Which points a bandwidth/latency fit uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every sample.
    Avg,
    /// For each distinct size, a low percentile (`aggregate::regression::MIN_QUANTILE`) of its
    /// times: the best-case path, robust to queueing noise and to the rare sample a preempted
    /// thread made too short.
    Min,
}

impl Mode {
    /// Parses `AVG` or `MIN`, ignoring ASCII case and surrounding whitespace.
    pub fn parse(s: &str) -> Option<Mode> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("avg") {
            Some(Mode::Avg)
        } else if s.eq_ignore_ascii_case("min") {
            Some(Mode::Min)
        } else {
            None
        }
    }

    /// The canonical spelling, `AVG` or `MIN`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Avg => "AVG",
            Mode::Min => "MIN",
        }
    }
}

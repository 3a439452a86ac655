//! A link's transfers as the queue they form. NCCL keeps up to 8 steps per connection in flight,
//! and the connections of all channels to one peer share the link: a step handed to the network
//! (SendWait) while earlier ones are still in flight waits behind them, so its SendWait → stop
//! grows with the queue ahead, not only with its size. Taken in SendWait order, a transfer
//! - **opens** a busy period of the link when every earlier transfer of the link had completed:
//!   a candidate idle transfer, idle only when no other transfer of the process (any link,
//!   communicator or window) was in flight at its SendWait either ([`super::idle`]);
//! - otherwise **waited** behind the link's earlier transfers until the latest of them completed;
//! - was **queued** when it was handed over more than the wire latency before that completion:
//!   the wire was still busy, so it completes after the previous completion by the time the wire
//!   took its bytes, plus that of any other link's transfer the NIC sent in between (a low
//!   percentile of the opening transfers' times bounds the latency from above, so only transfers
//!   certain to have queued count, and a few times made too short by a preempted proxy thread do
//!   not lower the bound). The queued transfers whose gap no other transfer of the process
//!   shared give the wire's own rate ([`super::idle`]).
//!
//! NCCL's proxy thread sees completions once per pass of its progress loop: those of one pass
//! are stopped together, whenever in the pass they happened. A completion less than
//! [`SAME_PASS`] after the one before is one observation with it: a gap runs from one
//! observation to the next and carries the bytes of every queued transfer in the later one (a
//! pass's second completion alone would be bytes over almost no time). The gap is clean only when
//! no other link's transfer completed within [`SAME_PASS`] of it either: one seen in the same
//! pass may have completed on either side of its edge.
//!
//! The link was **busy** while at least one transfer was in flight.
//!
//! Pure; called on the telemetry thread (or `finalize`) per link and window.
#![forbid(unsafe_code)]

use super::regression::{Mode, Samples};

/// One transfer: SendWait and stop (clock ticks) and bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// SendWait, clock ticks.
    pub sent: u64,
    /// Stop, clock ticks.
    pub stop: u64,
    /// Bytes of the SendWait.
    pub bytes: u64,
    /// The caller's tag (the channel's group index).
    pub tag: u32,
}

/// The clean gaps' bytes and seconds: the wire's rate is their ratio of sums. A gap's ends are
/// completions as the proxy saw them, each late by however long it took to look (the rest of its
/// pass, a preemption): a gap is its bytes' wire time plus the difference of two such delays,
/// which cancel over consecutive gaps.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Clean {
    n: u64,
    bytes: u64,
    secs: f64,
}

impl Clean {
    /// Adds `other`'s gaps.
    pub fn merge(&mut self, other: &Clean) {
        self.n += other.n;
        self.bytes = self.bytes.saturating_add(other.bytes);
        self.secs += other.secs;
    }

    /// Adds a clean gap.
    pub fn add(&mut self, gap: &Gap) {
        self.merge(&Clean {
            n: 1,
            bytes: gap.bytes,
            secs: gap.secs,
        });
    }

    /// Clean gaps added.
    #[cfg(test)]
    pub fn gaps(&self) -> u64 {
        self.n
    }

    /// Bytes per second over the gaps, when there are [`MIN_CLEAN`] of them.
    pub fn per_sec(&self) -> Option<f64> {
        let rate = self.bytes as f64 / self.secs;
        (self.n >= MIN_CLEAN && rate.is_finite() && rate > 0.0).then_some(rate)
    }
}

/// A transfer that opened a busy period of the link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Opener {
    /// Its SendWait, clock ticks.
    pub sent: u64,
    /// Its bytes.
    pub bytes: u64,
    /// Its SendWait → stop, seconds.
    pub secs: f64,
    /// Its channel.
    pub channel: u8,
}

/// SendWait of a busy period's first transfer and the latest stop in it, clock ticks.
pub type Span = (u64, u64);

/// Queued transfers seen in one observation: the observation before them and theirs, clock
/// ticks; their bytes went over the wire in between, unless another transfer of the process
/// completed there too.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Gap {
    /// The latest completion of the link's earlier transfers.
    pub after: u64,
    /// The observation's last stop.
    pub stop: u64,
    /// Their bytes.
    pub bytes: u64,
    /// `stop - after`, seconds.
    pub secs: f64,
    /// Where no other link's transfer may have completed for the gap to be clean: `after` and
    /// `stop` widened by [`SAME_PASS`], clock ticks.
    pub around: Span,
    /// The link's own stops in `around`.
    pub own: u32,
}

/// What one window's transfers on a link say about it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Queue {
    /// Transfers idle process-wide: (bytes, SendWait → stop seconds). Filled per interval
    /// ([`super::idle`]), never per window.
    pub idle: Samples,
    /// The link's busy periods.
    pub spans: Vec<Span>,
    /// Every transfer's stop, clock ticks, sorted.
    pub stops: Vec<u64>,
    /// Its queued transfers' gaps.
    pub gaps: Vec<Gap>,
    /// The transfers that opened them.
    pub openers: Vec<Opener>,
    /// The gaps near which no other transfer of the process completed: the wire's own rate,
    /// unmixed with other links' transfers queued on the same NIC (a slow link's among them would
    /// make a healthy one look slow). Filled per interval ([`super::idle`]), never per window.
    pub clean: Clean,
    /// Seconds with at least one transfer in flight.
    pub busy: f64,
    /// Seconds the transfers waited for the link's earlier ones to complete, summed.
    pub wait: f64,
}

impl Queue {
    /// Adds `other`'s transfers (another window of the same link); its busy periods and their
    /// openers are left to the process-wide check.
    pub fn merge(&mut self, other: &Queue) {
        self.idle.merge(&other.idle);
        self.clean.merge(&other.clean);
        self.busy += other.busy;
        self.wait += other.wait;
    }
}

/// Clean queued transfers a wire rate needs before it is preferred to the idle transfers' fit.
pub const MIN_CLEAN: u64 = 4;

/// Completions closer than this (seconds) were seen in one pass of the proxy's progress loop:
/// its callbacks for one pass's completions come a few hundred nanoseconds apart, and no real
/// step (512 KiB at 100 GB/s takes 5 µs) completes sooner after the one before on its wire.
pub const SAME_PASS: f64 = 10e-6;

/// A link's figures for one interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LinkFit {
    /// Seconds of a zero-byte transfer on an idle link.
    pub latency: Option<f64>,
    /// Bytes per second the wire moves.
    pub bandwidth: Option<f64>,
    /// R² of the idle transfers' time-vs-size fit, when that fit was made.
    pub r2: Option<f64>,
    /// Bytes moved per second of busy time (achieved throughput).
    pub throughput: Option<f64>,
    /// Mean seconds a transfer waited for the link's earlier transfers to complete.
    pub wait: Option<f64>,
    /// Why there is no latency: `no_idle_transfer`, `one_size` or `no_fit`.
    pub missing: Option<&'static str>,
}

impl Queue {
    /// The link's figures from `bytes` moved by `transfers`: bandwidth from the wire rate of the
    /// clean gaps ([`Clean::per_sec`]), else from the idle transfers' fit; latency from the idle
    /// transfers at that wire rate (one size suffices), else from their fit (two sizes at
    /// least); throughput from the busy time; the mean wait over the transfers.
    pub fn fit(&self, bytes: u64, transfers: u64, mode: Mode) -> LinkFit {
        let fit = self.idle.fit(mode);
        let rate = self.clean.per_sec();
        let bandwidth = rate.or(fit.map(|f| f.bandwidth()));
        let latency = match (rate, fit) {
            (Some(bw), _) => self.idle.latency_at(mode, bw),
            (None, Some(f)) => f.latency(),
            (None, None) => None,
        };
        let missing = latency
            .is_none()
            .then(|| match (self.idle.is_empty(), self.idle.sizes()) {
                (true, _) => "no_idle_transfer",
                // At a known rate one size suffices: the idle transfers took no longer than it.
                (false, 0 | 1) if rate.is_none() => "one_size",
                _ => "no_fit",
            });
        let throughput = bytes as f64 / self.busy;
        LinkFit {
            latency,
            bandwidth,
            r2: fit.map(|f| f.r2),
            throughput: (self.busy > 0.0 && throughput.is_finite()).then_some(throughput),
            wait: (transfers > 0).then(|| self.wait / transfers as f64),
            missing,
        }
    }
}

/// Classifies a link's transfers (sorted here by SendWait); `channel` names the channel of a
/// step's tag. A transfer completing no later than one before it (out of order) counts for the
/// busy time and its wait only.
pub fn analyze(steps: &mut [Step], secs_per_tick: f64, channel: impl Fn(u32) -> u8) -> Queue {
    // One proxy thread records a link's steps nearly in SendWait order already.
    if !steps.is_sorted_by_key(|s| (s.sent, s.stop)) {
        steps.sort_unstable_by_key(|s| (s.sent, s.stop));
    }
    let mut q = Queue::default();
    let secs = |ticks: u64| ticks as f64 * secs_per_tick;
    // Pass 1: busy periods, their openers, waits.
    let mut last_stop = 0u64;
    let mut open: Option<u64> = None;
    let mut opening_ticks = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        if i > 0 && s.sent < last_stop {
            q.wait += secs(last_stop - s.sent);
        } else {
            if let Some(from) = open {
                q.busy += secs(last_stop.saturating_sub(from));
                q.spans.push((from, last_stop));
            }
            open = Some(s.sent);
            let ticks = s.stop.saturating_sub(s.sent);
            opening_ticks.push(ticks);
            q.openers.push(Opener {
                sent: s.sent,
                bytes: s.bytes,
                secs: secs(ticks),
                channel: channel(s.tag),
            });
        }
        last_stop = last_stop.max(s.stop);
    }
    if let Some(from) = open {
        q.busy += secs(last_stop.saturating_sub(from));
        q.spans.push((from, last_stop));
    }
    q.stops.extend(steps.iter().map(|s| s.stop));
    q.stops.sort_unstable();
    q.gaps = gaps(steps, &q.stops, low_percentile(&mut opening_ticks).unwrap_or(u64::MAX), secs_per_tick);
    q
}

/// Pass 2 of [`analyze`]: the gaps of transfers certain to have queued behind a busy wire (handed
/// over more than `bound` ticks before the link's previous completion), one per observation;
/// `stops` are the steps' stops, sorted.
fn gaps(steps: &[Step], stops: &[u64], bound: u64, secs_per_tick: f64) -> Vec<Gap> {
    let pass = (SAME_PASS / secs_per_tick) as u64;
    let own = |(from, to): Span| (stops.partition_point(|&x| x <= to) - stops.partition_point(|&x| x < from)) as u32;
    let mut gaps: Vec<Gap> = Vec::new();
    // Whether the observation the last stop belongs to is the last gap's (else it is unusable).
    let mut open = false;
    let mut last_stop = 0u64;
    for s in steps {
        let queued = s.sent.saturating_add(bound) < last_stop && s.stop > last_stop;
        let same_pass = last_stop > 0 && s.stop >= last_stop && s.stop - last_stop < pass;
        match (same_pass, queued) {
            (true, true) if open => {
                let g = gaps.last_mut().expect("an open gap");
                (g.stop, g.bytes) = (s.stop, g.bytes.saturating_add(s.bytes));
            }
            (true, _) => {
                // A transfer of the pass that is not certain to have queued: the observation's
                // bytes are not all known to have crossed the wire in its gap.
                if open {
                    gaps.pop();
                }
                open = false;
            }
            (false, true) => {
                gaps.push(Gap {
                    after: last_stop,
                    stop: s.stop,
                    bytes: s.bytes,
                    ..Gap::default()
                });
                open = true;
            }
            (false, false) => open = false,
        }
        last_stop = last_stop.max(s.stop);
    }
    for g in &mut gaps {
        g.secs = (g.stop - g.after) as f64 * secs_per_tick;
        g.around = (g.after.saturating_sub(pass), g.stop.saturating_add(pass));
        g.own = own(g.around);
    }
    gaps
}

/// The [`BOUND_QUANTILE`] of `ticks` (nearest rank, `⌊q·n⌋ + 1`); `None` when empty.
fn low_percentile(ticks: &mut [u64]) -> Option<u64> {
    let rank = (BOUND_QUANTILE * ticks.len() as f64) as usize;
    (!ticks.is_empty()).then(|| *ticks.select_nth_unstable(rank.min(ticks.len() - 1)).1)
}

/// Share of opening transfers' times that may be too short (a preempted proxy thread read the clock late at
/// SendWait) without lowering the latency bound.
const BOUND_QUANTILE: f64 = 0.05;

#[cfg(test)]
mod tests {
    use super::*;

    fn step(sent: u64, stop: u64, bytes: u64) -> Step {
        Step {
            sent,
            stop,
            bytes,
            tag: 0,
        }
    }

    fn analyze(steps: &mut [Step], secs_per_tick: f64) -> Queue {
        super::analyze(steps, secs_per_tick, |tag| tag as u8)
    }

    /// The rate of all of `q`'s gaps, as if every one were clean.
    fn queued(q: &Queue) -> Clean {
        let mut r = Clean::default();
        q.gaps.iter().for_each(|g| r.add(g));
        r
    }

    /// Eight steps of 1000 bytes handed over at once to a link of 10 ticks latency and 100
    /// bytes per tick: each completes 10 ticks after the one before.
    #[test]
    fn pipelined_steps_give_the_wire_rate_and_the_first_the_latency() {
        let mut steps: Vec<Step> = (0..8).map(|k| step(0, 10 + 10 * (k + 1), 1000)).collect();
        let q = analyze(&mut steps, 1.0);
        assert_eq!((q.spans.clone(), q.gaps.len(), q.stops.len()), (vec![(0, 90)], 6, 8));
        assert_eq!(q.openers.len(), 1);
        // Each waited for the ones before it: 20 + 30 + … + 80 ticks.
        assert_eq!(q.wait, 350.0);
        assert_eq!(q.fit(8000, 8, Mode::Avg).wait, Some(350.0 / 8.0));
        // The second was handed over within the first one's latency: not certain to queue.
        assert_eq!(queued(&q).gaps(), 6);
        assert_eq!(queued(&q).per_sec(), Some(100.0));
        assert_eq!(q.busy, 90.0);
    }

    /// 100 kB steps taking 10 µs on the wire and 5 µs of latency, 8 in flight, a step handed over
    /// when the proxy saw one complete; the proxy sees completions at the end of 25 µs passes
    /// and stops them 300 ns apart (ticks of 1 ns). A gap per completion would credit a pass's
    /// second step with 300 ns; a gap per observation gives the wire's rate.
    #[test]
    fn completions_seen_in_passes_give_the_wire_rate() {
        let (pass, wire, latency, bytes) = (25_000u64, 10_000u64, 5_000u64, 100_000u64);
        let seen = |t: u64| t.div_ceil(pass) * pass;
        let mut steps: Vec<Step> = Vec::new();
        let mut free = 0u64;
        for k in 0..400usize {
            let sent = if k < 8 { 0 } else { steps[k - 8].stop };
            let start = free.max(sent);
            free = start + wire;
            let stop = seen(free + latency);
            let before = steps.iter().rev().take_while(|s| s.stop >= stop).count() as u64;
            steps.push(step(sent, stop + 300 * before, bytes));
        }
        let q = analyze(&mut steps, 1e-9);
        let r = queued(&q);
        let rate = r.per_sec().unwrap();
        assert!(r.gaps() > 100 && (rate / 1e10 - 1.0).abs() < 0.02, "{r:?}: {rate:.3e} B/s, not 1e10");
        assert!(q.gaps.iter().all(|g| g.secs >= 10e-6 && g.own >= 2), "{:?}", q.gaps.first());
    }

    #[test]
    fn separate_transfers_are_idle_and_busy_time_is_their_union() {
        let mut steps = vec![step(100, 130, 2000), step(0, 20, 1000), step(125, 160, 500)];
        let q = analyze(&mut steps, 0.5);
        assert_eq!(q.spans, vec![(0, 20), (100, 160)]);
        let opener = |sent, bytes, secs| Opener {
            sent,
            bytes,
            secs,
            channel: 0,
        };
        assert_eq!(q.openers, vec![opener(0, 1000, 10.0), opener(100, 2000, 15.0)]);
        assert_eq!(q.wait, 2.5);
        assert_eq!(q.gaps, [], "posted at 125, within the latency of the one ending at 130");
        assert_eq!(q.busy, (20.0 + 60.0) * 0.5);
    }

    #[test]
    fn out_of_order_completion_counts_for_busy_time_only() {
        let mut steps = vec![step(0, 50, 100), step(10, 40, 100)];
        let q = analyze(&mut steps, 1.0);
        assert_eq!((q.openers.len(), q.gaps.len(), q.busy), (1, 0, 50.0));
        assert_eq!(analyze(&mut [], 1.0), Queue::default());
    }

    #[test]
    fn figures_from_a_pipelined_link() {
        // 20 ticks latency, 100 bytes per tick; ops of 8 steps of 1000 bytes handed over at
        // once, and single steps of 300 bytes on an idle link.
        let mut steps = Vec::new();
        for op in 0..3u64 {
            let t = op * 1000;
            steps.extend((0..8).map(|k| step(t, t + 20 + 10 * (k + 1), 1000)));
            steps.push(step(t + 500, t + 523, 300));
        }
        let mut q = analyze(&mut steps, 1.0);
        assert_eq!(q.openers.len(), 6);
        assert!(q.fit(24_900, 27, Mode::Avg).latency.is_none(), "no transfer checked idle yet");
        for l in q.openers.clone() {
            q.idle.push(l.bytes, l.secs);
        }
        q.clean = queued(&q);
        let f = q.fit(24_900, 27, Mode::Avg);
        assert_eq!(f.bandwidth, Some(100.0));
        assert!((f.latency.unwrap() - 20.0).abs() < 1e-9, "{f:?}");
        assert_eq!(f.missing, None);
        assert_eq!(f.throughput, Some(24_900.0 / (3.0 * (100.0 + 23.0))));
        let mut one = analyze(&mut [step(0, 30, 1000)], 1.0);
        one.idle.push(1000, 30.0);
        let lone = one.fit(1000, 1, Mode::Avg);
        assert_eq!(
            (lone.latency, lone.bandwidth, lone.missing),
            (None, None, Some("one_size"))
        );
        assert_eq!(Queue::default().fit(0, 0, Mode::Min).missing, Some("no_idle_transfer"));
    }

    #[test]
    fn a_stop_before_its_send_wait_is_no_time() {
        // Timestamps NCCL never produces (a stop read before the SendWait) must not panic.
        let q = analyze(&mut [step(50, 10, 1), step(60, 70, 1), step(65, 20, 1)], 1.0);
        assert_eq!((q.openers.len(), q.wait), (2, 5.0));
        assert_eq!(q.busy, 10.0);
    }

    #[test]
    fn a_few_preempted_idle_times_do_not_let_latency_tails_pass_as_queued() {
        // Idle single steps of 1000 bytes (20 ticks latency, 100 bytes per tick: 30 ticks), one
        // of them timed 1 tick (its SendWait read late), then a step handed over 5 ticks into
        // the latency of the one before: not certain to have queued.
        let mut steps: Vec<Step> = (0..40).map(|k| step(100 * k, 100 * k + 30, 1000)).collect();
        steps[7] = step(729, 730, 1000);
        steps.push(step(4000, 4030, 1000));
        steps.push(step(4025, 4040, 1000));
        let q = analyze(&mut steps, 1.0);
        assert_eq!(q.gaps, [], "{q:?}");
    }

    #[test]
    fn merge_adds_windows() {
        let mut a = analyze(&mut [step(0, 10, 100), step(0, 20, 100), step(0, 30, 100)], 1.0);
        let mut b = analyze(&mut [step(0, 5, 50)], 1.0);
        b.clean.add(&Gap {
            after: 0,
            stop: 5,
            bytes: 50,
            secs: 5.0,
            ..Gap::default()
        });
        a.merge(&b);
        // a: the second waited 10 ticks, the third 20; b waited nothing.
        assert_eq!((a.clean.gaps(), a.busy, a.wait), (1, 35.0, 30.0));
    }
}

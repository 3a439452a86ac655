//! The host around the emulated NCCL, as on a busy training node: its proxy thread sees
//! completions once per pass of its progress loop, and the hypervisor pauses threads now and
//! then. Every draw is seeded ([`Rng`]), so a run is reproducible up to the real host's own noise.

use std::time::{Duration, Instant};

/// A seeded generator (splitmix64): the emulator's only source of randomness.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64, stream: u64) -> Rng {
        Rng(seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [`lo`, `hi`).
    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        lo + (hi.saturating_sub(lo)).mul_f64(self.unit())
    }

    /// Exponentially distributed with mean `mean` (the gaps of a Poisson process).
    pub fn exponential(&mut self, mean: Duration) -> Duration {
        mean.mul_f64(-(1.0 - self.unit()).ln())
    }
}

/// The proxy thread's progress loop: a completion is seen (its stop called) at the end of the
/// pass it happened in, together with the others of that pass, as NCCL's `progressOps` tests
/// each op's requests in turn. Passes are `pass` long from a phase of their own per proxy thread.
#[derive(Clone, Copy, Debug)]
pub struct Passes {
    origin: Instant,
    pass: Duration,
}

impl Passes {
    pub fn new(pass: Duration, rng: &mut Rng) -> Passes {
        Passes {
            origin: Instant::now() - rng.between(Duration::ZERO, pass),
            pass,
        }
    }

    /// When a completion at `t` is seen: the end of its pass (`t` itself without passes).
    pub fn seen(&self, t: Instant) -> Instant {
        if self.pass.is_zero() || t <= self.origin {
            return t;
        }
        let (since, pass) = ((t - self.origin).as_nanos(), self.pass.as_nanos());
        let passes = since.div_ceil(pass);
        self.origin + Duration::from_nanos((passes * pass) as u64)
    }
}

/// Pauses of a thread, as a hypervisor descheduling its vCPU: at random moments (`every` apart
/// on average), each `shortest` to `longest` long.
#[derive(Clone, Copy, Debug)]
pub struct Pauses {
    pub every: Duration,
    pub shortest: Duration,
    pub longest: Duration,
}

impl Pauses {
    /// This VM's: 1–4 ms, a few times a second.
    pub const HYPERVISOR: Pauses = Pauses {
        every: Duration::from_millis(250),
        shortest: Duration::from_millis(1),
        longest: Duration::from_millis(4),
    };
}

/// One thread's pauses: [`Paused::maybe`] sleeps when one is due.
#[derive(Clone, Debug)]
pub struct Paused {
    pauses: Pauses,
    next: Instant,
    rng: Rng,
}

impl Paused {
    pub fn new(pauses: Pauses, mut rng: Rng) -> Paused {
        let next = Instant::now() + rng.exponential(pauses.every);
        Paused { pauses, next, rng }
    }

    /// Sleeps through a pause when one is due.
    pub fn maybe(&mut self) {
        if Instant::now() < self.next {
            return;
        }
        let p = self.pauses;
        std::thread::sleep(self.rng.between(p.shortest, p.longest));
        self.next = Instant::now() + self.rng.exponential(p.every);
    }
}

//! Capped exponential backoff, the one policy every retry loop of volmgr
//! uses: the kubelet's operation backoff (`exponentialbackoff`: 500 ms
//! doubling to 2 m 2 s), client-go's reflector (800 ms doubling to 30 s,
//! jittered), and the plugin watcher's, CSINode's, the node status's, the
//! claim status's and the local socket's accept loop, each with its own
//! numbers.
//!
//! A [`Backoff`] is the policy (a value: copied into configurations);
//! [`Backoff::delay`] the wait after `n` consecutive failures, for code
//! that counts them itself (the operation executor keeps a count per
//! operation); [`Retries`] the state of one retry loop
//! ([`Retries::next_delay`] after each failure, [`Retries::reset`] after a
//! success).

use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, SystemTime};

/// A capped exponential backoff policy: [`Self::initial`] after the first
/// failure, [`Self::factor`] times longer after each further one, at most
/// [`Self::max`]; with [`Self::jitter`], each delay `d` is stretched to a
/// random time between `d` and `2 d` (client-go's `wait.Jitter(d, 1.0)`),
/// so that many clients failing together do not retry together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The wait after the first failure.
    pub initial: Duration,
    /// The multiplier per further failure.
    pub factor: u32,
    /// The longest wait (before jitter).
    pub max: Duration,
    /// Whether each wait is stretched by up to itself at random.
    pub jitter: bool,
}

impl Default for Backoff {
    /// The kubelet's operation backoff (`exponentialbackoff`): 500 ms,
    /// doubling, at most 2 m 2 s, no jitter.
    fn default() -> Self {
        Self::new(Duration::from_millis(500), 2, Duration::from_secs(122))
    }
}

impl Backoff {
    /// `initial`, times `factor` per further failure, at most `max`.
    pub const fn new(initial: Duration, factor: u32, max: Duration) -> Self {
        Self {
            initial,
            factor,
            max,
            jitter: false,
        }
    }

    /// The same with jitter.
    pub const fn with_jitter(mut self) -> Self {
        self.jitter = true;
        self
    }

    /// The wait after `failures` consecutive failures (1-based: 0 counts
    /// as 1).
    pub fn delay(&self, failures: u32) -> Duration {
        let mut d = self.initial.min(self.max);
        for _ in 1..failures {
            d = d.saturating_mul(self.factor);
            if d >= self.max {
                d = self.max;
                break;
            }
        }
        if self.jitter {
            d + d.mul_f64(random_fraction())
        } else {
            d
        }
    }

    /// A retry loop following this policy.
    pub const fn retries(self) -> Retries {
        Retries {
            policy: self,
            failures: 0,
        }
    }
}

/// The state of one retry loop (see the module documentation).
#[derive(Debug, Clone)]
pub struct Retries {
    policy: Backoff,
    failures: u32,
}

impl Retries {
    /// The wait after one more failure.
    pub fn next_delay(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.policy.delay(self.failures)
    }

    /// Starts over (after a success).
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// Failures since the last reset.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

/// A uniformly distributed fraction in `[0, 1)`, from the standard
/// library's randomly keyed SipHash (no random crate is needed for
/// jitter).
pub fn random_fraction() -> f64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    h.write_u128(nanos);
    // The top 53 bits: every value exactly representable.
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelets_operation_backoff() {
        let b = Backoff::default();
        assert_eq!(b.delay(0), Duration::from_millis(500));
        assert_eq!(b.delay(1), Duration::from_millis(500));
        assert_eq!(b.delay(2), Duration::from_secs(1));
        assert_eq!(b.delay(8), Duration::from_secs(64));
        assert_eq!(b.delay(9), Duration::from_secs(122));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(122));
    }

    /// Each delay is between its base and twice it, the bases doubling
    /// from 800 ms to 30 s (client-go's reflector), and a reset starts
    /// over.
    #[test]
    fn doubles_with_jitter_up_to_the_cap() {
        let mut r = Backoff::new(Duration::from_millis(800), 2, Duration::from_secs(30))
            .with_jitter()
            .retries();
        let bases = [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0, 30.0];
        for base in bases {
            let d = r.next_delay().as_secs_f64();
            assert!(d >= base && d < 2.0 * base + 1e-9, "{d} for base {base}");
        }
        assert_eq!(r.failures(), 9);
        r.reset();
        let d = r.next_delay().as_secs_f64();
        assert!((0.8..1.6).contains(&d), "{d}");
    }

    #[test]
    fn jitter_spreads() {
        let samples: Vec<f64> = (0..200).map(|_| random_fraction()).collect();
        assert!(samples.iter().all(|f| (0.0..1.0).contains(f)));
        let low = samples.iter().filter(|f| **f < 0.5).count();
        assert!((40..160).contains(&low), "{low} of 200 under 0.5");
    }

    #[test]
    fn an_initial_delay_over_the_cap_is_capped() {
        let b = Backoff::new(Duration::from_secs(5), 2, Duration::from_secs(1));
        assert_eq!(b.delay(1), Duration::from_secs(1));
    }
}

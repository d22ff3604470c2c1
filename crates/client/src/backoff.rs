//! Jittered exponential backoff for client retries (full jitter, AWS architecture blog style), so
//! many cells retrying after one outage do not return in lockstep.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// Retry schedule: attempt `n` (from 0) waits a random time in `[0, min(max, initial * 2^n)]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Backoff {
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self
            .initial
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.max);
        let ceiling_micros = ceiling.as_micros().max(1) as u64;
        Duration::from_micros(random_u64() % (ceiling_micros + 1))
    }
}

/// A random number from the standard library's per-process random hasher keys (no RNG crate).
pub(crate) fn random_u64() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
    );
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_stay_under_the_growing_ceiling_and_the_maximum() {
        let backoff = Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(300),
        };
        for attempt in 0..40 {
            let ceiling = Duration::from_millis(10 * (1u64 << attempt.min(16)))
                .min(Duration::from_millis(300));
            assert!(backoff.delay(attempt) <= ceiling);
        }
    }

    #[test]
    fn delays_are_jittered() {
        let backoff = Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(1),
        };
        let distinct: std::collections::BTreeSet<_> = (0..20).map(|_| backoff.delay(3)).collect();
        assert!(distinct.len() > 1, "twenty draws are not all equal");
    }
}

//! A log line at most every few seconds, saying how many were held back in between: what the
//! server logs per failing accept, refused connection or unavailable store, so a flood of
//! failures costs one line every [`LOG_EVERY`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The least time between two lines of one [`RateLimitedLog`].
pub const LOG_EVERY: Duration = Duration::from_secs(5);

/// A log line at most every [`LOG_EVERY`], saying how many were held back in between.
#[derive(Default)]
pub struct RateLimitedLog {
    last: Mutex<Option<Instant>>,
    held_back: AtomicU64,
}

impl RateLimitedLog {
    /// `Some(number held back since the last line)` when a line may be written now.
    pub fn ready(&self) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < LOG_EVERY) {
            self.held_back.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(now);
        Some(self.held_back.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_are_held_back_and_counted() {
        let log = RateLimitedLog::default();
        assert_eq!(log.ready(), Some(0));
        assert_eq!(log.ready(), None);
        assert_eq!(log.ready(), None);
        *log.last.lock().unwrap() = Some(Instant::now() - LOG_EVERY);
        assert_eq!(log.ready(), Some(2));
    }
}

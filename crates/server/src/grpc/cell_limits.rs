//! Per-cell limits: a token bucket of requests per second (`--cell-rate`, `--cell-burst`) and a
//! bound on concurrent mutating requests (`--cell-max-in-flight`), both keyed by the cell a
//! request acts for, so one flooding cell is refused on its own while the others are served.
//!
//! Owns the limits' configuration and state: the keyed GCRA limiter (`governor`), the per-cell
//! in-flight counters (released by [`InFlight`] on drop, also when a request is abandoned), the
//! cumulative count of refusals per cell (for the metrics), and keeping that memory bounded.
//! Must not decide *which* requests are limited or for which cell: `grpc::authz` applies it after
//! authorization, where the caller and the cell are known.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use governor::clock::Clock;
use governor::{DefaultKeyedRateLimiter, Quota};
use http_body::{Body as HttpBody, Frame, SizeHint};

use topology_claims::error::ClaimsError;

/// The shortest RetryInfo delay of a `--cell-rate` refusal.
const MIN_RATE_RETRY_HINT: Duration = Duration::from_millis(1);

/// The retry hint sent with a `cell-max-in-flight` refusal: a slot frees when one of the cell's
/// requests completes, which no clock predicts; a store round trip is a few milliseconds.
pub const IN_FLIGHT_RETRY_HINT: Duration = Duration::from_millis(50);

/// How many limiter checks pass between two sweeps of idle cells out of the rate limiter's map.
const SWEEP_EVERY_CHECKS: u64 = 4096;

/// Most distinct cells whose refusals are counted by name; refusals of further cells are
/// counted under [`OTHER_CELLS`], so a client inventing cell ids cannot grow the map.
pub const MAX_COUNTED_CELLS: usize = 10_000;

/// The key refusals of cells past [`MAX_COUNTED_CELLS`] are counted under.
pub const OTHER_CELLS: &str = "_other";

/// A cell's token bucket: `per_second` requests on average, up to `burst` at once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CellRate {
    pub per_second: f64,
    pub burst: NonZeroU32,
}

/// The per-cell limits (`serve --cell-max-in-flight`, `--cell-rate`, `--cell-burst`); `None`:
/// that limit is off. The default is both off.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CellLimits {
    /// Most mutating requests of one cell in flight at once.
    pub max_in_flight: Option<usize>,
    /// Requests per second of one cell, with a burst.
    pub rate: Option<CellRate>,
}

impl CellLimits {
    pub fn validate(&self) -> Result<(), ClaimsError> {
        let bad = |message: &str| {
            Err(ClaimsError::Configuration {
                message: message.to_owned(),
            })
        };
        if self.max_in_flight == Some(0) {
            return bad("--cell-max-in-flight must be at least 1 (leave it out for no limit)");
        }
        if let Some(rate) = self.rate {
            // Below one request in about 11 days the period overflows nothing, but it is a typo.
            if !rate.per_second.is_finite() || rate.per_second < 1e-6 {
                return bad("--cell-rate must be a positive number of requests per second");
            }
        }
        Ok(())
    }

    pub fn is_off(&self) -> bool {
        self.max_in_flight.is_none() && self.rate.is_none()
    }
}

/// The limits' state, shared by every connection.
pub struct CellLimiter {
    max_in_flight: Option<usize>,
    rate: Option<DefaultKeyedRateLimiter<String>>,
    checks: AtomicU64,
    /// Only cells with a request in flight have an entry.
    in_flight: Mutex<HashMap<String, usize>>,
    rejected: Mutex<HashMap<String, u64>>,
    /// `topology_claims_rate_limited_total`, labelled with the same bounded keys as `rejected`.
    metric: Option<prometheus::IntCounterVec>,
}

impl std::fmt::Debug for CellLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CellLimiter")
            .field("max_in_flight", &self.max_in_flight)
            .field("rate", &self.rate.is_some())
            .finish_non_exhaustive()
    }
}

impl CellLimiter {
    /// The limiter of `limits`, or `None` when both are off; refusals are also counted in
    /// `metric` (by cell, bounded as [`rejected`](Self::rejected) is).
    pub fn new(
        limits: &CellLimits,
        metric: Option<prometheus::IntCounterVec>,
    ) -> Result<Option<Arc<CellLimiter>>, ClaimsError> {
        limits.validate()?;
        if limits.is_off() {
            return Ok(None);
        }
        let rate = limits.rate.map(|rate| {
            let period =
                Duration::from_secs_f64(1.0 / rate.per_second).max(Duration::from_nanos(1));
            let quota = Quota::with_period(period)
                .expect("a period of at least 1 ns")
                .allow_burst(rate.burst);
            DefaultKeyedRateLimiter::dashmap(quota)
        });
        Ok(Some(Arc::new(CellLimiter {
            max_in_flight: limits.max_in_flight,
            rate,
            checks: AtomicU64::new(0),
            in_flight: Mutex::new(HashMap::new()),
            rejected: Mutex::new(HashMap::new()),
            metric,
        })))
    }

    /// Admits one request of `cell`, counting it in flight when it `mutates` (until the
    /// returned guard drops), or refuses it with [`ClaimsError::RateLimited`].
    pub fn admit(
        self: &Arc<Self>,
        cell: &str,
        mutates: bool,
    ) -> Result<Option<InFlight>, ClaimsError> {
        // The slot first: a request refused for concurrency does not spend a token.
        let slot = match (self.max_in_flight, mutates) {
            (Some(max), true) => Some(self.enter(cell, max)?),
            _ => None,
        };
        if let Some(limiter) = &self.rate {
            if self
                .checks
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(SWEEP_EVERY_CHECKS)
            {
                // Cells whose bucket is full again are indistinguishable from new ones.
                limiter.retain_recent();
                limiter.shrink_to_fit();
            }
            if let Err(not_until) = limiter.check_key(&cell.to_owned()) {
                // Read after the check: on a loaded machine the token may be due already, and a
                // zero RetryInfo would invite an immediate retry storm; wait at least 1 ms.
                let retry_after = not_until
                    .wait_time_from(limiter.clock().now())
                    .max(MIN_RATE_RETRY_HINT);
                return Err(self.refuse("cell-rate", cell, retry_after));
            }
        }
        Ok(slot)
    }

    fn enter(self: &Arc<Self>, cell: &str, max: usize) -> Result<InFlight, ClaimsError> {
        let mut in_flight = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let count = in_flight.entry(cell.to_owned()).or_default();
        if *count >= max {
            drop(in_flight);
            return Err(self.refuse("cell-max-in-flight", cell, IN_FLIGHT_RETRY_HINT));
        }
        *count += 1;
        Ok(InFlight {
            limiter: Arc::clone(self),
            cell: cell.to_owned(),
        })
    }

    fn refuse(&self, limit: &'static str, cell: &str, retry_after: Duration) -> ClaimsError {
        let mut rejected = self.rejected.lock().unwrap_or_else(PoisonError::into_inner);
        let key = if rejected.contains_key(cell) || rejected.len() < MAX_COUNTED_CELLS {
            cell
        } else {
            OTHER_CELLS
        };
        *rejected.entry(key.to_owned()).or_default() += 1;
        if let Some(metric) = &self.metric {
            metric.with_label_values(&[key]).inc();
        }
        ClaimsError::RateLimited {
            limit,
            cell_id: cell.to_owned(),
            retry_after,
        }
    }

    /// Requests refused so far, per cell (cumulative, for `topology_claims_rate_limited_total`),
    /// sorted by cell.
    pub fn rejected(&self) -> Vec<(String, u64)> {
        let rejected = self.rejected.lock().unwrap_or_else(PoisonError::into_inner);
        let mut counts: Vec<(String, u64)> =
            rejected.iter().map(|(k, v)| (k.clone(), *v)).collect();
        counts.sort();
        counts
    }

    /// Mutating requests of `cell` in flight now.
    pub fn in_flight(&self, cell: &str) -> usize {
        let in_flight = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        in_flight.get(cell).copied().unwrap_or(0)
    }
}

/// One mutating request of a cell in flight; dropping it frees the slot (and the cell's entry
/// when it was the last).
#[derive(Debug)]
pub struct InFlight {
    limiter: Arc<CellLimiter>,
    cell: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut in_flight = self
            .limiter
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = in_flight.get_mut(&self.cell) {
            *count -= 1;
            if *count == 0 {
                in_flight.remove(&self.cell);
            }
        }
    }
}

/// A response body that holds `T` (an [`InFlight`] slot) until the body is done or dropped.
pub struct Holding<B, T> {
    inner: B,
    held: Option<T>,
}

impl<B, T> Holding<B, T> {
    pub fn new(inner: B, held: T) -> Self {
        Self {
            inner,
            held: Some(held),
        }
    }
}

impl<B: HttpBody + Unpin, T: Unpin> HttpBody for Holding<B, T> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            self.held = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(limits: CellLimits) -> Arc<CellLimiter> {
        CellLimiter::new(&limits, None).unwrap().unwrap()
    }

    #[test]
    fn no_limit_configured_means_no_limiter_and_bad_values_are_refused() {
        assert!(CellLimiter::new(&CellLimits::default(), None)
            .unwrap()
            .is_none());
        let zero = CellLimits {
            max_in_flight: Some(0),
            rate: None,
        };
        assert!(zero.validate().is_err());
        let nan = CellLimits {
            max_in_flight: None,
            rate: Some(CellRate {
                per_second: f64::NAN,
                burst: NonZeroU32::MIN,
            }),
        };
        assert!(nan.validate().is_err());
    }

    #[test]
    fn a_cell_over_its_rate_is_refused_with_a_delay_and_the_others_are_not() {
        let limits = limiter(CellLimits {
            max_in_flight: None,
            rate: Some(CellRate {
                per_second: 1.0,
                burst: NonZeroU32::new(3).unwrap(),
            }),
        });
        for _ in 0..3 {
            assert!(limits.admit("cell-a", false).is_ok());
        }
        match limits.admit("cell-a", false) {
            Err(ClaimsError::RateLimited {
                limit,
                cell_id,
                retry_after,
            }) => {
                assert_eq!((limit, cell_id.as_str()), ("cell-rate", "cell-a"));
                assert!(retry_after > Duration::ZERO && retry_after <= Duration::from_secs(1));
            }
            other => panic!("expected RateLimited, got {other:?}"),
        }
        assert!(limits.admit("cell-b", true).is_ok());
        assert_eq!(limits.rejected(), vec![("cell-a".to_owned(), 1)]);
    }

    #[test]
    fn in_flight_slots_are_per_cell_mutations_only_and_freed_on_drop() {
        let limits = limiter(CellLimits {
            max_in_flight: Some(2),
            rate: None,
        });
        let first = limits.admit("cell-a", true).unwrap();
        let second = limits.admit("cell-a", true).unwrap();
        assert!(first.is_some() && second.is_some());
        assert!(matches!(
            limits.admit("cell-a", true),
            Err(ClaimsError::RateLimited { limit: "cell-max-in-flight", retry_after, .. })
                if retry_after == IN_FLIGHT_RETRY_HINT
        ));
        assert!(limits.admit("cell-a", false).unwrap().is_none(), "reads");
        assert!(limits.admit("cell-b", true).unwrap().is_some());
        drop(first);
        assert_eq!(limits.in_flight("cell-a"), 1);
        let third = limits.admit("cell-a", true).unwrap();
        drop((second, third));
        assert_eq!(limits.in_flight("cell-a"), 0);
        assert!(
            limits.in_flight.lock().unwrap().is_empty(),
            "no zero counters"
        );
    }

    #[test]
    fn refusals_of_too_many_distinct_cells_are_counted_together() {
        let limits = limiter(CellLimits {
            max_in_flight: None,
            rate: Some(CellRate {
                per_second: 0.001,
                burst: NonZeroU32::MIN,
            }),
        });
        for i in 0..MAX_COUNTED_CELLS + 5 {
            let cell = format!("c{i}");
            limits.admit(&cell, false).unwrap();
            assert!(limits.admit(&cell, false).is_err());
        }
        let counts = limits.rejected();
        assert_eq!(counts.len(), MAX_COUNTED_CELLS + 1);
        assert!(counts.contains(&(OTHER_CELLS.to_owned(), 5)));
    }

    #[tokio::test]
    async fn a_slot_is_held_until_the_response_body_has_been_read() {
        use http_body_util::BodyExt;
        let limits = limiter(CellLimits {
            max_in_flight: Some(1),
            rate: None,
        });
        let slot = limits.admit("cell-a", true).unwrap().unwrap();
        let body = Holding::new(
            http_body_util::Full::new(bytes::Bytes::from("answer")),
            slot,
        );
        assert_eq!(limits.in_flight("cell-a"), 1, "answered, body not yet sent");
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"answer");
        assert_eq!(limits.in_flight("cell-a"), 0);

        let slot = limits.admit("cell-a", true).unwrap().unwrap();
        drop(Holding::new(
            http_body_util::Full::new(bytes::Bytes::new()),
            slot,
        ));
        assert_eq!(limits.in_flight("cell-a"), 0, "a dropped body frees it too");
    }
}

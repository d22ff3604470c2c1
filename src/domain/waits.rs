//! Waiting for a leased claim (`BeginUpdateRequest.wait_for_leased`): when a BeginUpdate may
//! wait, how long, and in which order the waiters of a claim are decided (docs/decisions/118).
//!
//! The rules:
//! - only a refusal whose every refused claim is `CLAIM_LEASED` waits; any other refusal
//!   (CLAIM_TAKEN, NOT_CLAIM_OWNER, …) is answered at once;
//! - the wait is the smallest of the request's, `serve --max-lease-wait` and what is left of the
//!   caller's deadline;
//! - first come, first served: each waiter gets an arrival number once, when it first waits (a
//!   retry of the same lease keeps it), and joins the queue of every claim that blocks it. A
//!   waiter asks again only when it is first in the queue of every claim that blocks it, so the
//!   earliest waiter of all is always free to ask: batches that wait on each other's claims
//!   cannot deadlock, and a later waiter never overtakes an earlier one on a shared claim.
//!
//! - across servers: the arrival number is a ticket of the store's wait line
//!   (`ports::WaitLine`), given out in increasing order by the store all servers share; before it
//!   asks, a waiter first in its server's queues also looks in the store's line, and asks only
//!   when no earlier, unexpired ticket waits for any of its claims ([`LineAhead::first_in_line`]).
//!   A server that died mid-wait holds no one up for longer than its waiters' waits plus
//!   [`LINE_MARGIN`].
//!
//! Owns the rules. Must not do I/O or hold a clock: the server's waiting room holds the queues
//! and the timers, the store holds the line.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use crate::domain::{ClaimKey, Timestamp};
use crate::error::ClaimsError;

/// `serve --max-lease-wait`: the longest any BeginUpdate waits for a leased claim.
pub const DEFAULT_MAX_LEASE_WAIT: Duration = Duration::from_secs(5);

/// `serve --max-lease-waiters`: waiters at once per server; beyond it, CLAIM_LEASED at once.
pub const DEFAULT_MAX_LEASE_WAITERS: usize = 10_000;

/// How long a BeginUpdate may wait: the request's wait bounded by the server's maximum and by
/// the caller's deadline (`None`: none sent). `None`: do not wait (unset, zero, or no time left).
pub fn lease_wait(
    requested: Option<Duration>,
    max: Duration,
    deadline_left: Option<Duration>,
) -> Option<Duration> {
    let wait = requested?.min(max);
    let wait = match deadline_left {
        Some(left) => wait.min(left),
        None => wait,
    };
    (!wait.is_zero()).then_some(wait)
}

/// The claims a refused BeginUpdate waits for: every refused claim's, when each refusal is
/// `CLAIM_LEASED`; `None` when any other refusal is among them (answer at once).
pub fn blocking_claims(error: &ClaimsError) -> Option<BTreeSet<ClaimKey>> {
    let refusals = error.claim_refusals();
    if refusals.is_empty() {
        return None;
    }
    refusals
        .into_iter()
        .map(|refusal| match refusal {
            ClaimsError::ClaimLeased { claim } => Some(claim.clone()),
            _ => None,
        })
        .collect()
}

/// A waiter's place: its arrival number (smaller came first), the ticket the store's wait line
/// gave it.
pub type Arrival = u64;

/// How long a place in the store's wait line outlives the wait it was taken for, so a server
/// that died mid-wait holds the others up for at most its waiters' waits plus this.
pub const LINE_MARGIN: Duration = Duration::from_secs(1);

/// How long a place in the store's line is kept for a wait of `wait`.
pub fn line_ttl(wait: Duration) -> Duration {
    wait.saturating_add(LINE_MARGIN)
}

/// What the store's wait line holds ahead of a ticket on its claims (`WaitLine::line_ahead`):
/// the store's clock, and the latest expiry among the earlier tickets that wait for any of
/// those claims (`None`: no earlier ticket).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineAhead {
    pub now: Timestamp,
    pub latest_expiry: Option<Timestamp>,
}

impl LineAhead {
    /// Whether the ticket may ask the store again: every earlier ticket on its claims expired
    /// (its server died or forgot it), or there is none.
    pub fn first_in_line(&self) -> bool {
        self.latest_expiry.is_none_or(|at| at <= self.now)
    }
}

/// The store's wait line as rows, per ticket its claims and expiry: the memory store's line and
/// the reference the other stores' (`lease_waits` tables) are proven against.
#[derive(Debug, Default)]
pub struct WaitLineRows {
    last: Arrival,
    rows: BTreeMap<Arrival, (BTreeSet<ClaimKey>, Timestamp)>,
}

impl WaitLineRows {
    /// Joins the line for `claims` until `now + ttl`: a new ticket, larger than every earlier
    /// one, when `ticket` is `None`; else `ticket`'s claims are replaced and its place kept.
    /// Expired places of other tickets go.
    pub fn join(
        &mut self,
        ticket: Option<Arrival>,
        claims: &BTreeSet<ClaimKey>,
        ttl: Duration,
        now: Timestamp,
    ) -> Arrival {
        self.rows
            .retain(|t, (_, expires_at)| Some(*t) == ticket || *expires_at > now);
        let ticket = ticket.unwrap_or_else(|| {
            self.last += 1;
            self.last
        });
        self.rows
            .insert(ticket, (claims.clone(), now.saturating_add(ttl)));
        ticket
    }

    /// What waits ahead of `ticket` on `claims`.
    pub fn ahead(&self, ticket: Arrival, claims: &BTreeSet<ClaimKey>, now: Timestamp) -> LineAhead {
        let latest_expiry = self
            .rows
            .range(..ticket)
            .filter(|(_, (waits_for, _))| !waits_for.is_disjoint(claims))
            .map(|(_, (_, expires_at))| *expires_at)
            .max();
        LineAhead { now, latest_expiry }
    }

    /// `ticket` leaves the line.
    pub fn leave(&mut self, ticket: Arrival) {
        self.rows.remove(&ticket);
    }
}

/// The queues of the claims waited for: per claim, the arrivals of its waiters, in order.
#[derive(Debug, Default)]
pub struct WaitQueues {
    queues: HashMap<ClaimKey, BTreeSet<Arrival>>,
    /// What each waiter waits for now.
    blocking: HashMap<Arrival, BTreeSet<ClaimKey>>,
}

impl WaitQueues {
    /// `arrival` now waits for `claims` (replacing what it waited for before: a retry may be
    /// blocked by other claims than the first time). It keeps its arrival number, so its place.
    pub fn wait_for(&mut self, arrival: Arrival, claims: BTreeSet<ClaimKey>) {
        self.leave(arrival);
        for claim in &claims {
            self.queues
                .entry(claim.clone())
                .or_default()
                .insert(arrival);
        }
        self.blocking.insert(arrival, claims);
    }

    /// `arrival` is done waiting (decided, timed out, or gone).
    pub fn leave(&mut self, arrival: Arrival) {
        let Some(claims) = self.blocking.remove(&arrival) else {
            return;
        };
        for claim in claims {
            if let Some(queue) = self.queues.get_mut(&claim) {
                queue.remove(&arrival);
                if queue.is_empty() {
                    self.queues.remove(&claim);
                }
            }
        }
    }

    /// The claims `arrival` waits for now.
    pub fn claims_of(&self, arrival: Arrival) -> BTreeSet<ClaimKey> {
        self.blocking.get(&arrival).cloned().unwrap_or_default()
    }

    /// Whether `arrival` may ask again: it is first in the queue of every claim it waits for.
    pub fn is_first(&self, arrival: Arrival) -> bool {
        self.blocking.get(&arrival).is_some_and(|claims| {
            claims.iter().all(|claim| {
                self.queues
                    .get(claim)
                    .and_then(|q| q.first())
                    .is_some_and(|first| *first == arrival)
            })
        })
    }

    /// The waiter first in `claim`'s queue.
    pub fn first_of(&self, claim: &ClaimKey) -> Option<Arrival> {
        self.queues.get(claim).and_then(|q| q.first().copied())
    }

    /// Waiters now.
    pub fn len(&self) -> usize {
        self.blocking.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocking.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{ClaimConflict, ClaimConflicts, ClaimType};

    fn key(v: &str) -> ClaimKey {
        ClaimKey::new(ClaimType::Username, v.to_owned())
    }

    fn keys(vs: &[&str]) -> BTreeSet<ClaimKey> {
        vs.iter().map(|v| key(v)).collect()
    }

    #[test]
    fn the_wait_is_the_smallest_of_the_request_the_server_and_the_deadline() {
        let s = Duration::from_secs;
        assert_eq!(lease_wait(None, s(5), None), None);
        assert_eq!(lease_wait(Some(s(0)), s(5), None), None);
        assert_eq!(lease_wait(Some(s(3)), s(5), None), Some(s(3)));
        assert_eq!(lease_wait(Some(s(30)), s(5), None), Some(s(5)));
        assert_eq!(lease_wait(Some(s(3)), s(5), Some(s(1))), Some(s(1)));
        assert_eq!(lease_wait(Some(s(3)), s(5), Some(s(0))), None);
    }

    #[test]
    fn only_refusals_that_are_all_claim_leased_wait() {
        let leased = ClaimsError::ClaimLeased { claim: key("a") };
        assert_eq!(blocking_claims(&leased), Some(keys(&["a"])));
        let taken = ClaimsError::ClaimTaken { claim: key("a") };
        assert_eq!(blocking_claims(&taken), None);
        let conflicts = |second: ClaimsError| {
            ClaimsError::ClaimConflicts(Box::new(ClaimConflicts {
                conflicts: vec![
                    ClaimConflict {
                        record: crate::fixtures::username("a"),
                        refusal: ClaimsError::ClaimLeased { claim: key("a") },
                    },
                    ClaimConflict {
                        record: crate::fixtures::username("b"),
                        refusal: second,
                    },
                ],
                omitted: 0,
            }))
        };
        assert_eq!(
            blocking_claims(&conflicts(ClaimsError::ClaimLeased { claim: key("b") })),
            Some(keys(&["a", "b"]))
        );
        assert_eq!(blocking_claims(&conflicts(taken)), None);
        assert_eq!(blocking_claims(&ClaimsError::internal("x")), None);
    }

    #[test]
    fn waiters_are_decided_in_arrival_order_and_crossing_batches_cannot_deadlock() {
        let mut q = WaitQueues::default();
        q.wait_for(1, keys(&["x"]));
        q.wait_for(2, keys(&["x"]));
        q.wait_for(3, keys(&["x"]));
        assert!(q.is_first(1) && !q.is_first(2) && !q.is_first(3));
        // The first asks again and is blocked by the new holder: it keeps its place.
        q.wait_for(1, keys(&["x"]));
        assert!(q.is_first(1));
        q.leave(1);
        assert!(q.is_first(2) && !q.is_first(3));
        // Crossing batches: 4 waits for {y, z}, 5 for {z, y}; the earlier is first in both.
        q.wait_for(4, keys(&["y", "z"]));
        q.wait_for(5, keys(&["z", "y"]));
        assert!(q.is_first(4) && !q.is_first(5));
        q.leave(4);
        assert!(q.is_first(5));
        assert_eq!(q.first_of(&key("x")), Some(2));
        assert_eq!(q.len(), 3);
    }

    #[test]
    fn the_stores_line_orders_tickets_and_forgets_the_expired() {
        let now = Timestamp::from_unix_micros(1_000_000);
        let ttl = Duration::from_secs(2);
        let mut line = WaitLineRows::default();
        let a = line.join(None, &keys(&["x"]), ttl, now);
        let b = line.join(None, &keys(&["x", "y"]), ttl, now);
        let c = line.join(None, &keys(&["y"]), ttl, now);
        assert!(a < b && b < c);
        assert!(line.ahead(a, &keys(&["x"]), now).first_in_line());
        assert!(!line.ahead(b, &keys(&["x", "y"]), now).first_in_line());
        assert!(!line.ahead(c, &keys(&["y"]), now).first_in_line());
        line.leave(a);
        assert!(line.ahead(b, &keys(&["x", "y"]), now).first_in_line());
        // b now waits for x alone, and keeps its place: c is first on y.
        assert_eq!(line.join(Some(b), &keys(&["x"]), ttl, now), b);
        assert!(line.ahead(c, &keys(&["y"]), now).first_in_line());
        // Past b's expiry, nobody waits for b.
        let later = now.saturating_add(ttl);
        assert!(line.ahead(c, &keys(&["x", "y"]), later).first_in_line());
        let d = line.join(None, &keys(&["x"]), ttl, later);
        assert!(d > c && line.ahead(d, &keys(&["x"]), later).first_in_line());
        assert_eq!(line.rows.len(), 1, "the expired places went with d's join");
    }
}

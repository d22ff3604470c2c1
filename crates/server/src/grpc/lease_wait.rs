//! The waiting room of `BeginUpdateRequest.wait_for_leased` (docs/api.md, "Waiting for a leased
//! claim"; decision 118): a BeginUpdate refused only with CLAIM_LEASED waits here, in its
//! claims' queues, and asks the store again when it is first in line and one of its claims
//! changed, until it gets another answer or its wait is over.
//!
//! Wake-ups come from the change feed: the room reads the store's log (`ClaimStore::read_events`)
//! whenever the server's [`WatchHub`] sees the head move (at once after this server's writes
//! while anyone waits, within `--watch-poll-interval` after another server's) and wakes the
//! first waiter of each claim that changed. A waiter first in line also asks again every
//! [`FALLBACK`], in case a change was missed (a failed read), and right after it joins (a change
//! just before it joined).
//! Waiting costs no store connection, and one queue entry and one `Notify` per waiter.
//!
//! Owns the queues' bookkeeping, the timers and the wake-ups; the rules (who waits, how long,
//! in which order) are `domain::waits`'.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::{Histogram, IntCounterVec, IntGauge};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use topology_claims::domain::waits::{self, Arrival, WaitQueues};
use topology_claims::domain::{
    BeginUpdate, CellId, ClaimKey, EventPosition, EventsQuery, Lease, LeaseId, EVENTS_READ_LIMIT,
};
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;

/// A waiter first in line asks again at least this often.
pub const FALLBACK: Duration = Duration::from_millis(500);

/// The knobs of the waiting room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitConfig {
    /// `serve --max-lease-wait`.
    pub max_wait: Duration,
    /// `serve --max-lease-waiters`.
    pub max_waiters: usize,
}

impl Default for WaitConfig {
    fn default() -> Self {
        Self {
            max_wait: waits::DEFAULT_MAX_LEASE_WAIT,
            max_waiters: waits::DEFAULT_MAX_LEASE_WAITERS,
        }
    }
}

/// The room's metrics (`--metrics-listen`).
#[derive(Clone)]
pub struct WaitMetrics {
    pub waiters: IntGauge,
    pub wait_seconds: Histogram,
    pub outcomes: IntCounterVec,
}

#[derive(Default)]
struct Room {
    queues: WaitQueues,
    /// Per place (its ticket in the store's wait line), the `Notify` of each request waiting in it (more than one: retries of the
    /// same lease).
    wakers: HashMap<Arrival, Vec<Arc<Notify>>>,
    /// A retried request of the same lease keeps its place.
    by_lease: HashMap<(CellId, LeaseId), Arrival>,
}

/// The server's waiting room.
pub struct WaitingRoom {
    config: WaitConfig,
    room: Mutex<Room>,
    metrics: Option<WaitMetrics>,
}

/// A wait refused before it began.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Unwaited {
    /// `--max-lease-waiters` wait already.
    OverCap,
    /// The store's wait line could not be joined.
    NoLine,
}

/// How a wait ended, for `topology_claims_lease_wait_outcomes_total{outcome}`.
fn outcome_label(result: &Result<Lease, ClaimsError>, unwaited: Option<Unwaited>) -> &'static str {
    match result {
        _ if unwaited == Some(Unwaited::OverCap) => "over_cap",
        _ if unwaited == Some(Unwaited::NoLine) => "no_line",
        Ok(_) => "granted",
        Err(error) if waits::blocking_claims(error).is_some() => "timed_out",
        Err(_) => "refused",
    }
}

/// A waiter's place, given back when its wait ends however it ends (also when the caller went
/// away and the handler was dropped: then its ticket leaves the store's line from a task of its
/// own).
struct Place<'a> {
    room: &'a WaitingRoom,
    arrival: Arrival,
    notify: Arc<Notify>,
    lease: Option<(CellId, LeaseId)>,
    store: Arc<dyn ClaimStore>,
    /// Whether the ticket already left the store's line.
    left_line: bool,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let emptied = self
            .room
            .leave(self.arrival, &self.notify, self.lease.as_ref());
        if emptied && !self.left_line {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let (store, ticket) = (Arc::clone(&self.store), self.arrival);
                runtime.spawn(async move { leave_line(&*store, ticket).await });
            }
        }
    }
}

/// How a waiter got in.
enum Entry {
    Place(Arrival, Arc<Notify>),
    /// `--max-lease-waiters` wait already.
    Full,
    /// The store's line could not be joined.
    NoLine(ClaimsError),
}

async fn leave_line(store: &dyn ClaimStore, ticket: Arrival) {
    if let Err(error) = store.leave_wait_line(ticket).await {
        // Its place expires (waits::LINE_MARGIN after its wait) and the next join deletes it.
        tracing::debug!(%error, ticket, "a lease waiter could not leave the store's wait line");
    }
}

impl WaitingRoom {
    pub fn new(config: WaitConfig, metrics: Option<WaitMetrics>) -> Arc<Self> {
        if let Some(metrics) = &metrics {
            // Every outcome's series is there from the start, at 0.
            for outcome in ["granted", "refused", "timed_out", "over_cap", "no_line"] {
                metrics.outcomes.with_label_values(&[outcome]);
            }
        }
        Arc::new(Self {
            config,
            room: Mutex::new(Room::default()),
            metrics,
        })
    }

    fn room(&self) -> std::sync::MutexGuard<'_, Room> {
        self.room.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long a request may wait (`None`: not at all), given what is left of its deadline.
    pub fn wait_for(
        &self,
        requested: Option<Duration>,
        deadline_left: Option<Duration>,
    ) -> Option<Duration> {
        waits::lease_wait(requested, self.config.max_wait, deadline_left)
    }

    /// A place in the room for a request waiting for `blocking`: its ticket in the store's line,
    /// unless `--max-lease-waiters` are waiting already. A retry of a request that still waits
    /// (the same lease) shares its place and is woken with it.
    async fn enter(
        &self,
        store: &dyn ClaimStore,
        lease: Option<&(CellId, LeaseId)>,
        blocking: &BTreeSet<ClaimKey>,
        wait: Duration,
    ) -> Entry {
        let notify = Arc::new(Notify::new());
        {
            let mut room = self.room();
            if let Some(arrival) = lease.and_then(|l| room.by_lease.get(l)).copied() {
                room.wakers
                    .entry(arrival)
                    .or_default()
                    .push(Arc::clone(&notify));
                return Entry::Place(arrival, notify);
            }
            if room.wakers.len() >= self.config.max_waiters {
                return Entry::Full;
            }
        }
        let ticket = match store
            .join_wait_line(None, blocking, waits::line_ttl(wait))
            .await
        {
            Ok(ticket) => ticket,
            Err(error) => return Entry::NoLine(error),
        };
        let entered = {
            let mut room = self.room();
            let entered = room.wakers.len() < self.config.max_waiters;
            if entered {
                room.wakers.insert(ticket, vec![Arc::clone(&notify)]);
                if let Some(lease) = lease {
                    room.by_lease.insert(lease.clone(), ticket);
                }
                if let Some(metrics) = &self.metrics {
                    metrics.waiters.set(room.wakers.len() as i64);
                }
            }
            entered
        };
        if !entered {
            leave_line(store, ticket).await;
            return Entry::Full;
        }
        Entry::Place(ticket, notify)
    }

    /// Whether `arrival`'s place holds no other request (a retry of the same lease).
    fn alone_in(&self, arrival: Arrival) -> bool {
        self.room()
            .wakers
            .get(&arrival)
            .is_none_or(|wakers| wakers.len() <= 1)
    }

    /// `arrival`'s wait ended: out of the queues, and the next in line of each of its claims is
    /// woken (its turn may have come). `false` while a retry of the same lease still waits in
    /// the place.
    fn leave(
        &self,
        arrival: Arrival,
        notify: &Arc<Notify>,
        lease: Option<&(CellId, LeaseId)>,
    ) -> bool {
        let mut room = self.room();
        if let Some(wakers) = room.wakers.get_mut(&arrival) {
            wakers.retain(|n| !Arc::ptr_eq(n, notify));
            if !wakers.is_empty() {
                return false;
            }
        }
        if let Some(lease) = lease {
            room.by_lease.remove(lease);
        }
        let claims = room.queues.claims_of(arrival);
        room.queues.leave(arrival);
        room.wakers.remove(&arrival);
        for claim in &claims {
            wake_first(&room, claim);
        }
        if let Some(metrics) = &self.metrics {
            metrics.waiters.set(room.wakers.len() as i64);
        }
        true
    }

    /// Claims changed in the store: their first waiters ask again.
    pub fn changed<'a>(&self, claims: impl IntoIterator<Item = &'a ClaimKey>) {
        let room = self.room();
        for claim in claims {
            wake_first(&room, claim);
        }
    }

    /// Nobody waits here.
    pub fn is_empty(&self) -> bool {
        self.room().wakers.is_empty()
    }

    /// Waits for the leases that refused `request` (`refusal`, CLAIM_LEASED only) to end, at
    /// most `wait`, asking the store again (`ask`) whenever this waiter is first in line, here
    /// and in the store's line, and its claims changed. Returns the last answer: a lease,
    /// another refusal, or CLAIM_LEASED when the wait is over (or at once when the room is
    /// full or the store's line cannot be joined).
    pub async fn wait<F, Fut>(
        &self,
        store: &Arc<dyn ClaimStore>,
        request: &BeginUpdate,
        refusal: ClaimsError,
        wait: Duration,
        ask: F,
    ) -> Result<Lease, ClaimsError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Lease, ClaimsError>>,
    {
        let started = Instant::now();
        let Some(mut blocking) = waits::blocking_claims(&refusal) else {
            return Err(refusal);
        };
        let lease = request.lease_id.map(|id| (request.cell_id.clone(), id));
        let (arrival, notify) = match self.enter(&**store, lease.as_ref(), &blocking, wait).await {
            Entry::Place(arrival, notify) => (arrival, notify),
            Entry::Full => {
                self.count(&Err(refusal.clone()), Some(Unwaited::OverCap), started);
                return Err(refusal);
            }
            Entry::NoLine(error) => {
                tracing::warn!(%error, "a lease waiter could not join the store's wait line: answered CLAIM_LEASED at once");
                self.count(&Err(refusal.clone()), Some(Unwaited::NoLine), started);
                return Err(refusal);
            }
        };
        let mut place = Place {
            room: self,
            arrival,
            notify: Arc::clone(&notify),
            lease,
            store: Arc::clone(store),
            left_line: false,
        };
        let deadline = started + wait;
        let mut last = Err(refusal);
        let result = loop {
            self.room().queues.wait_for(arrival, blocking.clone());
            // Not first here: wait for the turn (or the end).
            while !self.room().queues.is_first(arrival) {
                if tokio::time::timeout_at(deadline, notify.notified())
                    .await
                    .is_err()
                {
                    break;
                }
            }
            if Instant::now() >= deadline {
                break last;
            }
            // First here; an earlier ticket of another server may still wait for these claims.
            let first = match store.line_ahead(arrival, &blocking).await {
                Ok(ahead) => ahead.first_in_line(),
                Err(error) => {
                    tracing::debug!(%error, "a lease waiter could not read the store's wait line");
                    true
                }
            };
            if first {
                last = ask().await;
                match last.as_ref().err().and_then(waits::blocking_claims) {
                    Some(now) if Instant::now() < deadline => {
                        if now != blocking {
                            let ttl = waits::line_ttl(deadline - Instant::now());
                            if let Err(error) = store.join_wait_line(Some(arrival), &now, ttl).await
                            {
                                tracing::debug!(%error, "a lease waiter could not move in the store's wait line");
                            }
                            blocking = now;
                        }
                    }
                    _ => break last,
                }
            }
            let until = deadline.min(Instant::now() + FALLBACK);
            let _ = tokio::time::timeout_at(until, notify.notified()).await;
            if Instant::now() >= deadline {
                break last;
            }
        };
        self.count(&result, None, started);
        // Out of the store's line before the next waiter here is woken, so it finds the way free.
        if self.alone_in(arrival) {
            leave_line(&**store, arrival).await;
            place.left_line = true;
        }
        drop(place);
        result
    }

    fn count(
        &self,
        result: &Result<Lease, ClaimsError>,
        unwaited: Option<Unwaited>,
        started: Instant,
    ) {
        if let Some(metrics) = &self.metrics {
            metrics
                .outcomes
                .with_label_values(&[outcome_label(result, unwaited)])
                .inc();
            if unwaited.is_none() {
                metrics
                    .wait_seconds
                    .observe(started.elapsed().as_secs_f64());
            }
        }
    }

    /// Follows the store's log while anyone waits, waking the first waiter of every claim that
    /// changed. `head` is the change feed's head (`WatchHub::head`); ends when `stop` changes.
    pub async fn follow(
        self: Arc<Self>,
        store: Arc<dyn ClaimStore>,
        mut head: watch::Receiver<u64>,
        mut stop: watch::Receiver<()>,
    ) {
        let mut from = EventPosition::start_of(*head.borrow() + 1);
        loop {
            tokio::select! {
                changed = head.changed() => if changed.is_err() { return },
                _ = stop.changed() => return,
            }
            let current = *head.borrow();
            if self.is_empty() {
                // Nobody waits: a waiter that joins asks once right away, so skipping is safe.
                from = EventPosition::start_of(current + 1);
                continue;
            }
            loop {
                let query = EventsQuery {
                    from,
                    limit: EVENTS_READ_LIMIT,
                };
                let page = match store.read_events(&query).await {
                    Ok(page) => page,
                    Err(ClaimsError::WatchCompacted {
                        compact_revision, ..
                    }) => {
                        from = EventPosition::start_of(compact_revision);
                        break;
                    }
                    Err(error) => {
                        tracing::debug!(%error, "the waiting room could not read the change feed");
                        break;
                    }
                };
                let claims: BTreeSet<&ClaimKey> =
                    page.events.iter().map(|e| &e.claim.record.key).collect();
                self.changed(claims);
                if let Some(last) = page.events.last() {
                    from = last.position.next();
                }
                if !page.more {
                    from = from.max(EventPosition::start_of(page.through + 1));
                    break;
                }
            }
        }
    }
}

fn wake_first(room: &Room, claim: &ClaimKey) {
    if let Some(first) = room.queues.first_of(claim) {
        for notify in room.wakers.get(&first).into_iter().flatten() {
            notify.notify_one();
        }
    }
}

/// What is left of the caller's deadline, from its `grpc-timeout` header (`None`: none sent),
/// less a margin for the answer to get back in time.
pub fn deadline_left(metadata: &tonic::metadata::MetadataMap) -> Option<Duration> {
    const MARGIN: Duration = Duration::from_millis(50);
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    let timeout = match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    };
    Some(timeout.saturating_sub(MARGIN))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_callers_deadline_is_read_from_grpc_timeout_less_a_margin() {
        let mut metadata = tonic::metadata::MetadataMap::new();
        assert_eq!(deadline_left(&metadata), None);
        metadata.insert("grpc-timeout", "2S".parse().unwrap());
        assert_eq!(deadline_left(&metadata), Some(Duration::from_millis(1950)));
        metadata.insert("grpc-timeout", "1500m".parse().unwrap());
        assert_eq!(deadline_left(&metadata), Some(Duration::from_millis(1450)));
        metadata.insert("grpc-timeout", "10m".parse().unwrap());
        assert_eq!(deadline_left(&metadata), Some(Duration::ZERO));
        metadata.insert("grpc-timeout", "x".parse().unwrap());
        assert_eq!(deadline_left(&metadata), None);
    }
}

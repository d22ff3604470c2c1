//! In-memory adapters of both ports: the reference implementation, and the `memory:` store for
//! laptops and tests. State is lost when the process exits.
//!
//! The change feed: [`Tables`] records every change of a claim row; when the lock is released
//! after a call, the call's changes become one revision of the event log (one counter: the
//! mutex orders every call, so revisions are in the order calls took effect).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use crate::domain::waits::{Arrival, LineAhead, WaitLineRows};
use crate::domain::{
    check_watch_start, events, group, BeginUpdate, CellId, Claim, ClaimEvent, ClaimKey, ClaimsPage,
    ClaimsQuery, DecommissionStep, EventPosition, EventsPage, EventsQuery, GroupOp, GroupResults,
    Lease, LeaseId, LeaseSummary, LeasesPage, LeasesQuery, LogBounds, MarkRestored, NamespaceId,
    NamespaceSpec, NamespaceUpdate, RestoreEpoch, SlotGrant, SlotHolder, SlotLimit,
    StoredNamespace, Tables, Timestamp,
};
use crate::error::ClaimsError;
use crate::ports::{
    ClaimStore, Clock, LocalLease, LocalLeaseStore, LocalLock, SystemClock, WaitLine,
};

/// A [`ClaimStore`] over [`Tables`] behind a mutex.
pub struct MemoryClaimStore {
    state: Mutex<State>,
    /// The lease waiters' line (`WaitLine`): not part of the tables a snapshot copies.
    line: Mutex<WaitLineRows>,
    clock: Arc<dyn Clock>,
}

struct State {
    tables: Tables,
    log: EventLog,
}

/// The event log: each event with when it was recorded (for the retention).
#[derive(Default)]
struct EventLog {
    events: VecDeque<(ClaimEvent, Timestamp)>,
    /// The last revision given.
    head: u64,
    compacted_through: u64,
}

impl EventLog {
    /// The changes `tables` recorded since the last call become the next revision.
    fn absorb(&mut self, tables: &mut Tables, now: Timestamp) {
        let changes = tables.take_changes();
        if changes.is_empty() {
            return;
        }
        self.head += 1;
        let revision = self.head;
        for (seq, (mut claim, deleted)) in changes.into_iter().enumerate() {
            claim.revision = revision;
            if !deleted {
                tables.set_revision(claim.key(), revision);
            }
            let position = EventPosition {
                revision,
                seq: seq as u64,
            };
            let event = ClaimEvent {
                position,
                claim,
                deleted,
            };
            self.events.push_back((event, now));
        }
    }

    fn bounds(&self) -> LogBounds {
        LogBounds {
            compacted_through: self.compacted_through,
            current: self.head,
        }
    }
}

/// The locked state: [`Tables`] to call, and on release, their changes logged.
struct Locked<'a> {
    guard: MutexGuard<'a, State>,
    now: Timestamp,
}

impl Deref for Locked<'_> {
    type Target = Tables;

    fn deref(&self) -> &Tables {
        &self.guard.tables
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Tables {
        &mut self.guard.tables
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        let state = &mut *self.guard;
        state.log.absorb(&mut state.tables, self.now);
    }
}

impl Default for MemoryClaimStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryClaimStore {
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        let mut tables = Tables::default();
        tables.record_changes();
        Self {
            state: Mutex::new(State {
                tables,
                log: EventLog::default(),
            }),
            line: Mutex::default(),
            clock,
        }
    }

    /// A copy of the whole state (for tests and debugging).
    pub fn snapshot(&self) -> Tables {
        self.lock().clone()
    }

    fn line(&self) -> MutexGuard<'_, WaitLineRows> {
        self.line.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The tables, and the time read under their lock: every operation stamps its changes with
    /// that `now`, so stamps follow the order in which the changes were made.
    fn lock(&self) -> Locked<'_> {
        // A panic while holding the lock cannot leave Tables half-updated in a way later calls
        // could not read, so a poisoned lock is still usable.
        let guard = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Locked {
            guard,
            now: self.clock.now(),
        }
    }
}

#[async_trait]
impl WaitLine for MemoryClaimStore {
    async fn join_wait_line(
        &self,
        ticket: Option<Arrival>,
        claims: &BTreeSet<ClaimKey>,
        ttl: Duration,
    ) -> Result<Arrival, ClaimsError> {
        let now = self.clock.now();
        Ok(self.line().join(ticket, claims, ttl, now))
    }

    async fn line_ahead(
        &self,
        ticket: Arrival,
        claims: &BTreeSet<ClaimKey>,
    ) -> Result<LineAhead, ClaimsError> {
        let now = self.clock.now();
        Ok(self.line().ahead(ticket, claims, now))
    }

    async fn leave_wait_line(&self, ticket: Arrival) -> Result<(), ClaimsError> {
        self.line().leave(ticket);
        Ok(())
    }
}

#[async_trait]
impl ClaimStore for MemoryClaimStore {
    async fn begin_update(&self, request: BeginUpdate) -> Result<Lease, ClaimsError> {
        let mut tables = self.lock();
        let now = tables.now;
        tables.begin_update(request, LeaseId::generate(), now)
    }

    async fn commit_update(&self, cell_id: &CellId, lease_id: LeaseId) -> Result<(), ClaimsError> {
        let mut tables = self.lock();
        let now = tables.now;
        tables.commit_update(cell_id, lease_id, now)
    }

    async fn rollback_update(
        &self,
        cell_id: &CellId,
        lease_id: LeaseId,
        unrenewed_for: Option<Duration>,
    ) -> Result<(), ClaimsError> {
        let mut tables = self.lock();
        let now = tables.now;
        tables.rollback_update(cell_id, lease_id, unrenewed_for, now)
    }

    async fn renew_lease(&self, cell_id: &CellId, lease_id: LeaseId) -> Result<Lease, ClaimsError> {
        let mut tables = self.lock();
        let now = tables.now;
        tables.renew_lease(cell_id, lease_id, now)
    }

    async fn list_outstanding_leases(
        &self,
        query: &LeasesQuery,
    ) -> Result<LeasesPage, ClaimsError> {
        let tables = self.lock();
        let now = tables.now;
        Ok(tables.list_outstanding_leases(query, now))
    }

    async fn list_claims(&self, query: &ClaimsQuery) -> Result<ClaimsPage, ClaimsError> {
        Ok(self.lock().list_claims(query))
    }

    async fn lookup_claim(&self, key: &ClaimKey) -> Result<Claim, ClaimsError> {
        self.lock().lookup_claim(key)
    }

    async fn namespaces(&self) -> Result<Vec<StoredNamespace>, ClaimsError> {
        Ok(self.lock().namespaces.iter().cloned().collect())
    }

    async fn create_namespace(
        &self,
        spec: NamespaceSpec,
        max: usize,
    ) -> Result<StoredNamespace, ClaimsError> {
        self.lock().create_namespace(spec, max)
    }

    async fn delete_namespace(&self, id: &str) -> Result<(), ClaimsError> {
        self.lock().delete_namespace(id)
    }

    async fn update_namespace(
        &self,
        id: &str,
        update: NamespaceUpdate,
    ) -> Result<StoredNamespace, ClaimsError> {
        self.lock().update_namespace(id, update)
    }

    async fn collect_outcomes(&self, retention: Duration) -> Result<u64, ClaimsError> {
        let mut tables = self.lock();
        let now = tables.now;
        Ok(tables.collect_outcomes(now, retention))
    }

    async fn count_claims(&self) -> Result<Vec<(NamespaceId, u64)>, ClaimsError> {
        Ok(self.lock().count_claims())
    }

    async fn lease_summary(&self) -> Result<LeaseSummary, ClaimsError> {
        let tables = self.lock();
        let now = tables.now;
        Ok(tables.lease_summary(now))
    }

    async fn decommission_step(
        &self,
        cell_id: &CellId,
        batch: usize,
        dry_run: bool,
    ) -> Result<DecommissionStep, ClaimsError> {
        let mut tables = self.lock();
        let now = tables.now;
        tables.decommission_step(cell_id, batch, dry_run, now)
    }

    async fn restore_state(&self) -> Result<Option<RestoreEpoch>, ClaimsError> {
        Ok(self.lock().restore.clone())
    }

    async fn mark_restored(&self, request: &MarkRestored) -> Result<RestoreEpoch, ClaimsError> {
        let mut tables = self.lock();
        let now = tables.now;
        tables.mark_restored(request, now)
    }

    async fn report_verification_pass(
        &self,
        cell_id: &CellId,
        epoch: u64,
    ) -> Result<RestoreEpoch, ClaimsError> {
        let mut tables = self.lock();
        let now = tables.now;
        tables.report_verification_pass(cell_id, epoch, now)
    }

    async fn lift_quarantine(&self, epoch: u64, reason: &str) -> Result<RestoreEpoch, ClaimsError> {
        let mut tables = self.lock();
        let now = tables.now;
        tables.lift_quarantine(epoch, reason, now)
    }

    async fn acquire_verification_slot(
        &self,
        holder: &SlotHolder,
        limit: SlotLimit,
    ) -> Result<SlotGrant, ClaimsError> {
        let mut tables = self.lock();
        let now = tables.now;
        tables.acquire_verification_slot(holder, limit, now)
    }

    async fn release_verification_slot(&self, holder: &SlotHolder) -> Result<bool, ClaimsError> {
        Ok(self.lock().release_verification_slot(holder))
    }

    async fn read_events(&self, query: &EventsQuery) -> Result<EventsPage, ClaimsError> {
        let state = self.lock();
        let log = &state.guard.log;
        check_watch_start(query.from.revision, log.bounds())?;
        let start = log
            .events
            .partition_point(|(event, _)| event.position < query.from);
        let events = log
            .events
            .range(start..)
            .take(query.limit.saturating_add(1))
            .map(|(event, _)| event.clone())
            .collect();
        Ok(EventsPage::cut(events, query, log.head))
    }

    async fn compact_events(
        &self,
        retention: Duration,
        max_events: u64,
    ) -> Result<u64, ClaimsError> {
        let mut state = self.lock();
        let cutoff = state.now.saturating_sub(retention);
        let log = &mut state.guard.log;
        let older = log.events.partition_point(|(_, at)| *at < cutoff) as u64;
        let mut remove =
            events::events_to_compact(older, log.events.len() as u64, max_events) as usize;
        // Whole revisions: a watch from a revision finds all of it or is refused.
        if let Some(last) = remove.checked_sub(1).and_then(|i| log.events.get(i)) {
            let revision = last.0.position.revision;
            remove = log
                .events
                .partition_point(|(event, _)| event.position.revision <= revision);
            log.compacted_through = revision;
        }
        log.events.drain(..remove);
        Ok(remove as u64)
    }

    async fn run_group(&self, ops: &[GroupOp]) -> Result<GroupResults, ClaimsError> {
        // The whole state is at hand: the group is one lock, each operation decided in order
        // by the reference semantics (`domain::group::apply_op`).
        let mut tables = self.lock();
        let now = tables.now;
        Ok(ops
            .iter()
            .map(|op| group::apply_op(&mut tables, op, now))
            .collect())
    }

    /// One lock, no transaction, nothing written to disk: a group would only add the hand-off
    /// to its worker (6 % of `serve`'s instructions per pair, docs/benchmarks.md).
    fn group_commit_saves(&self) -> bool {
        false
    }

    fn retries(&self) -> u64 {
        // One mutex, no contention to retry.
        0
    }
}

/// An in-memory `leases_outstanding` table.
#[derive(Clone)]
pub struct MemoryLocalLeaseStore {
    rows: Arc<Mutex<BTreeMap<LeaseId, LocalLease>>>,
    locks: Arc<Mutex<BTreeMap<String, (String, Timestamp)>>>,
    clock: Arc<dyn Clock>,
}

impl Default for MemoryLocalLeaseStore {
    fn default() -> Self {
        Self::new()
    }
}

/// A local "transaction" of the in-memory store: rows recorded in it appear on
/// [`commit`](MemoryLocalTx::commit) and vanish if it is dropped.
#[derive(Default)]
pub struct MemoryLocalTx {
    staged: Vec<LocalLease>,
}

impl MemoryLocalLeaseStore {
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self {
            rows: Arc::default(),
            locks: Arc::default(),
            clock,
        }
    }

    /// Starts a local transaction.
    pub fn begin(&self) -> MemoryLocalTx {
        MemoryLocalTx::default()
    }

    /// Commits a local transaction: its recorded leases become visible.
    pub fn commit(&self, tx: MemoryLocalTx) {
        let mut rows = self.lock();
        for row in tx.staged {
            rows.entry(row.lease_id).or_insert(row);
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<LeaseId, LocalLease>> {
        self.rows
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl LocalLeaseStore for MemoryLocalLeaseStore {
    type Tx<'t> = MemoryLocalTx;

    async fn record(&self, tx: &mut Self::Tx<'_>, lease_id: LeaseId) -> Result<(), ClaimsError> {
        tx.staged.push(LocalLease {
            lease_id,
            created_at: self.clock.now(),
        });
        Ok(())
    }

    async fn delete(&self, lease_id: LeaseId) -> Result<bool, ClaimsError> {
        Ok(self.lock().remove(&lease_id).is_some())
    }

    async fn find(&self, lease_ids: &[LeaseId]) -> Result<Vec<LocalLease>, ClaimsError> {
        let rows = self.lock();
        Ok(lease_ids
            .iter()
            .filter_map(|id| rows.get(id).cloned())
            .collect())
    }

    async fn list_older_than(
        &self,
        before: Timestamp,
        limit: usize,
    ) -> Result<Vec<LocalLease>, ClaimsError> {
        let mut old: Vec<LocalLease> = self
            .lock()
            .values()
            .filter(|r| r.created_at < before)
            .cloned()
            .collect();
        old.sort_by_key(|r| (r.created_at, r.lease_id));
        old.truncate(limit);
        Ok(old)
    }
}

impl LocalLock for MemoryLocalLeaseStore {
    async fn try_lock(&self, name: &str, holder: &str, ttl: Duration) -> Result<bool, ClaimsError> {
        let now = self.clock.now();
        let mut locks = self
            .locks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let free = match locks.get(name) {
            None => true,
            Some((current, expires_at)) => current == holder || *expires_at < now,
        };
        if free {
            locks.insert(
                name.to_owned(),
                (holder.to_owned(), now.saturating_add(ttl)),
            );
        }
        Ok(free)
    }

    async fn unlock(&self, name: &str, holder: &str) -> Result<(), ClaimsError> {
        let mut locks = self
            .locks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if locks
            .get(name)
            .is_some_and(|(current, _)| current == holder)
        {
            locks.remove(name);
        }
        Ok(())
    }
}

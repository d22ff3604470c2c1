//! The combiner: group commit for any [`ClaimStore`].
//!
//! BeginUpdate, CommitUpdate and RollbackUpdate calls that arrive while the store is busy queue
//! up; whenever one of the store's `group_parallelism()` transaction slots is free, a worker takes
//! everything queued (up to `--group-max`) and runs it as one store transaction through
//! [`ClaimStore::run_group`], which decides the operations one by one in arrival order
//! (`domain::group`). There is no timer: a lone call finds a free slot and runs at once, so
//! batching only happens when calls would otherwise wait for a connection anyway.
//!
//! The queue has no bound of its own: it holds one entry per such call in flight, so the
//! server's bounds on requests in flight (`--max-connections` × `--max-streams`, the request
//! byte budget, `--request-timeout`) bound it; a group takes at most `--group-max` entries and
//! `--group-max-claims` claims.
//!
//! Fairness: a small call must not wait behind another cell's large batches. A BeginUpdate of
//! more than `--group-max-claims` claims runs in its own store transaction beside the groups,
//! never in a group and never in a worker's slot, and so do the CommitUpdate and RollbackUpdate
//! of its lease (the lease ids of such leases are remembered, up to [`LARGE_LEASES_KEPT`]); and
//! a group stops taking calls at `--group-max-claims` claims. Large begins take turns, one at a
//! time, and large calls of any kind run at most `--group-large-parallelism` (default 1) at
//! once. So a small call shares its transaction with at most that many claims of others, finds
//! a worker that is not busy with a large batch, and by default waits behind at most one large
//! transaction (decision 104).
//!
//! Every call gets its own answer: a refusal (CLAIM_TAKEN, …) is that call's alone. When the
//! store transaction itself fails (after the adapter's own retries), every call in it gets that
//! error, exactly what a lone call would have got; nothing of the batch committed.

use std::collections::{BTreeSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::oneshot;

use topology_claims::domain::waits::{Arrival, LineAhead};
use topology_claims::domain::{
    self, BeginUpdate, CellId, Claim, ClaimKey, ClaimsPage, ClaimsQuery, DecommissionStep,
    GroupAnswer, GroupOp, GroupResults, Lease, LeaseId, LeaseSummary, LeasesPage, LeasesQuery,
    SlotGrant, SlotHolder, SlotLimit,
};
use topology_claims::error::ClaimsError;
use topology_claims::ports::{run_alone, ClaimStore, PoolStatus, WaitLine};

/// How the combiner batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupConfig {
    /// Most operations in one store transaction (`--group-max`).
    pub max: usize,
    /// Most store transactions in flight at once; `None`: the store's
    /// [`ClaimStore::group_parallelism`] (its pool size).
    pub parallelism: Option<usize>,
    /// Most claims in one group; a BeginUpdate with more runs alone, beside the groups
    /// (`--group-max-claims`).
    pub max_claims: usize,
    /// Most such large calls (begins, and the ends of their leases) in store transactions at
    /// once (`--group-large-parallelism`); large begins take turns one at a time whatever it is.
    pub large_parallelism: usize,
    /// A group of one call runs the store's own BeginUpdate / CommitUpdate / RollbackUpdate
    /// transaction (tuned for one operation: on PostgreSQL at most 11 statements instead of a
    /// group's 13) rather than `run_group`. `false` sends every call through `run_group` (the suites
    /// do, so that they prove it).
    pub lone_direct: bool,
}

impl Default for GroupConfig {
    fn default() -> Self {
        Self {
            max: domain::DEFAULT_GROUP_MAX,
            max_claims: domain::DEFAULT_GROUP_MAX_CLAIMS,
            large_parallelism: 1,
            parallelism: None,
            lone_direct: true,
        }
    }
}

/// What the combiner formed, for metrics and the benchmark.
#[derive(Debug, Default)]
pub struct GroupStats {
    /// Store transactions run.
    pub batches: AtomicU64,
    /// Operations they carried.
    pub operations: AtomicU64,
    /// Batches by size: `[1], [2], [3-4], [5-8], …, [>512]` (bucket `i` holds sizes up to `2^i`).
    pub sizes: [AtomicU64; SIZE_BUCKETS],
}

/// Size buckets of [`GroupStats::sizes`].
pub const SIZE_BUCKETS: usize = 11;

impl GroupStats {
    fn record(&self, size: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.operations.fetch_add(size as u64, Ordering::Relaxed);
        let bucket = (usize::BITS - size.saturating_sub(1).leading_zeros()) as usize;
        self.sizes[bucket.min(SIZE_BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
    }

    /// `(upper bound, batches)` per bucket; the last bound is `usize::MAX`.
    pub fn size_distribution(&self) -> Vec<(usize, u64)> {
        self.sizes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let bound = if i + 1 == SIZE_BUCKETS {
                    usize::MAX
                } else {
                    1 << i
                };
                (bound, n.load(Ordering::Relaxed))
            })
            .collect()
    }
}

struct Pending {
    op: GroupOp,
    reply: oneshot::Sender<Result<GroupAnswer, ClaimsError>>,
}

#[derive(Default)]
struct Queue {
    pending: VecDeque<Pending>,
    running: usize,
}

/// Lease ids of large leases remembered, so that their ends run beside the groups too; past it
/// the set starts again (a forgotten lease's end is grouped: correct, only less fair).
pub const LARGE_LEASES_KEPT: usize = 4096;

struct Shared {
    store: Arc<dyn ClaimStore>,
    max: usize,
    max_claims: usize,
    /// Leases begun alone for their size, whose ends run alone too.
    large: Mutex<std::collections::HashSet<LeaseId>>,
    /// Large begins take turns (one at a time, first come first served): a large begin locks
    /// whole key stripes on PostgreSQL, and the store's lock queue would put a small call
    /// behind every large one queued before it.
    large_turn: tokio::sync::Semaphore,
    /// Every large call, begin or end, holds one of `--group-large-parallelism` slots while it
    /// runs (a begin takes its turn first). With one slot large calls reach the store one by
    /// one, and a small call waits behind at most one of them: not behind every large end
    /// queued at SQLite's one connection, nor beside several on PostgreSQL's CPUs.
    large_slots: tokio::sync::Semaphore,
    parallelism: usize,
    lone_direct: bool,
    queue: Mutex<Queue>,
    stats: GroupStats,
    observer: Option<Observer>,
}

/// Told the size of every group the combiner forms (the batch-size histogram).
pub type Observer = Arc<dyn Fn(usize) + Send + Sync>;

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // The queue is consistent between statements; a panic elsewhere cannot tear it.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A [`ClaimStore`] that group-commits BeginUpdate, CommitUpdate and RollbackUpdate of the store
/// it wraps; every other call goes straight through.
#[derive(Clone)]
pub struct GroupCommit {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit")
            .field("max", &self.shared.max)
            .field("parallelism", &self.shared.parallelism)
            .finish()
    }
}

impl GroupCommit {
    pub fn new(store: Arc<dyn ClaimStore>, config: GroupConfig) -> Self {
        let parallelism = config
            .parallelism
            .unwrap_or_else(|| store.group_parallelism())
            .max(1);
        Self {
            shared: Arc::new(Shared {
                store,
                max: config.max.max(1),
                max_claims: config.max_claims.max(1),
                large: Mutex::default(),
                large_turn: tokio::sync::Semaphore::new(1),
                large_slots: tokio::sync::Semaphore::new(config.large_parallelism.max(1)),
                parallelism,
                lone_direct: config.lone_direct,
                queue: Mutex::default(),
                stats: GroupStats::default(),
                observer: None,
            }),
        }
    }

    /// Calls `observer` with the size of every group formed from now on. Call before sharing.
    pub fn with_observer(mut self, observer: Observer) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.observer = Some(observer);
        }
        self
    }

    /// What the combiner formed so far.
    pub fn stats(&self) -> &GroupStats {
        &self.shared.stats
    }

    /// The store transactions that may run at once.
    pub fn parallelism(&self) -> usize {
        self.shared.parallelism
    }

    /// Runs a large call in its own store transaction, beside the groups; remembers a large
    /// lease so that its end runs alone too.
    async fn alone(&self, op: GroupOp) -> Result<GroupAnswer, ClaimsError> {
        self.shared.stats.record(1);
        if let Some(observe) = &self.shared.observer {
            observe(1);
        }
        let closed = || {
            ClaimsError::internal(format!(
                "{}: the large batches' turn was closed",
                op.method()
            ))
        };
        // The begins' turn first, then a slot; ends take only a slot, so no two calls wait for
        // each other's.
        let _turn = match &op {
            GroupOp::Begin { .. } => Some(
                self.shared
                    .large_turn
                    .acquire()
                    .await
                    .map_err(|_| closed())?,
            ),
            _ => None,
        };
        let _slot = self
            .shared
            .large_slots
            .acquire()
            .await
            .map_err(|_| closed())?;
        let answer = run_alone(&*self.shared.store, &op).await;
        let mut large = self.shared.large.lock().unwrap_or_else(|p| p.into_inner());
        match (&op, &answer) {
            (GroupOp::Begin { .. }, Ok(GroupAnswer::Begun(lease))) => {
                if large.len() >= LARGE_LEASES_KEPT {
                    large.clear();
                }
                large.insert(lease.lease_id);
            }
            (GroupOp::Commit { lease_id, .. } | GroupOp::Rollback { lease_id, .. }, Ok(_)) => {
                large.remove(lease_id);
            }
            _ => {}
        }
        answer
    }

    fn is_large(&self, lease_id: LeaseId) -> bool {
        let large = self.shared.large.lock().unwrap_or_else(|p| p.into_inner());
        large.contains(&lease_id)
    }

    async fn submit(&self, op: GroupOp) -> Result<GroupAnswer, ClaimsError> {
        let method = op.method();
        let (reply, answer) = oneshot::channel();
        let start_worker = {
            let mut queue = self.shared.lock();
            queue.pending.push_back(Pending { op, reply });
            if queue.running < self.shared.parallelism {
                queue.running += 1;
                true
            } else {
                false
            }
        };
        if start_worker {
            // A task of its own: a caller that goes away (deadline, disconnect) must not cancel
            // a transaction that carries other callers' operations, nor a lone call's: a store
            // transaction dropped half-way holds the Spanner emulator's single lock (decision
            // 120: running lone calls in the caller's task was tried and the chaos campaign
            // caught it).
            tokio::spawn(work(self.shared.clone()));
        }
        answer.await.map_err(|_| {
            ClaimsError::internal(format!(
                "{method}: the group commit worker stopped before answering"
            ))
        })?
    }
}

/// Keeps `running` honest if a worker panics: the slot is given back and, if calls are still
/// queued, a new worker takes over.
struct WorkerSlot(Arc<Shared>);

impl Drop for WorkerSlot {
    fn drop(&mut self) {
        let restart = {
            let mut queue = self.0.lock();
            if std::thread::panicking() && !queue.pending.is_empty() {
                true
            } else {
                queue.running -= 1;
                false
            }
        };
        if restart {
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(work(self.0.clone()));
            } else {
                self.0.lock().running -= 1;
            }
        }
    }
}

/// A worker: runs groups until the queue is empty. Boxed: it may spawn its successor.
fn work(shared: Arc<Shared>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(run_worker(shared))
}

async fn run_worker(shared: Arc<Shared>) {
    let slot = WorkerSlot(shared.clone());
    loop {
        let mut batch: Vec<Pending> = {
            let mut queue = shared.lock();
            if queue.pending.is_empty() {
                // `running` is decremented under this same lock (by the slot's drop, below), so
                // a call queued after this check starts its own worker.
                drop(queue);
                break;
            }
            let n = group_size(
                queue.pending.iter().map(|p| p.op.claims()),
                shared.max,
                shared.max_claims,
            );
            queue.pending.drain(..n).collect()
        };
        shared.stats.record(batch.len());
        if let Some(observe) = &shared.observer {
            observe(batch.len());
        }
        if shared.lone_direct && batch.len() == 1 {
            let pending = batch.pop().expect("one call");
            let result = run_alone(&*shared.store, &pending.op).await;
            let _ = pending.reply.send(result);
            continue;
        }
        let ops: Vec<GroupOp> = batch.iter().map(|p| p.op.clone()).collect();
        let results: GroupResults = match shared.store.run_group(&ops).await {
            Ok(results) if results.len() == ops.len() => results,
            Ok(results) => {
                let error = ClaimsError::internal(format!(
                    "the store answered {} of a group's {} operations",
                    results.len(),
                    ops.len()
                ));
                ops.iter().map(|_| Err(error.clone())).collect()
            }
            Err(error) => ops.iter().map(|_| Err(error.clone())).collect(),
        };
        for (pending, result) in batch.into_iter().zip(results) {
            // A caller that went away no longer wants its answer.
            let _ = pending.reply.send(result);
        }
    }
    // Decrement under the lock, then re-check: a call queued between the empty check and here
    // saw `running` still counting this worker and started none.
    drop(slot);
    let restart = {
        let mut queue = shared.lock();
        if !queue.pending.is_empty() && queue.running < shared.parallelism {
            queue.running += 1;
            true
        } else {
            false
        }
    };
    if restart {
        tokio::spawn(work(shared));
    }
}

/// How many of the queued calls (their claims, in order) the next group takes: at least one, at
/// most `max`, and no more than `max_claims` claims in all unless the first alone has more.
fn group_size(claims: impl Iterator<Item = usize>, max: usize, max_claims: usize) -> usize {
    let (mut n, mut total) = (0, 0);
    for weight in claims {
        if n == max || (n > 0 && total + weight > max_claims) {
            break;
        }
        n += 1;
        total += weight;
    }
    n
}

/// The wait line is the store's; nothing of it is grouped.
#[async_trait]
impl WaitLine for GroupCommit {
    async fn join_wait_line(
        &self,
        ticket: Option<Arrival>,
        claims: &BTreeSet<ClaimKey>,
        ttl: Duration,
    ) -> Result<Arrival, ClaimsError> {
        self.shared.store.join_wait_line(ticket, claims, ttl).await
    }

    async fn line_ahead(
        &self,
        ticket: Arrival,
        claims: &BTreeSet<ClaimKey>,
    ) -> Result<LineAhead, ClaimsError> {
        self.shared.store.line_ahead(ticket, claims).await
    }

    async fn leave_wait_line(&self, ticket: Arrival) -> Result<(), ClaimsError> {
        self.shared.store.leave_wait_line(ticket).await
    }
}

#[async_trait]
impl ClaimStore for GroupCommit {
    async fn begin_update(&self, request: BeginUpdate) -> Result<Lease, ClaimsError> {
        // Malformed batches never queue. The batch-size policy is the front end's.
        domain::check_batch(&request, usize::MAX)?;
        // Fixed before the first attempt, as every store does: a retried group replays.
        let lease_id = request.lease_id.unwrap_or_else(LeaseId::generate);
        let op = GroupOp::Begin { request, lease_id };
        let answer = if op.claims() > self.shared.max_claims {
            self.alone(op).await?
        } else {
            self.submit(op).await?
        };
        match answer {
            GroupAnswer::Begun(lease) => Ok(lease),
            GroupAnswer::Ended => Err(ClaimsError::internal(
                "BeginUpdate: the store answered a group's begin as an end",
            )),
        }
    }

    async fn commit_update(&self, cell_id: &CellId, lease_id: LeaseId) -> Result<(), ClaimsError> {
        let op = GroupOp::Commit {
            cell_id: cell_id.clone(),
            lease_id,
        };
        if self.is_large(lease_id) {
            return self.alone(op).await.map(drop);
        }
        self.submit(op).await.map(drop)
    }

    async fn rollback_update(
        &self,
        cell_id: &CellId,
        lease_id: LeaseId,
        unrenewed_for: Option<Duration>,
    ) -> Result<(), ClaimsError> {
        let op = GroupOp::Rollback {
            cell_id: cell_id.clone(),
            lease_id,
            unrenewed_for,
        };
        if self.is_large(lease_id) {
            return self.alone(op).await.map(drop);
        }
        self.submit(op).await.map(drop)
    }

    async fn renew_lease(&self, cell_id: &CellId, lease_id: LeaseId) -> Result<Lease, ClaimsError> {
        self.shared.store.renew_lease(cell_id, lease_id).await
    }

    async fn list_outstanding_leases(
        &self,
        query: &LeasesQuery,
    ) -> Result<LeasesPage, ClaimsError> {
        self.shared.store.list_outstanding_leases(query).await
    }

    async fn list_claims(&self, query: &ClaimsQuery) -> Result<ClaimsPage, ClaimsError> {
        self.shared.store.list_claims(query).await
    }

    async fn lookup_claim(&self, key: &ClaimKey) -> Result<Claim, ClaimsError> {
        self.shared.store.lookup_claim(key).await
    }

    async fn namespaces(&self) -> Result<Vec<domain::StoredNamespace>, ClaimsError> {
        self.shared.store.namespaces().await
    }

    async fn create_namespace(
        &self,
        spec: domain::NamespaceSpec,
        max: usize,
    ) -> Result<domain::StoredNamespace, ClaimsError> {
        self.shared.store.create_namespace(spec, max).await
    }

    async fn delete_namespace(&self, id: &str) -> Result<(), ClaimsError> {
        self.shared.store.delete_namespace(id).await
    }

    async fn update_namespace(
        &self,
        id: &str,
        update: domain::NamespaceUpdate,
    ) -> Result<domain::StoredNamespace, ClaimsError> {
        self.shared.store.update_namespace(id, update).await
    }

    async fn collect_outcomes(&self, retention: Duration) -> Result<u64, ClaimsError> {
        self.shared.store.collect_outcomes(retention).await
    }

    async fn count_claims(&self) -> Result<Vec<(domain::NamespaceId, u64)>, ClaimsError> {
        self.shared.store.count_claims().await
    }

    async fn lease_summary(&self) -> Result<LeaseSummary, ClaimsError> {
        self.shared.store.lease_summary().await
    }

    async fn decommission_step(
        &self,
        cell_id: &CellId,
        batch: usize,
        dry_run: bool,
    ) -> Result<DecommissionStep, ClaimsError> {
        self.shared
            .store
            .decommission_step(cell_id, batch, dry_run)
            .await
    }

    async fn restore_state(
        &self,
    ) -> Result<Option<topology_claims::domain::RestoreEpoch>, ClaimsError> {
        self.shared.store.restore_state().await
    }
    async fn mark_restored(
        &self,
        request: &topology_claims::domain::MarkRestored,
    ) -> Result<topology_claims::domain::RestoreEpoch, ClaimsError> {
        self.shared.store.mark_restored(request).await
    }
    async fn report_verification_pass(
        &self,
        cell_id: &CellId,
        epoch: u64,
    ) -> Result<topology_claims::domain::RestoreEpoch, ClaimsError> {
        self.shared
            .store
            .report_verification_pass(cell_id, epoch)
            .await
    }
    async fn lift_quarantine(
        &self,
        epoch: u64,
        reason: &str,
    ) -> Result<topology_claims::domain::RestoreEpoch, ClaimsError> {
        self.shared.store.lift_quarantine(epoch, reason).await
    }

    async fn read_events(
        &self,
        query: &domain::EventsQuery,
    ) -> Result<domain::EventsPage, ClaimsError> {
        self.shared.store.read_events(query).await
    }

    async fn compact_events(
        &self,
        retention: std::time::Duration,
        max_events: u64,
    ) -> Result<u64, ClaimsError> {
        self.shared
            .store
            .compact_events(retention, max_events)
            .await
    }

    async fn acquire_verification_slot(
        &self,
        holder: &SlotHolder,
        limit: SlotLimit,
    ) -> Result<SlotGrant, ClaimsError> {
        self.shared
            .store
            .acquire_verification_slot(holder, limit)
            .await
    }

    async fn release_verification_slot(&self, holder: &SlotHolder) -> Result<bool, ClaimsError> {
        self.shared.store.release_verification_slot(holder).await
    }

    async fn run_group(&self, ops: &[GroupOp]) -> Result<GroupResults, ClaimsError> {
        self.shared.store.run_group(ops).await
    }

    fn group_parallelism(&self) -> usize {
        self.shared.parallelism
    }

    fn retries(&self) -> u64 {
        self.shared.store.retries()
    }

    fn pool_status(&self) -> Option<PoolStatus> {
        self.shared.store.pool_status()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_stops_at_its_calls_or_its_claims_and_always_takes_one() {
        assert_eq!(group_size([1, 1, 1].into_iter(), 64, 256), 3);
        assert_eq!(group_size([1; 100].into_iter(), 64, 256), 64);
        assert_eq!(group_size([100, 100, 100, 1].into_iter(), 64, 256), 2);
        assert_eq!(group_size([1000, 1].into_iter(), 64, 256), 1);
        assert_eq!(group_size([1, 1000, 1].into_iter(), 64, 256), 1);
        assert_eq!(group_size(std::iter::empty(), 64, 256), 0);
    }
}

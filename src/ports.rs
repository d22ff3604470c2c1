//! The two storage ports of the protocol and the clock port.
//!
//! [`ClaimStore`] is the service's store (claims, outstanding leases, outcomes);
//! [`LocalLeaseStore`] is a cell's own `leases_outstanding` table, written inside the cell's local
//! transaction. Adapters implement them by reading rows, asking `crate::domain` for the decision
//! and writing it; they must not decide protocol questions themselves.

use std::collections::BTreeSet;
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use crate::domain::waits::{Arrival, LineAhead};
use crate::domain::{
    BeginUpdate, CellId, Claim, ClaimKey, ClaimsPage, ClaimsQuery, DecommissionStep, EventsPage,
    EventsQuery, GroupAnswer, GroupOp, GroupResults, Lease, LeaseId, LeaseSummary, LeasesPage,
    LeasesQuery, LocalTransaction, LocalTxStatus, MarkRestored, NamespaceId, NamespaceSpec,
    NamespaceUpdate, RestoreEpoch, SlotGrant, SlotHolder, SlotLimit, StoredNamespace, Timestamp,
};
use crate::error::ClaimsError;

/// The store-wide line of lease waiters (`BeginUpdateRequest.wait_for_leased`,
/// `domain::waits`, docs/decisions/119): the order in which waiters on every server sharing the
/// store are decided. Each method is one short store transaction; waiters hold no connection in
/// between. A store keeps one place per ticket, with its claims and an expiry of the store's
/// clock (`domain::WaitLineRows` is the reference).
///
/// The defaults answer `Unsupported`, for test doubles that never serve waiters (the server's
/// waiting room then answers a waiting BeginUpdate at once); every store `serve` runs on, and
/// every wrapper of one, implements all three (the conformance suite's wait-line cases).
#[async_trait]
pub trait WaitLine: Send + Sync {
    /// Joins the line for `claims` until the store's clock plus `ttl`: a new ticket, larger than
    /// every ticket given before, when `ticket` is `None`; else `ticket`'s claims are replaced
    /// and its place kept. Removes other tickets' expired places.
    async fn join_wait_line(
        &self,
        _ticket: Option<Arrival>,
        _claims: &BTreeSet<ClaimKey>,
        _ttl: Duration,
    ) -> Result<Arrival, ClaimsError> {
        Err(no_wait_line())
    }

    /// The store's clock and the latest expiry among the tickets before `ticket` that wait for
    /// any of `claims` (`domain::LineAhead`).
    async fn line_ahead(
        &self,
        _ticket: Arrival,
        _claims: &BTreeSet<ClaimKey>,
    ) -> Result<LineAhead, ClaimsError> {
        Err(no_wait_line())
    }

    /// `ticket` leaves the line (nothing happens if it is not there).
    async fn leave_wait_line(&self, _ticket: Arrival) -> Result<(), ClaimsError> {
        Err(no_wait_line())
    }
}

fn no_wait_line() -> ClaimsError {
    ClaimsError::Unsupported {
        what: "this store keeps no wait line".to_owned(),
    }
}

/// The service's store. Every method is one atomic store transaction; contention inside the
/// store (serialization failures, deadlocks, aborts) is retried by the adapter, so callers only
/// see protocol errors, `Unavailable` or `Internal`.
///
/// Object-safe (through `async_trait`) because the server picks the adapter at run time from
/// the store URL and holds it as `Arc<dyn ClaimStore>`.
#[async_trait]
pub trait ClaimStore: WaitLine + Send + Sync + 'static {
    /// Leases every claim of the batch, or changes nothing. Retrying with the same client-chosen
    /// lease id and content returns the same lease.
    async fn begin_update(&self, request: BeginUpdate) -> Result<Lease, ClaimsError>;

    /// Finalises a lease: destroys are deleted, creates become committed. Idempotent.
    async fn commit_update(&self, cell_id: &CellId, lease_id: LeaseId) -> Result<(), ClaimsError>;

    /// Reverts a lease: creates are deleted, destroys are released. Idempotent; an unknown id is
    /// recorded as rolled back. With `unrenewed_for`, an outstanding lease is rolled back only
    /// if it has gone unrenewed that long by the store's clock, read in the same transaction as
    /// the lease (`domain::decide_rollback`); otherwise `LeaseRenewed` and nothing changes.
    async fn rollback_update(
        &self,
        cell_id: &CellId,
        lease_id: LeaseId,
        unrenewed_for: Option<Duration>,
    ) -> Result<(), ClaimsError>;

    /// Marks an outstanding lease as renewed now (store clock).
    async fn renew_lease(&self, cell_id: &CellId, lease_id: LeaseId) -> Result<Lease, ClaimsError>;

    /// A page of one cell's outstanding leases, ordered by lease id.
    async fn list_outstanding_leases(&self, query: &LeasesQuery)
        -> Result<LeasesPage, ClaimsError>;

    /// A page of one cell's claims of one table: the first `query.fetch_limit()` claims after
    /// `query.cursor.start_after()`, cut by `domain::claims_page`.
    async fn list_claims(&self, query: &ClaimsQuery) -> Result<ClaimsPage, ClaimsError>;

    /// The claim with this key, leased or not: `key` as sent, its key computed under the
    /// namespace's rules read in the same transaction (`domain::resolve_key`).
    async fn lookup_claim(&self, key: &ClaimKey) -> Result<Claim, ClaimsError>;

    /// Every namespace of the store (GetNamespace, ListNamespaces), in id order.
    async fn namespaces(&self) -> Result<Vec<StoredNamespace>, ClaimsError>;

    /// CreateNamespace, in one store transaction: read every namespace, ask
    /// `domain::decide_create_namespace` (at most `max`, `serve --max-namespaces`), insert the
    /// row. Refusals: `NAMESPACE_EXISTS`, `TOO_MANY_NAMESPACES`, an invalid field.
    async fn create_namespace(
        &self,
        spec: NamespaceSpec,
        max: usize,
    ) -> Result<StoredNamespace, ClaimsError>;

    /// DeleteNamespace of `id`, in one store transaction: read it and count its claims (leased
    /// ones included, locking out creates until the commit), ask
    /// `domain::decide_delete_namespace`, delete the row. Refusals: `NAMESPACE_NOT_FOUND`,
    /// `NAMESPACE_NOT_EMPTY`, a built-in.
    async fn delete_namespace(&self, id: &str) -> Result<(), ClaimsError>;

    /// UpdateNamespace of `id`, in one store transaction: read the namespace
    /// (`NAMESPACE_NOT_FOUND`), ask `domain::decide_rules_change`; when the change needs the
    /// proof, read every claim of the namespace (locking out writers of the namespace's claims
    /// until the commit) and rewrite the keys it changes; write the namespace, its version one
    /// more. Refusals: `NAMESPACE_RULES_CONFLICT` (the first collisions and violations), or an
    /// invalid field.
    async fn update_namespace(
        &self,
        id: &str,
        update: NamespaceUpdate,
    ) -> Result<StoredNamespace, ClaimsError>;

    /// Forgets lease outcomes decided longer than `retention` ago; returns how many.
    async fn collect_outcomes(&self, retention: Duration) -> Result<u64, ClaimsError>;

    /// How many claims (leased ones included) each namespace holding any has, in one read of
    /// every claim: the `topology_claims_claims` gauge (`serve --claims-gauge-interval`) and
    /// `admin namespaces list --count` read it, never a request path.
    async fn count_claims(&self) -> Result<Vec<(NamespaceId, u64)>, ClaimsError>;

    /// Every cell that has outstanding leases, with their count and the oldest `created_at`,
    /// and the store's clock, in one query (the lease gauges and the admin service read it).
    async fn lease_summary(&self) -> Result<LeaseSummary, ClaimsError>;

    /// One step of decommissioning `cell_id`, in one store transaction: read the cell's
    /// outstanding-lease count and decommission mark, ask `domain::decide_decommission`, then
    /// either count the cell's claims (dry run) or record the mark (first step) and delete up
    /// to `batch` of the cell's claims. Steps repeat until [`DecommissionStep::complete`]; a
    /// run cut short resumes with the next step. A marked cell's BeginUpdate is refused
    /// (`domain::check_not_decommissioned`, read inside BeginUpdate's transaction).
    async fn decommission_step(
        &self,
        cell_id: &CellId,
        batch: usize,
        dry_run: bool,
    ) -> Result<DecommissionStep, ClaimsError>;

    /// Takes or renews a verification slot for `holder`, in one store transaction: read every
    /// row of `verification_slots` (serialized with every other acquire, so several servers on
    /// the store share `limit.max` and `limit.per_cell`), ask `domain::decide_acquire` at the
    /// store's clock, then delete the expired rows and write the holder's with
    /// `expires_at = now + limit.ttl`. All slots held, or the holder's cell at its cap:
    /// `VerificationSlotsBusy` naming the limit, with the time until the earliest expires.
    async fn acquire_verification_slot(
        &self,
        holder: &SlotHolder,
        limit: SlotLimit,
    ) -> Result<SlotGrant, ClaimsError>;

    /// Releases `holder`'s slot (`domain::decide_release`); `false` when it had none (expired
    /// and taken, or never acquired). Another holder's slot is never touched.
    async fn release_verification_slot(&self, holder: &SlotHolder) -> Result<bool, ClaimsError>;

    /// The latest restore epoch (`domain::restore`), or `None` if the store was never marked
    /// restored. Read by `serve` at start and every `--restore-refresh`, and by the admin service.
    async fn restore_state(&self) -> Result<Option<RestoreEpoch>, ClaimsError>;

    /// `admin mark-restored`, in one store transaction: read the latest epoch and every cell that
    /// has claims or outstanding leases, ask `domain::decide_mark_restored` at the store's clock,
    /// and insert the new epoch (earlier ones stay as history where the store keeps them).
    async fn mark_restored(&self, request: &MarkRestored) -> Result<RestoreEpoch, ClaimsError>;

    /// A cell's report of a whole verification pass begun in `epoch`, in one store transaction:
    /// read the latest epoch with its reports, ask `domain::decide_report`, record the report and,
    /// when the last expected cell reports, the lift. Returns the epoch as written.
    async fn report_verification_pass(
        &self,
        cell_id: &CellId,
        epoch: u64,
    ) -> Result<RestoreEpoch, ClaimsError>;

    /// `admin lift-quarantine` of `epoch`, in one store transaction (`domain::decide_lift`);
    /// lifting a lifted epoch changes nothing. Returns the epoch as written.
    async fn lift_quarantine(&self, epoch: u64, reason: &str) -> Result<RestoreEpoch, ClaimsError>;

    /// The change feed (WatchClaims): the events at or after `query.from`, in log order, at most
    /// `query.limit`, and how far the log is complete (`domain::EventsPage`). Refuses
    /// `WATCH_COMPACTED` (`domain::check_watch_start`) when `query.from`'s revision was
    /// compacted. Every change of a claim row is an event written in the same store transaction
    /// as the change (docs/decisions/117).
    async fn read_events(&self, query: &EventsQuery) -> Result<EventsPage, ClaimsError>;

    /// Removes the events recorded longer than `retention` ago (store clock), and the oldest
    /// beyond `max_events`, whole revisions at a time; returns how many.
    async fn compact_events(
        &self,
        retention: Duration,
        max_events: u64,
    ) -> Result<u64, ClaimsError>;

    /// Group commit (the server's combiner, `topology_claims_server::group`): runs `ops` in **one** store transaction. Lock and read
    /// every row of `domain::GroupReads::of(ops)` in one go, decide them with
    /// `domain::decide_group` at the store's clock, write its `GroupWrites`, commit once, and
    /// return its per-operation results. Contention is retried like any transaction (the whole
    /// group, decided afresh). `Err` means the transaction failed for good: nothing of the group
    /// committed and every operation gets that error. A store whose transactions are bounded
    /// (Spanner's mutation limit) may split a large group, in order, into several transactions;
    /// then an operation of a later part that failed for good carries that error in its own
    /// result, and the earlier parts' operations keep their (committed) answers.
    ///
    /// The default runs the operations one by one, each as its own lone call
    /// ([`run_alone`]) under the group's lease ids: a store without group commit.
    async fn run_group(&self, ops: &[GroupOp]) -> Result<GroupResults, ClaimsError> {
        let mut results = Vec::with_capacity(ops.len());
        for op in ops {
            results.push(match op {
                // A later operation of the group may name the id the combiner chose: the lease
                // must have it. The answer keeps the request as sent.
                GroupOp::Begin { request, lease_id } if request.lease_id.is_none() => {
                    let fixed = GroupOp::Begin {
                        request: BeginUpdate {
                            lease_id: Some(*lease_id),
                            ..request.clone()
                        },
                        lease_id: *lease_id,
                    };
                    run_alone(self, &fixed).await.map(|answer| match answer {
                        GroupAnswer::Begun(mut lease) => {
                            lease.request.lease_id = None;
                            GroupAnswer::Begun(lease)
                        }
                        ended => ended,
                    })
                }
                op => run_alone(self, op).await,
            });
        }
        Ok(results)
    }

    /// How many [`run_group`](Self::run_group) transactions may usefully run at once (the
    /// connection pool's size; 1 for a single writer).
    fn group_parallelism(&self) -> usize {
        1
    }

    /// Whether group commit saves this store anything: one store transaction (its locks, its
    /// commit, its fsync) shared by concurrent calls. A store with no transaction to share says
    /// no (the in-memory store: one lock held for microseconds), and `serve` then runs calls
    /// directly instead of handing each to the group's worker and back (decision 101).
    fn group_commit_saves(&self) -> bool {
        true
    }

    /// Transactions the adapter retried (contention, aborts, lost connections) since it was
    /// opened; read by the metrics (`topology_claims_store_retries_total`), never a query.
    fn retries(&self) -> u64;

    /// The adapter's connection pool now, for the metrics (`topology_claims_store_pool_*`);
    /// `None` for a store without one (memory, SQLite's single connection, Spanner's sessions).
    fn pool_status(&self) -> Option<PoolStatus> {
        None
    }
}

/// A store's connection pool as the metrics show it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStatus {
    /// Most connections the pool opens (`--pg-pool-size`).
    pub max: usize,
    /// Open connections checked out by a transaction.
    pub in_use: usize,
    /// Open connections waiting in the pool.
    pub idle: usize,
    /// Transactions waiting for a connection.
    pub waiting: usize,
}

/// A lease id recorded in a cell's local `leases_outstanding` table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalLease {
    pub lease_id: LeaseId,
    /// The cell's local clock when the lease was recorded.
    pub created_at: Timestamp,
}

/// A cell's local `leases_outstanding` table.
///
/// [`record`](Self::record) runs inside the caller's own open transaction (`Tx`), so the lease
/// row commits or rolls back together with the application's rows: its presence after the fact
/// is the proof that the local transaction committed.
pub trait LocalLeaseStore: Send + Sync {
    /// The caller's open local transaction.
    type Tx<'t>;

    /// Records `lease_id` inside `tx`. Recording an id that is already recorded is a no-op that
    /// keeps the first `created_at`.
    fn record(
        &self,
        tx: &mut Self::Tx<'_>,
        lease_id: LeaseId,
    ) -> impl Future<Output = Result<(), ClaimsError>>;

    /// Deletes the row of `lease_id` (in its own transaction); `false` if there was none.
    fn delete(&self, lease_id: LeaseId) -> impl Future<Output = Result<bool, ClaimsError>> + Send;

    /// The rows among `lease_ids` that exist.
    fn find(
        &self,
        lease_ids: &[LeaseId],
    ) -> impl Future<Output = Result<Vec<LocalLease>, ClaimsError>> + Send;

    /// Up to `limit` rows recorded before `before`, oldest first.
    fn list_older_than(
        &self,
        before: Timestamp,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<LocalLease>, ClaimsError>> + Send;

    /// What this database knows of the transaction a lease's `local_transaction` names. Never
    /// fails: anything it cannot vouch for (another database's transaction, a standby, an error)
    /// is [`LocalTxStatus::Unknown`] with the reason, and the reconciler falls back to the
    /// staleness rule. The default knows nothing (SQLite, memory); PostgreSQL answers with
    /// `pg_xact_status` (decision 080).
    fn transaction_status(
        &self,
        local: &LocalTransaction,
    ) -> impl Future<Output = LocalTxStatus> + Send {
        let _ = local;
        std::future::ready(LocalTxStatus::Unknown(
            "this local database does not report transaction status".to_owned(),
        ))
    }
}

/// Where stores that do not have a database clock get their time from.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Timestamp;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        Timestamp::from_unix_micros(micros)
    }
}

/// What a store does at open when its schema is behind this binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MigrationPolicy {
    /// Apply pending migrations (the default of `serve`).
    #[default]
    Apply,
    /// Refuse with [`ClaimsError::MigrationsPending`] (`serve --no-migrate`).
    Refuse,
}

/// A named, expiring lock in the cell's local database, so that of several sidecars only one
/// reconciles (or verifies) a cell at a time. Expiry frees the lock of a holder that crashed.
pub trait LocalLock: Send + Sync {
    /// Takes or extends `name` for `holder` until now + `ttl`; `false` if another holder has it.
    fn try_lock(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, ClaimsError>> + Send;

    /// Releases `name` if `holder` has it.
    fn unlock(
        &self,
        name: &str,
        holder: &str,
    ) -> impl Future<Output = Result<(), ClaimsError>> + Send;
}

/// One operation as the store's own lone call: exactly what `--group-commit off` runs (a
/// BeginUpdate without a client lease id lets the store choose one, as it always has). A group
/// of one runs this, and so does `ClaimStore::run_group`'s default, op after op.
pub async fn run_alone<S: ClaimStore + ?Sized>(
    store: &S,
    op: &GroupOp,
) -> Result<GroupAnswer, ClaimsError> {
    match op {
        GroupOp::Begin { request, .. } => store
            .begin_update(request.clone())
            .await
            .map(GroupAnswer::Begun),
        GroupOp::Commit { cell_id, lease_id } => store
            .commit_update(cell_id, *lease_id)
            .await
            .map(|()| GroupAnswer::Ended),
        GroupOp::Rollback {
            cell_id,
            lease_id,
            unrenewed_for,
        } => store
            .rollback_update(cell_id, *lease_id, *unrenewed_for)
            .await
            .map(|()| GroupAnswer::Ended),
    }
}

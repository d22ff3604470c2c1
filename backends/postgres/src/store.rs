//! [`PostgresClaimStore`]: the service's [`ClaimStore`] on PostgreSQL.
//!
//! Every operation is one READ COMMITTED transaction of the same shape as
//! `domain::Tables` (the reference): lock and read the rows the request touches, ask the domain,
//! write exactly its decision. It must not decide anything itself; database constraints are the
//! second line of defence and their violations retry the whole transaction.
//!
//! ## Why an advisory lock on the lease id
//! `SELECT … FOR UPDATE` locks rows that exist. A lease id that exists nowhere yet can be used by
//! two transactions at once: BeginUpdate inserting it into `leases` and RollbackUpdate of the
//! unknown id inserting it into `lease_outcomes` would both commit (different tables, no unique
//! violation), leaving a lease that is outstanding and rolled back at once. Every transaction
//! that touches a lease therefore first takes `pg_advisory_xact_lock(LEASE_LOCK_CLASS,
//! hash(lease_id))` (with its stripe shared; a group of more than 64 lease ids takes the
//! stripes exclusively instead: see "lock budget"), pipelined with its first reads (no extra
//! round trip).
//!
//! ## Why a cell lock
//! READ COMMITTED lets a decommission step count a cell's leases (none) while a BeginUpdate of
//! the cell, which read "not decommissioned" a moment earlier, is about to commit a new lease:
//! its claims would then be deleted under it. BeginUpdate therefore takes
//! `pg_advisory_xact_lock_shared(CELL_LOCK_CLASS, stripe(cell_id))` before it reads the
//! decommission mark, and a decommission step takes the exclusive form before it counts leases:
//! BeginUpdates of one cell still run in parallel, but a step sees either their committed leases
//! or, once it has marked the cell, they see the mark. Both are in their first flight. One of
//! 32 stripes, not one lock per cell, so that a group of BeginUpdates of many cells holds a
//! bounded number of locks; the price is that a decommission step also holds back the
//! BeginUpdates of the other cells of its stripe while it runs (rare and short).
//!
//! ## Why a slot lock
//! A verification slot acquire counts the live rows of `verification_slots` and inserts one when
//! fewer than the limit exist. Under READ COMMITTED two acquires could both count N-1 and both
//! insert (different keys: no unique violation), exceeding the limit; `SELECT … FOR UPDATE`
//! cannot help, since it locks only rows that exist. Every acquire therefore first takes
//! `pg_advisory_xact_lock(SLOT_LOCK_CLASS, hashtext(current_schema()))`, one lock for the table: acquires run one at a
//! time (they are rare: one per verifier and renewal interval), and the statement after the lock
//! sees every earlier acquire's commit. The store's clock is `statement_timestamp()` of that
//! read, so a lock wait does not age it. Slot transactions take no other lock.
//!
//! ## Group commit
//! [`ClaimStore::run_group`] runs a batch of BeginUpdate / CommitUpdate / RollbackUpdate (the
//! combiner's, `topology_claims_server::group`) as one transaction of the same two flights. Flight 1
//! locks and reads every row of `domain::GroupReads`: every advisory lock (lease ids, claim
//! keys, cells; "lock budget") in one statement, the clock (`now()`, the transaction's time every write of this
//! store is stamped with) with the decommission marks, the lease and the outcome rows
//! (`= ANY`), and in one statement the claim rows of every named key and every claim carrying
//! one of the lease ids, in key order. `domain::decide_group` decides the operations one by one
//! against those rows; flight 2 writes its net `GroupWrites` as array statements (`unnest`):
//! insert leases, delete claims, update claims (every column), insert claims, delete leases,
//! insert outcomes, `COMMIT`. Statements with nothing to write are not sent; when nothing at
//! all is to be written the transaction is rolled back after flight 1. Deletes and updates
//! check their row count (TC001), and a key inserted meanwhile is a unique violation: either
//! retries the whole group, decided afresh on re-read rows. No statement count depends on the
//! batch's size.
//!
//! ## Why key locks
//! `SELECT … FOR UPDATE` cannot lock a claim that does not exist yet, so two transactions that
//! both create one key both read "absent", and the second insert fails on the primary key and
//! retries the whole transaction. For a lone BeginUpdate that is cheap; a group of dozens of
//! operations over hot keys would lose that race over and over (measured: groups of 16–48 on
//! the benchmark's hot keys ran out of their 12 attempts). Every BeginUpdate, lone or grouped,
//! therefore takes `pg_advisory_xact_lock(KEY_LOCK_CLASS, hash(key))` for each key it names, in
//! ascending order, right after its lease locks: transactions on one key serialize before they
//! read, and the later one's read (READ COMMITTED: a new snapshot per statement) sees the
//! earlier one's insert. Above 128 distinct keys in one transaction (a large batch, or a group
//! of many BeginUpdates) it takes the keys' stripes exclusively instead: equal keys still
//! serialize, since a key's stripe is the same in every transaction ("lock budget").
//!
//! ## Lock budget (a fixed number of locks per transaction)
//! PostgreSQL keeps advisory locks in its shared lock table, which holds about
//! `max_locks_per_transaction × (max_connections + max_prepared_transactions)` locks (6,400 by
//! default) for all sessions together: one lock per key of 48 concurrent 1,000-claim
//! BeginUpdates filled it, and 46 of them failed with "out of shared memory". Lease ids and
//! claim keys therefore lock on two levels (`locks.rs`, decision 072): up to an exact limit of
//! distinct items (64 lease ids, 128 keys) each item's own lock plus its stripe shared; above
//! it only the items' stripes (32 of each class), exclusive. Cells lock on 32 stripes. So one
//! transaction holds at most [`crate::ADVISORY_LOCKS_PER_TRANSACTION`] = 288 advisory locks
//! (96 lease, 160 key, 32 cell), whatever its batch or group size, plus at most 20 relation and
//! transaction-id locks (`tests/locks.rs` counts both from `pg_locks`). Below the limits
//! transactions only share stripes and exclude each other exactly as one lock per item did; a
//! transaction above a limit excludes every transaction that shares one of its stripes, so a
//! 1,000-claim BeginUpdate runs alone among BeginUpdates. A full lock table (SQLSTATE 53200)
//! is retried like contention (`error.rs`). Lock keys are XORed with
//! `hashtext(current_schema())` in the statement, so stores in different schemas of one
//! database do not share stripes.
//!
//! ## Lock order (no deadlocks between batches)
//! Advisory lease stripes → lease locks → key stripes → key locks → cell stripes, each class in
//! ascending key order (`locks::AdvisoryLocks`, one statement that takes them in array order)
//! → lease / outcome rows (a group: in id order) → claim rows in (claim_type, claim_value) order
//! (the sorted keys drive a `LATERAL … FOR UPDATE` probe each, decision 122) → inserts of absent
//! claims, also in key order. Commit/Rollback lock the lease's claims in key order before
//! rewriting them. A decommission step takes only its cell stripe, then deletes claim rows; it
//! never waits for a lease lock, and BeginUpdate never waits for a cell lock while holding rows. Every advisory lock is taken before any row lock,
//! by every kind of transaction and in the one order above, whether a class is held shared,
//! exact or exclusive, so a lone operation and a group order alike. Deadlocks the planner could
//! still produce are retried like any contention.
//!
//! ## Round trips (statements already prepared on the connection)
//! | operation | round trips | flights |
//! |---|---|---|
//! | BeginUpdate | 2 | `BEGIN`, advisory locks (lease, keys, cell), decommission mark, lease + outcome rows, claim rows `FOR UPDATE` · inserts, destroy marks, update marks, lease insert, `COMMIT` |
//! | BeginUpdate refused / replayed | 1 | the first flight; `ROLLBACK` is sent without waiting |
//! | CommitUpdate / RollbackUpdate | 2 | `BEGIN`, lease locks, lease + outcome rows, lease's claims `FOR UPDATE` · deletes, releases, replaces (committed updates), lease delete, outcome insert, `COMMIT` |
//! | CommitUpdate already done / refused | 1 | |
//! | group of N (BeginUpdate / CommitUpdate / RollbackUpdate) | 2 | `BEGIN`, advisory locks (lease ids, keys, cells), clock + decommission marks, lease rows, outcome rows, claim rows `FOR UPDATE` · lease inserts, claim deletes, claim updates, claim inserts, lease deletes, outcome inserts, `COMMIT`: at most 13 statements for any N |
//! | group of N, nothing to write | 1 | the first flight (6 statements); `ROLLBACK` is sent without waiting |
//! | RenewLease | 2 | `BEGIN`, lease locks, lease + outcome rows · update, `COMMIT` |
//! | ListOutstandingLeases | 1 | page + server time |
//! | ListClaims | 1 | one range of the record index from the cursor (inside a record when it has a key) |
//! | LookupClaim | 1 | |
//! | lease_summary | 1 | one `GROUP BY cell_id` with `now()` |
//! | decommission_step | 2 | `BEGIN`, cell stripe (exclusive), lease count, mark · (count of claims) or (mark insert, bounded delete), `COMMIT` |
//! | decommission_step refused | 1 | |
//! | acquire_verification_slot | 2 | `BEGIN`, slot lock, clock + every slot row · delete expired, upsert, `COMMIT` |
//! | release_verification_slot | 1 | `DELETE … RETURNING` (autocommit) |
//! | mark_restored | 2 | `BEGIN`, restore lock, clock + latest epoch and its reports, cells with claims or leases · epoch insert, `COMMIT` (`restore.rs`, "why a restore lock") |
//! | report_verification_pass / lift_quarantine | 2 | `BEGIN`, restore lock, clock + latest epoch and its reports · report insert and/or lift, `COMMIT` |
//! | mark refused; report or lift refused or with nothing to write | 1 | the first flight; `ROLLBACK` is sent without waiting |
//! | restore_state | 1 | latest epoch and its reports (autocommit) |
//!
//! A connection's first use of an operation adds one round trip that prepares all of its
//! statements at once. [`PostgresClaimStore::round_trips`] counts flights, for tests and the
//! benchmark.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::Pool;
use topology_claims::codec::encode_request;
use topology_claims::domain::{
    self, BeginPlan, DecommissionStep, EndPlan, EventsPage, EventsQuery, GroupDecision, GroupOp,
    GroupReads, GroupResults, GroupSnapshot, LeaseRecord, LeaseSummary, MarkRestored, NamespaceSet,
    NamespaceSpec, NamespaceUpdate, RestoreEpoch, SlotGrant, SlotHolder, SlotLimit,
    StoredNamespace,
};
use topology_claims::{
    BeginUpdate, CellId, Claim, ClaimKey, ClaimStore, ClaimsError, ClaimsPage, ClaimsQuery, Lease,
    LeaseId, LeaseOp, LeasesPage, LeasesQuery, MigrationPolicy, PoolStatus, Timestamp,
};

use crate::error::{final_error, pool_error, Failure};
use crate::locks::{AdvisoryLocks, CellMode};
use crate::migrations;
use crate::namespaces::{self, NamespaceCache};
use crate::options::{PostgresOptions, Settings};
use crate::rows::{self, small, KeyArrays, RecordArrays};
use crate::session::{Shared, StoreStats};
use crate::sql;
use crate::watch;

/// Outcomes deleted per statement by `collect_outcomes`.
const COLLECT_BATCH: i64 = 10_000;
/// Longest retention honoured (100 years): `now() - retention` must stay a valid timestamp.
const MAX_RETENTION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The service's store on PostgreSQL (see the module docs for the transaction shape).
/// Cheap to clone: clones share the pool.
#[derive(Clone)]
pub struct PostgresClaimStore {
    pub(crate) shared: Arc<Shared>,
    pub(crate) namespaces: Arc<NamespaceCache>,
    /// The connection that holds the serving lock shared while any clone lives (`transfer.rs`:
    /// a restore is refused meanwhile).
    _serving: Arc<deadpool_postgres::Object>,
}

impl std::fmt::Debug for PostgresClaimStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresClaimStore")
            .field("target", &self.shared.target)
            .finish()
    }
}

impl PostgresClaimStore {
    /// Connects to `url` (`postgres://USER@HOST:PORT/DB`, `?host=/var/run/postgresql` for a
    /// socket, or libpq key=value form) and applies or refuses pending migrations per `policy`.
    ///
    /// Fails with `Unavailable` when PostgreSQL cannot be reached, `Configuration` for a bad URL
    /// or option, `MigrationsPending` under [`MigrationPolicy::Refuse`].
    pub async fn connect(
        url: &str,
        options: PostgresOptions,
        policy: MigrationPolicy,
    ) -> Result<Self, ClaimsError> {
        let settings = Settings::new(url, &options)?;
        let pool = settings.pool(&options)?;
        migrations::prepare(&pool, &settings.target, options.schema.as_deref(), policy).await?;
        let client = pool
            .get()
            .await
            .map_err(|e| pool_error(e, &settings.target))?;
        let rows = namespaces::read_all(&**client)
            .await
            .map_err(|e| final_error(&e, &settings.target, "reading the namespaces"))?;
        let namespaces = Arc::new(NamespaceCache::new(namespaces::from_rows(&rows)?));
        drop(client);
        let serving = crate::transfer::hold_serving_lock(&settings, &options).await?;
        let shared = Shared::new(
            pool,
            settings.target,
            options.statement_timeout,
            options.connect_timeout,
        );
        Ok(Self {
            shared: Arc::new(shared),
            namespaces,
            _serving: Arc::new(serving),
        })
    }

    /// The connection pool (for tools and the benchmark that run `sql.rs` statements directly).
    pub fn pool(&self) -> &Pool {
        &self.shared.pool
    }

    /// The password-free `postgres://user@host:port/db` this store talks to.
    pub fn target(&self) -> &str {
        &self.shared.target
    }

    /// Pipelined flights of statements awaited since the store was created (see the module
    /// docs). Counts every attempt, retries included.
    pub fn round_trips(&self) -> u64 {
        self.shared.stats().round_trips
    }

    /// Round trips, retries and reconnects since the store was created.
    pub fn stats(&self) -> StoreStats {
        self.shared.stats()
    }

    async fn begin_attempt(&self, sent: &BeginUpdate, lease_id: LeaseId) -> Result<Lease, Failure> {
        let mut session = self.shared.session().await?;
        let [lock, decommissioned, select_lease, select_outcome, select_claims, select_namespaces, insert_claims, mark_claims, insert_lease] =
            session
                .prepare([
                    sql::LOCK_ADVISORY,
                    sql::CELL_DECOMMISSIONED,
                    sql::SELECT_LEASE_FOR_UPDATE,
                    sql::SELECT_OUTCOME_FOR_UPDATE,
                    sql::SELECT_CLAIMS_FOR_UPDATE,
                    sql::SELECT_NAMESPACES,
                    sql::INSERT_CLAIMS,
                    sql::MARK_CLAIMS,
                    sql::INSERT_LEASE,
                ])
                .await?;
        // The keys under the rules last seen, checked against this transaction's read below.
        let rules = namespaces::rules_for(&self.namespaces, &session, |set| {
            domain::prepare_begin(sent.clone(), set)
        })
        .await?;
        let (rules, request) = (rules.0, &rules.1);
        let named =
            namespaces::id_param(request.operations().map(|(_, r)| r.key.namespace.clone()));
        let payload = encode_request(request);
        let id = lease_id.as_uuid();
        let keys = KeyArrays::sorted(request.operations().map(|(_, record)| &record.key));
        let locks = AdvisoryLocks::of(
            [lease_id],
            request.operations().map(|(_, record)| &record.key),
            [&request.cell_id],
            CellMode::Shared,
        );
        let begin = session.begin_lease_transaction();
        let client = session.client()?;
        let cell = request.cell_id.as_str();
        // Flight 1: open the transaction and lock + read everything the decision needs. The
        // shared cell lock comes before the mark is read (see "why a cell lock").
        let (_, _, decommissioned_row, lease_row, outcome_row, claim_rows, namespace_rows) = tokio::try_join!(
            biased;
            client.batch_execute(begin),
            async { client.execute(&lock, &locks.params()).await },
            async { client.query_one(&decommissioned, &[&cell]).await },
            async { client.query_opt(&select_lease, &[id]).await },
            async { client.query_opt(&select_outcome, &[id]).await },
            async { client.query(&select_claims, &[&keys.types, &keys.values]).await },
            async { client.query(&select_namespaces, &[&named]).await },
        )?;
        session.round_trip();
        self.namespaces.confirm_read(
            &rules,
            request.operations().map(|(_, r)| r.key.namespace.clone()),
            &namespace_rows,
        )?;
        domain::check_not_decommissioned(
            &request.cell_id,
            decommissioned_row.try_get(0).map_err(internal)?,
        )?;
        let known = rows::lease_record(lease_row, outcome_row)?;
        let current = rows::claims_by_key(&claim_rows)?;
        let writes =
            match domain::decide_begin(request, lease_id, known.as_ref(), &current, &rules)? {
                // Dropping the session rolls the read-only transaction back.
                BeginPlan::Replay(lease) => return Ok(lease),
                BeginPlan::Apply(writes) => writes,
            };
        let inserts = RecordArrays::sorted(&writes.inserts);
        let marks = KeyArrays::sorted(&writes.marks);
        let update_marks = KeyArrays::sorted(&writes.update_marks);
        let (create, destroy, update) = (
            small(LeaseOp::Create.number()),
            small(LeaseOp::Destroy.number()),
            small(LeaseOp::Update.number()),
        );
        // Flight 2: the decision's writes and COMMIT. Any failing statement aborts the
        // transaction, which turns the pipelined COMMIT into a rollback.
        let (_, _, _, lease_row, _) = tokio::try_join!(
            biased;
            async {
                if inserts.is_empty() {
                    return Ok(0);
                }
                let i = &inserts;
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 13] = [
                    &i.types, &i.values, &i.owner_types, &i.owner_values, &i.table_names,
                    &i.record_ids, &cell, id, &create, &i.displays, &i.namespaces,
                    &i.owner_type_names, &i.source_tables,
                ];
                client.execute(&insert_claims, &params).await
            },
            async {
                if marks.is_empty() {
                    return Ok(0);
                }
                client.execute(&mark_claims, &[id, &destroy, &marks.types, &marks.values, &cell]).await
            },
            async {
                if update_marks.is_empty() {
                    return Ok(0);
                }
                let (types, values) = (&update_marks.types, &update_marks.values);
                client.execute(&mark_claims, &[id, &update, types, values, &cell]).await
            },
            async { client.query_one(&insert_lease, &[id, &cell, &payload]).await },
            client.batch_execute(sql::COMMIT),
        )?;
        session.round_trip();
        session.committed();
        Ok(Lease {
            lease_id,
            cell_id: request.cell_id.clone(),
            created_at: rows::timestamp(lease_row.try_get(0).map_err(internal)?),
            last_renewed_at: rows::timestamp(lease_row.try_get(1).map_err(internal)?),
            request: request.clone(),
        })
    }

    /// One attempt of a group (see "group commit" in the module docs): the rows of `reads`
    /// locked and read in one flight, the batch decided by `domain::decide_group`, its net
    /// writes and `COMMIT` in a second flight. Every statement takes arrays, so the number of
    /// statements does not depend on the batch's size.
    async fn group_attempt(&self, ops: &[GroupOp]) -> Result<GroupResults, Failure> {
        let mut session = self.shared.session().await?;
        let [lock, clock, select_leases, select_outcomes, select_claims, select_namespaces, insert_leases, delete_claims, update_claims, insert_claims, delete_leases, insert_outcomes] =
            session
                .prepare([
                    sql::LOCK_ADVISORY,
                    sql::GROUP_CLOCK_AND_DECOMMISSIONED,
                    sql::GROUP_SELECT_LEASES_FOR_UPDATE,
                    sql::GROUP_SELECT_OUTCOMES_FOR_UPDATE,
                    sql::GROUP_SELECT_CLAIMS_FOR_UPDATE,
                    sql::SELECT_NAMESPACES,
                    sql::GROUP_INSERT_LEASES,
                    sql::GROUP_DELETE_CLAIMS,
                    sql::GROUP_UPDATE_CLAIMS,
                    sql::GROUP_INSERT_CLAIMS,
                    sql::GROUP_DELETE_LEASES,
                    sql::GROUP_INSERT_OUTCOMES,
                ])
                .await?;
        // Keys under the rules last seen, checked against this transaction's read below. An
        // operation they refuse reads nothing and is refused when decided.
        let rules = self.namespaces.current();
        let named = domain::namespaces_named(ops);
        let reads = &GroupReads::of(ops, &rules);
        let named_param = namespaces::id_param(named.iter().cloned());
        // The lock order of the module docs, within the lock budget whatever the group's size.
        let locks = AdvisoryLocks::of(
            reads.lease_ids.iter().copied(),
            &reads.keys,
            &reads.cells,
            CellMode::Shared,
        );
        let cells: Vec<&str> = reads.cells.iter().map(CellId::as_str).collect();
        let ids = rows::lease_ids(&reads.lease_ids);
        let keys = KeyArrays::sorted(&reads.keys);
        let begin = session.begin_lease_transaction();
        let client = session.client()?;
        // Flight 1: every lock, then every row the decision needs (the shared cell locks come
        // before the marks are read: "why a cell lock").
        let (_, _, clock_rows, lease_rows, outcome_rows, claim_rows, namespace_rows) = tokio::try_join!(
            biased;
            client.batch_execute(begin),
            async { client.execute(&lock, &locks.params()).await },
            async { client.query(&clock, &[&cells]).await },
            async { client.query(&select_leases, &[&ids]).await },
            async { client.query(&select_outcomes, &[&ids]).await },
            async { client.query(&select_claims, &[&keys.types, &keys.values, &ids]).await },
            async { client.query(&select_namespaces, &[&named_param]).await },
        )?;
        session.round_trip();
        self.namespaces
            .confirm_read(&rules, named, &namespace_rows)?;
        let (now, decommissioned) = rows::clock_and_marks(&clock_rows)?;
        let snapshot = GroupSnapshot {
            claims: claim_rows
                .iter()
                .map(rows::claim)
                .collect::<Result<_, _>>()?,
            leases: lease_rows
                .iter()
                .map(rows::lease)
                .collect::<Result<_, _>>()?,
            outcomes: outcome_rows
                .iter()
                .map(rows::outcome)
                .collect::<Result<_, _>>()?,
            decommissioned,
            namespaces: NamespaceSet::clone(&rules),
        };
        let GroupDecision { results, writes } = domain::decide_group(snapshot, ops, now);
        if writes.is_empty() {
            // Every operation refused, replayed or already done: dropping the session rolls the
            // read-only transaction back.
            return Ok(results);
        }
        let new_leases = rows::LeaseRows::sorted(&writes.insert_leases);
        let deleted = KeyArrays::sorted(&writes.delete_claims);
        let updated = rows::ClaimRows::sorted(&writes.update_claims);
        let inserted = rows::ClaimRows::sorted(&writes.insert_claims);
        let ended = rows::lease_ids(&writes.delete_leases);
        let outcomes = rows::OutcomeRows::sorted(&writes.insert_outcomes);
        // Flight 2: the net writes and COMMIT. Any failing statement aborts the transaction,
        // which turns the pipelined COMMIT into a rollback; a unique violation (a key inserted
        // meanwhile) or a row-count mismatch retries the whole group, decided afresh.
        tokio::try_join!(
            biased;
            async {
                if new_leases.is_empty() {
                    return Ok(0);
                }
                client.execute(&insert_leases, &new_leases.params()).await
            },
            async {
                if deleted.is_empty() {
                    return Ok(0);
                }
                client.execute(&delete_claims, &[&deleted.types, &deleted.values]).await
            },
            async {
                if updated.is_empty() {
                    return Ok(0);
                }
                client.execute(&update_claims, &updated.params()).await
            },
            async {
                if inserted.is_empty() {
                    return Ok(0);
                }
                client.execute(&insert_claims, &inserted.params()).await
            },
            async {
                if ended.is_empty() {
                    return Ok(0);
                }
                client.execute(&delete_leases, &[&ended]).await
            },
            async {
                if outcomes.is_empty() {
                    return Ok(0);
                }
                client.execute(&insert_outcomes, &outcomes.params()).await
            },
            client.batch_execute(sql::COMMIT),
        )?;
        session.round_trip();
        session.committed();
        Ok(results)
    }

    /// CommitUpdate and RollbackUpdate: the same transaction, decided by `decide` from the
    /// locked lease row and the store's clock of this transaction (`now()`, the clock every
    /// write of the store uses; a conditional rollback compares it with `last_renewed_at`).
    async fn end_attempt(
        &self,
        lease_id: LeaseId,
        decide: impl Fn(Option<&LeaseRecord>, Timestamp) -> Result<EndPlan, ClaimsError>,
    ) -> Result<(), Failure> {
        let mut session = self.shared.session().await?;
        let [lock, server_time, select_lease, select_outcome, lock_claims, delete_claims, release_claims, replace_claims, delete_lease, insert_outcome] =
            session
                .prepare([
                    sql::LOCK_ADVISORY,
                    sql::SERVER_TIME,
                    sql::SELECT_LEASE_FOR_UPDATE,
                    sql::SELECT_OUTCOME_FOR_UPDATE,
                    sql::LOCK_CLAIMS_OF_LEASE,
                    sql::DELETE_CLAIMS_OF_LEASE,
                    sql::RELEASE_CLAIMS_OF_LEASE,
                    sql::REPLACE_CLAIMS_OF_LEASE,
                    sql::DELETE_LEASE,
                    sql::INSERT_OUTCOME,
                ])
                .await?;
        let id = lease_id.as_uuid();
        let locks = AdvisoryLocks::lease(lease_id);
        let begin = session.begin_lease_transaction();
        let client = session.client()?;
        let (_, _, time_row, lease_row, outcome_row, _) = tokio::try_join!(
            biased;
            client.batch_execute(begin),
            async { client.execute(&lock, &locks.params()).await },
            async { client.query_one(&server_time, &[]).await },
            async { client.query_opt(&select_lease, &[id]).await },
            async { client.query_opt(&select_outcome, &[id]).await },
            async { client.execute(&lock_claims, &[id]).await },
        )?;
        session.round_trip();
        let known = rows::lease_record(lease_row, outcome_row)?;
        let now = rows::timestamp(time_row.try_get(0).map_err(internal)?);
        let writes = match decide(known.as_ref(), now)? {
            EndPlan::AlreadyDone => return Ok(()),
            EndPlan::Apply(writes) => writes,
        };
        let delete = KeyArrays::sorted(&writes.delete);
        let release = KeyArrays::sorted(&writes.release);
        let replace = RecordArrays::sorted(&writes.replace);
        let owner = writes.cell_id.as_str();
        let outcome = small(writes.outcome.number());
        tokio::try_join!(
            biased;
            async {
                if delete.is_empty() {
                    return Ok(0);
                }
                client.execute(&delete_claims, &[&delete.types, &delete.values, id]).await
            },
            async {
                if release.is_empty() {
                    return Ok(0);
                }
                client.execute(&release_claims, &[&release.types, &release.values, id]).await
            },
            async {
                if replace.is_empty() {
                    return Ok(0);
                }
                let r = &replace;
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 10] = [
                    &r.types, &r.values, &r.owner_types, &r.owner_values, &r.table_names,
                    &r.record_ids, id, &r.displays, &r.owner_type_names, &r.source_tables,
                ];
                client.execute(&replace_claims, &params).await
            },
            async { client.execute(&delete_lease, &[id]).await },
            async { client.execute(&insert_outcome, &[id, &owner, &outcome]).await },
            client.batch_execute(sql::COMMIT),
        )?;
        session.round_trip();
        session.committed();
        Ok(())
    }

    async fn renew_attempt(&self, cell_id: &CellId, lease_id: LeaseId) -> Result<Lease, Failure> {
        let mut session = self.shared.session().await?;
        let [lock, select_lease, select_outcome, renew] = session
            .prepare([
                sql::LOCK_ADVISORY,
                sql::SELECT_LEASE_FOR_UPDATE,
                sql::SELECT_OUTCOME_FOR_UPDATE,
                sql::RENEW_LEASE,
            ])
            .await?;
        let id = lease_id.as_uuid();
        let locks = AdvisoryLocks::lease(lease_id);
        let begin = session.begin_lease_transaction();
        let client = session.client()?;
        let (_, _, lease_row, outcome_row) = tokio::try_join!(
            biased;
            client.batch_execute(begin),
            async { client.execute(&lock, &locks.params()).await },
            async { client.query_opt(&select_lease, &[id]).await },
            async { client.query_opt(&select_outcome, &[id]).await },
        )?;
        session.round_trip();
        let known = rows::lease_record(lease_row, outcome_row)?;
        let mut lease = domain::decide_renew(cell_id, lease_id, known.as_ref())?.clone();
        let (renewed, _) = tokio::try_join!(
            biased;
            async { client.query_one(&renew, &[id]).await },
            client.batch_execute(sql::COMMIT),
        )?;
        session.round_trip();
        session.committed();
        lease.last_renewed_at = rows::timestamp(renewed.try_get(0).map_err(internal)?);
        Ok(lease)
    }

    async fn collect_attempt(&self, retention_micros: i64) -> Result<u64, Failure> {
        let session = self.shared.session().await?;
        let [collect] = session.prepare([sql::COLLECT_OUTCOMES]).await?;
        let client = session.client()?;
        let mut total = 0;
        loop {
            let deleted = client
                .execute(&collect, &[&retention_micros, &COLLECT_BATCH])
                .await?;
            session.round_trip();
            total += deleted;
            if deleted < COLLECT_BATCH as u64 {
                return Ok(total);
            }
        }
    }
}

pub(crate) fn internal(error: tokio_postgres::Error) -> Failure {
    Failure::Final(ClaimsError::internal(format!(
        "unexpected PostgreSQL answer: {error}"
    )))
}

#[async_trait]
impl ClaimStore for PostgresClaimStore {
    async fn begin_update(&self, request: BeginUpdate) -> Result<Lease, ClaimsError> {
        // Malformed batches never reach the database. The batch-size policy is the front end's.
        domain::check_batch(&request, usize::MAX)?;
        // Fixed before the first attempt: a retry after an unacknowledged COMMIT finds its own
        // lease and replays it instead of leasing twice.
        let lease_id = request.lease_id.unwrap_or_else(LeaseId::generate);
        self.shared
            .run("BeginUpdate", || self.begin_attempt(&request, lease_id))
            .await
    }

    async fn commit_update(&self, cell_id: &CellId, lease_id: LeaseId) -> Result<(), ClaimsError> {
        self.shared
            .run("CommitUpdate", || {
                self.end_attempt(lease_id, |known, _| {
                    domain::decide_commit(cell_id, lease_id, known)
                })
            })
            .await
    }

    async fn rollback_update(
        &self,
        cell_id: &CellId,
        lease_id: LeaseId,
        unrenewed_for: Option<Duration>,
    ) -> Result<(), ClaimsError> {
        self.shared
            .run("RollbackUpdate", || {
                self.end_attempt(lease_id, |known, now| {
                    domain::decide_rollback(cell_id, lease_id, known, unrenewed_for, now)
                })
            })
            .await
    }

    async fn renew_lease(&self, cell_id: &CellId, lease_id: LeaseId) -> Result<Lease, ClaimsError> {
        self.shared
            .run("RenewLease", || self.renew_attempt(cell_id, lease_id))
            .await
    }

    async fn list_outstanding_leases(
        &self,
        query: &LeasesQuery,
    ) -> Result<LeasesPage, ClaimsError> {
        self.shared
            .run("ListOutstandingLeases", || self.list_leases_attempt(query))
            .await
    }

    async fn list_claims(&self, query: &ClaimsQuery) -> Result<ClaimsPage, ClaimsError> {
        self.shared
            .run("ListClaims", || self.list_claims_attempt(query))
            .await
    }

    async fn lookup_claim(&self, key: &ClaimKey) -> Result<Claim, ClaimsError> {
        self.shared
            .run("LookupClaim", || self.lookup_attempt(key))
            .await
    }

    async fn count_claims(
        &self,
    ) -> Result<Vec<(topology_claims::domain::NamespaceId, u64)>, ClaimsError> {
        self.shared
            .run("CountClaims", || namespaces::count_attempt(&self.shared))
            .await
    }

    async fn namespaces(&self) -> Result<Vec<StoredNamespace>, ClaimsError> {
        let all = self
            .shared
            .run("ListNamespaces", || namespaces::list_attempt(&self.shared))
            .await?;
        self.namespaces.replace(all.clone());
        Ok(all.iter().cloned().collect())
    }

    async fn create_namespace(
        &self,
        spec: NamespaceSpec,
        max: usize,
    ) -> Result<StoredNamespace, ClaimsError> {
        let cache = &self.namespaces;
        self.shared
            .run("CreateNamespace", || async {
                let mut session = self.shared.session().await?;
                namespaces::create_attempt(&mut session, cache, &spec, max).await
            })
            .await
    }

    async fn delete_namespace(&self, id: &str) -> Result<(), ClaimsError> {
        let cache = &self.namespaces;
        self.shared
            .run("DeleteNamespace", || async {
                let mut session = self.shared.session().await?;
                namespaces::delete_attempt(&mut session, cache, id).await
            })
            .await
    }

    async fn update_namespace(
        &self,
        id: &str,
        update: NamespaceUpdate,
    ) -> Result<StoredNamespace, ClaimsError> {
        self.shared
            .run("UpdateNamespace", || async {
                let mut session = self.shared.session().await?;
                namespaces::update_attempt(&mut session, &self.namespaces, id, &update).await
            })
            .await
    }

    async fn collect_outcomes(&self, retention: Duration) -> Result<u64, ClaimsError> {
        let micros = i64::try_from(retention.min(MAX_RETENTION).as_micros()).unwrap_or(i64::MAX);
        self.shared
            .run("collect_outcomes", || self.collect_attempt(micros))
            .await
    }

    async fn read_events(&self, query: &EventsQuery) -> Result<EventsPage, ClaimsError> {
        self.shared
            .run("WatchClaims", || watch::read_attempt(&self.shared, query))
            .await
    }

    async fn compact_events(&self, retention: Duration, max: u64) -> Result<u64, ClaimsError> {
        self.shared
            .run("compact_events", || {
                watch::compact_attempt(&self.shared, retention, max)
            })
            .await
    }

    async fn lease_summary(&self) -> Result<LeaseSummary, ClaimsError> {
        self.shared
            .run("lease_summary", || self.lease_summary_attempt())
            .await
    }

    async fn decommission_step(
        &self,
        cell_id: &CellId,
        batch: usize,
        dry_run: bool,
    ) -> Result<DecommissionStep, ClaimsError> {
        self.shared
            .run("decommission_step", || {
                self.decommission_attempt(cell_id, batch, dry_run)
            })
            .await
    }

    async fn acquire_verification_slot(
        &self,
        holder: &SlotHolder,
        limit: SlotLimit,
    ) -> Result<SlotGrant, ClaimsError> {
        self.shared
            .run("AcquireVerificationSlot", || {
                self.acquire_slot_attempt(holder, limit)
            })
            .await
    }

    async fn release_verification_slot(&self, holder: &SlotHolder) -> Result<bool, ClaimsError> {
        self.shared
            .run("ReleaseVerificationSlot", || {
                self.release_slot_attempt(holder)
            })
            .await
    }

    async fn restore_state(&self) -> Result<Option<RestoreEpoch>, ClaimsError> {
        self.shared
            .run("restore_state", || self.restore_state_attempt())
            .await
    }

    async fn mark_restored(&self, request: &MarkRestored) -> Result<RestoreEpoch, ClaimsError> {
        self.shared
            .run("MarkRestored", || self.mark_restored_attempt(request))
            .await
    }

    async fn report_verification_pass(
        &self,
        cell_id: &CellId,
        epoch: u64,
    ) -> Result<RestoreEpoch, ClaimsError> {
        self.shared
            .run("ReportVerificationPass", || {
                self.report_attempt(cell_id, epoch)
            })
            .await
    }

    async fn lift_quarantine(&self, epoch: u64, reason: &str) -> Result<RestoreEpoch, ClaimsError> {
        self.shared
            .run("LiftQuarantine", || self.lift_attempt(epoch, reason))
            .await
    }

    async fn run_group(&self, ops: &[GroupOp]) -> Result<GroupResults, ClaimsError> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        let operation = format!("a group of {} operations", ops.len());
        self.shared
            .run(&operation, || self.group_attempt(ops))
            .await
    }

    /// One group per pooled connection.
    fn group_parallelism(&self) -> usize {
        self.shared.pool.status().max_size
    }

    fn retries(&self) -> u64 {
        let stats = self.shared.stats();
        stats.contention_retries + stats.reconnects
    }

    fn pool_status(&self) -> Option<PoolStatus> {
        let status = self.shared.pool.status();
        Some(PoolStatus {
            max: status.max_size,
            in_use: status.size.saturating_sub(status.available),
            idle: status.available,
            waiting: status.waiting,
        })
    }
}

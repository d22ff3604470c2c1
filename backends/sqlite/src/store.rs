//! [`SqliteClaimStore`]: the service's [`ClaimStore`] on one SQLite file.
//!
//! Every method is one SQLite transaction on the store's single connection: write methods read
//! the rows the request touches inside `BEGIN IMMEDIATE`, ask `topology_claims::domain` for the
//! decision, and write exactly that (the statement-for-statement twin of
//! `topology_claims::domain::Tables`). This module must not decide any protocol question itself;
//! its conditional `WHERE` clauses only double-check what the domain already decided.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::Connection;
use rusqlite::OptionalExtension;
use topology_claims::codec::encode_request;
use topology_claims::domain::{
    self, BeginPlan, CellLeases, DecommissionPlan, DecommissionState, DecommissionStep, EndPlan,
    EndWrites, EventsPage, EventsQuery, GroupOp, GroupReads, GroupResults, GroupSnapshot,
    GroupWrites, LeaseRecord, LeaseSummary, MarkRestored, NamespaceSpec, NamespaceUpdate,
    RestoreEpoch, SlotGrant, SlotHolder, SlotLimit, SlotRow, StoredNamespace,
};
use topology_claims::{
    BeginUpdate, CellId, Claim, ClaimKey, ClaimStore, ClaimsError, ClaimsPage, ClaimsQuery, Clock,
    Lease, LeaseId, LeaseOp, LeasesPage, LeasesQuery, MigrationPolicy, SystemClock, Timestamp,
};

use crate::connection::{open_service_connection, SharedConnection, SqliteOptions};
use crate::error::{retry, StoreError};
use crate::lock::StoreLock;
use crate::migrations;
use crate::namespaces::{
    adopt_builtins, create_namespace, delete_namespace, read_named, read_namespaces,
    update_namespace,
};
use crate::restore;
use crate::rows::{self, lease_id_text, select_claims, sql_limit, LeaseRow, LEASE_COLUMNS};
use crate::watch::{read_transaction, write_transaction};

/// The service's store on a SQLite file (see the crate docs for the schema and durability).
///
/// Cheap to clone: clones share the one connection.
#[derive(Clone)]
pub struct SqliteClaimStore {
    conn: SharedConnection,
    clock: Arc<dyn Clock>,
    /// Transactions re-run by [`retry_counted`], shared by the clones.
    retries: Arc<AtomicU64>,
    /// Held while the store is open: `restore` refuses a store in use (`lock`).
    _in_use: Arc<StoreLock>,
}

impl fmt::Debug for SqliteClaimStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteClaimStore")
            .field("path", &self.conn.path())
            .finish_non_exhaustive()
    }
}

impl SqliteClaimStore {
    /// Opens (creating if needed) the database at `path`, with pending schema migrations
    /// applied or refused as `policy` says. Timestamps come from the system clock; commits are
    /// fsynced ([`SqliteOptions::default`]).
    pub async fn open(
        path: impl AsRef<Path>,
        policy: MigrationPolicy,
    ) -> Result<Self, ClaimsError> {
        Self::open_with_options(path, SqliteOptions::default(), policy).await
    }

    /// [`open`](Self::open) with `options` (e.g. [`Synchronous::Normal`](crate::Synchronous)).
    pub async fn open_with_options(
        path: impl AsRef<Path>,
        options: SqliteOptions,
        policy: MigrationPolicy,
    ) -> Result<Self, ClaimsError> {
        Self::opened(path.as_ref(), options, policy, Arc::new(SystemClock)).await
    }

    /// [`open`](Self::open) with the clock that stamps `created_at`, `updated_at`,
    /// `last_renewed_at`, `decided_at` and `server_time` (tests pass a controllable one).
    pub async fn open_with_clock(
        path: impl AsRef<Path>,
        policy: MigrationPolicy,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, ClaimsError> {
        Self::opened(path.as_ref(), SqliteOptions::default(), policy, clock).await
    }

    async fn opened(
        path: &Path,
        options: SqliteOptions,
        policy: MigrationPolicy,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, ClaimsError> {
        let path = path.to_path_buf();
        // A path that cannot be a store is named as such, before its lock file is looked for.
        crate::connection::check_path(&path)?;
        let in_use =
            StoreLock::shared(&path).map_err(|message| ClaimsError::Unavailable { message })?;
        let (conn, _applied) =
            open_migrated(path.clone(), options, policy, Arc::clone(&clock)).await?;
        Ok(Self {
            conn: SharedConnection::new(conn, path),
            clock,
            retries: Arc::new(AtomicU64::new(0)),
            _in_use: Arc::new(in_use),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        self.conn.path()
    }

    /// Runs one write transaction (with the bounded retry) on a blocking thread.
    pub(crate) async fn write<T, F>(&self, op: F) -> Result<T, ClaimsError>
    where
        T: Send + 'static,
        F: FnMut(&Connection, Timestamp) -> Result<T, StoreError> + Send + 'static,
    {
        let clock = Arc::clone(&self.clock);
        let retries = Arc::clone(&self.retries);
        self.conn
            .run(move |conn| write_transaction(conn, &*clock, &retries, op))
            .await
    }

    /// Runs one read transaction (with the bounded retry) on a blocking thread.
    pub(crate) async fn read<T, F>(&self, op: F) -> Result<T, ClaimsError>
    where
        T: Send + 'static,
        F: FnMut(&Connection, Timestamp) -> Result<T, StoreError> + Send + 'static,
    {
        let clock = Arc::clone(&self.clock);
        let retries = Arc::clone(&self.retries);
        self.conn
            .run(move |conn| read_transaction(conn, &*clock, &retries, op))
            .await
    }
}

/// Opens the file and brings its schema up to date (or refuses); returns the names applied.
pub(crate) async fn open_migrated(
    path: PathBuf,
    options: SqliteOptions,
    policy: MigrationPolicy,
    clock: Arc<dyn Clock>,
) -> Result<(Connection, Vec<String>), ClaimsError> {
    tokio::task::spawn_blocking(move || {
        let mut conn = open_service_connection(&path, options)?;
        // More statements than rusqlite's default cache of 16 are in regular use.
        conn.set_prepared_statement_cache_capacity(64);
        let applied =
            retry(|| migrations::run(&mut conn, policy, &*clock)).map_err(|e| match e {
                ClaimsError::Internal { message } => ClaimsError::Internal {
                    message: format!("migrating {}: {message}", path.display()),
                },
                other => other,
            })?;
        if policy == MigrationPolicy::Apply {
            // At open, before any request: adopting precis-username is not a request's retry.
            let decided = write_transaction(&mut conn, &*clock, &AtomicU64::new(0), |tx, _| {
                adopt_builtins(tx)
            })?;
            for (namespace, adoption) in decided {
                match adoption.describe(&namespace) {
                    (true, line) => tracing::warn!("SQLite: {line}"),
                    (false, line) => tracing::info!("SQLite: {line}"),
                }
            }
        }
        Ok((conn, applied))
    })
    .await
    .map_err(|e| ClaimsError::internal(format!("SQLite open thread failed: {e}")))?
}

fn begin(
    tx: &Connection,
    request: &BeginUpdate,
    fresh_id: LeaseId,
    now: Timestamp,
) -> Result<Lease, StoreError> {
    // The keys, under the rules as this transaction reads them (decision 108).
    let named = request.operations().map(|(_, r)| r.key.namespace.clone());
    let namespaces = read_named(tx, named)?;
    let request = &domain::prepare_begin(request.clone(), &namespaces)?;
    // BEGIN IMMEDIATE serializes this with every decommission step, so the mark read here
    // cannot appear before the claims below are written.
    domain::check_not_decommissioned(&request.cell_id, is_decommissioned(tx, &request.cell_id)?)?;
    let lease_id = request.lease_id.unwrap_or(fresh_id);
    let known = rows::lease_record(tx, lease_id)?;
    let mut current = BTreeMap::new();
    for (_, record) in request.operations() {
        if let Some(claim) = rows::claim_by_key(tx, &record.key)? {
            current.insert(record.key.clone(), claim);
        }
    }
    let writes =
        match domain::decide_begin(request, lease_id, known.as_ref(), &current, &namespaces)? {
            BeginPlan::Replay(lease) => return Ok(lease),
            BeginPlan::Apply(writes) => writes,
        };
    let id = lease_id_text(lease_id);
    let now_micros = now.as_unix_micros();
    // The lease row first: the claims' foreign key points at it.
    tx.prepare_cached(&format!(
        "INSERT INTO leases_outstanding ({LEASE_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?4)"
    ))?
    .execute((
        &id,
        request.cell_id.as_str(),
        encode_request(request),
        now_micros,
    ))?;
    let mut insert = tx.prepare_cached(
        "INSERT INTO claims (claim_type, claim_value, cell_id, owner_type, owner_value, \
         table_name, table_record_id, lease_id, lease_op, created_at, updated_at, display_value, \
         namespace, owner_type_name, source_table) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10, ?11, ?12, ?13, ?14)",
    )?;
    for record in &writes.inserts {
        // A primary-key violation here means another writer got in between: retried.
        insert.execute((
            record.key.namespace_number(),
            &record.key.value,
            request.cell_id.as_str(),
            record.owner_type.store_number(),
            &record.owner_value,
            record.table_name.store_number(),
            record.table_record_id,
            &id,
            LeaseOp::Create.number(),
            now_micros,
            &record.display,
            record.key.namespace.row_column(),
            record.owner_type.stored_name(),
            record.table_name.stored_name(),
        ))?;
    }
    let mut mark = tx.prepare_cached(
        "UPDATE claims SET lease_id = ?1, lease_op = ?2, updated_at = ?3 \
         WHERE claim_type = ?4 AND claim_value = ?5 AND lease_id IS NULL AND cell_id = ?6",
    )?;
    let marks = (writes.marks.iter().map(|k| (k, LeaseOp::Destroy)))
        .chain(writes.update_marks.iter().map(|k| (k, LeaseOp::Update)));
    for (key, op) in marks {
        let marked = mark.execute((
            &id,
            op.number(),
            now_micros,
            key.namespace_number(),
            &key.value,
            request.cell_id.as_str(),
        ))?;
        if marked != 1 {
            return Err(StoreError::Conflict(format!(
                "claim {key} was no longer an unleased claim of cell {}",
                request.cell_id
            )));
        }
    }
    Ok(Lease {
        lease_id,
        cell_id: request.cell_id.clone(),
        created_at: now,
        last_renewed_at: now,
        request: request.clone(),
    })
}

/// Writes what commit or rollback decided. Claim writes are conditional on the claim still
/// carrying the lease, exactly as `Tables::apply_end` skips claims that do not.
fn end(tx: &Connection, plan: EndPlan, now: Timestamp) -> Result<(), StoreError> {
    let EndPlan::Apply(EndWrites {
        lease_id,
        cell_id,
        outcome,
        delete,
        release,
        replace,
    }) = plan
    else {
        return Ok(());
    };
    let id = lease_id_text(lease_id);
    let now_micros = now.as_unix_micros();
    let mut delete_claim = tx.prepare_cached(
        "DELETE FROM claims WHERE claim_type = ?1 AND claim_value = ?2 AND lease_id = ?3",
    )?;
    for key in &delete {
        delete_claim.execute((key.namespace_number(), &key.value, &id))?;
    }
    let mut release_claim = tx.prepare_cached(
        "UPDATE claims SET lease_id = NULL, lease_op = 0, updated_at = ?1 \
         WHERE claim_type = ?2 AND claim_value = ?3 AND lease_id = ?4",
    )?;
    for key in &release {
        release_claim.execute((now_micros, key.namespace_number(), &key.value, &id))?;
    }
    let mut replace_claim = tx.prepare_cached(
        "UPDATE claims SET owner_type = ?1, owner_value = ?2, table_name = ?3, \
         table_record_id = ?4, lease_id = NULL, lease_op = 0, updated_at = ?5, \
         display_value = ?9, owner_type_name = ?10, source_table = ?11 \
         WHERE claim_type = ?6 AND claim_value = ?7 AND lease_id = ?8",
    )?;
    for record in &replace {
        replace_claim.execute((
            record.owner_type.store_number(),
            &record.owner_value,
            record.table_name.store_number(),
            record.table_record_id,
            now_micros,
            record.key.namespace_number(),
            &record.key.value,
            &id,
            &record.display,
            record.owner_type.stored_name(),
            record.table_name.stored_name(),
        ))?;
    }
    // After the claims: the foreign key forbids removing a lease that claims still carry.
    tx.prepare_cached("DELETE FROM leases_outstanding WHERE lease_id = ?1")?
        .execute([&id])?;
    tx.prepare_cached(
        "INSERT INTO lease_outcomes (lease_id, cell_id, outcome, decided_at) \
         VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute((&id, cell_id.as_str(), outcome.number(), now_micros))?;
    Ok(())
}

/// Group commit: one write transaction for the whole group. Reads every row of
/// [`GroupReads::of`], lets `domain::decide_group` decide each operation in order, and writes
/// the net result. The order of the writes keeps the claims' foreign key to
/// `leases_outstanding` valid at every statement.
fn group(tx: &Connection, ops: &[GroupOp], now: Timestamp) -> Result<GroupResults, StoreError> {
    let namespaces = read_named(tx, domain::namespaces_named(ops))?;
    let reads = GroupReads::of(ops, &namespaces);
    let mut snapshot = GroupSnapshot {
        namespaces,
        ..GroupSnapshot::default()
    };
    let mut claims = BTreeMap::new();
    for key in &reads.keys {
        if let Some(claim) = rows::claim_by_key(tx, key)? {
            claims.insert(key.clone(), claim);
        }
    }
    for &lease_id in &reads.lease_ids {
        match rows::lease_record(tx, lease_id)? {
            Some(LeaseRecord::Outstanding(lease)) => {
                for claim in select_claims(tx, "WHERE lease_id = ?1", &[&lease_id_text(lease_id)])?
                {
                    claims.insert(claim.record.key.clone(), claim);
                }
                snapshot.leases.push(lease);
            }
            Some(LeaseRecord::Ended(outcome)) => snapshot.outcomes.push(outcome),
            None => {}
        }
    }
    snapshot.claims = claims.into_values().collect();
    for cell_id in &reads.cells {
        if is_decommissioned(tx, cell_id)? {
            // The mark's time is not used by any decision.
            snapshot.decommissioned.push((cell_id.clone(), now));
        }
    }
    let decision = domain::decide_group(snapshot, ops, now);
    write_group(tx, &decision.writes)?;
    Ok(decision.results)
}

fn write_group(tx: &Connection, writes: &GroupWrites) -> Result<(), StoreError> {
    let mut insert_lease = tx.prepare_cached(&format!(
        "INSERT INTO leases_outstanding ({LEASE_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5)"
    ))?;
    for lease in &writes.insert_leases {
        insert_lease.execute((
            lease_id_text(lease.lease_id),
            lease.cell_id.as_str(),
            encode_request(&lease.request),
            lease.created_at.as_unix_micros(),
            lease.last_renewed_at.as_unix_micros(),
        ))?;
    }
    let mut delete_claim =
        tx.prepare_cached("DELETE FROM claims WHERE claim_type = ?1 AND claim_value = ?2")?;
    for key in &writes.delete_claims {
        delete_claim.execute((key.namespace_number(), &key.value))?;
    }
    let mut update_claim = tx.prepare_cached(
        "UPDATE claims SET cell_id = ?3, owner_type = ?4, owner_value = ?5, table_name = ?6, \
         table_record_id = ?7, lease_id = ?8, lease_op = ?9, created_at = ?10, updated_at = ?11, \
         display_value = ?12, namespace = ?13, owner_type_name = ?14, source_table = ?15 \
         WHERE claim_type = ?1 AND claim_value = ?2",
    )?;
    let mut insert_claim = tx.prepare_cached(
        "INSERT INTO claims (claim_type, claim_value, cell_id, owner_type, owner_value, \
         table_name, table_record_id, lease_id, lease_op, created_at, updated_at, display_value, \
         namespace, owner_type_name, source_table) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
    )?;
    let updates = writes.update_claims.iter().map(|c| (c, true));
    for (claim, existing) in updates.chain(writes.insert_claims.iter().map(|c| (c, false))) {
        let record = &claim.record;
        let params = (
            record.key.namespace_number(),
            &record.key.value,
            claim.cell_id.as_str(),
            record.owner_type.store_number(),
            &record.owner_value,
            record.table_name.store_number(),
            record.table_record_id,
            claim.lease.map(|l| lease_id_text(l.lease_id)),
            claim.lease.map_or(0, |l| l.op.number()),
            claim.created_at.as_unix_micros(),
            claim.updated_at.as_unix_micros(),
            &record.display,
            record.key.namespace.row_column(),
            record.owner_type.stored_name(),
            record.table_name.stored_name(),
        );
        if existing {
            if update_claim.execute(params)? != 1 {
                return Err(StoreError::Conflict(format!(
                    "claim {} vanished inside its group's transaction",
                    record.key
                )));
            }
        } else {
            // A primary-key violation here means another writer got in between: retried.
            insert_claim.execute(params)?;
        }
    }
    // After the claims: the foreign key forbids removing a lease that claims still carry.
    let mut delete_lease =
        tx.prepare_cached("DELETE FROM leases_outstanding WHERE lease_id = ?1")?;
    for lease_id in &writes.delete_leases {
        delete_lease.execute([lease_id_text(*lease_id)])?;
    }
    let mut insert_outcome = tx.prepare_cached(
        "INSERT INTO lease_outcomes (lease_id, cell_id, outcome, decided_at) \
         VALUES (?1, ?2, ?3, ?4)",
    )?;
    for outcome in &writes.insert_outcomes {
        insert_outcome.execute((
            lease_id_text(outcome.lease_id),
            outcome.cell_id.as_str(),
            outcome.outcome.number(),
            outcome.decided_at.as_unix_micros(),
        ))?;
    }
    Ok(())
}

fn renew(
    tx: &Connection,
    cell_id: &CellId,
    lease_id: LeaseId,
    now: Timestamp,
) -> Result<Lease, StoreError> {
    let known = rows::lease_record(tx, lease_id)?;
    let mut lease = domain::decide_renew(cell_id, lease_id, known.as_ref())?.clone();
    let renewed = tx
        .prepare_cached("UPDATE leases_outstanding SET last_renewed_at = ?1 WHERE lease_id = ?2")?
        .execute((now.as_unix_micros(), lease_id_text(lease_id)))?;
    if renewed != 1 {
        return Err(
            ClaimsError::internal(format!("lease {lease_id} vanished during renew")).into(),
        );
    }
    lease.last_renewed_at = now;
    Ok(lease)
}

/// Whether `cell_id` is recorded in `decommissioned_cells`.
fn is_decommissioned(tx: &Connection, cell_id: &CellId) -> Result<bool, StoreError> {
    let found = tx
        .prepare_cached("SELECT 1 FROM decommissioned_cells WHERE cell_id = ?1")?
        .query_row([cell_id.as_str()], |_| Ok(()))
        .optional()?;
    Ok(found.is_some())
}

/// Every cell's outstanding-lease count and oldest `created_at`: one aggregate over the
/// `leases_outstanding_by_cell` index plus the table.
fn lease_summary(conn: &Connection, now: Timestamp) -> Result<LeaseSummary, StoreError> {
    let mut statement = conn.prepare_cached(
        "SELECT cell_id, count(*), min(created_at) FROM leases_outstanding GROUP BY cell_id",
    )?;
    let rows = statement
        .query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, i64>(2)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let cells = rows
        .into_iter()
        .map(|(cell, outstanding, oldest)| {
            Ok(CellLeases {
                cell_id: rows::cell_id("leases_outstanding", &cell)?,
                outstanding: outstanding as u64,
                oldest_created_at: Timestamp::from_unix_micros(oldest),
            })
        })
        .collect::<Result<Vec<_>, ClaimsError>>()?;
    Ok(LeaseSummary::from_cells(now, cells))
}

/// One decommission step (the twin of `Tables::decommission_step`). The claims of the cell are
/// a range of `claims_by_cell_table_record`, deleted in its order. No locking beyond
/// `BEGIN IMMEDIATE`: SQLite runs one writer at a time, so no BeginUpdate of the cell can
/// interleave between the lease count and the mark.
fn decommission_step(
    tx: &Connection,
    cell_id: &CellId,
    batch: usize,
    dry_run: bool,
    now: Timestamp,
) -> Result<DecommissionStep, StoreError> {
    let outstanding: i64 = tx
        .prepare_cached("SELECT count(*) FROM leases_outstanding WHERE cell_id = ?1")?
        .query_row([cell_id.as_str()], |row| row.get(0))?;
    let state = DecommissionState {
        outstanding_leases: outstanding as u64,
        decommissioned: is_decommissioned(tx, cell_id)?,
    };
    let plan = domain::decide_decommission(cell_id, state, dry_run, batch)?;
    let claims = match plan {
        DecommissionPlan::Count => {
            let count: i64 = tx
                .prepare_cached("SELECT count(*) FROM claims WHERE cell_id = ?1")?
                .query_row([cell_id.as_str()], |row| row.get(0))?;
            count as u64
        }
        DecommissionPlan::Delete { mark, limit } => {
            if mark {
                tx.prepare_cached(
                    "INSERT INTO decommissioned_cells (cell_id, decommissioned_at) VALUES (?1, ?2)",
                )?
                .execute((cell_id.as_str(), now.as_unix_micros()))?;
            }
            let deleted = tx
                .prepare_cached(
                    "DELETE FROM claims WHERE (claim_type, claim_value) IN ( \
                     SELECT claim_type, claim_value FROM claims \
                     INDEXED BY claims_by_cell_table_record WHERE cell_id = ?1 \
                     ORDER BY table_name, table_record_id, claim_type, claim_value LIMIT ?2)",
                )?
                .execute((cell_id.as_str(), sql_limit(limit)))?;
            deleted as u64
        }
    };
    Ok(DecommissionStep::after(cell_id, state, plan, claims))
}

/// A verification slot acquire (the twin of `Tables::acquire_verification_slot`): every row is
/// read (the table holds at most the limit's live rows and the expired ones the last acquire
/// did not yet see), and `BEGIN IMMEDIATE` serializes acquires, so the limit holds.
fn acquire_slot(
    tx: &Connection,
    holder: &SlotHolder,
    limit: SlotLimit,
    now: Timestamp,
) -> Result<SlotGrant, StoreError> {
    let rows = tx
        .prepare_cached("SELECT cell_id, holder, expires_at FROM verification_slots")?
        .query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, i64>(2)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let rows = rows
        .into_iter()
        .map(|(cell, name, expires_at)| {
            let cell_id = rows::cell_id("verification_slots", &cell)?;
            Ok(SlotRow {
                holder: SlotHolder::new(cell_id, &name).map_err(|e| {
                    ClaimsError::internal(format!("verification_slots holds {name:?}: {e}"))
                })?,
                expires_at: Timestamp::from_unix_micros(expires_at),
            })
        })
        .collect::<Result<Vec<_>, ClaimsError>>()?;
    let plan = domain::decide_acquire(&rows, holder, limit, now)?;
    let mut delete =
        tx.prepare_cached("DELETE FROM verification_slots WHERE cell_id = ?1 AND holder = ?2")?;
    for expired in &plan.expired {
        delete.execute((expired.cell_id.as_str(), expired.holder.as_str()))?;
    }
    tx.prepare_cached(
        "INSERT INTO verification_slots (cell_id, holder, expires_at) VALUES (?1, ?2, ?3) \
         ON CONFLICT (cell_id, holder) DO UPDATE SET expires_at = excluded.expires_at",
    )?
    .execute((
        holder.cell_id.as_str(),
        holder.holder.as_str(),
        plan.grant.expires_at.as_unix_micros(),
    ))?;
    Ok(plan.grant)
}

/// Releases `holder`'s slot (the twin of `Tables::release_verification_slot`).
fn release_slot(tx: &Connection, holder: &SlotHolder) -> Result<bool, StoreError> {
    let expires_at: Option<i64> = tx
        .prepare_cached(
            "SELECT expires_at FROM verification_slots WHERE cell_id = ?1 AND holder = ?2",
        )?
        .query_row((holder.cell_id.as_str(), holder.holder.as_str()), |row| {
            row.get(0)
        })
        .optional()?;
    let row = expires_at.map(|at| SlotRow {
        holder: holder.clone(),
        expires_at: Timestamp::from_unix_micros(at),
    });
    let release = domain::decide_release(row.as_ref(), holder);
    if release {
        tx.prepare_cached("DELETE FROM verification_slots WHERE cell_id = ?1 AND holder = ?2")?
            .execute((holder.cell_id.as_str(), holder.holder.as_str()))?;
    }
    Ok(release)
}

fn outstanding_leases(
    conn: &Connection,
    query: &LeasesQuery,
    now: Timestamp,
) -> Result<LeasesPage, StoreError> {
    // Every stored id sorts after the empty string, so "no cursor" needs no second statement.
    let after = query.after.map(lease_id_text).unwrap_or_default();
    let mut statement = conn.prepare_cached(&format!(
        "SELECT {LEASE_COLUMNS} FROM leases_outstanding \
         WHERE cell_id = ?1 AND lease_id > ?2 ORDER BY lease_id LIMIT ?3"
    ))?;
    let rows = statement
        .query_map(
            (
                query.cell_id.as_str(),
                &after,
                sql_limit(query.fetch_limit()),
            ),
            LeaseRow::read,
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let leases = rows
        .into_iter()
        .map(LeaseRow::into_lease)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(domain::leases_page(query, leases, now))
}

#[async_trait]
impl ClaimStore for SqliteClaimStore {
    async fn begin_update(&self, request: BeginUpdate) -> Result<Lease, ClaimsError> {
        // Before any I/O: a malformed batch never reaches the file. The batch-size policy is the
        // front end's, so the store accepts any size.
        domain::check_batch(&request, usize::MAX)?;
        let fresh_id = LeaseId::generate();
        self.write(move |tx, now| begin(tx, &request, fresh_id, now))
            .await
    }

    async fn commit_update(&self, cell_id: &CellId, lease_id: LeaseId) -> Result<(), ClaimsError> {
        let cell_id = cell_id.clone();
        self.write(move |tx, now| {
            let known = rows::lease_record(tx, lease_id)?;
            end(
                tx,
                domain::decide_commit(&cell_id, lease_id, known.as_ref())?,
                now,
            )
        })
        .await
    }

    async fn rollback_update(
        &self,
        cell_id: &CellId,
        lease_id: LeaseId,
        unrenewed_for: Option<Duration>,
    ) -> Result<(), ClaimsError> {
        let cell_id = cell_id.clone();
        // `now` is read inside the write transaction that reads the lease row: the condition is
        // judged against the row as it is when the rollback is written.
        self.write(move |tx, now| {
            let known = rows::lease_record(tx, lease_id)?;
            end(
                tx,
                domain::decide_rollback(&cell_id, lease_id, known.as_ref(), unrenewed_for, now)?,
                now,
            )
        })
        .await
    }

    async fn renew_lease(&self, cell_id: &CellId, lease_id: LeaseId) -> Result<Lease, ClaimsError> {
        let cell_id = cell_id.clone();
        self.write(move |tx, now| renew(tx, &cell_id, lease_id, now))
            .await
    }

    async fn list_outstanding_leases(
        &self,
        query: &LeasesQuery,
    ) -> Result<LeasesPage, ClaimsError> {
        let query = query.clone();
        self.read(move |conn, now| outstanding_leases(conn, &query, now))
            .await
    }

    async fn list_claims(&self, query: &ClaimsQuery) -> Result<ClaimsPage, ClaimsError> {
        let query = query.clone();
        self.read(move |conn, _| rows::claims_page(conn, &query))
            .await
    }

    async fn lookup_claim(&self, key: &ClaimKey) -> Result<Claim, ClaimsError> {
        let key = key.clone();
        self.read(move |conn, _| {
            let namespaces = read_named(conn, [key.namespace.clone()])?;
            let key = domain::resolve_key(&key, &namespaces, "claim_value")?;
            rows::claim_by_key(conn, &key)?
                .ok_or_else(|| ClaimsError::ClaimNotFound { claim: key }.into())
        })
        .await
    }

    async fn count_claims(
        &self,
    ) -> Result<Vec<(topology_claims::domain::NamespaceId, u64)>, ClaimsError> {
        self.read(|conn, _| crate::namespaces::count_claims(conn))
            .await
    }

    async fn namespaces(&self) -> Result<Vec<StoredNamespace>, ClaimsError> {
        self.read(|conn, _| Ok(read_namespaces(conn)?.iter().cloned().collect()))
            .await
    }

    async fn create_namespace(
        &self,
        spec: NamespaceSpec,
        max: usize,
    ) -> Result<StoredNamespace, ClaimsError> {
        self.write(move |tx, _| create_namespace(tx, spec.clone(), max))
            .await
    }

    async fn delete_namespace(&self, id: &str) -> Result<(), ClaimsError> {
        let id = id.to_owned();
        self.write(move |tx, _| delete_namespace(tx, &id)).await
    }

    async fn update_namespace(
        &self,
        id: &str,
        update: NamespaceUpdate,
    ) -> Result<StoredNamespace, ClaimsError> {
        let id = id.to_owned();
        self.write(move |tx, _| update_namespace(tx, &id, update.clone()))
            .await
    }

    async fn collect_outcomes(&self, retention: Duration) -> Result<u64, ClaimsError> {
        self.write(move |tx, now| {
            // `domain::outcome_expired` as a range over the decided_at index.
            let cutoff = now.saturating_sub(retention).as_unix_micros();
            let deleted = tx
                .prepare_cached("DELETE FROM lease_outcomes WHERE decided_at < ?1")?
                .execute([cutoff])?;
            Ok(deleted as u64)
        })
        .await
    }

    async fn lease_summary(&self) -> Result<LeaseSummary, ClaimsError> {
        self.read(lease_summary).await
    }

    async fn decommission_step(
        &self,
        cell_id: &CellId,
        batch: usize,
        dry_run: bool,
    ) -> Result<DecommissionStep, ClaimsError> {
        let cell_id = cell_id.clone();
        self.write(move |tx, now| decommission_step(tx, &cell_id, batch, dry_run, now))
            .await
    }

    async fn acquire_verification_slot(
        &self,
        holder: &SlotHolder,
        limit: SlotLimit,
    ) -> Result<SlotGrant, ClaimsError> {
        let holder = holder.clone();
        self.write(move |tx, now| acquire_slot(tx, &holder, limit, now))
            .await
    }

    async fn release_verification_slot(&self, holder: &SlotHolder) -> Result<bool, ClaimsError> {
        let holder = holder.clone();
        self.write(move |tx, _| release_slot(tx, &holder)).await
    }

    async fn restore_state(&self) -> Result<Option<RestoreEpoch>, ClaimsError> {
        self.read(|conn, _| restore::latest(conn)).await
    }

    async fn mark_restored(&self, request: &MarkRestored) -> Result<RestoreEpoch, ClaimsError> {
        let request = request.clone();
        self.write(move |tx, now| restore::mark(tx, &request, now))
            .await
    }

    async fn report_verification_pass(
        &self,
        cell_id: &CellId,
        epoch: u64,
    ) -> Result<RestoreEpoch, ClaimsError> {
        let cell_id = cell_id.clone();
        self.write(move |tx, now| restore::report(tx, &cell_id, epoch, now))
            .await
    }

    async fn lift_quarantine(&self, epoch: u64, reason: &str) -> Result<RestoreEpoch, ClaimsError> {
        let reason = reason.to_owned();
        self.write(move |tx, now| restore::lift(tx, epoch, &reason, now))
            .await
    }

    async fn read_events(&self, query: &EventsQuery) -> Result<EventsPage, ClaimsError> {
        let query = query.clone();
        self.read(move |tx, _| crate::watch::read(tx, &query)).await
    }

    async fn compact_events(&self, retention: Duration, max: u64) -> Result<u64, ClaimsError> {
        self.write(move |tx, now| crate::watch::compact(tx, now, retention, max))
            .await
    }

    async fn run_group(&self, ops: &[GroupOp]) -> Result<GroupResults, ClaimsError> {
        let ops = ops.to_vec();
        self.write(move |tx, now| group(tx, &ops, now)).await
    }

    fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }
}

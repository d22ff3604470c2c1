//! The cell side for a cell whose local database is SQLite: the three-phase transaction as one
//! call around the application's closure, in the pre-flight order ([`transact`]) or inside the
//! local transaction ([`transact_in_transaction`]), and a verifier [`ClaimSource`] made of
//! one SQL query per table ([`SqliteQuerySource`]).
//!
//! The protocol itself (phases, staleness guard, reconciliation) is `topology_claims_client`'s;
//! this module only opens, commits and rolls back SQLite transactions around it.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::types::ValueRef;
use rusqlite::{Connection, DropBehavior, TransactionBehavior};
use topology_claims::{
    domain::NamespaceId, BeginUpdate, ClaimKey, ClaimRecord, ClaimsError, LeaseId, OwnerType,
    TableName, Timestamp,
};
use topology_claims_client::{
    check_verify_query_columns, ClaimSource, ClaimsClient, CommitOutcome, LocalClaim, LocalEnd,
    PendingUpdate, TransactionError, UpdateConfig,
};

use crate::error::{open_error, sqlite_to_claims};
use crate::SqliteLocalLeaseStore;

/// Runs the three-phase transaction: BeginUpdate; then, in one local SQLite transaction on `db`,
/// the application's `body` and the lease record; the staleness guard; the local COMMIT; then
/// CommitUpdate and the deletion of the local lease row. Any local failure rolls back locally
/// and then the lease. `leases` must be the `leases_outstanding` store of the same database.
///
/// ```no_run
/// # use topology_claims_client::{ClaimsClient, TransactionError, UpdateConfig};
/// # use topology_claims::BeginUpdate;
/// # use topology_claims_sqlite::{cell::transact, SqliteLocalLeaseStore};
/// # async fn signup(
/// #     client: ClaimsClient, mut db: rusqlite::Connection, leases: SqliteLocalLeaseStore,
/// #     request: BeginUpdate, name: String, email: String,
/// # ) -> Result<i64, TransactionError<rusqlite::Error>> {
/// let (user_id, _) = transact(&client, &mut db, &leases, request, UpdateConfig::default(), |tx| {
///     tx.execute("INSERT INTO users (name, email) VALUES (?1, ?2)", (&name, &email))?;
///     Ok::<_, rusqlite::Error>(tx.last_insert_rowid())
/// }).await?;
/// # Ok(user_id)
/// # }
/// ```
pub async fn transact<T, E>(
    client: &ClaimsClient,
    db: &mut Connection,
    leases: &SqliteLocalLeaseStore,
    request: BeginUpdate,
    config: UpdateConfig,
    body: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, E>,
) -> Result<(T, CommitOutcome), TransactionError<E>>
where
    E: From<rusqlite::Error>,
{
    let pending = PendingUpdate::begin(client, request, config)
        .await
        .map_err(TransactionError::Claims)?;
    let local_end = local_phase(db, leases, &pending, body);
    pending.finish(local_end, leases).await
}

/// Phase 2, synchronous so that the `!Send` transaction never lives across an await.
fn local_phase<T, E: From<rusqlite::Error>>(
    db: &mut Connection,
    leases: &SqliteLocalLeaseStore,
    pending: &PendingUpdate,
    body: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, E>,
) -> LocalEnd<T, E> {
    // IMMEDIATE: take the write lock up front, so the commit cannot fail on a lock upgrade.
    let tx = match db.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => return LocalEnd::Failed(e.into()),
    };
    let mut tx = tx;
    let value = match body(&tx) {
        Ok(value) => value,
        Err(e) => return LocalEnd::Failed(e),
    };
    // From here on the transaction is ended by SQL (`record_and_commit`), as in the other order.
    tx.set_drop_behavior(DropBehavior::Ignore);
    record_and_commit(&tx, leases, pending, value)
}

/// The end of phase 2 in either order, on a connection with an open transaction: the lease row,
/// the staleness guard, the local COMMIT. Every outcome but a commit leaves it rolled back.
fn record_and_commit<T, E: From<rusqlite::Error>>(
    conn: &Connection,
    leases: &SqliteLocalLeaseStore,
    pending: &PendingUpdate,
    value: T,
) -> LocalEnd<T, E> {
    let end = if let Err(e) = leases.record_on(conn, pending.lease_id()) {
        LocalEnd::Failed(e.into())
    } else if let Err(elapsed) = pending.check_fresh() {
        LocalEnd::Stale { elapsed }
    } else {
        match conn.execute_batch("COMMIT") {
            Ok(()) => return LocalEnd::Committed(value),
            Err(e) => LocalEnd::Failed(e.into()),
        }
    };
    roll_back(conn);
    end
}

/// ROLLBACK if a transaction is still open (a failed COMMIT may have ended it already).
fn roll_back(conn: &Connection) {
    if !conn.is_autocommit() {
        if let Err(error) = conn.execute_batch("ROLLBACK") {
            tracing::warn!(%error, "local ROLLBACK failed");
        }
    }
}

/// The local transaction of the in-transaction order while BeginUpdate is awaited: a plain
/// `&mut Connection` (`Send`, unlike a `rusqlite::Transaction`) that rolls back when dropped
/// unless it was handed on, so a cancelled or panicking caller leaves nothing open.
struct OpenTransaction<'c> {
    conn: Option<&'c mut Connection>,
}

impl<'c> OpenTransaction<'c> {
    fn conn(&self) -> &Connection {
        self.conn.as_deref().expect("open until handed on")
    }

    /// The connection, with the transaction still open, for its caller to end.
    fn hand_on(mut self) -> &'c mut Connection {
        self.conn.take().expect("open until handed on")
    }
}

impl Drop for OpenTransaction<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            roll_back(conn);
        }
    }
}

/// The three-phase transaction in the **in-transaction order** (GitLab's Cells ADR 021): local
/// `BEGIN IMMEDIATE` on `db`; the application's `body`; BeginUpdate of `request(&value)` (so it
/// can name the rows `body` just inserted) within [`UpdateConfig::in_transaction_deadline`]
/// (retries keep the lease id); the lease record; the staleness guard; the local COMMIT; then
/// CommitUpdate and the deletion of the local lease row.
///
/// A refused or unanswered BeginUpdate rolls the local transaction back and returns
/// [`TransactionError::Claims`] with the service's error (e.g. `ClaimTaken`). SQLite has one
/// writer: while BeginUpdate is in flight the database's write lock is held, for at most the
/// deadline, and every other writer waits. SQLite has no transaction id a reconciler could ask
/// about, so the lease carries no `local_transaction` and a crash here is healed by staleness.
///
/// ```no_run
/// # use topology_claims_client::{ClaimsClient, TransactionError, UpdateConfig};
/// # use topology_claims::BeginUpdate;
/// # use topology_claims_sqlite::{cell::transact_in_transaction, SqliteLocalLeaseStore};
/// # async fn signup(
/// #     client: ClaimsClient, mut db: rusqlite::Connection, leases: SqliteLocalLeaseStore,
/// #     claims_of: impl FnOnce(i64) -> BeginUpdate, name: String,
/// # ) -> Result<i64, TransactionError<rusqlite::Error>> {
/// let (user_id, _) = transact_in_transaction(
///     &client, &mut db, &leases, UpdateConfig::default(),
///     |tx| {
///         tx.execute("INSERT INTO users (name) VALUES (?1)", [&name])?;
///         Ok::<_, rusqlite::Error>(tx.last_insert_rowid())
///     },
///     |id| claims_of(*id),
/// ).await?;
/// # Ok(user_id)
/// # }
/// ```
pub async fn transact_in_transaction<T, E>(
    client: &ClaimsClient,
    db: &mut Connection,
    leases: &SqliteLocalLeaseStore,
    config: UpdateConfig,
    body: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, E>,
    request: impl FnOnce(&T) -> BeginUpdate,
) -> Result<(T, CommitOutcome), TransactionError<E>>
where
    E: From<rusqlite::Error>,
{
    let value = {
        // IMMEDIATE: take the write lock up front, so the commit cannot fail on a lock upgrade.
        let mut tx = db
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| TransactionError::Local(e.into()))?;
        let value = body(&tx).map_err(TransactionError::Local)?;
        // Kept open past this `!Send` value: `OpenTransaction` ends it.
        tx.set_drop_behavior(DropBehavior::Ignore);
        value
    };
    let open = OpenTransaction { conn: Some(db) };
    let pending = match PendingUpdate::begin_in_transaction(client, request(&value), config).await {
        Ok(pending) => pending,
        Err(failure) => {
            drop(open);
            return Err(TransactionError::Claims(failure.settle().await));
        }
    };
    let local_end = record_and_commit(open.conn(), leases, &pending, value);
    open.hand_on();
    pending.finish(local_end, leases).await
}

/// A verifier claim source: for each table, one SQL query over the cell's SQLite database with
/// the id range bound to `?1` (inclusive) and `?2` (exclusive), returning the columns
/// `table_record_id, claim_type, claim_value, owner_type, owner_value, created_at`.
/// Enum columns may be names (`'username'`) or numbers; `created_at` is unix seconds (INTEGER
/// or REAL, e.g. `CAST(strftime('%s', created_at) AS INTEGER)`).
pub struct SqliteQuerySource {
    conn: Arc<Mutex<Connection>>,
    queries: BTreeMap<TableName, String>,
}

impl SqliteQuerySource {
    /// Opens its own connection to the cell's database (read only) with these queries; each
    /// query is prepared once here so a typo fails now, not halfway through a run.
    pub fn open(path: &Path, queries: BTreeMap<TableName, String>) -> Result<Self, ClaimsError> {
        let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|e| open_error(path, &e))?;
        for (table, sql) in &queries {
            let statement = conn.prepare(sql).map_err(|e| ClaimsError::Configuration {
                message: format!("verify query for table {table} does not prepare: {e}"),
            })?;
            check_verify_query_columns(table, statement.column_count())?;
        }
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            queries,
        })
    }
}

fn enum_column<T>(
    value: ValueRef<'_>,
    column: &str,
    by_name: impl Fn(&str) -> Option<T>,
    by_number: impl Fn(i64) -> Option<T>,
) -> Result<T, ClaimsError> {
    let parsed = match value {
        ValueRef::Integer(n) => by_number(n),
        ValueRef::Text(text) => std::str::from_utf8(text).ok().and_then(&by_name),
        _ => None,
    };
    parsed.ok_or_else(|| ClaimsError::Configuration {
        message: format!(
            "verify query column {column} has a value that is not a known name or number"
        ),
    })
}

fn read_claim(row: &rusqlite::Row<'_>, table: &TableName) -> Result<LocalClaim, ClaimsError> {
    let get = |i: usize| row.get_ref(i).map_err(|e| sqlite_to_claims(&e));
    let text = |i: usize, column: &str| -> Result<String, ClaimsError> {
        match get(i)? {
            ValueRef::Text(t) => Ok(String::from_utf8_lossy(t).into_owned()),
            ValueRef::Integer(n) => Ok(n.to_string()),
            _ => Err(ClaimsError::Configuration {
                message: format!("verify query column {column} must be text"),
            }),
        }
    };
    let record_id = match get(0)? {
        ValueRef::Integer(n) => n,
        _ => {
            return Err(ClaimsError::Configuration {
                message: "verify query column table_record_id must be an integer".into(),
            })
        }
    };
    let created_at = match get(5)? {
        ValueRef::Integer(secs) => Timestamp::from_unix_micros(secs.saturating_mul(1_000_000)),
        ValueRef::Real(secs) => Timestamp::from_unix_micros((secs * 1e6) as i64),
        _ => {
            return Err(ClaimsError::Configuration {
                message: "verify query column created_at must be unix seconds".into(),
            })
        }
    };
    let record = ClaimRecord {
        display: None,
        key: ClaimKey::new(
            enum_column(
                get(1)?,
                "claim_type",
                NamespaceId::from_name_or_legacy,
                NamespaceId::from_legacy_number,
            )?,
            text(2, "claim_value")?,
        ),
        owner_type: enum_column(
            get(3)?,
            "owner_type",
            OwnerType::from_name,
            OwnerType::from_number,
        )?,
        owner_value: text(4, "owner_value")?,
        table_name: table.clone(),
        table_record_id: record_id,
    };
    Ok(LocalClaim { record, created_at })
}

impl ClaimSource for SqliteQuerySource {
    async fn claims_in_range(
        &self,
        table: TableName,
        start: i64,
        end: i64,
    ) -> Result<Vec<LocalClaim>, ClaimsError> {
        let Some(sql) = self.queries.get(&table).cloned() else {
            return Ok(Vec::new());
        };
        let conn = Arc::clone(&self.conn);
        tokio::task::spawn_blocking(move || {
            let conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            let mut statement = conn
                .prepare_cached(&sql)
                .map_err(|e| sqlite_to_claims(&e))?;
            let mut rows = statement
                .query((start, end))
                .map_err(|e| sqlite_to_claims(&e))?;
            let mut claims = Vec::new();
            while let Some(row) = rows.next().map_err(|e| sqlite_to_claims(&e))? {
                claims.push(read_claim(row, &table)?);
            }
            Ok(claims)
        })
        .await
        .map_err(|e| ClaimsError::internal(format!("verify query thread failed: {e}")))?
    }

    async fn leases_recorded(
        &self,
        lease_ids: &[LeaseId],
    ) -> Result<HashSet<LeaseId>, ClaimsError> {
        let conn = Arc::clone(&self.conn);
        let lease_ids = lease_ids.to_vec();
        tokio::task::spawn_blocking(move || {
            let conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            let mut select =
                match conn.prepare_cached("SELECT 1 FROM leases_outstanding WHERE lease_id = ?1") {
                    Ok(select) => select,
                    // A database without the cell's lease table records no lease.
                    Err(e) if e.to_string().contains("no such table") => return Ok(HashSet::new()),
                    Err(e) => return Err(sqlite_to_claims(&e)),
                };
            let mut recorded = HashSet::new();
            for id in lease_ids {
                if select
                    .exists([crate::rows::lease_id_text(id)])
                    .map_err(|e| sqlite_to_claims(&e))?
                {
                    recorded.insert(id);
                }
            }
            Ok(recorded)
        })
        .await
        .map_err(|e| ClaimsError::internal(format!("lease lookup thread failed: {e}")))?
    }
}

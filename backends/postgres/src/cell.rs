//! The cell side for a cell whose local database is PostgreSQL: the three-phase transaction as
//! one call around the application's async closure, in the pre-flight order ([`transact`]) or
//! inside the local transaction ([`transact_in_transaction`]), and a verifier
//! [`ClaimSource`] made of one SQL query per table ([`PostgresQuerySource`]).
//!
//! The protocol itself (phases, staleness guard, reconciliation) is `topology_claims_client`'s;
//! this module only opens, commits and rolls back PostgreSQL transactions around it.

use std::collections::{BTreeMap, HashSet};

use futures::future::BoxFuture;
use tokio_postgres::{Row, Transaction};
use topology_claims::{
    domain::NamespaceId, BeginUpdate, ClaimKey, ClaimRecord, ClaimsError, LeaseId,
    LocalTransaction, OwnerType, TableName, Timestamp,
};
use topology_claims_client::{
    check_verify_query_columns, ClaimSource, ClaimsClient, CommitOutcome, LocalClaim, LocalEnd,
    PendingUpdate, TransactionError, UpdateConfig,
};

use crate::error::{final_error, pool_error};
use crate::local::record_in;
use crate::options::{PostgresOptions, Settings};
use crate::PostgresLocalLeaseStore;

/// Runs the three-phase transaction: BeginUpdate; then, in one local transaction on `db`, the
/// application's `body` and the lease record; the staleness guard; the local COMMIT; then
/// CommitUpdate and the deletion of the local lease row. A local failure rolls back locally and
/// then the lease. A COMMIT cut off by a broken connection has an unknown outcome: the lease is
/// left to the reconciler ([`TransactionError::Indeterminate`]).
///
/// ```no_run
/// # use topology_claims_client::{ClaimsClient, TransactionError, UpdateConfig};
/// # use topology_claims::BeginUpdate;
/// # use topology_claims_postgres::{cell::transact, tokio_postgres, PostgresLocalLeaseStore};
/// # async fn signup(
/// #     client: ClaimsClient, mut db: tokio_postgres::Client, leases: PostgresLocalLeaseStore,
/// #     request: BeginUpdate, name: String,
/// # ) -> Result<i64, TransactionError<tokio_postgres::Error>> {
/// let (id, _) = transact(&client, &mut db, &leases, request, UpdateConfig::default(), |tx| {
///     Box::pin(async move {
///         let row = tx.query_one("INSERT INTO users (name) VALUES ($1) RETURNING id", &[&name]).await?;
///         Ok::<i64, tokio_postgres::Error>(row.get(0))
///     })
/// }).await?;
/// # Ok(id)
/// # }
/// ```
pub async fn transact<T, E, F>(
    client: &ClaimsClient,
    db: &mut tokio_postgres::Client,
    leases: &PostgresLocalLeaseStore,
    request: BeginUpdate,
    config: UpdateConfig,
    body: F,
) -> Result<(T, CommitOutcome), TransactionError<E>>
where
    E: From<tokio_postgres::Error>,
    F: for<'t> FnOnce(&'t Transaction<'t>) -> BoxFuture<'t, Result<T, E>>,
{
    let pending = PendingUpdate::begin(client, request, config)
        .await
        .map_err(TransactionError::Claims)?;
    let local_end = local_phase(db, &pending, body).await;
    pending.finish(local_end, leases).await
}

async fn local_phase<T, E, F>(
    db: &mut tokio_postgres::Client,
    pending: &PendingUpdate,
    body: F,
) -> LocalEnd<T, E>
where
    E: From<tokio_postgres::Error>,
    F: for<'t> FnOnce(&'t Transaction<'t>) -> BoxFuture<'t, Result<T, E>>,
{
    let tx = match db.transaction().await {
        Ok(tx) => tx,
        Err(e) => return LocalEnd::Failed(e.into()),
    };
    let value = match body(&tx).await {
        Ok(value) => value,
        Err(e) => return LocalEnd::Failed(e),
    };
    record_and_commit(tx, pending, value).await
}

/// The end of phase 2 in either order: the lease row, the staleness guard, the local COMMIT.
async fn record_and_commit<T, E: From<tokio_postgres::Error>>(
    tx: Transaction<'_>,
    pending: &PendingUpdate,
    value: T,
) -> LocalEnd<T, E> {
    if let Err(e) = record_in(&tx, pending.lease_id()).await {
        return LocalEnd::Failed(e.into());
    }
    if let Err(elapsed) = pending.check_fresh() {
        // Dropping the transaction rolls it back.
        return LocalEnd::Stale { elapsed };
    }
    match tx.commit().await {
        Ok(()) => LocalEnd::Committed(value),
        // The server answered: the COMMIT definitely did not happen.
        Err(e) if e.as_db_error().is_some() => LocalEnd::Failed(e.into()),
        // No answer (connection closed or broken mid-COMMIT): it may or may not have happened.
        Err(e) => LocalEnd::Indeterminate(e.into()),
    }
}

/// `pg:<system_identifier>:<xid8>` of the transaction open in `tx` (it is given a transaction
/// id now if it has none): the `local_transaction` of a BeginUpdate sent from inside it.
pub async fn local_transaction_of(
    tx: &Transaction<'_>,
) -> Result<LocalTransaction, tokio_postgres::Error> {
    let row = tx
        .query_one(crate::sql::LOCAL_TRANSACTION_NAME, &[])
        .await?;
    let (system, xid): (String, String) = (row.try_get(0)?, row.try_get(1)?);
    // Digits and a colon, at most 46 bytes: always a valid field.
    Ok(
        LocalTransaction::parse_field(&format!("pg:{system}:{xid}"), "local_transaction")
            .expect("decimal integers make a valid local_transaction"),
    )
}

/// The three-phase transaction in the **in-transaction order** (GitLab's Cells ADR 021): local
/// BEGIN on `db`; the application's `body`; BeginUpdate of `request(&value)` (so it can name the
/// records `body` just inserted) carrying this transaction as its `local_transaction`, within
/// [`UpdateConfig::in_transaction_deadline`] (retries keep the lease id); the lease record; the
/// staleness guard; the local COMMIT; then CommitUpdate and the deletion of the local lease row.
///
/// A refused or unanswered BeginUpdate rolls the local transaction back and returns
/// [`TransactionError::Claims`] with the service's error (e.g. `ClaimTaken`). While BeginUpdate
/// is in flight the local transaction stays open with its locks, for at most the deadline. If the
/// process dies there, the cell's reconciler sees the transaction `aborted` and rolls the lease
/// back in its next pass (decision 080).
///
/// ```no_run
/// # use topology_claims_client::{ClaimsClient, TransactionError, UpdateConfig};
/// # use topology_claims::BeginUpdate;
/// # use topology_claims_postgres::{cell::transact_in_transaction, tokio_postgres, PostgresLocalLeaseStore};
/// # async fn signup(
/// #     client: ClaimsClient, mut db: tokio_postgres::Client, leases: PostgresLocalLeaseStore,
/// #     claims_of: impl FnOnce(i64) -> BeginUpdate, name: String,
/// # ) -> Result<i64, TransactionError<tokio_postgres::Error>> {
/// let (id, _) = transact_in_transaction(
///     &client, &mut db, &leases, UpdateConfig::default(),
///     |tx| Box::pin(async move {
///         let row = tx.query_one("INSERT INTO users (name) VALUES ($1) RETURNING id", &[&name]).await?;
///         Ok::<i64, tokio_postgres::Error>(row.get(0))
///     }),
///     |id| claims_of(*id),
/// ).await?;
/// # Ok(id)
/// # }
/// ```
pub async fn transact_in_transaction<T, E, F, R>(
    client: &ClaimsClient,
    db: &mut tokio_postgres::Client,
    leases: &PostgresLocalLeaseStore,
    config: UpdateConfig,
    body: F,
    request: R,
) -> Result<(T, CommitOutcome), TransactionError<E>>
where
    E: From<tokio_postgres::Error>,
    F: for<'t> FnOnce(&'t Transaction<'t>) -> BoxFuture<'t, Result<T, E>>,
    R: FnOnce(&T) -> BeginUpdate,
{
    let local = |e: tokio_postgres::Error| TransactionError::Local(E::from(e));
    // Every early return drops `tx`, which rolls it back.
    let tx = db.transaction().await.map_err(local)?;
    let value = body(&tx).await.map_err(TransactionError::Local)?;
    let mut request = request(&value);
    request.local_transaction = Some(local_transaction_of(&tx).await.map_err(local)?);
    let pending = match PendingUpdate::begin_in_transaction(client, request, config).await {
        Ok(pending) => pending,
        Err(failure) => {
            if let Err(error) = tx.rollback().await {
                tracing::warn!(%error, "local rollback after a refused BeginUpdate failed; the connection's end rolls it back");
            }
            return Err(TransactionError::Claims(failure.settle().await));
        }
    };
    let local_end = record_and_commit(tx, &pending, value).await;
    pending.finish(local_end, leases).await
}

/// A verifier claim source: for each table, one SQL query over the cell's PostgreSQL database
/// with the id range bound to `$1` (inclusive) and `$2` (exclusive), both `bigint`, returning
/// `table_record_id, claim_type, claim_value, owner_type, owner_value, created_at`. Enum columns
/// may be names (`'username'`) or integers; `created_at` is unix seconds as `bigint` or
/// `double precision` (e.g. `EXTRACT(EPOCH FROM created_at)::bigint`).
pub struct PostgresQuerySource {
    pool: deadpool_postgres::Pool,
    target: String,
    queries: BTreeMap<TableName, String>,
}

impl PostgresQuerySource {
    /// Connects (a small pool) and prepares every query once, so a typo fails now.
    pub async fn connect(
        url: &str,
        queries: BTreeMap<TableName, String>,
    ) -> Result<Self, ClaimsError> {
        let options = PostgresOptions {
            pool_size: 2,
            ..PostgresOptions::default()
        };
        let settings = Settings::new(url, &options)?;
        let pool = settings.pool(&options)?;
        let client = pool
            .get()
            .await
            .map_err(|e| pool_error(e, &settings.target))?;
        for (table, sql) in &queries {
            let statement = client
                .prepare(sql)
                .await
                .map_err(|e| ClaimsError::Configuration {
                    message: format!(
                        "verify query for table {table} does not prepare: {}",
                        crate::error::describe(&e)
                    ),
                })?;
            check_verify_query_columns(table, statement.columns().len())?;
        }
        Ok(Self {
            pool,
            target: settings.target,
            queries,
        })
    }
}

fn bad_column(column: &str, expected: &str) -> ClaimsError {
    ClaimsError::Configuration {
        message: format!("verify query column {column} must be {expected}"),
    }
}

fn integer(row: &Row, i: usize) -> Option<i64> {
    row.try_get::<_, i64>(i)
        .ok()
        .or_else(|| row.try_get::<_, i32>(i).ok().map(i64::from))
        .or_else(|| row.try_get::<_, i16>(i).ok().map(i64::from))
}

fn enum_column<T>(
    row: &Row,
    i: usize,
    column: &str,
    by_name: fn(&str) -> Option<T>,
    by_number: fn(i64) -> Option<T>,
) -> Result<T, ClaimsError> {
    let parsed = match row.try_get::<_, String>(i) {
        Ok(name) => by_name(&name),
        Err(_) => integer(row, i).and_then(by_number),
    };
    parsed.ok_or_else(|| bad_column(column, "a known name or number"))
}

fn read_claim(row: &Row, table: &TableName) -> Result<LocalClaim, ClaimsError> {
    let text = |i: usize, column: &str| {
        row.try_get::<_, String>(i)
            .ok()
            .or_else(|| integer(row, i).map(|n| n.to_string()))
            .ok_or_else(|| bad_column(column, "text"))
    };
    let created_at = match integer(row, 5) {
        Some(secs) => Timestamp::from_unix_micros(secs.saturating_mul(1_000_000)),
        None => {
            let secs: f64 = row.try_get(5).map_err(|_| {
                bad_column("created_at", "unix seconds (bigint or double precision)")
            })?;
            Timestamp::from_unix_micros((secs * 1e6) as i64)
        }
    };
    Ok(LocalClaim {
        record: ClaimRecord {
            display: None,
            key: ClaimKey::new(
                enum_column(
                    row,
                    1,
                    "claim_type",
                    NamespaceId::from_name_or_legacy,
                    NamespaceId::from_legacy_number,
                )?,
                text(2, "claim_value")?,
            ),
            owner_type: enum_column(
                row,
                3,
                "owner_type",
                OwnerType::from_name,
                OwnerType::from_number,
            )?,
            owner_value: text(4, "owner_value")?,
            table_name: table.clone(),
            table_record_id: integer(row, 0)
                .ok_or_else(|| bad_column("table_record_id", "an integer"))?,
        },
        created_at,
    })
}

impl ClaimSource for PostgresQuerySource {
    async fn claims_in_range(
        &self,
        table: TableName,
        start: i64,
        end: i64,
    ) -> Result<Vec<LocalClaim>, ClaimsError> {
        let Some(sql) = self.queries.get(&table) else {
            return Ok(Vec::new());
        };
        let client = self
            .pool
            .get()
            .await
            .map_err(|e| pool_error(e, &self.target))?;
        let statement = client
            .prepare_cached(sql)
            .await
            .map_err(|e| final_error(&e, &self.target, "preparing a verify query"))?;
        let rows = client
            .query(&statement, &[&start, &end])
            .await
            .map_err(|e| final_error(&e, &self.target, "running a verify query"))?;
        rows.iter().map(|row| read_claim(row, &table)).collect()
    }

    async fn leases_recorded(
        &self,
        lease_ids: &[LeaseId],
    ) -> Result<HashSet<LeaseId>, ClaimsError> {
        let client = self
            .pool
            .get()
            .await
            .map_err(|e| pool_error(e, &self.target))?;
        let ids: Vec<uuid::Uuid> = lease_ids.iter().map(|id| *id.as_uuid()).collect();
        // A database without the cell's lease table records no lease.
        let present: bool = client
            .query_one("SELECT to_regclass('leases_outstanding') IS NOT NULL", &[])
            .await
            .and_then(|row| row.try_get(0))
            .map_err(|e| final_error(&e, &self.target, "looking up leases_outstanding"))?;
        if !present {
            return Ok(HashSet::new());
        }
        let rows = client
            .query(
                "SELECT lease_id FROM leases_outstanding WHERE lease_id = ANY($1::uuid[])",
                &[&ids],
            )
            .await
            .map_err(|e| final_error(&e, &self.target, "reading leases_outstanding"))?;
        rows.iter()
            .map(|row| {
                row.try_get::<_, uuid::Uuid>(0)
                    .map(LeaseId::from_uuid)
                    .map_err(|e| final_error(&e, &self.target, "reading leases_outstanding"))
            })
            .collect()
    }
}

//! The cell side for a cell whose local database is PostgreSQL: the three-phase transaction as
//! one call around the application's async closure ([`transact`]) and a verifier
//! [`ClaimSource`] made of one SQL query per table ([`PostgresQuerySource`]).
//!
//! The protocol itself (phases, staleness guard, reconciliation) is `topology_claims::cell`'s;
//! this module only opens, commits and rolls back PostgreSQL transactions around it.

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use tokio_postgres::{Row, Transaction};
use topology_claims::cell::{
    check_verify_query_columns, ClaimSource, ClaimsClient, CommitOutcome, LocalClaim, LocalEnd,
    PendingUpdate, TransactionError, UpdateConfig,
};
use topology_claims::{
    BeginUpdate, ClaimKey, ClaimRecord, ClaimType, ClaimsError, OwnerType, TableName, Timestamp,
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
/// # use topology_claims::cell::{ClaimsClient, TransactionError, UpdateConfig};
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
            check_verify_query_columns(*table, statement.columns().len())?;
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

fn read_claim(row: &Row, table: TableName) -> Result<LocalClaim, ClaimsError> {
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
            key: ClaimKey {
                claim_type: enum_column(
                    row,
                    1,
                    "claim_type",
                    ClaimType::from_name,
                    ClaimType::from_number,
                )?,
                value: text(2, "claim_value")?,
            },
            owner_type: enum_column(
                row,
                3,
                "owner_type",
                OwnerType::from_name,
                OwnerType::from_number,
            )?,
            owner_value: text(4, "owner_value")?,
            table_name: table,
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
        rows.iter().map(|row| read_claim(row, table)).collect()
    }
}

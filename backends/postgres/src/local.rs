//! [`PostgresLocalLeaseStore`]: a cell's own `leases_outstanding` table, for a cell whose local
//! database is PostgreSQL.
//!
//! It is also the cell's [`LocalLock`] (table `topology_claims_locks`), so only one reconciler
//! acts for a cell at a time. [`record`](LocalLeaseStore::record) runs inside the application's open
//! `tokio_postgres::Transaction`, so the lease row commits or rolls back with the application's
//! own rows; the other operations use the store's pool. The table is the application's: this
//! module ships its DDL ([`LOCAL_LEASES_DDL`], [`ensure_local_schema`]) but never migrates the
//! cell's database behind its back.

use std::collections::HashMap;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Transaction};
use topology_claims::{
    ClaimsError, LeaseId, LocalLease, LocalLeaseStore, LocalLock, LocalTransaction, LocalTxStatus,
    PgLocalTransaction, Timestamp,
};

use crate::error::{final_error, pool_error};
use crate::options::{PostgresOptions, Settings};
use crate::rows;
use crate::sql;

pub use crate::sql::LOCAL_LEASES_DDL;

/// Creates the `leases_outstanding` table and its index if missing ([`LOCAL_LEASES_DDL`]) on
/// `client`'s search_path. Idempotent; run it from the cell's deployment (or copy the DDL into
/// the application's own migrations).
pub async fn ensure_local_schema(client: &impl GenericClient) -> Result<(), ClaimsError> {
    // Looked up first: `CREATE … IF NOT EXISTS` of an existing table sends a NOTICE ("already
    // exists, skipping") that the driver logs at info level, three lines on every sidecar start
    // of a cell whose migrations created the tables as documented.
    let present: bool = client
        .query_one(sql::LOCAL_SCHEMA_PRESENT, &[])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(|e| final_error(&e, "the cell's PostgreSQL", "looking up leases_outstanding"))?;
    if present {
        return Ok(());
    }
    client
        .batch_execute(LOCAL_LEASES_DDL)
        .await
        .map_err(|e| final_error(&e, "the cell's PostgreSQL", "creating leases_outstanding"))
}

/// The cell's `leases_outstanding` table in PostgreSQL.
#[derive(Clone)]
pub struct PostgresLocalLeaseStore {
    pool: Pool,
    target: String,
}

impl std::fmt::Debug for PostgresLocalLeaseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresLocalLeaseStore")
            .field("target", &self.target)
            .finish()
    }
}

impl PostgresLocalLeaseStore {
    /// A store with its own pool on `url`. With `options.schema`, the schema is created if
    /// missing and is every pooled connection's search_path. Tables are not created: see
    /// [`ensure_local_schema`].
    pub async fn connect(url: &str, options: PostgresOptions) -> Result<Self, ClaimsError> {
        let settings = Settings::new(url, &options)?;
        let pool = settings.pool(&options)?;
        if let Some(schema) = &options.schema {
            let client = pool
                .get()
                .await
                .map_err(|e| pool_error(e, &settings.target))?;
            client
                .batch_execute(&sql::create_schema(schema)?)
                .await
                .map_err(|e| final_error(&e, &settings.target, "creating the schema"))?;
        }
        Ok(Self {
            pool,
            target: settings.target,
        })
    }

    /// A store on the application's existing pool.
    pub fn from_pool(pool: Pool) -> Self {
        Self {
            pool,
            target: "the cell's PostgreSQL".to_owned(),
        }
    }

    /// [`ensure_local_schema`] on a connection of this store's pool. A connection failure names
    /// its cause (a missing database or role, refused connection, …), not just the pool's
    /// "error occurred while creating a new object".
    pub async fn ensure_schema(&self) -> Result<(), ClaimsError> {
        ensure_local_schema(&**self.client().await?).await
    }

    /// The pool `delete`, `find` and `list_older_than` use (and tests open transactions on).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, ClaimsError> {
        self.pool
            .get()
            .await
            .map_err(|e| pool_error(e, &self.target))
    }

    fn fail(&self, doing: &'static str) -> impl Fn(tokio_postgres::Error) -> ClaimsError + '_ {
        move |e| final_error(&e, &self.target, doing)
    }
}

/// [`LocalLeaseStore::record`] with the driver's own error, for callers whose error type
/// converts from `tokio_postgres::Error`.
pub async fn record_in(
    tx: &Transaction<'_>,
    lease_id: LeaseId,
) -> Result<(), tokio_postgres::Error> {
    // Typed, unprepared: one round trip inside the application's transaction, and no
    // statement left behind on the application's connection.
    tx.execute_typed(sql::LOCAL_RECORD, &[(lease_id.as_uuid(), Type::UUID)])
        .await
        .map(drop)
}

fn local_lease(row: &tokio_postgres::Row) -> Result<LocalLease, ClaimsError> {
    let corrupt = |e: tokio_postgres::Error| {
        ClaimsError::internal(format!("stored leases_outstanding row is invalid: {e}"))
    };
    Ok(LocalLease {
        lease_id: LeaseId::from_uuid(row.try_get(0).map_err(corrupt)?),
        created_at: rows::timestamp(row.try_get(1).map_err(corrupt)?),
    })
}

impl LocalLeaseStore for PostgresLocalLeaseStore {
    type Tx<'t> = Transaction<'t>;

    async fn record(&self, tx: &mut Self::Tx<'_>, lease_id: LeaseId) -> Result<(), ClaimsError> {
        record_in(tx, lease_id)
            .await
            .map_err(self.fail("recording a lease in leases_outstanding"))
    }

    async fn delete(&self, lease_id: LeaseId) -> Result<bool, ClaimsError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(sql::LOCAL_DELETE)
            .await
            .map_err(self.fail("delete"))?;
        let deleted = client
            .execute(&statement, &[lease_id.as_uuid()])
            .await
            .map_err(self.fail("deleting from leases_outstanding"))?;
        Ok(deleted > 0)
    }

    async fn find(&self, lease_ids: &[LeaseId]) -> Result<Vec<LocalLease>, ClaimsError> {
        if lease_ids.is_empty() {
            return Ok(Vec::new());
        }
        let client = self.client().await?;
        let statement = client
            .prepare_cached(sql::LOCAL_FIND)
            .await
            .map_err(self.fail("find"))?;
        let ids: Vec<uuid::Uuid> = lease_ids.iter().map(|id| *id.as_uuid()).collect();
        let rows = client
            .query(&statement, &[&ids])
            .await
            .map_err(self.fail("reading leases_outstanding"))?;
        let found: HashMap<LeaseId, LocalLease> = rows
            .iter()
            .map(|row| local_lease(row).map(|lease| (lease.lease_id, lease)))
            .collect::<Result<_, _>>()?;
        // In the order asked, like the reference store.
        Ok(lease_ids
            .iter()
            .filter_map(|id| found.get(id).cloned())
            .collect())
    }

    async fn list_older_than(
        &self,
        before: Timestamp,
        limit: usize,
    ) -> Result<Vec<LocalLease>, ClaimsError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(sql::LOCAL_LIST_OLDER_THAN)
            .await
            .map_err(self.fail("list_older_than"))?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = client
            .query(&statement, &[&rows::system_time(before), &limit])
            .await
            .map_err(self.fail("reading leases_outstanding"))?;
        rows.iter().map(local_lease).collect()
    }

    /// `pg:<system_identifier>:<xid8>` of this cluster, asked of the server the pool is on: its
    /// `pg_xact_status`, unless the server is a standby. Anything else is `Unknown` (decision 080).
    async fn transaction_status(&self, local: &LocalTransaction) -> LocalTxStatus {
        match PgLocalTransaction::parse(local) {
            Some(named) => self.pg_transaction_status(named).await,
            None => LocalTxStatus::Unknown(format!(
                "{local:?} is not a PostgreSQL transaction (pg:<system_identifier>:<xid8>)"
            )),
        }
    }
}

/// The first normal PostgreSQL transaction id: 0 to 2 are special (invalid, bootstrap, frozen),
/// and `pg_xact_status` of them says nothing about a cell's transaction.
const FIRST_NORMAL_XID: u64 = 3;

impl PostgresLocalLeaseStore {
    /// [`LocalLeaseStore::transaction_status`] of a `pg:<system_identifier>:<xid8>` transaction.
    async fn pg_transaction_status(&self, named: PgLocalTransaction) -> LocalTxStatus {
        let unknown = |why: String| LocalTxStatus::Unknown(why);
        // A system identifier PostgreSQL cannot hold (it is a bigint) is no cluster's.
        let Ok(system) = i64::try_from(named.system_identifier) else {
            return unknown(format!(
                "system identifier {} is not this cluster's",
                named.system_identifier
            ));
        };
        if named.xid8 < FIRST_NORMAL_XID {
            return unknown(format!("{} is not a normal transaction id", named.xid8));
        }
        let client = match self.client().await {
            Ok(client) => client,
            Err(error) => return unknown(format!("could not ask the local database: {error}")),
        };
        let row = match client
            .query_one(
                sql::LOCAL_TRANSACTION_STATUS,
                &[&system, &named.xid8.to_string()],
            )
            .await
        {
            Ok(row) => row,
            // 22023 for an xid from the future (after a failover or a restore): fall back.
            Err(error) => {
                let code = error.code().map_or("none", |c| c.code());
                return unknown(format!("pg_xact_status failed (SQLSTATE {code}): {error}"));
            }
        };
        let answer = (|| -> Result<_, tokio_postgres::Error> {
            Ok((
                row.try_get::<_, bool>(0)?,
                row.try_get::<_, i64>(1)?,
                row.try_get::<_, Option<String>>(2)?,
            ))
        })();
        match answer {
            Err(error) => unknown(format!("unreadable pg_xact_status answer: {error}")),
            Ok((true, _, _)) => unknown(
                "the local database is a standby (pg_is_in_recovery()): point --local-db at the primary"
                    .to_owned(),
            ),
            Ok((false, own, _)) if own != system => unknown(format!(
                "another cluster's transaction (system identifier {system}, this one is {own})"
            )),
            Ok((false, _, None)) => unknown(
                "pg_xact_status is NULL: the transaction is too old for this cluster to know"
                    .to_owned(),
            ),
            Ok((false, _, Some(status))) => match status.as_str() {
                "aborted" => LocalTxStatus::Aborted,
                "in progress" => LocalTxStatus::InProgress,
                "committed" => LocalTxStatus::Committed,
                other => unknown(format!("unexpected pg_xact_status {other:?}")),
            },
        }
    }
}

/// Longest lock time-to-live honoured (a year): the expiry must stay a valid timestamp.
const MAX_LOCK_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

impl LocalLock for PostgresLocalLeaseStore {
    async fn try_lock(&self, name: &str, holder: &str, ttl: Duration) -> Result<bool, ClaimsError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(sql::LOCAL_TRY_LOCK)
            .await
            .map_err(self.fail("try_lock"))?;
        let ttl = i64::try_from(ttl.min(MAX_LOCK_TTL).as_micros()).unwrap_or(i64::MAX);
        let changed = client
            .execute(&statement, &[&name, &holder, &ttl])
            .await
            .map_err(self.fail("taking a topology_claims_locks lock"))?;
        Ok(changed > 0)
    }

    async fn unlock(&self, name: &str, holder: &str) -> Result<(), ClaimsError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(sql::LOCAL_UNLOCK)
            .await
            .map_err(self.fail("unlock"))?;
        client
            .execute(&statement, &[&name, &holder])
            .await
            .map_err(self.fail("releasing a topology_claims_locks lock"))?;
        Ok(())
    }
}

//! A simulated cell's local database: SQLite (the pre-flight order, `cell.rs`), or a schema of
//! the campaign's private PostgreSQL cluster (the in-transaction order with `local_transaction`,
//! `in_tx.rs`). Both hold the application table `records` and the protocol's
//! `leases_outstanding`; the reconciler sidecars see either through [`CellLeases`].
//!
//! Owns the local databases' wiring. Must not decide protocol questions.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::time::Duration;

use topology_claims::{
    ClaimsError, LeaseId, LocalLease, LocalLeaseStore, LocalLock, LocalTransaction, LocalTxStatus,
    Timestamp,
};
use topology_claims_harness::postgres as pg;
use topology_claims_postgres::{tokio_postgres, PostgresLocalLeaseStore, PostgresOptions};
use topology_claims_sqlite::SqliteLocalLeaseStore;

/// The application table of a PostgreSQL cell (the SQLite one is `cell::APP_DDL`).
const PG_APP_DDL: &str = "\
CREATE TABLE IF NOT EXISTS records (
    key         integer PRIMARY KEY,
    lease_id    text    NOT NULL,
    created_at  bigint  NOT NULL,
    owner_value text
);";

/// A cell's lease table on either database, for the code that only reads and deletes rows (the
/// reconciler, `PendingUpdate::finish`). Recording happens inside the cell's own transaction,
/// with the backend's own type, so [`LocalLeaseStore::record`] is unreachable here.
pub enum CellLeases {
    Sqlite(SqliteLocalLeaseStore),
    Postgres(PostgresLocalLeaseStore),
}

impl CellLeases {
    pub async fn open_sqlite(path: &Path) -> Result<CellLeases, String> {
        SqliteLocalLeaseStore::open(path)
            .await
            .map(CellLeases::Sqlite)
            .map_err(|e| format!("opening the lease store of {}: {e}", path.display()))
    }

    pub async fn open_postgres(url: &str, schema: &str) -> Result<CellLeases, String> {
        let options = PostgresOptions {
            pool_size: 2,
            schema: Some(schema.to_owned()),
            application_name: Some(schema.to_owned()),
            ..PostgresOptions::default()
        };
        PostgresLocalLeaseStore::connect(url, options)
            .await
            .map(CellLeases::Postgres)
            .map_err(|e| format!("opening a PostgreSQL cell's lease store: {e}"))
    }
}

impl LocalLeaseStore for CellLeases {
    type Tx<'t> = Infallible;

    fn record(
        &self,
        tx: &mut Self::Tx<'_>,
        _lease_id: LeaseId,
    ) -> impl std::future::Future<Output = Result<(), ClaimsError>> {
        let never: Infallible = *tx;
        async move { match never {} }
    }

    async fn delete(&self, lease_id: LeaseId) -> Result<bool, ClaimsError> {
        match self {
            CellLeases::Sqlite(s) => s.delete(lease_id).await,
            CellLeases::Postgres(p) => p.delete(lease_id).await,
        }
    }

    async fn find(&self, lease_ids: &[LeaseId]) -> Result<Vec<LocalLease>, ClaimsError> {
        match self {
            CellLeases::Sqlite(s) => s.find(lease_ids).await,
            CellLeases::Postgres(p) => p.find(lease_ids).await,
        }
    }

    async fn list_older_than(
        &self,
        before: Timestamp,
        limit: usize,
    ) -> Result<Vec<LocalLease>, ClaimsError> {
        match self {
            CellLeases::Sqlite(s) => s.list_older_than(before, limit).await,
            CellLeases::Postgres(p) => p.list_older_than(before, limit).await,
        }
    }

    async fn transaction_status(&self, local: &LocalTransaction) -> LocalTxStatus {
        match self {
            CellLeases::Sqlite(s) => s.transaction_status(local).await,
            CellLeases::Postgres(p) => p.transaction_status(local).await,
        }
    }
}

impl LocalLock for CellLeases {
    async fn try_lock(&self, name: &str, holder: &str, ttl: Duration) -> Result<bool, ClaimsError> {
        match self {
            CellLeases::Sqlite(s) => s.try_lock(name, holder, ttl).await,
            CellLeases::Postgres(p) => p.try_lock(name, holder, ttl).await,
        }
    }

    async fn unlock(&self, name: &str, holder: &str) -> Result<(), ClaimsError> {
        match self {
            CellLeases::Sqlite(s) => s.unlock(name, holder).await,
            CellLeases::Postgres(p) => p.unlock(name, holder).await,
        }
    }
}

/// Where a cell keeps its data.
#[derive(Clone, Debug)]
pub enum LocalDbSpec {
    Sqlite(PathBuf),
    /// The cluster's URL and the cell's own schema there.
    Postgres {
        url: String,
        schema: String,
    },
}

impl LocalDbSpec {
    pub fn sqlite_path(&self) -> Option<&Path> {
        match self {
            LocalDbSpec::Sqlite(path) => Some(path),
            LocalDbSpec::Postgres { .. } => None,
        }
    }

    pub async fn leases(&self) -> Result<CellLeases, String> {
        match self {
            LocalDbSpec::Sqlite(path) => CellLeases::open_sqlite(path).await,
            LocalDbSpec::Postgres { url, schema } => CellLeases::open_postgres(url, schema).await,
        }
    }

    /// The application's connection URL of a PostgreSQL cell: its schema as the search_path.
    pub fn app_url(&self) -> Option<Result<String, String>> {
        match self {
            LocalDbSpec::Sqlite(_) => None,
            LocalDbSpec::Postgres { url, schema } => {
                Some(pg::url_with_search_path(url, schema, schema))
            }
        }
    }
}

/// A PostgreSQL cell's application connection, opened again when a fault (`pg-restart`,
/// `pg-terminate`) closed it, as an application's pool would.
pub struct PgConnection {
    url: String,
    /// `None` after [`PgConnection::close`].
    client: Option<tokio_postgres::Client>,
}

impl PgConnection {
    /// Connects and creates the cell's tables.
    pub async fn open(url: &str) -> Result<PgConnection, String> {
        let client = pg::connect(url).await?;
        client
            .batch_execute(PG_APP_DDL)
            .await
            .map_err(|e| format!("creating a PostgreSQL cell's records table: {e}"))?;
        topology_claims_postgres::ensure_local_schema(&client)
            .await
            .map_err(|e| format!("creating a PostgreSQL cell's lease table: {e}"))?;
        Ok(PgConnection {
            url: url.to_owned(),
            client: Some(client),
        })
    }

    /// Drops the connection without ending its transaction (the socket closes; PostgreSQL
    /// aborts whatever was open), as the death of the process would.
    pub fn close(&mut self) {
        self.client = None;
    }

    /// The connection, reconnected (for up to 30 s: the cluster may be restarting) if closed.
    pub async fn get(&mut self) -> Result<&mut tokio_postgres::Client, String> {
        let mut last = String::new();
        if self
            .client
            .as_ref()
            .is_none_or(tokio_postgres::Client::is_closed)
        {
            self.client = None;
            for _ in 0..300 {
                match pg::connect(&self.url).await {
                    Ok(client) => {
                        self.client = Some(client);
                        break;
                    }
                    Err(e) => last = e,
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        match &mut self.client {
            Some(client) => Ok(client),
            None => Err(format!(
                "a PostgreSQL cell could not reconnect for 30 s: {last}"
            )),
        }
    }

    /// The keys of the committed records.
    pub async fn records(&mut self) -> Result<BTreeSet<u32>, String> {
        let rows = self
            .get()
            .await?
            .query("SELECT key FROM records", &[])
            .await
            .map_err(|e| format!("reading records: {e}"))?;
        Ok(rows.iter().map(|row| row.get::<_, i32>(0) as u32).collect())
    }
}

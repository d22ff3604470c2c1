//! [`SqliteLocalLeaseStore`]: a cell's own `leases_outstanding` table, for a cell whose local
//! database is SQLite.
//!
//! `record` writes through the caller's open `rusqlite::Transaction`, so the lease row commits
//! or rolls back with the application's rows; the other methods use the store's own connection
//! to the same file. Owns only that one table: it must not touch the application's tables, nor
//! the database's settings (journal mode and the like are the application's choice). Its own
//! connection commits with `synchronous=FULL`, a per-connection setting the application's
//! connection does not see (decision 073).

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};
use topology_claims::{
    ClaimsError, Clock, LeaseId, LocalLease, LocalLeaseStore, LocalLock, SystemClock, Timestamp,
};

use crate::connection::{check_path, SharedConnection, Synchronous, BUSY_TIMEOUT};
use crate::error::{open_error, retry, sqlite_to_claims, StoreError};
use crate::rows::{lease_id, lease_id_text};

/// The cell's `leases_outstanding` table (the design's local schema, with INTEGER unix-micro
/// timestamps), plus `topology_claims_locks`, where sidecars take turns (one reconciler per cell). Idempotent: put it in the application's migrations, or call
/// [`ensure_local_schema`].
pub const LOCAL_LEASES_DDL: &str = "\
CREATE TABLE IF NOT EXISTS leases_outstanding (
    lease_id   TEXT    NOT NULL PRIMARY KEY,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS leases_outstanding_by_created_at
    ON leases_outstanding (created_at);
CREATE TABLE IF NOT EXISTS topology_claims_locks (
    name       TEXT    NOT NULL PRIMARY KEY,
    holder     TEXT    NOT NULL,
    expires_at INTEGER NOT NULL
);
";

/// Creates the cell's `leases_outstanding` table and index if they do not exist.
pub fn ensure_local_schema(conn: &Connection) -> Result<(), ClaimsError> {
    conn.execute_batch(LOCAL_LEASES_DDL)
        .map_err(|e| sqlite_to_claims(&e))
}

/// A cell's `leases_outstanding` table in its SQLite database.
#[derive(Clone)]
pub struct SqliteLocalLeaseStore {
    conn: SharedConnection,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for SqliteLocalLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteLocalLeaseStore")
            .field("path", &self.conn.path())
            .finish_non_exhaustive()
    }
}

impl SqliteLocalLeaseStore {
    /// Opens its own connection to the cell's database at `path` (which must exist or be
    /// creatable) and ensures the table exists. Rows are stamped with the system clock.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, ClaimsError> {
        Self::open_with_clock(path, Arc::new(SystemClock)).await
    }

    /// [`open`](Self::open) with the clock that stamps `created_at` and `updated_at`.
    pub async fn open_with_clock(
        path: impl AsRef<Path>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, ClaimsError> {
        let path = path.as_ref().to_path_buf();
        let opened = path.clone();
        let conn = tokio::task::spawn_blocking(move || {
            check_path(&opened)?;
            let conn = Connection::open(&opened).map_err(|e| open_error(&opened, &e))?;
            conn.busy_timeout(BUSY_TIMEOUT)
                .map_err(|e| open_error(&opened, &e))?;
            // SQLite's default, stated so that a differently compiled SQLite cannot weaken it
            // (decision 073). What this connection writes is bookkeeping the reconciler redoes
            // if an OS crash loses it; the write that matters, `record`, commits on the
            // application's connection, with the application's setting.
            conn.pragma_update(None, "synchronous", Synchronous::Full.as_pragma())
                .map_err(|e| open_error(&opened, &e))?;
            // The first statement that reads the file: a non-database fails here, clearly.
            conn.execute_batch(LOCAL_LEASES_DDL)
                .map_err(|e| open_error(&opened, &e))?;
            Ok::<_, ClaimsError>(conn)
        })
        .await
        .map_err(|e| ClaimsError::internal(format!("SQLite open thread failed: {e}")))??;
        Ok(Self {
            conn: SharedConnection::new(conn, path),
            clock,
        })
    }

    /// The cell's database file.
    pub fn path(&self) -> &Path {
        self.conn.path()
    }

    /// [`LocalLeaseStore::record`] as a plain function, for callers that hold a (`!Send`)
    /// `rusqlite::Transaction` and must not await while they do.
    pub fn record_sync(
        &self,
        tx: &rusqlite::Transaction<'_>,
        lease_id: LeaseId,
    ) -> rusqlite::Result<()> {
        self.record_on(tx, lease_id)
    }

    /// [`record_sync`](Self::record_sync) on a connection whose transaction was opened with SQL
    /// (`BEGIN IMMEDIATE`) rather than as a `rusqlite::Transaction`.
    pub(crate) fn record_on(&self, conn: &Connection, lease_id: LeaseId) -> rusqlite::Result<()> {
        let now = self.clock.now().as_unix_micros();
        conn.prepare_cached(
            "INSERT INTO leases_outstanding (lease_id, created_at, updated_at) VALUES (?1, ?2, ?2) \
             ON CONFLICT(lease_id) DO NOTHING",
        )?
        .execute((lease_id_text(lease_id), now))
        .map(drop)
    }
}

impl LocalLock for SqliteLocalLeaseStore {
    async fn try_lock(&self, name: &str, holder: &str, ttl: Duration) -> Result<bool, ClaimsError> {
        let now = self.clock.now();
        let expires_at = now.saturating_add(ttl).as_unix_micros();
        let (name, holder) = (name.to_owned(), holder.to_owned());
        self.conn
            .run(move |conn| {
                retry(|| {
                    let changed = conn
                        .prepare_cached(
                            "INSERT INTO topology_claims_locks (name, holder, expires_at) VALUES (?1, ?2, ?3) \
                             ON CONFLICT(name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at \
                             WHERE topology_claims_locks.holder = excluded.holder OR topology_claims_locks.expires_at < ?4",
                        )?
                        .execute((&name, &holder, expires_at, now.as_unix_micros()))?;
                    Ok(changed > 0)
                })
            })
            .await
    }

    async fn unlock(&self, name: &str, holder: &str) -> Result<(), ClaimsError> {
        let (name, holder) = (name.to_owned(), holder.to_owned());
        self.conn
            .run(move |conn| {
                retry(|| {
                    conn.prepare_cached(
                        "DELETE FROM topology_claims_locks WHERE name = ?1 AND holder = ?2",
                    )?
                    .execute((&name, &holder))?;
                    Ok(())
                })
            })
            .await
    }
}

fn local_lease(id: &str, created_at: i64) -> Result<LocalLease, StoreError> {
    Ok(LocalLease {
        lease_id: lease_id("leases_outstanding (local)", id)?,
        created_at: Timestamp::from_unix_micros(created_at),
    })
}

impl LocalLeaseStore for SqliteLocalLeaseStore {
    type Tx<'t> = rusqlite::Transaction<'t>;

    /// Synchronous inside: a `rusqlite::Transaction` is `!Send`, so it cannot go to a blocking
    /// thread, and the caller is already running synchronous SQLite calls on this thread.
    async fn record(&self, tx: &mut Self::Tx<'_>, lease_id: LeaseId) -> Result<(), ClaimsError> {
        self.record_sync(tx, lease_id)
            .map_err(|e| sqlite_to_claims(&e))
    }

    async fn delete(&self, lease_id: LeaseId) -> Result<bool, ClaimsError> {
        self.conn
            .run(move |conn| {
                retry(|| {
                    let deleted = conn
                        .prepare_cached("DELETE FROM leases_outstanding WHERE lease_id = ?1")?
                        .execute([lease_id_text(lease_id)])?;
                    Ok(deleted > 0)
                })
            })
            .await
    }

    async fn find(&self, lease_ids: &[LeaseId]) -> Result<Vec<LocalLease>, ClaimsError> {
        let lease_ids = lease_ids.to_vec();
        self.conn
            .run(move |conn| {
                retry(|| {
                    // One snapshot for all the lookups.
                    let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
                    let mut select = tx.prepare_cached(
                        "SELECT lease_id, created_at FROM leases_outstanding WHERE lease_id = ?1",
                    )?;
                    let mut found = Vec::new();
                    for id in &lease_ids {
                        let row = select
                            .query_row([lease_id_text(*id)], |row| {
                                Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
                            })
                            .optional()?;
                        if let Some((id, created_at)) = row {
                            found.push(local_lease(&id, created_at)?);
                        }
                    }
                    drop(select);
                    tx.commit()?;
                    Ok(found)
                })
            })
            .await
    }

    async fn list_older_than(
        &self,
        before: Timestamp,
        limit: usize,
    ) -> Result<Vec<LocalLease>, ClaimsError> {
        self.conn
            .run(move |conn| {
                retry(|| {
                    let mut select = conn.prepare_cached(
                        "SELECT lease_id, created_at FROM leases_outstanding \
                         WHERE created_at < ?1 ORDER BY created_at, lease_id LIMIT ?2",
                    )?;
                    let rows = select
                        .query_map(
                            (
                                before.as_unix_micros(),
                                i64::try_from(limit).unwrap_or(i64::MAX),
                            ),
                            |row| Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?)),
                        )?
                        .collect::<rusqlite::Result<Vec<_>>>()?;
                    rows.iter()
                        .map(|(id, created_at)| local_lease(id, *created_at))
                        .collect()
                })
            })
            .await
    }
}

//! Opening the service's database file: path checks, the connection settings ([`SqliteOptions`]),
//! and the mutex that makes the one connection usable from async code through `spawn_blocking`.
//!
//! Owns every PRAGMA of the service's connection. Must not know any table.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::Connection;
use topology_claims::ClaimsError;

use crate::error::open_error;

/// How long a statement waits for another connection's lock before SQLite answers BUSY.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Refuses paths that cannot be a database file before SQLite is asked, so the message says
/// what is wrong instead of SQLite's generic "unable to open database file".
pub(crate) fn check_path(path: &Path) -> Result<(), ClaimsError> {
    let configuration = |message: String| Err(ClaimsError::Configuration { message });
    if path.as_os_str().is_empty() {
        return configuration("the SQLite database path is empty".to_owned());
    }
    if path.is_dir() {
        return configuration(format!(
            "{} is a directory, not a SQLite database file",
            path.display()
        ));
    }
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() && !dir.is_dir() => configuration(format!(
            "cannot create SQLite database {}: directory {} does not exist",
            path.display(),
            dir.display()
        )),
        _ => Ok(()),
    }
}

/// How the service's SQLite store is opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SqliteOptions {
    /// When a commit reaches the disk (default [`Synchronous::Full`]).
    pub synchronous: Synchronous,
}

/// SQLite's `PRAGMA synchronous` for the service's connection (in WAL mode): whether COMMIT
/// waits for the disk. Decision 073.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Synchronous {
    /// `FULL`: every commit fsyncs the WAL before COMMIT returns, so every answered write
    /// survives a crash of the process, of the OS, and a power loss. One disk flush per write
    /// transaction (a group-commit transaction carries many calls).
    #[default]
    Full,
    /// `NORMAL`: the WAL is fsynced only at checkpoints. An answered write survives a crash of
    /// the process, and the file is never corrupted, but a power loss or OS crash can roll back
    /// the last answered writes (leases begun, commits and rollbacks acknowledged).
    Normal,
}

impl Synchronous {
    /// The PRAGMA's value.
    pub fn as_pragma(self) -> &'static str {
        match self {
            Self::Full => "FULL",
            Self::Normal => "NORMAL",
        }
    }
}

/// Opens (creating if needed) and configures the service's connection.
pub(crate) fn open_service_connection(
    path: &Path,
    options: SqliteOptions,
) -> Result<Connection, ClaimsError> {
    check_path(path)?;
    let conn = Connection::open(path).map_err(|e| open_error(path, &e))?;
    configure(&conn, options).map_err(|e| open_error(path, &e))?;
    Ok(conn)
}

fn configure(conn: &Connection, options: SqliteOptions) -> rusqlite::Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // WAL: readers never block the writer and a commit appends to the log instead of rewriting
    // pages. It is also the first statement that reads the file, so a file that is not a
    // database fails here (NotADatabase) rather than in the first request.
    let mode = switch_to_wal(conn)?;
    if !mode.eq_ignore_ascii_case("wal") {
        // In-memory databases answer "memory"; they have no file to be durable in anyway.
        tracing::warn!(journal_mode = %mode, "SQLite did not switch to WAL");
    }
    // Durability (decision 073). An OK answer is a promise the cell acts on: after CommitUpdate
    // it deletes its lease row, so a commit the store forgets comes back as a lease the
    // reconciler rolls back, releasing a claim the cell's record still holds. FULL (the default)
    // fsyncs the WAL at every commit, so the promise survives an OS crash or a power loss;
    // NORMAL (opt-in) only a crash of this process. Set explicitly, never left to how SQLite
    // was compiled.
    conn.pragma_update(None, "synchronous", options.synchronous.as_pragma())?;
    // Enforces claims.lease_id -> leases_outstanding: SQLite checks foreign keys only when asked.
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(())
}

/// `PRAGMA journal_mode = WAL`, retried while another connection holds the lock the switch
/// needs: SQLite answers that BUSY without waiting for `busy_timeout` when processes open a new
/// file at the same time (several servers starting together).
fn switch_to_wal(conn: &Connection) -> rusqlite::Result<String> {
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    loop {
        match conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0)) {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// The one connection, shared by clones of a store. A `std` mutex, locked only on a blocking
/// thread for the span of one transaction, behind a first-come-first-served turn taken in async
/// code: callers reach the connection in the order they asked, and a waiting caller holds no
/// blocking thread. (A `std` mutex alone lets a newcomer overtake a woken waiter, so a small
/// call could wait behind several large transactions; issue 34.)
#[derive(Clone)]
pub(crate) struct SharedConnection {
    conn: Arc<Mutex<Connection>>,
    turn: Arc<tokio::sync::Mutex<()>>,
    path: Arc<PathBuf>,
}

impl SharedConnection {
    pub(crate) fn new(conn: Connection, path: PathBuf) -> Self {
        Self {
            conn: Arc::new(Mutex::new(conn)),
            turn: Arc::new(tokio::sync::Mutex::new(())),
            path: Arc::new(path),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `work` with the connection on a blocking thread. If the caller's future is dropped
    /// (a cancelled request), `work` still runs to the end: a transaction is never cut in half,
    /// and every operation is safe for the client to retry.
    pub(crate) async fn run<T, F>(&self, work: F) -> Result<T, ClaimsError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, ClaimsError> + Send + 'static,
    {
        let conn = Arc::clone(&self.conn);
        // Tokio's mutex queues its waiters in order. The turn moves into the blocking closure,
        // so it is held until the transaction ends even if the caller goes away.
        let turn = Arc::clone(&self.turn).lock_owned().await;
        tokio::task::spawn_blocking(move || {
            let _turn = turn;
            work(&mut lock(&conn))
        })
        .await
        .map_err(|e| ClaimsError::internal(format!("SQLite worker thread failed: {e}")))?
    }
}

fn lock(conn: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    // A panic while the lock was held unwound through rusqlite's Transaction, whose drop rolls
    // back, so the connection itself is sound: take it back from the poisoned mutex.
    let guard = conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if !guard.is_autocommit() {
        // Belt and braces: never start a request inside a transaction a failed one left open.
        if let Err(error) = guard.execute_batch("ROLLBACK") {
            tracing::warn!(%error, "could not roll back a transaction left open");
        }
    }
    guard
}

#[cfg(test)]
mod tests {
    use super::*;

    fn synchronous_of(conn: &Connection) -> i64 {
        conn.pragma_query_value(None, "synchronous", |row| row.get(0))
            .unwrap()
    }

    #[test]
    fn the_service_connection_is_full_by_default_and_normal_only_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("claims.db");
        // SQLite's numbers: 1 NORMAL, 2 FULL.
        let default = open_service_connection(&path, SqliteOptions::default()).unwrap();
        assert_eq!(synchronous_of(&default), 2);
        let normal = SqliteOptions {
            synchronous: Synchronous::Normal,
        };
        assert_eq!(
            synchronous_of(&open_service_connection(&path, normal).unwrap()),
            1
        );
    }
}

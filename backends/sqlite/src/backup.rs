//! Online backups of the SQLite store, and their restore (`topology-claims backup` /
//! `restore`; docs/operations.md, "Disaster recovery").
//!
//! A backup is `VACUUM INTO` from a read-only connection: one read transaction, so the copy is
//! a consistent snapshot of the store at one commit, taken while `serve` keeps writing (WAL
//! readers never block writers, and a busy store never makes it start over, as the page-by-page
//! backup API would). It is written to `TO.partial`, created exclusively (never through a
//! symlink, never a file the backup did not make), checked (integrity, the schema's migrations),
//! synced and hard-linked as `TO`, which fails if anything is there: a crash never leaves a
//! partial file under the backup's name, and nothing is ever overwritten, even a file created
//! at `TO` while the backup ran. A restore checks the backup the same way, takes the store's
//! lock exclusively (refused while a `serve` uses the store, `lock`), then replaces the store
//! file atomically and removes the old store's `-wal` and `-shm` (SQLite would otherwise replay
//! the old write-ahead log onto the restored file).
//!
//! Owns the files. Must not decide what a restore means for the claims (the restore epoch).

use std::fs::File;
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};

use crate::lock::StoreLock;

/// What a backup holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupSummary {
    pub path: PathBuf,
    pub bytes: u64,
    /// Rows of `claims` (active and leased).
    pub claims: i64,
    /// Outstanding leases.
    pub leases: i64,
    /// The newest schema migration applied, e.g. `0005_restore_epochs`.
    pub schema: String,
}

impl std::fmt::Display for BackupSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} bytes, {} claims, {} outstanding leases, schema {}",
            self.path.display(),
            self.bytes,
            self.claims,
            self.leases,
            self.schema
        )
    }
}

/// Writes a consistent copy of the store at `store` to `to`, which must not exist.
pub async fn backup(store: &Path, to: &Path) -> Result<BackupSummary, String> {
    let (store, to) = (store.to_path_buf(), to.to_path_buf());
    tokio::task::spawn_blocking(move || backup_blocking(&store, &to))
        .await
        .map_err(|e| format!("the backup task failed: {e}"))?
}

/// Replaces the store at `store` with the backup at `from`. With the store present, `replace`
/// must be set (every `serve` using it must be stopped first).
pub async fn restore(from: &Path, store: &Path, replace: bool) -> Result<BackupSummary, String> {
    let (from, store) = (from.to_path_buf(), store.to_path_buf());
    tokio::task::spawn_blocking(move || restore_blocking(&from, &store, replace))
        .await
        .map_err(|e| format!("the restore task failed: {e}"))?
}

fn backup_blocking(store: &Path, to: &Path) -> Result<BackupSummary, String> {
    // symlink_metadata: a symlink at the target, dangling or not, is a name that exists.
    if std::fs::symlink_metadata(to).is_ok() {
        return Err(format!(
            "backup target {} exists; backups are never overwritten: choose a new file",
            to.display()
        ));
    }
    if !store.exists() {
        return Err(format!("store {} does not exist", store.display()));
    }
    summarize(store).map_err(|e| format!("store {}: {e}", store.display()))?;
    let partial = sibling(to, "partial")?;
    // Created here, exclusively (O_EXCL: never through a symlink, never someone else's file),
    // so every later removal removes only what this backup made. VACUUM INTO fills an empty file.
    if let Err(e) = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&partial)
    {
        return Err(if e.kind() == std::io::ErrorKind::AlreadyExists {
            format!(
                "{} exists: another backup to {} is running, or one crashed; check, remove it, \
                 and run the backup again",
                partial.display(),
                to.display()
            )
        } else {
            format!("cannot create {}: {e}", partial.display())
        });
    }
    let copied = (|| {
        let conn = Connection::open_with_flags(store, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        conn.busy_timeout(std::time::Duration::from_secs(30))?;
        let target = partial
            .to_str()
            .ok_or_else(|| rusqlite::Error::InvalidPath(partial.clone()))?;
        conn.execute("VACUUM INTO ?1", [target])?;
        Ok::<_, rusqlite::Error>(())
    })();
    if let Err(e) = copied {
        let _ = std::fs::remove_file(&partial);
        return Err(format!(
            "copying {} to {}: {e}",
            store.display(),
            partial.display()
        ));
    }
    let summary = match summarize(&partial) {
        Ok(summary) => summary,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(format!("the copy {} is not sound: {e}", partial.display()));
        }
    };
    if let Err(e) = sync_and_link(&partial, to) {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    Ok(BackupSummary {
        path: to.to_path_buf(),
        ..summary
    })
}

fn restore_blocking(from: &Path, store: &Path, replace: bool) -> Result<BackupSummary, String> {
    let summary = summarize(from).map_err(|e| format!("backup {}: {e}", from.display()))?;
    if store.exists() && !replace {
        return Err(format!(
            "store {} exists; restoring replaces it: stop every `serve` using it, then pass --replace",
            store.display()
        ));
    }
    // Held until the restored file is in place: no server uses the store meanwhile.
    let _restoring = StoreLock::exclusive(store)?;
    let incoming = sibling(store, "restoring")?;
    let _ = std::fs::remove_file(&incoming);
    std::fs::copy(from, &incoming)
        .map_err(|e| format!("copying {} to {}: {e}", from.display(), incoming.display()))?;
    // Before the old log is removed: the old store's head may be in it.
    let old_head = crate::watch::head_of(store);
    if let Err(e) = crate::watch::fence_watchers(&incoming, old_head) {
        let _ = std::fs::remove_file(&incoming);
        return Err(format!("{}: {e}", incoming.display()));
    }
    // The old store's write-ahead log must not be replayed onto the restored file.
    for suffix in ["-wal", "-shm", "-journal"] {
        let mut name = store.as_os_str().to_owned();
        name.push(suffix);
        match std::fs::remove_file(PathBuf::from(&name)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                let _ = std::fs::remove_file(&incoming);
                return Err(format!("removing {}: {e}", PathBuf::from(name).display()));
            }
        }
    }
    sync_and_rename(&incoming, store)?;
    Ok(BackupSummary {
        path: store.to_path_buf(),
        ..summary
    })
}

/// `path` with `.SUFFIX` added, in the same directory (so a rename is atomic).
pub(crate) fn sibling(path: &Path, suffix: &str) -> Result<PathBuf, String> {
    let name = path
        .file_name()
        .ok_or_else(|| format!("{} names no file", path.display()))?;
    let mut name = name.to_owned();
    name.push(format!(".{suffix}"));
    Ok(path.with_file_name(name))
}

/// fsyncs `from`, renames it to `to` and fsyncs the directory: the file is whole under its
/// final name, or not there.
fn sync_and_rename(from: &Path, to: &Path) -> Result<(), String> {
    let sync = |path: &Path| File::open(path).and_then(|f| f.sync_all());
    sync(from).map_err(|e| format!("syncing {}: {e}", from.display()))?;
    std::fs::rename(from, to)
        .map_err(|e| format!("renaming {} to {}: {e}", from.display(), to.display()))?;
    sync_dir(to)
}

/// fsyncs `from`, links it as `to` (which fails if anything, a symlink included, is at `to`:
/// never an overwrite, even of a file created while the backup ran), removes `from` and fsyncs
/// the directory.
pub(crate) fn sync_and_link(from: &Path, to: &Path) -> Result<(), String> {
    File::open(from)
        .and_then(|f| f.sync_all())
        .map_err(|e| format!("syncing {}: {e}", from.display()))?;
    std::fs::hard_link(from, to).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            format!(
                "backup target {} appeared while the backup ran; backups are never overwritten: \
                 choose a new file",
                to.display()
            )
        } else {
            format!("linking {} as {}: {e}", from.display(), to.display())
        }
    })?;
    std::fs::remove_file(from).map_err(|e| format!("removing {}: {e}", from.display()))?;
    sync_dir(to)
}

fn sync_dir(path: &Path) -> Result<(), String> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| format!("syncing directory {}: {e}", dir.display()))
}

/// Checks that `path` is a sound topology-claims store and says what it holds.
pub(crate) fn summarize(path: &Path) -> Result<BackupSummary, String> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| format!("cannot open: {e}"))?;
    conn.busy_timeout(std::time::Duration::from_secs(30))
        .map_err(|e| e.to_string())?;
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .map_err(|e| format!("not a SQLite database: {e}"))?;
    if integrity != "ok" {
        return Err(format!("integrity check failed: {integrity}"));
    }
    let schema: String = conn
        .query_row(
            "SELECT name FROM schema_migrations ORDER BY version DESC LIMIT 1",
            [],
            |row| row.get(0),
        )
        .map_err(|e| format!("not a topology-claims store (no schema migrations: {e})"))?;
    let count = |table: &str| {
        conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |row| {
            row.get::<_, i64>(0)
        })
        .map_err(|e| format!("not a topology-claims store (reading {table}: {e})"))
    };
    Ok(BackupSummary {
        path: path.to_path_buf(),
        bytes: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
        claims: count("claims")?,
        leases: count("leases_outstanding")?,
        schema,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_copy_never_replaces_a_name_that_appeared_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let (partial, to) = (dir.path().join("b.db.partial"), dir.path().join("b.db"));
        std::fs::write(&partial, b"copy").unwrap();
        std::fs::write(&to, b"someone else's").unwrap();
        let refused = sync_and_link(&partial, &to).unwrap_err();
        assert!(
            refused.contains("appeared while the backup ran"),
            "{refused}"
        );
        assert_eq!(std::fs::read(&to).unwrap(), b"someone else's");
        #[cfg(unix)]
        {
            let link = dir.path().join("c.db");
            std::os::unix::fs::symlink(dir.path().join("nowhere"), &link).unwrap();
            assert!(sync_and_link(&partial, &link).is_err());
            assert!(
                !dir.path().join("nowhere").exists(),
                "the symlink was followed"
            );
        }
    }
}

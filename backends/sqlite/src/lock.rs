//! Who uses a store file: every process that opens the store (`serve`, `migrate`) holds a
//! shared advisory lock (flock) on `STORE.lock` for as long as it has the store open, and
//! `restore` takes it exclusively, without waiting. So a restore refuses a store that a running
//! server uses (it would delete the live server's `-wal`, and the server would acknowledge
//! writes that vanish), and a server cannot open a store while a restore replaces it.
//!
//! A lock file of its own, not SQLite's locks on the database file: SQLite's are POSIX record
//! locks, which a process loses when it closes *any* descriptor of that file. The lock dies with
//! its process, so a crashed server never leaves it behind.
//!
//! Owns the lock file only; what the store does under it is `store`'s and `backup`'s.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

/// A held lock on a store's lock file, released when dropped (or when the process ends).
#[derive(Debug)]
pub struct StoreLock {
    _file: File,
    path: PathBuf,
}

/// `STORE.lock`, beside the store.
pub fn lock_path(store: &Path) -> PathBuf {
    let mut name = store.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

fn open(store: &Path) -> Result<(File, PathBuf), String> {
    let path = lock_path(store);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| format!("cannot open the store's lock file {}: {e}", path.display()))?;
    Ok((file, path))
}

impl StoreLock {
    /// The lock of a process that uses the store; refused while a restore replaces it.
    pub fn shared(store: &Path) -> Result<StoreLock, String> {
        let (file, path) = open(store)?;
        match file.try_lock_shared() {
            Ok(()) => Ok(StoreLock { _file: file, path }),
            Err(TryLockError::WouldBlock) => Err(format!(
                "store {} is being restored (a `restore` holds {}): start again once it is done",
                store.display(),
                path.display()
            )),
            Err(TryLockError::Error(e)) => Err(format!("cannot lock {}: {e}", path.display())),
        }
    }

    /// The lock of a restore; refused while any process uses the store.
    pub fn exclusive(store: &Path) -> Result<StoreLock, String> {
        let (file, path) = open(store)?;
        match file.try_lock() {
            Ok(()) => Ok(StoreLock { _file: file, path }),
            Err(TryLockError::WouldBlock) => Err(format!(
                "store {} is in use: a running `serve` (or `migrate`) holds {}; stop every \
                 process using the store, then restore",
                store.display(),
                path.display()
            )),
            Err(TryLockError::Error(e)) => Err(format!("cannot lock {}: {e}", path.display())),
        }
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_share_and_a_restore_excludes_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("claims.db");
        let first = StoreLock::shared(&store).unwrap();
        let second = StoreLock::shared(&store).unwrap();
        let refused = StoreLock::exclusive(&store).unwrap_err();
        assert!(refused.contains("in use"), "{refused}");
        drop((first, second));
        let restoring = StoreLock::exclusive(&store).unwrap();
        let refused = StoreLock::shared(&store).unwrap_err();
        assert!(refused.contains("being restored"), "{refused}");
        drop(restoring);
        StoreLock::shared(&store).unwrap();
    }
}

//! The adapter's private error and its one conversion to the public [`ClaimsError`], plus the
//! bounded retry of whole transactions.
//!
//! Owns the classification of SQLite failures (retry / unavailable / configuration / internal).
//! Must not decide protocol questions: a domain refusal passes through unchanged.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rusqlite::ErrorCode;
use topology_claims::ClaimsError;

/// How often a transaction is attempted before contention is reported as `Unavailable`.
/// Every BUSY already waited up to `busy_timeout` inside SQLite, so few attempts suffice; the
/// retry exists for the BUSY answers SQLite gives without waiting and for write conflicts.
pub(crate) const MAX_ATTEMPTS: u32 = 4;

/// Why one attempt of a store operation failed.
#[derive(Debug)]
pub(crate) enum StoreError {
    /// A protocol answer (from the domain) or an already-classified error: returned as is.
    Claims(ClaimsError),
    /// SQLite said no.
    Sqlite(rusqlite::Error),
    /// A conditional write matched no row although the rows read in the same transaction said
    /// it would: the second line of defence fired. Re-running the whole transaction re-reads the
    /// rows, so the domain gives the real answer (or this repeats and becomes `Internal`).
    Conflict(String),
}

impl From<ClaimsError> for StoreError {
    fn from(error: ClaimsError) -> Self {
        Self::Claims(error)
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(error: rusqlite::Error) -> Self {
        Self::Sqlite(error)
    }
}

impl StoreError {
    /// Whether re-running the whole transaction may succeed.
    fn is_retryable(&self) -> bool {
        match self {
            Self::Claims(_) => false,
            Self::Conflict(_) => true,
            Self::Sqlite(error) => matches!(
                error.sqlite_error_code(),
                // BUSY/LOCKED: another connection (another process) holds the write lock.
                // ConstraintViolation: a primary key, foreign key or CHECK refused a write the
                // domain allowed; only a concurrent writer outside this store could cause it.
                Some(
                    ErrorCode::DatabaseBusy
                        | ErrorCode::DatabaseLocked
                        | ErrorCode::ConstraintViolation
                )
            ),
        }
    }

    /// The public error, once retrying is over.
    pub(crate) fn into_claims(self) -> ClaimsError {
        match self {
            Self::Claims(error) => error,
            Self::Conflict(message) => ClaimsError::internal(format!(
                "the store's rows changed under a write transaction {MAX_ATTEMPTS} times: {message}"
            )),
            Self::Sqlite(error) => sqlite_to_claims(&error),
        }
    }
}

/// Classifies a SQLite error that is not retried (or no longer).
pub(crate) fn sqlite_to_claims(error: &rusqlite::Error) -> ClaimsError {
    match error.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => ClaimsError::unavailable(
            format!("SQLite database is locked by another connection: {error}"),
        ),
        // The file cannot be read or written right now (disk, permissions, full, gone): an
        // operator can fix it and the service then works again, so callers should retry later.
        Some(
            ErrorCode::SystemIoFailure
            | ErrorCode::CannotOpen
            | ErrorCode::DiskFull
            | ErrorCode::ReadOnly
            | ErrorCode::PermissionDenied
            | ErrorCode::FileLockingProtocolFailed
            | ErrorCode::OutOfMemory,
        ) => ClaimsError::unavailable(format!("SQLite I/O error: {error}")),
        _ => ClaimsError::internal(format!("SQLite: {error}")),
    }
}

/// Classifies an error met while opening and configuring the file at `path`, where a wrong path
/// or a file that is not a database is a configuration mistake, not an outage.
pub(crate) fn open_error(path: &Path, error: &rusqlite::Error) -> ClaimsError {
    match error.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => ClaimsError::Configuration {
            message: format!("{} is not a SQLite database", path.display()),
        },
        Some(ErrorCode::CannotOpen) => ClaimsError::Configuration {
            message: format!("cannot open SQLite database {}: {error}", path.display()),
        },
        _ => match sqlite_to_claims(error) {
            ClaimsError::Unavailable { message } => ClaimsError::Unavailable {
                message: format!("{}: {message}", path.display()),
            },
            ClaimsError::Internal { message } => ClaimsError::Internal {
                message: format!("{}: {message}", path.display()),
            },
            other => other,
        },
    }
}

/// Runs `attempt` until it succeeds, fails for good, or [`MAX_ATTEMPTS`] are used up. Called on
/// a blocking thread, so the short back-off sleeps that thread, never an async worker.
pub(crate) fn retry<T>(attempt: impl FnMut() -> Result<T, StoreError>) -> Result<T, ClaimsError> {
    retry_counted(&AtomicU64::new(0), attempt)
}

/// [`retry`], adding each re-run to `retries` (the store's `ClaimStore::retries`).
pub(crate) fn retry_counted<T>(
    retries: &AtomicU64,
    mut attempt: impl FnMut() -> Result<T, StoreError>,
) -> Result<T, ClaimsError> {
    let mut tries = 0;
    loop {
        tries += 1;
        match attempt() {
            Ok(value) => return Ok(value),
            Err(error) if tries < MAX_ATTEMPTS && error.is_retryable() => {
                tracing::debug!(?error, tries, "retrying SQLite transaction");
                retries.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5 << tries));
            }
            Err(error) => return Err(error.into_claims()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rerun_is_counted_and_a_refusal_is_not() {
        let retries = AtomicU64::new(0);
        let mut failures = 2;
        let value = retry_counted(&retries, || {
            if failures > 0 {
                failures -= 1;
                return Err(StoreError::Conflict("a concurrent writer".into()));
            }
            Ok(7)
        });
        assert_eq!(value.unwrap(), 7);
        assert_eq!(retries.load(Ordering::Relaxed), 2);

        let refused: Result<(), _> = retry_counted(&retries, || {
            Err(StoreError::Claims(ClaimsError::internal("not retryable")))
        });
        assert!(refused.is_err());
        assert_eq!(
            retries.load(Ordering::Relaxed),
            2,
            "a refusal is not re-run"
        );
    }
}

//! How PostgreSQL and pool errors become the core's [`ClaimsError`], and which of them make the
//! adapter retry a whole transaction.
//!
//! Owns the classification only (SQLSTATE → retry / unavailable / internal); it must not decide
//! protocol questions: refusals come from the domain, never from an SQL error.

use deadpool_postgres::{PoolError, TimeoutType};
use tokio_postgres::error::SqlState;
use topology_claims::ClaimsError;

/// Raised by `topology_claims_expect_rows` (migration 0001) when a conditional write touched
/// another number of rows than the domain decided: a lost race, retried like contention.
const ROW_COUNT_MISMATCH: &str = "TC001";

/// Why one attempt of a store transaction did not produce an answer.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The answer: a domain refusal, `Unavailable` or `Internal`. Returned as is.
    Final(ClaimsError),
    /// Lost a race inside the database (unique violation of two creators of an absent key,
    /// serialization failure, deadlock, conditional write mismatch) or found PostgreSQL's
    /// shared lock table full for a moment: retry the whole transaction; the re-read rows then
    /// give the domain's answer.
    Contention { text: String, cause: Contended },
    /// The connection broke mid-attempt (terminated backend, server restart, network). Safe to
    /// retry on a fresh connection: every operation is idempotent under its fixed lease id.
    ConnectionLost(String),
}

/// What a retried attempt ran into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Contended {
    /// Another transaction won (unique violation, serialization failure, TC001).
    Race,
    /// PostgreSQL broke a deadlock by aborting this transaction.
    Deadlock,
    /// "out of shared memory" (53200): the shared lock table was full. Every transaction of the
    /// store holds a bounded number of locks (`locks.rs`) and gives them back when it ends, so
    /// a later attempt finds room; an operator sees it in the log and sizes the lock table
    /// (docs/backends/postgres.md, "Lock budget").
    LockTableFull,
}

impl From<ClaimsError> for Failure {
    fn from(error: ClaimsError) -> Self {
        Failure::Final(error)
    }
}

impl From<tokio_postgres::Error> for Failure {
    fn from(error: tokio_postgres::Error) -> Self {
        classify(&error)
    }
}

/// Classifies a driver error.
pub(crate) fn classify(error: &tokio_postgres::Error) -> Failure {
    let text = describe(error);
    if let Some(code) = error.code() {
        return classify_sqlstate(code, text);
    }
    if error.is_closed() || io_cause(error) {
        return Failure::ConnectionLost(text);
    }
    Failure::Final(ClaimsError::internal(format!(
        "PostgreSQL client error: {text}"
    )))
}

/// Classifies an error the server sent with SQLSTATE `code`, described by `text`.
fn classify_sqlstate(code: &SqlState, text: String) -> Failure {
    let cause = if [
        SqlState::UNIQUE_VIOLATION,
        SqlState::T_R_SERIALIZATION_FAILURE,
    ]
    .contains(code)
        || code.code() == ROW_COUNT_MISMATCH
    {
        Some(Contended::Race)
    } else if code == &SqlState::T_R_DEADLOCK_DETECTED {
        Some(Contended::Deadlock)
    } else if code == &SqlState::OUT_OF_MEMORY {
        // 53200 is what PostgreSQL raises for a full lock table ("out of shared memory",
        // hint: increase max_locks_per_transaction).
        Some(Contended::LockTableFull)
    } else {
        None
    };
    if let Some(cause) = cause {
        return Failure::Contention { text, cause };
    }
    if code == &SqlState::QUERY_CANCELED {
        // statement_timeout: the database is overloaded or blocked; the client may retry.
        return Failure::Final(ClaimsError::unavailable(format!(
            "PostgreSQL cancelled a statement (statement timeout): {text}"
        )));
    }
    let class = &code.code()[..2];
    if class == "08"
        || [
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
        ]
        .contains(code)
    {
        return Failure::ConnectionLost(text);
    }
    if class == "53" || class == "58" {
        // insufficient resources (too many connections, disk full) / system errors
        return Failure::Final(ClaimsError::unavailable(format!("PostgreSQL: {text}")));
    }
    Failure::Final(ClaimsError::internal(format!("PostgreSQL error: {text}")))
}

/// A driver error as one line, with its SQLSTATE when the server sent one.
pub(crate) fn describe(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        // The driver's Display names only the kind ("error connecting to server"); the why
        // ("Connection refused") is in the source chain.
        None => topology_claims::error::error_chain(error),
    }
}

fn io_cause(error: &tokio_postgres::Error) -> bool {
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if cause.is::<std::io::Error>() {
            return true;
        }
        source = cause.source();
    }
    false
}

/// A pool error as `Unavailable` (the pool already waited `connect_timeout`), naming `target`.
pub(crate) fn pool_error(error: PoolError, target: &str) -> ClaimsError {
    match error {
        PoolError::Timeout(TimeoutType::Wait) => ClaimsError::unavailable(format!(
            "no free connection to PostgreSQL at {target} within the connect timeout \
             (all pooled connections busy; raise the pool size?)"
        )),
        PoolError::Timeout(TimeoutType::Create) => {
            ClaimsError::unavailable(format!("connecting to PostgreSQL at {target} timed out"))
        }
        PoolError::Timeout(TimeoutType::Recycle) => ClaimsError::unavailable(format!(
            "checking a pooled connection to PostgreSQL at {target} timed out"
        )),
        PoolError::Backend(e) => ClaimsError::unavailable(format!(
            "cannot connect to PostgreSQL at {target}: {}",
            describe(&e)
        )),
        PoolError::Closed => {
            ClaimsError::unavailable(format!("the connection pool to {target} is closed"))
        }
        other => ClaimsError::internal(format!("connection pool for {target}: {other}")),
    }
}

/// A driver error outside the retried transactions (migrations, local store) as a final error.
pub(crate) fn final_error(error: &tokio_postgres::Error, target: &str, doing: &str) -> ClaimsError {
    match classify(error) {
        Failure::Final(ClaimsError::Internal { message }) => {
            ClaimsError::internal(format!("{doing}: {message}"))
        }
        Failure::Final(e) => e,
        Failure::Contention { text, .. } => ClaimsError::unavailable(format!(
            "{doing} on PostgreSQL at {target} lost a race; retry: {text}"
        )),
        Failure::ConnectionLost(text) => ClaimsError::unavailable(format!(
            "{doing}: lost the connection to PostgreSQL at {target}: {text}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classified(code: &str) -> Failure {
        classify_sqlstate(&SqlState::from_code(code), format!("text of {code}"))
    }

    fn contended(code: &str) -> Option<Contended> {
        match classified(code) {
            Failure::Contention { cause, .. } => Some(cause),
            _ => None,
        }
    }

    #[test]
    fn lost_races_deadlocks_and_a_full_lock_table_are_retried() {
        assert_eq!(
            contended("23505"),
            Some(Contended::Race),
            "unique violation"
        );
        assert_eq!(
            contended("40001"),
            Some(Contended::Race),
            "serialization failure"
        );
        assert_eq!(
            contended("TC001"),
            Some(Contended::Race),
            "row count mismatch"
        );
        assert_eq!(contended("40P01"), Some(Contended::Deadlock));
        assert_eq!(
            contended("53200"),
            Some(Contended::LockTableFull),
            "out of shared memory"
        );
    }

    #[test]
    fn other_resource_shortages_and_timeouts_are_unavailable_at_once() {
        for code in ["53300", "53100", "57014", "58030"] {
            assert!(
                matches!(
                    classified(code),
                    Failure::Final(ClaimsError::Unavailable { .. })
                ),
                "{code}"
            );
        }
    }

    #[test]
    fn broken_connections_are_retried_on_a_fresh_one_and_the_rest_is_internal() {
        for code in ["08006", "57P01", "57P03"] {
            assert!(
                matches!(classified(code), Failure::ConnectionLost(_)),
                "{code}"
            );
        }
        assert!(matches!(
            classified("42601"),
            Failure::Final(ClaimsError::Internal { .. })
        ));
    }
}

//! The adapter's private errors and their one conversion to the public [`ClaimsError`].
//!
//! Owns the classification of Spanner failures: retry the transaction (aborted, lost session,
//! a second-line constraint that fired), `Unavailable` (cannot reach or use the database), or
//! `Internal` (anything unexpected). Must not decide protocol questions: domain refusals are
//! values, never errors of this module.

use gcloud_gax::grpc::{Code, Status};
use gcloud_gax::retry::TryAs;
use gcloud_spanner::client::Error as ClientError;
use gcloud_spanner::session::SessionError;
use topology_claims::ClaimsError;

/// Why one attempt of a store transaction failed.
#[derive(Debug)]
pub(crate) enum TxError {
    /// An RPC failed; classified by [`classify`] (and retried or not) once the attempt ended.
    Status(Status),
    /// An already classified error (a row that does not decode, a session pool timeout, …).
    Claims(ClaimsError),
}

impl From<Status> for TxError {
    fn from(status: Status) -> Self {
        Self::Status(status)
    }
}

impl From<ClaimsError> for TxError {
    fn from(error: ClaimsError) -> Self {
        Self::Claims(error)
    }
}

impl From<ClientError> for TxError {
    fn from(error: ClientError) -> Self {
        match error {
            ClientError::GRPC(status) => Self::Status(status),
            ClientError::InvalidSession(SessionError::GRPC(status)) => Self::Status(status),
            other => Self::Claims(client_error("Spanner", &other)),
        }
    }
}

impl From<gcloud_spanner::row::Error> for TxError {
    fn from(error: gcloud_spanner::row::Error) -> Self {
        Self::Claims(ClaimsError::internal(format!(
            "unexpected Spanner row: {error}"
        )))
    }
}

/// gcloud-spanner's `ReadWriteTransaction::end` looks at the status to decide between rolling
/// back (any error but `Aborted`) and leaving an aborted transaction alone.
impl TryAs<Status> for TxError {
    fn try_as(&self) -> Option<&Status> {
        match self {
            Self::Status(status) => Some(status),
            Self::Claims(_) => None,
        }
    }
}

/// What to do about a failed RPC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Spanner aborted the transaction (lock contention, wound-wait, the emulator's one
    /// transaction at a time): nothing was written; run the whole transaction again.
    Aborted,
    /// The session is gone (expired, or the server restarted); gcloud-spanner has evicted it,
    /// so a new attempt runs on another session.
    SessionLost,
    /// A mutation's own check fired at commit (insert of an existing row, update of a missing
    /// one): the rows changed after the transaction read them, which Spanner's locking rules out.
    /// Re-running re-reads the rows so the domain decides again; a few times, then `Internal`.
    Constraint,
    /// Spanner cannot be reached or used right now.
    Unavailable,
    /// Anything else.
    Internal,
}

pub(crate) fn classify(status: &Status) -> Failure {
    let message = status.message();
    match status.code() {
        Code::Aborted => Failure::Aborted,
        Code::NotFound if message.contains("Session not found") => Failure::SessionLost,
        Code::NotFound if is_missing_resource(message) => Failure::Unavailable,
        Code::NotFound | Code::AlreadyExists => Failure::Constraint,
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::ResourceExhausted => {
            Failure::Unavailable
        }
        _ => Failure::Internal,
    }
}

/// A NotFound about the database or instance itself (not about a row).
fn is_missing_resource(message: &str) -> bool {
    [
        "Database not found",
        "Instance not found",
        "database not found",
        "instance not found",
    ]
    .iter()
    .any(|needle| message.contains(needle))
}

/// The public error for a status that is not (or no longer) retried.
pub(crate) fn status_error(context: &str, status: &Status) -> ClaimsError {
    let described = format!("{context}: {} ({:?})", status.message(), status.code());
    match classify(status) {
        Failure::Unavailable => ClaimsError::unavailable(described),
        Failure::Aborted | Failure::SessionLost => ClaimsError::unavailable(described),
        Failure::Constraint | Failure::Internal => ClaimsError::internal(described),
    }
}

/// The public error for a gcloud-spanner client error.
pub(crate) fn client_error(context: &str, error: &ClientError) -> ClaimsError {
    match error {
        ClientError::GRPC(status) => status_error(context, status),
        ClientError::InvalidSession(SessionError::GRPC(status)) => status_error(context, status),
        ClientError::InvalidSession(SessionError::SessionGetTimeout) => ClaimsError::unavailable(
            format!("{context}: no Spanner session became free in time (pool exhausted or Spanner unreachable)"),
        ),
        ClientError::InvalidSession(SessionError::FailedToCreateSession) => {
            ClaimsError::unavailable(format!("{context}: could not create a Spanner session"))
        }
        ClientError::Connection(e) => {
            ClaimsError::unavailable(format!("{context}: cannot connect to Spanner: {e}"))
        }
        ClientError::InvalidConfig(message) => {
            ClaimsError::Configuration { message: format!("{context}: {message}") }
        }
        ClientError::ParseError(e) => ClaimsError::internal(format!("{context}: {e}")),
    }
}

/// The public error of a failed attempt that is not retried.
pub(crate) fn tx_error(context: &str, error: TxError) -> ClaimsError {
    match error {
        TxError::Status(status) => status_error(context, &status),
        TxError::Claims(error) => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_classified_by_code_and_subject() {
        let cases = [
            (Status::aborted("Transaction aborted"), Failure::Aborted),
            (
                Status::not_found("Session not found: projects/p/.../sessions/s"),
                Failure::SessionLost,
            ),
            (
                Status::not_found("Database not found: projects/p/instances/i/databases/d"),
                Failure::Unavailable,
            ),
            (
                Status::not_found("Row [1,x] in table claims is missing. Row cannot be updated."),
                Failure::Constraint,
            ),
            (
                Status::already_exists("Row [1,x] in table claims already exists"),
                Failure::Constraint,
            ),
            (
                Status::unavailable("connection refused"),
                Failure::Unavailable,
            ),
            (Status::cancelled("Timeout expired"), Failure::Unavailable),
            (Status::deadline_exceeded("deadline"), Failure::Unavailable),
            (Status::invalid_argument("bad SQL"), Failure::Internal),
            (Status::permission_denied("no"), Failure::Internal),
        ];
        for (status, expected) in cases {
            assert_eq!(classify(&status), expected, "{status:?}");
        }
    }

    #[test]
    fn an_unreachable_store_is_unavailable_and_a_surprise_internal() {
        let down = status_error("BeginUpdate", &Status::unavailable("connection refused"));
        assert!(matches!(down, ClaimsError::Unavailable { .. }), "{down:?}");
        let odd = status_error("BeginUpdate", &Status::invalid_argument("bad SQL"));
        assert!(matches!(odd, ClaimsError::Internal { .. }), "{odd:?}");
        let pool = client_error(
            "Lookup",
            &ClientError::InvalidSession(SessionError::SessionGetTimeout),
        );
        assert!(matches!(pool, ClaimsError::Unavailable { .. }), "{pool:?}");
    }
}

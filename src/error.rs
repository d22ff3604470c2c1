//! The one public error type of the service. Every protocol rule that refuses a request says so
//! with one of these variants; the gRPC layer maps each to a status code and an ErrorInfo reason
//! in exactly one place (`topology_claims_proto::status`). Backends keep their own private errors and convert.

use crate::domain::{CellId, ClaimKey, LeaseId, NamespaceId, ValueRule};

/// PERMISSION_DENIED reason: a cell acted for another cell.
pub const CELL_ID_MISMATCH: &str = "CELL_ID_MISMATCH";
/// PERMISSION_DENIED reason: the caller's role may not call this method.
pub const ROLE_NOT_ALLOWED: &str = "ROLE_NOT_ALLOWED";

/// Why a request was refused (or could not be served).
///
/// The variants mirror the API's status table: a client can act on each one (show "already
/// taken", retry later, fix its request, …) without parsing messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClaimsError {
    /// A field is malformed; `field` is its path in the request (e.g. `creates_claims[2].claim_value`).
    #[error("invalid request: {field}: {description}")]
    InvalidRequest { field: String, description: String },
    /// The same claim appears twice in one batch (in creates, in destroys, or in both).
    #[error("claim {claim} appears more than once in the batch")]
    BatchConflict { claim: ClaimKey },
    /// A create of a claim that exists and is committed.
    #[error("claim {claim} is already taken")]
    ClaimTaken { claim: ClaimKey },
    /// The claim is under another lease; temporary: retry later.
    #[error("claim {claim} is leased by an update in progress; retry later")]
    ClaimLeased { claim: ClaimKey },
    /// Several claims of one BeginUpdate were refused (each a `ClaimTaken`, `ClaimLeased`,
    /// `ClaimNotFound` or `NotClaimOwner`): the status is the first one's, with every refused
    /// claim listed in a `topology.claims.v1.ClaimConflicts` detail. [`Self::refusal`] is the
    /// first, for code that acts on one refusal.
    #[error("{0}")]
    ClaimConflicts(Box<crate::domain::ClaimConflicts>),
    /// A destroy (or lookup) of a claim that does not exist.
    #[error("claim {claim} does not exist")]
    ClaimNotFound { claim: ClaimKey },
    /// A destroy of a claim owned by another cell.
    #[error("claim {claim} is owned by another cell")]
    NotClaimOwner { claim: ClaimKey },
    /// Commit, rollback or renew of another cell's lease.
    #[error("lease {lease_id} belongs to another cell")]
    NotLeaseOwner { lease_id: LeaseId },
    /// The lease was rolled back; its claims are gone (creates) or kept (destroys).
    #[error("lease {lease_id} was rolled back")]
    LeaseRolledBack { lease_id: LeaseId },
    /// The lease was committed already.
    #[error("lease {lease_id} was committed")]
    LeaseCommitted { lease_id: LeaseId },
    /// A conditional rollback (`unrenewed_for`) of a lease renewed within that window, by the
    /// store's clock: the lease was left as it was (FAILED_PRECONDITION). Not an error for the
    /// reconciler or ForceRollback: the cell is alive and may still commit.
    #[error("lease {lease_id} was renewed within the rollback's unrenewed_for window; it was left as it was")]
    LeaseRenewed { lease_id: LeaseId },
    /// A ListClaims page would end inside record `record_id` (its claims alone overflow a page),
    /// and the request can only resume at record ids (no `page_token`, no `cursor_key`, no
    /// `page_tokens`): it would get the record's first claims again, forever
    /// (FAILED_PRECONDITION). See `domain::check_claims_page_followable`.
    #[error("record {record_id} of table {table_name} has more claims than one page: follow next_page_token (set page_tokens), or send next_cursor_key as cursor_key")]
    RecordExceedsPage {
        table_name: crate::domain::TableName,
        record_id: i64,
    },
    /// The lease id was never seen, or its outcome is past retention.
    #[error("lease {lease_id} not found")]
    LeaseNotFound { lease_id: LeaseId },
    /// A client-chosen lease id that is already used for other content or by another cell.
    #[error("lease id {lease_id} is already in use for a different request")]
    LeaseIdConflict { lease_id: LeaseId },
    /// The caller did not prove who it is: no client certificate on a TLS server, or one that
    /// names no single identity.
    #[error("unauthenticated: {message}")]
    Unauthenticated { message: String },
    /// The caller is known and may not do this; `reason` is the ErrorInfo reason
    /// (`CELL_ID_MISMATCH`, `ROLE_NOT_ALLOWED`).
    #[error("permission denied ({reason}): {message}")]
    PermissionDenied { reason: String, message: String },
    /// BeginUpdate of a cell an administrator decommissioned (PERMISSION_DENIED).
    #[error("cell {cell_id} is decommissioned; it may begin no updates")]
    CellDecommissioned { cell_id: CellId },
    /// A create of a claim that does not exist while the store's latest restore is quarantined
    /// (`domain::restore`): the name may be a claim the restore lost, which its owner's verifier
    /// is about to re-create (FAILED_PRECONDITION with a RetryInfo of `retry_after`).
    #[error("claim {claim} may not be created yet: the claims store was restored from a backup (restore epoch {epoch}) and the cells have not all re-verified their claims; retry after {retry_after:?}")]
    RestoreQuarantine {
        claim: ClaimKey,
        epoch: u64,
        retry_after: std::time::Duration,
    },
    /// A verification pass report or a lift that names another restore epoch than the store's
    /// latest (`current`, 0 when the store was never marked restored): FAILED_PRECONDITION.
    #[error("restore epoch {sent} is not the store's latest ({current}); read it again")]
    RestoreEpochMismatch { sent: u64, current: u64 },
    /// DecommissionCell of a cell that still has outstanding leases (FAILED_PRECONDITION):
    /// they must end first (the cell's commit or rollback, or ForceRollback).
    #[error("cell {cell_id} has {outstanding} outstanding lease(s); end them first (admin force-rollback)")]
    CellHasOutstandingLeases { cell_id: CellId, outstanding: u64 },
    /// A per-cell limit (`limit`: `cell-rate` or `cell-max-in-flight`) refused the request
    /// (RESOURCE_EXHAUSTED with a RetryInfo of `retry_after`).
    #[error("cell {cell_id} is over its {limit} limit; retry after {retry_after:?}")]
    RateLimited {
        limit: &'static str,
        cell_id: String,
        retry_after: std::time::Duration,
    },
    /// Every verification slot is held by a running verifier (`serve
    /// --max-concurrent-verifications`), or the caller's cell holds as many as one cell may
    /// (`--max-verifications-per-cell`): RESOURCE_EXHAUSTED with a RetryInfo of `retry_after`,
    /// when the earliest slot that fills the limit expires unless renewed.
    #[error("{limit} ({in_use} of {max} held, --{}); retry after {retry_after:?}", limit.name())]
    VerificationSlotsBusy {
        in_use: u32,
        max: u32,
        /// Which limit is full: the fleet's, or the caller's cell's own cap.
        limit: crate::domain::SlotCap,
        retry_after: std::time::Duration,
    },
    /// A verifier's verification slot expired (not renewed within its time-to-live) and another
    /// verifier took it: the run stopped before its next correcting lease or page (the cursor of
    /// its last whole page is saved). Raised by the cell-side verifier, never sent by the
    /// service.
    #[error("verification slot of {holder} lost: it was not renewed within its time-to-live and another verifier took it; the run stopped and the next run resumes from its saved cursor")]
    VerificationSlotLost { holder: String },
    /// An admin call that could not be written to the audit log first, so it did not act
    /// (UNAVAILABLE): fix the log (disk, permissions) and retry.
    #[error("audit log unavailable: {message}; the admin call was not carried out")]
    AuditUnavailable { message: String },
    /// A request names a namespace the store does not hold (INVALID_ARGUMENT
    /// `UNKNOWN_NAMESPACE`): a typo, or a namespace not created yet.
    #[error("unknown namespace {namespace:?}: the store holds no such namespace (`topology-claims admin namespaces list` shows them)")]
    UnknownNamespace { namespace: String },
    /// A value that breaks one of its namespace's rules (INVALID_ARGUMENT `INVALID_CLAIM_VALUE`,
    /// metadata `namespace` and `rule`); `field` is its path in the request.
    #[error(
        "invalid request: {field}: the value breaks namespace {namespace}'s {rule} rule: {detail}"
    )]
    InvalidClaimValue {
        field: String,
        namespace: NamespaceId,
        rule: ValueRule,
        detail: String,
    },
    /// A create in a deprecated namespace (FAILED_PRECONDITION): destroys, updates and lookups
    /// still work.
    #[error("namespace {namespace} is deprecated: it takes no new claims")]
    NamespaceDeprecated { namespace: NamespaceId },
    /// DeleteNamespace of a namespace that holds claims or outstanding leases
    /// (FAILED_PRECONDITION).
    #[error("namespace {namespace} is not empty: it holds {claims} claim(s); destroy them first")]
    NamespaceNotEmpty { namespace: NamespaceId, claims: u64 },
    /// A rule change that existing claims break (FAILED_PRECONDITION): the first `problems`
    /// (collisions, violations, leases in the way) and how many `more` there are.
    #[error("namespace {namespace}'s rules cannot change: {}{}", problems.join("; "), if *more > 0 { format!("; and {more} more") } else { String::new() })]
    NamespaceRulesConflict {
        namespace: NamespaceId,
        problems: Vec<String>,
        more: u64,
    },
    /// CreateNamespace of an id the store holds already (ALREADY_EXISTS).
    #[error("namespace {namespace} exists already")]
    NamespaceExists { namespace: NamespaceId },
    /// Get, update or delete of a namespace the store does not hold (NOT_FOUND).
    #[error("namespace {namespace:?} not found")]
    NamespaceNotFound { namespace: String },
    /// CreateNamespace beyond `serve --max-namespaces` (FAILED_PRECONDITION).
    #[error("the store holds {max} namespaces, as many as --max-namespaces allows; delete one or raise the limit")]
    TooManyNamespaces { max: u64 },
    /// A WatchClaims from a revision whose events were compacted away (OUT_OF_RANGE): the
    /// watcher re-reads what it caches and watches again from `compact_revision`, the oldest
    /// revision still available.
    #[error("revision {requested} is compacted; the oldest revision still available is {compact_revision}: re-read and watch from there")]
    WatchCompacted {
        requested: u64,
        compact_revision: u64,
    },
    /// The store cannot do this (UNIMPLEMENTED): `what` names it and the store.
    #[error("{what}")]
    Unsupported { what: String },
    /// The store cannot be reached (down, restarting, network): retry later.
    #[error("store unavailable: {message}")]
    Unavailable { message: String },
    /// The claims server could not be reached, or gave no answer of its own (a refused or cut
    /// connection, TLS or protocol trouble, no answer within the deadline): retry later. Raised
    /// by clients, never sent by the service (whose store outages are [`Self::Unavailable`]).
    #[error("claims server unavailable: {message}")]
    ServerUnavailable { message: String },
    /// The store's schema is behind this binary and migrations were not allowed to run.
    #[error("schema migrations pending: {}; run `topology-claims migrate` or start without --no-migrate", pending.join(", "))]
    MigrationsPending { pending: Vec<String> },
    /// A bad store URL or setting.
    #[error("configuration error: {message}")]
    Configuration { message: String },
    /// Anything else: a bug or an unexpected store answer. Never a protocol refusal.
    #[error("internal error: {message}")]
    Internal { message: String },
}

impl ClaimsError {
    /// The refusal to act on: the first refused claim's for [`Self::ClaimConflicts`], else the
    /// error itself.
    pub fn refusal(&self) -> &ClaimsError {
        match self {
            Self::ClaimConflicts(conflicts) => conflicts.first(),
            _ => self,
        }
    }

    /// Every refused claim's refusal: the list of [`Self::ClaimConflicts`], else the error
    /// itself when it is about one claim, else none.
    pub fn claim_refusals(&self) -> Vec<&ClaimsError> {
        match self {
            Self::ClaimConflicts(conflicts) => {
                conflicts.conflicts.iter().map(|c| &c.refusal).collect()
            }
            _ if self.claim().is_some() => vec![self],
            _ => Vec::new(),
        }
    }

    /// The machine-readable reason (google.rpc.ErrorInfo `reason`).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::ClaimConflicts(conflicts) => conflicts.first().reason(),
            Self::InvalidRequest { .. } => "INVALID_REQUEST",
            Self::BatchConflict { .. } => "BATCH_CONFLICT",
            Self::ClaimTaken { .. } => "CLAIM_TAKEN",
            Self::ClaimLeased { .. } => "CLAIM_LEASED",
            Self::ClaimNotFound { .. } => "CLAIM_NOT_FOUND",
            Self::NotClaimOwner { .. } => "NOT_CLAIM_OWNER",
            Self::NotLeaseOwner { .. } => "NOT_LEASE_OWNER",
            Self::LeaseRolledBack { .. } => "LEASE_ROLLED_BACK",
            Self::LeaseCommitted { .. } => "LEASE_COMMITTED",
            Self::LeaseRenewed { .. } => "LEASE_RENEWED",
            Self::RecordExceedsPage { .. } => "RECORD_EXCEEDS_PAGE",
            Self::LeaseNotFound { .. } => "LEASE_NOT_FOUND",
            Self::LeaseIdConflict { .. } => "LEASE_ID_CONFLICT",
            Self::Unauthenticated { .. } => "UNAUTHENTICATED",
            Self::PermissionDenied { reason, .. } => match reason.as_str() {
                CELL_ID_MISMATCH => CELL_ID_MISMATCH,
                _ => ROLE_NOT_ALLOWED,
            },
            Self::CellDecommissioned { .. } => "CELL_DECOMMISSIONED",
            Self::CellHasOutstandingLeases { .. } => "CELL_HAS_OUTSTANDING_LEASES",
            Self::RestoreQuarantine { .. } => "RESTORE_QUARANTINE",
            Self::RestoreEpochMismatch { .. } => "RESTORE_EPOCH_MISMATCH",
            Self::RateLimited { .. } => "RATE_LIMITED",
            Self::VerificationSlotsBusy { .. } => "VERIFICATION_SLOTS_BUSY",
            Self::VerificationSlotLost { .. } => "VERIFICATION_SLOT_LOST",
            Self::AuditUnavailable { .. } => "AUDIT_UNAVAILABLE",
            Self::UnknownNamespace { .. } => "UNKNOWN_NAMESPACE",
            Self::InvalidClaimValue { .. } => "INVALID_CLAIM_VALUE",
            Self::NamespaceDeprecated { .. } => "NAMESPACE_DEPRECATED",
            Self::NamespaceNotEmpty { .. } => "NAMESPACE_NOT_EMPTY",
            Self::NamespaceRulesConflict { .. } => "NAMESPACE_RULES_CONFLICT",
            Self::NamespaceExists { .. } => "NAMESPACE_EXISTS",
            Self::NamespaceNotFound { .. } => "NAMESPACE_NOT_FOUND",
            Self::TooManyNamespaces { .. } => "TOO_MANY_NAMESPACES",
            Self::WatchCompacted { .. } => "WATCH_COMPACTED",
            Self::Unsupported { .. } => "UNSUPPORTED",
            Self::Unavailable { .. } => "STORE_UNAVAILABLE",
            Self::ServerUnavailable { .. } => "SERVER_UNAVAILABLE",
            Self::MigrationsPending { .. } => "MIGRATIONS_PENDING",
            Self::Configuration { .. } => "CONFIGURATION",
            Self::Internal { .. } => "INTERNAL",
        }
    }

    /// The claim the error is about, if any.
    pub fn claim(&self) -> Option<&ClaimKey> {
        match self {
            Self::BatchConflict { claim }
            | Self::ClaimTaken { claim }
            | Self::ClaimLeased { claim }
            | Self::ClaimNotFound { claim }
            | Self::NotClaimOwner { claim }
            | Self::RestoreQuarantine { claim, .. } => Some(claim),
            Self::ClaimConflicts(conflicts) => conflicts.first().claim(),
            _ => None,
        }
    }

    /// The lease the error is about, if any.
    pub fn lease_id(&self) -> Option<LeaseId> {
        match self {
            Self::NotLeaseOwner { lease_id }
            | Self::LeaseRolledBack { lease_id }
            | Self::LeaseCommitted { lease_id }
            | Self::LeaseRenewed { lease_id }
            | Self::LeaseNotFound { lease_id }
            | Self::LeaseIdConflict { lease_id } => Some(*lease_id),
            _ => None,
        }
    }

    pub fn invalid(field: impl Into<String>, description: impl Into<String>) -> Self {
        Self::InvalidRequest {
            field: field.into(),
            description: description.into(),
        }
    }

    pub fn internal(message: impl std::fmt::Display) -> Self {
        Self::Internal {
            message: message.to_string(),
        }
    }

    pub fn unavailable(message: impl std::fmt::Display) -> Self {
        Self::Unavailable {
            message: message.to_string(),
        }
    }

    pub fn server_unavailable(message: impl std::fmt::Display) -> Self {
        Self::ServerUnavailable {
            message: message.to_string(),
        }
    }

    /// Whether the call may or may not have been applied and can be retried: the store or the
    /// claims server was unavailable.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            Self::Unavailable { .. } | Self::ServerUnavailable { .. }
        )
    }
}

/// An error with its source chain as one line, `outer: cause: root cause`, each part once.
/// Transport and driver errors hide the useful part ("Connection refused", "database … does not
/// exist") in their sources, and many repeat their cause in their own text
/// (`tcp connect error: Connection refused` over `Connection refused`): a cause already said is
/// left out, and a cause that repeats its parent's text replaces it.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(error);
    while let Some(current) = next {
        let text = current.to_string();
        next = current.source();
        if text.is_empty() || parts.iter().any(|part| part.contains(&text)) {
            continue;
        }
        match parts.last_mut() {
            Some(last) if text.contains(last.as_str()) => *last = text,
            _ => parts.push(text),
        }
    }
    parts.join(": ")
}

#[cfg(test)]
mod chain_tests {
    use super::error_chain;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|l| l as _)
        }
    }

    fn chain(texts: &[&'static str]) -> Layer {
        texts
            .iter()
            .rev()
            .fold(None, |inner, text| Some(Layer(text, inner.map(Box::new))))
            .unwrap()
    }

    #[test]
    fn error_chain_says_each_part_once() {
        assert_eq!(
            error_chain(&chain(&[
                "transport error",
                "tcp connect error",
                "Connection refused"
            ])),
            "transport error: tcp connect error: Connection refused"
        );
        assert_eq!(
            error_chain(&chain(&[
                "tcp connect error: Connection refused",
                "tcp connect error",
                "Connection refused"
            ])),
            "tcp connect error: Connection refused"
        );
        assert_eq!(
            error_chain(&chain(&[
                "dns error",
                "dns error",
                "failed to lookup address"
            ])),
            "dns error: failed to lookup address"
        );
        assert_eq!(
            error_chain(&chain(&[
                "client error (Connect)",
                "client error (Connect): dns error"
            ])),
            "client error (Connect): dns error"
        );
    }
}

//! The one mapping between [`ClaimsError`] and gRPC statuses, both ways.
//!
//! [`to_status`] is the only place where the server picks a status code: every status carries a
//! `google.rpc.ErrorInfo` (domain [`ERROR_DOMAIN`], reason [`ClaimsError::reason`], metadata
//! naming the claim or lease involved), and malformed requests also a `google.rpc.BadRequest`
//! field violation. [`from_status`] reads those details back for clients.
//!
//! Must not decide protocol questions: it translates errors the domain already decided.

use std::collections::HashMap;

use std::sync::LazyLock;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::log::RateLimitedLog;
use crate::pb;
use prost::Message;
use topology_claims::domain::{
    CellId, ClaimConflict, ClaimConflicts, ClaimKey, ClaimType, LeaseId, NamespaceId, SlotCap,
    TableName, Timestamp, ValueRule,
};
use topology_claims::error::ClaimsError;

/// The `google.rpc.ErrorInfo.domain` of every error this service returns.
pub const ERROR_DOMAIN: &str = "topology-claims";

/// ErrorInfo metadata keys.
pub const META_CLAIM_TYPE: &str = "claim_type";
pub const META_CLAIM_VALUE: &str = "claim_value";
pub const META_LEASE_ID: &str = "lease_id";
pub const META_FIELD: &str = "field";
pub const META_PENDING: &str = "pending";
pub const META_CELL_ID: &str = "cell_id";
pub const META_OUTSTANDING: &str = "outstanding";
pub const META_LIMIT: &str = "limit";
pub const META_IN_USE: &str = "in_use";
pub const META_MAX: &str = "max";
/// WATCH_COMPACTED: the revision a watch asked for, and the oldest revision still available.
pub const META_REQUESTED: &str = "requested";
pub const META_COMPACT_REVISION: &str = "compact_revision";
/// CLAIM_LEASED: when the claim's lease began (RFC 3339, the store's clock).
pub const META_LEASED_SINCE: &str = "leased_since";
pub const META_TABLE_NAME: &str = "table_name";
pub const META_TABLE_RECORD_ID: &str = "table_record_id";
/// RESTORE_QUARANTINE and RESTORE_EPOCH_MISMATCH: the store's restore epoch.
pub const META_EPOCH: &str = "epoch";
/// RESTORE_EPOCH_MISMATCH: the epoch the request named.
pub const META_SENT_EPOCH: &str = "sent_epoch";
/// The namespace a refusal is about (INVALID_CLAIM_VALUE, UNKNOWN_NAMESPACE, NAMESPACE_*).
pub const META_NAMESPACE: &str = "namespace";
/// INVALID_CLAIM_VALUE: the rule the value breaks (`normalization`, `max_chars`, `pattern`,
/// `reserved`).
pub const META_RULE: &str = "rule";
/// NAMESPACE_NOT_EMPTY: how many claims the namespace holds.
pub const META_CLAIMS: &str = "claims";
/// NAMESPACE_RULES_CONFLICT: how many problems the message does not list.
pub const META_MORE: &str = "more";

/// The status code of each error (the status table of the API, docs/api.md).
pub fn code_of(error: &ClaimsError) -> Code {
    match error {
        ClaimsError::ClaimConflicts(conflicts) => code_of(conflicts.first()),
        ClaimsError::InvalidRequest { .. } | ClaimsError::BatchConflict { .. } => {
            Code::InvalidArgument
        }
        ClaimsError::ClaimTaken { .. } | ClaimsError::LeaseIdConflict { .. } => Code::AlreadyExists,
        ClaimsError::ClaimLeased { .. }
        | ClaimsError::LeaseRolledBack { .. }
        | ClaimsError::LeaseCommitted { .. }
        | ClaimsError::LeaseRenewed { .. } => Code::FailedPrecondition,
        ClaimsError::ClaimNotFound { .. } | ClaimsError::LeaseNotFound { .. } => Code::NotFound,
        ClaimsError::NotClaimOwner { .. }
        | ClaimsError::NotLeaseOwner { .. }
        | ClaimsError::PermissionDenied { .. } => Code::PermissionDenied,
        ClaimsError::CellDecommissioned { .. } => Code::PermissionDenied,
        ClaimsError::CellHasOutstandingLeases { .. }
        | ClaimsError::RestoreQuarantine { .. }
        | ClaimsError::RestoreEpochMismatch { .. } => Code::FailedPrecondition,
        ClaimsError::RecordExceedsPage { .. } => Code::FailedPrecondition,
        ClaimsError::RateLimited { .. } | ClaimsError::VerificationSlotsBusy { .. } => {
            Code::ResourceExhausted
        }
        ClaimsError::UnknownNamespace { .. } | ClaimsError::InvalidClaimValue { .. } => {
            Code::InvalidArgument
        }
        ClaimsError::NamespaceDeprecated { .. }
        | ClaimsError::NamespaceNotEmpty { .. }
        | ClaimsError::NamespaceRulesConflict { .. }
        | ClaimsError::TooManyNamespaces { .. } => Code::FailedPrecondition,
        ClaimsError::NamespaceExists { .. } => Code::AlreadyExists,
        ClaimsError::WatchCompacted { .. } => Code::OutOfRange,
        ClaimsError::Unsupported { .. } => Code::Unimplemented,
        ClaimsError::NamespaceNotFound { .. } => Code::NotFound,
        ClaimsError::AuditUnavailable { .. } => Code::Unavailable,
        // Client-side only (the verifier's own slot bookkeeping); never on the wire.
        ClaimsError::VerificationSlotLost { .. } => Code::Aborted,
        ClaimsError::Unauthenticated { .. } => Code::Unauthenticated,
        ClaimsError::Unavailable { .. } | ClaimsError::ServerUnavailable { .. } => {
            Code::Unavailable
        }
        ClaimsError::MigrationsPending { .. }
        | ClaimsError::Configuration { .. }
        | ClaimsError::Internal { .. } => Code::Internal,
        // `ClaimsError` is `#[non_exhaustive]` (and defined in the core): a variant added there
        // without a row here is INTERNAL until it gets one; `every_error` in the tests lists
        // every variant with the code it must have.
        _ => Code::Internal,
    }
}

/// The canonical gRPC name of a code.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The gRPC status of an error, with its ErrorInfo (and BadRequest for malformed fields).
///
/// Server-side details of `Internal`, `Configuration` and `Unavailable` errors (SQL, hosts,
/// paths) are logged here and never sent to the client.
pub fn to_status(error: &ClaimsError) -> Status {
    to_status_with(error, None)
}

/// [`to_status`] of a `ClaimLeased` refusal, saying when the claim's lease began (the claim
/// row's `updated_at`, which every store sets to the lease's start: the store's clock).
pub fn claim_leased_status(error: &ClaimsError, leased_since: Option<Timestamp>) -> Status {
    to_status_with(error, leased_since)
}

fn to_status_with(error: &ClaimsError, leased_since: Option<Timestamp>) -> Status {
    let status = one_status(error.refusal(), leased_since);
    let conflicts = match error {
        ClaimsError::ClaimConflicts(conflicts) => conflicts_to_pb(conflicts),
        _ => match error.claim() {
            // One refused claim: the same detail, listing it alone, so a client reads the
            // list whatever the batch.
            Some(claim) if CLAIM_REFUSALS.contains(&error.reason()) => pb::ClaimConflicts {
                conflicts: vec![pb::ClaimConflict {
                    claim: Some(pb::ClaimRecord {
                        claim_type: claim.namespace.claim_type_number(),
                        namespace: claim.namespace.to_string(),
                        claim_value: claim.value.clone(),
                        ..Default::default()
                    }),
                    reason: error.reason().to_owned(),
                }],
                omitted: 0,
            },
            _ => return status,
        },
    };
    with_detail(status, CLAIM_CONFLICTS_TYPE_URL, conflicts.encode_to_vec())
}

/// The refusals a [`pb::ClaimConflicts`] lists: those about one claim's row.
const CLAIM_REFUSALS: [&str; 4] = [
    "CLAIM_TAKEN",
    "CLAIM_LEASED",
    "CLAIM_NOT_FOUND",
    "NOT_CLAIM_OWNER",
];

/// The type URL of the [`pb::ClaimConflicts`] status detail.
pub const CLAIM_CONFLICTS_TYPE_URL: &str = "type.googleapis.com/topology.claims.v1.ClaimConflicts";

/// Bytes of listed claims a [`pb::ClaimConflicts`] detail holds at most, beside the first (it
/// rides in the `grpc-status-details-bin` trailer, base64, which clients cap at 8 KiB in
/// all: gRPC's C core, so Ruby's, refuses larger metadata).
pub const MAX_CONFLICTS_DETAIL_BYTES: usize = 3 * 1024;

fn conflicts_to_pb(conflicts: &topology_claims::domain::ClaimConflicts) -> pb::ClaimConflicts {
    let mut listed = pb::ClaimConflicts::default();
    let mut bytes = 0;
    for (i, conflict) in conflicts.conflicts.iter().enumerate() {
        let item = pb::ClaimConflict {
            claim: Some(topology_claims::codec::claim_record_to_pb(&conflict.record)),
            reason: conflict.refusal.reason().to_owned(),
        };
        bytes += item.encoded_len() + 3;
        if i > 0 && bytes > MAX_CONFLICTS_DETAIL_BYTES {
            listed.omitted = u32::try_from(conflicts.conflicts.len() - i + conflicts.omitted)
                .unwrap_or(u32::MAX);
            return listed;
        }
        listed.conflicts.push(item);
    }
    listed.omitted = u32::try_from(conflicts.omitted).unwrap_or(u32::MAX);
    listed
}

/// `status` with one more google.rpc.Status detail.
fn with_detail(status: Status, type_url: &str, value: Vec<u8>) -> Status {
    let mut rpc = tonic_types::pb::Status::decode(status.details()).unwrap_or_default();
    rpc.details.push(prost_types::Any {
        type_url: type_url.to_owned(),
        value,
    });
    Status::with_details(status.code(), status.message(), rpc.encode_to_vec().into())
}

/// The [`pb::ClaimConflicts`] detail of a status, if it has one.
pub fn claim_conflicts(status: &Status) -> Option<pb::ClaimConflicts> {
    let rpc = tonic_types::pb::Status::decode(status.details()).ok()?;
    rpc.details
        .iter()
        .find(|any| any.type_url == CLAIM_CONFLICTS_TYPE_URL)
        .and_then(|any| pb::ClaimConflicts::decode(any.value.as_slice()).ok())
}

fn one_status(error: &ClaimsError, leased_since: Option<Timestamp>) -> Status {
    let mut metadata = HashMap::new();
    if let Some(claim) = error.claim() {
        if let Some(claim_type) = claim.namespace.claim_type() {
            metadata.insert(META_CLAIM_TYPE.to_owned(), claim_type.name().to_owned());
        }
        metadata.insert(META_NAMESPACE.to_owned(), claim.namespace.to_string());
        metadata.insert(META_CLAIM_VALUE.to_owned(), claim.value.clone());
    }
    if let Some(lease_id) = error.lease_id() {
        metadata.insert(META_LEASE_ID.to_owned(), lease_id.to_string());
    }
    let message = match error {
        ClaimsError::Internal { .. } | ClaimsError::Configuration { .. } => {
            tracing::error!(error = %error, "request failed");
            "internal error".to_owned()
        }
        ClaimsError::Unavailable { .. } => {
            // An outage fails every request: the health watcher logs when the store goes and
            // comes back; here one line every few seconds says how many requests it cost.
            static UNAVAILABLE: LazyLock<RateLimitedLog> = LazyLock::new(RateLimitedLog::default);
            if let Some(held_back) = UNAVAILABLE.ready() {
                tracing::warn!(error = %error, failed_since_last_line = held_back,
                    "request failed: store unavailable");
            }
            "store unavailable; retry later".to_owned()
        }
        ClaimsError::MigrationsPending { pending } => {
            tracing::error!(error = %error, "request failed");
            metadata.insert(META_PENDING.to_owned(), pending.join(","));
            error.to_string()
        }
        _ => error.to_string(),
    };
    let mut details = ErrorDetails::new();
    match error {
        ClaimsError::InvalidRequest { field, description } => {
            metadata.insert(META_FIELD.to_owned(), field.clone());
            details.add_bad_request_violation(field.clone(), description.clone());
        }
        ClaimsError::CellDecommissioned { cell_id } => {
            metadata.insert(META_CELL_ID.to_owned(), cell_id.to_string());
        }
        ClaimsError::InvalidClaimValue {
            field,
            namespace,
            rule,
            detail,
        } => {
            metadata.insert(META_FIELD.to_owned(), field.clone());
            metadata.insert(META_NAMESPACE.to_owned(), namespace.to_string());
            metadata.insert(META_RULE.to_owned(), rule.name().to_owned());
            details.add_bad_request_violation(field.clone(), detail.clone());
        }
        ClaimsError::UnknownNamespace { namespace }
        | ClaimsError::NamespaceNotFound { namespace } => {
            metadata.insert(META_NAMESPACE.to_owned(), namespace.clone());
        }
        ClaimsError::NamespaceDeprecated { namespace }
        | ClaimsError::NamespaceExists { namespace } => {
            metadata.insert(META_NAMESPACE.to_owned(), namespace.to_string());
        }
        ClaimsError::NamespaceNotEmpty { namespace, claims } => {
            metadata.insert(META_NAMESPACE.to_owned(), namespace.to_string());
            metadata.insert(META_CLAIMS.to_owned(), claims.to_string());
        }
        ClaimsError::NamespaceRulesConflict {
            namespace,
            more,
            problems,
        } => {
            metadata.insert(META_NAMESPACE.to_owned(), namespace.to_string());
            metadata.insert(META_MORE.to_owned(), more.to_string());
            // Each listed problem under a key of its own: a value may hold any separator.
            for (i, problem) in problems.iter().enumerate() {
                metadata.insert(format!("problem_{i}"), problem.clone());
            }
        }
        ClaimsError::TooManyNamespaces { max } => {
            metadata.insert(META_MAX.to_owned(), max.to_string());
        }
        ClaimsError::WatchCompacted {
            requested,
            compact_revision,
        } => {
            metadata.insert(META_REQUESTED.to_owned(), requested.to_string());
            metadata.insert(
                META_COMPACT_REVISION.to_owned(),
                compact_revision.to_string(),
            );
        }
        ClaimsError::RecordExceedsPage {
            table_name,
            record_id,
        } => {
            metadata.insert(META_TABLE_NAME.to_owned(), table_name.name().to_owned());
            metadata.insert(META_TABLE_RECORD_ID.to_owned(), record_id.to_string());
        }
        ClaimsError::CellHasOutstandingLeases {
            cell_id,
            outstanding,
        } => {
            metadata.insert(META_CELL_ID.to_owned(), cell_id.to_string());
            metadata.insert(META_OUTSTANDING.to_owned(), outstanding.to_string());
        }
        // Temporary: the lease usually ends within a second (`CLAIM_LEASED_RETRY_AFTER`). When
        // it began is the front end's one extra read on this refusal (`leased_since`); its age
        // would need a second clock, so the client judges it (docs/api.md).
        ClaimsError::ClaimLeased { .. } => {
            details.set_retry_info(Some(topology_claims::domain::CLAIM_LEASED_RETRY_AFTER));
            if let Some(since) = leased_since {
                metadata.insert(META_LEASED_SINCE.to_owned(), rfc3339_micros(since));
            }
        }
        ClaimsError::RestoreQuarantine {
            epoch, retry_after, ..
        } => {
            metadata.insert(META_EPOCH.to_owned(), epoch.to_string());
            details.set_retry_info(Some(*retry_after));
        }
        ClaimsError::RestoreEpochMismatch { sent, current } => {
            metadata.insert(META_EPOCH.to_owned(), current.to_string());
            metadata.insert(META_SENT_EPOCH.to_owned(), sent.to_string());
        }
        ClaimsError::RateLimited {
            limit,
            cell_id,
            retry_after,
        } => {
            metadata.insert(META_CELL_ID.to_owned(), cell_id.clone());
            metadata.insert(META_LIMIT.to_owned(), (*limit).to_owned());
            details.set_retry_info(Some(*retry_after));
        }
        ClaimsError::VerificationSlotsBusy {
            in_use,
            max,
            limit,
            retry_after,
        } => {
            metadata.insert(META_IN_USE.to_owned(), in_use.to_string());
            metadata.insert(META_MAX.to_owned(), max.to_string());
            metadata.insert(META_LIMIT.to_owned(), limit.name().to_owned());
            details.set_retry_info(Some(*retry_after));
        }
        _ => {}
    }
    details.set_error_info(error.reason(), ERROR_DOMAIN, metadata);
    Status::with_error_details(code_of(error), message, details)
}

/// `2026-11-25T17:04:05.123456Z`.
fn rfc3339_micros(time: Timestamp) -> String {
    let micros = time.as_unix_micros();
    let seconds = micros.div_euclid(1_000_000);
    let nanos = (micros.rem_euclid(1_000_000) * 1000) as i32;
    prost_types::Timestamp { seconds, nanos }.to_string()
}

/// Reads a status back into the error the server meant (for clients and tests).
///
/// A status without this service's ErrorInfo (a transport failure, a proxy, another server) is
/// `Unavailable` when the call may be retried (UNAVAILABLE, DEADLINE_EXCEEDED: the request may
/// or may not have been applied) and `Internal` otherwise.
pub fn from_status(status: &Status) -> ClaimsError {
    let first = one_from_status(status);
    let Some(listed) =
        claim_conflicts(status).filter(|c| c.conflicts.len() + c.omitted as usize > 1)
    else {
        return first;
    };
    if first.claim().is_none() {
        return first;
    }
    let mut conflicts = Vec::with_capacity(listed.conflicts.len());
    for (i, conflict) in listed.conflicts.into_iter().enumerate() {
        let Some(record) = conflict.claim.and_then(|r| {
            topology_claims::codec::claim_record_from_server_pb(r, format_args!("conflicts[{i}]"))
                .ok()
        }) else {
            continue;
        };
        let claim = ClaimKey {
            namespace: record.key.namespace.clone(),
            value: record.display_value().to_owned(),
        };
        let refusal = match conflict.reason.as_str() {
            "CLAIM_TAKEN" => ClaimsError::ClaimTaken { claim },
            "CLAIM_LEASED" => ClaimsError::ClaimLeased { claim },
            "CLAIM_NOT_FOUND" => ClaimsError::ClaimNotFound { claim },
            "NOT_CLAIM_OWNER" => ClaimsError::NotClaimOwner { claim },
            _ => continue,
        };
        // The status's own first refusal stands for the first listed (it carries RetryInfo).
        let refusal = if conflicts.is_empty() {
            first.clone()
        } else {
            refusal
        };
        conflicts.push(ClaimConflict { record, refusal });
    }
    // None readable (a malformed detail), or only one: the status's own refusal alone.
    if conflicts.is_empty() || conflicts.len() + (listed.omitted as usize) < 2 {
        return first;
    }
    ClaimsError::ClaimConflicts(Box::new(ClaimConflicts {
        conflicts,
        omitted: listed.omitted as usize,
    }))
}

fn one_from_status(status: &Status) -> ClaimsError {
    let details = status.get_error_details();
    let Some(info) = details
        .error_info()
        .filter(|info| info.domain == ERROR_DOMAIN)
    else {
        return without_error_info(status);
    };
    let meta = |key: &str| info.metadata.get(key).map(String::as_str);
    // A server older than namespaces names the claim by its claim type only.
    let claim = || -> Option<ClaimKey> {
        let namespace = match meta(META_NAMESPACE) {
            Some(id) => NamespaceId::parse(id).ok()?,
            None => ClaimType::from_name(meta(META_CLAIM_TYPE)?)?.into(),
        };
        Some(ClaimKey::new(namespace, meta(META_CLAIM_VALUE)?))
    };
    let lease_id = || meta(META_LEASE_ID).and_then(|id| LeaseId::parse(id).ok());
    let namespace = || meta(META_NAMESPACE).and_then(|id| NamespaceId::parse(id).ok());
    let message = status.message().to_owned();
    let malformed = || {
        ClaimsError::internal(format!(
            "status {:?} with reason {} lacks its metadata: {message}",
            status.code(),
            info.reason
        ))
    };
    let with_claim =
        |make: fn(ClaimKey) -> ClaimsError| claim().map(make).unwrap_or_else(malformed);
    let with_lease =
        |make: fn(LeaseId) -> ClaimsError| lease_id().map(make).unwrap_or_else(malformed);
    match info.reason.as_str() {
        "INVALID_REQUEST" => {
            let violation = details
                .bad_request()
                .and_then(|b| b.field_violations.first());
            match violation {
                Some(v) => ClaimsError::invalid(v.field.clone(), v.description.clone()),
                None => ClaimsError::invalid(meta(META_FIELD).unwrap_or_default(), message),
            }
        }
        "BATCH_CONFLICT" => with_claim(|claim| ClaimsError::BatchConflict { claim }),
        "CLAIM_TAKEN" => with_claim(|claim| ClaimsError::ClaimTaken { claim }),
        "CLAIM_LEASED" => with_claim(|claim| ClaimsError::ClaimLeased { claim }),
        "CLAIM_NOT_FOUND" => with_claim(|claim| ClaimsError::ClaimNotFound { claim }),
        "NOT_CLAIM_OWNER" => with_claim(|claim| ClaimsError::NotClaimOwner { claim }),
        "NOT_LEASE_OWNER" => with_lease(|lease_id| ClaimsError::NotLeaseOwner { lease_id }),
        "LEASE_ROLLED_BACK" => with_lease(|lease_id| ClaimsError::LeaseRolledBack { lease_id }),
        "LEASE_COMMITTED" => with_lease(|lease_id| ClaimsError::LeaseCommitted { lease_id }),
        "LEASE_RENEWED" => with_lease(|lease_id| ClaimsError::LeaseRenewed { lease_id }),
        "LEASE_NOT_FOUND" => with_lease(|lease_id| ClaimsError::LeaseNotFound { lease_id }),
        "LEASE_ID_CONFLICT" => with_lease(|lease_id| ClaimsError::LeaseIdConflict { lease_id }),
        "STORE_UNAVAILABLE" => ClaimsError::unavailable(message),
        "MIGRATIONS_PENDING" => ClaimsError::MigrationsPending {
            pending: meta(META_PENDING)
                .unwrap_or_default()
                .split(',')
                .filter(|name| !name.is_empty())
                .map(str::to_owned)
                .collect(),
        },
        "CONFIGURATION" => ClaimsError::Configuration { message },
        "UNAUTHENTICATED" => ClaimsError::Unauthenticated { message },
        "CELL_DECOMMISSIONED" => meta(META_CELL_ID)
            .and_then(|cell| CellId::parse(cell).ok())
            .map(|cell_id| ClaimsError::CellDecommissioned { cell_id })
            .unwrap_or_else(malformed),
        "CELL_HAS_OUTSTANDING_LEASES" => meta(META_CELL_ID)
            .and_then(|cell| CellId::parse(cell).ok())
            .zip(meta(META_OUTSTANDING).and_then(|n| n.parse().ok()))
            .map(
                |(cell_id, outstanding)| ClaimsError::CellHasOutstandingLeases {
                    cell_id,
                    outstanding,
                },
            )
            .unwrap_or_else(malformed),
        "RECORD_EXCEEDS_PAGE" => meta(META_TABLE_NAME)
            .and_then(TableName::from_name)
            .zip(meta(META_TABLE_RECORD_ID).and_then(|id| id.parse().ok()))
            .map(|(table_name, record_id)| ClaimsError::RecordExceedsPage {
                table_name,
                record_id,
            })
            .unwrap_or_else(malformed),
        "RESTORE_QUARANTINE" => claim()
            .zip(meta(META_EPOCH).and_then(|n| n.parse().ok()))
            .map(|(claim, epoch)| ClaimsError::RestoreQuarantine {
                claim,
                epoch,
                retry_after: details
                    .retry_info()
                    .and_then(|r| r.retry_delay)
                    .unwrap_or_default(),
            })
            .unwrap_or_else(malformed),
        "RESTORE_EPOCH_MISMATCH" => meta(META_SENT_EPOCH)
            .and_then(|n| n.parse().ok())
            .zip(meta(META_EPOCH).and_then(|n| n.parse().ok()))
            .map(|(sent, current)| ClaimsError::RestoreEpochMismatch { sent, current })
            .unwrap_or_else(malformed),
        "AUDIT_UNAVAILABLE" => ClaimsError::AuditUnavailable {
            message: message
                .strip_prefix("audit log unavailable: ")
                .and_then(|m| m.strip_suffix("; the admin call was not carried out"))
                .unwrap_or(&message)
                .to_owned(),
        },
        "RATE_LIMITED" => ClaimsError::RateLimited {
            limit: match meta(META_LIMIT) {
                Some("cell-max-in-flight") => "cell-max-in-flight",
                _ => "cell-rate",
            },
            cell_id: meta(META_CELL_ID).unwrap_or_default().to_owned(),
            retry_after: details
                .retry_info()
                .and_then(|r| r.retry_delay)
                .unwrap_or_default(),
        },
        "VERIFICATION_SLOTS_BUSY" => meta(META_IN_USE)
            .and_then(|n| n.parse().ok())
            .zip(meta(META_MAX).and_then(|n| n.parse().ok()))
            .map(|(in_use, max)| ClaimsError::VerificationSlotsBusy {
                in_use,
                max,
                // A server older than the per-cell cap names no limit: it had only the fleet's.
                limit: meta(META_LIMIT)
                    .and_then(SlotCap::from_name)
                    .unwrap_or(SlotCap::Fleet),
                retry_after: details
                    .retry_info()
                    .and_then(|r| r.retry_delay)
                    .unwrap_or_default(),
            })
            .unwrap_or_else(malformed),
        "UNKNOWN_NAMESPACE" => ClaimsError::UnknownNamespace {
            namespace: meta(META_NAMESPACE).unwrap_or_default().to_owned(),
        },
        "NAMESPACE_NOT_FOUND" => ClaimsError::NamespaceNotFound {
            namespace: meta(META_NAMESPACE).unwrap_or_default().to_owned(),
        },
        "INVALID_CLAIM_VALUE" => namespace()
            .zip(meta(META_RULE).and_then(ValueRule::from_name))
            .map(|(namespace, rule)| {
                let violation = details
                    .bad_request()
                    .and_then(|b| b.field_violations.first().cloned());
                ClaimsError::InvalidClaimValue {
                    field: meta(META_FIELD).unwrap_or_default().to_owned(),
                    namespace,
                    rule,
                    detail: violation.map(|v| v.description).unwrap_or(message.clone()),
                }
            })
            .unwrap_or_else(malformed),
        "NAMESPACE_DEPRECATED" => namespace()
            .map(|namespace| ClaimsError::NamespaceDeprecated { namespace })
            .unwrap_or_else(malformed),
        "NAMESPACE_EXISTS" => namespace()
            .map(|namespace| ClaimsError::NamespaceExists { namespace })
            .unwrap_or_else(malformed),
        "NAMESPACE_NOT_EMPTY" => namespace()
            .zip(meta(META_CLAIMS).and_then(|n| n.parse().ok()))
            .map(|(namespace, claims)| ClaimsError::NamespaceNotEmpty { namespace, claims })
            .unwrap_or_else(malformed),
        "NAMESPACE_RULES_CONFLICT" => namespace()
            .map(|namespace| {
                let prefix = format!("namespace {namespace}'s rules cannot change: ");
                let more: u64 = meta(META_MORE).and_then(|n| n.parse().ok()).unwrap_or(0);
                let problems: Vec<String> = (0..)
                    .map_while(|i| meta(&format!("problem_{i}")).map(str::to_owned))
                    .collect();
                let problems = if problems.is_empty() {
                    // From a server that sent the list in the message only.
                    let listed = message.strip_prefix(&prefix).unwrap_or(&message);
                    let listed = listed
                        .strip_suffix(&format!("; and {more} more"))
                        .unwrap_or(listed);
                    listed.split("; ").map(str::to_owned).collect()
                } else {
                    problems
                };
                ClaimsError::NamespaceRulesConflict {
                    namespace,
                    problems,
                    more,
                }
            })
            .unwrap_or_else(malformed),
        "WATCH_COMPACTED" => match (
            meta(META_REQUESTED).and_then(|n| n.parse().ok()),
            meta(META_COMPACT_REVISION).and_then(|n| n.parse().ok()),
        ) {
            (Some(requested), Some(compact_revision)) => ClaimsError::WatchCompacted {
                requested,
                compact_revision,
            },
            _ => malformed(),
        },
        "UNSUPPORTED" => ClaimsError::Unsupported { what: message },
        "TOO_MANY_NAMESPACES" => meta(META_MAX)
            .and_then(|n| n.parse().ok())
            .map(|max| ClaimsError::TooManyNamespaces { max })
            .unwrap_or_else(malformed),
        reason @ (topology_claims::error::CELL_ID_MISMATCH
        | topology_claims::error::ROLE_NOT_ALLOWED) => ClaimsError::PermissionDenied {
            reason: reason.to_owned(),
            message,
        },
        _ => ClaimsError::internal(format!("{}: {message}", info.reason)),
    }
}

/// Whether `status` is this service's answer (it carries the service's ErrorInfo), rather than
/// the transport's, a proxy's or another program's at that address.
pub fn from_service(status: &Status) -> bool {
    status
        .get_error_details()
        .error_info()
        .is_some_and(|info| info.domain == ERROR_DOMAIN)
}

/// The google.rpc.RetryInfo delay a status carries, if any (RATE_LIMITED,
/// VERIFICATION_SLOTS_BUSY, CLAIM_LEASED, RESTORE_QUARANTINE).
pub fn retry_delay(status: &Status) -> Option<std::time::Duration> {
    status.get_error_details().retry_info()?.retry_delay
}

fn without_error_info(status: &Status) -> ClaimsError {
    let text = format!("{:?}: {}", status.code(), status.message());
    match status.code() {
        // The service attaches ErrorInfo to everything it sends, so these only come from the
        // transport (a connection cut mid-call) or the server's transport bounds (a byte budget
        // or the connection limit: RESOURCE_EXHAUSTED; `--request-timeout`): maybe applied,
        // safe to retry with backoff (every call the client retries is idempotent).
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Unknown
        | Code::Cancelled
        | Code::ResourceExhausted => ClaimsError::server_unavailable(text),
        _ => ClaimsError::internal(text),
    }
}

#[cfg(test)]
mod tests;

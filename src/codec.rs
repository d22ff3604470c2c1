//! The encoding of domain values that outlives one request: the lease payload every store keeps
//! (the original BeginUpdate as protobuf `BeginUpdateRequest` bytes) and the timestamp
//! conversions stores need. The on-disk format is owned here, not by the gRPC layer: `grpc/`
//! uses these functions for the request it decodes, and every backend uses them for its rows, so
//! the bytes a store writes and the request the API returns can never drift apart.
//!
//! Decoding validates every field (errors name the field's path); encoding cannot fail. Must not
//! hold protocol rules (those are `crate::domain`'s) or anything about transport.

use prost::Message;

use crate::domain::{
    BeginUpdate, CellId, ClaimKey, ClaimRecord, ClaimType, LeaseId, LocalTransaction, NamespaceId,
    OwnerType, TableName, Timestamp,
};
use crate::error::ClaimsError;
use crate::pb;

/// Protobuf timestamp from a domain timestamp.
pub fn timestamp_to_pb(ts: Timestamp) -> prost_types::Timestamp {
    let micros = ts.as_unix_micros();
    prost_types::Timestamp {
        seconds: micros.div_euclid(1_000_000),
        nanos: (micros.rem_euclid(1_000_000) * 1000) as i32,
    }
}

/// Domain timestamp from a protobuf timestamp (sub-microsecond digits are dropped).
pub fn timestamp_from_pb(ts: &prost_types::Timestamp) -> Timestamp {
    Timestamp::from_unix_micros(
        ts.seconds
            .saturating_mul(1_000_000)
            .saturating_add(i64::from(ts.nanos / 1000)),
    )
}

/// Decodes and validates a claim record as a client sent it; `field` prefixes error paths.
/// `field` names the record in errors (e.g. `creates_claims[3]`); it is only written out for
/// an error, so pass `format_args!` (every claim of every BeginUpdate comes through here).
/// Takes the record by value: its strings move into the domain record, uncopied. The key is
/// the value as sent until the store resolves it; `claim_key` is output only and ignored.
pub fn claim_record_from_pb(
    record: pb::ClaimRecord,
    field: impl std::fmt::Display,
) -> Result<ClaimRecord, ClaimsError> {
    claim_record_from(record, field, Origin::Request)
}

/// Decodes a record as the server wrote it (a lease payload, a ClaimInfo): `claim_key`, when set,
/// is the key and `claim_value` the value as sent.
pub fn claim_record_from_server_pb(
    record: pb::ClaimRecord,
    field: impl std::fmt::Display,
) -> Result<ClaimRecord, ClaimsError> {
    claim_record_from(record, field, Origin::Stored)
}

/// Decodes a lease's original request as the server returns it (ListOutstandingLeases,
/// RenewLease): its records' keys are the server's.
pub fn begin_update_from_server_pb(
    request: pb::BeginUpdateRequest,
) -> Result<BeginUpdate, ClaimsError> {
    begin_update_from(request, Origin::Stored)
}

/// Where a record comes from: a client (its `claim_key` is ignored) or a store's lease payload
/// (its `claim_key`, when set, is the key the store computed).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Origin {
    Request,
    Stored,
}

fn claim_record_from(
    record: pb::ClaimRecord,
    field: impl std::fmt::Display,
    origin: Origin,
) -> Result<ClaimRecord, ClaimsError> {
    let namespace = namespace_from_pb(record.claim_type, &record.namespace, &field)?;
    // The enums' own parse_field, with its message, only once a number is known to be bad.
    // The common shape (a legacy enum alone) costs no allocation; paths are written out only
    // for the uncommon ones.
    let owner_type = match (
        OwnerType::from_number(i64::from(record.owner)),
        record.owner_type.as_str(),
    ) {
        (Some(known), "") => known,
        _ => OwnerType::from_wire(
            record.owner,
            &record.owner_type,
            &format!("{field}.owner"),
            &format!("{field}.owner_type"),
        )?,
    };
    let table_name = match (
        TableName::from_number(i64::from(record.table_name)),
        record.source_table.as_str(),
    ) {
        (Some(known), "") => known,
        _ => TableName::from_wire(
            record.table_name,
            &record.source_table,
            &format!("{field}.table_name"),
            &format!("{field}.source_table"),
        )?,
    };
    let (key, display) = match origin {
        Origin::Stored
            if !record.claim_key.is_empty() && record.claim_key != record.claim_value =>
        {
            (record.claim_key, Some(record.claim_value))
        }
        _ => (record.claim_value, None),
    };
    let record = ClaimRecord {
        key: ClaimKey {
            namespace,
            value: key,
        },
        display,
        owner_type,
        owner_value: record.owner_value,
        table_name,
        table_record_id: record.table_record_id,
    };
    record.check(&field)?;
    Ok(record)
}

/// The namespace a record, cursor or lookup names: `namespace`, or the legacy `claim_type`
/// (1/2/3: the built-ins); both set must agree. `field` is the path of the message holding them.
pub fn namespace_from_pb(
    claim_type: i32,
    namespace: &str,
    field: impl std::fmt::Display,
) -> Result<NamespaceId, ClaimsError> {
    let prefix = |name: &str| {
        let field = field.to_string();
        if field.is_empty() {
            name.to_owned()
        } else {
            format!("{field}.{name}")
        }
    };
    let legacy = match claim_type {
        0 => None,
        number => Some(match ClaimType::from_number(i64::from(number)) {
            Some(known) => known,
            None => ClaimType::parse_field(number, &prefix("claim_type"))?,
        }),
    };
    let id = match (namespace, legacy) {
        ("", Some(claim_type)) => NamespaceId::of_claim_type(claim_type),
        ("", None) => {
            return Err(ClaimsError::invalid(
                prefix("namespace"),
                "must be specified (or the legacy claim_type)",
            ))
        }
        (namespace, legacy) => {
            let id = NamespaceId::parse_field(namespace, &prefix("namespace"))?;
            if let Some(claim_type) = legacy.filter(|t| id.claim_type() != Some(*t)) {
                return Err(ClaimsError::invalid(
                    prefix("namespace"),
                    format!(
                        "{id:?} disagrees with claim_type {} (the namespace {:?}); set one of them",
                        claim_type.number(),
                        NamespaceId::of_claim_type(claim_type).as_str()
                    ),
                ));
            }
            id
        }
    };
    // Whether the store holds it is the store's to say (UNKNOWN_NAMESPACE), under the rules it
    // reads in the deciding transaction.
    Ok(id)
}

/// A record as answers and lease payloads carry it: `namespace` always, `claim_type` for the
/// built-ins (old clients read it), `claim_key` when the key differs from the value as sent.
pub fn claim_record_to_pb(record: &ClaimRecord) -> pb::ClaimRecord {
    pb::ClaimRecord {
        claim_type: record.key.namespace.claim_type_number(),
        claim_value: record.display_value().to_owned(),
        owner: record.owner_type.number(),
        owner_value: record.owner_value.clone(),
        table_name: record.table_name.number(),
        owner_type: record.owner_type.name().to_owned(),
        source_table: record.table_name.name().to_owned(),
        table_record_id: record.table_record_id,
        namespace: record.key.namespace.to_string(),
        claim_key: if record.display.is_some() {
            record.key.value.clone()
        } else {
            String::new()
        },
    }
}

/// Decodes and validates a BeginUpdate request (field by field; batch rules are the domain's).
/// Takes the message by value: its strings move into the domain request, uncopied (every
/// BeginUpdate and every stored lease payload comes through here).
pub fn begin_update_from_pb(request: pb::BeginUpdateRequest) -> Result<BeginUpdate, ClaimsError> {
    begin_update_from(request, Origin::Request)
}

fn begin_update_from(
    request: pb::BeginUpdateRequest,
    origin: Origin,
) -> Result<BeginUpdate, ClaimsError> {
    let records = |list: Vec<pb::ClaimRecord>, name: &str| {
        list.into_iter()
            .enumerate()
            .map(|(i, r)| claim_record_from(r, format_args!("{name}[{i}]"), origin))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(BeginUpdate {
        cell_id: CellId::parse(&request.cell_id)?,
        lease_id: optional_lease_id(&request.lease_id)?,
        creates: records(request.creates_claims, "creates_claims")?,
        destroys: records(request.destroys_claims, "destroys_claims")?,
        updates: records(request.updates_claims, "updates_claims")?,
        local_transaction: LocalTransaction::parse_optional(&request.local_transaction)?,
    })
}

fn optional_lease_id(value: &str) -> Result<Option<LeaseId>, ClaimsError> {
    if value.is_empty() {
        Ok(None)
    } else {
        LeaseId::parse(value).map(Some)
    }
}

pub fn begin_update_to_pb(request: &BeginUpdate) -> pb::BeginUpdateRequest {
    pb::BeginUpdateRequest {
        cell_id: request.cell_id.to_string(),
        creates_claims: request.creates.iter().map(claim_record_to_pb).collect(),
        destroys_claims: request.destroys.iter().map(claim_record_to_pb).collect(),
        updates_claims: request.updates.iter().map(claim_record_to_pb).collect(),
        lease_id: request
            .lease_id
            .map(|id| id.to_string())
            .unwrap_or_default(),
        local_transaction: request
            .local_transaction
            .as_ref()
            .map(|t| t.as_str().to_owned())
            .unwrap_or_default(),
        restore_correction: false,
        wait_for_leased: None,
    }
}

/// The bytes a store keeps for a lease's original request (protobuf `BeginUpdateRequest`).
pub fn encode_request(request: &BeginUpdate) -> Vec<u8> {
    begin_update_to_pb(request).encode_to_vec()
}

/// Reads back what [`encode_request`] wrote. Failure means the store holds corrupt data.
pub fn decode_request(bytes: &[u8]) -> Result<BeginUpdate, ClaimsError> {
    let message = pb::BeginUpdateRequest::decode(bytes).map_err(|e| {
        ClaimsError::internal(format!("stored lease payload is not decodable: {e}"))
    })?;
    begin_update_from(message, Origin::Stored)
        .map_err(|e| ClaimsError::internal(format!("stored lease payload is invalid: {e}")))
}

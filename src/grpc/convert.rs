//! Conversions between the protobuf messages and the domain types. Decoding validates every
//! field (errors name the field's path); encoding cannot fail.
//!
//! Also the lease payload codec that stores use to keep the original request as bytes, so every
//! backend stores the same protobuf encoding the API returns.

use prost::Message;

use crate::domain::{
    check_record_id, check_value, page_limit, BeginUpdate, CellId, Claim, ClaimKey, ClaimRecord,
    ClaimState, ClaimType, ClaimsPage, ClaimsQuery, Lease, LeaseId, LeasesPage, LeasesQuery,
    OwnerType, TableName, Timestamp, CLAIMS_DEFAULT_LIMIT, CLAIMS_MAX_LIMIT, LEASES_DEFAULT_LIMIT,
    LEASES_MAX_LIMIT,
};
use crate::error::ClaimsError;
use crate::grpc::pb;

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

/// Decodes and validates a claim record; `field` prefixes error paths.
pub fn claim_record_from_pb(
    record: &pb::ClaimRecord,
    field: &str,
) -> Result<ClaimRecord, ClaimsError> {
    let record = ClaimRecord {
        key: ClaimKey {
            claim_type: ClaimType::parse_field(record.claim_type, &format!("{field}.claim_type"))?,
            value: record.claim_value.clone(),
        },
        owner_type: OwnerType::parse_field(record.owner, &format!("{field}.owner"))?,
        owner_value: record.owner_value.clone(),
        table_name: TableName::parse_field(record.table_name, &format!("{field}.table_name"))?,
        table_record_id: record.table_record_id,
    };
    record.check(field)?;
    Ok(record)
}

pub fn claim_record_to_pb(record: &ClaimRecord) -> pb::ClaimRecord {
    pb::ClaimRecord {
        claim_type: record.key.claim_type.number(),
        claim_value: record.key.value.clone(),
        owner: record.owner_type.number(),
        owner_value: record.owner_value.clone(),
        table_name: record.table_name.number(),
        table_record_id: record.table_record_id,
    }
}

/// Decodes and validates a BeginUpdate request (field by field; batch rules are the domain's).
pub fn begin_update_from_pb(request: &pb::BeginUpdateRequest) -> Result<BeginUpdate, ClaimsError> {
    let records = |list: &[pb::ClaimRecord], name: &str| {
        list.iter()
            .enumerate()
            .map(|(i, r)| claim_record_from_pb(r, &format!("{name}[{i}]")))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(BeginUpdate {
        cell_id: CellId::parse(&request.cell_id)?,
        lease_id: optional_lease_id(&request.lease_id)?,
        creates: records(&request.creates_claims, "creates_claims")?,
        destroys: records(&request.destroys_claims, "destroys_claims")?,
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
        lease_id: request
            .lease_id
            .map(|id| id.to_string())
            .unwrap_or_default(),
    }
}

pub fn lease_payload_to_pb(lease: &Lease) -> pb::LeasePayload {
    pb::LeasePayload {
        lease_id: lease.lease_id.to_string(),
        cell_id: lease.cell_id.to_string(),
        created_at: Some(timestamp_to_pb(lease.created_at)),
        original_request: Some(begin_update_to_pb(&lease.request)),
    }
}

pub fn claim_state_to_pb(state: ClaimState) -> pb::ClaimState {
    match state {
        ClaimState::Active => pb::ClaimState::Active,
        ClaimState::Creating => pb::ClaimState::Creating,
        ClaimState::Destroying => pb::ClaimState::Destroying,
    }
}

pub fn claim_info_to_pb(claim: &Claim) -> pb::ClaimInfo {
    let record = &claim.record;
    pb::ClaimInfo {
        claim_type: record.key.claim_type.number(),
        claim_value: record.key.value.clone(),
        owner_type: record.owner_type.number(),
        owner_value: record.owner_value.clone(),
        table_name: record.table_name.number(),
        table_record_id: record.table_record_id,
        created_at: Some(timestamp_to_pb(claim.created_at)),
        updated_at: Some(timestamp_to_pb(claim.updated_at)),
        state: claim_state_to_pb(claim.state()).into(),
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
    begin_update_from_pb(&message)
        .map_err(|e| ClaimsError::internal(format!("stored lease payload is invalid: {e}")))
}

/// The `(cell_id, lease_id)` of CommitUpdate, RollbackUpdate and RenewLease; both required.
pub fn lease_ref_from_pb(cell_id: &str, lease_id: &str) -> Result<(CellId, LeaseId), ClaimsError> {
    Ok((CellId::parse(cell_id)?, LeaseId::parse(lease_id)?))
}

/// Decodes a ListOutstandingLeases request: `cursor` empty or a lease id, `limit` 0 (default
/// 100) up to 1000.
pub fn leases_query_from_pb(
    request: &pb::ListOutstandingLeasesRequest,
) -> Result<LeasesQuery, ClaimsError> {
    let cell_id = CellId::parse(&request.cell_id)?;
    let after = if request.cursor.is_empty() {
        None
    } else {
        Some(LeaseId::parse_field(&request.cursor, "cursor")?)
    };
    let limit = page_limit(
        request.limit,
        LEASES_DEFAULT_LIMIT,
        LEASES_MAX_LIMIT,
        "limit",
    )?;
    Ok(LeasesQuery {
        cell_id,
        after,
        limit,
    })
}

/// Decodes a ListClaims request: `0 <= cursor < i64::MAX`, `limit` 0 (default 1000) up to 10000.
pub fn claims_query_from_pb(request: &pb::ListClaimsRequest) -> Result<ClaimsQuery, ClaimsError> {
    let cell_id = CellId::parse(&request.cell_id)?;
    let table_name = TableName::parse_field(request.table_name, "table_name")?;
    check_record_id(request.cursor, "cursor")?;
    let limit = page_limit(
        request.limit,
        CLAIMS_DEFAULT_LIMIT,
        CLAIMS_MAX_LIMIT,
        "limit",
    )?;
    Ok(ClaimsQuery {
        cell_id,
        table_name,
        cursor: request.cursor,
        limit,
    })
}

/// Decodes a LookupClaim request into the claim's key.
pub fn claim_key_from_pb(request: &pb::LookupClaimRequest) -> Result<ClaimKey, ClaimsError> {
    let claim_type = ClaimType::parse_field(request.claim_type, "claim_type")?;
    check_value(&request.claim_value, "claim_value")?;
    Ok(ClaimKey::new(claim_type, request.claim_value.clone()))
}

pub fn renew_response_to_pb(lease: &Lease) -> pb::RenewLeaseResponse {
    pb::RenewLeaseResponse {
        lease_payload: Some(lease_payload_to_pb(lease)),
        last_renewed_at: Some(timestamp_to_pb(lease.last_renewed_at)),
    }
}

pub fn leases_page_to_pb(page: &LeasesPage) -> pb::ListOutstandingLeasesResponse {
    pb::ListOutstandingLeasesResponse {
        leases: page
            .leases
            .iter()
            .map(|lease| pb::OutstandingLease {
                lease_payload: Some(lease_payload_to_pb(lease)),
                last_renewed_at: Some(timestamp_to_pb(lease.last_renewed_at)),
            })
            .collect(),
        next_cursor: page
            .next_cursor
            .map(|id| id.to_string())
            .unwrap_or_default(),
        server_time: Some(timestamp_to_pb(page.server_time)),
    }
}

pub fn claims_page_to_pb(page: &ClaimsPage) -> pb::ListClaimsResponse {
    pb::ListClaimsResponse {
        claims: page.claims.iter().map(claim_info_to_pb).collect(),
        start_range: page.start_range,
        end_range: page.end_range,
        next_cursor: page.next_cursor,
    }
}

pub fn lookup_response_to_pb(claim: &Claim) -> pb::LookupClaimResponse {
    pb::LookupClaimResponse {
        claim: Some(claim_info_to_pb(claim)),
        cell_id: claim.cell_id.to_string(),
        state: claim_state_to_pb(claim.state()).into(),
    }
}

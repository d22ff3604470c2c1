//! Conversions between the API's request / response messages and the domain types. Decoding
//! validates every field (errors name the field's path); encoding cannot fail.
//!
//! The claim record, BeginUpdate and timestamp encodings are shared with the stored lease
//! payload, so they live in [`crate::codec`] and are re-exported here.

use crate::domain::{
    check_record_id, check_value, page_limit, CellId, Claim, ClaimKey, ClaimState, ClaimType,
    ClaimsPage, ClaimsQuery, Lease, LeaseId, LeasesPage, LeasesQuery, TableName,
    CLAIMS_DEFAULT_LIMIT, CLAIMS_MAX_LIMIT, LEASES_DEFAULT_LIMIT, LEASES_MAX_LIMIT,
};
use crate::error::ClaimsError;
use crate::grpc::pb;

pub use crate::codec::{
    begin_update_from_pb, begin_update_to_pb, claim_record_from_pb, claim_record_to_pb,
    timestamp_from_pb, timestamp_to_pb,
};

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

//! Client-side decoding of responses into domain types. A response that does not decode is the
//! server's fault (or a version mismatch) and becomes `ClaimsError::Internal` naming the field.

use crate::domain::{
    CellId, ClaimState, ClaimView, ClaimViewsPage, ClaimsQuery, Lease, LeaseId, LeasesPage,
    LeasesQuery, Timestamp,
};
use crate::error::ClaimsError;
use crate::grpc::convert::{begin_update_from_pb, claim_record_from_pb, timestamp_from_pb};
use crate::grpc::pb;

fn bad(field: &str, what: impl std::fmt::Display) -> ClaimsError {
    ClaimsError::internal(format!("malformed response: {field}: {what}"))
}

fn required_time(
    ts: Option<&prost_types::Timestamp>,
    field: &str,
) -> Result<Timestamp, ClaimsError> {
    ts.map(timestamp_from_pb)
        .ok_or_else(|| bad(field, "missing"))
}

/// A lease from its payload and last renewal (`None`: never renewed, i.e. `created_at`).
pub fn lease_from_pb(
    payload: Option<&pb::LeasePayload>,
    last_renewed_at: Option<&prost_types::Timestamp>,
) -> Result<Lease, ClaimsError> {
    let payload = payload.ok_or_else(|| bad("lease_payload", "missing"))?;
    let created_at = required_time(payload.created_at.as_ref(), "lease_payload.created_at")?;
    let request = payload
        .original_request
        .as_ref()
        .ok_or_else(|| bad("lease_payload.original_request", "missing"))?;
    Ok(Lease {
        lease_id: LeaseId::parse(&payload.lease_id)
            .map_err(|e| bad("lease_payload.lease_id", e))?,
        cell_id: CellId::parse(&payload.cell_id).map_err(|e| bad("lease_payload.cell_id", e))?,
        created_at,
        last_renewed_at: last_renewed_at.map(timestamp_from_pb).unwrap_or(created_at),
        request: begin_update_from_pb(request)
            .map_err(|e| bad("lease_payload.original_request", e))?,
    })
}

pub fn claim_state_from_pb(state: i32) -> Result<ClaimState, ClaimsError> {
    match pb::ClaimState::try_from(state) {
        Ok(pb::ClaimState::Active) => Ok(ClaimState::Active),
        Ok(pb::ClaimState::Creating) => Ok(ClaimState::Creating),
        Ok(pb::ClaimState::Destroying) => Ok(ClaimState::Destroying),
        _ => Err(bad("state", format!("unknown claim state {state}"))),
    }
}

/// A claim from a ClaimInfo held by `cell_id`.
pub fn claim_view_from_pb(info: &pb::ClaimInfo, cell_id: CellId) -> Result<ClaimView, ClaimsError> {
    let record = pb::ClaimRecord {
        claim_type: info.claim_type,
        claim_value: info.claim_value.clone(),
        owner: info.owner_type,
        owner_value: info.owner_value.clone(),
        table_name: info.table_name,
        table_record_id: info.table_record_id,
    };
    Ok(ClaimView {
        record: claim_record_from_pb(&record, "claim").map_err(|e| bad("claim", e))?,
        cell_id,
        state: claim_state_from_pb(info.state)?,
        created_at: required_time(info.created_at.as_ref(), "claim.created_at")?,
        updated_at: required_time(info.updated_at.as_ref(), "claim.updated_at")?,
    })
}

pub fn lookup_from_pb(response: &pb::LookupClaimResponse) -> Result<ClaimView, ClaimsError> {
    let info = response
        .claim
        .as_ref()
        .ok_or_else(|| bad("claim", "missing"))?;
    let cell_id = CellId::parse(&response.cell_id).map_err(|e| bad("cell_id", e))?;
    claim_view_from_pb(info, cell_id)
}

pub fn leases_query_to_pb(query: &LeasesQuery) -> pb::ListOutstandingLeasesRequest {
    pb::ListOutstandingLeasesRequest {
        cell_id: query.cell_id.to_string(),
        cursor: query.after.map(|id| id.to_string()).unwrap_or_default(),
        limit: i32::try_from(query.limit).unwrap_or(i32::MAX),
    }
}

pub fn leases_page_from_pb(
    response: &pb::ListOutstandingLeasesResponse,
) -> Result<LeasesPage, ClaimsError> {
    let leases = response
        .leases
        .iter()
        .map(|l| lease_from_pb(l.lease_payload.as_ref(), l.last_renewed_at.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    let next_cursor = match response.next_cursor.as_str() {
        "" => None,
        cursor => Some(LeaseId::parse(cursor).map_err(|e| bad("next_cursor", e))?),
    };
    Ok(LeasesPage {
        leases,
        next_cursor,
        server_time: required_time(response.server_time.as_ref(), "server_time")?,
    })
}

pub fn claims_query_to_pb(query: &ClaimsQuery) -> pb::ListClaimsRequest {
    pb::ListClaimsRequest {
        cell_id: query.cell_id.to_string(),
        table_name: query.table_name.number(),
        cursor: query.cursor,
        limit: i32::try_from(query.limit).unwrap_or(i32::MAX),
    }
}

pub fn claims_page_from_pb(
    response: &pb::ListClaimsResponse,
    cell_id: &CellId,
) -> Result<ClaimViewsPage, ClaimsError> {
    Ok(ClaimViewsPage {
        claims: response
            .claims
            .iter()
            .map(|info| claim_view_from_pb(info, cell_id.clone()))
            .collect::<Result<Vec<_>, _>>()?,
        start_range: response.start_range,
        end_range: response.end_range,
        next_cursor: response.next_cursor,
    })
}

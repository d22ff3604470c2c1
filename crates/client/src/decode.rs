//! The client side of the API: the client every caller of ours builds ([`claims_client`], with
//! the largest response it must accept), requests from domain queries, and responses decoded
//! into domain types. A response that does not decode is the server's fault (or a version
//! mismatch) and becomes `ClaimsError::Internal` naming the field.

use tonic::transport::Channel;

use topology_claims::domain::{
    CellId, Claim, ClaimEvent, ClaimLease, ClaimState, ClaimView, ClaimViewsPage, ClaimsCursor,
    ClaimsQuery, EventPosition, Lease, LeaseId, LeaseOp, LeasesPage, LeasesQuery, RestoreView,
    SlotGrant, SlotHolder, Timestamp,
};
use topology_claims::error::ClaimsError;
use topology_claims_proto::convert::{
    begin_update_from_server_pb, claim_key_cursor_from_pb, claim_key_cursor_to_pb,
    claim_record_from_server_pb, timestamp_from_pb,
};
use topology_claims_proto::pb;
use topology_claims_proto::pb::claims_service_client::ClaimsServiceClient;

/// The largest response message our clients decode (tonic's default is 4 MiB). List pages stop
/// before the server's `--max-response-bytes` (at most about 4 MB), but a ListOutstandingLeases
/// page always holds at least one lease, and one lease carries its whole BeginUpdate request,
/// which may itself be up to the server's 4 MiB request limit. 8 MiB holds that lease with room
/// for the rest of the page; a client at tonic's default could fail on it forever
/// (`decoded message length too large`), and a reconciler could never heal the lease.
pub const MAX_RESPONSE_MESSAGE_BYTES: usize = 8 * 1024 * 1024;

/// A `ClaimsService` client on `channel` that accepts every response the server can send
/// ([`MAX_RESPONSE_MESSAGE_BYTES`]). Every client of ours is built here.
pub fn claims_client(channel: Channel) -> ClaimsServiceClient<Channel> {
    ClaimsServiceClient::new(channel).max_decoding_message_size(MAX_RESPONSE_MESSAGE_BYTES)
}

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
        .clone()
        .ok_or_else(|| bad("lease_payload.original_request", "missing"))?;
    Ok(Lease {
        lease_id: LeaseId::parse(&payload.lease_id)
            .map_err(|e| bad("lease_payload.lease_id", e))?,
        cell_id: CellId::parse(&payload.cell_id).map_err(|e| bad("lease_payload.cell_id", e))?,
        created_at,
        last_renewed_at: last_renewed_at.map(timestamp_from_pb).unwrap_or(created_at),
        request: begin_update_from_server_pb(request)
            .map_err(|e| bad("lease_payload.original_request", e))?,
    })
}

pub fn claim_state_from_pb(state: i32) -> Result<ClaimState, ClaimsError> {
    match pb::ClaimState::try_from(state) {
        Ok(pb::ClaimState::Active) => Ok(ClaimState::Active),
        Ok(pb::ClaimState::Creating) => Ok(ClaimState::Creating),
        Ok(pb::ClaimState::Destroying) => Ok(ClaimState::Destroying),
        Ok(pb::ClaimState::Updating) => Ok(ClaimState::Updating),
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
        namespace: info.namespace.clone(),
        claim_key: info.claim_key.clone(),
        owner_type: info.owner_type_name.clone(),
        source_table: info.source_table.clone(),
    };
    Ok(ClaimView {
        record: claim_record_from_server_pb(record, "claim").map_err(|e| bad("claim", e))?,
        cell_id,
        state: claim_state_from_pb(info.state)?,
        created_at: required_time(info.created_at.as_ref(), "claim.created_at")?,
        updated_at: required_time(info.updated_at.as_ref(), "claim.updated_at")?,
        revision: info.revision,
    })
}

/// A change-feed event from the wire. The wire carries no timestamps: `created_at` and
/// `updated_at` are zero; `seq` is the event's place among those of its revision received so
/// far, counted by the caller.
pub fn claim_event_from_pb(event: &pb::ClaimEvent, seq: u64) -> Result<ClaimEvent, ClaimsError> {
    let record = pb::ClaimRecord {
        claim_value: event.claim_value.clone(),
        owner_value: event.owner_value.clone(),
        table_record_id: event.source_record_id,
        namespace: event.namespace.clone(),
        claim_key: event.claim_key.clone(),
        owner_type: event.owner_type.clone(),
        source_table: event.source_table.clone(),
        ..pb::ClaimRecord::default()
    };
    let op = match claim_state_from_pb(event.state)? {
        ClaimState::Active => None,
        ClaimState::Creating => Some(LeaseOp::Create),
        ClaimState::Destroying => Some(LeaseOp::Destroy),
        ClaimState::Updating => Some(LeaseOp::Update),
    };
    let lease = match op {
        None => None,
        Some(op) => Some(ClaimLease {
            lease_id: LeaseId::parse(&event.lease_id).map_err(|e| bad("lease_id", e))?,
            op,
        }),
    };
    Ok(ClaimEvent {
        position: EventPosition {
            revision: event.revision,
            seq,
        },
        claim: Claim {
            record: claim_record_from_server_pb(record, "event").map_err(|e| bad("event", e))?,
            cell_id: CellId::parse(&event.cell_id).map_err(|e| bad("cell_id", e))?,
            lease,
            created_at: Timestamp::from_unix_micros(0),
            updated_at: Timestamp::from_unix_micros(0),
            revision: event.revision,
        },
        deleted: event.deleted,
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

/// The request of a leases page (`query.max_bytes` is the server's, never sent).
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
        restore: response
            .restore
            .as_ref()
            .map(restore_view_from_pb)
            .transpose()?,
    })
}

/// A leases page's `restore`.
pub fn restore_view_from_pb(info: &pb::RestoreInfo) -> Result<RestoreView, ClaimsError> {
    Ok(RestoreView {
        epoch: info.epoch,
        backup_time: required_time(info.backup_time.as_ref(), "restore.backup_time")?,
        marked_at: required_time(info.marked_at.as_ref(), "restore.marked_at")?,
        quarantined: info.quarantined,
        reported: info.reported,
    })
}

/// The request of a claims page (`query.max_bytes` is the server's, never sent): the previous
/// page's `next_page_token` when there is one (it is the whole position: nothing else of it is
/// sent), else `query.cursor` (how a listing starts, and how it continues on a server older
/// than page tokens). Always says it follows page tokens (`page_tokens`), so a record split
/// over pages is served, not refused.
pub fn claims_query_to_pb(query: &ClaimsQuery, page_token: Option<&str>) -> pb::ListClaimsRequest {
    let (cursor, cursor_key) = match page_token {
        Some(_) => (0, None),
        None => (
            query.cursor.record_id,
            query.cursor.after_key.as_ref().map(claim_key_cursor_to_pb),
        ),
    };
    pb::ListClaimsRequest {
        cell_id: query.cell_id.to_string(),
        table_name: query.table_name.number(),
        // Both: a server from before free-form tables reads the enum (and lists no other).
        source_table: query.table_name.name().to_owned(),
        cursor,
        limit: i32::try_from(query.limit).unwrap_or(i32::MAX),
        cursor_key,
        page_token: page_token.unwrap_or_default().to_owned(),
        page_tokens: true,
    }
}

pub fn claims_page_from_pb(
    response: &pb::ListClaimsResponse,
    cell_id: &CellId,
) -> Result<ClaimViewsPage, ClaimsError> {
    let after_key = response
        .next_cursor_key
        .as_ref()
        .map(|key| {
            claim_key_cursor_from_pb(key, "next_cursor_key").map_err(|e| bad("next_cursor_key", e))
        })
        .transpose()?;
    let next_cursor = match (response.next_cursor, after_key) {
        (Some(record_id), after_key) => Some(ClaimsCursor {
            record_id,
            after_key,
        }),
        (None, None) => None,
        (None, Some(_)) => return Err(bad("next_cursor_key", "set without next_cursor")),
    };
    Ok(ClaimViewsPage {
        claims: response
            .claims
            .iter()
            .map(|info| claim_view_from_pb(info, cell_id.clone()))
            .collect::<Result<Vec<_>, _>>()?,
        start_range: response.start_range,
        end_range: response.end_range,
        next_page_token: Some(response.next_page_token.clone())
            .filter(|token| !token.is_empty() && next_cursor.is_some()),
        next_cursor,
    })
}

/// A granted slot from an AcquireVerificationSlot response.
pub fn slot_grant_from_pb(
    holder: &SlotHolder,
    response: &pb::AcquireVerificationSlotResponse,
) -> Result<SlotGrant, ClaimsError> {
    Ok(SlotGrant {
        holder: holder.clone(),
        expires_at: required_time(response.expires_at.as_ref(), "expires_at")?,
        renewed: response.renewed,
        in_use: response.in_use,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use topology_claims::domain::{ClaimKey, ClaimType, TableName};

    #[test]
    fn our_requests_follow_page_tokens_and_send_a_token_alone() {
        let query = ClaimsQuery::new(
            CellId::parse("cell-a").unwrap(),
            TableName::USERS,
            ClaimsCursor {
                record_id: 9,
                after_key: Some(ClaimKey::new(ClaimType::Username, "ada")),
            },
            5,
        );
        let by_token = claims_query_to_pb(&query, Some("t0ken"));
        assert_eq!(
            (
                by_token.page_token.as_str(),
                by_token.cursor,
                by_token.cursor_key
            ),
            ("t0ken", 0, None)
        );
        assert!(by_token.page_tokens);
        // Without a token (a listing's start, or an older server's pages): the cursor.
        let by_cursor = claims_query_to_pb(&query, None);
        assert_eq!((by_cursor.page_token.as_str(), by_cursor.cursor), ("", 9));
        assert!(by_cursor.cursor_key.is_some() && by_cursor.page_tokens);
    }
}

//! Conversions between the API's request / response messages and the domain types. Decoding
//! validates every field (errors name the field's path); encoding cannot fail.
//!
//! The claim record, BeginUpdate and timestamp encodings are shared with the stored lease
//! payload, so they live in [`topology_claims::codec`] and are re-exported here.

use crate::pb::admin as apb;
use crate::{page_token, pb};
use topology_claims::domain::{self, MarkRestored, RestoreEpoch, RestoreView};
use topology_claims::domain::{
    check_record_id, check_value, page_limit, CellId, Claim, ClaimEvent, ClaimKey, ClaimState,
    ClaimsCursor, ClaimsPage, ClaimsQuery, Lease, LeaseId, LeasesPage, LeasesQuery, SlotGrant,
    SlotHolder, SlotLimit, TableName, Timestamp, CLAIMS_DEFAULT_LIMIT, CLAIMS_MAX_LIMIT,
    LEASES_DEFAULT_LIMIT, LEASES_MAX_LIMIT,
};
use topology_claims::error::ClaimsError;

pub use topology_claims::codec::{
    begin_update_from_pb, begin_update_from_server_pb, begin_update_to_pb, claim_record_from_pb,
    claim_record_from_server_pb, claim_record_to_pb, namespace_from_pb, timestamp_from_pb,
    timestamp_to_pb,
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
        ClaimState::Updating => pb::ClaimState::Updating,
    }
}

pub fn claim_info_to_pb(claim: &Claim) -> pb::ClaimInfo {
    let record = &claim.record;
    pb::ClaimInfo {
        claim_type: record.key.namespace.claim_type_number(),
        claim_value: record.display_value().to_owned(),
        namespace: record.key.namespace.to_string(),
        claim_key: record.key.value.clone(),
        owner_type: record.owner_type.number(),
        owner_value: record.owner_value.clone(),
        table_name: record.table_name.number(),
        owner_type_name: record.owner_type.name().to_owned(),
        source_table: record.table_name.name().to_owned(),
        table_record_id: record.table_record_id,
        created_at: Some(timestamp_to_pb(claim.created_at)),
        updated_at: Some(timestamp_to_pb(claim.updated_at)),
        state: claim_state_to_pb(claim.state()).into(),
        revision: claim.revision,
    }
}

/// A change-feed event on the wire.
pub fn claim_event_to_pb(event: &ClaimEvent) -> pb::ClaimEvent {
    let claim = &event.claim;
    let record = &claim.record;
    pb::ClaimEvent {
        revision: event.position.revision,
        namespace: record.key.namespace.to_string(),
        claim_value: record.display_value().to_owned(),
        claim_key: record.key.value.clone(),
        state: claim_state_to_pb(claim.state()).into(),
        cell_id: claim.cell_id.to_string(),
        lease_id: claim
            .lease
            .map(|l| l.lease_id.to_string())
            .unwrap_or_default(),
        deleted: event.deleted,
        owner_type: record.owner_type.name().to_owned(),
        owner_value: record.owner_value.clone(),
        source_table: record.table_name.name().to_owned(),
        source_record_id: record.table_record_id,
    }
}

/// The `(cell_id, lease_id)` of CommitUpdate, RollbackUpdate and RenewLease; both required.
pub fn lease_ref_from_pb(cell_id: &str, lease_id: &str) -> Result<(CellId, LeaseId), ClaimsError> {
    Ok((CellId::parse(cell_id)?, LeaseId::parse(lease_id)?))
}

/// Decodes a RollbackUpdate request: the lease, and its condition (`unrenewed_for`, unset for
/// an unconditional rollback).
pub fn rollback_from_pb(
    request: &pb::RollbackUpdateRequest,
) -> Result<(CellId, LeaseId, Option<std::time::Duration>), ClaimsError> {
    let (cell_id, lease_id) = lease_ref_from_pb(&request.cell_id, &request.lease_id)?;
    let unrenewed_for = match &request.unrenewed_for {
        Some(d) => Some(duration_from_pb(Some(d), "unrenewed_for")?),
        None => None,
    };
    Ok((cell_id, lease_id, unrenewed_for))
}

/// Decodes a ListOutstandingLeases request: `cursor` empty or a lease id, `limit` 0 (default
/// 100) up to 1000. `max_bytes` is the server's response budget (`--max-response-bytes`).
pub fn leases_query_from_pb(
    request: &pb::ListOutstandingLeasesRequest,
    max_bytes: usize,
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
        max_bytes,
    })
}

/// Decodes a ListClaims request: `0 <= cursor < i64::MAX`, `cursor_key` absent or a claim key,
/// `page_token` empty or a token of this listing (cell and table), `limit` 0 (default 1000) up
/// to 10000. A token is the whole position: `cursor` and `cursor_key` beside it must be unset
/// or name the same position. `max_bytes` is the server's response budget
/// (`--max-response-bytes`).
pub fn claims_query_from_pb(
    request: &pb::ListClaimsRequest,
    max_bytes: usize,
) -> Result<ClaimsQuery, ClaimsError> {
    let cell_id = CellId::parse(&request.cell_id)?;
    let table_name = TableName::from_wire(
        request.table_name,
        &request.source_table,
        "table_name",
        "source_table",
    )?;
    check_record_id(request.cursor, "cursor")?;
    let after_key = request
        .cursor_key
        .as_ref()
        .map(|key| claim_key_cursor_from_pb(key, "cursor_key"))
        .transpose()?;
    let limit = page_limit(
        request.limit,
        CLAIMS_DEFAULT_LIMIT,
        CLAIMS_MAX_LIMIT,
        "limit",
    )?;
    let named = ClaimsCursor {
        record_id: request.cursor,
        after_key,
    };
    let cursor = if request.page_token.is_empty() {
        named
    } else {
        let position = page_token::decode(&request.page_token, &cell_id, &table_name)?;
        if named != ClaimsCursor::at(0) && named != position {
            return Err(ClaimsError::invalid(
                page_token::FIELD,
                "carries the whole position, and cursor / cursor_key name another one: send \
                 next_page_token alone",
            ));
        }
        position
    };
    Ok(ClaimsQuery {
        cell_id,
        table_name,
        cursor,
        limit,
        max_bytes,
    })
}

/// Whether a ListClaims client resumes inside a record, so that a page may end inside one
/// (`domain::check_claims_page_followable`): it follows page tokens (`page_tokens`, or sends
/// one), or it sends a `cursor_key`, so it knows next_cursor_key.
pub fn resumes_inside_records(request: &pb::ListClaimsRequest) -> bool {
    request.page_tokens || !request.page_token.is_empty() || request.cursor_key.is_some()
}

/// A `ClaimKeyCursor` (request or response) as a claim key; `field` prefixes error paths.
pub fn claim_key_cursor_from_pb(
    key: &pb::ClaimKeyCursor,
    field: &str,
) -> Result<ClaimKey, ClaimsError> {
    let namespace = namespace_from_pb(key.claim_type, &key.namespace, field)?;
    check_value(&key.claim_value, &format!("{field}.claim_value"))?;
    Ok(ClaimKey::new(namespace, key.claim_value.clone()))
}

pub fn claim_key_cursor_to_pb(key: &ClaimKey) -> pb::ClaimKeyCursor {
    pb::ClaimKeyCursor {
        claim_type: key.namespace.claim_type_number(),
        claim_value: key.value.clone(),
        namespace: key.namespace.to_string(),
    }
}

/// Decodes a LookupClaim request into the claim's key (the value as sent, until the store
/// resolves it under the namespace's rules).
pub fn claim_key_from_pb(request: &pb::LookupClaimRequest) -> Result<ClaimKey, ClaimsError> {
    let namespace = namespace_from_pb(request.claim_type, &request.namespace, "")?;
    check_value(&request.claim_value, "claim_value")?;
    Ok(ClaimKey::new(namespace, request.claim_value.clone()))
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
        restore: page.restore.as_ref().map(restore_view_to_pb),
    }
}

/// A cell's view of the latest restore (ListOutstandingLeases, ReportVerificationPass).
pub fn restore_view_to_pb(view: &RestoreView) -> pb::RestoreInfo {
    pb::RestoreInfo {
        epoch: view.epoch,
        backup_time: Some(timestamp_to_pb(view.backup_time)),
        marked_at: Some(timestamp_to_pb(view.marked_at)),
        quarantined: view.quarantined,
        reported: view.reported,
    }
}

/// The admin RestoreStatus of the latest epoch (`None`: never restored); `enforce` is
/// `--restore-quarantine`.
pub fn restore_status_to_pb(state: Option<&RestoreEpoch>, enforce: bool) -> apb::RestoreStatus {
    let Some(state) = state else {
        return apb::RestoreStatus::default();
    };
    apb::RestoreStatus {
        restored: true,
        epoch: state.epoch,
        backup_time: Some(timestamp_to_pb(state.backup_time)),
        marked_at: Some(timestamp_to_pb(state.marked_at)),
        reason: state.reason.clone(),
        expected_cells: state.expected_cells.iter().map(|c| c.to_string()).collect(),
        reported: state
            .reported
            .iter()
            .map(|(cell, at)| apb::CellReport {
                cell_id: cell.to_string(),
                reported_at: Some(timestamp_to_pb(*at)),
            })
            .collect(),
        pending_cells: state.pending_cells().map(|c| c.to_string()).collect(),
        lifted_at: state.lifted.as_ref().map(|(at, _)| timestamp_to_pb(*at)),
        lift_reason: state
            .lifted
            .as_ref()
            .map(|(_, why)| why.clone())
            .unwrap_or_default(),
        quarantine_enforced: domain::quarantine_active(Some(state), enforce),
    }
}

/// A RestoreStatus read back (clients and the conformance suite over gRPC).
pub fn restore_status_from_pb(
    status: &apb::RestoreStatus,
) -> Result<Option<RestoreEpoch>, ClaimsError> {
    if !status.restored {
        return Ok(None);
    }
    let time = |t: Option<&prost_types::Timestamp>, field: &str| {
        t.map(topology_claims::codec::timestamp_from_pb)
            .ok_or_else(|| ClaimsError::internal(format!("RestoreStatus without {field}")))
    };
    let cell = |c: &str| {
        CellId::parse(c).map_err(|e| ClaimsError::internal(format!("RestoreStatus: {e}")))
    };
    Ok(Some(RestoreEpoch {
        epoch: status.epoch,
        backup_time: time(status.backup_time.as_ref(), "backup_time")?,
        marked_at: time(status.marked_at.as_ref(), "marked_at")?,
        reason: status.reason.clone(),
        expected_cells: status
            .expected_cells
            .iter()
            .map(|c| cell(c))
            .collect::<Result<_, _>>()?,
        reported: status
            .reported
            .iter()
            .map(|r| {
                Ok((
                    cell(&r.cell_id)?,
                    time(r.reported_at.as_ref(), "reported_at")?,
                ))
            })
            .collect::<Result<_, ClaimsError>>()?,
        lifted: status.lifted_at.as_ref().map(|at| {
            (
                topology_claims::codec::timestamp_from_pb(at),
                status.lift_reason.clone(),
            )
        }),
    }))
}

/// A MarkRestored request, validated (the reason and the time are the domain's to judge).
pub fn mark_restored_from_pb(
    request: &apb::MarkRestoredRequest,
) -> Result<MarkRestored, ClaimsError> {
    let backup_time = request
        .backup_time
        .as_ref()
        .ok_or_else(|| ClaimsError::invalid("backup_time", "required (RFC 3339)"))?;
    Ok(MarkRestored {
        backup_time: Timestamp::from_wire(backup_time.seconds, backup_time.nanos, "backup_time")?,
        reason: request.reason.clone(),
        expect_cells: request
            .expect_cells
            .iter()
            .enumerate()
            .map(|(i, c)| CellId::parse_field(c, &format!("expect_cells[{i}]")))
            .collect::<Result<_, _>>()?,
    })
}

/// A page of `query`'s listing; `next_page_token` is bound to the query's cell and table.
pub fn claims_page_to_pb(page: &ClaimsPage, query: &ClaimsQuery) -> pb::ListClaimsResponse {
    pb::ListClaimsResponse {
        claims: page.claims.iter().map(claim_info_to_pb).collect(),
        start_range: page.start_range,
        end_range: page.end_range,
        next_cursor: page.next_cursor.as_ref().map(|c| c.record_id),
        next_cursor_key: page
            .next_cursor
            .as_ref()
            .and_then(|c| c.after_key.as_ref())
            .map(claim_key_cursor_to_pb),
        next_page_token: page
            .next_cursor
            .as_ref()
            .map(|next| page_token::encode(&query.cell_id, &query.table_name, next))
            .unwrap_or_default(),
    }
}

pub fn lookup_response_to_pb(claim: &Claim) -> pb::LookupClaimResponse {
    pb::LookupClaimResponse {
        claim: Some(claim_info_to_pb(claim)),
        cell_id: claim.cell_id.to_string(),
        state: claim_state_to_pb(claim.state()).into(),
        revision: claim.revision,
    }
}

/// The holder of a slot request: `cell_id` and `holder` (1 to 128 printable ASCII characters).
pub fn slot_holder_from_pb(cell_id: &str, holder: &str) -> Result<SlotHolder, ClaimsError> {
    SlotHolder::new(CellId::parse_field(cell_id, "cell_id")?, holder)
}

/// Decodes an AcquireVerificationSlot request: the holder and the ttl it asks for (`None`
/// when unset or zero: the server's).
pub fn slot_request_from_pb(
    request: &pb::AcquireVerificationSlotRequest,
) -> Result<(SlotHolder, Option<std::time::Duration>), ClaimsError> {
    let holder = slot_holder_from_pb(&request.cell_id, &request.holder)?;
    let ttl = duration_from_pb(request.ttl.as_ref(), "ttl")?;
    Ok((holder, Some(ttl).filter(|ttl| !ttl.is_zero())))
}

/// A granted slot, with the limit it was granted under.
pub fn slot_grant_to_pb(
    grant: &SlotGrant,
    limit: SlotLimit,
) -> pb::AcquireVerificationSlotResponse {
    pb::AcquireVerificationSlotResponse {
        expires_at: Some(timestamp_to_pb(grant.expires_at)),
        ttl: Some(duration_to_pb(limit.ttl)),
        renewed: grant.renewed,
        in_use: grant.in_use,
        max: limit.max,
    }
}

/// A protobuf duration as a std one: absent is zero, negative is refused.
pub fn duration_from_pb(
    duration: Option<&prost_types::Duration>,
    field: &str,
) -> Result<std::time::Duration, ClaimsError> {
    let Some(d) = duration else {
        return Ok(std::time::Duration::ZERO);
    };
    if d.seconds < 0 || d.nanos < 0 || d.nanos >= 1_000_000_000 {
        return Err(ClaimsError::invalid(
            field,
            "must be a non-negative duration",
        ));
    }
    Ok(std::time::Duration::new(d.seconds as u64, d.nanos as u32))
}

/// A duration as protobuf's.
pub fn duration_to_pb(duration: std::time::Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: duration.as_secs().min(i64::MAX as u64) as i64,
        nanos: duration.subsec_nanos() as i32,
    }
}

#[cfg(test)]
mod tests {
    //! The byte budget of the list pages is counted with the domain's upper bounds of the
    //! encoding (`domain::pages`); here they are held against prost's real encoding.

    use prost::Message;

    use super::*;
    use topology_claims::domain::ClaimType;
    use topology_claims::domain::{
        claim_encoded_len_bound, claims_page, lease_encoded_len_bound, leases_page, BeginUpdate,
        ClaimLease, ClaimRecord, LeaseOp, OwnerType, Timestamp, MAX_CELL_ID_LEN, MAX_VALUE_LEN,
    };

    /// The largest timestamps (every varint at full length) and the longest fields.
    const LATE: Timestamp = Timestamp::from_unix_micros(i64::MAX);
    const EARLY: Timestamp = Timestamp::from_unix_micros(i64::MIN + 1);

    fn cell(long: bool) -> CellId {
        CellId::parse(&if long {
            "c".repeat(MAX_CELL_ID_LEN)
        } else {
            "c".into()
        })
        .unwrap()
    }

    fn record(n: usize, value_len: usize, id: i64) -> ClaimRecord {
        let mut value = format!("v{n}-");
        while value.len() < value_len {
            value.push('x');
        }
        ClaimRecord {
            display: None,
            key: ClaimKey::new(ClaimType::Email, value.clone()),
            owner_type: OwnerType::PROJECT,
            owner_value: value,
            table_name: TableName::GROUPS,
            table_record_id: id,
        }
    }

    fn lease(n: u128, claims: usize, value_len: usize, long_cell: bool, time: Timestamp) -> Lease {
        let records: Vec<ClaimRecord> = (0..claims)
            .map(|i| record(i, value_len, i64::MAX - 1))
            .collect();
        Lease {
            lease_id: LeaseId::from_uuid(uuid::Uuid::from_u128(n)),
            cell_id: cell(long_cell),
            created_at: time,
            last_renewed_at: time,
            request: BeginUpdate {
                local_transaction: None,
                cell_id: cell(long_cell),
                lease_id: Some(LeaseId::from_uuid(uuid::Uuid::from_u128(n))),
                creates: records[..claims / 2].to_vec(),
                destroys: records[claims / 2..].to_vec(),
                updates: Vec::new(),
            },
        }
    }

    fn claim(n: usize, value_len: usize, id: i64, time: Timestamp) -> Claim {
        Claim {
            record: record(n, value_len, id),
            cell_id: cell(true),
            lease: Some(ClaimLease {
                lease_id: LeaseId::from_uuid(uuid::Uuid::from_u128(1)),
                op: LeaseOp::Destroy,
            }),
            created_at: time,
            updated_at: time,
            // The largest revision: the page bounds must hold for any.
            revision: u64::MAX,
        }
    }

    fn one_lease_len(lease: &Lease) -> usize {
        let page = LeasesPage {
            leases: vec![lease.clone()],
            next_cursor: None,
            server_time: Timestamp::from_unix_micros(0),
            restore: None,
        };
        let empty = LeasesPage {
            leases: Vec::new(),
            ..page.clone()
        };
        leases_page_to_pb(&page).encoded_len() - leases_page_to_pb(&empty).encoded_len()
    }

    fn listing() -> ClaimsQuery {
        ClaimsQuery::new(cell(true), TableName::GROUPS, ClaimsCursor::at(0), 10)
    }

    fn one_claim_len(claim: &Claim) -> usize {
        let page = ClaimsPage {
            claims: vec![claim.clone()],
            start_range: 0,
            end_range: 0,
            next_cursor: None,
        };
        let empty = ClaimsPage {
            claims: Vec::new(),
            ..page.clone()
        };
        claims_page_to_pb(&page, &listing()).encoded_len()
            - claims_page_to_pb(&empty, &listing()).encoded_len()
    }

    #[test]
    fn lease_and_claim_bounds_are_upper_bounds_and_tight_for_large_items() {
        for time in [EARLY, Timestamp::from_unix_micros(0), LATE] {
            for long_cell in [false, true] {
                for (claims, value_len) in
                    [(1, 1), (2, 40), (7, MAX_VALUE_LEN), (1000, MAX_VALUE_LEN)]
                {
                    let lease = lease(7, claims, value_len, long_cell, time);
                    let (bound, real) = (lease_encoded_len_bound(&lease), one_lease_len(&lease));
                    assert!(bound >= real, "lease of {claims}: bound {bound} < {real}");
                    if claims == 1000 {
                        assert!(bound * 100 <= real * 103, "lease bound {bound} vs {real}");
                    }
                }
            }
            for value_len in [1, 17, MAX_VALUE_LEN] {
                for id in [0, 300, i64::MAX - 1] {
                    let claim = claim(3, value_len, id, time);
                    let (bound, real) = (claim_encoded_len_bound(&claim), one_claim_len(&claim));
                    assert!(bound >= real, "claim: bound {bound} < {real}");
                    if value_len == MAX_VALUE_LEN {
                        assert!(bound * 100 <= real * 103, "claim bound {bound} vs {real}");
                    }
                }
            }
        }
    }

    #[test]
    fn encoded_pages_stay_within_the_budget() {
        let budget = 64 * 1024;
        let leases: Vec<Lease> = (1..=6)
            .map(|n| lease(n, 40, MAX_VALUE_LEN, true, LATE))
            .collect();
        let query = LeasesQuery {
            cell_id: cell(true),
            after: None,
            limit: 100,
            max_bytes: budget,
        };
        let page = leases_page(&query, leases, LATE);
        assert!(page.leases.len() > 1 && page.next_cursor.is_some());
        let len = leases_page_to_pb(&page).encoded_len();
        assert!(len <= budget, "leases page of {len} bytes");

        // One record whose claims fill pages: every page carries the longest key cursor.
        let claims: Vec<Claim> = (0..400)
            .map(|n| claim(n, MAX_VALUE_LEN, i64::MAX - 1, LATE))
            .collect();
        let query = ClaimsQuery {
            cell_id: cell(true),
            table_name: TableName::GROUPS,
            cursor: ClaimsCursor::at(i64::MAX - 1),
            limit: 10_000,
            max_bytes: budget,
        };
        let page = claims_page(&query, claims);
        assert!(page
            .next_cursor
            .as_ref()
            .is_some_and(|c| c.after_key.is_some()));
        let len = claims_page_to_pb(&page, &query).encoded_len();
        assert!(len <= budget, "claims page of {len} bytes");
        assert!(
            len * 100 >= budget * 95,
            "claims page of {len} bytes is needlessly small"
        );
    }

    #[test]
    fn stream_claims_messages_are_list_claims_messages_on_the_wire() {
        let request = pb::ListClaimsRequest {
            cell_id: "cell-a".into(),
            table_name: 2,
            cursor: 41,
            limit: 7,
            cursor_key: Some(pb::ClaimKeyCursor {
                claim_type: 3,
                claim_value: "v".into(),
                ..Default::default()
            }),
            page_token: "token".into(),
            page_tokens: true,
            source_table: "emails".into(),
        };
        let stream = pb::StreamClaimsRequest::from(request.clone());
        assert_eq!(stream.encode_to_vec(), request.encode_to_vec());
        assert_eq!(pb::ListClaimsRequest::from(stream), request);
        let claim = claim(3, 17, 41, LATE);
        let page = claims_page_to_pb(
            &ClaimsPage {
                claims: vec![claim.clone(), claim],
                start_range: 5,
                end_range: 41,
                next_cursor: Some(ClaimsCursor {
                    record_id: 41,
                    after_key: Some(ClaimKey::new(ClaimType::Email, "v")),
                }),
            },
            &listing(),
        );
        assert!(!page.next_page_token.is_empty());
        let range = pb::ClaimsRange::from(page.clone());
        assert_eq!(range.encoded_len(), page.encoded_len(), "same byte budget");
        assert_eq!(range.encode_to_vec(), page.encode_to_vec());
        assert_eq!(pb::ListClaimsResponse::from(range), page);
    }

    fn list_request(cursor: i64, page_token: String) -> pb::ListClaimsRequest {
        pb::ListClaimsRequest {
            cell_id: "cell-a".into(),
            table_name: TableName::USERS.number(),
            cursor,
            limit: 0,
            cursor_key: None,
            page_token,
            page_tokens: true,
            source_table: String::new(),
        }
    }

    #[test]
    fn a_page_token_is_the_next_page_position_of_its_own_listing_only() {
        let query = claims_query_from_pb(&list_request(0, String::new()), 1 << 20).unwrap();
        let next = ClaimsCursor {
            record_id: 9,
            after_key: Some(ClaimKey::new(ClaimType::Username, "ada")),
        };
        let page = ClaimsPage {
            claims: Vec::new(),
            start_range: 0,
            end_range: 9,
            next_cursor: Some(next.clone()),
        };
        let token = claims_page_to_pb(&page, &query).next_page_token;
        let resumed = claims_query_from_pb(&list_request(0, token.clone()), 1 << 20).unwrap();
        assert_eq!(resumed.cursor, next);
        // Beside a token, cursor may name the token's own record only with its key, i.e. not
        // at all here: record 9 alone is another position (its first claim).
        let conflicting = claims_query_from_pb(&list_request(9, token.clone()), 1 << 20);
        assert!(
            matches!(&conflicting, Err(ClaimsError::InvalidRequest { field, .. }) if field == "page_token"),
            "{conflicting:?}"
        );
        let mut other_cell = list_request(0, token.clone());
        other_cell.cell_id = "cell-b".into();
        let mut other_table = list_request(0, token);
        other_table.table_name = TableName::EMAILS.number();
        for request in [other_cell, other_table] {
            let refused = claims_query_from_pb(&request, 1 << 20);
            assert!(
                matches!(&refused, Err(ClaimsError::InvalidRequest { field, .. }) if field == "page_token"),
                "{refused:?}"
            );
        }
        let last = ClaimsPage {
            next_cursor: None,
            end_range: i64::MAX,
            ..page
        };
        assert_eq!(claims_page_to_pb(&last, &query).next_page_token, "");
    }
}

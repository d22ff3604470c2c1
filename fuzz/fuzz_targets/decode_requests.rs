//! Arbitrary bytes as the body of each RPC: protobuf decoding, then the front end's field
//! validation (`grpc::convert`) and the batch check (`domain::check_batch`), exactly what the
//! service runs before any store access. Must never panic; whatever validation accepts must
//! satisfy the documented limits and survive the stored-payload codec unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use topology_claims::codec;
use topology_claims::domain::{self, MAX_CELL_ID_LEN, MAX_LOCAL_TRANSACTION_LEN, MAX_VALUE_LEN};
use topology_claims_proto::{convert, pb};
use topology_claims::BeginUpdate;

fn check_accepted_begin(request: &BeginUpdate) {
    assert!(request.cell_id.as_str().len() <= MAX_CELL_ID_LEN);
    for (_, record) in request.operations() {
        assert!(!record.key.value.is_empty() && record.key.value.len() <= MAX_VALUE_LEN);
        assert!(!record.owner_value.is_empty() && record.owner_value.len() <= MAX_VALUE_LEN);
        assert!((0..i64::MAX).contains(&record.table_record_id));
    }
    if let Some(local) = &request.local_transaction {
        let text = local.as_str();
        assert!(!text.is_empty() && text.len() <= MAX_LOCAL_TRANSACTION_LEN);
        assert!(text.bytes().all(|b| (b' '..=b'~').contains(&b)));
    }
    // The lease payload codec every store uses must give back exactly what it was given.
    let stored = codec::encode_request(request);
    let back = codec::decode_request(&stored).expect("an accepted request round-trips");
    assert_eq!(&back, request);
    assert_eq!(
        convert::begin_update_to_pb(&back),
        convert::begin_update_to_pb(request)
    );
}

fuzz_target!(|data: &[u8]| {
    // The first byte picks the method, as the path would; the rest is the message.
    let Some((&method, body)) = data.split_first() else {
        return;
    };
    match method % 7 {
        0 => {
            if let Ok(message) = pb::BeginUpdateRequest::decode(body) {
                if let Ok(request) = convert::begin_update_from_pb(message) {
                    match domain::check_batch(&request, domain::DEFAULT_MAX_BATCH) {
                        Ok(()) => {
                            assert!(!request.is_empty());
                            assert!(request.len() <= domain::DEFAULT_MAX_BATCH);
                            check_accepted_begin(&request);
                        }
                        Err(error) => assert_eq!(
                            topology_claims_proto::status::code_of(&error),
                            tonic::Code::InvalidArgument
                        ),
                    }
                }
            }
        }
        1..=3 => {
            // CommitUpdate, RollbackUpdate and RenewLease share (cell_id, lease_id).
            if let Ok(message) = pb::CommitUpdateRequest::decode(body) {
                if let Ok((cell, lease)) =
                    convert::lease_ref_from_pb(&message.cell_id, &message.lease_id)
                {
                    assert!(cell.as_str().len() <= MAX_CELL_ID_LEN);
                    assert_eq!(lease.to_string(), message.lease_id.to_ascii_lowercase());
                }
            }
        }
        4 => {
            if let Ok(message) = pb::ListOutstandingLeasesRequest::decode(body) {
                let budget = domain::DEFAULT_MAX_RESPONSE_BYTES;
                if let Ok(query) = convert::leases_query_from_pb(&message, budget) {
                    assert!((1..=domain::LEASES_MAX_LIMIT).contains(&query.limit));
                }
            }
        }
        5 => {
            if let Ok(message) = pb::ListClaimsRequest::decode(body) {
                let budget = domain::DEFAULT_MAX_RESPONSE_BYTES;
                if let Ok(query) = convert::claims_query_from_pb(&message, budget) {
                    assert!((1..=domain::CLAIMS_MAX_LIMIT).contains(&query.limit));
                    assert!((0..i64::MAX).contains(&query.cursor.record_id));
                    if let Some(key) = &query.cursor.after_key {
                        assert!(!key.value.is_empty() && key.value.len() <= MAX_VALUE_LEN);
                    }
                }
            }
        }
        _ => {
            if let Ok(message) = pb::LookupClaimRequest::decode(body) {
                if let Ok(key) = convert::claim_key_from_pb(&message) {
                    assert!(!key.value.is_empty() && key.value.len() <= MAX_VALUE_LEN);
                }
            }
        }
    }
    // A store's stored payload may be corrupt: decoding it is an error, never a panic.
    let _ = codec::decode_request(body);
});

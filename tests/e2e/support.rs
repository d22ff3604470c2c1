//! What every module of the end-to-end tests shares: fresh stores (memory, SQLite on a temp
//! file) and the `against_every_store!` expansion, builders of protobuf requests, and assertions
//! on statuses (code, ErrorInfo reason and metadata, BadRequest violations) and on lookups.

use std::fmt::Debug;
use std::sync::Arc;

use tonic::transport::Channel;
use tonic::{Code, Response, Status};
use tonic_types::StatusExt;
use topology_claims::memory::MemoryClaimStore;
use topology_claims::{ClaimStore, ClaimType, MigrationPolicy, OwnerType, TableName};
use topology_claims_proto::pb;
use topology_claims_proto::pb::claims_service_client::ClaimsServiceClient;

pub type Client = ClaimsServiceClient<Channel>;

/// A fresh store plus whatever must outlive it (the SQLite temp dir).
pub struct Fresh {
    pub store: Arc<dyn ClaimStore>,
    _dir: Option<tempfile::TempDir>,
}

pub async fn memory_store() -> Fresh {
    Fresh {
        store: Arc::new(MemoryClaimStore::new()),
        _dir: None,
    }
}

pub async fn sqlite_store() -> Fresh {
    let dir = tempfile::tempdir().expect("a temp dir");
    let store = topology_claims_sqlite::SqliteClaimStore::open(
        dir.path().join("claims.db"),
        MigrationPolicy::Apply,
    )
    .await
    .expect("open a fresh SQLite store");
    Fresh {
        store: Arc::new(store),
        _dir: Some(dir),
    }
}

/// Runs every case of the calling module once per store: `<module>::memory::case` and
/// `<module>::sqlite::case`, each over a fresh store.
macro_rules! against_every_store {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let fresh = $crate::support::memory_store().await;
                    super::$case(fresh.store.clone()).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let fresh = $crate::support::sqlite_store().await;
                    super::$case(fresh.store.clone()).await;
                }
            )*
        }
    };
}
pub(crate) use against_every_store;

pub fn claim(
    claim_type: ClaimType,
    value: &str,
    table: TableName,
    record_id: i64,
) -> pb::ClaimRecord {
    pb::ClaimRecord {
        claim_type: claim_type.number(),
        claim_value: value.to_owned(),
        owner: OwnerType::USER.number(),
        owner_value: format!("owner-of-{value}"),
        table_name: table.number(),
        table_record_id: record_id,
        ..Default::default()
    }
}

pub fn username(value: &str) -> pb::ClaimRecord {
    claim(ClaimType::Username, value, TableName::USERS, 1)
}

pub fn email(value: &str) -> pb::ClaimRecord {
    claim(ClaimType::Email, value, TableName::EMAILS, 1)
}

pub fn route(value: &str) -> pb::ClaimRecord {
    claim(ClaimType::Routes, value, TableName::ROUTES, 1)
}

/// A BeginUpdate request; `creates` / `destroys` are arrays, vectors or slices of records.
pub fn request(
    cell: &str,
    creates: impl AsRef<[pb::ClaimRecord]>,
    destroys: impl AsRef<[pb::ClaimRecord]>,
) -> pb::BeginUpdateRequest {
    pb::BeginUpdateRequest {
        local_transaction: String::new(),
        restore_correction: false,
        wait_for_leased: None,
        cell_id: cell.to_owned(),
        creates_claims: creates.as_ref().to_vec(),
        destroys_claims: destroys.as_ref().to_vec(),
        updates_claims: Vec::new(),
        lease_id: String::new(),
    }
}

pub fn commit_req(cell: &str, lease_id: &str) -> pb::CommitUpdateRequest {
    pb::CommitUpdateRequest {
        cell_id: cell.to_owned(),
        lease_id: lease_id.to_owned(),
    }
}

pub fn rollback_req(cell: &str, lease_id: &str) -> pb::RollbackUpdateRequest {
    pb::RollbackUpdateRequest {
        cell_id: cell.to_owned(),
        lease_id: lease_id.to_owned(),
        unrenewed_for: None,
    }
}

pub fn renew_req(cell: &str, lease_id: &str) -> pb::RenewLeaseRequest {
    pb::RenewLeaseRequest {
        cell_id: cell.to_owned(),
        lease_id: lease_id.to_owned(),
    }
}

pub fn lookup_req(claim_type: ClaimType, value: &str) -> pb::LookupClaimRequest {
    pb::LookupClaimRequest {
        claim_type: claim_type.number(),
        claim_value: value.to_owned(),
        ..Default::default()
    }
}

pub fn leases_req(cell: &str, cursor: &str, limit: i32) -> pb::ListOutstandingLeasesRequest {
    pb::ListOutstandingLeasesRequest {
        cell_id: cell.to_owned(),
        cursor: cursor.to_owned(),
        limit,
    }
}

/// A ListClaims request at `cursor`, from a client that resumes inside records (`page_tokens`):
/// the cases that page follow next_cursor_key or next_page_token.
pub fn claims_req(cell: &str, table: TableName, cursor: i64, limit: i32) -> pb::ListClaimsRequest {
    pb::ListClaimsRequest {
        cell_id: cell.to_owned(),
        table_name: table.number(),
        cursor,
        limit,
        cursor_key: None,
        page_token: String::new(),
        page_tokens: true,
        source_table: String::new(),
    }
}

pub fn ok<T: Debug>(result: Result<Response<T>, Status>, what: &str) -> T {
    match result {
        Ok(response) => response.into_inner(),
        Err(status) => panic!("{what}: expected OK, got {status:?}"),
    }
}

pub async fn begin(client: &mut Client, req: pb::BeginUpdateRequest) -> pb::LeasePayload {
    ok(client.begin_update(req).await, "BeginUpdate")
        .lease_payload
        .expect("a lease payload")
}

pub async fn commit(client: &mut Client, cell: &str, lease_id: &str) {
    ok(
        client.commit_update(commit_req(cell, lease_id)).await,
        "CommitUpdate",
    );
}

pub async fn rollback(client: &mut Client, cell: &str, lease_id: &str) {
    ok(
        client.rollback_update(rollback_req(cell, lease_id)).await,
        "RollbackUpdate",
    );
}

/// Creates and commits `claims` for `cell`.
pub async fn claimed(client: &mut Client, cell: &str, claims: impl AsRef<[pb::ClaimRecord]>) {
    let lease = begin(client, request(cell, claims, [])).await;
    commit(client, cell, &lease.lease_id).await;
}

/// The state and holder of a claim, or `None` when LookupClaim says NOT_FOUND CLAIM_NOT_FOUND.
pub async fn lookup(
    client: &mut Client,
    record: &pb::ClaimRecord,
) -> Option<(pb::ClaimState, String)> {
    let claim_type = ClaimType::from_number(record.claim_type.into()).expect("a known claim type");
    match client
        .lookup_claim(lookup_req(claim_type, &record.claim_value))
        .await
    {
        Ok(response) => {
            let response = response.into_inner();
            let info = response.claim.as_ref().expect("ClaimInfo");
            assert_eq!(info.claim_value, record.claim_value);
            assert_eq!(
                info.state, response.state,
                "ClaimInfo.state agrees with the response's"
            );
            Some((response.state(), response.cell_id))
        }
        Err(status) => {
            expect_claim_error(
                Err::<Response<()>, _>(status),
                Code::NotFound,
                "CLAIM_NOT_FOUND",
                record,
            );
            None
        }
    }
}

pub fn held(state: pb::ClaimState, cell: &str) -> Option<(pb::ClaimState, String)> {
    Some((state, cell.to_owned()))
}

/// Asserts a refusal: code, ErrorInfo domain and reason, and the given metadata entries.
#[track_caller]
pub fn expect_status<T: Debug>(
    result: Result<Response<T>, Status>,
    code: Code,
    reason: &str,
    metadata: &[(&str, &str)],
) -> Status {
    let status = match result {
        Ok(response) => panic!(
            "expected {code:?} {reason}, got OK {:?}",
            response.get_ref()
        ),
        Err(status) => status,
    };
    assert_eq!(status.code(), code, "code of {status:?}");
    let details = status.get_error_details();
    let info = details
        .error_info()
        .unwrap_or_else(|| panic!("no ErrorInfo in {status:?}"));
    assert_eq!(
        info.domain, "topology-claims",
        "ErrorInfo domain of {status:?}"
    );
    assert_eq!(info.reason, reason, "ErrorInfo reason of {status:?}");
    for (key, value) in metadata {
        assert_eq!(
            info.metadata.get(*key).map(String::as_str),
            Some(*value),
            "ErrorInfo metadata {key:?} of {status:?}"
        );
    }
    status
}

/// A refusal naming a claim in its ErrorInfo metadata.
#[track_caller]
pub fn expect_claim_error<T: Debug>(
    result: Result<Response<T>, Status>,
    code: Code,
    reason: &str,
    record: &pb::ClaimRecord,
) {
    let claim_type = ClaimType::from_number(record.claim_type.into()).expect("a known claim type");
    expect_status(
        result,
        code,
        reason,
        &[
            ("claim_type", claim_type.name()),
            ("claim_value", &record.claim_value),
        ],
    );
}

/// A refusal naming a lease in its ErrorInfo metadata (always lowercase).
#[track_caller]
pub fn expect_lease_error<T: Debug>(
    result: Result<Response<T>, Status>,
    code: Code,
    reason: &str,
    lease_id: &str,
) {
    expect_status(
        result,
        code,
        reason,
        &[("lease_id", &lease_id.to_ascii_lowercase())],
    );
}

/// INVALID_ARGUMENT INVALID_REQUEST with a BadRequest violation of exactly `field`.
#[track_caller]
pub fn expect_invalid<T: Debug>(result: Result<Response<T>, Status>, field: &str) {
    let status = expect_status(
        result,
        Code::InvalidArgument,
        "INVALID_REQUEST",
        &[("field", field)],
    );
    let details = status.get_error_details();
    let bad_request = details
        .bad_request()
        .unwrap_or_else(|| panic!("no BadRequest in {status:?}"));
    let violation = bad_request
        .field_violations
        .first()
        .expect("a field violation");
    assert_eq!(violation.field, field, "violation of {status:?}");
    assert!(
        !violation.description.is_empty(),
        "the violation says why: {status:?}"
    );
}

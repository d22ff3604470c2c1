//! End-to-end tests: real gRPC over TCP to the in-process server (`testing::TestServer`), over
//! the in-memory store and over SQLite on a temp file. Everything is checked from a client's
//! view: status codes, the google.rpc.ErrorInfo reason and metadata, BadRequest field
//! violations, and what LookupClaim / ListClaims / ListOutstandingLeases answer afterwards.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use tonic::transport::Channel;
use tonic::{Code, Response, Status};
use tonic_types::StatusExt;
use topology_claims::grpc::pb;
use topology_claims::grpc::pb::claims_service_client::ClaimsServiceClient;
use topology_claims::grpc::server::ServerConfig;
use topology_claims::memory::MemoryClaimStore;
use topology_claims::testing::TestServer;
use topology_claims::ClaimsError;
use topology_claims::{ClaimStore, ClaimType, MigrationPolicy, OwnerType, TableName};

type Client = ClaimsServiceClient<Channel>;

// ---------------------------------------------------------------------------------------------
// Stores and the per-store test expansion
// ---------------------------------------------------------------------------------------------

/// A fresh store plus whatever must outlive it (the SQLite temp dir).
struct Fresh {
    store: Arc<dyn ClaimStore>,
    _dir: Option<tempfile::TempDir>,
}

async fn memory_store() -> Fresh {
    Fresh {
        store: Arc::new(MemoryClaimStore::new()),
        _dir: None,
    }
}

async fn sqlite_store() -> Fresh {
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

/// Runs every case once per store: `memory::case` and `sqlite::case`.
macro_rules! against_every_store {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let fresh = super::memory_store().await;
                    super::$case(fresh.store.clone()).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let fresh = super::sqlite_store().await;
                    super::$case(fresh.store.clone()).await;
                }
            )*
        }
    };
}

against_every_store!(
    happy_path_user_email_and_route_are_routable_while_creating_and_active_after_commit,
    failure_2a_conflicting_begin_from_another_cell_is_refused_and_changes_nothing,
    failure_3a_rollback_after_local_failure_restores_destroys_and_frees_creates,
    every_status_row_of_the_begin_update_table,
    every_status_row_of_commit_rollback_and_renew,
    client_chosen_lease_ids_make_begin_safe_to_retry,
    lease_ids_are_case_insensitive_on_input_and_lowercase_on_output,
    cell_id_rules_are_enforced_at_and_past_their_limits_on_every_rpc,
    claim_record_rules_are_enforced_at_and_past_their_limits,
    lease_id_rules_are_enforced_on_every_rpc,
    batch_size_rules_are_enforced_before_any_store_access,
    list_limits_and_cursors_are_validated_not_clamped,
    default_page_sizes_apply_when_limit_is_zero,
    renew_moves_last_renewed_at_and_leases_are_judged_by_server_time,
    list_claims_pages_tile_the_id_space_and_include_leased_claims,
    sixteen_concurrent_clients_racing_for_fifty_claims_get_one_winner_each,
    health_and_reflection_are_served,
);

// ---------------------------------------------------------------------------------------------
// Builders and assertions
// ---------------------------------------------------------------------------------------------

fn claim(claim_type: ClaimType, value: &str, table: TableName, record_id: i64) -> pb::ClaimRecord {
    pb::ClaimRecord {
        claim_type: claim_type.number(),
        claim_value: value.to_owned(),
        owner: OwnerType::User.number(),
        owner_value: format!("owner-of-{value}"),
        table_name: table.number(),
        table_record_id: record_id,
    }
}

fn username(value: &str) -> pb::ClaimRecord {
    claim(ClaimType::Username, value, TableName::Users, 1)
}

fn email(value: &str) -> pb::ClaimRecord {
    claim(ClaimType::Email, value, TableName::Emails, 1)
}

fn route(value: &str) -> pb::ClaimRecord {
    claim(ClaimType::Routes, value, TableName::Routes, 1)
}

/// A BeginUpdate request; `creates` / `destroys` are arrays, vectors or slices of records.
fn request(
    cell: &str,
    creates: impl AsRef<[pb::ClaimRecord]>,
    destroys: impl AsRef<[pb::ClaimRecord]>,
) -> pb::BeginUpdateRequest {
    pb::BeginUpdateRequest {
        cell_id: cell.to_owned(),
        creates_claims: creates.as_ref().to_vec(),
        destroys_claims: destroys.as_ref().to_vec(),
        lease_id: String::new(),
    }
}

fn commit_req(cell: &str, lease_id: &str) -> pb::CommitUpdateRequest {
    pb::CommitUpdateRequest {
        cell_id: cell.to_owned(),
        lease_id: lease_id.to_owned(),
    }
}

fn rollback_req(cell: &str, lease_id: &str) -> pb::RollbackUpdateRequest {
    pb::RollbackUpdateRequest {
        cell_id: cell.to_owned(),
        lease_id: lease_id.to_owned(),
    }
}

fn renew_req(cell: &str, lease_id: &str) -> pb::RenewLeaseRequest {
    pb::RenewLeaseRequest {
        cell_id: cell.to_owned(),
        lease_id: lease_id.to_owned(),
    }
}

fn lookup_req(claim_type: ClaimType, value: &str) -> pb::LookupClaimRequest {
    pb::LookupClaimRequest {
        claim_type: claim_type.number(),
        claim_value: value.to_owned(),
    }
}

fn leases_req(cell: &str, cursor: &str, limit: i32) -> pb::ListOutstandingLeasesRequest {
    pb::ListOutstandingLeasesRequest {
        cell_id: cell.to_owned(),
        cursor: cursor.to_owned(),
        limit,
    }
}

fn claims_req(cell: &str, table: TableName, cursor: i64, limit: i32) -> pb::ListClaimsRequest {
    pb::ListClaimsRequest {
        cell_id: cell.to_owned(),
        table_name: table.number(),
        cursor,
        limit,
    }
}

fn ok<T: Debug>(result: Result<Response<T>, Status>, what: &str) -> T {
    match result {
        Ok(response) => response.into_inner(),
        Err(status) => panic!("{what}: expected OK, got {status:?}"),
    }
}

async fn begin(client: &mut Client, req: pb::BeginUpdateRequest) -> pb::LeasePayload {
    ok(client.begin_update(req).await, "BeginUpdate")
        .lease_payload
        .expect("a lease payload")
}

async fn commit(client: &mut Client, cell: &str, lease_id: &str) {
    ok(
        client.commit_update(commit_req(cell, lease_id)).await,
        "CommitUpdate",
    );
}

async fn rollback(client: &mut Client, cell: &str, lease_id: &str) {
    ok(
        client.rollback_update(rollback_req(cell, lease_id)).await,
        "RollbackUpdate",
    );
}

/// Creates and commits `claims` for `cell`.
async fn claimed(client: &mut Client, cell: &str, claims: impl AsRef<[pb::ClaimRecord]>) {
    let lease = begin(client, request(cell, claims, [])).await;
    commit(client, cell, &lease.lease_id).await;
}

/// The state and holder of a claim, or `None` when LookupClaim says NOT_FOUND CLAIM_NOT_FOUND.
async fn lookup(client: &mut Client, record: &pb::ClaimRecord) -> Option<(pb::ClaimState, String)> {
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

fn held(state: pb::ClaimState, cell: &str) -> Option<(pb::ClaimState, String)> {
    Some((state, cell.to_owned()))
}

/// Asserts a refusal: code, ErrorInfo domain and reason, and the given metadata entries.
#[track_caller]
fn expect_status<T: Debug>(
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
fn expect_claim_error<T: Debug>(
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
fn expect_lease_error<T: Debug>(
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
fn expect_invalid<T: Debug>(result: Result<Response<T>, Status>, field: &str) {
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

// ---------------------------------------------------------------------------------------------
// The design's scenarios
// ---------------------------------------------------------------------------------------------

async fn happy_path_user_email_and_route_are_routable_while_creating_and_active_after_commit(
    store: Arc<dyn ClaimStore>,
) {
    let server = TestServer::start(store).await;
    let mut client = server.client().await;
    let claims = [
        claim(ClaimType::Username, "alice", TableName::Users, 7),
        claim(ClaimType::Email, "alice@example.com", TableName::Emails, 70),
        claim(ClaimType::Routes, "alice", TableName::Routes, 700),
        claim(ClaimType::Routes, "alice/blog", TableName::Routes, 701),
    ];

    // Phase 1: one BeginUpdate for the whole batch.
    let lease = begin(&mut client, request("cell-a", &claims, &[])).await;
    assert_eq!(lease.cell_id, "cell-a");
    assert_eq!(lease.lease_id, lease.lease_id.to_ascii_lowercase());
    let original = lease
        .original_request
        .as_ref()
        .expect("the original request");
    assert_eq!(original.creates_claims, claims.to_vec());
    // Routable right away (hides replication latency), as CREATING.
    for record in &claims {
        assert_eq!(
            lookup(&mut client, record).await,
            held(pb::ClaimState::Creating, "cell-a")
        );
    }
    let outstanding = ok(
        client
            .list_outstanding_leases(leases_req("cell-a", "", 0))
            .await,
        "list",
    );
    assert_eq!(outstanding.leases.len(), 1);
    assert_eq!(
        outstanding.leases[0]
            .lease_payload
            .as_ref()
            .unwrap()
            .lease_id,
        lease.lease_id
    );

    // Phase 2 (the cell's local transaction) happens elsewhere; phase 3: commit.
    commit(&mut client, "cell-a", &lease.lease_id).await;
    for record in &claims {
        assert_eq!(
            lookup(&mut client, record).await,
            held(pb::ClaimState::Active, "cell-a")
        );
    }
    let outstanding = ok(
        client
            .list_outstanding_leases(leases_req("cell-a", "", 0))
            .await,
        "list",
    );
    assert!(
        outstanding.leases.is_empty(),
        "a committed lease is no longer outstanding"
    );
    // A retried commit (e.g. by the reconciler) is a no-op success.
    commit(&mut client, "cell-a", &lease.lease_id).await;

    let users = ok(
        client
            .list_claims(claims_req("cell-a", TableName::Users, 0, 0))
            .await,
        "list",
    );
    assert_eq!(users.claims.len(), 1);
    assert_eq!(users.claims[0].claim_value, "alice");
    assert_eq!(users.claims[0].table_record_id, 7);
    assert_eq!(users.claims[0].state(), pb::ClaimState::Active);
    server.shutdown().await;
}

async fn failure_2a_conflicting_begin_from_another_cell_is_refused_and_changes_nothing(
    store: Arc<dyn ClaimStore>,
) {
    let server = TestServer::start(store).await;
    let mut a = server.client().await;
    let mut b = server.client().await;
    let contested = email("shared@example.com");
    let lease = begin(&mut a, request("cell-a", [contested.clone()], &[])).await;

    // While cell-a's lease is open the claim is temporarily locked.
    let innocent = username("bob");
    let result = b
        .begin_update(request(
            "cell-b",
            &[innocent.clone(), contested.clone()],
            &[],
        ))
        .await;
    expect_claim_error(result, Code::FailedPrecondition, "CLAIM_LEASED", &contested);
    // All or nothing: the batch's other claim was not created.
    assert_eq!(lookup(&mut b, &innocent).await, None);

    // Once committed it is permanently taken.
    commit(&mut a, "cell-a", &lease.lease_id).await;
    let result = b
        .begin_update(request(
            "cell-b",
            &[innocent.clone(), contested.clone()],
            &[],
        ))
        .await;
    expect_claim_error(result, Code::AlreadyExists, "CLAIM_TAKEN", &contested);
    assert_eq!(lookup(&mut b, &innocent).await, None);
    assert_eq!(
        lookup(&mut b, &contested).await,
        held(pb::ClaimState::Active, "cell-a")
    );
    let outstanding = ok(
        b.list_outstanding_leases(leases_req("cell-b", "", 0)).await,
        "list",
    );
    assert!(
        outstanding.leases.is_empty(),
        "a refused BeginUpdate leaves no lease"
    );
    server.shutdown().await;
}

async fn failure_3a_rollback_after_local_failure_restores_destroys_and_frees_creates(
    store: Arc<dyn ClaimStore>,
) {
    let server = TestServer::start(store).await;
    let mut a = server.client().await;
    let mut b = server.client().await;
    let old_route = route("team/old-name");
    let new_route = route("team/new-name");
    claimed(&mut a, "cell-a", [old_route.clone()]).await;

    // A rename: create the new route, destroy the old one.
    let lease = begin(
        &mut a,
        request("cell-a", [new_route.clone()], [old_route.clone()]),
    )
    .await;
    assert_eq!(
        lookup(&mut a, &new_route).await,
        held(pb::ClaimState::Creating, "cell-a")
    );
    assert_eq!(
        lookup(&mut a, &old_route).await,
        held(pb::ClaimState::Destroying, "cell-a")
    );

    // The local transaction fails (say a unique constraint): the cell rolls the lease back.
    rollback(&mut a, "cell-a", &lease.lease_id).await;
    assert_eq!(
        lookup(&mut a, &old_route).await,
        held(pb::ClaimState::Active, "cell-a")
    );
    assert_eq!(lookup(&mut a, &new_route).await, None);
    // Rollback is idempotent; commit after it is refused.
    rollback(&mut a, "cell-a", &lease.lease_id).await;
    let result = a.commit_update(commit_req("cell-a", &lease.lease_id)).await;
    expect_lease_error(
        result,
        Code::FailedPrecondition,
        "LEASE_ROLLED_BACK",
        &lease.lease_id,
    );

    // The freed name is claimable by another cell.
    claimed(&mut b, "cell-b", [new_route.clone()]).await;
    assert_eq!(
        lookup(&mut b, &new_route).await,
        held(pb::ClaimState::Active, "cell-b")
    );
    // ...and the restored one is still cell-a's to destroy.
    let lease = begin(&mut a, request("cell-a", &[], [old_route.clone()])).await;
    commit(&mut a, "cell-a", &lease.lease_id).await;
    assert_eq!(lookup(&mut a, &old_route).await, None);
    server.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Every status row (issue 2 §5), from a client's view
// ---------------------------------------------------------------------------------------------

async fn every_status_row_of_the_begin_update_table(store: Arc<dyn ClaimStore>) {
    let server = TestServer::start(store).await;
    let mut c = server.client().await;
    let mine = username("mine");
    let theirs = username("theirs");
    claimed(&mut c, "cell-a", [mine.clone()]).await;
    claimed(&mut c, "cell-b", [theirs.clone()]).await;
    let fresh = email("fresh@example.com");

    // BATCH_CONFLICT: twice in creates, twice in destroys, in both. Refused before the store,
    // so even claims that would otherwise fail are not looked at.
    for (creates, destroys) in [
        (vec![fresh.clone(), fresh.clone()], vec![]),
        (vec![], vec![mine.clone(), mine.clone()]),
        (vec![fresh.clone()], vec![fresh.clone()]),
    ] {
        let twice = creates.first().or(destroys.first()).unwrap().clone();
        let result = c.begin_update(request("cell-a", &creates, &destroys)).await;
        expect_claim_error(result, Code::InvalidArgument, "BATCH_CONFLICT", &twice);
    }
    // Same value under another claim type is a different claim: no conflict.
    let as_route = route("fresh@example.com");
    let lease = begin(
        &mut c,
        request("cell-a", &[fresh.clone(), as_route.clone()], &[]),
    )
    .await;
    rollback(&mut c, "cell-a", &lease.lease_id).await;

    // CLAIM_TAKEN: a committed claim, whichever cell holds it (the caller's too).
    let result = c
        .begin_update(request("cell-a", [theirs.clone()], &[]))
        .await;
    expect_claim_error(result, Code::AlreadyExists, "CLAIM_TAKEN", &theirs);
    let result = c.begin_update(request("cell-a", [mine.clone()], &[])).await;
    expect_claim_error(result, Code::AlreadyExists, "CLAIM_TAKEN", &mine);

    // CLAIM_LEASED: create of a claim being created, create of a claim being destroyed, and
    // destroy of a leased claim (the caller's own lease too).
    let creating = begin(&mut c, request("cell-a", [fresh.clone()], &[])).await;
    let result = c
        .begin_update(request("cell-b", [fresh.clone()], &[]))
        .await;
    expect_claim_error(result, Code::FailedPrecondition, "CLAIM_LEASED", &fresh);
    let result = c
        .begin_update(request("cell-a", &[], [fresh.clone()]))
        .await;
    expect_claim_error(result, Code::FailedPrecondition, "CLAIM_LEASED", &fresh);
    let destroying = begin(&mut c, request("cell-a", &[], [mine.clone()])).await;
    let result = c.begin_update(request("cell-b", [mine.clone()], &[])).await;
    expect_claim_error(result, Code::FailedPrecondition, "CLAIM_LEASED", &mine);
    let result = c.begin_update(request("cell-a", &[], [mine.clone()])).await;
    expect_claim_error(result, Code::FailedPrecondition, "CLAIM_LEASED", &mine);

    // CLAIM_NOT_FOUND: destroy of an absent claim; LookupClaim of one.
    let absent = email("nobody@example.com");
    let result = c
        .begin_update(request("cell-a", &[], [absent.clone()]))
        .await;
    expect_claim_error(result, Code::NotFound, "CLAIM_NOT_FOUND", &absent);
    let result = c
        .lookup_claim(lookup_req(ClaimType::Email, "nobody@example.com"))
        .await;
    expect_claim_error(result, Code::NotFound, "CLAIM_NOT_FOUND", &absent);

    // NOT_CLAIM_OWNER: destroy of another cell's claim; permanent wins over temporary, so it is
    // reported even while that claim is leased.
    let result = c
        .begin_update(request("cell-a", &[], [theirs.clone()]))
        .await;
    expect_claim_error(result, Code::PermissionDenied, "NOT_CLAIM_OWNER", &theirs);
    let result = c.begin_update(request("cell-b", &[], [mine.clone()])).await;
    expect_claim_error(result, Code::PermissionDenied, "NOT_CLAIM_OWNER", &mine);

    // The first failing claim in request order (creates, then destroys) is the one named.
    let result = c
        .begin_update(request(
            "cell-a",
            &[email("ok@example.com"), theirs.clone(), fresh.clone()],
            [absent.clone()],
        ))
        .await;
    expect_claim_error(result, Code::AlreadyExists, "CLAIM_TAKEN", &theirs);
    let result = c
        .begin_update(request(
            "cell-a",
            &[email("ok@example.com")],
            &[absent.clone(), theirs.clone()],
        ))
        .await;
    expect_claim_error(result, Code::NotFound, "CLAIM_NOT_FOUND", &absent);
    assert_eq!(
        lookup(&mut c, &email("ok@example.com")).await,
        None,
        "failed batches change nothing"
    );

    rollback(&mut c, "cell-a", &creating.lease_id).await;
    rollback(&mut c, "cell-a", &destroying.lease_id).await;
    assert_eq!(lookup(&mut c, &fresh).await, None);
    assert_eq!(
        lookup(&mut c, &mine).await,
        held(pb::ClaimState::Active, "cell-a")
    );
    server.shutdown().await;
}

async fn every_status_row_of_commit_rollback_and_renew(store: Arc<dyn ClaimStore>) {
    let server = TestServer::start(store).await;
    let mut c = server.client().await;
    let open = begin(&mut c, request("cell-a", &[username("open")], &[]))
        .await
        .lease_id;
    let committed = begin(&mut c, request("cell-a", &[username("committed")], &[]))
        .await
        .lease_id;
    commit(&mut c, "cell-a", &committed).await;
    let rolled_back = begin(&mut c, request("cell-a", &[username("rolled")], &[]))
        .await
        .lease_id;
    rollback(&mut c, "cell-a", &rolled_back).await;
    let never_seen = "0b8a1f1e-3c2d-4f5a-9b6c-7d8e9fa0b1c2";

    // NOT_LEASE_OWNER: commit / rollback / renew of another cell's lease, open or ended.
    for lease in [&open, &committed, &rolled_back] {
        let result = c.commit_update(commit_req("cell-b", lease)).await;
        expect_lease_error(result, Code::PermissionDenied, "NOT_LEASE_OWNER", lease);
        let result = c.rollback_update(rollback_req("cell-b", lease)).await;
        expect_lease_error(result, Code::PermissionDenied, "NOT_LEASE_OWNER", lease);
        let result = c.renew_lease(renew_req("cell-b", lease)).await;
        expect_lease_error(result, Code::PermissionDenied, "NOT_LEASE_OWNER", lease);
    }
    assert_eq!(
        lookup(&mut c, &username("open")).await,
        held(pb::ClaimState::Creating, "cell-a")
    );

    // LEASE_ROLLED_BACK: commit or renew of a rolled-back lease.
    let result = c.commit_update(commit_req("cell-a", &rolled_back)).await;
    expect_lease_error(
        result,
        Code::FailedPrecondition,
        "LEASE_ROLLED_BACK",
        &rolled_back,
    );
    let result = c.renew_lease(renew_req("cell-a", &rolled_back)).await;
    expect_lease_error(
        result,
        Code::FailedPrecondition,
        "LEASE_ROLLED_BACK",
        &rolled_back,
    );

    // LEASE_COMMITTED: rollback or renew of a committed lease.
    let result = c.rollback_update(rollback_req("cell-a", &committed)).await;
    expect_lease_error(
        result,
        Code::FailedPrecondition,
        "LEASE_COMMITTED",
        &committed,
    );
    let result = c.renew_lease(renew_req("cell-a", &committed)).await;
    expect_lease_error(
        result,
        Code::FailedPrecondition,
        "LEASE_COMMITTED",
        &committed,
    );

    // LEASE_NOT_FOUND: commit or renew of a lease id never seen.
    let result = c.commit_update(commit_req("cell-a", never_seen)).await;
    expect_lease_error(result, Code::NotFound, "LEASE_NOT_FOUND", never_seen);
    let result = c.renew_lease(renew_req("cell-a", never_seen)).await;
    expect_lease_error(result, Code::NotFound, "LEASE_NOT_FOUND", never_seen);

    // OK (idempotent): commit of a committed lease, rollback of a rolled-back one.
    commit(&mut c, "cell-a", &committed).await;
    rollback(&mut c, "cell-a", &rolled_back).await;

    // OK: rollback of a never-seen id, remembered, so a delayed BeginUpdate with it fails.
    rollback(&mut c, "cell-a", never_seen).await;
    let mut late = request("cell-a", &[username("late")], &[]);
    late.lease_id = never_seen.to_owned();
    let result = c.begin_update(late).await;
    expect_lease_error(
        result,
        Code::FailedPrecondition,
        "LEASE_ROLLED_BACK",
        never_seen,
    );
    assert_eq!(lookup(&mut c, &username("late")).await, None);
    server.shutdown().await;
}

async fn client_chosen_lease_ids_make_begin_safe_to_retry(store: Arc<dyn ClaimStore>) {
    let server = TestServer::start(store).await;
    let mut c = server.client().await;
    let id = "5d0c8f7e-1a2b-4c3d-8e9f-0a1b2c3d4e5f";
    let mut first = request("cell-a", &[username("retry")], &[]);
    first.lease_id = id.to_owned();

    // The same id, cell and claims again (a retry after a timeout) returns the same lease.
    let lease = begin(&mut c, first.clone()).await;
    assert_eq!(lease.lease_id, id);
    assert_eq!(begin(&mut c, first.clone()).await, lease);

    // LEASE_ID_CONFLICT: the same id with other content, or from another cell (which learns
    // nothing about the lease: the metadata names only the id).
    let mut other_content = request("cell-a", &[username("retry"), username("more")], &[]);
    other_content.lease_id = id.to_owned();
    let result = c.begin_update(other_content).await;
    expect_lease_error(result, Code::AlreadyExists, "LEASE_ID_CONFLICT", id);
    let mut other_cell = first.clone();
    other_cell.cell_id = "cell-b".to_owned();
    let status = expect_status(
        c.begin_update(other_cell.clone()).await,
        Code::AlreadyExists,
        "LEASE_ID_CONFLICT",
        &[("lease_id", id)],
    );
    let info = status.get_error_details().error_info().cloned().unwrap();
    assert_eq!(
        info.metadata.keys().collect::<Vec<_>>(),
        vec!["lease_id"],
        "{status:?}"
    );
    assert!(
        !status.message().contains("cell-a") && !status.message().contains("retry"),
        "{status:?}"
    );

    // After the lease ended, the id keeps its outcome.
    commit(&mut c, "cell-a", id).await;
    let result = c.begin_update(first.clone()).await;
    expect_lease_error(result, Code::FailedPrecondition, "LEASE_COMMITTED", id);
    let result = c.begin_update(other_cell).await;
    expect_lease_error(result, Code::AlreadyExists, "LEASE_ID_CONFLICT", id);
    server.shutdown().await;
}

async fn lease_ids_are_case_insensitive_on_input_and_lowercase_on_output(
    store: Arc<dyn ClaimStore>,
) {
    let server = TestServer::start(store).await;
    let mut c = server.client().await;
    let upper = "5D0C8F7E-1A2B-4C3D-8E9F-0A1B2C3D4E5F";
    let lower = upper.to_ascii_lowercase();
    let mixed = "5d0C8f7E-1a2B-4c3D-8e9F-0a1B2c3D4e5F";
    let mut req = request("cell-a", &[username("cases")], &[]);
    req.lease_id = upper.to_owned();
    let lease = begin(&mut c, req.clone()).await;
    assert_eq!(lease.lease_id, lower);
    // A retry in another case is the same lease.
    req.lease_id = mixed.to_owned();
    assert_eq!(begin(&mut c, req).await.lease_id, lower);

    let listed = ok(
        c.list_outstanding_leases(leases_req("cell-a", "", 0)).await,
        "list",
    );
    assert_eq!(
        listed.leases[0].lease_payload.as_ref().unwrap().lease_id,
        lower
    );
    let renewed = ok(c.renew_lease(renew_req("cell-a", mixed)).await, "renew");
    assert_eq!(renewed.lease_payload.unwrap().lease_id, lower);
    // A cursor in upper case works like its lowercase form.
    let after = ok(
        c.list_outstanding_leases(leases_req("cell-a", upper, 0))
            .await,
        "list",
    );
    assert!(after.leases.is_empty());

    commit(&mut c, "cell-a", upper).await;
    commit(&mut c, "cell-a", &lower).await;
    let result = c.rollback_update(rollback_req("cell-a", mixed)).await;
    expect_status(
        result,
        Code::FailedPrecondition,
        "LEASE_COMMITTED",
        &[("lease_id", &lower)],
    );
    server.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Validation (issue 2 §6): every rule at and past its limit, as INVALID_ARGUMENT + BadRequest
// ---------------------------------------------------------------------------------------------

const SOME_LEASE: &str = "0b8a1f1e-3c2d-4f5a-9b6c-7d8e9fa0b1c2";

async fn cell_id_rules_are_enforced_at_and_past_their_limits_on_every_rpc(
    store: Arc<dyn ClaimStore>,
) {
    let server = TestServer::start(store).await;
    let mut c = server.client().await;
    let longest: String = "Az09._-".chars().cycle().take(100).collect();
    let too_long = "c".repeat(101);

    let lease = begin(&mut c, request(&longest, &[username("longest-cell")], &[])).await;
    assert_eq!(lease.cell_id, longest);
    ok(
        c.renew_lease(renew_req(&longest, &lease.lease_id)).await,
        "renew",
    );
    ok(
        c.list_outstanding_leases(leases_req(&longest, "", 0)).await,
        "list leases",
    );
    ok(
        c.list_claims(claims_req(&longest, TableName::Users, 0, 0))
            .await,
        "list claims",
    );
    commit(&mut c, &longest, &lease.lease_id).await;
    assert_eq!(
        lookup(&mut c, &username("longest-cell")).await,
        held(pb::ClaimState::Active, &longest)
    );

    for bad in [
        "",
        too_long.as_str(),
        "cell a",
        "cell/a",
        "cell:a",
        "céll",
        "cell\n",
        "cell@1",
    ] {
        expect_invalid(
            c.begin_update(request(bad, &[username("x")], &[])).await,
            "cell_id",
        );
        expect_invalid(
            c.commit_update(commit_req(bad, SOME_LEASE)).await,
            "cell_id",
        );
        expect_invalid(
            c.rollback_update(rollback_req(bad, SOME_LEASE)).await,
            "cell_id",
        );
        expect_invalid(c.renew_lease(renew_req(bad, SOME_LEASE)).await, "cell_id");
        expect_invalid(
            c.list_outstanding_leases(leases_req(bad, "", 0)).await,
            "cell_id",
        );
        expect_invalid(
            c.list_claims(claims_req(bad, TableName::Users, 0, 0)).await,
            "cell_id",
        );
    }
    // The rollback of an unknown id with a bad cell id did not record anything for it.
    let mut req = request("cell-a", &[username("after-bad-rollback")], &[]);
    req.lease_id = SOME_LEASE.to_owned();
    begin(&mut c, req).await;
    server.shutdown().await;
}

async fn claim_record_rules_are_enforced_at_and_past_their_limits(store: Arc<dyn ClaimStore>) {
    let server = TestServer::start(store).await;
    let mut c = server.client().await;
    let ascii_255 = "a".repeat(255);
    let utf8_255 = "€".repeat(85); // 3 bytes each
    let utf8_256 = format!("{utf8_255}a");

    // At the limits: accepted.
    let mut at_limits = vec![
        claim(ClaimType::Username, &ascii_255, TableName::Users, 0),
        claim(ClaimType::Email, &utf8_255, TableName::Emails, i64::MAX - 1),
        claim(ClaimType::Routes, "x", TableName::Groups, 1),
    ];
    at_limits[0].owner_value = "o".repeat(255);
    at_limits[1].owner_value = utf8_255.clone();
    at_limits[2].owner = OwnerType::Group.number();
    for owner in OwnerType::ALL {
        let mut record = claim(
            ClaimType::Routes,
            &format!("owner-{owner}"),
            TableName::Projects,
            2,
        );
        record.owner = owner.number();
        at_limits.push(record);
    }
    let lease = begin(&mut c, request("cell-a", &at_limits, &[])).await;
    commit(&mut c, "cell-a", &lease.lease_id).await;
    for record in &at_limits {
        assert_eq!(
            lookup(&mut c, record).await,
            held(pb::ClaimState::Active, "cell-a")
        );
    }
    ok(
        c.lookup_claim(lookup_req(ClaimType::Email, &utf8_255))
            .await,
        "lookup at limit",
    );

    // Past the limits: refused, naming the field's path (creates and destroys, any position).
    type Breaker = fn(&mut pb::ClaimRecord);
    let cases: Vec<(&str, Breaker)> = vec![
        ("claim_value", |r| r.claim_value = String::new()),
        ("claim_value", |r| r.claim_value = "a".repeat(256)),
        ("claim_value", |r| {
            r.claim_value = format!("{}a", "€".repeat(85))
        }),
        ("claim_value", |r| r.claim_value = "new\nline".to_owned()),
        ("claim_value", |r| r.claim_value = "nul\0".to_owned()),
        ("claim_value", |r| r.claim_value = "del\u{7f}".to_owned()),
        ("claim_value", |r| r.claim_value = "c1\u{85}".to_owned()),
        ("owner_value", |r| r.owner_value = String::new()),
        ("owner_value", |r| r.owner_value = "o".repeat(256)),
        ("owner_value", |r| r.owner_value = "tab\t".to_owned()),
        ("claim_type", |r| r.claim_type = 0),
        ("claim_type", |r| r.claim_type = 4),
        ("claim_type", |r| r.claim_type = -1),
        ("owner", |r| r.owner = 0),
        ("owner", |r| r.owner = 4),
        ("table_name", |r| r.table_name = 0),
        ("table_name", |r| r.table_name = 6),
        ("table_record_id", |r| r.table_record_id = -1),
        ("table_record_id", |r| r.table_record_id = i64::MAX),
        ("table_record_id", |r| r.table_record_id = i64::MIN),
    ];
    let taken = at_limits[2].clone();
    for (field, breaker) in cases {
        let mut bad = username("valid-otherwise");
        breaker(&mut bad);
        let good = [email("a@example.com"), email("b@example.com")];
        let creates = [good[0].clone(), good[1].clone(), bad.clone()];
        let result = c.begin_update(request("cell-a", &creates, &[])).await;
        expect_invalid(result, &format!("creates_claims[2].{field}"));
        // Validation comes before the store: a taken claim earlier in the batch is not reported.
        let result = c
            .begin_update(request("cell-a", [taken.clone()], &[good[0].clone(), bad]))
            .await;
        expect_invalid(result, &format!("destroys_claims[1].{field}"));
    }
    assert_eq!(utf8_256.len(), 256);
    expect_invalid(
        c.lookup_claim(lookup_req(ClaimType::Email, &utf8_256))
            .await,
        "claim_value",
    );
    expect_invalid(
        c.lookup_claim(lookup_req(ClaimType::Email, "")).await,
        "claim_value",
    );
    expect_invalid(
        c.lookup_claim(lookup_req(ClaimType::Email, "a\rb")).await,
        "claim_value",
    );
    let unspecified = pb::LookupClaimRequest {
        claim_type: 0,
        claim_value: "x".into(),
    };
    expect_invalid(c.lookup_claim(unspecified).await, "claim_type");
    let unknown = pb::LookupClaimRequest {
        claim_type: 42,
        claim_value: "x".into(),
    };
    expect_invalid(c.lookup_claim(unknown).await, "claim_type");
    server.shutdown().await;
}

async fn lease_id_rules_are_enforced_on_every_rpc(store: Arc<dyn ClaimStore>) {
    let server = TestServer::start(store).await;
    let mut c = server.client().await;
    let malformed = [
        "0b8a1f1e-3c2d-4f5a-9b6c-7d8e9fa0b1c",    // 35 characters
        "0b8a1f1e-3c2d-4f5a-9b6c-7d8e9fa0b1c2a",  // 37 characters
        "0b8a1f1e3c2d4f5a9b6c7d8e9fa0b1c2",       // simple form, no hyphens
        "{0b8a1f1e-3c2d-4f5a-9b6c-7d8e9fa0b1c2}", // braced
        "0b8a1f1e3-c2d-4f5a-9b6c-7d8e9fa0b1c2",   // 36 characters, hyphens misplaced
        "zb8a1f1e-3c2d-4f5a-9b6c-7d8e9fa0b1c2",   // not hex
        " b8a1f1e-3c2d-4f5a-9b6c-7d8e9fa0b1c2",   // whitespace
    ];
    for bad in malformed.iter().chain([&""]) {
        expect_invalid(c.commit_update(commit_req("cell-a", bad)).await, "lease_id");
        expect_invalid(
            c.rollback_update(rollback_req("cell-a", bad)).await,
            "lease_id",
        );
        expect_invalid(c.renew_lease(renew_req("cell-a", bad)).await, "lease_id");
    }
    for bad in malformed {
        let mut req = request("cell-a", &[username("x")], &[]);
        req.lease_id = bad.to_owned();
        expect_invalid(c.begin_update(req).await, "lease_id");
        expect_invalid(
            c.list_outstanding_leases(leases_req("cell-a", bad, 0))
                .await,
            "cursor",
        );
    }
    assert_eq!(lookup(&mut c, &username("x")).await, None);
    // Optional on BeginUpdate: empty means the server picks a (lowercase v4) id.
    let lease = begin(&mut c, request("cell-a", &[username("x")], &[])).await;
    assert_eq!(lease.lease_id.len(), 36);
    assert_eq!(lease.lease_id, lease.lease_id.to_ascii_lowercase());
    server.shutdown().await;
}

async fn batch_size_rules_are_enforced_before_any_store_access(store: Arc<dyn ClaimStore>) {
    let server = TestServer::start(Arc::clone(&store)).await;
    let mut c = server.client().await;
    // At least one create or destroy.
    expect_invalid(
        c.begin_update(request("cell-a", &[], &[])).await,
        "creates_claims",
    );

    // At most --max-batch (default 1000) claims, creates and destroys together.
    let many = |n: usize, prefix: &str| -> Vec<pb::ClaimRecord> {
        (0..n)
            .map(|i| {
                claim(
                    ClaimType::Username,
                    &format!("{prefix}-{i}"),
                    TableName::Users,
                    i as i64,
                )
            })
            .collect()
    };
    let result = c
        .begin_update(request("cell-a", many(1001, "over"), &[]))
        .await;
    expect_invalid(result, "creates_claims");
    // 601 destroys of absent claims would be CLAIM_NOT_FOUND if they reached the store.
    let result = c
        .begin_update(request("cell-a", many(400, "c"), many(601, "d")))
        .await;
    expect_invalid(result, "creates_claims");
    let lease = begin(&mut c, request("cell-a", many(1000, "at"), &[])).await;
    commit(&mut c, "cell-a", &lease.lease_id).await;
    assert_eq!(
        lookup(&mut c, &many(1000, "at")[999]).await,
        held(pb::ClaimState::Active, "cell-a")
    );
    server.shutdown().await;

    // A configured --max-batch is honoured.
    let config = ServerConfig {
        max_batch: 2,
        ..ServerConfig::default()
    };
    let server = TestServer::start_with(store, config).await;
    let mut c = server.client().await;
    let result = c
        .begin_update(request("cell-a", many(2, "small"), many(1, "at")))
        .await;
    expect_invalid(result, "creates_claims");
    let lease = begin(&mut c, request("cell-a", many(1, "small"), many(1, "at"))).await;
    commit(&mut c, "cell-a", &lease.lease_id).await;
    server.shutdown().await;
}

async fn list_limits_and_cursors_are_validated_not_clamped(store: Arc<dyn ClaimStore>) {
    let server = TestServer::start(store).await;
    let mut c = server.client().await;
    for bad in [-1, i32::MIN, 1001, i32::MAX] {
        expect_invalid(
            c.list_outstanding_leases(leases_req("cell-a", "", bad))
                .await,
            "limit",
        );
    }
    for bad in [-1, i32::MIN, 10_001, i32::MAX] {
        expect_invalid(
            c.list_claims(claims_req("cell-a", TableName::Users, 0, bad))
                .await,
            "limit",
        );
    }
    for bad in [-1, i64::MIN, i64::MAX] {
        expect_invalid(
            c.list_claims(claims_req("cell-a", TableName::Users, bad, 0))
                .await,
            "cursor",
        );
    }
    for bad in [0, 6, -3] {
        let req = pb::ListClaimsRequest {
            cell_id: "cell-a".into(),
            table_name: bad,
            cursor: 0,
            limit: 0,
        };
        expect_invalid(c.list_claims(req).await, "table_name");
    }
    expect_invalid(
        c.list_outstanding_leases(leases_req("cell-a", "page-2", 0))
            .await,
        "cursor",
    );

    // At the limits: accepted.
    ok(
        c.list_outstanding_leases(leases_req("cell-a", "", 1000))
            .await,
        "leases limit 1000",
    );
    ok(
        c.list_outstanding_leases(leases_req("cell-a", "", 1)).await,
        "leases limit 1",
    );
    ok(
        c.list_outstanding_leases(leases_req("cell-a", SOME_LEASE, 0))
            .await,
        "leases cursor",
    );
    ok(
        c.list_claims(claims_req("cell-a", TableName::Users, 0, 10_000))
            .await,
        "claims limit 10000",
    );
    let last = ok(
        c.list_claims(claims_req("cell-a", TableName::Users, i64::MAX - 1, 1))
            .await,
        "cursor",
    );
    assert_eq!(
        (last.start_range, last.end_range, last.next_cursor),
        (i64::MAX - 1, i64::MAX, None)
    );
    server.shutdown().await;
}

async fn default_page_sizes_apply_when_limit_is_zero(store: Arc<dyn ClaimStore>) {
    let server = TestServer::start(store).await;
    let mut c = server.client().await;
    // 101 outstanding leases: limit 0 means 100.
    let mut ids = BTreeSet::new();
    for i in 0..101 {
        ids.insert(
            begin(
                &mut c,
                request("cell-a", &[username(&format!("lease-{i}"))], &[]),
            )
            .await
            .lease_id,
        );
    }
    let first = ok(
        c.list_outstanding_leases(leases_req("cell-a", "", 0)).await,
        "list",
    );
    assert_eq!(first.leases.len(), 100);
    assert!(!first.next_cursor.is_empty());
    let rest = ok(
        c.list_outstanding_leases(leases_req("cell-a", &first.next_cursor, 0))
            .await,
        "list",
    );
    assert_eq!(rest.leases.len(), 1);
    assert_eq!(rest.next_cursor, "");
    let listed: BTreeSet<String> = first
        .leases
        .iter()
        .chain(&rest.leases)
        .map(|l| l.lease_payload.as_ref().unwrap().lease_id.clone())
        .collect();
    assert_eq!(listed, ids);

    // 1001 claims with distinct record ids: limit 0 means 1000.
    let records: Vec<pb::ClaimRecord> = (0..1001)
        .map(|i| {
            claim(
                ClaimType::Email,
                &format!("u{i}@example.com"),
                TableName::Emails,
                i,
            )
        })
        .collect();
    begin(&mut c, request("cell-b", &records[..1000], &[])).await;
    begin(&mut c, request("cell-b", &records[1000..], &[])).await;
    let page = ok(
        c.list_claims(claims_req("cell-b", TableName::Emails, 0, 0))
            .await,
        "list",
    );
    assert_eq!(page.claims.len(), 1000);
    assert_eq!(page.next_cursor, Some(1000));
    assert_eq!((page.start_range, page.end_range), (0, 1000));
    server.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Renewal, listing, concurrency, server plumbing
// ---------------------------------------------------------------------------------------------

async fn renew_moves_last_renewed_at_and_leases_are_judged_by_server_time(
    store: Arc<dyn ClaimStore>,
) {
    let server = TestServer::start(store).await;
    let mut c = server.client().await;
    let lease = begin(&mut c, request("cell-a", &[username("long-tx")], &[])).await;
    let created = lease.created_at.expect("created_at");

    let renewed = ok(
        c.renew_lease(renew_req("cell-a", &lease.lease_id)).await,
        "renew",
    );
    assert_eq!(
        renewed.lease_payload.as_ref(),
        Some(&lease),
        "renew returns the same payload"
    );
    let renewed_at = renewed.last_renewed_at.expect("last_renewed_at");
    assert!(seconds(&renewed_at) >= seconds(&created));

    let page = ok(
        c.list_outstanding_leases(leases_req("cell-a", "", 0)).await,
        "list",
    );
    let listed = &page.leases[0];
    assert_eq!(listed.lease_payload.as_ref(), Some(&lease));
    assert_eq!(listed.last_renewed_at.as_ref(), Some(&renewed_at));
    let server_time = page.server_time.expect("server_time");
    assert!(
        seconds(&server_time) >= seconds(&renewed_at),
        "server_time is the server's now"
    );
    // Another cell sees none of it.
    let other = ok(
        c.list_outstanding_leases(leases_req("cell-b", "", 0)).await,
        "list",
    );
    assert!(other.leases.is_empty());
    assert!(
        other.server_time.is_some(),
        "server_time is set on every page"
    );
    server.shutdown().await;
}

fn seconds(ts: &prost_types::Timestamp) -> f64 {
    ts.seconds as f64 + f64::from(ts.nanos) / 1e9
}

async fn list_claims_pages_tile_the_id_space_and_include_leased_claims(store: Arc<dyn ClaimStore>) {
    let server = TestServer::start(store).await;
    let mut c = server.client().await;
    // Record 5 has three claims: a page never splits them.
    let records = [
        claim(ClaimType::Routes, "r-1", TableName::Routes, 1),
        claim(ClaimType::Routes, "r-5a", TableName::Routes, 5),
        claim(ClaimType::Routes, "r-5b", TableName::Routes, 5),
        claim(ClaimType::Routes, "r-5c", TableName::Routes, 5),
        claim(ClaimType::Routes, "r-9", TableName::Routes, 9),
    ];
    claimed(&mut c, "cell-a", &records[..4]).await;
    begin(&mut c, request("cell-a", &records[4..], &[])).await; // left leased
    claimed(
        &mut c,
        "cell-b",
        &[claim(ClaimType::Routes, "b-3", TableName::Routes, 3)],
    )
    .await;

    let mut cursor = 0;
    let mut expected_start = 0;
    let mut seen = Vec::new();
    loop {
        let page = ok(
            c.list_claims(claims_req("cell-a", TableName::Routes, cursor, 2))
                .await,
            "page",
        );
        assert_eq!(page.start_range, expected_start, "pages leave no gap");
        for info in &page.claims {
            assert!(
                page.start_range <= info.table_record_id && info.table_record_id < page.end_range
            );
            seen.push((info.claim_value.clone(), info.state()));
        }
        match page.next_cursor {
            Some(next) => {
                assert_eq!(next, page.end_range);
                cursor = next;
                expected_start = next;
            }
            None => {
                assert_eq!(
                    page.end_range,
                    i64::MAX,
                    "the last page reaches the end of the id space"
                );
                break;
            }
        }
    }
    let active = pb::ClaimState::Active;
    assert_eq!(
        seen,
        vec![
            ("r-1".to_owned(), active),
            ("r-5a".to_owned(), active),
            ("r-5b".to_owned(), active),
            ("r-5c".to_owned(), active),
            ("r-9".to_owned(), pb::ClaimState::Creating),
        ]
    );
    server.shutdown().await;
}

/// A small deterministic generator, so each client's order differs but runs are reproducible.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, (self.next() % (i as u64 + 1)) as usize);
        }
    }
}

async fn sixteen_concurrent_clients_racing_for_fifty_claims_get_one_winner_each(
    store: Arc<dyn ClaimStore>,
) {
    const CLIENTS: usize = 16;
    const CLAIMS: usize = 50;
    let server = TestServer::start(store).await;
    let claims: Vec<pb::ClaimRecord> = (0..CLAIMS)
        .map(|i| username(&format!("race-{i:02}")))
        .collect();

    let mut tasks = Vec::new();
    for n in 0..CLIENTS {
        let mut client = server.client().await;
        let mut order = claims.clone();
        XorShift(0x9E37_79B9_7F4A_7C15 ^ ((n as u64 + 1) * 0x1000_0001)).shuffle(&mut order);
        // Clients 0, 3, 6, … send single claims; the others batches of 2 or 3.
        let batch = 1 + n % 3;
        tasks.push(tokio::spawn(async move {
            let cell = format!("cell-{n:02}");
            let mut won = Vec::new();
            for chunk in order.chunks(batch) {
                if try_claim(&mut client, &cell, chunk).await {
                    won.extend(chunk.iter().map(|r| r.claim_value.clone()));
                } else if chunk.len() > 1 {
                    // The batch lost on some claim: the others may still be free.
                    for single in chunk {
                        if try_claim(&mut client, &cell, std::slice::from_ref(single)).await {
                            won.push(single.claim_value.clone());
                        }
                    }
                }
            }
            (cell, won)
        }));
    }
    let mut winners: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for task in tasks {
        let (cell, won) = task.await.expect("a racing client");
        for value in won {
            winners.entry(value).or_default().push(cell.clone());
        }
    }

    let mut c = server.client().await;
    for record in &claims {
        let cells = winners
            .get(&record.claim_value)
            .cloned()
            .unwrap_or_default();
        assert_eq!(cells.len(), 1, "{} won by {cells:?}", record.claim_value);
        assert_eq!(
            lookup(&mut c, record).await,
            held(pb::ClaimState::Active, &cells[0])
        );
    }
    for n in 0..CLIENTS {
        let page = ok(
            c.list_outstanding_leases(leases_req(&format!("cell-{n:02}"), "", 0))
                .await,
            "list",
        );
        assert!(page.leases.is_empty(), "every lease of the race ended");
    }
    server.shutdown().await;
}

/// Begin + commit; `false` when the batch lost (taken or leased by a rival).
async fn try_claim(client: &mut Client, cell: &str, records: &[pb::ClaimRecord]) -> bool {
    match client.begin_update(request(cell, records, &[])).await {
        Ok(response) => {
            let lease = response
                .into_inner()
                .lease_payload
                .expect("a lease payload");
            commit(client, cell, &lease.lease_id).await;
            true
        }
        Err(status) => {
            let reason = status
                .get_error_details()
                .error_info()
                .map(|i| i.reason.clone());
            match (status.code(), reason.as_deref()) {
                (Code::AlreadyExists, Some("CLAIM_TAKEN"))
                | (Code::FailedPrecondition, Some("CLAIM_LEASED")) => false,
                _ => panic!("a racing BeginUpdate failed unexpectedly: {status:?}"),
            }
        }
    }
}

async fn health_and_reflection_are_served(store: Arc<dyn ClaimStore>) {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let server = TestServer::start(store).await;
    let channel = Channel::from_shared(server.endpoint())
        .unwrap()
        .connect()
        .await
        .expect("connect");

    let mut health = HealthClient::new(channel.clone());
    for service in ["", "topology.claims.v1.ClaimsService"] {
        let answer = ok(
            health
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await,
            "health",
        );
        assert_eq!(
            answer.status(),
            ServingStatus::Serving,
            "health of {service:?}"
        );
    }

    let mut reflection = ServerReflectionClient::new(channel);
    let requests = [
        MessageRequest::ListServices(String::new()),
        MessageRequest::FileContainingSymbol("topology.claims.v1.ClaimsService".into()),
        MessageRequest::FileContainingSymbol("google.rpc.ErrorInfo".into()),
    ]
    .map(|message| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(message),
    });
    let mut answers = ok(
        reflection
            .server_reflection_info(tokio_stream::iter(requests))
            .await,
        "reflection",
    );
    let Some(MessageResponse::ListServicesResponse(list)) =
        answers.message().await.unwrap().unwrap().message_response
    else {
        panic!("expected a service list");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"topology.claims.v1.ClaimsService".to_owned()),
        "{names:?}"
    );
    assert!(
        names.contains(&"grpc.health.v1.Health".to_owned()),
        "{names:?}"
    );
    let Some(MessageResponse::FileDescriptorResponse(files)) =
        answers.message().await.unwrap().unwrap().message_response
    else {
        panic!("expected file descriptors");
    };
    assert!(!files.file_descriptor_proto.is_empty());
    // google.rpc error details are described too, so grpcurl can print ErrorInfo.
    let Some(MessageResponse::FileDescriptorResponse(files)) =
        answers.message().await.unwrap().unwrap().message_response
    else {
        panic!("expected the file describing google.rpc.ErrorInfo");
    };
    assert!(!files.file_descriptor_proto.is_empty());
    server.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Server behaviour that needs its own configuration (memory store only: it is about the server)
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_are_collected_by_the_server_after_retention() {
    let config = ServerConfig {
        outcome_retention: Duration::ZERO,
        gc_interval: Duration::from_millis(10),
        ..ServerConfig::default()
    };
    let server = TestServer::start_with(memory_store().await.store, config).await;
    let mut c = server.client().await;
    let lease = begin(&mut c, request("cell-a", &[username("gc")], &[])).await;
    commit(&mut c, "cell-a", &lease.lease_id).await;
    // Polls until the collector ran; a hang means it never does (guarded, not timed).
    let forgotten = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match c.commit_update(commit_req("cell-a", &lease.lease_id)).await {
                Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                Err(status) => return status,
            }
        }
    })
    .await
    .expect("the outcome is collected");
    expect_lease_error(
        Err::<Response<()>, _>(forgotten),
        Code::NotFound,
        "LEASE_NOT_FOUND",
        &lease.lease_id,
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_larger_than_four_mebibytes_are_refused_before_decoding() {
    // tonic refuses an oversized message with OUT_OF_RANGE (no ErrorInfo: no handler ran).
    let server = TestServer::start(memory_store().await.store).await;
    let mut c = server.client().await;
    let huge = email(&"x".repeat(5 * 1024 * 1024));
    let status = c
        .begin_update(request("cell-a", &[huge], &[]))
        .await
        .expect_err("too large");
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    // The connection stays usable.
    begin(&mut c, request("cell-a", &[username("after-huge")], &[])).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_with_idle_clients_still_connected() {
    let server = TestServer::start(memory_store().await.store).await;
    let mut idle = server.client().await;
    begin(&mut idle, request("cell-a", &[username("idle")], &[])).await;
    tokio::time::timeout(Duration::from_secs(60), server.shutdown())
        .await
        .expect("shutdown completes although a client keeps its connection open");
    let status = idle
        .lookup_claim(lookup_req(ClaimType::Username, "idle"))
        .await
        .expect_err("server gone");
    // The transport reports a vanished server as UNAVAILABLE or, when the connection closes
    // mid-call, CANCELLED; a client sees either as a retryable Unavailable.
    assert!(
        matches!(
            topology_claims::grpc::status::from_status(&status),
            ClaimsError::Unavailable { .. }
        ),
        "{status:?}"
    );
}

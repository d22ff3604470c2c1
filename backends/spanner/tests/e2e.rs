//! End-to-end through the real gRPC server (`topology_claims_testkit::TestServer`) over a
//! Spanner-backed store on the emulator: the design's happy path (and its rollback), and sixteen
//! concurrent clients racing for the same claims with exactly one winner per claim.

mod common;

use std::sync::Arc;

use tonic::transport::Channel;
use tonic::{Code, Response, Status};
use tonic_types::StatusExt;
use topology_claims::{ClaimStore, ClaimType, OwnerType, TableName};
use topology_claims_proto::pb;
use topology_claims_proto::pb::claims_service_client::ClaimsServiceClient;
use topology_claims_testkit::race::racing_clients_get_one_winner_each;
use topology_claims_testkit::TestServer;

type Client = ClaimsServiceClient<Channel>;

async fn spanner_server() -> TestServer {
    let store: Arc<dyn ClaimStore> = Arc::new(common::fresh_store(common::Mode::Plain).await);
    TestServer::start(store).await
}

fn claim(claim_type: ClaimType, value: &str, table: TableName, record_id: i64) -> pb::ClaimRecord {
    pb::ClaimRecord {
        claim_type: claim_type.number(),
        claim_value: value.to_owned(),
        owner: OwnerType::USER.number(),
        owner_value: format!("owner-of-{value}"),
        table_name: table.number(),
        table_record_id: record_id,
        // Both, agreeing: the server returns records with both set (the owner type and table
        // as names too).
        namespace: topology_claims::domain::NamespaceId::of_claim_type(claim_type).to_string(),
        owner_type: OwnerType::USER.name().to_owned(),
        source_table: table.name().to_owned(),
        ..Default::default()
    }
}

fn request(
    cell: &str,
    creates: &[pb::ClaimRecord],
    destroys: &[pb::ClaimRecord],
) -> pb::BeginUpdateRequest {
    pb::BeginUpdateRequest {
        local_transaction: String::new(),
        cell_id: cell.to_owned(),
        creates_claims: creates.to_vec(),
        destroys_claims: destroys.to_vec(),
        updates_claims: Vec::new(),
        lease_id: String::new(),
        restore_correction: false,
        wait_for_leased: None,
    }
}

fn ok<T>(result: Result<Response<T>, Status>, what: &str) -> T {
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
    let req = pb::CommitUpdateRequest {
        cell_id: cell.to_owned(),
        lease_id: lease_id.to_owned(),
    };
    ok(client.commit_update(req).await, "CommitUpdate");
}

async fn rollback(client: &mut Client, cell: &str, lease_id: &str) {
    let req = pb::RollbackUpdateRequest {
        cell_id: cell.to_owned(),
        lease_id: lease_id.to_owned(),
        unrenewed_for: None,
    };
    ok(client.rollback_update(req).await, "RollbackUpdate");
}

async fn outstanding(client: &mut Client, cell: &str) -> pb::ListOutstandingLeasesResponse {
    let req = pb::ListOutstandingLeasesRequest {
        cell_id: cell.to_owned(),
        cursor: String::new(),
        limit: 0,
    };
    ok(
        client.list_outstanding_leases(req).await,
        "ListOutstandingLeases",
    )
}

/// The claim's state and holder, `None` when absent.
async fn lookup(client: &mut Client, record: &pb::ClaimRecord) -> Option<(pb::ClaimState, String)> {
    let req = pb::LookupClaimRequest {
        claim_type: record.claim_type,
        claim_value: record.claim_value.clone(),
        ..Default::default()
    };
    match client.lookup_claim(req).await {
        Ok(response) => {
            let response = response.into_inner();
            Some((response.state(), response.cell_id))
        }
        Err(status) if status.code() == Code::NotFound => None,
        Err(status) => panic!("LookupClaim failed: {status:?}"),
    }
}

fn held(state: pb::ClaimState, cell: &str) -> Option<(pb::ClaimState, String)> {
    Some((state, cell.to_owned()))
}

/// The code and ErrorInfo reason of a refused request.
fn refusal<T: std::fmt::Debug>(result: Result<Response<T>, Status>) -> (Code, Option<String>) {
    let status = result.expect_err("a refusal");
    (status.code(), reason(&status))
}

fn reason(status: &Status) -> Option<String> {
    status
        .get_error_details()
        .error_info()
        .map(|info| info.reason.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn happy_path_claims_are_routable_while_creating_active_after_commit_and_freed_by_rollback() {
    let server = spanner_server().await;
    let mut client = server.client().await;
    let claims = [
        claim(ClaimType::Username, "alice", TableName::USERS, 7),
        claim(ClaimType::Email, "alice@example.com", TableName::EMAILS, 70),
        claim(ClaimType::Routes, "alice", TableName::ROUTES, 700),
    ];

    // Phase 1: one BeginUpdate for the whole batch; the claims are routable at once.
    let lease = begin(&mut client, request("cell-a", &claims, &[])).await;
    assert_eq!(lease.cell_id, "cell-a");
    assert_eq!(
        lease
            .original_request
            .as_ref()
            .map(|r| r.creates_claims.clone()),
        Some(claims.to_vec())
    );
    for record in &claims {
        assert_eq!(
            lookup(&mut client, record).await,
            held(pb::ClaimState::Creating, "cell-a")
        );
    }
    let page = outstanding(&mut client, "cell-a").await;
    assert_eq!(page.leases.len(), 1);
    let listed = page.leases[0].lease_payload.as_ref().expect("a payload");
    assert_eq!(listed.lease_id, lease.lease_id);
    let created = listed.created_at.expect("created_at");
    let server_time = page.server_time.expect("server_time");
    assert!(
        (server_time.seconds, server_time.nanos) >= (created.seconds, created.nanos),
        "Spanner's clock on both ends"
    );

    // A rival cell is refused while the lease is outstanding (temporarily), and afterwards.
    let rival = refusal(
        client
            .begin_update(request("cell-b", &claims[..1], &[]))
            .await,
    );
    assert_eq!(
        rival,
        (Code::FailedPrecondition, Some("CLAIM_LEASED".into()))
    );

    // Phase 3: commit, retried once as a reconciler would.
    commit(&mut client, "cell-a", &lease.lease_id).await;
    commit(&mut client, "cell-a", &lease.lease_id).await;
    for record in &claims {
        assert_eq!(
            lookup(&mut client, record).await,
            held(pb::ClaimState::Active, "cell-a")
        );
    }
    assert!(outstanding(&mut client, "cell-a").await.leases.is_empty());
    let rival = refusal(
        client
            .begin_update(request("cell-b", &claims[..1], &[]))
            .await,
    );
    assert_eq!(rival, (Code::AlreadyExists, Some("CLAIM_TAKEN".into())));

    // Failure point 3A: an email change whose local transaction fails is rolled back: the old
    // email is restored, the new one freed.
    let new_email = claim(
        ClaimType::Email,
        "alice@new.example.com",
        TableName::EMAILS,
        70,
    );
    let change = begin(
        &mut client,
        request("cell-a", std::slice::from_ref(&new_email), &claims[1..2]),
    )
    .await;
    assert_eq!(
        lookup(&mut client, &claims[1]).await,
        held(pb::ClaimState::Destroying, "cell-a")
    );
    rollback(&mut client, "cell-a", &change.lease_id).await;
    assert_eq!(
        lookup(&mut client, &claims[1]).await,
        held(pb::ClaimState::Active, "cell-a")
    );
    assert_eq!(lookup(&mut client, &new_email).await, None);

    let users = pb::ListClaimsRequest {
        cell_id: "cell-a".into(),
        table_name: TableName::USERS.number(),
        cursor: 0,
        limit: 0,
        cursor_key: None,
        ..Default::default()
    };
    let users = ok(client.list_claims(users).await, "ListClaims");
    assert_eq!(
        users
            .claims
            .iter()
            .map(|c| c.claim_value.as_str())
            .collect::<Vec<_>>(),
        ["alice"]
    );
    assert_eq!((users.end_range, users.next_cursor), (i64::MAX, None));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_concurrent_clients_racing_for_the_same_claims_get_one_winner_each() {
    // The shared scenario (`testing::race`), over fewer claims: the emulator runs one
    // read-write transaction at a time and aborts the rest, so every attempt is retried.
    let store: Arc<dyn ClaimStore> = Arc::new(common::fresh_store(common::Mode::Plain).await);
    racing_clients_get_one_winner_each(store, 16, 24).await;
}

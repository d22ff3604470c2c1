//! The design's scenarios, end to end: the happy path (routable while creating, active after
//! commit), a conflicting BeginUpdate from another cell (2a), and a rollback after the cell's
//! local transaction failed (3a).

use std::sync::Arc;

use tonic::Code;
use topology_claims::{ClaimStore, ClaimType, OwnerType, TableName};
use topology_claims_proto::pb;
use topology_claims_testkit::TestServer;

use crate::support::*;

against_every_store!(
    happy_path_user_email_and_route_are_routable_while_creating_and_active_after_commit,
    failure_2a_conflicting_begin_from_another_cell_is_refused_and_changes_nothing,
    failure_3a_rollback_after_local_failure_restores_destroys_and_frees_creates,
);

async fn happy_path_user_email_and_route_are_routable_while_creating_and_active_after_commit(
    store: Arc<dyn ClaimStore>,
) {
    let server = TestServer::start(store).await;
    let mut client = server.client().await;
    let claims = [
        claim(ClaimType::Username, "alice", TableName::USERS, 7),
        claim(ClaimType::Email, "alice@example.com", TableName::EMAILS, 70),
        claim(ClaimType::Routes, "alice", TableName::ROUTES, 700),
        claim(ClaimType::Routes, "alice/blog", TableName::ROUTES, 701),
    ];

    // Phase 1: one BeginUpdate for the whole batch.
    let lease = begin(&mut client, request("cell-a", &claims, &[])).await;
    assert_eq!(lease.cell_id, "cell-a");
    assert_eq!(lease.lease_id, lease.lease_id.to_ascii_lowercase());
    let original = lease
        .original_request
        .as_ref()
        .expect("the original request");
    // As sent, with the namespace each legacy claim_type stands for and the names of the legacy
    // owner and table enums.
    let with_namespaces: Vec<pb::ClaimRecord> = claims
        .iter()
        .map(|c| pb::ClaimRecord {
            namespace: ["routes", "usernames", "emails"][c.claim_type as usize - 1].to_owned(),
            owner_type: OwnerType::from_number(c.owner.into())
                .unwrap()
                .name()
                .to_owned(),
            source_table: TableName::from_number(c.table_name.into())
                .unwrap()
                .name()
                .to_owned(),
            ..c.clone()
        })
        .collect();
    assert_eq!(original.creates_claims, with_namespaces);
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
            .list_claims(claims_req("cell-a", TableName::USERS, 0, 0))
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

//! Ending and renewing a lease from a client's view: every row of the status table of
//! CommitUpdate, RollbackUpdate and RenewLease, including the idempotent OKs and a rollback of a
//! never-seen id that refuses its late BeginUpdate.

use std::sync::Arc;

use tonic::Code;
use topology_claims::ClaimStore;
use topology_claims_proto::pb;
use topology_claims_testkit::TestServer;

use crate::support::*;

against_every_store!(every_status_row_of_commit_rollback_and_renew,);

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

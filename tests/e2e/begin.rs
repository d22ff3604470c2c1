//! BeginUpdate from a client's view: every row of its status table (code, ErrorInfo reason and
//! metadata), and client-chosen lease ids that make a retried BeginUpdate return the same lease.

use std::sync::Arc;

use tonic::Code;
use tonic_types::StatusExt;
use topology_claims::{ClaimStore, ClaimType};
use topology_claims_proto::pb;
use topology_claims_testkit::TestServer;

use crate::support::*;

against_every_store!(
    every_status_row_of_the_begin_update_table,
    client_chosen_lease_ids_make_begin_safe_to_retry,
);

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

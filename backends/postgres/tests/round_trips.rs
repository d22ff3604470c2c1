//! The documented round trips per operation (statements pipelined, already prepared), counted by
//! the store itself. A change that adds a round trip to the hot path fails here.

mod common;

use topology_claims::{BeginUpdate, ClaimStore, ClaimsError, TableName};
use topology_claims_postgres::PostgresOptions;
use topology_claims_testkit::fixtures::{cell, creates, destroys, moved, username};

#[tokio::test]
async fn begin_and_commit_take_two_round_trips_each() {
    // One pooled connection: every operation finds its statements prepared after the warm-up.
    let Some((store, schema)) =
        common::fresh_store_with(|o| PostgresOptions { pool_size: 1, ..o }).await
    else {
        return;
    };
    let a = cell("cell-a");
    let warm = store
        .begin_update(creates(&a, &[username("warm"), username("moving")]))
        .await
        .unwrap();
    store.commit_update(&a, warm.lease_id).await.unwrap();
    store
        .rollback_update(&a, warm.lease_id, None)
        .await
        .unwrap_err();
    store.renew_lease(&a, warm.lease_id).await.unwrap_err();
    store.lookup_claim(&username("warm").key).await.unwrap();

    // Creates, destroys and updates in one batch: still two round trips each way.
    let request = BeginUpdate {
        destroys: vec![username("warm")],
        updates: vec![moved(&username("moving"), "p", TableName::PROJECTS, 5)],
        ..creates(&a, &[username("x"), username("y"), username("z")])
    };
    let (lease, n) = common::trips(&store, store.begin_update(request)).await;
    let lease = lease.unwrap();
    assert_eq!(n, 2, "BeginUpdate");
    let (renewed, n) = common::trips(&store, store.renew_lease(&a, lease.lease_id)).await;
    renewed.unwrap();
    assert_eq!(n, 2, "RenewLease");
    let (done, n) = common::trips(&store, store.commit_update(&a, lease.lease_id)).await;
    done.unwrap();
    assert_eq!(n, 2, "CommitUpdate");
    let updated = store.lookup_claim(&username("moving").key).await.unwrap();
    assert_eq!(updated.record.table_name, TableName::PROJECTS);
    let (again, n) = common::trips(&store, store.commit_update(&a, lease.lease_id)).await;
    again.unwrap();
    assert_eq!(n, 1, "CommitUpdate of a committed lease");
    let (refused, n) = common::trips(
        &store,
        store.begin_update(destroys(&a, &[username("absent")])),
    )
    .await;
    assert!(matches!(refused, Err(ClaimsError::ClaimNotFound { .. })));
    assert_eq!(n, 1, "a refused BeginUpdate");
    let lease = store
        .begin_update(creates(&a, &[username("undo")]))
        .await
        .unwrap();
    let (undone, n) = common::trips(&store, store.rollback_update(&a, lease.lease_id, None)).await;
    undone.unwrap();
    assert_eq!(n, 2, "RollbackUpdate");
    let (found, n) = common::trips(&store, store.lookup_claim(&username("x").key)).await;
    found.unwrap();
    assert_eq!(n, 1, "LookupClaim");
    if let Some(admin) = common::admin().await {
        common::drop_schema(&admin, &schema).await;
    }
}

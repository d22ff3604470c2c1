//! Restore epochs on PostgreSQL beyond the shared conformance cases (which include concurrent
//! marks and reports: without the restore lock, concurrent reports each see another one pending
//! and none lifts): each call takes its documented round trips.

mod common;

use topology_claims::domain::MarkRestored;
use topology_claims::{ClaimStore, Timestamp};
use topology_claims_postgres::{PostgresClaimStore, PostgresOptions};
use topology_claims_testkit::fixtures::{cell, creates, username};

fn mark(reason: &str) -> MarkRestored {
    MarkRestored {
        backup_time: Timestamp::from_unix_micros(1_700_000_000_000_000),
        reason: reason.to_owned(),
        expect_cells: vec![],
    }
}

async fn store(pool_size: usize) -> Option<(PostgresClaimStore, String)> {
    common::fresh_store_with(|o| PostgresOptions { pool_size, ..o }).await
}

async fn drop_schema(schema: &str) {
    if let Some(admin) = common::admin().await {
        common::drop_schema(&admin, schema).await;
    }
}

async fn committed_claim_of(store: &PostgresClaimStore, cell_name: &str) {
    let c = cell(cell_name);
    let lease = store
        .begin_update(creates(&c, &[username(&format!("{cell_name}-name"))]))
        .await
        .unwrap();
    store.commit_update(&c, lease.lease_id).await.unwrap();
}

#[tokio::test]
async fn restore_calls_take_their_documented_round_trips() {
    // One pooled connection: every call finds its statements prepared after the warm-up.
    let Some((store, schema)) = store(1).await else {
        return;
    };
    committed_claim_of(&store, "cell-a").await;
    committed_claim_of(&store, "cell-b").await;
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    let warm = store.mark_restored(&mark("warm-up")).await.unwrap();
    store
        .report_verification_pass(&a, warm.epoch)
        .await
        .unwrap();
    store.lift_quarantine(warm.epoch, "warm-up").await.unwrap();
    store.restore_state().await.unwrap();

    let (marked, n) = common::trips(&store, store.mark_restored(&mark("drill"))).await;
    let marked = marked.unwrap();
    assert_eq!(n, 2, "mark_restored");
    let (refused, n) = common::trips(&store, store.mark_restored(&mark(" "))).await;
    refused.unwrap_err();
    assert_eq!(n, 1, "a refused mark");
    let (reported, n) =
        common::trips(&store, store.report_verification_pass(&a, marked.epoch)).await;
    assert!(reported.unwrap().quarantined());
    assert_eq!(n, 2, "report_verification_pass");
    let (again, n) = common::trips(&store, store.report_verification_pass(&a, marked.epoch)).await;
    again.unwrap();
    assert_eq!(n, 1, "a repeated report writes nothing");
    let (last, n) = common::trips(&store, store.report_verification_pass(&b, marked.epoch)).await;
    assert!(!last.unwrap().quarantined());
    assert_eq!(n, 2, "the last report and its lift");
    let (lifted, n) = common::trips(&store, store.lift_quarantine(marked.epoch, "ops")).await;
    lifted.unwrap();
    assert_eq!(n, 1, "a lift of a lifted epoch writes nothing");
    let next = store.mark_restored(&mark("again")).await.unwrap();
    let (lifted, n) = common::trips(&store, store.lift_quarantine(next.epoch, "ops")).await;
    assert!(!lifted.unwrap().quarantined());
    assert_eq!(n, 2, "lift_quarantine");
    let (state, n) = common::trips(&store, store.restore_state()).await;
    assert_eq!(state.unwrap().unwrap().epoch, next.epoch);
    assert_eq!(n, 1, "restore_state");
    drop_schema(&schema).await;
}

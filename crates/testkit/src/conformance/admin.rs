//! The administrative calls: the lease summary the gauges and ListLeases read, and
//! decommissioning a cell in bounded steps (refused while it has outstanding leases, resumable,
//! and final: a decommissioned cell may begin nothing).

use crate::fixtures::{cell, creates, email, record_in, username};
use topology_claims::domain::{CellId, ClaimRecord, ClaimState, ClaimType, TableName};
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;

use super::{committed, state_of};

/// `n` username claims of `cell_id` (`<prefix>-0` …), committed in one lease, each its own record.
async fn committed_usernames(
    store: &impl ClaimStore,
    cell_id: &CellId,
    prefix: &str,
    n: usize,
) -> Vec<ClaimRecord> {
    let records: Vec<ClaimRecord> = (0..n)
        .map(|i| {
            record_in(
                TableName::USERS,
                i as i64 + 1,
                ClaimType::Username,
                &format!("{prefix}-{i}"),
            )
        })
        .collect();
    committed(store, creates(cell_id, &records)).await;
    records
}

pub async fn lease_summary_counts_each_cells_outstanding_leases_and_its_oldest(
    store: &impl ClaimStore,
) {
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    assert!(
        store.lease_summary().await.unwrap().cells.is_empty(),
        "no leases, no cells"
    );
    let first_a = store
        .begin_update(creates(&a, &[username("sum-a1")]))
        .await
        .unwrap();
    let second_a = store
        .begin_update(creates(&a, &[username("sum-a2")]))
        .await
        .unwrap();
    let only_b = store
        .begin_update(creates(&b, &[username("sum-b1")]))
        .await
        .unwrap();

    let summary = store.lease_summary().await.unwrap();
    let cells: Vec<(String, u64)> = summary
        .cells
        .iter()
        .map(|c| (c.cell_id.to_string(), c.outstanding))
        .collect();
    assert_eq!(
        cells,
        [("cell-a".to_string(), 2), ("cell-b".to_string(), 1)]
    );
    let oldest_a = first_a.created_at.min(second_a.created_at);
    assert_eq!(summary.cells[0].oldest_created_at, oldest_a);
    assert_eq!(summary.cells[1].oldest_created_at, only_b.created_at);
    for cell_leases in &summary.cells {
        assert!(
            summary.server_time >= cell_leases.oldest_created_at,
            "the store's clock reads after its leases were created"
        );
    }

    store.commit_update(&b, only_b.lease_id).await.unwrap();
    store
        .rollback_update(&a, first_a.lease_id, None)
        .await
        .unwrap();
    let summary = store.lease_summary().await.unwrap();
    assert_eq!(
        summary.cells.len(),
        1,
        "a cell without outstanding leases leaves the summary"
    );
    assert_eq!(summary.cells[0].cell_id, a);
    assert_eq!(summary.cells[0].outstanding, 1);
    assert_eq!(summary.cells[0].oldest_created_at, second_a.created_at);
}

pub async fn decommission_is_refused_while_the_cell_has_outstanding_leases(
    store: &impl ClaimStore,
) {
    let a = cell("cell-a");
    committed(store, creates(&a, &[username("kept")])).await;
    let first = store
        .begin_update(creates(&a, &[username("pending-1")]))
        .await
        .unwrap();
    store
        .begin_update(creates(&a, &[email("pending@example.com")]))
        .await
        .unwrap();
    for dry_run in [true, false] {
        let error = store.decommission_step(&a, 10, dry_run).await.unwrap_err();
        assert!(
            matches!(error, ClaimsError::CellHasOutstandingLeases { outstanding: 2, ref cell_id } if *cell_id == a),
            "dry run {dry_run}: {error:?}"
        );
    }
    assert_eq!(
        state_of(store, &username("kept").key).await,
        Some(("cell-a".into(), ClaimState::Active)),
        "nothing deleted"
    );
    assert_eq!(
        state_of(store, &username("pending-1").key).await,
        Some(("cell-a".into(), ClaimState::Creating))
    );
    store
        .begin_update(creates(&a, &[username("still-allowed")]))
        .await
        .expect("a refused decommission marks nothing");

    store.commit_update(&a, first.lease_id).await.unwrap();
    let error = store.decommission_step(&a, 10, false).await.unwrap_err();
    assert!(
        matches!(
            error,
            ClaimsError::CellHasOutstandingLeases { outstanding: 2, .. }
        ),
        "one lease ended, another began: {error:?}"
    );
}

pub async fn decommission_dry_run_counts_and_changes_nothing(store: &impl ClaimStore) {
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    let records = committed_usernames(store, &a, "dry", 6).await;
    committed_usernames(store, &b, "other", 3).await;
    let step = store.decommission_step(&a, 4, true).await.unwrap();
    assert!(step.dry_run);
    assert_eq!(step.cell_id, a);
    assert_eq!(
        step.claims, 6,
        "a dry run counts all the cell's claims, not one batch"
    );
    assert!(!step.complete);
    assert!(!step.already_decommissioned);
    for record in &records {
        assert_eq!(
            state_of(store, &record.key).await,
            Some(("cell-a".into(), ClaimState::Active))
        );
    }
    let again = store.decommission_step(&a, 4, true).await.unwrap();
    assert!(!again.already_decommissioned, "a dry run marks nothing");
    committed(store, creates(&a, &[username("after-dry-run")])).await;

    let empty = store
        .decommission_step(&cell("cell-empty"), 4, true)
        .await
        .unwrap();
    assert_eq!(empty.claims, 0);
    assert!(empty.complete, "a cell without claims is already done");
}

pub async fn decommission_deletes_in_bounded_steps_and_leaves_other_cells_untouched(
    store: &impl ClaimStore,
) {
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    let doomed = committed_usernames(store, &a, "gone", 25).await;
    let kept = committed_usernames(store, &b, "kept", 7).await;
    let mut deleted = Vec::new();
    loop {
        let step = store.decommission_step(&a, 10, false).await.unwrap();
        assert!(!step.dry_run);
        deleted.push((step.claims, step.complete));
        if step.complete || deleted.len() > 5 {
            break;
        }
    }
    assert_eq!(deleted, [(10, false), (10, false), (5, true)]);
    for record in &doomed {
        assert_eq!(
            store.lookup_claim(&record.key).await.unwrap_err(),
            ClaimsError::ClaimNotFound {
                claim: record.key.clone()
            }
        );
    }
    for record in &kept {
        assert_eq!(
            state_of(store, &record.key).await,
            Some(("cell-b".into(), ClaimState::Active))
        );
    }
    let after = store.decommission_step(&a, 10, false).await.unwrap();
    assert_eq!(
        (after.claims, after.complete),
        (0, true),
        "a finished decommission repeats harmlessly"
    );
}

pub async fn decommission_resumes_after_a_step_that_was_cut_short(store: &impl ClaimStore) {
    let a = cell("cell-a");
    committed_usernames(store, &a, "resume", 12).await;
    let first = store.decommission_step(&a, 5, false).await.unwrap();
    assert_eq!(
        (first.claims, first.complete, first.already_decommissioned),
        (5, false, false)
    );
    // The operator's run stops here; a new run starts over with a dry run.
    let dry = store.decommission_step(&a, 5, true).await.unwrap();
    assert_eq!(dry.claims, 7, "the dry run counts what is left");
    assert!(dry.already_decommissioned);
    let mut steps = Vec::new();
    loop {
        let step = store.decommission_step(&a, 5, false).await.unwrap();
        assert!(step.already_decommissioned, "later steps find the mark");
        steps.push(step.claims);
        if step.complete || steps.len() > 5 {
            break;
        }
    }
    assert_eq!(steps, [5, 2]);
    assert_eq!(
        store.decommission_step(&a, 5, true).await.unwrap().claims,
        0
    );
}

pub async fn a_decommissioned_cell_may_begin_nothing(store: &impl ClaimStore) {
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    committed(
        store,
        creates(&a, &[username("inherited"), email("old@example.com")]),
    )
    .await;
    let step = store.decommission_step(&a, 1, false).await.unwrap();
    assert_eq!((step.claims, step.complete), (1, false));
    assert_eq!(
        store
            .begin_update(creates(&a, &[username("refused")]))
            .await
            .unwrap_err(),
        ClaimsError::CellDecommissioned { cell_id: a.clone() },
        "refused from the first real step on, while claims are still being deleted"
    );
    assert_eq!(
        state_of(store, &username("refused").key).await,
        None,
        "the refused batch wrote nothing"
    );
    committed(store, creates(&b, &[username("unaffected")])).await;

    while !store
        .decommission_step(&a, 1, false)
        .await
        .unwrap()
        .complete
    {}
    assert_eq!(
        store
            .begin_update(creates(&a, &[username("still-refused")]))
            .await
            .unwrap_err(),
        ClaimsError::CellDecommissioned { cell_id: a.clone() },
        "the mark outlives the claims"
    );
    committed(
        store,
        creates(&b, &[username("inherited"), email("old@example.com")]),
    )
    .await;
    assert_eq!(
        state_of(store, &username("inherited").key).await,
        Some(("cell-b".into(), ClaimState::Active))
    );
    assert_eq!(
        state_of(store, &email("old@example.com").key).await,
        Some(("cell-b".into(), ClaimState::Active))
    );
}

//! Restore epochs (`domain::restore`): a mark records the next epoch with the cells to wait for,
//! the reports of their verification passes lift the quarantine, an operator may lift it, and a
//! report or lift of another epoch is refused; concurrent marks number distinct, consecutive
//! epochs, and concurrent reports of every expected cell lift it. The quarantine itself is the front end's
//! (`restore::RestoreGate`), so it is tested there and in the drill, not per store.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::fixtures::{cell, creates, username};
use topology_claims::domain::{CellId, MarkRestored, Timestamp};
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;

use super::committed;

/// A backup time well before any store's clock.
fn backup_time() -> Timestamp {
    Timestamp::from_unix_micros(1_700_000_000_000_000)
}

fn mark(reason: &str, expect: &[&str]) -> MarkRestored {
    MarkRestored {
        backup_time: backup_time(),
        reason: reason.to_owned(),
        expect_cells: expect.iter().map(|c| cell(c)).collect(),
    }
}

fn cells(names: &[&str]) -> BTreeSet<CellId> {
    names.iter().map(|c| cell(c)).collect()
}

pub async fn a_store_never_restored_has_no_epoch_and_refuses_reports_and_lifts(
    store: &impl ClaimStore,
) {
    assert_eq!(store.restore_state().await.unwrap(), None);
    let report = store
        .report_verification_pass(&cell("cell-a"), 1)
        .await
        .unwrap_err();
    assert_eq!(
        report,
        ClaimsError::RestoreEpochMismatch {
            sent: 1,
            current: 0
        }
    );
    let lift = store.lift_quarantine(1, "ops").await.unwrap_err();
    assert!(
        matches!(
            lift,
            ClaimsError::RestoreEpochMismatch {
                sent: 1,
                current: 0
            }
        ),
        "{lift:?}"
    );
}

pub async fn mark_restored_expects_every_cell_with_claims_or_leases_and_the_named_ones(
    store: &impl ClaimStore,
) {
    committed(store, creates(&cell("cell-a"), &[username("rs-a")])).await;
    store
        .begin_update(creates(&cell("cell-b"), &[username("rs-b")]))
        .await
        .unwrap();
    let before = store.lease_summary().await.unwrap().server_time;
    let first = store
        .mark_restored(&mark("restored last night's backup", &["cell-c"]))
        .await
        .unwrap();
    assert_eq!(first.epoch, 1);
    assert_eq!(first.backup_time, backup_time());
    assert_eq!(first.reason, "restored last night's backup");
    assert!(first.marked_at >= before, "marked at the store's clock");
    assert_eq!(first.expected_cells, cells(&["cell-a", "cell-b", "cell-c"]));
    assert!(first.reported.is_empty());
    assert!(first.quarantined());
    assert_eq!(store.restore_state().await.unwrap(), Some(first.clone()));

    let second = store.mark_restored(&mark("again", &[])).await.unwrap();
    assert_eq!(second.epoch, 2, "each mark is a new epoch");
    assert_eq!(second.expected_cells, cells(&["cell-a", "cell-b"]));
    assert!(second.marked_at >= first.marked_at);
    assert_eq!(store.restore_state().await.unwrap(), Some(second));
}

pub async fn a_mark_refuses_a_future_backup_time_and_an_empty_store_is_not_quarantined(
    store: &impl ClaimStore,
) {
    let now = store.lease_summary().await.unwrap().server_time;
    let future = MarkRestored {
        backup_time: now.saturating_add(Duration::from_secs(3600)),
        ..mark("typo", &[])
    };
    let error = store.mark_restored(&future).await.unwrap_err();
    assert!(
        matches!(error, ClaimsError::InvalidRequest { ref field, .. } if field == "backup_time"),
        "{error:?}"
    );
    assert_eq!(
        store.restore_state().await.unwrap(),
        None,
        "nothing written"
    );
    let empty = store
        .mark_restored(&mark("empty store", &[]))
        .await
        .unwrap();
    assert!(empty.expected_cells.is_empty());
    assert!(!empty.quarantined(), "no cell to wait for");
}

pub async fn the_last_expected_report_lifts_the_quarantine(store: &impl ClaimStore) {
    committed(store, creates(&cell("cell-a"), &[username("rp-a")])).await;
    committed(store, creates(&cell("cell-b"), &[username("rp-b")])).await;
    let marked = store.mark_restored(&mark("drill", &[])).await.unwrap();
    let after_a = store
        .report_verification_pass(&cell("cell-a"), marked.epoch)
        .await
        .unwrap();
    assert_eq!(
        after_a.reported.keys().cloned().collect::<BTreeSet<_>>(),
        cells(&["cell-a"])
    );
    assert!(after_a.quarantined(), "cell-b has not reported");
    let reported_at = after_a.reported[&cell("cell-a")];
    assert!(reported_at >= marked.marked_at);
    // A repeat keeps the first report.
    let again = store
        .report_verification_pass(&cell("cell-a"), marked.epoch)
        .await
        .unwrap();
    assert_eq!(again.reported[&cell("cell-a")], reported_at);
    // A stale epoch is refused.
    let stale = store
        .report_verification_pass(&cell("cell-b"), marked.epoch + 1)
        .await
        .unwrap_err();
    assert_eq!(
        stale,
        ClaimsError::RestoreEpochMismatch {
            sent: marked.epoch + 1,
            current: marked.epoch
        }
    );
    let after_b = store
        .report_verification_pass(&cell("cell-b"), marked.epoch)
        .await
        .unwrap();
    assert!(!after_b.quarantined());
    let (lifted_at, reason) = after_b.lifted.clone().unwrap();
    assert!(lifted_at >= reported_at);
    assert_eq!(reason, topology_claims::domain::restore::LIFTED_BY_REPORTS);
    assert_eq!(store.restore_state().await.unwrap(), Some(after_b));
}

pub async fn an_operator_lift_ends_the_quarantine_once(store: &impl ClaimStore) {
    committed(store, creates(&cell("cell-a"), &[username("lf-a")])).await;
    let marked = store.mark_restored(&mark("drill", &[])).await.unwrap();
    let error = store.lift_quarantine(marked.epoch, " ").await.unwrap_err();
    assert!(
        matches!(error, ClaimsError::InvalidRequest { .. }),
        "{error:?}"
    );
    let lifted = store
        .lift_quarantine(marked.epoch, "cell-a is gone for good")
        .await
        .unwrap();
    let (at, reason) = lifted.lifted.clone().unwrap();
    assert_eq!(reason, "cell-a is gone for good");
    let again = store
        .lift_quarantine(marked.epoch, "second try")
        .await
        .unwrap();
    assert_eq!(again.lifted, Some((at, reason)), "the first lift stays");
    // A report after the lift is still recorded.
    let reported = store
        .report_verification_pass(&cell("cell-a"), marked.epoch)
        .await
        .unwrap();
    assert!(reported.reported.contains_key(&cell("cell-a")));
    assert_eq!(reported.lifted, again.lifted);
}

/// Calls at once, as several servers on one store would make them.
const CONCURRENT: usize = 8;

pub async fn concurrent_marks_number_distinct_consecutive_epochs(store: &impl ClaimStore) {
    let requests: Vec<MarkRestored> = (0..CONCURRENT)
        .map(|i| mark(&format!("mark {i}"), &[]))
        .collect();
    let results = futures::future::join_all(requests.iter().map(|r| store.mark_restored(r))).await;
    let mut epochs: Vec<_> = results.into_iter().map(|r| r.expect("a mark")).collect();
    let numbers: BTreeSet<u64> = epochs.iter().map(|e| e.epoch).collect();
    assert_eq!(numbers, (1..=CONCURRENT as u64).collect());
    epochs.sort_by_key(|e| e.epoch);
    assert!(
        epochs.windows(2).all(|w| w[0].marked_at <= w[1].marked_at),
        "epochs are stamped in the order they commit"
    );
    let latest = store.restore_state().await.unwrap().unwrap();
    assert_eq!(&latest, epochs.last().unwrap());
}

pub async fn concurrent_reports_of_every_expected_cell_lift_the_quarantine(
    store: &impl ClaimStore,
) {
    let names: Vec<String> = (0..CONCURRENT).map(|i| format!("cell-{i}")).collect();
    for name in &names {
        committed(
            store,
            creates(&cell(name), &[username(&format!("{name}-name"))]),
        )
        .await;
    }
    let marked = store.mark_restored(&mark("drill", &[])).await.unwrap();
    assert_eq!(marked.expected_cells.len(), CONCURRENT);
    let cells: Vec<CellId> = names.iter().map(|n| cell(n)).collect();
    let results = futures::future::join_all(
        cells
            .iter()
            .map(|c| store.report_verification_pass(c, marked.epoch)),
    )
    .await;
    let lifts = results
        .into_iter()
        .filter(|r| r.as_ref().expect("a report").lifted.is_some())
        .count();
    assert!(lifts >= 1, "the last report saw every other one");
    let state = store.restore_state().await.unwrap().unwrap();
    assert_eq!(state.reported.len(), CONCURRENT);
    let (lifted_at, reason) = state.lifted.expect("lifted by the reports");
    assert_eq!(reason, topology_claims::domain::restore::LIFTED_BY_REPORTS);
    assert!(state.reported.values().all(|at| *at <= lifted_at));
}

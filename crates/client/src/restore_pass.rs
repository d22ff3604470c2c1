//! The verifier's part after a restore of the claims store (`domain::restore`, decision 100).
//!
//! Every run first reads the store's latest restore (ListOutstandingLeases' `restore`). Leases of
//! the cell that were outstanding when the restore was marked are decided from the cell's
//! records ([`resolve_restored_leases`]): the reconciler leaves them alone, since the cell may
//! have committed them after the backup. Then, while the cell has not reported a pass in the
//! epoch, the run is a *restore pass*: it walks every table from the start (saved cursors are
//! ignored), comparing every record made before the mark however recent, and when it ends whole and
//! clean it reports itself (ReportVerificationPass); the last expected report lifts the
//! quarantine.
//!
//! Owns these calls; every rule is the domain's.

use std::collections::BTreeMap;

use crate::client::ClaimsClient;
use crate::source::ClaimSource;
use crate::verify_report::VerifyReport;
use topology_claims::domain::{
    decide_restored_lease, lease_predates_restore, CellId, ClaimKey, LeaseId, LeasesQuery,
    RestoreView, RestoredLeaseAction, TableName,
};
use topology_claims::error::ClaimsError;

/// Leases read per page while resolving.
const PAGE: usize = 500;

/// The store's latest restore as `cell` sees it (`None`: never restored, or a server that
/// predates restores).
pub(crate) async fn latest_restore(
    client: &ClaimsClient,
    cell: &CellId,
) -> Result<Option<RestoreView>, ClaimsError> {
    let page = client
        .list_outstanding_leases(&LeasesQuery::new(cell.clone(), None, 1))
        .await?;
    Ok(page.restore)
}

/// Commits or rolls back each of `cell`'s outstanding leases that predate `view`'s restore, as
/// `domain::decide_restored_lease` says from the records `source` holds now. A dry run counts.
pub(crate) async fn resolve_restored_leases<S: ClaimSource>(
    client: &ClaimsClient,
    source: &S,
    cell: &CellId,
    view: &RestoreView,
    dry_run: bool,
    report: &mut VerifyReport,
) -> Result<(), ClaimsError> {
    let mut after: Option<LeaseId> = None;
    loop {
        let page = client
            .list_outstanding_leases(&LeasesQuery::new(cell.clone(), after, PAGE))
            .await?;
        let predating: Vec<_> = page
            .leases
            .iter()
            .filter(|l| lease_predates_restore(l, Some(view)))
            .collect();
        let ids: Vec<LeaseId> = predating.iter().map(|l| l.lease_id).collect();
        // A lease whose local row is there committed locally: the reconciler commits it, and the
        // comparison corrects what the records no longer imply. Deciding it here too would race
        // the reconciler with another answer (decision 100, addendum).
        let recorded = if ids.is_empty() {
            Default::default()
        } else {
            source.leases_recorded(&ids).await?
        };
        for lease in predating {
            if recorded.contains(&lease.lease_id) {
                tracing::debug!(lease_id = %lease.lease_id, "a lease that predates the restore is recorded locally: left to the reconciler");
                continue;
            }
            // The keys each touched record holds now, read once per record.
            let mut held: BTreeMap<(TableName, i64), Vec<ClaimKey>> = BTreeMap::new();
            for (_, record) in lease.request.operations() {
                let at = (record.table_name.clone(), record.table_record_id);
                if let std::collections::btree_map::Entry::Vacant(entry) = held.entry(at) {
                    let (table, id) = (record.table_name.clone(), record.table_record_id);
                    let claims = source.claims_in_range(table, id, id + 1).await?;
                    entry.insert(claims.into_iter().map(|c| c.record.key).collect());
                }
            }
            let action = decide_restored_lease(lease, |_, record| {
                held.get(&(record.table_name.clone(), record.table_record_id))
                    .is_some_and(|keys| keys.contains(&record.key))
            });
            let lease_id = lease.lease_id;
            if dry_run {
                match action {
                    RestoredLeaseAction::Commit => report.restored_leases_committed += 1,
                    RestoredLeaseAction::RollBack => report.restored_leases_rolled_back += 1,
                }
                continue;
            }
            let ended = match action {
                RestoredLeaseAction::Commit => client.commit_update(cell, lease_id).await,
                RestoredLeaseAction::RollBack => client.rollback_update(cell, lease_id).await,
            };
            match (action, ended) {
                (RestoredLeaseAction::Commit, Ok(())) => {
                    report.restored_leases_committed += 1;
                    tracing::info!(%lease_id, "committed a lease that predates the restore: the cell's records hold it");
                }
                (RestoredLeaseAction::RollBack, Ok(())) => {
                    report.restored_leases_rolled_back += 1;
                    tracing::info!(%lease_id, "rolled back a lease that predates the restore: no record of the cell implies it");
                }
                // The reconciler ended it meanwhile (its local transaction said how).
                (
                    _,
                    Err(
                        ClaimsError::LeaseCommitted { .. }
                        | ClaimsError::LeaseRolledBack { .. }
                        | ClaimsError::LeaseNotFound { .. },
                    ),
                ) => {}
                (_, Err(error)) => {
                    report.restored_leases_failed += 1;
                    tracing::warn!(%lease_id, %error, "could not end a lease that predates the restore; the next run tries again");
                }
            }
        }
        match page.next_cursor {
            Some(cursor) => after = Some(cursor),
            None => return Ok(()),
        }
    }
}

/// Reports the restore pass of `view`'s epoch if the run was whole and clean; says why not
/// otherwise. Returns the expected cells still pending after the report.
pub(crate) async fn report_pass(
    client: &ClaimsClient,
    cell: &CellId,
    view: &RestoreView,
    report: &mut VerifyReport,
) -> Result<Option<u32>, ClaimsError> {
    let unclean =
        report.corrections_failed + report.restored_leases_failed + report.restore_unsettled;
    if !report.finished || unclean > 0 {
        tracing::warn!(
            epoch = view.epoch,
            finished = report.finished,
            failures = unclean,
            "restore pass not reported: it must walk every table and correct everything (see the failures above); the next run starts a restore pass again"
        );
        return Ok(None);
    }
    let (after, pending) = client.report_verification_pass(cell, view.epoch).await?;
    report.restore_reported = Some(view.epoch);
    tracing::info!(
        epoch = view.epoch,
        quarantined = after.quarantined,
        cells_pending = pending,
        "reported this cell's verification pass after the store's restore"
    );
    Ok(Some(pending))
}

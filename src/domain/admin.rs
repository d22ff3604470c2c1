//! The administrative decisions of the design's "Cell downtime" and "Cell decommissioning":
//! which leases a force rollback ends, whether a cell may be decommissioned now, and that a
//! decommissioned cell may begin nothing. Pure functions over what a store read; the stores
//! write what these say (see `ClaimStore::decommission_step`), and the admin service drives
//! them.
//!
//! Owns the rules. Must not do I/O or read a clock (the store's clock is an input).

use std::time::Duration;

use crate::domain::decide::lease_unrenewed_for;
use crate::domain::types::{CellId, Lease, LeaseId, Timestamp};
use crate::error::ClaimsError;

/// Default claims deleted per decommission step (one store transaction).
pub const DECOMMISSION_DEFAULT_BATCH: usize = 1_000;
/// Most claims one decommission step may delete: bounds the store transaction.
pub const DECOMMISSION_MAX_BATCH: usize = 10_000;

/// The outstanding leases of one cell, as the store's clock saw them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CellLeases {
    pub cell_id: CellId,
    /// Outstanding leases of the cell (never zero in a summary).
    pub outstanding: u64,
    /// `created_at` of the cell's oldest outstanding lease.
    pub oldest_created_at: Timestamp,
}

impl CellLeases {
    /// Age of the oldest outstanding lease at `server_time`.
    pub fn oldest_age(&self, server_time: Timestamp) -> Duration {
        server_time.saturating_since(self.oldest_created_at)
    }
}

/// Every cell that has outstanding leases (ordered by cell id), read in one store query: what the
/// lease gauges and the admin ListLeases are built from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseSummary {
    /// The store's clock when the summary was read.
    pub server_time: Timestamp,
    pub cells: Vec<CellLeases>,
}

impl LeaseSummary {
    /// Builds a summary from one row per cell (a store's `GROUP BY cell_id`), in any order: the
    /// cells are sorted here, so no store depends on its collation for the order.
    pub fn from_cells(server_time: Timestamp, mut cells: Vec<CellLeases>) -> Self {
        cells.sort_by(|a, b| a.cell_id.cmp(&b.cell_id));
        Self { server_time, cells }
    }

    /// Builds a summary from one row per lease `(cell, created_at)`, in any order.
    pub fn from_leases<'a>(
        server_time: Timestamp,
        leases: impl IntoIterator<Item = (&'a CellId, Timestamp)>,
    ) -> Self {
        let mut cells: std::collections::BTreeMap<&CellId, (u64, Timestamp)> =
            std::collections::BTreeMap::new();
        for (cell, created_at) in leases {
            let entry = cells.entry(cell).or_insert((0, created_at));
            entry.0 += 1;
            entry.1 = entry.1.min(created_at);
        }
        Self {
            server_time,
            cells: cells
                .into_iter()
                .map(|(cell_id, (outstanding, oldest_created_at))| CellLeases {
                    cell_id: cell_id.clone(),
                    outstanding,
                    oldest_created_at,
                })
                .collect(),
        }
    }
}

/// The leases a ForceRollback of `cell_id` ends: the cell's outstanding leases that have gone
/// unrenewed for at least `older_than` (`decide::lease_unrenewed_for`) at `server_time`. Each is
/// then ended through the same decision as RollbackUpdate (`decide_rollback`), conditional on
/// the same window judged again by the store's clock in the rollback's own transaction, so a
/// lease renewed since this selection is spared (`LeaseRenewed`); its outcome is remembered and
/// the cell's late CommitUpdate gets LEASE_ROLLED_BACK.
pub fn force_rollback_selection<'a>(
    cell_id: &CellId,
    leases: impl IntoIterator<Item = &'a Lease>,
    server_time: Timestamp,
    older_than: Duration,
) -> Vec<LeaseId> {
    leases
        .into_iter()
        .filter(|l| &l.cell_id == cell_id && lease_unrenewed_for(l, server_time, older_than))
        .map(|l| l.lease_id)
        .collect()
}

/// BeginUpdate of a decommissioned cell is refused (PERMISSION_DENIED `CELL_DECOMMISSIONED`).
pub fn check_not_decommissioned(cell_id: &CellId, decommissioned: bool) -> Result<(), ClaimsError> {
    if decommissioned {
        Err(ClaimsError::CellDecommissioned {
            cell_id: cell_id.clone(),
        })
    } else {
        Ok(())
    }
}

/// A bounded decommission step size: `0` means the default; larger than the maximum is refused.
pub fn decommission_batch(requested: usize) -> Result<usize, ClaimsError> {
    match requested {
        0 => Ok(DECOMMISSION_DEFAULT_BATCH),
        n if n > DECOMMISSION_MAX_BATCH => Err(ClaimsError::invalid(
            "batch_size",
            format!("at most {DECOMMISSION_MAX_BATCH} claims per step, got {n}"),
        )),
        n => Ok(n),
    }
}

/// What a decommission step found in the store before deciding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecommissionState {
    /// Outstanding leases of the cell.
    pub outstanding_leases: u64,
    /// Whether the cell is already recorded as decommissioned.
    pub decommissioned: bool,
}

/// What a decommission step must write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecommissionPlan {
    /// A dry run: count the cell's claims, write nothing.
    Count,
    /// Record the cell as decommissioned (when `mark`), then delete up to `limit` of its
    /// claims, all in the same store transaction. The mark comes first, so no BeginUpdate of
    /// the cell can start while its claims are being deleted.
    Delete { mark: bool, limit: usize },
}

/// Decides one decommission step. Refused (FAILED_PRECONDITION `CELL_HAS_OUTSTANDING_LEASES`)
/// while the cell has outstanding leases: they must end first (the cell's own commit or
/// rollback, or an admin ForceRollback), or their claims would be deleted under them. A dry
/// run is refused the same way, so it tells what the real run would.
pub fn decide_decommission(
    cell_id: &CellId,
    state: DecommissionState,
    dry_run: bool,
    batch: usize,
) -> Result<DecommissionPlan, ClaimsError> {
    if state.outstanding_leases > 0 {
        return Err(ClaimsError::CellHasOutstandingLeases {
            cell_id: cell_id.clone(),
            outstanding: state.outstanding_leases,
        });
    }
    if dry_run {
        return Ok(DecommissionPlan::Count);
    }
    Ok(DecommissionPlan::Delete {
        mark: !state.decommissioned,
        limit: batch.max(1),
    })
}

/// What one decommission step did (or, in a dry run, would do).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecommissionStep {
    pub cell_id: CellId,
    pub dry_run: bool,
    /// Whether the cell was recorded as decommissioned before this step.
    pub already_decommissioned: bool,
    /// Dry run: the claims the cell holds (what a full run deletes). Otherwise: the claims
    /// this step deleted.
    pub claims: u64,
    /// No claim of the cell is left (after this step; in a dry run, `claims == 0`).
    pub complete: bool,
}

impl DecommissionStep {
    /// The report of a step that ran `plan` and deleted (or, for `Count`, counted) `claims`.
    pub fn after(
        cell_id: &CellId,
        state: DecommissionState,
        plan: DecommissionPlan,
        claims: u64,
    ) -> Self {
        let complete = match plan {
            DecommissionPlan::Count => claims == 0,
            DecommissionPlan::Delete { limit, .. } => claims < limit as u64,
        };
        Self {
            cell_id: cell_id.clone(),
            dry_run: plan == DecommissionPlan::Count,
            already_decommissioned: state.decommissioned,
            claims,
            complete,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(name: &str) -> CellId {
        CellId::parse(name).unwrap()
    }

    #[test]
    fn decommission_is_refused_while_the_cell_has_outstanding_leases() {
        let state = DecommissionState {
            outstanding_leases: 2,
            decommissioned: false,
        };
        for dry_run in [false, true] {
            let error = decide_decommission(&cell("a"), state, dry_run, 10).unwrap_err();
            assert_eq!(error.reason(), "CELL_HAS_OUTSTANDING_LEASES");
        }
    }

    #[test]
    fn the_first_step_marks_the_cell_and_later_steps_only_delete() {
        let fresh = DecommissionState {
            outstanding_leases: 0,
            decommissioned: false,
        };
        assert_eq!(
            decide_decommission(&cell("a"), fresh, false, 10).unwrap(),
            DecommissionPlan::Delete {
                mark: true,
                limit: 10
            }
        );
        let marked = DecommissionState {
            decommissioned: true,
            ..fresh
        };
        assert_eq!(
            decide_decommission(&cell("a"), marked, false, 10).unwrap(),
            DecommissionPlan::Delete {
                mark: false,
                limit: 10
            }
        );
        assert_eq!(
            decide_decommission(&cell("a"), marked, true, 10).unwrap(),
            DecommissionPlan::Count
        );
    }

    #[test]
    fn a_step_that_deletes_less_than_its_limit_is_the_last() {
        let state = DecommissionState {
            outstanding_leases: 0,
            decommissioned: true,
        };
        let plan = DecommissionPlan::Delete {
            mark: false,
            limit: 10,
        };
        assert!(!DecommissionStep::after(&cell("a"), state, plan, 10).complete);
        assert!(DecommissionStep::after(&cell("a"), state, plan, 9).complete);
        assert!(DecommissionStep::after(&cell("a"), state, DecommissionPlan::Count, 0).complete);
        assert!(!DecommissionStep::after(&cell("a"), state, DecommissionPlan::Count, 1).complete);
    }

    #[test]
    fn a_decommissioned_cell_begins_nothing() {
        assert!(check_not_decommissioned(&cell("a"), false).is_ok());
        let error = check_not_decommissioned(&cell("a"), true).unwrap_err();
        assert_eq!(error.reason(), "CELL_DECOMMISSIONED");
    }

    #[test]
    fn batch_sizes_are_bounded() {
        assert_eq!(decommission_batch(0).unwrap(), DECOMMISSION_DEFAULT_BATCH);
        assert_eq!(decommission_batch(5).unwrap(), 5);
        assert!(decommission_batch(DECOMMISSION_MAX_BATCH + 1).is_err());
    }

    #[test]
    fn a_summary_counts_each_cell_and_keeps_its_oldest_lease() {
        let (a, b) = (cell("a"), cell("b"));
        let t = Timestamp::from_unix_micros;
        let summary = LeaseSummary::from_leases(t(100), [(&b, t(50)), (&a, t(30)), (&b, t(20))]);
        assert_eq!(summary.cells.len(), 2);
        assert_eq!(summary.cells[0].cell_id, a);
        assert_eq!(summary.cells[1].outstanding, 2);
        assert_eq!(summary.cells[1].oldest_created_at, t(20));
        assert_eq!(
            summary.cells[1].oldest_age(t(100)),
            Duration::from_micros(80)
        );
    }
}

//! The restore epochs of [`SqliteClaimStore`](crate::SqliteClaimStore) (`domain::restore`):
//! reading the latest epoch with its reports, and the three writes (mark, report, lift), each the
//! twin of its `domain::Tables` method. Every write runs inside the store's `BEGIN IMMEDIATE`, so
//! marks, reports and lifts are serialized with each other and with every other write: two marks
//! never number the same epoch, and of two last reports exactly one sees the other and lifts.
//!
//! Owns the `restore_epochs` / `restore_reports` rows and their encoding (`expected_cells` is
//! the cell ids joined with `'\n'`). Must not decide anything: that is `domain::restore`.

use std::collections::{BTreeMap, BTreeSet};

use rusqlite::{Connection, OptionalExtension};
use topology_claims::domain::{self, MarkRestored, RestoreEpoch};
use topology_claims::{CellId, ClaimsError, Timestamp};

use crate::error::StoreError;
use crate::rows::{self, corrupt};

/// Separates the cell ids of `restore_epochs.expected_cells` (a cell id never contains it).
const CELL_SEPARATOR: char = '\n';

/// Every cell with claims or outstanding leases. The claims' cells are a skip scan of
/// `claims_by_cell_table_record` (one index probe per distinct cell, not a scan of every claim);
/// outstanding leases are few, and `UNION` removes the duplicates.
const HOLDING_CELLS: &str = "\
WITH RECURSIVE claim_cells(cell_id) AS (
    SELECT (SELECT cell_id FROM claims ORDER BY cell_id LIMIT 1)
    UNION ALL
    SELECT (SELECT c.cell_id FROM claims AS c WHERE c.cell_id > claim_cells.cell_id
            ORDER BY c.cell_id LIMIT 1)
    FROM claim_cells WHERE claim_cells.cell_id IS NOT NULL)
SELECT cell_id FROM claim_cells WHERE cell_id IS NOT NULL
UNION
SELECT cell_id FROM leases_outstanding";

/// An epoch number as stored (INTEGER).
fn epoch_value(epoch: u64) -> Result<i64, StoreError> {
    i64::try_from(epoch).map_err(|_| {
        ClaimsError::internal(format!("restore epoch {epoch} exceeds SQLite INTEGER")).into()
    })
}

/// The cells of `restore_epochs.expected_cells`.
fn cells_text(cells: &BTreeSet<CellId>) -> String {
    let ids: Vec<&str> = cells.iter().map(CellId::as_str).collect();
    ids.join(&CELL_SEPARATOR.to_string())
}

/// A `restore_epochs` row as SQLite returns it, before validation.
struct EpochRow {
    epoch: i64,
    backup_time: i64,
    marked_at: i64,
    reason: String,
    expected_cells: String,
    lifted_at: Option<i64>,
    lift_reason: Option<String>,
}

impl EpochRow {
    fn into_epoch(
        self,
        reported: BTreeMap<CellId, Timestamp>,
    ) -> Result<RestoreEpoch, ClaimsError> {
        const T: &str = "restore_epochs";
        let epoch =
            u64::try_from(self.epoch).map_err(|_| corrupt(T, format!("epoch = {}", self.epoch)))?;
        let expected_cells = self
            .expected_cells
            .split(CELL_SEPARATOR)
            .filter(|cell| !cell.is_empty())
            .map(|cell| rows::cell_id(T, cell))
            .collect::<Result<BTreeSet<_>, _>>()?;
        let lifted = match (self.lifted_at, self.lift_reason) {
            (None, None) => None,
            (Some(at), Some(reason)) => Some((Timestamp::from_unix_micros(at), reason)),
            _ => {
                return Err(corrupt(
                    T,
                    format!("epoch {epoch}: lifted_at without lift_reason or the reverse"),
                ))
            }
        };
        Ok(RestoreEpoch {
            epoch,
            backup_time: Timestamp::from_unix_micros(self.backup_time),
            marked_at: Timestamp::from_unix_micros(self.marked_at),
            reason: self.reason,
            expected_cells,
            reported,
            lifted,
        })
    }
}

/// The latest epoch (the highest number) with its reports, or `None` if the store was never
/// marked restored. Two statements: the caller's transaction makes them one snapshot.
pub(crate) fn latest(conn: &Connection) -> Result<Option<RestoreEpoch>, StoreError> {
    let row = conn
        .prepare_cached(
            "SELECT epoch, backup_time, marked_at, reason, expected_cells, lifted_at, lift_reason \
             FROM restore_epochs ORDER BY epoch DESC LIMIT 1",
        )?
        .query_row([], |row| {
            Ok(EpochRow {
                epoch: row.get(0)?,
                backup_time: row.get(1)?,
                marked_at: row.get(2)?,
                reason: row.get(3)?,
                expected_cells: row.get(4)?,
                lifted_at: row.get(5)?,
                lift_reason: row.get(6)?,
            })
        })
        .optional()?;
    let Some(row) = row else {
        return Ok(None);
    };
    let reports = conn
        .prepare_cached("SELECT cell_id, reported_at FROM restore_reports WHERE epoch = ?1")?
        .query_map([row.epoch], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let reported = reports
        .into_iter()
        .map(|(cell, at)| {
            Ok((
                rows::cell_id("restore_reports", &cell)?,
                Timestamp::from_unix_micros(at),
            ))
        })
        .collect::<Result<BTreeMap<_, _>, ClaimsError>>()?;
    Ok(Some(row.into_epoch(reported)?))
}

/// Every cell that has claims or outstanding leases.
fn holding_cells(tx: &Connection) -> Result<BTreeSet<CellId>, StoreError> {
    let cells = tx
        .prepare_cached(HOLDING_CELLS)?
        .query_map([], |row| row.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let cells = cells
        .iter()
        .map(|cell| rows::cell_id("claims", cell))
        .collect::<Result<BTreeSet<_>, _>>()?;
    Ok(cells)
}

/// `admin mark-restored` (the twin of `Tables::mark_restored`).
pub(crate) fn mark(
    tx: &Connection,
    request: &MarkRestored,
    now: Timestamp,
) -> Result<RestoreEpoch, StoreError> {
    let previous = latest(tx)?;
    let holding = holding_cells(tx)?;
    let epoch = domain::decide_mark_restored(previous.as_ref(), request, holding, now)?;
    let lifted_at = epoch.lifted.as_ref().map(|(at, _)| at.as_unix_micros());
    let lift_reason = epoch.lifted.as_ref().map(|(_, reason)| reason.as_str());
    // A primary-key violation here means another writer got in between: retried.
    tx.prepare_cached(
        "INSERT INTO restore_epochs (epoch, backup_time, marked_at, reason, expected_cells, \
         lifted_at, lift_reason) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute((
        epoch_value(epoch.epoch)?,
        epoch.backup_time.as_unix_micros(),
        epoch.marked_at.as_unix_micros(),
        &epoch.reason,
        cells_text(&epoch.expected_cells),
        lifted_at,
        lift_reason,
    ))?;
    Ok(epoch)
}

/// Records the lift of `epoch` at `now`; the row must still be quarantined.
fn write_lift(tx: &Connection, epoch: u64, reason: &str, now: Timestamp) -> Result<(), StoreError> {
    let lifted = tx
        .prepare_cached(
            "UPDATE restore_epochs SET lifted_at = ?1, lift_reason = ?2 \
             WHERE epoch = ?3 AND lifted_at IS NULL",
        )?
        .execute((now.as_unix_micros(), reason, epoch_value(epoch)?))?;
    if lifted != 1 {
        return Err(StoreError::Conflict(format!(
            "restore epoch {epoch} was lifted or replaced inside its lift's transaction"
        )));
    }
    Ok(())
}

/// A cell's verification pass report (the twin of `Tables::report_verification_pass`).
pub(crate) fn report(
    tx: &Connection,
    cell_id: &CellId,
    epoch: u64,
    now: Timestamp,
) -> Result<RestoreEpoch, StoreError> {
    let current = latest(tx)?;
    let plan = domain::decide_report(current.as_ref(), cell_id, epoch)?;
    let mut state = current.expect("decide_report checked the epoch");
    if plan.record {
        // A primary-key violation here means another writer got in between: retried.
        tx.prepare_cached(
            "INSERT INTO restore_reports (epoch, cell_id, reported_at) VALUES (?1, ?2, ?3)",
        )?
        .execute((epoch_value(epoch)?, cell_id.as_str(), now.as_unix_micros()))?;
        state.reported.insert(cell_id.clone(), now);
    }
    if let Some(reason) = plan.lift {
        write_lift(tx, epoch, &reason, now)?;
        state.lifted = Some((now, reason));
    }
    Ok(state)
}

/// `admin lift-quarantine` (the twin of `Tables::lift_quarantine`).
pub(crate) fn lift(
    tx: &Connection,
    epoch: u64,
    reason: &str,
    now: Timestamp,
) -> Result<RestoreEpoch, StoreError> {
    let current = latest(tx)?;
    let lift = domain::decide_lift(current.as_ref(), epoch, reason)?;
    let mut state = current.expect("decide_lift checked the epoch");
    if lift {
        write_lift(tx, epoch, reason, now)?;
        state.lifted = Some((now, reason.to_owned()));
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_cells_round_trip_through_their_text() {
        let cells: BTreeSet<CellId> = ["a", "cell-b", "c_1"]
            .iter()
            .map(|c| CellId::parse(c).unwrap())
            .collect();
        let row = |expected_cells: String| EpochRow {
            epoch: 1,
            backup_time: 1,
            marked_at: 2,
            reason: "drill".into(),
            expected_cells,
            lifted_at: None,
            lift_reason: None,
        };
        let read = row(cells_text(&cells)).into_epoch(BTreeMap::new()).unwrap();
        assert_eq!(read.expected_cells, cells);
        let none = row(cells_text(&BTreeSet::new()))
            .into_epoch(BTreeMap::new())
            .unwrap();
        assert!(none.expected_cells.is_empty());
    }
}

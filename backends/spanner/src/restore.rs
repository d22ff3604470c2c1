//! Restore epochs (`topology_claims::domain::restore`) on Spanner: the `restore_epochs` and
//! `restore_reports` tables (migration `0005_restore_epochs`), their rows ↔ `RestoreEpoch`, and
//! the transactions of `ClaimStore::{restore_state, mark_restored, report_verification_pass,
//! lift_quarantine}` (the twins of `Tables::{mark_restored, report_verification_pass,
//! lift_quarantine}`).
//!
//! Every earlier epoch's row stays as history; the store's restore state is the row with the
//! highest epoch and its reports. Each write is one read-write transaction that first reads that
//! row and its reports with a query (which locks the range read, the gap above the latest epoch
//! included), so a concurrent mark, report or lift conflicts and one of them aborts and re-runs.
//! The clock is `CURRENT_TIMESTAMP()`, read after those rows, and written explicitly, so the
//! epoch returned is the epoch stored.
//!
//! Owns the restore tables' transaction shapes and encoding; must not decide anything about
//! restores (that is `domain::restore`).

use std::collections::{BTreeMap, BTreeSet};

use gcloud_googleapis::spanner::v1::Mutation;
use gcloud_spanner::mutation::{insert, update};
use gcloud_spanner::row::Row;
use gcloud_spanner::statement::Statement;
use gcloud_spanner::transaction::Transaction;
use topology_claims::codec::timestamp_to_pb;
use topology_claims::domain::{self, MarkRestored, RestoreEpoch};
use topology_claims::{CellId, ClaimsError, Timestamp};

use crate::error::{tx_error, TxError};
use crate::rows::{cell_id, column, corrupt, timestamp};
use crate::store::SpannerClaimStore;
use crate::transaction::WriteTx;

pub(crate) const RESTORE_EPOCHS: &str = "restore_epochs";
pub(crate) const RESTORE_REPORTS: &str = "restore_reports";

const EPOCH_COLUMNS: [&str; 7] = [
    "epoch",
    "backup_time",
    "marked_at",
    "reason",
    "expected_cells",
    "lifted_at",
    "lift_reason",
];
const REPORT_COLUMNS: [&str; 3] = ["epoch", "cell_id", "reported_at"];

/// Separates the cell ids of `expected_cells` (a cell id never contains it).
const CELL_SEPARATOR: char = '\n';

/// One of the restore writes of the port.
#[derive(Clone, Copy, Debug)]
enum RestoreWrite<'a> {
    Mark(&'a MarkRestored),
    Report { cell: &'a CellId, epoch: u64 },
    Lift { epoch: u64, reason: &'a str },
}

impl RestoreWrite<'_> {
    fn what(self) -> &'static str {
        match self {
            Self::Mark(_) => "MarkRestored",
            Self::Report { .. } => "ReportVerificationPass",
            Self::Lift { .. } => "LiftQuarantine",
        }
    }
}

impl SpannerClaimStore {
    /// `ClaimStore::restore_state`: the latest epoch, read in one strong snapshot.
    pub(crate) async fn read_restore_state(&self) -> Result<Option<RestoreEpoch>, ClaimsError> {
        let context = "reading the restore state";
        let (mut tx, _) = self.snapshot(context).await?;
        self.latest_restore(&mut tx)
            .await
            .map_err(|e| tx_error(context, e))
    }

    /// `ClaimStore::mark_restored`.
    pub(crate) async fn write_mark(
        &self,
        request: &MarkRestored,
    ) -> Result<RestoreEpoch, ClaimsError> {
        self.write_restore(RestoreWrite::Mark(request)).await
    }

    /// `ClaimStore::report_verification_pass`.
    pub(crate) async fn write_report(
        &self,
        cell: &CellId,
        epoch: u64,
    ) -> Result<RestoreEpoch, ClaimsError> {
        self.write_restore(RestoreWrite::Report { cell, epoch })
            .await
    }

    /// `ClaimStore::lift_quarantine`.
    pub(crate) async fn write_lift(
        &self,
        epoch: u64,
        reason: &str,
    ) -> Result<RestoreEpoch, ClaimsError> {
        self.write_restore(RestoreWrite::Lift { epoch, reason })
            .await
    }

    /// The three restore writes: one read-write transaction, re-run from its first read when
    /// Spanner aborts it.
    async fn write_restore(&self, write: RestoreWrite<'_>) -> Result<RestoreEpoch, ClaimsError> {
        let mut attempts = self.attempts(write.what());
        let (answer, _) = loop {
            let Some(mut tx) = attempts.begin(&self.client).await? else {
                continue;
            };
            let result = match write {
                RestoreWrite::Mark(request) => self.mark_attempt(&mut tx, request).await,
                RestoreWrite::Report { cell, epoch } => {
                    self.report_attempt(&mut tx, cell, epoch).await
                }
                RestoreWrite::Lift { epoch, reason } => {
                    self.lift_attempt(&mut tx, epoch, reason).await
                }
            };
            if let Some(done) = attempts.end(&mut tx, result).await? {
                break done;
            }
        };
        answer
    }

    /// One attempt of a mark: the latest epoch, every cell with claims or outstanding leases
    /// (both tables' cell indexes; the scan locks them, so no claim or lease of a new cell
    /// commits in between), then the clock, `domain::decide_mark_restored`, and the new row.
    async fn mark_attempt(
        &self,
        tx: &mut WriteTx,
        request: &MarkRestored,
    ) -> Result<Result<RestoreEpoch, ClaimsError>, TxError> {
        let previous = self.latest_restore(tx).await?;
        let stmt = Statement::new(
            "SELECT DISTINCT cell_id FROM claims@{FORCE_INDEX=claims_by_cell}
             UNION DISTINCT
             SELECT DISTINCT cell_id FROM leases_outstanding@{FORCE_INDEX=leases_by_cell}",
        );
        let holding: BTreeSet<CellId> = self
            .query_in(tx, stmt, |row| cell_id(&column::<String>(row, "cell_id")?))
            .await?
            .into_iter()
            .collect();
        let now = self.clock_in(tx).await?;
        match domain::decide_mark_restored(previous.as_ref(), request, holding, now) {
            Ok(epoch) => {
                tx.buffer_write(vec![insert_epoch(&epoch)?, crate::watch::fence_watchers()]);
                Ok(Ok(epoch))
            }
            Err(refusal) => Ok(Err(refusal)),
        }
    }

    /// One attempt of a report: the latest epoch with its reports, `domain::decide_report`,
    /// then (at the clock, read only when something is written) the report and the lift.
    async fn report_attempt(
        &self,
        tx: &mut WriteTx,
        cell: &CellId,
        epoch: u64,
    ) -> Result<Result<RestoreEpoch, ClaimsError>, TxError> {
        let mut current = self.latest_restore(tx).await?;
        let plan = match domain::decide_report(current.as_ref(), cell, epoch) {
            Ok(plan) => plan,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let mut state = current.take().expect("decide_report checked the epoch");
        if !plan.record && plan.lift.is_none() {
            return Ok(Ok(state));
        }
        let now = self.clock_in(tx).await?;
        let mut mutations = Vec::with_capacity(2);
        if plan.record {
            mutations.push(insert_report(state.epoch, cell, now)?);
            state.reported.insert(cell.clone(), now);
        }
        if let Some(reason) = plan.lift {
            mutations.push(lift_epoch(state.epoch, now, &reason)?);
            state.lifted = Some((now, reason));
        }
        tx.buffer_write(mutations);
        Ok(Ok(state))
    }

    /// One attempt of an operator's lift: the latest epoch, `domain::decide_lift`, then (at the
    /// clock) the lift, unless the epoch was lifted already.
    async fn lift_attempt(
        &self,
        tx: &mut WriteTx,
        epoch: u64,
        reason: &str,
    ) -> Result<Result<RestoreEpoch, ClaimsError>, TxError> {
        let mut current = self.latest_restore(tx).await?;
        let lift = match domain::decide_lift(current.as_ref(), epoch, reason) {
            Ok(lift) => lift,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let mut state = current.take().expect("decide_lift checked the epoch");
        if lift {
            let now = self.clock_in(tx).await?;
            tx.buffer_write(vec![lift_epoch(state.epoch, now, reason)?]);
            state.lifted = Some((now, reason.to_owned()));
        }
        Ok(Ok(state))
    }

    /// The row with the highest epoch and its reports (two queries in `tx`); `None` if the
    /// store was never marked restored.
    async fn latest_restore(&self, tx: &mut Transaction) -> Result<Option<RestoreEpoch>, TxError> {
        let stmt = Statement::new(format!(
            "SELECT {} FROM {RESTORE_EPOCHS} ORDER BY epoch DESC LIMIT 1",
            EPOCH_COLUMNS.join(", ")
        ));
        let Some(mut state) = self.query_in(tx, stmt, epoch_from_row).await?.pop() else {
            return Ok(None);
        };
        let mut stmt = Statement::new(format!(
            "SELECT cell_id, reported_at FROM {RESTORE_REPORTS} WHERE epoch = @epoch"
        ));
        stmt.add_param("epoch", &epoch_number(state.epoch)?);
        let reports = self
            .query_in(tx, stmt, |row| {
                Ok((
                    cell_id(&column::<String>(row, "cell_id")?)?,
                    timestamp(row, "reported_at")?,
                ))
            })
            .await?;
        state.reported = reports.into_iter().collect();
        Ok(Some(state))
    }
}

/// An epoch number as stored (INT64).
fn epoch_number(epoch: u64) -> Result<i64, ClaimsError> {
    i64::try_from(epoch)
        .map_err(|_| ClaimsError::internal(format!("restore epoch {epoch} exceeds INT64")))
}

/// `expected_cells` as stored: the ids joined with [`CELL_SEPARATOR`], empty for none.
fn encode_cells(cells: &BTreeSet<CellId>) -> String {
    let ids: Vec<&str> = cells.iter().map(CellId::as_str).collect();
    ids.join(&CELL_SEPARATOR.to_string())
}

fn decode_cells(text: &str) -> Result<BTreeSet<CellId>, ClaimsError> {
    if text.is_empty() {
        return Ok(BTreeSet::new());
    }
    text.split(CELL_SEPARATOR).map(cell_id).collect()
}

/// A `restore_epochs` row read with [`EPOCH_COLUMNS`] (without its reports).
fn epoch_from_row(row: &Row) -> Result<RestoreEpoch, ClaimsError> {
    let epoch: i64 = column(row, "epoch")?;
    let lifted_at: Option<prost_types::Timestamp> = column(row, "lifted_at")?;
    let lift_reason: Option<String> = column(row, "lift_reason")?;
    let lifted = match (lifted_at, lift_reason) {
        (Some(at), Some(reason)) => Some((topology_claims::codec::timestamp_from_pb(&at), reason)),
        (None, None) => None,
        _ => {
            return Err(corrupt(
                "restore epoch",
                format!("epoch {epoch} has only one of lifted_at and lift_reason"),
            ))
        }
    };
    Ok(RestoreEpoch {
        epoch: u64::try_from(epoch).map_err(|e| corrupt("restore epoch", e))?,
        backup_time: timestamp(row, "backup_time")?,
        marked_at: timestamp(row, "marked_at")?,
        reason: column(row, "reason")?,
        expected_cells: decode_cells(&column::<String>(row, "expected_cells")?)?,
        reported: BTreeMap::new(),
        lifted,
    })
}

/// A new epoch's row. `insert`: a row of that epoch appearing meanwhile fails the commit.
fn insert_epoch(epoch: &RestoreEpoch) -> Result<Mutation, ClaimsError> {
    let (lifted_at, lift_reason) = match &epoch.lifted {
        Some((at, reason)) => (Some(timestamp_to_pb(*at)), Some(reason.clone())),
        None => (None, None),
    };
    Ok(insert(
        RESTORE_EPOCHS,
        &EPOCH_COLUMNS,
        &[
            &epoch_number(epoch.epoch)?,
            &timestamp_to_pb(epoch.backup_time),
            &timestamp_to_pb(epoch.marked_at),
            &epoch.reason,
            &encode_cells(&epoch.expected_cells),
            &lifted_at,
            &lift_reason,
        ],
    ))
}

/// A cell's report of a whole verification pass in `epoch`.
fn insert_report(epoch: u64, cell: &CellId, at: Timestamp) -> Result<Mutation, ClaimsError> {
    Ok(insert(
        RESTORE_REPORTS,
        &REPORT_COLUMNS,
        &[&epoch_number(epoch)?, &cell.as_str(), &timestamp_to_pb(at)],
    ))
}

/// The lift of `epoch`'s quarantine. `update`: fails the commit if the row is gone.
fn lift_epoch(epoch: u64, at: Timestamp, reason: &str) -> Result<Mutation, ClaimsError> {
    Ok(update(
        RESTORE_EPOCHS,
        &["epoch", "lifted_at", "lift_reason"],
        &[&epoch_number(epoch)?, &timestamp_to_pb(at), &reason],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use topology_claims_testkit::fixtures::cell;

    #[test]
    fn expected_cells_round_trip_through_their_column() {
        for cells in [
            BTreeSet::new(),
            [cell("cell-a")].into(),
            [cell("cell-a"), cell("b.2"), cell("c_3")].into(),
        ] {
            assert_eq!(decode_cells(&encode_cells(&cells)).unwrap(), cells);
        }
        assert_eq!(encode_cells(&[cell("a"), cell("b")].into()), "a\nb");
        assert!(decode_cells("a\n\nb").is_err(), "an empty id is corrupt");
    }
}

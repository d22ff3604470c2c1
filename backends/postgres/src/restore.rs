//! The restore epochs of [`PostgresClaimStore`] (`domain::restore`): reading the latest epoch
//! with its reports, and the three writes (mark, report, lift), each the twin of its
//! `domain::Tables` method and of the same shape as every other transaction: lock, read, ask the
//! domain, write its decision.
//!
//! ## Why a restore lock
//! Under READ COMMITTED two marks could both read epoch N and both insert N + 1 (the primary key
//! would make one retry, but only after both read the cells), and two reports of the last two
//! pending cells could each see the other pending, so that neither lifts the quarantine (their
//! inserts touch different rows: nothing conflicts). `SELECT … FOR UPDATE` of the latest epoch
//! cannot help the first mark, which has no row to lock. Every mark, report and lift therefore
//! first takes `pg_advisory_xact_lock(RESTORE_LOCK_CLASS, hashtext(current_schema()))`, one lock
//! per store: they run one at a time (they are rare: one per restore, operator command, and cell
//! per restore), and the statement after the lock sees every earlier one's commit. The store's
//! clock is `statement_timestamp()` of that read, so a lock wait does not age it and epochs,
//! reports and lifts are stamped in commit order. These transactions take no other lock, and
//! read `claims` and `leases` without locking rows, so they never wait on a claim transaction.
//!
//! ## Round trips
//! A mark, report or lift is two flights (`BEGIN`, lock, clock + state (+ the holding cells) ·
//! writes, `COMMIT`); a refused one, or a report or lift with nothing to write, one (`ROLLBACK`
//! is sent without waiting). `restore_state` is one statement.
//!
//! Owns these transactions' shapes; must not decide anything itself (that is `domain`).

use std::collections::BTreeSet;
use std::time::SystemTime;

use tokio_postgres::Statement;
use topology_claims::domain::{self, MarkRestored, RestoreEpoch};
use topology_claims::{CellId, ClaimsError, Timestamp};

use crate::error::Failure;
use crate::rows;
use crate::session::Session;
use crate::sql;
use crate::store::PostgresClaimStore;

/// An epoch number as stored (`bigint`).
fn epoch_value(epoch: u64) -> Result<i64, Failure> {
    i64::try_from(epoch).map_err(|_| {
        Failure::Final(ClaimsError::internal(format!(
            "restore epoch {epoch} exceeds a PostgreSQL bigint"
        )))
    })
}

/// What a restore transaction read under the restore lock.
struct Locked {
    /// The store's clock, read after the lock was granted.
    now: Timestamp,
    current: Option<RestoreEpoch>,
    /// The cells holding claims or outstanding leases (a mark only; empty otherwise).
    holding: BTreeSet<CellId>,
}

/// What a report or a lift writes (`domain::ReportPlan`, `domain::decide_lift`).
struct EpochWrites {
    /// Record this cell's report at the store's clock.
    report: Option<CellId>,
    /// Lift the quarantine at the store's clock, with this reason.
    lift: Option<String>,
}

impl PostgresClaimStore {
    /// The latest epoch with its reports: one statement, one snapshot.
    pub(crate) async fn restore_state_attempt(&self) -> Result<Option<RestoreEpoch>, Failure> {
        let session = self.shared.session().await?;
        let [state] = session.prepare([sql::SELECT_RESTORE_STATE]).await?;
        let client = session.client()?;
        let state_rows = client.query(&state, &[]).await?;
        session.round_trip();
        Ok(rows::restore_state(&state_rows)?.1)
    }

    /// Opens a restore transaction on `session` in one flight: `BEGIN`, the restore lock
    /// (`lock`), then the clock and the latest epoch (`state`) and, for a mark, the cells
    /// holding claims or leases (`holding`).
    async fn locked_restore_state(
        session: &mut Session<'_>,
        lock: &Statement,
        state: &Statement,
        holding: Option<&Statement>,
    ) -> Result<Locked, Failure> {
        let begin = session.begin_transaction();
        let client = session.client()?;
        let (_, _, state_rows, holding_rows) = tokio::try_join!(
            biased;
            client.batch_execute(begin),
            async { client.execute(lock, &[&sql::RESTORE_LOCK_CLASS]).await },
            async { client.query(state, &[]).await },
            async {
                match holding {
                    Some(holding) => client.query(holding, &[]).await,
                    None => Ok(Vec::new()),
                }
            },
        )?;
        session.round_trip();
        let (now, current) = rows::restore_state(&state_rows)?;
        Ok(Locked {
            now,
            current,
            holding: rows::cells(&holding_rows)?,
        })
    }

    /// `admin mark-restored` (the twin of `Tables::mark_restored`).
    pub(crate) async fn mark_restored_attempt(
        &self,
        request: &MarkRestored,
    ) -> Result<RestoreEpoch, Failure> {
        let mut session = self.shared.session().await?;
        let [lock, state, cells, insert] = session
            .prepare([
                sql::LOCK_RESTORE,
                sql::SELECT_RESTORE_STATE,
                sql::SELECT_HOLDING_CELLS,
                sql::INSERT_RESTORE_EPOCH,
            ])
            .await?;
        // Flight 1: the restore lock, then the clock, the latest epoch and the holding cells.
        let Locked {
            now,
            current,
            holding,
        } = Self::locked_restore_state(&mut session, &lock, &state, Some(&cells)).await?;
        let epoch = domain::decide_mark_restored(current.as_ref(), request, holding, now)?;
        let number = epoch_value(epoch.epoch)?;
        let backup_time = rows::system_time(epoch.backup_time);
        let marked_at = rows::system_time(epoch.marked_at);
        let expected = rows::cells_text(&epoch.expected_cells);
        let lifted_at: Option<SystemTime> =
            epoch.lifted.as_ref().map(|(at, _)| rows::system_time(*at));
        let lift_reason: Option<&str> = epoch.lifted.as_ref().map(|(_, r)| r.as_str());
        let client = session.client()?;
        // Flight 2: the new epoch, and COMMIT.
        tokio::try_join!(
            biased;
            async {
                client
                    .execute(
                        &insert,
                        &[
                            &number, &backup_time, &marked_at, &epoch.reason, &expected,
                            &lifted_at, &lift_reason,
                        ],
                    )
                    .await
            },
            client.batch_execute(sql::COMMIT),
        )?;
        session.round_trip();
        session.committed();
        Ok(epoch)
    }

    /// A cell's verification pass report (the twin of `Tables::report_verification_pass`).
    pub(crate) async fn report_attempt(
        &self,
        cell_id: &CellId,
        epoch: u64,
    ) -> Result<RestoreEpoch, Failure> {
        self.epoch_write_attempt(epoch, |current| {
            let plan = domain::decide_report(current, cell_id, epoch)?;
            Ok(EpochWrites {
                report: plan.record.then(|| cell_id.clone()),
                lift: plan.lift,
            })
        })
        .await
    }

    /// `admin lift-quarantine` (the twin of `Tables::lift_quarantine`).
    pub(crate) async fn lift_attempt(
        &self,
        epoch: u64,
        reason: &str,
    ) -> Result<RestoreEpoch, Failure> {
        self.epoch_write_attempt(epoch, |current| {
            let lift = domain::decide_lift(current, epoch, reason)?;
            Ok(EpochWrites {
                report: None,
                lift: lift.then(|| reason.to_owned()),
            })
        })
        .await
    }

    /// A report or a lift of `epoch`: `decide` is asked with the latest epoch read under the
    /// restore lock (and refuses any other epoch), and its writes are sent with `COMMIT`.
    /// Returns the epoch as written.
    async fn epoch_write_attempt(
        &self,
        epoch: u64,
        decide: impl FnOnce(Option<&RestoreEpoch>) -> Result<EpochWrites, ClaimsError>,
    ) -> Result<RestoreEpoch, Failure> {
        let mut session = self.shared.session().await?;
        let [lock, state, insert, lift] = session
            .prepare([
                sql::LOCK_RESTORE,
                sql::SELECT_RESTORE_STATE,
                sql::INSERT_RESTORE_REPORT,
                sql::LIFT_RESTORE_QUARANTINE,
            ])
            .await?;
        let Locked { now, current, .. } =
            Self::locked_restore_state(&mut session, &lock, &state, None).await?;
        let writes = decide(current.as_ref())?;
        let mut written = current.expect("the decision checked the epoch");
        if writes.report.is_none() && writes.lift.is_none() {
            // Nothing to write: the guard rolls the transaction back without waiting.
            return Ok(written);
        }
        let number = epoch_value(epoch)?;
        let at = rows::system_time(now);
        let client = session.client()?;
        // Flight 2: the report, the lift, and COMMIT.
        tokio::try_join!(
            biased;
            async {
                let Some(cell_id) = &writes.report else {
                    return Ok(0);
                };
                client.execute(&insert, &[&number, &cell_id.as_str(), &at]).await
            },
            async {
                let Some(reason) = writes.lift.as_deref() else {
                    return Ok(0);
                };
                client.execute(&lift, &[&number, &at, &reason]).await
            },
            client.batch_execute(sql::COMMIT),
        )?;
        session.round_trip();
        session.committed();
        if let Some(cell_id) = writes.report {
            written.reported.insert(cell_id, now);
        }
        if let Some(reason) = writes.lift {
            written.lifted = Some((now, reason));
        }
        Ok(written)
    }
}

//! The administrative transactions of [`PostgresClaimStore`]: a decommission step (under the
//! exclusive cell lock, module docs of `store.rs`) and the verification slots (under the slot
//! lock). Same shape as every other transaction: lock, read, ask the domain, write its decision.
//!
//! Owns these transactions' shapes; must not decide anything itself (that is `domain`).

use topology_claims::domain::{
    self, DecommissionPlan, DecommissionState, DecommissionStep, SlotGrant, SlotHolder, SlotLimit,
    SlotRow,
};
use topology_claims::CellId;

use crate::error::Failure;
use crate::locks::{AdvisoryLocks, CellMode};
use crate::rows;
use crate::sql;
use crate::store::{internal, PostgresClaimStore};

impl PostgresClaimStore {
    /// One decommission step (the twin of `Tables::decommission_step`).
    pub(crate) async fn decommission_attempt(
        &self,
        cell_id: &CellId,
        batch: usize,
        dry_run: bool,
    ) -> Result<DecommissionStep, Failure> {
        let mut session = self.shared.session().await?;
        let [lock, count_leases, decommissioned, count_claims, mark_cell, delete_claims] = session
            .prepare([
                sql::LOCK_ADVISORY,
                sql::COUNT_LEASES_OF_CELL,
                sql::CELL_DECOMMISSIONED,
                sql::COUNT_CLAIMS_OF_CELL,
                sql::MARK_DECOMMISSIONED,
                sql::DELETE_CLAIMS_OF_CELL,
            ])
            .await?;
        let cell = cell_id.as_str();
        let locks = AdvisoryLocks::of([], [], [cell_id], CellMode::Exclusive);
        let begin = session.begin_transaction();
        let client = session.client()?;
        // Flight 1: the exclusive cell lock before the lease count (see "why a cell lock").
        let (_, _, leases_row, decommissioned_row) = tokio::try_join!(
            biased;
            client.batch_execute(begin),
            async { client.execute(&lock, &locks.params()).await },
            async { client.query_one(&count_leases, &[&cell]).await },
            async { client.query_one(&decommissioned, &[&cell]).await },
        )?;
        session.round_trip();
        let state = DecommissionState {
            outstanding_leases: rows::count(&leases_row)?,
            decommissioned: decommissioned_row.try_get(0).map_err(internal)?,
        };
        let plan = domain::decide_decommission(cell_id, state, dry_run, batch)?;
        // Flight 2: what the plan says, and COMMIT.
        let claims = match plan {
            DecommissionPlan::Count => {
                let (count_row, _) = tokio::try_join!(
                    biased;
                    async { client.query_one(&count_claims, &[&cell]).await },
                    client.batch_execute(sql::COMMIT),
                )?;
                rows::count(&count_row)?
            }
            DecommissionPlan::Delete { mark, limit } => {
                let limit = i64::try_from(limit).unwrap_or(i64::MAX);
                let (_, deleted, _) = tokio::try_join!(
                    biased;
                    async {
                        if !mark {
                            return Ok(0);
                        }
                        client.execute(&mark_cell, &[&cell]).await
                    },
                    async { client.execute(&delete_claims, &[&cell, &limit]).await },
                    client.batch_execute(sql::COMMIT),
                )?;
                deleted
            }
        };
        session.round_trip();
        session.committed();
        Ok(DecommissionStep::after(cell_id, state, plan, claims))
    }

    /// One slot acquire (the twin of `Tables::acquire_verification_slot`).
    pub(crate) async fn acquire_slot_attempt(
        &self,
        holder: &SlotHolder,
        limit: SlotLimit,
    ) -> Result<SlotGrant, Failure> {
        let mut session = self.shared.session().await?;
        let [lock, select, delete, upsert] = session
            .prepare([
                sql::LOCK_SLOTS,
                sql::SELECT_SLOTS,
                sql::DELETE_SLOTS,
                sql::UPSERT_SLOT,
            ])
            .await?;
        let begin = session.begin_transaction();
        let client = session.client()?;
        // Flight 1: the slot lock, then the clock and every row (see "why a slot lock").
        let (_, _, slot_rows) = tokio::try_join!(
            biased;
            client.batch_execute(begin),
            async { client.execute(&lock, &[&sql::SLOT_LOCK_CLASS]).await },
            async { client.query(&select, &[]).await },
        )?;
        session.round_trip();
        let (now, rows) = rows::slots(&slot_rows)?;
        let plan = domain::decide_acquire(&rows, holder, limit, now)?;
        let cells: Vec<&str> = plan.expired.iter().map(|h| h.cell_id.as_str()).collect();
        let names: Vec<&str> = plan.expired.iter().map(|h| h.holder.as_str()).collect();
        let expires_at = rows::system_time(plan.grant.expires_at);
        // Flight 2: what the plan says, and COMMIT.
        tokio::try_join!(
            biased;
            async {
                if cells.is_empty() {
                    return Ok(0);
                }
                client.execute(&delete, &[&cells, &names]).await
            },
            async {
                client
                    .execute(
                        &upsert,
                        &[&holder.cell_id.as_str(), &holder.holder.as_str(), &expires_at],
                    )
                    .await
            },
            client.batch_execute(sql::COMMIT),
        )?;
        session.round_trip();
        session.committed();
        Ok(plan.grant)
    }

    pub(crate) async fn release_slot_attempt(&self, holder: &SlotHolder) -> Result<bool, Failure> {
        let session = self.shared.session().await?;
        let [release] = session.prepare([sql::RELEASE_SLOT]).await?;
        let client = session.client()?;
        let deleted = client
            .query_opt(
                &release,
                &[&holder.cell_id.as_str(), &holder.holder.as_str()],
            )
            .await?;
        session.round_trip();
        let row = match deleted {
            Some(row) => Some(SlotRow {
                holder: holder.clone(),
                expires_at: rows::timestamp(row.try_get(0).map_err(internal)?),
            }),
            None => None,
        };
        // The key is the holder: the row deleted (if any) is the holder's own.
        Ok(domain::decide_release(row.as_ref(), holder))
    }
}

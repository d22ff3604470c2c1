//! Collecting lease outcomes past their retention: candidates found through the sharded
//! `lease_outcomes_by_decided_at` index in a read-only snapshot, then re-read under lock and
//! deleted in batches of `COLLECT_BATCH`, as the domain decides.
//!
//! Owns the collection's transaction shape; must not decide which outcomes expire (`domain`).

use std::time::Duration;

use gcloud_spanner::key::Key;
use gcloud_spanner::statement::Statement;
use topology_claims::domain;
use topology_claims::{ClaimsError, LeaseId, Timestamp};

use crate::error::TxError;
use crate::rows::{self, OUTCOMES, OUTCOME_COLUMNS};
use crate::schema::OUTCOME_SHARDS;
use crate::store::{SpannerClaimStore, SPANNER_MIN_TIMESTAMP};
use crate::transaction::WriteTx;

/// Outcomes deleted per transaction (far below Spanner's mutation limit).
const COLLECT_BATCH: usize = 1000;

impl SpannerClaimStore {
    /// Deletes every outcome past `retention`, batch by batch; returns how many.
    pub(crate) async fn collect_expired_outcomes(
        &self,
        retention: Duration,
    ) -> Result<u64, ClaimsError> {
        let mut total = 0;
        loop {
            let (candidates, now) = self.expired_outcomes(retention).await?;
            if candidates.is_empty() {
                return Ok(total);
            }
            let mut attempts = self.attempts("collecting lease outcomes");
            let (deleted, _) = loop {
                let Some(mut tx) = attempts.begin(&self.client).await? else {
                    continue;
                };
                let result = self
                    .collect_attempt(&mut tx, &candidates, now, retention)
                    .await;
                if let Some(done) = attempts.end(&mut tx, result).await? {
                    break done;
                }
            };
            total += deleted;
            // A full batch of which nothing expired (a clock step on the store?) would repeat.
            if candidates.len() < COLLECT_BATCH || deleted == 0 {
                return Ok(total);
            }
        }
    }

    /// One attempt of deleting candidate outcomes: re-read them under lock and delete the ones
    /// the domain says are past retention. Returns how many were deleted.
    async fn collect_attempt(
        &self,
        tx: &mut WriteTx,
        candidates: &[LeaseId],
        now: Timestamp,
        retention: Duration,
    ) -> Result<u64, TxError> {
        let keys: Vec<Key> = candidates.iter().map(|id| rows::lease_key(*id)).collect();
        let outcomes = self
            .read_keys(tx, OUTCOMES, &OUTCOME_COLUMNS, keys, rows::outcome_from_row)
            .await?;
        let mut expired = Vec::new();
        for outcome in outcomes {
            if domain::outcome_expired(outcome.decided_at, now, retention) {
                expired.push(rows::lease_key(outcome.lease_id));
            }
        }
        let count = expired.len() as u64;
        if !expired.is_empty() {
            tx.buffer_write(vec![rows::delete_outcomes(expired)]);
        }
        Ok(count)
    }

    /// Up to `COLLECT_BATCH` outcomes decided before `now - retention`, found through the
    /// sharded `lease_outcomes_by_decided_at` index in a read-only snapshot (no locks).
    async fn expired_outcomes(
        &self,
        retention: Duration,
    ) -> Result<(Vec<LeaseId>, Timestamp), ClaimsError> {
        let context = "finding expired lease outcomes";
        let (mut tx, now) = self.snapshot(context).await?;
        let cutoff = now.saturating_sub(retention);
        if cutoff <= SPANNER_MIN_TIMESTAMP {
            // Nothing was decided before the first representable timestamp.
            return Ok((Vec::new(), now));
        }
        let mut stmt = Statement::new(
            "SELECT lease_id, decided_at FROM lease_outcomes@{FORCE_INDEX=lease_outcomes_by_decided_at}
             WHERE decided_shard IN UNNEST(@shards) AND decided_at < @cutoff
             LIMIT @limit",
        );
        let shards: Vec<i64> = (0..OUTCOME_SHARDS).collect();
        stmt.add_param("shards", &shards);
        stmt.add_param("cutoff", &topology_claims::codec::timestamp_to_pb(cutoff));
        stmt.add_param("limit", &(COLLECT_BATCH as i64));
        let candidates = self
            .query_all(&mut tx, stmt, context, |row| {
                let id: String = row
                    .column_by_name("lease_id")
                    .map_err(|e| ClaimsError::internal(format!("{context}: {e}")))?;
                LeaseId::parse(&id).map_err(|e| ClaimsError::internal(format!("{context}: {e}")))
            })
            .await?;
        Ok((candidates, now))
    }
}

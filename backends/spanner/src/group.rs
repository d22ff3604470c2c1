//! One group of BeginUpdate / CommitUpdate / RollbackUpdate calls (`ClaimStore::run_group`,
//! the combiner's) as one read-write transaction: at most four multi-key reads,
//! `domain::decide_group`, the net mutations, one commit.
//!
//! Owns the group transaction's shape; must not decide protocol questions (that is `domain`).

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use topology_claims::domain::{
    self, GroupAnswer, GroupDecision, GroupOp, GroupReads, GroupResults, GroupSnapshot,
};
use topology_claims::{ClaimKey, ClaimsError, LeaseId, Timestamp};

use crate::error::TxError;
use crate::rows::{self, DECOMMISSIONED, LEASES, LEASE_COLUMNS, OUTCOMES, OUTCOME_COLUMNS};
use crate::store::{SpannerClaimStore, GROUP_MAX_ROWS, SPANNER_MIN_TIMESTAMP};
use crate::transaction::WriteTx;

impl SpannerClaimStore {
    /// `ClaimStore::run_group`: one read-write transaction per group (`run_one_group`). A group
    /// that would write more than `GROUP_MAX_ROWS` rows is split in two halves run one after
    /// the other, so each operation still sees the ones before it; if a later part fails for
    /// good, its operations (and those after it) get the error while the parts before stay
    /// committed and answered.
    pub(crate) async fn run_group_in_parts(
        &self,
        ops: &[GroupOp],
    ) -> Result<GroupResults, ClaimsError> {
        let mut results = Vec::with_capacity(ops.len());
        let mut parts = VecDeque::from([ops]);
        while let Some(part) = parts.pop_front() {
            match self.run_one_group(part).await {
                Ok(Some(answers)) => results.extend(answers),
                Ok(None) => {
                    let (first, second) = part.split_at(part.len() / 2);
                    parts.push_front(second);
                    parts.push_front(first);
                }
                Err(error) if results.is_empty() => return Err(error),
                Err(error) => {
                    let failed = part.len() + parts.iter().map(|p| p.len()).sum::<usize>();
                    results.extend((0..failed).map(|_| Err(error.clone())));
                    break;
                }
            }
        }
        Ok(results)
    }

    /// One attempt of a group (`ClaimStore::run_group`): read every row of
    /// `GroupReads::of(ops)` in at most four Reads, decide the operations one by one
    /// (`domain::decide_group`), buffer the net writes.
    ///
    /// 1. `leases_outstanding` at every lease id;
    /// 2. `claims` at every key a BeginUpdate names and every key of a lease found in 1: a claim
    ///    carries only an outstanding lease's id, and only for a key of that lease's request,
    ///    so these are all the claims carrying one of the ids (what a lone CommitUpdate reads);
    /// 3. `lease_outcomes` at the ids not found in 1;
    /// 4. `decommissioned_cells` at every cell that begins.
    ///
    /// The group is decided at a stand-in clock later than every timestamp read; whatever
    /// carries it is written as, and answered with, the commit timestamp (time is Spanner's, as
    /// for a lone call). A group with a conditional rollback reads `CURRENT_TIMESTAMP()` after
    /// its rows and decides at the later of the two, so the condition is judged by Spanner's
    /// clock in this transaction.
    async fn group_attempt(
        &self,
        tx: &mut WriteTx,
        ops: &[GroupOp],
    ) -> Result<GroupAttempt, TxError> {
        let namespaces = self
            .read_named(tx, topology_claims::domain::namespaces_named(ops))
            .await?;
        let reads = GroupReads::of(ops, &namespaces);
        let lease_keys = reads.lease_ids.iter().map(|id| rows::lease_key(*id));
        let leases = self
            .read_keys(
                tx,
                LEASES,
                &LEASE_COLUMNS,
                lease_keys.collect(),
                rows::lease_from_row,
            )
            .await?;
        let mut keys: BTreeSet<&ClaimKey> = reads.keys.iter().collect();
        keys.extend(
            leases
                .iter()
                .flat_map(|lease| lease.request.operations().map(|(_, r)| &r.key)),
        );
        let claims = self.claims(tx, &keys).await?;
        let outstanding: BTreeSet<LeaseId> = leases.iter().map(|l| l.lease_id).collect();
        let ended = reads
            .lease_ids
            .iter()
            .filter(|id| !outstanding.contains(id))
            .map(|id| rows::lease_key(*id))
            .collect();
        let outcomes = self
            .read_keys(
                tx,
                OUTCOMES,
                &OUTCOME_COLUMNS,
                ended,
                rows::outcome_from_row,
            )
            .await?;
        let cells = reads.cells.iter().map(rows::decommissioned_key).collect();
        let decommissioned = self
            .read_keys(
                tx,
                DECOMMISSIONED,
                &rows::DECOMMISSIONED_COLUMNS,
                cells,
                rows::decommissioned_from_row,
            )
            .await?;
        let snapshot = GroupSnapshot {
            claims: claims.into_values().collect(),
            leases,
            outcomes,
            decommissioned,
            namespaces,
        };
        let conditional = ops.iter().any(|op| {
            matches!(
                op,
                GroupOp::Rollback {
                    unrenewed_for: Some(_),
                    ..
                }
            )
        });
        let mut stand_in = later_than_all(&snapshot);
        if conditional {
            stand_in = stand_in.max(self.clock_in(tx).await?);
        }
        let GroupDecision { results, writes } = domain::decide_group(snapshot, ops, stand_in);
        if ops.len() > 1 && rows::rows_written(&writes) > GROUP_MAX_ROWS {
            return Ok(GroupAttempt::TooLarge);
        }
        tx.buffer_write(rows::group_mutations(&writes, stand_in));
        Ok(GroupAttempt::Decided { results, stand_in })
    }

    /// One group in one read-write transaction, retried whole (and decided afresh) on abort.
    pub(crate) async fn run_one_group(
        &self,
        ops: &[GroupOp],
    ) -> Result<Option<GroupResults>, ClaimsError> {
        let mut attempts = self.attempts("group commit");
        let (attempt, committed_at) = loop {
            let Some(mut tx) = attempts.begin(&self.client).await? else {
                continue;
            };
            let result = self.group_attempt(&mut tx, ops).await;
            if let Some(done) = attempts.end(&mut tx, result).await? {
                break done;
            }
        };
        Ok(match attempt {
            GroupAttempt::TooLarge => None,
            GroupAttempt::Decided { results, stand_in } => Some(
                results
                    .into_iter()
                    .map(|result| result.map(|answer| stamped(answer, stand_in, committed_at)))
                    .collect(),
            ),
        })
    }
}

/// What one attempt of a group came to.
enum GroupAttempt {
    /// Decided (and its writes buffered) at the stand-in clock `stand_in`.
    Decided {
        results: GroupResults,
        stand_in: Timestamp,
    },
    /// Writes more than `GROUP_MAX_ROWS` rows: nothing buffered, to be split.
    TooLarge,
}

/// A clock later than every timestamp of `snapshot`: whatever a group decided at it carries it
/// only because the group wrote it now.
fn later_than_all(snapshot: &GroupSnapshot) -> Timestamp {
    let claims = snapshot
        .claims
        .iter()
        .flat_map(|c| [c.created_at, c.updated_at]);
    let leases = snapshot
        .leases
        .iter()
        .flat_map(|l| [l.created_at, l.last_renewed_at]);
    let outcomes = snapshot.outcomes.iter().map(|o| o.decided_at);
    let marks = snapshot.decommissioned.iter().map(|(_, at)| *at);
    claims
        .chain(leases)
        .chain(outcomes)
        .chain(marks)
        .max()
        .unwrap_or(SPANNER_MIN_TIMESTAMP)
        .saturating_add(Duration::from_micros(1))
}

/// An answer decided at `stand_in`, with the commit timestamp in its place.
fn stamped(answer: GroupAnswer, stand_in: Timestamp, committed_at: Timestamp) -> GroupAnswer {
    let stamp = |at: Timestamp| if at == stand_in { committed_at } else { at };
    match answer {
        GroupAnswer::Begun(mut lease) => {
            lease.created_at = stamp(lease.created_at);
            lease.last_renewed_at = stamp(lease.last_renewed_at);
            GroupAnswer::Begun(lease)
        }
        GroupAnswer::Ended => GroupAnswer::Ended,
    }
}

//! Group commit, decided one operation at a time.
//!
//! A store that runs several concurrent BeginUpdate / CommitUpdate / RollbackUpdate calls in one
//! store transaction (the server's combiner, `topology_claims_server::group`) does it in three steps:
//!
//! 1. [`GroupReads::of`]: which rows the batch touches. The store locks and reads them in one
//!    go: the lease and outcome rows of every lease id, the claim rows of every key a BeginUpdate
//!    names plus every claim row that carries one of the lease ids, and the decommission mark of
//!    every cell that begins.
//! 2. [`decide_group`]: those rows become a partial [`Tables`] (a snapshot), and the batch's
//!    operations are applied to it **in arrival order with the same methods the reference store
//!    uses**, so a later operation sees an earlier one's effect and every rule (idempotent begin,
//!    outcome memory, ownership, the first failing claim named, each operation's own atomicity)
//!    holds exactly as for a lone call. A refused operation gets its own error and changes
//!    nothing; its neighbours are unaffected.
//! 3. [`GroupWrites`]: the difference between the snapshot and the final state, written by the
//!    store in one transaction and committed once.
//!
//! The snapshot is complete for the batch: every row a lone call of any of its operations would
//! read is in it (a claim a CommitUpdate would touch carries its lease id; a claim a BeginUpdate
//! would touch is named by it). So deciding against the snapshot is deciding against the store.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::domain::namespaces::NamespaceId;
use crate::domain::resolve::{self, NamespaceSet};
pub use crate::domain::tables::GroupWrites;
use crate::domain::tables::Tables;
use crate::domain::types::{
    BeginUpdate, CellId, Claim, ClaimKey, Lease, LeaseId, Outcome, Timestamp,
};
use crate::error::ClaimsError;

/// Default `--group-max`: most operations one store transaction carries.
pub const DEFAULT_GROUP_MAX: usize = 64;

/// One operation of a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupOp {
    /// BeginUpdate. `lease_id` is the request's own or the one the combiner chose before the
    /// first attempt (so a retried group replays instead of leasing twice); the request is
    /// stored as sent.
    Begin {
        request: BeginUpdate,
        lease_id: LeaseId,
    },
    Commit {
        cell_id: CellId,
        lease_id: LeaseId,
    },
    /// RollbackUpdate; `unrenewed_for` is its condition (`decide::decide_rollback`), judged at
    /// the group's store clock like a lone call's.
    Rollback {
        cell_id: CellId,
        lease_id: LeaseId,
        unrenewed_for: Option<Duration>,
    },
}

/// `--group-max-claims`' default: claims one group transaction carries at most.
pub const DEFAULT_GROUP_MAX_CLAIMS: usize = 256;

impl GroupOp {
    /// The claims it writes, as far as it knows: a begin its batch's; an end 1 (it does not
    /// know its lease's size).
    pub fn claims(&self) -> usize {
        match self {
            GroupOp::Begin { request, .. } => {
                request.creates.len() + request.destroys.len() + request.updates.len()
            }
            GroupOp::Commit { .. } | GroupOp::Rollback { .. } => 1,
        }
    }

    /// The lease id the operation is about.
    pub fn lease_id(&self) -> LeaseId {
        match self {
            GroupOp::Begin { lease_id, .. }
            | GroupOp::Commit { lease_id, .. }
            | GroupOp::Rollback { lease_id, .. } => *lease_id,
        }
    }

    /// The RPC name, for logs and errors.
    pub fn method(&self) -> &'static str {
        match self {
            GroupOp::Begin { .. } => "BeginUpdate",
            GroupOp::Commit { .. } => "CommitUpdate",
            GroupOp::Rollback { .. } => "RollbackUpdate",
        }
    }
}

/// A successful operation's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupAnswer {
    /// BeginUpdate's lease (new or replayed).
    Begun(Lease),
    /// CommitUpdate or RollbackUpdate done (or already done).
    Ended,
}

/// Each operation's own result, in the batch's order.
pub type GroupResults = Vec<Result<GroupAnswer, ClaimsError>>;

/// The rows a batch reads (and locks) before it is decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupReads {
    /// Lease and outcome rows of these ids; also every claim row that carries one of them.
    pub lease_ids: BTreeSet<LeaseId>,
    /// Claim rows of these keys (every claim a BeginUpdate names).
    pub keys: BTreeSet<ClaimKey>,
    /// Decommission marks of these cells (every cell that begins).
    pub cells: BTreeSet<CellId>,
}

impl GroupReads {
    /// The rows of `ops`, whose keys are computed under `namespaces` (the rows of
    /// [`namespaces_named`], read first in the same transaction). A BeginUpdate whose values
    /// cannot be resolved reads no claim: it is refused when decided.
    pub fn of(ops: &[GroupOp], namespaces: &NamespaceSet) -> Self {
        let mut reads = GroupReads::default();
        for op in ops {
            reads.lease_ids.insert(op.lease_id());
            if let GroupOp::Begin { request, .. } = op {
                reads.cells.insert(request.cell_id.clone());
                if let Ok(resolved) = resolve::resolve_begin(request.clone(), namespaces) {
                    reads
                        .keys
                        .extend(resolved.operations().map(|(_, r)| r.key.clone()));
                }
            }
        }
        reads
    }
}

/// The namespaces the BeginUpdates of `ops` name: a store reads their rows before
/// [`GroupReads::of`].
pub fn namespaces_named(ops: &[GroupOp]) -> BTreeSet<NamespaceId> {
    ops.iter()
        .filter_map(|op| match op {
            GroupOp::Begin { request, .. } => Some(request),
            _ => None,
        })
        .flat_map(|request| request.operations().map(|(_, r)| r.key.namespace.clone()))
        .collect()
}

/// The rows read for a batch: what [`decide_group`] starts from.
#[derive(Clone, Debug, Default)]
pub struct GroupSnapshot {
    /// Every claim row read (by key or by lease id), each once.
    pub claims: Vec<Claim>,
    /// Outstanding leases among the read lease ids.
    pub leases: Vec<Lease>,
    /// Remembered outcomes among the read lease ids.
    pub outcomes: Vec<Outcome>,
    /// The read cells that are decommissioned, with when.
    pub decommissioned: Vec<(CellId, Timestamp)>,
    /// The namespaces the batch names ([`namespaces_named`]), as read.
    pub namespaces: NamespaceSet,
}

/// A decided batch: each operation's result and the writes of the accepted ones.
#[derive(Clone, Debug)]
pub struct GroupDecision {
    pub results: GroupResults,
    pub writes: GroupWrites,
}

/// Decides a batch against its snapshot at the store's clock `now`: every operation in order,
/// by the reference semantics ([`Tables`]), then the net writes. Answers are only valid once the
/// writes have committed.
pub fn decide_group(snapshot: GroupSnapshot, ops: &[GroupOp], now: Timestamp) -> GroupDecision {
    let before = Tables::from_rows(
        snapshot.claims,
        snapshot.leases,
        snapshot.outcomes,
        snapshot.decommissioned,
        snapshot.namespaces,
    );
    let mut after = before.clone();
    let results = ops.iter().map(|op| apply_op(&mut after, op, now)).collect();
    GroupDecision {
        results,
        writes: diff(&before, &after),
    }
}

/// One operation on `tables`, as a lone call would run it.
pub fn apply_op(
    tables: &mut Tables,
    op: &GroupOp,
    now: Timestamp,
) -> Result<GroupAnswer, ClaimsError> {
    match op {
        GroupOp::Begin { request, lease_id } => tables
            .begin_update(request.clone(), *lease_id, now)
            .map(GroupAnswer::Begun),
        GroupOp::Commit { cell_id, lease_id } => tables
            .commit_update(cell_id, *lease_id, now)
            .map(|()| GroupAnswer::Ended),
        GroupOp::Rollback {
            cell_id,
            lease_id,
            unrenewed_for,
        } => tables
            .rollback_update(cell_id, *lease_id, *unrenewed_for, now)
            .map(|()| GroupAnswer::Ended),
    }
}

fn diff(before: &Tables, after: &Tables) -> GroupWrites {
    let mut writes = GroupWrites::default();
    for (key, claim) in &after.claims {
        match before.claims.get(key) {
            None => writes.insert_claims.push(claim.clone()),
            Some(old) if old != claim => writes.update_claims.push(claim.clone()),
            Some(_) => {}
        }
    }
    writes.delete_claims = before
        .claims
        .keys()
        .filter(|key| !after.claims.contains_key(*key))
        .cloned()
        .collect();
    writes.insert_leases = after
        .leases
        .values()
        .filter(|lease| !before.leases.contains_key(&lease.lease_id))
        .cloned()
        .collect();
    writes.delete_leases = before
        .leases
        .keys()
        .filter(|id| !after.leases.contains_key(*id))
        .copied()
        .collect();
    writes.insert_outcomes = after
        .outcomes
        .values()
        .filter(|outcome| !before.outcomes.contains_key(&outcome.lease_id))
        .cloned()
        .collect();
    writes
}

/// Applies decided writes to full tables (the memory store, and the tests' check that a batch's
/// writes reproduce the reference).
pub fn apply_writes(tables: &mut Tables, writes: &GroupWrites) {
    tables.apply_group_writes(writes);
}

/// The claims that carry one of `lease_ids` among `claims` (what a store reads by lease id).
pub fn claims_of_leases<'a>(
    claims: impl IntoIterator<Item = &'a Claim>,
    lease_ids: &BTreeSet<LeaseId>,
) -> BTreeMap<ClaimKey, Claim> {
    claims
        .into_iter()
        .filter(|c| c.lease.is_some_and(|l| lease_ids.contains(&l.lease_id)))
        .map(|c| (c.record.key.clone(), c.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::types::{ClaimRecord, ClaimType, OwnerType, TableName};
    use proptest::prelude::*;

    fn record(value: u8, id: i64) -> ClaimRecord {
        ClaimRecord {
            display: None,
            key: ClaimKey::new(ClaimType::ALL[0], format!("k{value}")),
            owner_type: OwnerType::USER,
            owner_value: format!("o{id}"),
            table_name: TableName::ALL[0].clone(),
            table_record_id: id,
        }
    }

    fn cell(n: u8) -> CellId {
        CellId::parse(&format!("c{n}")).unwrap()
    }

    fn lease(n: u8) -> LeaseId {
        LeaseId::from_uuid(uuid::Uuid::from_u128(u128::from(n) + 1))
    }

    /// A random operation over 3 cells, 4 keys and 6 lease ids.
    fn op() -> impl Strategy<Value = GroupOp> {
        (
            0u8..3,
            0u8..3,
            0u8..6,
            prop::collection::vec((0u8..3, 0u8..4, 0i64..3), 1..3),
            0usize..3,
        )
            .prop_map(|(kind, c, l, claims, condition)| {
                let (cell_id, lease_id) = (cell(c), lease(l));
                match kind {
                    0 => {
                        let mut request = BeginUpdate {
                            local_transaction: None,
                            cell_id,
                            lease_id: None,
                            creates: vec![],
                            destroys: vec![],
                            updates: vec![],
                        };
                        let mut seen = BTreeSet::new();
                        for (list, value, id) in claims {
                            if !seen.insert(value) {
                                continue;
                            }
                            match list {
                                0 => request.creates.push(record(value, id)),
                                1 => request.destroys.push(record(value, id)),
                                _ => request.updates.push(record(value, id)),
                            }
                        }
                        GroupOp::Begin { request, lease_id }
                    }
                    1 => GroupOp::Commit { cell_id, lease_id },
                    // Unconditional, always met, or (for a lease begun or renewed within the
                    // last 30 µs of the history's clock) refused.
                    _ => GroupOp::Rollback {
                        cell_id,
                        lease_id,
                        unrenewed_for: [
                            None,
                            Some(Duration::ZERO),
                            Some(Duration::from_micros(30)),
                        ][condition],
                    },
                }
            })
    }

    /// What a store reads for `ops` from full `tables`.
    fn read(tables: &Tables, ops: &[GroupOp]) -> GroupSnapshot {
        let reads = GroupReads::of(ops, &tables.namespaces);
        let mut claims: BTreeMap<ClaimKey, Claim> = reads
            .keys
            .iter()
            .filter_map(|k| tables.claims.get(k).map(|c| (k.clone(), c.clone())))
            .collect();
        claims.extend(claims_of_leases(tables.claims.values(), &reads.lease_ids));
        GroupSnapshot {
            claims: claims.into_values().collect(),
            leases: reads
                .lease_ids
                .iter()
                .filter_map(|id| tables.leases.get(id).cloned())
                .collect(),
            outcomes: reads
                .lease_ids
                .iter()
                .filter_map(|id| tables.outcomes.get(id).cloned())
                .collect(),
            decommissioned: reads
                .cells
                .iter()
                .filter_map(|c| tables.decommissioned.get(c).map(|t| (c.clone(), *t)))
                .collect(),
            namespaces: tables.namespaces.clone(),
        }
    }

    proptest! {
        /// Random histories cut into random batches: deciding each batch against its snapshot
        /// and applying the net writes gives the same answers and the same final tables as
        /// running every operation alone on the reference.
        #[test]
        fn a_batch_decides_like_its_operations_one_by_one(
            ops in prop::collection::vec(op(), 1..60),
            cuts in prop::collection::vec(1usize..8, 1..20),
        ) {
            let mut grouped = Tables::default();
            let mut alone = Tables::default();
            let mut rest = ops.as_slice();
            let mut step = 0;
            while !rest.is_empty() {
                let n = cuts[step % cuts.len()].min(rest.len());
                let (batch, tail) = rest.split_at(n);
                rest = tail;
                let now = Timestamp::from_unix_micros(step as i64 * 10);
                step += 1;
                let decision = decide_group(read(&grouped, batch), batch, now);
                apply_writes(&mut grouped, &decision.writes);
                let expected: GroupResults =
                    batch.iter().map(|op| apply_op(&mut alone, op, now)).collect();
                prop_assert_eq!(decision.results, expected);
                prop_assert_eq!(&grouped, &alone);
            }
        }
    }

    #[test]
    fn a_refusal_does_not_abort_its_neighbours() {
        let k = record(1, 1);
        let begin = |c: u8, l: u8| GroupOp::Begin {
            request: BeginUpdate {
                local_transaction: None,
                cell_id: cell(c),
                lease_id: None,
                creates: vec![k.clone()],
                destroys: vec![],
                updates: vec![],
            },
            lease_id: lease(l),
        };
        let ops = [
            begin(1, 1),
            begin(2, 2),
            GroupOp::Commit {
                cell_id: cell(1),
                lease_id: lease(1),
            },
        ];
        let decision = decide_group(
            GroupSnapshot::default(),
            &ops,
            Timestamp::from_unix_micros(5),
        );
        assert!(matches!(decision.results[0], Ok(GroupAnswer::Begun(_))));
        assert_eq!(
            decision.results[1],
            Err(ClaimsError::ClaimLeased {
                claim: k.key.clone()
            })
        );
        assert_eq!(decision.results[2], Ok(GroupAnswer::Ended));
        // Begin then commit in one batch: the claim is inserted committed, the lease never
        // written, its outcome remembered.
        assert_eq!(decision.writes.insert_claims.len(), 1);
        assert!(decision.writes.insert_claims[0].lease.is_none());
        assert!(decision.writes.insert_leases.is_empty());
        assert_eq!(decision.writes.insert_outcomes.len(), 1);
    }
}

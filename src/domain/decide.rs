//! The protocol's rules as pure functions: current rows in, decision or error out.
//!
//! Every adapter reads the rows a request touches, calls one of these, and writes exactly what
//! the decision says. Nothing here does I/O or reads a clock.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use crate::domain::resolve::{check_creates, NamespaceSet};
use crate::domain::types::{
    BeginUpdate, CellId, Claim, ClaimKey, ClaimRecord, Lease, LeaseId, LeaseOp, LeaseOutcome,
    LeaseRecord, Timestamp,
};
use crate::error::ClaimsError;

/// Default `--max-batch`: most claims one BeginUpdate may carry.
pub const DEFAULT_MAX_BATCH: usize = 1000;
/// The retry delay `ClaimLeased` suggests (its google.rpc.RetryInfo). A lease normally lives as
/// long as one cell transaction (milliseconds, a second or two for a large batch), so a second
/// later it has usually ended; one that has not is probably stuck, and only the cell's
/// reconciler (after its `--staleness`, minutes) ends it, so asking sooner gains nothing and
/// waiting longer only delays the common case.
pub const CLAIM_LEASED_RETRY_AFTER: Duration = Duration::from_secs(1);
/// Checks that a batch of `claims` claims (creates + destroys + updates) is within `max_batch`.
/// The front end applies it to the wire before any claim is decoded, as well as here.
pub fn check_batch_size(claims: usize, max_batch: usize) -> Result<(), ClaimsError> {
    if claims > max_batch {
        return Err(ClaimsError::invalid(
            "creates_claims",
            format!("at most {max_batch} claims per batch, got {claims}"),
        ));
    }
    Ok(())
}

/// Batch-level validation, done before any store access: every record well-formed, the batch
/// neither empty nor larger than `max_batch`, and no claim twice (the first repeat is named).
pub fn check_batch(request: &BeginUpdate, max_batch: usize) -> Result<(), ClaimsError> {
    if request.is_empty() {
        return Err(ClaimsError::invalid(
            "creates_claims",
            "at least one create, destroy or update is required",
        ));
    }
    check_batch_size(request.len(), max_batch)?;
    for (i, record) in request.creates.iter().enumerate() {
        record.check(format_args!("creates_claims[{i}]"))?;
    }
    for (i, record) in request.destroys.iter().enumerate() {
        record.check(format_args!("destroys_claims[{i}]"))?;
    }
    for (i, record) in request.updates.iter().enumerate() {
        record.check(format_args!("updates_claims[{i}]"))?;
    }
    // One key in two lists (or twice in one) is a conflict: a claim takes one operation a batch.
    // Named as the caller sent it (the repeat's own form), like every refusal of a claim.
    match first_repeat(request) {
        Some(record) => Err(ClaimsError::BatchConflict {
            claim: ClaimKey {
                namespace: record.key.namespace.clone(),
                value: record.display_value().to_owned(),
            },
        }),
        None => Ok(()),
    }
}

/// Batches up to this size look for a repeated key by comparing every pair (at most 120
/// comparisons, no allocation, no hashing); larger ones with a hash set.
const PAIRWISE_REPEAT_CHECK: usize = 16;

/// The first record of `request`'s operations (in `operations()` order) whose key an earlier
/// one has.
fn first_repeat(request: &BeginUpdate) -> Option<&ClaimRecord> {
    if request.len() <= PAIRWISE_REPEAT_CHECK {
        let records = || request.operations().map(|(_, record)| record);
        return records()
            .enumerate()
            .find(|&(i, record)| records().take(i).any(|earlier| earlier.key == record.key))
            .map(|(_, record)| record);
    }
    let mut seen = HashSet::with_capacity(request.len());
    request
        .operations()
        .map(|(_, record)| record)
        .find(|record| !seen.insert(&record.key))
}

/// The rule for one claim of a batch, given its current row.
///
/// Permanent reasons win over temporary ones: a destroy or an update of an absent claim is
/// `ClaimNotFound`, of another cell's claim `NotClaimOwner`, and only then `ClaimLeased`.
/// A create of any leased claim is `ClaimLeased` (it may be rolled back), of a committed one
/// `ClaimTaken` (whichever cell holds it).
pub fn check_claim(
    op: LeaseOp,
    record: &ClaimRecord,
    caller: &CellId,
    current: Option<&Claim>,
) -> Result<(), ClaimsError> {
    // Named as the caller sent it: that is the value it can find in its own request.
    let claim = || ClaimKey {
        namespace: record.key.namespace.clone(),
        value: record.display_value().to_owned(),
    };
    match (op, current) {
        (LeaseOp::Create, None) => Ok(()),
        (LeaseOp::Create, Some(row)) if row.lease.is_some() => {
            Err(ClaimsError::ClaimLeased { claim: claim() })
        }
        (LeaseOp::Create, Some(_)) => Err(ClaimsError::ClaimTaken { claim: claim() }),
        (LeaseOp::Destroy | LeaseOp::Update, None) => {
            Err(ClaimsError::ClaimNotFound { claim: claim() })
        }
        (LeaseOp::Destroy | LeaseOp::Update, Some(row)) if &row.cell_id != caller => {
            Err(ClaimsError::NotClaimOwner { claim: claim() })
        }
        (LeaseOp::Destroy | LeaseOp::Update, Some(row)) if row.lease.is_some() => {
            Err(ClaimsError::ClaimLeased { claim: claim() })
        }
        (LeaseOp::Destroy | LeaseOp::Update, Some(_)) => Ok(()),
    }
}

/// Most refused claims one refusal lists ([`ClaimConflicts`]); the rest are counted. The wire
/// caps the list again by bytes (the status trailer must stay small).
pub const MAX_LISTED_CONFLICTS: usize = 100;

/// One refused claim of a BeginUpdate: the record as the caller sent it, and its refusal
/// (`ClaimTaken`, `ClaimLeased`, `ClaimNotFound`, `NotClaimOwner`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimConflict {
    pub record: ClaimRecord,
    pub refusal: ClaimsError,
}

/// Every refused claim of a BeginUpdate that refused more than one, in the request's order
/// (creates, destroys, updates): the first is the refusal a client that reads one error sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimConflicts {
    /// At least two; at most [`MAX_LISTED_CONFLICTS`].
    pub conflicts: Vec<ClaimConflict>,
    /// Refused claims past [`MAX_LISTED_CONFLICTS`], not listed.
    pub omitted: usize,
}

impl ClaimConflicts {
    /// The first refused claim's refusal.
    pub fn first(&self) -> &ClaimsError {
        &self.conflicts[0].refusal
    }
}

impl std::fmt::Display for ClaimConflicts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let more = self.conflicts.len() - 1 + self.omitted;
        write!(
            f,
            "{}; and {more} more claim(s) of the batch refused",
            self.first()
        )
    }
}

/// Checks every claim of a batch against its current row ([`check_claim`]). One refused claim
/// is its own refusal; several are [`ClaimsError::ClaimConflicts`], listing each (the first
/// one's refusal first), so a form can show every taken name at once.
pub fn check_claims(
    request: &BeginUpdate,
    current: &BTreeMap<ClaimKey, Claim>,
) -> Result<(), ClaimsError> {
    let mut refused = request.operations().filter_map(|(op, record)| {
        check_claim(op, record, &request.cell_id, current.get(&record.key))
            .err()
            .map(|refusal| ClaimConflict {
                record: record.clone(),
                refusal,
            })
    });
    let Some(first) = refused.next() else {
        return Ok(());
    };
    let mut conflicts = vec![first];
    let mut omitted = 0;
    for conflict in refused {
        if conflicts.len() < MAX_LISTED_CONFLICTS {
            conflicts.push(conflict);
        } else {
            omitted += 1;
        }
    }
    if conflicts.len() == 1 {
        return Err(conflicts.pop().expect("one conflict").refusal);
    }
    Err(ClaimsError::ClaimConflicts(Box::new(ClaimConflicts {
        conflicts,
        omitted,
    })))
}

/// What BeginUpdate must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BeginPlan {
    /// The same request was already applied under this lease id: answer with that lease.
    Replay(Lease),
    /// Insert the lease and mark the claims, all in one transaction.
    Apply(BeginWrites),
}

/// The writes of a successful BeginUpdate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BeginWrites {
    pub lease_id: LeaseId,
    /// Insert these claims, leased with `LeaseOp::Create`, owned by the caller.
    pub inserts: Vec<ClaimRecord>,
    /// Mark these committed claims with `LeaseOp::Destroy` (only if still unleased and the caller's).
    pub marks: Vec<ClaimKey>,
    /// Mark these committed claims with `LeaseOp::Update`, on the same condition. Their values
    /// stay as they are until the commit ([`EndWrites::replace`]).
    pub update_marks: Vec<ClaimKey>,
}

/// Decides a BeginUpdate (already through [`prepare_begin`](super::resolve::prepare_begin): its
/// keys computed under `namespaces`, the batch checked).
///
/// `lease_id` is the client's id or a fresh one; `known` is what the store knows of that id;
/// `current` holds the current row of every claim in the batch that exists. A replay is
/// answered before the create-only rules are consulted (`check_creates`): it was decided under
/// the rules of its first attempt, and a namespace deprecated or a value reserved since then
/// does not undo a lease already granted.
pub fn decide_begin(
    request: &BeginUpdate,
    lease_id: LeaseId,
    known: Option<&LeaseRecord>,
    current: &BTreeMap<ClaimKey, Claim>,
    namespaces: &NamespaceSet,
) -> Result<BeginPlan, ClaimsError> {
    match known {
        Some(LeaseRecord::Outstanding(lease)) => {
            return if lease.cell_id == request.cell_id && lease.request.same_content(request) {
                Ok(BeginPlan::Replay(lease.clone()))
            } else {
                Err(ClaimsError::LeaseIdConflict { lease_id })
            };
        }
        Some(LeaseRecord::Ended(outcome)) => {
            return Err(if outcome.cell_id != request.cell_id {
                ClaimsError::LeaseIdConflict { lease_id }
            } else {
                match outcome.outcome {
                    LeaseOutcome::Committed => ClaimsError::LeaseCommitted { lease_id },
                    LeaseOutcome::RolledBack => ClaimsError::LeaseRolledBack { lease_id },
                }
            });
        }
        None => {}
    }
    check_creates(request, namespaces)?;
    check_claims(request, current)?;
    Ok(BeginPlan::Apply(BeginWrites {
        lease_id,
        inserts: request.creates.clone(),
        marks: request.destroys.iter().map(|r| r.key.clone()).collect(),
        update_marks: request.updates.iter().map(|r| r.key.clone()).collect(),
    }))
}

/// What CommitUpdate or RollbackUpdate must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndPlan {
    /// Already ended this way: nothing to write (idempotent success).
    AlreadyDone,
    Apply(EndWrites),
}

/// The writes that end a lease. Every claim write is conditional on the claim still carrying
/// `lease_id`; the lease row (if any) is deleted and the outcome remembered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndWrites {
    pub lease_id: LeaseId,
    pub cell_id: CellId,
    pub outcome: LeaseOutcome,
    /// Delete these claims (destroys on commit, creates on rollback).
    pub delete: Vec<ClaimKey>,
    /// Clear the lease from these claims (creates on commit, destroys and updates on rollback).
    pub release: Vec<ClaimKey>,
    /// Clear the lease from these claims and set their owner type, owner value, table name and
    /// table record id to the record's (updates on commit; the new values come from the lease's
    /// stored request).
    pub replace: Vec<ClaimRecord>,
}

fn end_writes(lease: &Lease, outcome: LeaseOutcome) -> EndWrites {
    fn keys(records: &[ClaimRecord]) -> impl Iterator<Item = ClaimKey> + '_ {
        records.iter().map(|r| r.key.clone())
    }
    let request = &lease.request;
    let (delete, release, replace) = match outcome {
        LeaseOutcome::Committed => (
            keys(&request.destroys).collect(),
            keys(&request.creates).collect(),
            request.updates.clone(),
        ),
        LeaseOutcome::RolledBack => (
            keys(&request.creates).collect(),
            keys(&request.destroys)
                .chain(keys(&request.updates))
                .collect(),
            Vec::new(),
        ),
    };
    EndWrites {
        lease_id: lease.lease_id,
        cell_id: lease.cell_id.clone(),
        outcome,
        delete,
        release,
        replace,
    }
}

fn check_lease_owner(
    owner: &CellId,
    caller: &CellId,
    lease_id: LeaseId,
) -> Result<(), ClaimsError> {
    if owner == caller {
        Ok(())
    } else {
        Err(ClaimsError::NotLeaseOwner { lease_id })
    }
}

/// Decides a CommitUpdate.
pub fn decide_commit(
    caller: &CellId,
    lease_id: LeaseId,
    known: Option<&LeaseRecord>,
) -> Result<EndPlan, ClaimsError> {
    match known {
        None => Err(ClaimsError::LeaseNotFound { lease_id }),
        Some(LeaseRecord::Outstanding(lease)) => {
            check_lease_owner(&lease.cell_id, caller, lease_id)?;
            Ok(EndPlan::Apply(end_writes(lease, LeaseOutcome::Committed)))
        }
        Some(LeaseRecord::Ended(outcome)) => {
            check_lease_owner(&outcome.cell_id, caller, lease_id)?;
            match outcome.outcome {
                LeaseOutcome::Committed => Ok(EndPlan::AlreadyDone),
                LeaseOutcome::RolledBack => Err(ClaimsError::LeaseRolledBack { lease_id }),
            }
        }
    }
}

/// Decides a RollbackUpdate. Rolling back an unknown id records the rolled-back outcome, so a
/// BeginUpdate with that id that arrives late (after the client gave up) is refused.
///
/// `unrenewed_for` makes it conditional (the reconciler's and ForceRollback's rollbacks): an
/// outstanding lease is rolled back only if it has gone unrenewed for at least that long at
/// `now`, the store's clock in the same transaction that reads the lease; otherwise
/// `LeaseRenewed` and nothing changes. A cell that renewed after someone judged its lease stale
/// keeps it, so its commit (which its staleness guard now allows) succeeds. Ended and unknown
/// leases answer as for an unconditional rollback: they have no renewals to respect.
pub fn decide_rollback(
    caller: &CellId,
    lease_id: LeaseId,
    known: Option<&LeaseRecord>,
    unrenewed_for: Option<Duration>,
    now: Timestamp,
) -> Result<EndPlan, ClaimsError> {
    match known {
        None => Ok(EndPlan::Apply(EndWrites {
            lease_id,
            cell_id: caller.clone(),
            outcome: LeaseOutcome::RolledBack,
            delete: Vec::new(),
            release: Vec::new(),
            replace: Vec::new(),
        })),
        Some(LeaseRecord::Outstanding(lease)) => {
            check_lease_owner(&lease.cell_id, caller, lease_id)?;
            if unrenewed_for.is_some_and(|window| !lease_unrenewed_for(lease, now, window)) {
                return Err(ClaimsError::LeaseRenewed { lease_id });
            }
            Ok(EndPlan::Apply(end_writes(lease, LeaseOutcome::RolledBack)))
        }
        Some(LeaseRecord::Ended(outcome)) => {
            check_lease_owner(&outcome.cell_id, caller, lease_id)?;
            match outcome.outcome {
                LeaseOutcome::RolledBack => Ok(EndPlan::AlreadyDone),
                LeaseOutcome::Committed => Err(ClaimsError::LeaseCommitted { lease_id }),
            }
        }
    }
}

/// Decides a RenewLease: returns the lease whose `last_renewed_at` the store must set to now.
pub fn decide_renew<'a>(
    caller: &CellId,
    lease_id: LeaseId,
    known: Option<&'a LeaseRecord>,
) -> Result<&'a Lease, ClaimsError> {
    match known {
        None => Err(ClaimsError::LeaseNotFound { lease_id }),
        Some(LeaseRecord::Outstanding(lease)) => {
            check_lease_owner(&lease.cell_id, caller, lease_id)?;
            Ok(lease)
        }
        Some(LeaseRecord::Ended(outcome)) => {
            check_lease_owner(&outcome.cell_id, caller, lease_id)?;
            Err(match outcome.outcome {
                LeaseOutcome::Committed => ClaimsError::LeaseCommitted { lease_id },
                LeaseOutcome::RolledBack => ClaimsError::LeaseRolledBack { lease_id },
            })
        }
    }
}

/// Whether a remembered outcome is past retention and may be collected.
pub fn outcome_expired(decided_at: Timestamp, now: Timestamp, retention: Duration) -> bool {
    decided_at < now.saturating_sub(retention)
}

/// Whether a lease has gone unrenewed for at least `window` at `now` (the store's clock):
/// measured from `last_renewed_at`, which is `created_at` until the first renewal. The condition
/// of a conditional rollback and the filter of the admin ListLeases and ForceRollback.
pub fn lease_unrenewed_for(lease: &Lease, now: Timestamp, window: Duration) -> bool {
    now.saturating_since(lease.last_renewed_at) >= window
}

/// Whether a lease is stale: no renewal for longer than `threshold`, by the store's clock.
pub fn lease_is_stale(lease: &Lease, server_time: Timestamp, threshold: Duration) -> bool {
    server_time.saturating_since(lease.last_renewed_at) > threshold
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(created_at: i64, last_renewed_at: i64) -> LeaseRecord {
        let cell_id = CellId::parse("cell-a").unwrap();
        LeaseRecord::Outstanding(Lease {
            lease_id: LeaseId::from_uuid(uuid::Uuid::from_u128(1)),
            cell_id: cell_id.clone(),
            created_at: Timestamp::from_unix_micros(created_at),
            last_renewed_at: Timestamp::from_unix_micros(last_renewed_at),
            request: BeginUpdate {
                local_transaction: None,
                cell_id,
                lease_id: None,
                creates: vec![],
                destroys: vec![],
                updates: vec![],
            },
        })
    }

    #[test]
    fn a_conditional_rollback_measures_idle_time_from_the_last_renewal() {
        let caller = CellId::parse("cell-a").unwrap();
        let id = LeaseId::from_uuid(uuid::Uuid::from_u128(1));
        let window = Some(Duration::from_micros(100));
        let at = Timestamp::from_unix_micros;
        // Created long ago, renewed 50 µs ago: refused.
        assert_eq!(
            decide_rollback(&caller, id, Some(&lease(0, 950)), window, at(1_000)),
            Err(ClaimsError::LeaseRenewed { lease_id: id })
        );
        // Exactly the window since the renewal (or since creation, never renewed): rolled back.
        for known in [lease(0, 900), lease(900, 900)] {
            assert!(matches!(
                decide_rollback(&caller, id, Some(&known), window, at(1_000)),
                Ok(EndPlan::Apply(_))
            ));
        }
        // Unconditional: the clock does not matter.
        assert!(matches!(
            decide_rollback(&caller, id, Some(&lease(0, 999)), None, at(1_000)),
            Ok(EndPlan::Apply(_))
        ));
        // Another cell's lease is refused as such before any condition.
        let other = CellId::parse("cell-b").unwrap();
        assert_eq!(
            decide_rollback(&other, id, Some(&lease(0, 999)), window, at(1_000)),
            Err(ClaimsError::NotLeaseOwner { lease_id: id })
        );
    }

    fn batch(creates: &[&str], destroys: &[&str]) -> BeginUpdate {
        use crate::fixtures::{self, cell, username};
        let records = |values: &[&str]| values.iter().map(|v| username(v)).collect::<Vec<_>>();
        BeginUpdate {
            destroys: records(destroys),
            ..fixtures::creates(&cell("cell-a"), &records(creates))
        }
    }

    #[test]
    fn a_repeated_claim_is_named_at_its_first_repeat_in_small_and_large_batches() {
        let conflict = |request: &BeginUpdate| match check_batch(request, 1000) {
            Err(ClaimsError::BatchConflict { claim }) => Some(claim.value),
            Err(other) => panic!("unexpected {other}"),
            Ok(()) => None,
        };
        // Small (pairwise) and large (hash set) batches: same answers.
        for filler in [0, PAIRWISE_REPEAT_CHECK] {
            let names: Vec<String> = (0..filler).map(|i| format!("f{i}")).collect();
            let mut creates: Vec<&str> = names.iter().map(String::as_str).collect();
            creates.extend(["a", "b", "c"]);
            assert_eq!(conflict(&batch(&creates, &["d"])), None, "{filler}");
            // b repeats before a does (destroys come after creates): b is named.
            let mut with_repeats = creates.clone();
            with_repeats.push("b");
            assert_eq!(
                conflict(&batch(&with_repeats, &["a"])).as_deref(),
                Some("b"),
                "{filler}"
            );
            // A create repeated as a destroy is a conflict too.
            assert_eq!(
                conflict(&batch(&creates, &["c"])).as_deref(),
                Some("c"),
                "{filler}"
            );
        }
    }
}

//! The whole protocol state as plain in-memory tables, with every operation written in terms of
//! the decisions in [`super::decide`]. It is the reference semantics: the in-memory store wraps
//! it in a mutex, and the model-based property suite runs it beside every adapter.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::time::Duration;

use crate::domain::admin::{
    self, DecommissionPlan, DecommissionState, DecommissionStep, LeaseSummary,
};
use crate::domain::decide::{self, BeginPlan, EndPlan, EndWrites};
use crate::domain::namespaces::{NamespaceId, NamespaceSpec, NamespaceUpdate, ProofClaim, Rekey};
use crate::domain::pages;
use crate::domain::resolve::{self, NamespaceSet, StoredNamespace};
use crate::domain::restore::{self, MarkRestored, RestoreEpoch};
use crate::domain::slots::{self, SlotGrant, SlotHolder, SlotLimit, SlotRow};
use crate::domain::types::{
    BeginUpdate, CellId, Claim, ClaimKey, ClaimLease, ClaimRecord, ClaimsPage, ClaimsQuery, Lease,
    LeaseId, LeaseOp, LeaseRecord, LeasesPage, LeasesQuery, Outcome, TableName, Timestamp,
};
use crate::error::ClaimsError;

/// The net writes of a decided batch: the snapshot's rows that changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupWrites {
    /// Claims that did not exist in the snapshot (created by a BeginUpdate).
    pub insert_claims: Vec<Claim>,
    /// Claims that exist before and after but differ: write every column (lease marker, owner,
    /// table, record id, cell, timestamps).
    pub update_claims: Vec<Claim>,
    /// Claims that existed and are gone.
    pub delete_claims: Vec<ClaimKey>,
    pub insert_leases: Vec<Lease>,
    pub delete_leases: Vec<LeaseId>,
    pub insert_outcomes: Vec<Outcome>,
}

impl GroupWrites {
    pub fn is_empty(&self) -> bool {
        self.insert_claims.is_empty()
            && self.update_claims.is_empty()
            && self.delete_claims.is_empty()
            && self.insert_leases.is_empty()
            && self.delete_leases.is_empty()
            && self.insert_outcomes.is_empty()
    }
}

/// The three tables of the service: claims (one row per key), outstanding leases, and the
/// remembered outcomes of ended leases. The fields are public for reading; every write goes
/// through the methods, which keep the ListClaims index in step with `claims`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tables {
    pub claims: BTreeMap<ClaimKey, Claim>,
    pub leases: BTreeMap<LeaseId, Lease>,
    pub outcomes: BTreeMap<LeaseId, Outcome>,
    /// Cells an administrator decommissioned, with when.
    pub decommissioned: BTreeMap<CellId, Timestamp>,
    /// Verification slots by holder (`verification_slots`).
    pub slots: BTreeMap<SlotHolder, Timestamp>,
    /// The latest restore epoch (`restore_epochs` and `restore_reports`; earlier epochs are
    /// history, which only the SQL stores keep).
    pub restore: Option<RestoreEpoch>,
    /// The namespaces (`namespaces`): every key is computed under their rules. A new store has
    /// the built-ins.
    pub namespaces: NamespaceSet,
    /// `(cell, table, record id, key)` of every claim: ListClaims reads one page of it instead
    /// of scanning every claim (the design's claims-by-(cell, table, record id) index). A
    /// committed update changes table name and record id: `replace_claim` moves its entry.
    by_record: BTreeSet<RecordIndexKey>,
    /// Every change of a claim row since the last [`Tables::take_changes`], once
    /// [`Tables::record_changes`] turned it on (the memory store's event log).
    changes: ChangeLog,
}

/// The claim-row changes a [`Tables`] recorded: each row after the change (before it, for a
/// delete) and whether it was deleted. Not part of the tables' state: it never makes two
/// tables unequal.
#[derive(Clone, Debug, Default)]
struct ChangeLog(Option<Vec<(Claim, bool)>>);

impl PartialEq for ChangeLog {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for ChangeLog {}

type RecordIndexKey = (CellId, TableName, i64, ClaimKey);

fn index_key(claim: &Claim) -> RecordIndexKey {
    (
        claim.cell_id.clone(),
        claim.record.table_name.clone(),
        claim.record.table_record_id,
        claim.record.key.clone(),
    )
}

impl Tables {
    /// From now on, every change of a claim row is kept until [`Self::take_changes`].
    pub fn record_changes(&mut self) {
        self.changes.0.get_or_insert_with(Vec::new);
    }

    /// The claim-row changes recorded since the last call, in the order they were made: each
    /// row after the change (as it was, for a delete) and whether it was deleted.
    pub fn take_changes(&mut self) -> Vec<(Claim, bool)> {
        self.changes
            .0
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Sets the revision of the claim at `key` (the store numbers a transaction's changes).
    pub fn set_revision(&mut self, key: &ClaimKey, revision: u64) {
        if let Some(claim) = self.claims.get_mut(key) {
            claim.revision = revision;
        }
    }

    fn changed(&mut self, key: &ClaimKey) {
        if let (Some(changes), Some(claim)) = (self.changes.0.as_mut(), self.claims.get(key)) {
            changes.push((claim.clone(), false));
        }
    }

    fn insert_claim(&mut self, claim: Claim) {
        let key = claim.record.key.clone();
        self.insert_row(claim);
        self.changed(&key);
    }

    fn insert_row(&mut self, claim: Claim) {
        self.by_record.insert(index_key(&claim));
        if let Some(old) = self.claims.insert(claim.record.key.clone(), claim) {
            // Not reached (inserts are for absent keys), but the index must never lie.
            let new = self.claims.get(&old.record.key).map(index_key);
            if new.as_ref() != Some(&index_key(&old)) {
                self.by_record.remove(&index_key(&old));
            }
        }
    }

    /// A committed update: the claim takes `record`'s owner and record fields and loses its
    /// lease; the index entry moves with it.
    fn replace_claim(&mut self, record: ClaimRecord, now: Timestamp) {
        let key = record.key.clone();
        if let Some(claim) = self.claims.get_mut(&record.key) {
            self.by_record.remove(&index_key(claim));
            claim.record = record;
            claim.lease = None;
            claim.updated_at = now;
            self.by_record.insert(index_key(claim));
        }
        self.changed(&key);
    }

    fn remove_claim(&mut self, key: &ClaimKey) {
        if let Some(old) = self.remove_row(key) {
            if let Some(changes) = self.changes.0.as_mut() {
                changes.push((old, true));
            }
        }
    }

    fn remove_row(&mut self, key: &ClaimKey) -> Option<Claim> {
        let old = self.claims.remove(key)?;
        self.by_record.remove(&index_key(&old));
        Some(old)
    }

    /// Tables holding exactly these rows (a group's snapshot, see `domain::group`).
    pub fn from_rows(
        claims: impl IntoIterator<Item = Claim>,
        leases: impl IntoIterator<Item = Lease>,
        outcomes: impl IntoIterator<Item = Outcome>,
        decommissioned: impl IntoIterator<Item = (CellId, Timestamp)>,
        namespaces: NamespaceSet,
    ) -> Self {
        let mut tables = Tables {
            namespaces,
            leases: leases.into_iter().map(|l| (l.lease_id, l)).collect(),
            outcomes: outcomes.into_iter().map(|o| (o.lease_id, o)).collect(),
            decommissioned: decommissioned.into_iter().collect(),
            ..Tables::default()
        };
        for claim in claims {
            tables.insert_row(claim);
        }
        tables
    }

    /// Writes a decided group's net writes ([`GroupWrites`], decided by `domain::group`).
    pub(crate) fn apply_group_writes(&mut self, writes: &GroupWrites) {
        for key in &writes.delete_claims {
            self.remove_claim(key);
        }
        for claim in writes.insert_claims.iter().chain(&writes.update_claims) {
            self.remove_row(claim.key());
            self.insert_claim(claim.clone());
        }
        for lease_id in &writes.delete_leases {
            self.leases.remove(lease_id);
        }
        for lease in &writes.insert_leases {
            self.leases.insert(lease.lease_id, lease.clone());
        }
        for outcome in &writes.insert_outcomes {
            self.outcomes.insert(outcome.lease_id, outcome.clone());
        }
    }

    /// What is known of a lease id.
    pub fn lease_record(&self, lease_id: LeaseId) -> Option<LeaseRecord> {
        if let Some(lease) = self.leases.get(&lease_id) {
            return Some(LeaseRecord::Outstanding(lease.clone()));
        }
        self.outcomes
            .get(&lease_id)
            .cloned()
            .map(LeaseRecord::Ended)
    }

    /// BeginUpdate. `fresh_id` is used when the request carries no lease id.
    pub fn begin_update(
        &mut self,
        request: BeginUpdate,
        fresh_id: LeaseId,
        now: Timestamp,
    ) -> Result<Lease, ClaimsError> {
        // The batch-size policy is the front end's (`--max-batch`); stores accept any size.
        let request = resolve::prepare_begin(request, &self.namespaces)?;
        admin::check_not_decommissioned(
            &request.cell_id,
            self.decommissioned.contains_key(&request.cell_id),
        )?;
        let lease_id = request.lease_id.unwrap_or(fresh_id);
        let current: BTreeMap<ClaimKey, Claim> = request
            .operations()
            .filter_map(|(_, r)| self.claims.get(&r.key).map(|c| (r.key.clone(), c.clone())))
            .collect();
        let known = self.lease_record(lease_id);
        match decide::decide_begin(
            &request,
            lease_id,
            known.as_ref(),
            &current,
            &self.namespaces,
        )? {
            BeginPlan::Replay(lease) => Ok(lease),
            BeginPlan::Apply(writes) => {
                for record in writes.inserts {
                    let claim = Claim {
                        record,
                        cell_id: request.cell_id.clone(),
                        lease: Some(ClaimLease {
                            lease_id,
                            op: LeaseOp::Create,
                        }),
                        created_at: now,
                        updated_at: now,
                        revision: 0,
                    };
                    self.insert_claim(claim);
                }
                let marks = (writes.marks.into_iter().map(|k| (k, LeaseOp::Destroy))).chain(
                    writes
                        .update_marks
                        .into_iter()
                        .map(|k| (k, LeaseOp::Update)),
                );
                for (key, op) in marks {
                    if let Some(claim) = self.claims.get_mut(&key) {
                        claim.lease = Some(ClaimLease { lease_id, op });
                        claim.updated_at = now;
                        self.changed(&key);
                    }
                }
                let lease = Lease {
                    lease_id,
                    cell_id: request.cell_id.clone(),
                    created_at: now,
                    last_renewed_at: now,
                    request,
                };
                self.leases.insert(lease_id, lease.clone());
                Ok(lease)
            }
        }
    }

    /// How many claims each namespace holding any has (`ClaimStore::count_claims`), in id order.
    pub fn count_claims(&self) -> Vec<(NamespaceId, u64)> {
        let mut counts: BTreeMap<&NamespaceId, u64> = BTreeMap::new();
        for key in self.claims.keys() {
            *counts.entry(&key.namespace).or_default() += 1;
        }
        counts.into_iter().map(|(id, n)| (id.clone(), n)).collect()
    }

    /// Every cell with outstanding leases, at `now`.
    pub fn lease_summary(&self, now: Timestamp) -> LeaseSummary {
        LeaseSummary::from_leases(
            now,
            self.leases.values().map(|l| (&l.cell_id, l.created_at)),
        )
    }

    /// One decommission step (see `ClaimStore::decommission_step`): deletes the first `batch`
    /// claims of the cell in the ListClaims index order.
    pub fn decommission_step(
        &mut self,
        cell_id: &CellId,
        batch: usize,
        dry_run: bool,
        now: Timestamp,
    ) -> Result<DecommissionStep, ClaimsError> {
        let state = DecommissionState {
            outstanding_leases: self
                .leases
                .values()
                .filter(|l| &l.cell_id == cell_id)
                .count() as u64,
            decommissioned: self.decommissioned.contains_key(cell_id),
        };
        let plan = admin::decide_decommission(cell_id, state, dry_run, batch)?;
        // A scan of the index: the reference store favours plainness over speed here.
        let cell_claims = self
            .by_record
            .iter()
            .filter(|(cell, ..)| cell == cell_id)
            .map(|(.., key)| key.clone());
        let claims = match plan {
            DecommissionPlan::Count => cell_claims.count() as u64,
            DecommissionPlan::Delete { mark, limit } => {
                let doomed: Vec<ClaimKey> = cell_claims.take(limit).collect();
                if mark {
                    self.decommissioned.insert(cell_id.clone(), now);
                }
                for key in &doomed {
                    self.remove_claim(key);
                }
                doomed.len() as u64
            }
        };
        Ok(DecommissionStep::after(cell_id, state, plan, claims))
    }

    /// `admin mark-restored` (see `ClaimStore::mark_restored`).
    pub fn mark_restored(
        &mut self,
        request: &MarkRestored,
        now: Timestamp,
    ) -> Result<RestoreEpoch, ClaimsError> {
        let mut holding: BTreeSet<CellId> = self
            .by_record
            .iter()
            .map(|(cell, ..)| cell.clone())
            .collect();
        holding.extend(self.leases.values().map(|l| l.cell_id.clone()));
        let epoch = restore::decide_mark_restored(self.restore.as_ref(), request, holding, now)?;
        self.restore = Some(epoch.clone());
        Ok(epoch)
    }

    /// A verification pass report (see `ClaimStore::report_verification_pass`).
    pub fn report_verification_pass(
        &mut self,
        cell_id: &CellId,
        epoch: u64,
        now: Timestamp,
    ) -> Result<RestoreEpoch, ClaimsError> {
        let plan = restore::decide_report(self.restore.as_ref(), cell_id, epoch)?;
        let state = self
            .restore
            .as_mut()
            .expect("decide_report checked the epoch");
        if plan.record {
            state.reported.insert(cell_id.clone(), now);
        }
        if let Some(reason) = plan.lift {
            state.lifted = Some((now, reason));
        }
        Ok(state.clone())
    }

    /// `admin lift-quarantine` (see `ClaimStore::lift_quarantine`).
    pub fn lift_quarantine(
        &mut self,
        epoch: u64,
        reason: &str,
        now: Timestamp,
    ) -> Result<RestoreEpoch, ClaimsError> {
        let lift = restore::decide_lift(self.restore.as_ref(), epoch, reason)?;
        let state = self
            .restore
            .as_mut()
            .expect("decide_lift checked the epoch");
        if lift {
            state.lifted = Some((now, reason.to_owned()));
        }
        Ok(state.clone())
    }

    pub fn commit_update(
        &mut self,
        cell_id: &CellId,
        lease_id: LeaseId,
        now: Timestamp,
    ) -> Result<(), ClaimsError> {
        let known = self.lease_record(lease_id);
        let plan = decide::decide_commit(cell_id, lease_id, known.as_ref())?;
        self.apply_end(plan, now);
        Ok(())
    }

    /// A RollbackUpdate; `unrenewed_for` makes it conditional (see `decide::decide_rollback`).
    pub fn rollback_update(
        &mut self,
        cell_id: &CellId,
        lease_id: LeaseId,
        unrenewed_for: Option<Duration>,
        now: Timestamp,
    ) -> Result<(), ClaimsError> {
        let known = self.lease_record(lease_id);
        let plan = decide::decide_rollback(cell_id, lease_id, known.as_ref(), unrenewed_for, now)?;
        self.apply_end(plan, now);
        Ok(())
    }

    fn apply_end(&mut self, plan: EndPlan, now: Timestamp) {
        let EndPlan::Apply(EndWrites {
            lease_id,
            cell_id,
            outcome,
            delete,
            release,
            replace,
        }) = plan
        else {
            return;
        };
        let held = |claim: &Claim| claim.lease.map(|l| l.lease_id) == Some(lease_id);
        for key in delete {
            if self.claims.get(&key).is_some_and(held) {
                self.remove_claim(&key);
            }
        }
        for key in release {
            if let Some(claim) = self.claims.get_mut(&key).filter(|c| held(c)) {
                claim.lease = None;
                claim.updated_at = now;
                self.changed(&key);
            }
        }
        for record in replace {
            if self.claims.get(&record.key).is_some_and(held) {
                self.replace_claim(record, now);
            }
        }
        self.leases.remove(&lease_id);
        self.outcomes.insert(
            lease_id,
            Outcome {
                lease_id,
                cell_id,
                outcome,
                decided_at: now,
            },
        );
    }

    pub fn renew_lease(
        &mut self,
        cell_id: &CellId,
        lease_id: LeaseId,
        now: Timestamp,
    ) -> Result<Lease, ClaimsError> {
        let known = self.lease_record(lease_id);
        decide::decide_renew(cell_id, lease_id, known.as_ref())?;
        let lease = self.leases.get_mut(&lease_id).ok_or_else(|| {
            ClaimsError::internal(format!("lease {lease_id} vanished during renew"))
        })?;
        lease.last_renewed_at = now;
        Ok(lease.clone())
    }

    pub fn list_outstanding_leases(&self, query: &LeasesQuery, now: Timestamp) -> LeasesPage {
        let leases: Vec<Lease> = self
            .leases
            .values()
            .filter(|l| l.cell_id == query.cell_id)
            .filter(|l| query.after.is_none_or(|after| l.lease_id > after))
            .take(query.fetch_limit())
            .cloned()
            .collect();
        pages::leases_page(query, leases, now)
    }

    pub fn list_claims(&self, query: &ClaimsQuery) -> ClaimsPage {
        // The index is ordered as `pages::claims_page_order` within one (cell, table), so a
        // page is a range read: O(log n + page), whatever the number of claims.
        let cursor = &query.cursor;
        let start = match &cursor.after_key {
            Some(key) => Bound::Excluded((
                query.cell_id.clone(),
                query.table_name.clone(),
                cursor.record_id,
                key.clone(),
            )),
            None => {
                let lowest = ClaimKey::lowest();
                Bound::Included((
                    query.cell_id.clone(),
                    query.table_name.clone(),
                    cursor.record_id,
                    lowest,
                ))
            }
        };
        let rows: Vec<Claim> = self
            .by_record
            .range((start, Bound::Unbounded))
            .take_while(|(cell, table, ..)| *cell == query.cell_id && *table == query.table_name)
            .take(query.fetch_limit())
            .filter_map(|(.., key)| self.claims.get(key).cloned())
            .collect();
        pages::claims_page(query, rows)
    }

    /// CreateNamespace (see `ClaimStore::create_namespace`).
    pub fn create_namespace(
        &mut self,
        spec: NamespaceSpec,
        max: usize,
    ) -> Result<StoredNamespace, ClaimsError> {
        let created = resolve::decide_create_namespace(&self.namespaces, spec, max)?;
        self.namespaces = std::mem::take(&mut self.namespaces).with(created.clone());
        Ok(created)
    }

    /// DeleteNamespace (see `ClaimStore::delete_namespace`).
    pub fn delete_namespace(&mut self, id: &str) -> Result<(), ClaimsError> {
        let held = self
            .claims
            .keys()
            .filter(|key| key.namespace.as_str() == id)
            .count() as u64;
        resolve::decide_delete_namespace(&self.namespaces, id, held)?;
        let id = self.namespaces.find(id)?.namespace.id.clone();
        self.namespaces = std::mem::take(&mut self.namespaces).without(&id);
        Ok(())
    }

    /// UpdateNamespace (see `ClaimStore::update_namespace`).
    pub fn update_namespace(
        &mut self,
        id: &str,
        update: NamespaceUpdate,
    ) -> Result<StoredNamespace, ClaimsError> {
        let current = self.namespaces.find(id)?.clone();
        let claims = || {
            Ok::<_, ClaimsError>(
                self.claims
                    .values()
                    .filter(|c| c.record.key.namespace == current.namespace.id)
                    .map(|c| ProofClaim {
                        key: c.record.key.value.clone(),
                        display_value: c.record.display_value().to_owned(),
                        leased: c.lease.is_some(),
                    })
                    .collect(),
            )
        };
        let change = resolve::decide_rules_change(&current, update, claims)??;
        self.rekey(&current.namespace.id, &change.rekeys);
        self.namespaces = std::mem::take(&mut self.namespaces).with(change.next.clone());
        Ok(change.next)
    }

    /// Moves each claim of `rekeys` to its new key; it keeps its display form.
    pub fn rekey(&mut self, namespace: &NamespaceId, rekeys: &[Rekey]) {
        let moved: Vec<Claim> = rekeys
            .iter()
            .filter_map(|change| {
                let old = ClaimKey {
                    namespace: namespace.clone(),
                    value: change.old_key.clone(),
                };
                let mut claim = self.claims.get(&old)?.clone();
                self.remove_claim(&old);
                let shown = claim.record.display_value().to_owned();
                claim.record.display = (shown != change.new_key).then_some(shown);
                claim.record.key.value = change.new_key.clone();
                Some(claim)
            })
            .collect();
        for claim in moved {
            self.insert_claim(claim);
        }
    }

    /// LookupClaim of `key` as sent: found by any form that has its key.
    pub fn lookup_claim(&self, key: &ClaimKey) -> Result<Claim, ClaimsError> {
        let key = resolve::resolve_key(key, &self.namespaces, "claim_value")?;
        self.claims
            .get(&key)
            .cloned()
            .ok_or(ClaimsError::ClaimNotFound { claim: key })
    }

    /// Takes or renews a verification slot (see `ClaimStore::acquire_verification_slot`).
    pub fn acquire_verification_slot(
        &mut self,
        holder: &SlotHolder,
        limit: SlotLimit,
        now: Timestamp,
    ) -> Result<SlotGrant, ClaimsError> {
        let rows: Vec<SlotRow> = self
            .slots
            .iter()
            .map(|(holder, expires_at)| SlotRow {
                holder: holder.clone(),
                expires_at: *expires_at,
            })
            .collect();
        let plan = slots::decide_acquire(&rows, holder, limit, now)?;
        for expired in &plan.expired {
            self.slots.remove(expired);
        }
        self.slots
            .insert(plan.grant.holder.clone(), plan.grant.expires_at);
        Ok(plan.grant)
    }

    /// Releases `holder`'s slot; `false` when it had none.
    pub fn release_verification_slot(&mut self, holder: &SlotHolder) -> bool {
        let row = self.slots.get(holder).map(|expires_at| SlotRow {
            holder: holder.clone(),
            expires_at: *expires_at,
        });
        let release = slots::decide_release(row.as_ref(), holder);
        if release {
            self.slots.remove(holder);
        }
        release
    }

    /// Forgets outcomes older than `retention`; returns how many.
    pub fn collect_outcomes(&mut self, now: Timestamp, retention: Duration) -> u64 {
        let before = self.outcomes.len();
        self.outcomes
            .retain(|_, o| !decide::outcome_expired(o.decided_at, now, retention));
        (before - self.outcomes.len()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::types::{ClaimType, ClaimsCursor, OwnerType};
    use proptest::prelude::*;

    /// ListClaims as a full scan: every claim of the cell and table after the cursor, in page
    /// order (what the index must reproduce).
    fn scanned_page(tables: &Tables, query: &ClaimsQuery) -> ClaimsPage {
        let mut rows: Vec<Claim> = tables
            .claims
            .values()
            .filter(|c| c.cell_id == query.cell_id && c.record.table_name == query.table_name)
            .filter(|c| {
                let (id, claim_type, value) = query.cursor.start_after();
                let key = &c.record.key;
                (
                    c.record.table_record_id,
                    key.namespace_number(),
                    key.value.as_str(),
                ) > (id, claim_type, value)
            })
            .cloned()
            .collect();
        rows.sort_by(pages::claims_page_order);
        rows.truncate(query.fetch_limit());
        pages::claims_page(query, rows)
    }

    fn record(table: u8, id: i64, claim_type: u8, value: u8) -> ClaimRecord {
        ClaimRecord {
            display: None,
            key: ClaimKey::new(
                ClaimType::ALL[usize::from(claim_type) % ClaimType::ALL.len()],
                format!("v{value}"),
            ),
            owner_type: OwnerType::USER,
            owner_value: "o".into(),
            table_name: TableName::ALL[usize::from(table) % TableName::ALL.len()].clone(),
            table_record_id: id,
        }
    }

    proptest! {
        /// Random begins (two cells, creates and destroys), some committed, some rolled back;
        /// then every (cell, table) is paged to its end with random limits: the indexed pages
        /// equal the scanned ones.
        #[test]
        fn indexed_pages_equal_a_full_scan(
            batches in prop::collection::vec(
                (any::<bool>(), prop::collection::vec((0u8..3, 0i64..6, 0u8..3, 0u8..12), 1..4), 0u8..3),
                1..40,
            ),
            limits in prop::collection::vec(1usize..5, 1..4),
        ) {
            let mut tables = Tables::default();
            let cells = [CellId::parse("c1").unwrap(), CellId::parse("c2").unwrap()];
            for (n, (second, claims, end)) in batches.into_iter().enumerate() {
                let cell = &cells[usize::from(second)];
                let records: Vec<ClaimRecord> =
                    claims.into_iter().map(|(t, id, ct, v)| record(t, id, ct, v)).collect();
                // Creates, destroys and updates (which move a claim to another table and id).
                let (mut creates, mut destroys, mut updates) = (Vec::new(), Vec::new(), Vec::new());
                match n % 4 {
                    2 => destroys = records,
                    3 => {
                        updates = records
                            .into_iter()
                            .map(|r| ClaimRecord {
                                display: None,
                                table_name: TableName::ALL[(r.table_name.number() as usize) % 3].clone(),
                                table_record_id: r.table_record_id + 1,
                                ..r
                            })
                            .collect()
                    }
                    _ => creates = records,
                }
                let request = BeginUpdate { local_transaction: None,
                    cell_id: cell.clone(),
                    lease_id: None,
                    creates,
                    destroys,
                    updates,
                };
                let id = LeaseId::from_uuid(uuid::Uuid::from_u128(n as u128 + 1));
                let now = Timestamp::from_unix_micros(n as i64);
                if tables.begin_update(request, id, now).is_ok() {
                    let _ = match end {
                        0 => tables.commit_update(cell, id, now),
                        1 => tables.rollback_update(cell, id, None, now),
                        _ => Ok(()),
                    };
                }
            }
            for cell in &cells {
                for table in TableName::ALL {
                    let mut cursor = ClaimsCursor::at(0);
                    for step in 0..100 {
                        let query = ClaimsQuery {
                            cell_id: cell.clone(),
                            table_name: table.clone(),
                            cursor: cursor.clone(),
                            limit: limits[step % limits.len()],
                            max_bytes: crate::domain::DEFAULT_MAX_RESPONSE_BYTES,
                        };
                        let page = tables.list_claims(&query);
                        prop_assert_eq!(&page, &scanned_page(&tables, &query));
                        match page.next_cursor {
                            Some(next) => cursor = next,
                            None => break,
                        }
                    }
                }
            }
        }
    }
}

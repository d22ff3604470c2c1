//! The whole protocol state as plain in-memory tables, with every operation written in terms of
//! the decisions in [`super::decide`]. It is the reference semantics: the in-memory store wraps
//! it in a mutex, and the model-based property suite runs it beside every adapter.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::domain::decide::{self, BeginPlan, ClaimsPagePlan, EndPlan, EndWrites};
use crate::domain::types::{
    BeginUpdate, CellId, Claim, ClaimKey, ClaimLease, ClaimsPage, ClaimsQuery, Lease, LeaseId,
    LeaseOp, LeaseRecord, LeasesPage, LeasesQuery, Outcome, Timestamp,
};
use crate::error::ClaimsError;

/// The three tables of the service: claims (one row per key), outstanding leases, and the
/// remembered outcomes of ended leases.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tables {
    pub claims: BTreeMap<ClaimKey, Claim>,
    pub leases: BTreeMap<LeaseId, Lease>,
    pub outcomes: BTreeMap<LeaseId, Outcome>,
}

impl Tables {
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
        decide::check_batch(&request, usize::MAX)?;
        let lease_id = request.lease_id.unwrap_or(fresh_id);
        let current: BTreeMap<ClaimKey, Claim> = request
            .operations()
            .filter_map(|(_, r)| self.claims.get(&r.key).map(|c| (r.key.clone(), c.clone())))
            .collect();
        let known = self.lease_record(lease_id);
        match decide::decide_begin(&request, lease_id, known.as_ref(), &current)? {
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
                    };
                    self.claims.insert(claim.record.key.clone(), claim);
                }
                for key in writes.marks {
                    if let Some(claim) = self.claims.get_mut(&key) {
                        claim.lease = Some(ClaimLease {
                            lease_id,
                            op: LeaseOp::Destroy,
                        });
                        claim.updated_at = now;
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

    pub fn rollback_update(
        &mut self,
        cell_id: &CellId,
        lease_id: LeaseId,
        now: Timestamp,
    ) -> Result<(), ClaimsError> {
        let known = self.lease_record(lease_id);
        let plan = decide::decide_rollback(cell_id, lease_id, known.as_ref())?;
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
        }) = plan
        else {
            return;
        };
        let held = |claim: &Claim| claim.lease.map(|l| l.lease_id) == Some(lease_id);
        for key in delete {
            if self.claims.get(&key).is_some_and(held) {
                self.claims.remove(&key);
            }
        }
        for key in release {
            if let Some(claim) = self.claims.get_mut(&key).filter(|c| held(c)) {
                claim.lease = None;
                claim.updated_at = now;
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
            .take(query.limit.saturating_add(1))
            .cloned()
            .collect();
        decide::leases_page(leases, query.limit, now)
    }

    pub fn list_claims(&self, query: &ClaimsQuery) -> ClaimsPage {
        let mut rows: Vec<Claim> = self
            .claims
            .values()
            .filter(|c| c.cell_id == query.cell_id && c.record.table_name == query.table_name)
            .filter(|c| c.record.table_record_id >= query.cursor)
            .cloned()
            .collect();
        rows.sort_by(decide::claims_page_order);
        let first = &rows[..rows.len().min(query.limit.max(1).saturating_add(1))];
        match decide::plan_claims_page(query.cursor, query.limit, first) {
            ClaimsPagePlan::Done(page) => page,
            ClaimsPagePlan::NeedBoundary { boundary } => {
                let at = |c: &&Claim| c.record.table_record_id == boundary;
                let boundary_claims = rows.iter().filter(at).cloned().collect();
                let more_after = rows.iter().any(|c| c.record.table_record_id > boundary);
                decide::finish_claims_page(
                    query.cursor,
                    first,
                    boundary,
                    boundary_claims,
                    more_after,
                )
            }
        }
    }

    pub fn lookup_claim(&self, key: &ClaimKey) -> Result<Claim, ClaimsError> {
        self.claims
            .get(key)
            .cloned()
            .ok_or_else(|| ClaimsError::ClaimNotFound { claim: key.clone() })
    }

    /// Forgets outcomes older than `retention`; returns how many.
    pub fn collect_outcomes(&mut self, now: Timestamp, retention: Duration) -> u64 {
        let before = self.outcomes.len();
        self.outcomes
            .retain(|_, o| !decide::outcome_expired(o.decided_at, now, retention));
        (before - self.outcomes.len()) as u64
    }
}

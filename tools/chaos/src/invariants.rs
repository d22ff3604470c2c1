//! Checker (1): the state after healing. Once faults stopped and every cell's reconciler ran
//! once past the staleness threshold:
//! - no claim has two owners (no key is recorded locally by two cells);
//! - every locally committed record's claim is held, committed, by its cell;
//! - no claim exists without the local record of the cell that holds it;
//! - no lease is outstanding on the service and no row is left in any `leases_outstanding`;
//! - no lease was reported lost (local commit after the service rolled the lease back);
//! - no lease whose BeginUpdate a cell saw succeed is unknown to the service at the end (its
//!   probe: LEASE_NOT_FOUND), except across a store restore;
//! - no verifier freed a claim whose record its cell had committed before the correction began,
//!   and every correction a verifier committed is explained by drift the campaign injected;
//! - after healing, a verify pass of each cell finds nothing but the drift the campaign injected
//!   (local changes outside the protocol), and the pass after it finds nothing at all;
//! - in the deterministic sweep, the lease of a transaction that crashed inside its open local
//!   transaction and named it (`local_transaction`) was freed sooner than the staleness
//!   threshold: by the reconciler's early rollback of an aborted transaction, not the fallback.
//!
//! Owns these rules over plain data gathered by the campaign. Must not do I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use topology_claims::{ClaimState, LeaseId, LeaseOp};

/// What the campaign read back after healing.
#[derive(Clone, Debug, Default)]
pub struct FinalState {
    /// Every key of the key space: the service's claim (holder, state), or `None`.
    pub claims: BTreeMap<u32, Option<(u16, ClaimState)>>,
    /// Per cell: the keys of its committed local records.
    pub local_records: Vec<BTreeSet<u32>>,
    /// Per cell: rows left in its `leases_outstanding`.
    pub local_lease_rows: Vec<usize>,
    /// Per cell: leases still outstanding on the service.
    pub outstanding_leases: Vec<usize>,
    /// Leases whose claims were lost (reported by a cell's CommitUpdate or a reconciler).
    pub lost: Vec<(u16, LeaseId)>,
    /// Leases a cell saw taken (BeginUpdate answered OK) that the service did not know after
    /// healing: (cell, key, lease).
    pub forgotten: Vec<(u16, u32, LeaseId)>,
    /// Destroys a verifier committed of a claim its cell's committed record held: (cell, key,
    /// the correction's lease).
    pub verifier_freed_held: Vec<(u16, u32, LeaseId)>,
    /// Corrections a verifier committed on keys the campaign never drifted: (cell, key, kind,
    /// the correction's lease).
    pub unexplained_corrections: Vec<(u16, u32, LeaseOp, LeaseId)>,
    /// What the first verify pass after healing corrected that no drift explains.
    pub unexplained_repairs: Vec<String>,
    /// Per cell with a verifier: the discrepancies its final verify pass found, or why the
    /// pass failed.
    pub final_verify: Vec<(u16, Result<Vec<String>, String>)>,
    /// Leases of the sweep's crashes inside a named local transaction that were not seen freed
    /// within `recovery_bound`: (cell, lease, time to free if seen).
    pub slow_recoveries: Vec<(u16, LeaseId, Option<Duration>)>,
    pub recovery_bound: Duration,
}

/// One broken rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub rule: &'static str,
    /// The key concerned, if any (its history is printed with the violation).
    pub key: Option<u32>,
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.key {
            Some(key) => write!(f, "{} (k{key}): {}", self.rule, self.detail),
            None => write!(f, "{}: {}", self.rule, self.detail),
        }
    }
}

pub fn check(state: &FinalState) -> Vec<Violation> {
    let mut violations = Vec::new();
    let mut owners: BTreeMap<u32, Vec<u16>> = BTreeMap::new();
    for (cell, keys) in state.local_records.iter().enumerate() {
        for &key in keys {
            owners.entry(key).or_default().push(cell as u16);
        }
    }
    for (&key, cells) in &owners {
        if cells.len() > 1 {
            violations.push(Violation {
                rule: "claim with two owners",
                key: Some(key),
                detail: format!("recorded locally by cells {cells:?}"),
            });
        }
        for &cell in cells {
            match state.claims.get(&key).copied().flatten() {
                Some((holder, ClaimState::Active)) if holder == cell => {}
                other => violations.push(Violation {
                    rule: "local record without its claim",
                    key: Some(key),
                    detail: format!("cell c{cell:02} has the record; the service has {other:?}"),
                }),
            }
        }
    }
    for (&key, claim) in &state.claims {
        let Some((holder, claim_state)) = claim else {
            continue;
        };
        let recorded = state
            .local_records
            .get(usize::from(*holder))
            .is_some_and(|keys| keys.contains(&key));
        if !recorded {
            violations.push(Violation {
                rule: "claim without a local record",
                key: Some(key),
                detail: format!(
                    "held by c{holder:02} ({}), which has no record of it",
                    claim_state.name()
                ),
            });
        }
        if *claim_state != ClaimState::Active {
            violations.push(Violation {
                rule: "claim still leased",
                key: Some(key),
                detail: format!("c{holder:02} {}", claim_state.name()),
            });
        }
    }
    for (cell, &n) in state.outstanding_leases.iter().enumerate() {
        if n > 0 {
            violations.push(Violation {
                rule: "outstanding lease left",
                key: None,
                detail: format!("cell c{cell:02} has {n} outstanding on the service"),
            });
        }
    }
    for (cell, &n) in state.local_lease_rows.iter().enumerate() {
        if n > 0 {
            violations.push(Violation {
                rule: "local lease row left",
                key: None,
                detail: format!("cell c{cell:02} has {n} rows in leases_outstanding"),
            });
        }
    }
    for (cell, lease) in &state.lost {
        violations.push(Violation {
            rule: "claims lost",
            key: None,
            detail: format!(
                "cell c{cell:02} lease {lease}: committed locally, rolled back by the service"
            ),
        });
    }
    for &(cell, key, lease) in &state.forgotten {
        violations.push(Violation {
            rule: "lease forgotten by the service",
            key: Some(key),
            detail: format!(
                "cell c{cell:02} lease {lease}: BeginUpdate answered OK, the final probe found no such lease"
            ),
        });
    }
    for &(cell, key, lease) in &state.verifier_freed_held {
        violations.push(Violation {
            rule: "verifier freed a held claim",
            key: Some(key),
            detail: format!(
                "cell c{cell:02}'s verifier destroyed it (lease {lease}) while the cell's committed record held it"
            ),
        });
    }
    for &(cell, key, op, lease) in &state.unexplained_corrections {
        violations.push(Violation {
            rule: "verifier correction no drift explains",
            key: Some(key),
            detail: format!(
                "cell c{cell:02}'s verifier committed a{} {} (lease {lease}): records and claims had parted without drift",
                if op == LeaseOp::Update { "n" } else { "" },
                match op {
                    LeaseOp::Create => "create",
                    LeaseOp::Destroy => "destroy",
                    LeaseOp::Update => "update",
                }
            ),
        });
    }
    for found in &state.unexplained_repairs {
        violations.push(Violation {
            rule: "discrepancy after healing that is not injected drift",
            key: None,
            detail: found.clone(),
        });
    }
    for (cell, pass) in &state.final_verify {
        let detail = match pass {
            Ok(found) if found.is_empty() => continue,
            Ok(found) => format!(
                "cell c{cell:02}: {} discrepancies: {}",
                found.len(),
                found.join("; ")
            ),
            Err(error) => format!("cell c{cell:02}: the pass did not finish: {error}"),
        };
        violations.push(Violation {
            rule: "final verify pass not clean",
            key: None,
            detail,
        });
    }
    for (cell, lease, freed) in &state.slow_recoveries {
        let bound = state.recovery_bound;
        violations.push(Violation {
            rule: "aborted local transaction's lease not freed early",
            key: None,
            detail: match freed {
                Some(t) => format!("cell c{cell:02}: lease {lease} freed after {t:?}, not within {bound:?}"),
                None => format!("cell c{cell:02}: lease {lease} not freed before the final passes (bound {bound:?})"),
            },
        });
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> FinalState {
        FinalState {
            claims: [(1, Some((0, ClaimState::Active))), (2, None)].into(),
            local_records: vec![[1].into(), BTreeSet::new()],
            local_lease_rows: vec![0, 0],
            outstanding_leases: vec![0, 0],
            lost: vec![],
            forgotten: vec![],
            verifier_freed_held: vec![],
            unexplained_corrections: vec![],
            unexplained_repairs: vec![],
            final_verify: vec![(0, Ok(vec![])), (1, Ok(vec![]))],
            slow_recoveries: vec![],
            recovery_bound: Duration::from_secs(2),
        }
    }

    #[test]
    fn a_healed_state_has_no_violation() {
        assert_eq!(check(&healthy()), vec![]);
    }

    #[test]
    fn each_rule_is_enforced() {
        let mut two_owners = healthy();
        two_owners.local_records[1].insert(1);
        let rules = |s: &FinalState| check(s).iter().map(|v| v.rule).collect::<Vec<_>>();
        assert!(rules(&two_owners).contains(&"claim with two owners"));

        let mut orphan = healthy();
        orphan.claims.insert(2, Some((1, ClaimState::Active)));
        assert_eq!(rules(&orphan), ["claim without a local record"]);

        let mut missing = healthy();
        missing.claims.insert(1, None);
        assert_eq!(rules(&missing), ["local record without its claim"]);

        let mut leased = healthy();
        leased.claims.insert(1, Some((0, ClaimState::Creating)));
        assert!(rules(&leased).contains(&"claim still leased"));

        let mut leftovers = healthy();
        leftovers.outstanding_leases[1] = 2;
        leftovers.local_lease_rows[0] = 1;
        leftovers.lost.push((0, LeaseId::generate()));
        leftovers.forgotten.push((1, 2, LeaseId::generate()));
        leftovers
            .verifier_freed_held
            .push((0, 1, LeaseId::generate()));
        leftovers.final_verify[1].1 = Ok(vec!["extra    k2".into()]);
        leftovers.final_verify[0].1 = Err("store unavailable".into());
        leftovers
            .slow_recoveries
            .push((1, LeaseId::generate(), Some(Duration::from_secs(3))));
        leftovers.unexplained_repairs.push("c00: missing k3".into());
        leftovers
            .unexplained_corrections
            .push((1, 3, LeaseOp::Create, LeaseId::generate()));
        assert_eq!(
            rules(&leftovers),
            [
                "outstanding lease left",
                "local lease row left",
                "claims lost",
                "lease forgotten by the service",
                "verifier freed a held claim",
                "verifier correction no drift explains",
                "discrepancy after healing that is not injected drift",
                "final verify pass not clean",
                "final verify pass not clean",
                "aborted local transaction's lease not freed early"
            ]
        );
    }
}

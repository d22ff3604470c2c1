//! The checkers after a `store-restore` (restore.rs). A restore breaks linearizability by
//! design: claims committed or destroyed after the backup are undone, outcomes forgotten. So:
//!
//! - **Touched leases and keys.** A lease the restore may have changed is *uncertain*: one listed
//!   outstanding just before the backup, or one whose BeginUpdate may have taken effect after the
//!   listing began (it returned after it, or never returned and was sent within [`SLACK`] of
//!   it, or after) and was sent before the cells were let back in. Every other lease had ended, or
//!   never existed, when the listing began, and the backup holds its fate. The keys of uncertain
//!   leases are *touched*; on every other key the store was the same at the restore as at the
//!   backup.
//! - **Linearizability.** Untouched keys are checked on their whole history, as without a
//!   restore. Touched keys are checked on their history before the backup (the `cut`): calls
//!   that had not returned by then count as unknown, uncertain leases lose their inferred
//!   endings and final probes (the restored store's word on them is not the history's), the
//!   others keep them. What touched keys did after the backup is judged by the invariants below.
//! - **Corrections.** A verifier's correction of a touched key begun after the listing, and a
//!   discrepancy of a touched key in the first pass after healing, are explained by the restore
//!   (as drift explains others).
//! - **The restore's invariants**, at the end: no key is held by the committed local records of
//!   two cells, and every record's claim is its cell's (checker 1's rules, over every key); no
//!   lease that created a record a cell still holds ended rolled back (a commit undone; the
//!   campaign's "claims lost" tally still counts CommitUpdates answered LEASE_ROLLED_BACK); the
//!   quarantine was lifted, every cell having reported its pass.
//!
//! Owns these rules over plain data. Must not do I/O.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use topology_claims::domain::RestoreView;
use topology_claims::LeaseId;

use crate::history::{Answer, Call, ErrorKind, Event};
use crate::invariants::Violation;
use crate::linearizability;
use crate::restore::Window;
use crate::verify::Committed;

/// How long after it was sent a BeginUpdate whose answer was lost may still take effect (the
/// cells' deadline is 0.75 s per attempt, 4 attempts).
pub const SLACK: u64 = 10_000_000;

/// The leases the restore may have changed (see the module doc).
pub fn uncertain_leases(events: &[Event], window: &Window) -> BTreeSet<LeaseId> {
    // With no listing, a lease counts as ended before it only if a client saw it end.
    let ended_before: BTreeSet<LeaseId> = events
        .iter()
        .filter_map(|e| match (e.call, e.answer, e.ret) {
            (Call::Commit { lease, .. } | Call::Rollback { lease, .. }, Answer::Ok, Some(ret))
                if ret < window.listed_from =>
            {
                Some(lease)
            }
            _ => None,
        })
        .collect();
    events
        .iter()
        .filter_map(|e| {
            let Call::Begin { lease, .. } = e.call else {
                return None;
            };
            let refused =
                matches!(e.answer, Answer::Err(kind) if kind != ErrorKind::RestoreQuarantine);
            if refused || e.invoke > window.restored {
                return None;
            }
            let answered = matches!(e.answer, Answer::Ok | Answer::Err(_));
            let late = match (answered, e.ret) {
                (true, Some(ret)) => ret >= window.listed_from,
                _ => e.invoke.saturating_add(SLACK) >= window.listed_from,
            };
            let outstanding = match &window.listed {
                Some(listed) => listed.contains(&lease),
                None => !ended_before.contains(&lease),
            };
            (late || outstanding).then_some(lease)
        })
        .collect()
}

/// The keys of `uncertain` leases.
pub fn touched_keys(events: &[Event], uncertain: &BTreeSet<LeaseId>) -> BTreeSet<u32> {
    events
        .iter()
        .filter(|e| matches!(e.call, Call::Begin { .. }))
        .filter(|e| e.call.lease().is_some_and(|l| uncertain.contains(&l)))
        .map(|e| e.call.key())
        .collect()
}

/// The per-key histories to check for linearizability (see the module doc).
pub fn per_key(
    events: &[Event],
    window: &Window,
    uncertain: &BTreeSet<LeaseId>,
    touched: &BTreeSet<u32>,
) -> BTreeMap<u32, Vec<Event>> {
    let whole: Vec<Event> = events
        .iter()
        .filter(|e| !touched.contains(&e.call.key()))
        .copied()
        .collect();
    let cut = window.cut;
    let begun_before: BTreeSet<LeaseId> = events
        .iter()
        .filter(|e| matches!(e.call, Call::Begin { .. }) && e.invoke < cut)
        .filter_map(|e| e.call.lease())
        .collect();
    let prefix: Vec<Event> = events
        .iter()
        .filter(|e| touched.contains(&e.call.key()))
        .filter_map(|e| {
            let uncertain = e.call.lease().is_some_and(|l| uncertain.contains(&l));
            let begun_before = e.call.lease().is_some_and(|l| begun_before.contains(&l));
            match e.call {
                Call::Probe { .. } if uncertain || !begun_before => None,
                Call::Ghost { .. } if !begun_before => None,
                // An uncertain lease may have ended before the cut (its cell's reconciler, say)
                // or after it (a verifier, after the restore): its end may or may not have
                // taken effect by the cut, like a call still running there.
                Call::Ghost { .. } if uncertain => Some(Event {
                    answer: Answer::Unknown,
                    ret: None,
                    ..*e
                }),
                // The fate of a lease that had ended by the cut: read at the cut.
                Call::Probe { .. } => Some(Event {
                    invoke: cut + 1,
                    ret: Some(cut + 1),
                    ..*e
                }),
                // It ended before the cut (not outstanding at the listing).
                Call::Ghost { .. } => Some(Event {
                    ret: e.ret.map(|r| r.min(cut)),
                    ..*e
                }),
                _ if e.invoke >= cut => None,
                _ if e.ret.is_none_or(|r| r > cut) => Some(Event {
                    answer: Answer::Unknown,
                    ret: None,
                    ..*e
                }),
                _ => Some(*e),
            }
        })
        .collect();
    let mut keys = linearizability::by_key(&linearizability::simplify(&whole));
    keys.extend(linearizability::by_key(&linearizability::simplify(&prefix)));
    keys
}

/// `committed` without the corrections the restore explains: on touched keys, begun after the
/// listing.
pub fn not_explained_by_restore(
    committed: &[Committed],
    window: &Window,
    touched: &BTreeSet<u32>,
) -> Vec<Committed> {
    committed
        .iter()
        .filter(|c| !(touched.contains(&c.key) && c.begun_at >= window.listed_from))
        .cloned()
        .collect()
}

/// `drifted` plus every cell's record of every touched key.
pub fn with_touched(
    drifted: &BTreeSet<(u16, u32)>,
    touched: &BTreeSet<u32>,
    cells: u16,
) -> BTreeSet<(u16, u32)> {
    let mut explained = drifted.clone();
    for &key in touched {
        explained.extend((0..cells).map(|cell| (cell, key)));
    }
    explained
}

/// No lease that created a record a cell holds at the end ended rolled back. `records`: per
/// cell, each record's key and the lease that created it; `events`: with the final probes.
pub fn committed_leases_kept(
    records: &[(u16, BTreeMap<u32, LeaseId>)],
    events: &[Event],
) -> Vec<Violation> {
    let fate: HashMap<LeaseId, Answer> = events
        .iter()
        .filter_map(|e| match e.call {
            Call::Probe { lease, .. } => Some((lease, e.answer)),
            _ => None,
        })
        .collect();
    let mut violations = Vec::new();
    for (cell, keys) in records {
        for (&key, lease) in keys {
            if fate.get(lease) == Some(&Answer::Err(ErrorKind::LeaseRolledBack)) {
                violations.push(Violation {
                    rule: "committed lease rolled back",
                    key: Some(key),
                    detail: format!(
                        "cell c{cell:02}'s record of k{key} was committed locally by lease {lease}, which the service ended rolled back"
                    ),
                });
            }
        }
    }
    violations
}

/// The quarantine of the campaign's restore was lifted: `views` is each cell's
/// ListOutstandingLeases `restore` at the end.
pub fn quarantine_lifted(views: &[(u16, Option<RestoreView>)]) -> Vec<Violation> {
    let missing: Vec<String> = views
        .iter()
        .filter(|(_, view)| view.is_none())
        .map(|(cell, _)| format!("c{cell:02}"))
        .collect();
    if !missing.is_empty() {
        return vec![Violation {
            rule: "restore epoch missing",
            key: None,
            detail: format!(
                "the store was marked restored, but cells {} are told of no restore",
                missing.join(", ")
            ),
        }];
    }
    let quarantined = views
        .iter()
        .any(|(_, view)| view.as_ref().is_some_and(|v| v.quarantined));
    if !quarantined {
        return Vec::new();
    }
    let pending: Vec<String> = views
        .iter()
        .filter(|(_, view)| view.as_ref().is_some_and(|v| !v.reported))
        .map(|(cell, _)| format!("c{cell:02}"))
        .collect();
    vec![Violation {
        rule: "restore quarantine not lifted",
        key: None,
        detail: format!(
            "after the final verify passes; cells that have not reported a pass: {}",
            if pending.is_empty() {
                "none (yet quarantined)".to_owned()
            } else {
                pending.join(", ")
            }
        ),
    }]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::TxOp;
    use topology_claims::Timestamp;

    fn window(listed: Option<BTreeSet<LeaseId>>) -> Window {
        Window {
            listed_from: 100_000_000,
            cut: 100_100_000,
            listed,
            restored: 200_000_000,
            backup_time: String::new(),
            transactions_before: 0,
            transactions_between: 0,
            outage: std::time::Duration::ZERO,
            mark: String::new(),
        }
    }

    fn event(call: Call, invoke: u64, ret: Option<u64>, answer: Answer) -> Event {
        Event {
            id: 0,
            cell: 0,
            call,
            invoke,
            ret,
            answer,
        }
    }

    fn begin(lease: LeaseId, key: u32, invoke: u64, answer: Answer) -> Event {
        let op = TxOp::Create;
        let ret = (answer != Answer::Unknown).then_some(invoke + 1000);
        event(Call::Begin { lease, op, key }, invoke, ret, answer)
    }

    #[test]
    fn leases_ended_before_the_listing_are_certain_and_the_others_touch_their_keys() {
        let ids: Vec<LeaseId> = (0..6).map(|_| LeaseId::generate()).collect();
        let events = [
            begin(ids[0], 0, 1_000, Answer::Ok),           // ended before
            begin(ids[1], 1, 2_000, Answer::Ok),           // listed: outstanding
            begin(ids[2], 2, 150_000_000, Answer::Ok),     // between backup and restore
            begin(ids[3], 3, 99_000_000, Answer::Unknown), // may land after the listing
            begin(ids[4], 4, 150_000_000, Answer::Err(ErrorKind::ClaimTaken)), // refused
            begin(ids[5], 5, 250_000_000, Answer::Ok),     // after the restore
        ];
        let listed = BTreeSet::from([ids[1]]);
        let uncertain = uncertain_leases(&events, &window(Some(listed)));
        assert_eq!(uncertain, BTreeSet::from([ids[1], ids[2], ids[3]]));
        assert_eq!(touched_keys(&events, &uncertain), BTreeSet::from([1, 2, 3]));

        // Without a listing, only a lease seen to end before it is certain.
        let ended = event(
            Call::Commit {
                lease: ids[0],
                key: 0,
            },
            3_000,
            Some(4_000),
            Answer::Ok,
        );
        let mut with_end = events.to_vec();
        with_end.push(ended);
        let uncertain = uncertain_leases(&with_end, &window(None));
        assert_eq!(uncertain, BTreeSet::from([ids[1], ids[2], ids[3]]));
    }

    #[test]
    fn a_touched_key_is_checked_up_to_the_cut_and_an_untouched_one_whole() {
        let (a, b) = (LeaseId::generate(), LeaseId::generate());
        let events = [
            begin(a, 1, 1_000, Answer::Ok),
            event(
                Call::Commit { lease: a, key: 1 },
                3_000,
                Some(4_000),
                Answer::Ok,
            ),
            begin(b, 1, 150_000_000, Answer::Ok),
            event(
                Call::Commit { lease: b, key: 1 },
                151_000_000,
                Some(151_001_000),
                Answer::Ok,
            ),
            event(
                Call::Lookup { key: 2 },
                250_000_000,
                Some(250_001_000),
                Answer::Err(ErrorKind::ClaimNotFound),
            ),
            event(
                Call::Probe { lease: b, key: 1 },
                300_000_000,
                Some(300_001_000),
                Answer::Err(ErrorKind::LeaseNotFound),
            ),
        ];
        let w = window(Some(BTreeSet::new()));
        let uncertain = uncertain_leases(&events, &w);
        let touched = touched_keys(&events, &uncertain);
        assert_eq!(touched, BTreeSet::from([1]));
        let keys = per_key(&events, &w, &uncertain, &touched);
        assert_eq!(keys[&1].len(), 2, "k1 before the cut: a's begin and commit");
        assert_eq!(keys[&2].len(), 1);
    }

    /// The campaign of seed 20261127 (private-postgres): a create with an unknown answer took
    /// effect, its cell's reconciler rolled it back before the backup, and other cells saw it
    /// leased, then gone. The lease is uncertain (its begin might have landed after the
    /// listing), so its ghost rollback must stay, as a call that may or may not have taken
    /// effect by the cut: dropping it made the history before the cut unexplainable.
    #[test]
    fn an_uncertain_leases_ghost_stays_as_a_maybe_before_the_cut() {
        let (lost, seen) = (LeaseId::generate(), LeaseId::generate());
        let events = [
            begin(lost, 4, 95_000_000, Answer::Unknown),
            begin(seen, 4, 96_000_000, Answer::Err(ErrorKind::ClaimLeased)),
            event(
                Call::Ghost {
                    lease: lost,
                    key: 4,
                    committed: false,
                },
                95_000_000,
                Some(300_000_000),
                Answer::Ok,
            ),
        ];
        let w = window(Some(BTreeSet::new()));
        let uncertain = uncertain_leases(&events, &w);
        assert!(
            uncertain.contains(&lost),
            "may have landed after the listing"
        );
        let touched = touched_keys(&events, &uncertain);
        let keys = per_key(&events, &w, &uncertain, &touched);
        let ghost = keys[&4]
            .iter()
            .find(|e| matches!(e.call, Call::Ghost { .. }))
            .expect("the ghost of an uncertain lease is kept");
        assert_eq!((ghost.answer, ghost.ret), (Answer::Unknown, None));
    }

    #[test]
    fn a_record_whose_creating_lease_ended_rolled_back_is_a_violation() {
        let (kept, undone) = (LeaseId::generate(), LeaseId::generate());
        let probe = |lease, answer| {
            event(
                Call::Probe { lease, key: 0 },
                1,
                Some(2),
                Answer::Err(answer),
            )
        };
        let events = [
            probe(kept, ErrorKind::LeaseCommitted),
            probe(undone, ErrorKind::LeaseRolledBack),
        ];
        let records = [(3, BTreeMap::from([(1, kept), (2, undone)]))];
        let violations = committed_leases_kept(&records, &events);
        assert_eq!(violations.len(), 1);
        assert_eq!(violations[0].key, Some(2));
        assert!(violations[0].detail.contains(&undone.to_string()));
    }

    #[test]
    fn the_quarantine_must_be_lifted_and_every_cell_told() {
        let view = |quarantined, reported| RestoreView {
            epoch: 1,
            backup_time: Timestamp::from_unix_micros(1),
            marked_at: Timestamp::from_unix_micros(2),
            quarantined,
            reported,
        };
        assert!(quarantine_lifted(&[(0, Some(view(false, true)))]).is_empty());
        let pending =
            quarantine_lifted(&[(0, Some(view(true, true))), (1, Some(view(true, false)))]);
        assert_eq!(pending[0].rule, "restore quarantine not lifted");
        assert!(pending[0].detail.contains("c01"));
        assert_eq!(
            quarantine_lifted(&[(0, None)])[0].rule,
            "restore epoch missing"
        );
    }
}

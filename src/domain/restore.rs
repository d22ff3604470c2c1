//! Restores: the rules that keep a claims store restored from a backup from handing a lost claim
//! to another cell, or rolling back what a cell committed (issue 26, decision 100).
//!
//! After a restore the operator records a *restore epoch* (`admin mark-restored`): the backup's
//! time, the store's clock at the mark, a reason, and the cells that must re-verify (every cell
//! with claims or outstanding leases in the restored store, plus any the operator names). While
//! the epoch is *quarantined* (some expected cell has not reported a whole verification pass and
//! nobody lifted it), a create of a claim that does not exist is refused with
//! `RESTORE_QUARANTINE`, unless it is a verifier's correction: such a name may be a claim the
//! restore lost, which its owner's verifier is about to re-create.
//!
//! A lease that was outstanding when the restore was marked (its `created_at` is not after
//! `marked_at`) may have been committed by its cell after the backup, and the cell then deleted
//! its local row: staleness proves nothing about it. The reconciler commits it when the local row
//! exists or its local transaction committed, rolls it back when the transaction aborted, and
//! otherwise leaves it to the verifier, which decides from the local records
//! ([`decide_restored_lease`]).
//!
//! Pure: rows and the store's clock in, decisions out.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::types::{BeginUpdate, CellId, ClaimKey, ClaimRecord, Lease, LeaseOp, Timestamp};
use crate::error::ClaimsError;

/// The retry delay `RESTORE_QUARANTINE` suggests: verification passes take minutes, and a sign-up
/// form retried every few seconds gains nothing.
pub const RESTORE_QUARANTINE_RETRY_AFTER: Duration = Duration::from_secs(30);
/// Longest `reason` of a mark or a lift, in bytes.
pub const MAX_RESTORE_REASON_LEN: usize = 1024;
/// Most cells an operator may name with `--expect-cell` in one mark.
pub const MAX_EXPECTED_CELLS: usize = 10_000;
/// The lift reason recorded when the last expected cell reports.
pub const LIFTED_BY_REPORTS: &str = "every expected cell reported a verification pass";

/// One restore, as the store records it (`restore_epochs` and `restore_reports`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreEpoch {
    /// 1 for the first restore, then one more each time.
    pub epoch: u64,
    /// When the backup was taken (the operator's word).
    pub backup_time: Timestamp,
    /// The store's clock when the restore was marked.
    pub marked_at: Timestamp,
    pub reason: String,
    /// The cells whose verification passes lift the quarantine.
    pub expected_cells: BTreeSet<CellId>,
    /// Cells that reported a whole verification pass in this epoch, with when (store clock).
    pub reported: BTreeMap<CellId, Timestamp>,
    /// When and why the quarantine was lifted: by the last expected report, or an operator.
    pub lifted: Option<(Timestamp, String)>,
}

impl RestoreEpoch {
    /// Expected cells that have not reported yet.
    pub fn pending_cells(&self) -> impl Iterator<Item = &CellId> {
        self.expected_cells
            .iter()
            .filter(|cell| !self.reported.contains_key(*cell))
    }

    /// Whether creates of absent claims are refused (before `--restore-quarantine` is applied).
    pub fn quarantined(&self) -> bool {
        self.lifted.is_none()
    }

    /// What a cell is told in ListOutstandingLeases.
    pub fn view_for(&self, cell: &CellId) -> RestoreView {
        RestoreView {
            epoch: self.epoch,
            backup_time: self.backup_time,
            marked_at: self.marked_at,
            quarantined: self.quarantined(),
            reported: self.reported.contains_key(cell),
        }
    }
}

/// The latest restore as one cell sees it (ListOutstandingLeases' `restore`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreView {
    pub epoch: u64,
    pub backup_time: Timestamp,
    pub marked_at: Timestamp,
    pub quarantined: bool,
    /// Whether this cell reported a whole verification pass in this epoch.
    pub reported: bool,
}

/// `admin mark-restored`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MarkRestored {
    pub backup_time: Timestamp,
    pub reason: String,
    /// Cells to wait for besides those the store knows (a cell whose first claims came after the
    /// backup is not in the restored store).
    pub expect_cells: Vec<CellId>,
}

fn check_reason(reason: &str, field: &str) -> Result<(), ClaimsError> {
    if reason.trim().is_empty() {
        return Err(ClaimsError::invalid(
            field,
            "a reason is required (it goes to the audit log and the restore history)",
        ));
    }
    if reason.len() > MAX_RESTORE_REASON_LEN {
        return Err(ClaimsError::invalid(
            field,
            format!(
                "at most {MAX_RESTORE_REASON_LEN} bytes, got {}",
                reason.len()
            ),
        ));
    }
    Ok(())
}

/// Decides a mark: the next epoch after `previous`, expecting `holding` (every cell with claims
/// or outstanding leases in the store, read in the same transaction) and the named cells.
pub fn decide_mark_restored(
    previous: Option<&RestoreEpoch>,
    request: &MarkRestored,
    holding: BTreeSet<CellId>,
    now: Timestamp,
) -> Result<RestoreEpoch, ClaimsError> {
    check_reason(&request.reason, "reason")?;
    if request.backup_time > now {
        return Err(ClaimsError::invalid(
            "backup_time",
            "is after the store's clock: a backup cannot come from the future (RFC 3339, e.g. 2026-11-25T03:00:00Z)",
        ));
    }
    if request.expect_cells.len() > MAX_EXPECTED_CELLS {
        return Err(ClaimsError::invalid(
            "expect_cells",
            format!(
                "at most {MAX_EXPECTED_CELLS} cells, got {}",
                request.expect_cells.len()
            ),
        ));
    }
    let mut expected_cells = holding;
    expected_cells.extend(request.expect_cells.iter().cloned());
    let lifted = expected_cells
        .is_empty()
        .then(|| (now, "no cell holds claims: nothing to re-verify".to_owned()));
    Ok(RestoreEpoch {
        epoch: previous.map_or(1, |p| p.epoch + 1),
        backup_time: request.backup_time,
        marked_at: now,
        reason: request.reason.clone(),
        expected_cells,
        reported: BTreeMap::new(),
        lifted,
    })
}

/// The writes of a verification pass report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportPlan {
    /// Record `(cell, now)` in `restore_reports` (false: the cell had reported already).
    pub record: bool,
    /// Lift the quarantine now, with this reason (the last expected cell reported).
    pub lift: Option<String>,
}

/// Refuses a report or lift that names another epoch than the store's latest.
fn check_epoch(current: Option<&RestoreEpoch>, sent: u64) -> Result<&RestoreEpoch, ClaimsError> {
    match current {
        Some(state) if state.epoch == sent => Ok(state),
        _ => Err(ClaimsError::RestoreEpochMismatch {
            sent,
            current: current.map_or(0, |s| s.epoch),
        }),
    }
}

/// Decides `cell`'s report of a whole verification pass begun in `epoch`.
pub fn decide_report(
    current: Option<&RestoreEpoch>,
    cell: &CellId,
    epoch: u64,
) -> Result<ReportPlan, ClaimsError> {
    let state = check_epoch(current, epoch)?;
    if state.reported.contains_key(cell) {
        return Ok(ReportPlan {
            record: false,
            lift: None,
        });
    }
    let last = state.lifted.is_none() && state.pending_cells().all(|pending| pending == cell);
    Ok(ReportPlan {
        record: true,
        lift: last.then(|| LIFTED_BY_REPORTS.to_owned()),
    })
}

/// Decides `admin lift-quarantine` of `epoch`: `Ok(false)` when it was lifted already (nothing to
/// write), `Ok(true)` to record the lift with `reason` at the store's clock.
pub fn decide_lift(
    current: Option<&RestoreEpoch>,
    epoch: u64,
    reason: &str,
) -> Result<bool, ClaimsError> {
    check_reason(reason, "reason")?;
    Ok(check_epoch(current, epoch)?.lifted.is_none())
}

/// Whether `--restore-quarantine` refuses creates now.
pub fn quarantine_active(current: Option<&RestoreEpoch>, enabled: bool) -> bool {
    enabled && current.is_some_and(RestoreEpoch::quarantined)
}

/// The quarantine rule for one BeginUpdate: while it is active, a create of a claim that does not
/// exist (`absent`) is refused, unless the request is a verifier's correction. Destroys, updates
/// and creates of existing claims (refused by the store as taken or leased) pass.
///
/// A correction restores a name only its owner's records can prove lost, so the server cannot
/// check the name; it narrows who may send one and when: a cell that has not yet reported its
/// verification pass for the current epoch (its verifier is still correcting). Once a cell has
/// reported, its corrections are over, and the flag from it is refused (INVALID_ARGUMENT).
pub fn check_quarantine(
    current: Option<&RestoreEpoch>,
    enabled: bool,
    request: &BeginUpdate,
    correction: bool,
    absent: impl Fn(&ClaimKey) -> bool,
) -> Result<(), ClaimsError> {
    let Some(state) = current.filter(|_| quarantine_active(current, enabled)) else {
        return Ok(());
    };
    let epoch = state.epoch;
    if correction {
        return match state.reported.get(&request.cell_id) {
            Some(_) => Err(ClaimsError::invalid(
                "restore_correction",
                format!(
                    "cell {} already reported its verification pass for restore epoch {epoch}: \
                     corrections are accepted only before the cell's report",
                    request.cell_id
                ),
            )),
            None => Ok(()),
        };
    }
    match request.creates.iter().find(|r| absent(&r.key)) {
        Some(record) => Err(ClaimsError::RestoreQuarantine {
            claim: record.key.clone(),
            epoch,
            retry_after: RESTORE_QUARANTINE_RETRY_AFTER,
        }),
        None => Ok(()),
    }
}

/// After the store granted `lease` for `request`, which passed [`check_quarantine`]: whether
/// the grant must be undone. The quarantine's look-up of a create's claim runs before the
/// store transaction, and the store grants no create of a claim that exists. So a lease begun
/// after the mark, under an active quarantine, that creates claims the look-up found, was
/// granted because a claim went away in between (a pre-restore lease that a verifier rolled
/// back meanwhile): a create of an absent claim, refused as the look-up would have refused it.
/// A correction, a request without creates, and a replay of a lease begun before the mark
/// stand.
pub fn check_granted(
    current: Option<&RestoreEpoch>,
    enabled: bool,
    request: &BeginUpdate,
    correction: bool,
    lease: &Lease,
) -> Result<(), ClaimsError> {
    let Some(state) = current.filter(|_| quarantine_active(current, enabled)) else {
        return Ok(());
    };
    match request.creates.first() {
        Some(record) if !correction && lease.created_at > state.marked_at => {
            Err(ClaimsError::RestoreQuarantine {
                claim: record.key.clone(),
                epoch: state.epoch,
                retry_after: RESTORE_QUARANTINE_RETRY_AFTER,
            })
        }
        _ => Ok(()),
    }
}

/// Whether `lease` was outstanding when the restore of `restore` was marked: its cell may have
/// committed it after the backup, so its staleness proves nothing.
pub fn lease_predates_restore(lease: &Lease, restore: Option<&RestoreView>) -> bool {
    restore.is_some_and(|r| lease.created_at <= r.marked_at)
}

/// What the verifier does with a lease that predates the restore and has no local row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestoredLeaseAction {
    Commit,
    RollBack,
}

/// Decides a pre-restore lease from the cell's local records: `held(op, record)` says whether
/// the cell's records hold `record` now (for a create or an update, that exact claim; for a
/// destroy, the claim's key at all).
///
/// A create whose claim a record holds means the lease was committed (rolling it back would free
/// a name the cell holds); failing that, a destroy whose claim a record still holds means it was
/// rolled back (committing it would free a name the cell holds); failing that, an update whose
/// new values the records hold means committed. Anything else (no record implies the lease) is a
/// roll back. A lease the cell's later transactions mixed up is committed, and the verifier's
/// comparison in the same pass repairs what remains, while the quarantine holds the names.
pub fn decide_restored_lease(
    lease: &Lease,
    held: impl Fn(LeaseOp, &ClaimRecord) -> bool,
) -> RestoredLeaseAction {
    let request = &lease.request;
    if request.creates.iter().any(|r| held(LeaseOp::Create, r)) {
        return RestoredLeaseAction::Commit;
    }
    if request.destroys.iter().any(|r| held(LeaseOp::Destroy, r)) {
        return RestoredLeaseAction::RollBack;
    }
    if request.updates.iter().any(|r| held(LeaseOp::Update, r)) {
        return RestoredLeaseAction::Commit;
    }
    if request.creates.is_empty() && request.updates.is_empty() {
        // Destroys only, none of whose claims a record holds: the cell destroyed them.
        return RestoredLeaseAction::Commit;
    }
    RestoredLeaseAction::RollBack
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::types::LeaseId;
    use crate::domain::{ClaimType, OwnerType, TableName};

    fn cell(id: &str) -> CellId {
        CellId::parse(id).unwrap()
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_unix_micros(seconds * 1_000_000)
    }

    fn record(value: &str) -> ClaimRecord {
        ClaimRecord {
            display: None,
            key: ClaimKey::new(ClaimType::Username, value),
            owner_type: OwnerType::USER,
            owner_value: "1".into(),
            table_name: TableName::USERS,
            table_record_id: 1,
        }
    }

    fn mark(cells: &[&str]) -> RestoreEpoch {
        let request = MarkRestored {
            backup_time: at(100),
            reason: "drill".into(),
            expect_cells: vec![],
        };
        decide_mark_restored(
            None,
            &request,
            cells.iter().map(|c| cell(c)).collect(),
            at(200),
        )
        .unwrap()
    }

    fn begin(creates: &[&str], destroys: &[&str], updates: &[&str]) -> BeginUpdate {
        BeginUpdate {
            cell_id: cell("a"),
            lease_id: None,
            creates: creates.iter().map(|v| record(v)).collect(),
            destroys: destroys.iter().map(|v| record(v)).collect(),
            updates: updates.iter().map(|v| record(v)).collect(),
            local_transaction: None,
        }
    }

    #[test]
    fn a_correction_is_accepted_only_before_its_cell_reported() {
        let mut state = mark(&["a", "b"]);
        let request = begin(&["lost"], &[], &[]);
        check_quarantine(Some(&state), true, &request, true, |_| true).unwrap();
        // Without the flag the absent name is refused, as ever.
        assert!(matches!(
            check_quarantine(Some(&state), true, &request, false, |_| true),
            Err(ClaimsError::RestoreQuarantine { .. })
        ));
        state.reported.insert(cell("a"), at(300));
        let error = check_quarantine(Some(&state), true, &request, true, |_| true).unwrap_err();
        assert!(
            matches!(&error, ClaimsError::InvalidRequest { field, .. } if field == "restore_correction"),
            "{error:?}"
        );
        assert!(error.to_string().contains("epoch 1"), "{error}");
        // Once the quarantine is lifted (or not enforced), the flag changes nothing.
        check_quarantine(Some(&state), false, &request, true, |_| true).unwrap();
        state.lifted = Some((at(400), "lifted".into()));
        check_quarantine(Some(&state), true, &request, true, |_| true).unwrap();
    }

    #[test]
    fn a_mark_numbers_epochs_and_expects_the_holding_and_named_cells() {
        let first = mark(&["a", "b"]);
        assert_eq!(first.epoch, 1);
        assert!(first.quarantined());
        let request = MarkRestored {
            backup_time: at(150),
            reason: "again".into(),
            expect_cells: vec![cell("c")],
        };
        let second =
            decide_mark_restored(Some(&first), &request, [cell("a")].into(), at(300)).unwrap();
        assert_eq!(second.epoch, 2);
        assert_eq!(second.marked_at, at(300));
        assert_eq!(
            second.expected_cells,
            [cell("a"), cell("c")].into_iter().collect()
        );
    }

    #[test]
    fn a_mark_refuses_a_future_backup_and_an_empty_reason_and_an_empty_store_is_not_quarantined() {
        let future = MarkRestored {
            backup_time: at(300),
            reason: "x".into(),
            expect_cells: vec![],
        };
        let error = decide_mark_restored(None, &future, BTreeSet::new(), at(200)).unwrap_err();
        assert!(
            matches!(error, ClaimsError::InvalidRequest { ref field, .. } if field == "backup_time")
        );
        let blank = MarkRestored {
            backup_time: at(100),
            reason: "  ".into(),
            expect_cells: vec![],
        };
        assert!(decide_mark_restored(None, &blank, BTreeSet::new(), at(200)).is_err());
        let empty = mark(&[]);
        assert!(!empty.quarantined());
    }

    #[test]
    fn the_last_expected_report_lifts_the_quarantine_and_repeats_change_nothing() {
        let mut state = mark(&["a", "b"]);
        let plan = decide_report(Some(&state), &cell("a"), 1).unwrap();
        assert_eq!(
            plan,
            ReportPlan {
                record: true,
                lift: None
            }
        );
        state.reported.insert(cell("a"), at(210));
        let again = decide_report(Some(&state), &cell("a"), 1).unwrap();
        assert!(!again.record);
        // A cell the mark did not expect is recorded, and lifts nothing.
        assert_eq!(
            decide_report(Some(&state), &cell("z"), 1).unwrap().lift,
            None
        );
        let last = decide_report(Some(&state), &cell("b"), 1).unwrap();
        assert_eq!(last.lift.as_deref(), Some(LIFTED_BY_REPORTS));
    }

    #[test]
    fn a_report_or_lift_of_another_epoch_is_refused() {
        let state = mark(&["a"]);
        let error = decide_report(Some(&state), &cell("a"), 2).unwrap_err();
        assert_eq!(
            error,
            ClaimsError::RestoreEpochMismatch {
                sent: 2,
                current: 1
            }
        );
        assert!(decide_report(None, &cell("a"), 1).is_err());
        assert!(decide_lift(None, 1, "ops").is_err());
        assert!(decide_lift(Some(&state), 1, "ops").unwrap());
        let mut lifted = state;
        lifted.lifted = Some((at(250), "ops".into()));
        assert!(!decide_lift(Some(&lifted), 1, "ops").unwrap());
    }

    #[test]
    fn quarantine_refuses_creates_of_absent_claims_only() {
        let state = mark(&["a"]);
        let absent = |key: &ClaimKey| key.value == "lost";
        let request = begin(&["taken", "lost"], &["x"], &[]);
        let error = check_quarantine(Some(&state), true, &request, false, absent).unwrap_err();
        assert!(matches!(
            error,
            ClaimsError::RestoreQuarantine { ref claim, epoch: 1, .. } if claim.value == "lost"
        ));
        // Corrections, a disabled quarantine, no restore, a lifted one: served.
        assert!(check_quarantine(Some(&state), true, &request, true, absent).is_ok());
        assert!(check_quarantine(Some(&state), false, &request, false, absent).is_ok());
        assert!(check_quarantine(None, true, &request, false, absent).is_ok());
        let mut lifted = state.clone();
        lifted.lifted = Some((at(300), "ops".into()));
        assert!(check_quarantine(Some(&lifted), true, &request, false, absent).is_ok());
        // Destroys, updates and creates of existing claims pass.
        let others = begin(&["taken"], &["lost"], &["lost2"]);
        assert!(check_quarantine(Some(&state), true, &others, false, absent).is_ok());
    }

    fn lease(request: BeginUpdate, created: i64) -> Lease {
        Lease {
            lease_id: LeaseId::from_uuid(uuid::Uuid::from_u128(7)),
            cell_id: cell("a"),
            created_at: at(created),
            last_renewed_at: at(created),
            request,
        }
    }

    #[test]
    fn a_lease_predates_a_restore_when_created_by_its_mark() {
        let view = mark(&["a"]).view_for(&cell("a"));
        assert!(lease_predates_restore(
            &lease(begin(&["x"], &[], &[]), 200),
            Some(&view)
        ));
        assert!(!lease_predates_restore(
            &lease(begin(&["x"], &[], &[]), 201),
            Some(&view)
        ));
        assert!(!lease_predates_restore(
            &lease(begin(&["x"], &[], &[]), 1),
            None
        ));
    }

    #[test]
    fn a_restored_lease_is_decided_by_the_records_that_imply_it() {
        use RestoredLeaseAction::*;
        let held = |names: &'static [&'static str]| {
            move |_: LeaseOp, r: &ClaimRecord| names.contains(&r.key.value.as_str())
        };
        let create = lease(begin(&["new"], &[], &[]), 1);
        assert_eq!(decide_restored_lease(&create, held(&["new"])), Commit);
        assert_eq!(decide_restored_lease(&create, held(&[])), RollBack);
        let destroy = lease(begin(&[], &["old"], &[]), 1);
        assert_eq!(decide_restored_lease(&destroy, held(&["old"])), RollBack);
        assert_eq!(decide_restored_lease(&destroy, held(&[])), Commit);
        let both = lease(begin(&["new"], &["old"], &[]), 1);
        // Mixed evidence: commit (the create's name stays with the cell).
        assert_eq!(decide_restored_lease(&both, held(&["new", "old"])), Commit);
        assert_eq!(decide_restored_lease(&both, held(&["old"])), RollBack);
        assert_eq!(decide_restored_lease(&both, held(&[])), RollBack);
        let update = lease(begin(&[], &[], &["u"]), 1);
        assert_eq!(decide_restored_lease(&update, held(&["u"])), Commit);
        assert_eq!(decide_restored_lease(&update, held(&[])), RollBack);
    }

    #[test]
    fn a_create_granted_after_the_look_up_found_its_claim_is_undone_during_the_quarantine() {
        let mut state = mark(&["a", "b"]);
        let request = begin(&["gone"], &[], &[]);
        // Begun after the mark (200 s) while quarantined: the claim went away after the look-up.
        let granted = lease(request.clone(), 250);
        let error = check_granted(Some(&state), true, &request, false, &granted).unwrap_err();
        assert!(
            matches!(&error, ClaimsError::RestoreQuarantine { claim, epoch: 1, .. } if claim.value == "gone"),
            "{error:?}"
        );
        // A correction, a request without creates, a replay of a lease begun before the mark,
        // an unenforced quarantine: the grant stands.
        check_granted(Some(&state), true, &request, true, &granted).unwrap();
        let destroy = begin(&[], &["old"], &[]);
        check_granted(
            Some(&state),
            true,
            &destroy,
            false,
            &lease(destroy.clone(), 250),
        )
        .unwrap();
        check_granted(
            Some(&state),
            true,
            &request,
            false,
            &lease(request.clone(), 150),
        )
        .unwrap();
        check_granted(Some(&state), false, &request, false, &granted).unwrap();
        check_granted(None, true, &request, false, &granted).unwrap();
        // Lifted: creates are free again.
        state.lifted = Some((at(400), "lifted".into()));
        check_granted(Some(&state), true, &request, false, &granted).unwrap();
    }
}

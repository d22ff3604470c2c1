//! The reconciler's decision for a lease that the cell's local `leases_outstanding` table does not
//! hold: roll it back now because its local transaction is known to have aborted, roll it back
//! because it is stale, or leave it for a later pass.
//!
//! Pure: the lease, the store's time of the page and the local database's answer in, the action
//! out. Must not query anything (the status comes from `LocalLeaseStore::transaction_status`).
//! Only `aborted` ever shortens the wait (decision 080): a status never makes a lease committed.

use std::time::Duration;

use super::decide::lease_is_stale;
use super::restore::{lease_predates_restore, RestoreView};
use super::types::{Lease, LocalTransaction, Timestamp};

/// What the cell's local database says about the transaction a lease's `local_transaction`
/// names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LocalTxStatus {
    /// The transaction ended without committing (PostgreSQL `pg_xact_status` = `aborted`): the
    /// lease's local row can never appear.
    Aborted,
    /// Still running.
    InProgress,
    /// Committed (without the lease's row, since the row is absent).
    Committed,
    /// The database cannot tell; why: another cluster's or another database's transaction, a
    /// standby, a transaction too old to be known, an error, or no support at all.
    Unknown(String),
}

/// What the reconciler does with a lease absent from the local table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AbsentLeaseAction {
    /// Its local transaction aborted: roll it back in this pass, whatever its age, with the
    /// conditional rollback's window at zero ([`EARLY_ROLLBACK_UNRENEWED_FOR`]).
    RollBackAborted,
    /// Stale by the store's clock: roll it back conditionally on the staleness (today's rule).
    RollBackStale,
    /// Young and not known to have aborted: left for a later pass. `fallback` says why its
    /// local transaction did not decide (the reconciler logs it once per lease).
    Wait { fallback: String },
    /// Outstanding when the store's latest restore was marked, and its local transaction is
    /// known to have committed: the cell committed it after the backup and then deleted its row
    /// (`domain::restore`). CommitUpdate.
    CommitRestored,
    /// Outstanding when the store's latest restore was marked, and nothing local says how it
    /// ended: never rolled back for staleness; the verifier decides it from the cell's records
    /// (`domain::decide_restored_lease`).
    LeaveToVerifier,
}

/// The `unrenewed_for` of an early rollback: zero, so a renewal does not hold it back. Whether
/// the lease's row can still appear is settled by the abort, not by time (decision 080).
pub const EARLY_ROLLBACK_UNRENEWED_FOR: Duration = Duration::ZERO;

/// The local transaction to ask about, if asking can change the action: the lease is young (a
/// stale one is rolled back anyway) and names one.
pub fn local_transaction_to_ask<'l>(
    lease: &'l Lease,
    server_time: Timestamp,
    staleness: Duration,
    restore: Option<&RestoreView>,
) -> Option<&'l LocalTransaction> {
    if lease_is_stale(lease, server_time, staleness) && !lease_predates_restore(lease, restore) {
        return None;
    }
    lease.request.local_transaction.as_ref()
}

/// The action for `lease`, absent from the local table, listed at `server_time`; `status` is the
/// local database's answer for [`local_transaction_to_ask`] (`None` if nothing was asked);
/// `restore` is the page's restore epoch. A lease that predates the restore is never rolled back
/// for staleness: its cell may have committed it after the backup (issue 26).
pub fn decide_absent_lease(
    lease: &Lease,
    server_time: Timestamp,
    staleness: Duration,
    status: Option<&LocalTxStatus>,
    restore: Option<&RestoreView>,
) -> AbsentLeaseAction {
    if lease_predates_restore(lease, restore) {
        return match (&lease.request.local_transaction, status) {
            (Some(_), Some(LocalTxStatus::Aborted)) => AbsentLeaseAction::RollBackAborted,
            (Some(_), Some(LocalTxStatus::Committed)) => AbsentLeaseAction::CommitRestored,
            _ => AbsentLeaseAction::LeaveToVerifier,
        };
    }
    if lease_is_stale(lease, server_time, staleness) {
        return AbsentLeaseAction::RollBackStale;
    }
    let fallback = match (&lease.request.local_transaction, status) {
        (None, _) => "the lease names no local transaction".to_owned(),
        (Some(_), None) => "its local transaction was not asked about".to_owned(),
        (Some(_), Some(LocalTxStatus::Aborted)) => return AbsentLeaseAction::RollBackAborted,
        (Some(_), Some(LocalTxStatus::InProgress)) => {
            "its local transaction is in progress".to_owned()
        }
        (Some(_), Some(LocalTxStatus::Committed)) => {
            "its local transaction committed without its leases_outstanding row; only staleness decides"
                .to_owned()
        }
        (Some(_), Some(LocalTxStatus::Unknown(why))) => why.clone(),
    };
    AbsentLeaseAction::Wait { fallback }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::types::{BeginUpdate, CellId, LeaseId};
    use crate::domain::{ClaimKey, ClaimRecord, ClaimType, OwnerType, TableName};

    const STALENESS: Duration = Duration::from_secs(600);

    fn lease(local: Option<&str>, idle: Duration) -> (Lease, Timestamp) {
        let now = Timestamp::from_unix_micros(10_000_000_000);
        let at = now.saturating_sub(idle);
        let record = ClaimRecord {
            display: None,
            key: ClaimKey::new(ClaimType::Username, "a"),
            owner_type: OwnerType::USER,
            owner_value: "1".into(),
            table_name: TableName::USERS,
            table_record_id: 1,
        };
        let cell_id = CellId::parse("c").unwrap();
        let lease = Lease {
            lease_id: LeaseId::from_uuid(uuid::Uuid::from_u128(1)),
            cell_id: cell_id.clone(),
            created_at: at,
            last_renewed_at: at,
            request: BeginUpdate {
                cell_id,
                lease_id: None,
                creates: vec![record],
                destroys: vec![],
                updates: vec![],
                local_transaction: local
                    .map(|t| LocalTransaction::parse_field(t, "local_transaction").unwrap()),
            },
        };
        (lease, now)
    }

    fn young(local: Option<&str>) -> (Lease, Timestamp) {
        lease(local, Duration::from_secs(1))
    }

    #[test]
    fn a_young_lease_whose_local_transaction_aborted_is_rolled_back_now() {
        let (lease, now) = young(Some("pg:1:2"));
        assert_eq!(
            local_transaction_to_ask(&lease, now, STALENESS, None).map(LocalTransaction::as_str),
            Some("pg:1:2")
        );
        assert_eq!(
            decide_absent_lease(&lease, now, STALENESS, Some(&LocalTxStatus::Aborted), None),
            AbsentLeaseAction::RollBackAborted
        );
    }

    #[test]
    fn every_other_answer_leaves_a_young_lease_and_says_why() {
        let (lease, now) = young(Some("pg:1:2"));
        for status in [
            None,
            Some(LocalTxStatus::InProgress),
            Some(LocalTxStatus::Committed),
            Some(LocalTxStatus::Unknown("another cluster".into())),
        ] {
            match decide_absent_lease(&lease, now, STALENESS, status.as_ref(), None) {
                AbsentLeaseAction::Wait { fallback } => assert!(!fallback.is_empty()),
                other => panic!("{status:?} gave {other:?}"),
            }
        }
        let unknown = Some(LocalTxStatus::Unknown("too old".into()));
        assert_eq!(
            decide_absent_lease(&lease, now, STALENESS, unknown.as_ref(), None),
            AbsentLeaseAction::Wait {
                fallback: "too old".into()
            }
        );
    }

    #[test]
    fn a_young_lease_without_local_transaction_is_not_asked_about_and_waits() {
        let (lease, now) = young(None);
        assert_eq!(local_transaction_to_ask(&lease, now, STALENESS, None), None);
        assert!(matches!(
            decide_absent_lease(&lease, now, STALENESS, None, None),
            AbsentLeaseAction::Wait { .. }
        ));
    }

    fn restored_at(now: Timestamp) -> RestoreView {
        RestoreView {
            epoch: 1,
            backup_time: now.saturating_sub(Duration::from_secs(86_400)),
            marked_at: now,
            quarantined: true,
            reported: false,
        }
    }

    #[test]
    fn a_lease_that_predates_a_restore_is_never_rolled_back_for_staleness() {
        let (stale, now) = lease(Some("pg:1:2"), STALENESS * 10);
        let view = restored_at(now);
        assert_eq!(
            local_transaction_to_ask(&stale, now, STALENESS, Some(&view))
                .map(LocalTransaction::as_str),
            Some("pg:1:2"),
            "asked although stale"
        );
        for (status, action) in [
            (None, AbsentLeaseAction::LeaveToVerifier),
            (
                Some(LocalTxStatus::InProgress),
                AbsentLeaseAction::LeaveToVerifier,
            ),
            (
                Some(LocalTxStatus::Unknown("standby".into())),
                AbsentLeaseAction::LeaveToVerifier,
            ),
            (
                Some(LocalTxStatus::Aborted),
                AbsentLeaseAction::RollBackAborted,
            ),
            (
                Some(LocalTxStatus::Committed),
                AbsentLeaseAction::CommitRestored,
            ),
        ] {
            assert_eq!(
                decide_absent_lease(&stale, now, STALENESS, status.as_ref(), Some(&view)),
                action,
                "{status:?}"
            );
        }
        let (no_tx, now) = lease(None, STALENESS * 10);
        assert_eq!(
            decide_absent_lease(&no_tx, now, STALENESS, None, Some(&restored_at(now))),
            AbsentLeaseAction::LeaveToVerifier
        );
        // A lease begun after the mark follows the ordinary rules.
        let earlier = restored_at(now.saturating_sub(STALENESS * 20));
        assert_eq!(
            decide_absent_lease(&no_tx, now, STALENESS, None, Some(&earlier)),
            AbsentLeaseAction::RollBackStale
        );
    }

    #[test]
    fn a_stale_lease_is_rolled_back_by_staleness_whatever_its_local_transaction_says() {
        let (lease, now) = lease(Some("pg:1:2"), STALENESS + Duration::from_secs(1));
        assert_eq!(
            local_transaction_to_ask(&lease, now, STALENESS, None),
            None,
            "not asked"
        );
        for status in [
            None,
            Some(LocalTxStatus::Aborted),
            Some(LocalTxStatus::InProgress),
            Some(LocalTxStatus::Committed),
        ] {
            assert_eq!(
                decide_absent_lease(&lease, now, STALENESS, status.as_ref(), None),
                AbsentLeaseAction::RollBackStale
            );
        }
    }
}

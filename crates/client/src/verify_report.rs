//! What a verification run did: the counts the CLI prints, the metrics export and the tests
//! read.

use std::time::Duration;

use topology_claims::domain::ClaimRecord;

/// One difference between the cell's records and the service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Discrepancy {
    Missing(ClaimRecord),
    Different {
        local: ClaimRecord,
        service: ClaimRecord,
    },
    Extra(ClaimRecord),
}

impl std::fmt::Display for Discrepancy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let describe = |r: &ClaimRecord| {
            format!(
                "{} ({} {} {}#{})",
                r.key, r.owner_type, r.owner_value, r.table_name, r.table_record_id
            )
        };
        match self {
            Discrepancy::Missing(r) => write!(f, "missing  {}", describe(r)),
            Discrepancy::Different { local, service } => {
                write!(
                    f,
                    "different {} service has {}",
                    describe(local),
                    describe(service)
                )
            }
            Discrepancy::Extra(r) => write!(f, "extra    {}", describe(r)),
        }
    }
}

/// Progress and result of a run.
#[derive(Clone, Debug, Default)]
pub struct VerifyReport {
    pub records_checked: u64,
    pub claims_checked: u64,
    pub missing: u64,
    pub different: u64,
    pub extra: u64,
    pub skipped_recent: u64,
    pub corrections_applied: u64,
    pub corrections_failed: u64,
    /// Corrections rolled back because the local records changed after the comparison and no
    /// longer called for them (the next run compares again).
    pub corrections_withdrawn: u64,
    pub discrepancies: Vec<Discrepancy>,
    /// Leases that predate the store's restore, ended from the cell's records (`restore_pass`).
    pub restored_leases_committed: u64,
    pub restored_leases_rolled_back: u64,
    pub restored_leases_failed: u64,
    /// In a restore pass: local records whose claim the service shows in a lease not yet ended
    /// (a correction whose commit was lost, a lease the backup caught in flight). The pass does
    /// not report until they settle: if the lease were rolled back after the report, the record
    /// would be left without its claim and this cell could no longer correct it before the lift.
    pub restore_unsettled: u64,
    /// The restore epoch whose pass this run reported, if it did.
    pub restore_reported: Option<u64>,
    /// False when the time budget ran out (the cursor is saved).
    pub finished: bool,
    pub elapsed: Duration,
}

impl std::fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rate = self.records_checked as f64 / self.elapsed.as_secs_f64().max(1e-3);
        write!(
            f,
            "records={} claims={} missing={} different={} extra={} skipped_recent={} corrected={} failed={} withdrawn={} rate={rate:.0} records/s{}",
            self.records_checked,
            self.claims_checked,
            self.missing,
            self.different,
            self.extra,
            self.skipped_recent,
            self.corrections_applied,
            self.corrections_failed,
            self.corrections_withdrawn,
            if self.finished { "" } else { " (time budget reached; resumable)" }
        )?;
        let restored = self.restored_leases_committed
            + self.restored_leases_rolled_back
            + self.restored_leases_failed;
        if restored > 0 {
            write!(
                f,
                " restored_leases: committed={} rolled_back={} failed={}",
                self.restored_leases_committed,
                self.restored_leases_rolled_back,
                self.restored_leases_failed
            )?;
        }
        if self.restore_unsettled > 0 {
            write!(f, " restore_unsettled={}", self.restore_unsettled)?;
        }
        if let Some(epoch) = self.restore_reported {
            write!(f, " reported_restore_pass={epoch}")?;
        }
        Ok(())
    }
}

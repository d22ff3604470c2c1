//! The reconciler: heals what crashes leave between the three phases, for one cell.
//!
//! One pass pages through the cell's outstanding leases on the service and, for each:
//! - present in the local `leases_outstanding` table → the local transaction committed: CommitUpdate,
//!   then delete the local row (failure point 4A);
//! - absent locally and stale (`server_time - last_renewed_at > staleness`, both by the server's
//!   clock) → the local transaction never committed: RollbackUpdate (3B), conditional on
//!   `unrenewed_for = staleness`, so the store refuses it (LEASE_RENEWED) if the cell renewed
//!   the lease after this page was read; such a lease is left for the next pass;
//! - absent locally, young, and its `local_transaction` is one the local database reports as
//!   aborted (`LocalLeaseStore::transaction_status`, PostgreSQL's `pg_xact_status`) → its row
//!   can never appear: RollbackUpdate now, whatever its age (`unrenewed_for` zero; decision 080);
//! - absent locally and young otherwise → maybe still running: left alone (why is logged once
//!   per lease at debug level, not on every pass);
//! - absent locally and outstanding when the store's latest restore was marked (the page's
//!   `restore`, `domain::restore`) → its cell may have committed it after the backup and deleted
//!   its row, so staleness proves nothing: committed if its local transaction is known to have
//!   committed, rolled back if it aborted, otherwise left to the verifier, which decides it from
//!   the cell's records.
//!
//! Then local rows older than the threshold that are still there (their CommitUpdate or local
//! delete was lost, 5A) are committed idempotently and deleted; those the service no longer knows
//! or rolled back are logged at error level.
//!
//! Only one reconciler per cell acts at a time: a pass first takes the `LocalLock` named
//! `reconciler:<cell>` in the cell's own database and skips if another sidecar holds it.
//! Must not decide protocol rules beyond this lease bookkeeping; the service decides the rest.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use crate::client::ClaimsClient;
use topology_claims::domain::{
    decide_absent_lease, local_transaction_to_ask, AbsentLeaseAction, CellId, LeaseId, LeasesQuery,
    EARLY_ROLLBACK_UNRENEWED_FOR,
};
use topology_claims::error::ClaimsError;
use topology_claims::ports::{Clock, LocalLeaseStore, LocalLock, SystemClock};

/// Knobs of the reconciler.
#[derive(Clone, Debug)]
pub struct ReconcilerConfig {
    pub cell_id: CellId,
    /// Leases missing locally are rolled back once older than this (server clock). Must match
    /// the cells' `UpdateConfig::staleness`.
    pub staleness: Duration,
    /// Leases per ListOutstandingLeases page.
    pub page_size: usize,
    /// How long the reconciler lock lasts without renewal (renewed on every page).
    pub lock_ttl: Duration,
    /// This process's identity as a lock holder.
    pub holder: String,
    /// Most stale local rows examined per pass.
    pub local_batch: usize,
}

impl ReconcilerConfig {
    pub fn new(cell_id: CellId) -> Self {
        Self {
            cell_id,
            staleness: Duration::from_secs(600),
            page_size: 100,
            lock_ttl: Duration::from_secs(120),
            holder: default_holder(),
            local_batch: 1000,
        }
    }
}

/// `hostname-pid-random`: unique per process, readable in the lock table.
pub fn default_holder() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "host".to_owned());
    format!(
        "{host}-{}-{:08x}",
        std::process::id(),
        crate::backoff::random_u64() as u32
    )
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// False if another reconciler held the lock (the pass did nothing).
    pub acted: bool,
    pub pages: u64,
    pub committed: u64,
    /// Every lease rolled back, stale or early.
    pub rolled_back: u64,
    /// Of `rolled_back`, those rolled back early: young, but their local transaction aborted.
    pub rolled_back_aborted: u64,
    pub left_young: u64,
    /// Of `committed`, leases that predate a restore whose local transaction committed.
    pub committed_restored: u64,
    /// Leases that predate a restore and that nothing local decides: the verifier's.
    pub left_to_verifier: u64,
    /// Stale when listed, but renewed by the cell before the rollback reached the store
    /// (LEASE_RENEWED): left for the next pass, not an error.
    pub left_renewed: u64,
    pub local_rows_deleted: u64,
    /// Leases whose local transaction committed but which the service had rolled back.
    pub lost: Vec<LeaseId>,
    /// Calls that failed (retried on the next pass).
    pub errors: u64,
}

impl std::fmt::Display for ReconcileReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.acted {
            return write!(f, "skipped: another reconciler holds the lock");
        }
        write!(
            f,
            "pages={} committed={} rolled_back={} rolled_back_aborted={} left_young={} left_renewed={} committed_restored={} left_to_verifier={} local_rows_deleted={} lost={} errors={}",
            self.pages,
            self.committed,
            self.rolled_back,
            self.rolled_back_aborted,
            self.left_young,
            self.left_renewed,
            self.committed_restored,
            self.left_to_verifier,
            self.local_rows_deleted,
            self.lost.len(),
            self.errors
        )
    }
}

/// The reconciler of one cell.
pub struct Reconciler<L> {
    client: ClaimsClient,
    local: L,
    config: ReconcilerConfig,
    /// Young leases whose fallback was logged: each is logged once, not on every pass. Holds
    /// only the leases of the last pass, so it is bounded by the cell's outstanding leases.
    fallbacks_logged: Mutex<HashSet<LeaseId>>,
}

impl<L: LocalLeaseStore + LocalLock> Reconciler<L> {
    pub fn new(client: ClaimsClient, local: L, config: ReconcilerConfig) -> Self {
        Self {
            client,
            local,
            config,
            fallbacks_logged: Mutex::new(HashSet::new()),
        }
    }

    fn lock_name(&self) -> String {
        format!("reconciler:{}", self.config.cell_id)
    }

    /// One pass (see the module docs). Errors of single leases are counted, not returned; an
    /// error is returned only when the pass could not run (service or local DB unreachable).
    pub async fn run_once(&self) -> Result<ReconcileReport, ClaimsError> {
        let mut report = ReconcileReport::default();
        let (lock, holder) = (self.lock_name(), self.config.holder.clone());
        if !self
            .local
            .try_lock(&lock, &holder, self.config.lock_ttl)
            .await?
        {
            return Ok(report);
        }
        report.acted = true;
        let result = self.pass(&mut report).await;
        if let Err(error) = self.local.unlock(&lock, &holder).await {
            tracing::warn!(%error, "could not release the reconciler lock; it expires by itself");
        }
        result.map(|()| report)
    }

    async fn pass(&self, report: &mut ReconcileReport) -> Result<(), ClaimsError> {
        let logged = std::mem::take(&mut *self.fallbacks_logged());
        let mut waiting = HashSet::new();
        let result = self.outstanding(report, &logged, &mut waiting).await;
        if result.is_err() {
            // Leases the failed pass did not reach are not logged again by the next one.
            waiting.extend(logged);
        }
        *self.fallbacks_logged() = waiting;
        result?;
        let cut = SystemClock.now().saturating_sub(self.config.staleness);
        for row in self
            .local
            .list_older_than(cut, self.config.local_batch)
            .await?
        {
            // Routine after a crash between CommitUpdate and the local delete; the cases that
            // mean lost data (unknown or rolled-back lease) are logged at error level below.
            tracing::warn!(lease_id = %row.lease_id, "stale local lease row without an outstanding lease on the service");
            self.commit_and_forget(row.lease_id, report).await;
        }
        Ok(())
    }

    fn fallbacks_logged(&self) -> std::sync::MutexGuard<'_, HashSet<LeaseId>> {
        self.fallbacks_logged
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Pages through the cell's outstanding leases and acts on each (module docs). `logged`:
    /// young leases whose fallback the previous pass logged; `waiting` collects this pass's.
    async fn outstanding(
        &self,
        report: &mut ReconcileReport,
        logged: &HashSet<LeaseId>,
        waiting: &mut HashSet<LeaseId>,
    ) -> Result<(), ClaimsError> {
        let (cell_id, staleness) = (&self.config.cell_id, self.config.staleness);
        let mut after = None;
        loop {
            let query = LeasesQuery::new(cell_id.clone(), after, self.config.page_size);
            let page = self.client.list_outstanding_leases(&query).await?;
            report.pages += 1;
            let ids: Vec<LeaseId> = page.leases.iter().map(|l| l.lease_id).collect();
            let present: HashSet<LeaseId> = self
                .local
                .find(&ids)
                .await?
                .into_iter()
                .map(|l| l.lease_id)
                .collect();
            for lease in &page.leases {
                let lease_id = lease.lease_id;
                if present.contains(&lease_id) {
                    self.commit_and_forget(lease_id, report).await;
                    continue;
                }
                let restore = page.restore.as_ref();
                let status =
                    match local_transaction_to_ask(lease, page.server_time, staleness, restore) {
                        Some(local) => Some(self.local.transaction_status(local).await),
                        None => None,
                    };
                let local = lease.request.local_transaction.as_ref().map(|t| t.as_str());
                match decide_absent_lease(
                    lease,
                    page.server_time,
                    staleness,
                    status.as_ref(),
                    restore,
                ) {
                    AbsentLeaseAction::CommitRestored => {
                        match self
                            .client
                            .commit_update(&self.config.cell_id, lease_id)
                            .await
                        {
                            Ok(()) => {
                                report.committed += 1;
                                report.committed_restored += 1;
                                tracing::info!(%lease_id, local_transaction = local, "committed a lease that predates the restore: its local transaction committed");
                            }
                            Err(error) => {
                                report.errors += 1;
                                tracing::warn!(%lease_id, %error, "commit of a lease that predates the restore failed; retried next pass");
                            }
                        }
                    }
                    AbsentLeaseAction::LeaveToVerifier => {
                        report.left_to_verifier += 1;
                        if !logged.contains(&lease_id) {
                            tracing::info!(%lease_id, local_transaction = local, "lease predates the store's restore and has no local record: left to the verifier");
                        }
                        waiting.insert(lease_id);
                    }
                    // The store judges staleness again, by its clock, in the rollback's own
                    // transaction: the cell may have renewed since this page was read.
                    AbsentLeaseAction::RollBackStale => {
                        if self.rollback(lease_id, staleness, report).await {
                            tracing::info!(%lease_id, "rolled back a stale lease with no local record");
                        }
                    }
                    AbsentLeaseAction::RollBackAborted => {
                        if self
                            .rollback(lease_id, EARLY_ROLLBACK_UNRENEWED_FOR, report)
                            .await
                        {
                            report.rolled_back_aborted += 1;
                            tracing::info!(%lease_id, local_transaction = local, "rolled back a lease whose local transaction aborted");
                        }
                    }
                    AbsentLeaseAction::Wait { fallback } => {
                        report.left_young += 1;
                        if !logged.contains(&lease_id) {
                            tracing::debug!(%lease_id, local_transaction = local, %fallback, "young lease with no local record left for the staleness rule");
                        }
                        waiting.insert(lease_id);
                    }
                }
            }
            // Keep the lock while paging through a long list.
            self.local
                .try_lock(&self.lock_name(), &self.config.holder, self.config.lock_ttl)
                .await?;
            match page.next_cursor {
                Some(cursor) => after = Some(cursor),
                None => return Ok(()),
            }
        }
    }

    /// The conditional RollbackUpdate of a lease with no local record; `true` if it was rolled
    /// back. A renewal within `unrenewed_for` (LEASE_RENEWED) leaves it for the next pass.
    async fn rollback(
        &self,
        lease_id: LeaseId,
        unrenewed_for: Duration,
        report: &mut ReconcileReport,
    ) -> bool {
        match self
            .client
            .rollback_if_unrenewed_for(&self.config.cell_id, lease_id, unrenewed_for)
            .await
        {
            Ok(()) => {
                report.rolled_back += 1;
                true
            }
            Err(ClaimsError::LeaseRenewed { .. }) => {
                report.left_renewed += 1;
                tracing::info!(%lease_id, "stale lease was renewed before its rollback; left for the next pass");
                false
            }
            Err(error) => {
                report.errors += 1;
                tracing::warn!(%lease_id, %error, "rollback of a lease with no local record failed");
                false
            }
        }
    }

    /// CommitUpdate for a lease whose local transaction committed, then delete the local row.
    async fn commit_and_forget(&self, lease_id: LeaseId, report: &mut ReconcileReport) {
        match self
            .client
            .commit_update(&self.config.cell_id, lease_id)
            .await
        {
            Ok(()) => report.committed += 1,
            Err(ClaimsError::LeaseNotFound { .. }) => {
                tracing::error!(%lease_id, "the service does not know this lease (past outcome retention, or begun after the backup of a restored store); its claims are re-created by the verifier");
            }
            Err(ClaimsError::LeaseRolledBack { .. }) => {
                tracing::error!(%lease_id, "lease was rolled back although the local transaction committed: claims lost; run the verifier");
                report.lost.push(lease_id);
            }
            Err(error) => {
                report.errors += 1;
                tracing::warn!(%lease_id, %error, "commit failed; retried next pass");
                return;
            }
        }
        match self.local.delete(lease_id).await {
            Ok(_) => report.local_rows_deleted += 1,
            Err(error) => {
                report.errors += 1;
                tracing::warn!(%lease_id, %error, "could not delete the local lease row");
            }
        }
    }

    /// Runs a pass every `interval` until `shutdown` completes.
    pub async fn run(
        &self,
        interval: Duration,
        shutdown: impl Future<Output = ()>,
        mut on_pass: impl FnMut(&Result<ReconcileReport, ClaimsError>),
    ) {
        tokio::pin!(shutdown);
        loop {
            let pass = self.run_once().await;
            match &pass {
                Ok(report) => tracing::info!(%report, "reconcile pass"),
                Err(error) => tracing::error!(%error, "reconcile pass failed"),
            }
            on_pass(&pass);
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    }
}

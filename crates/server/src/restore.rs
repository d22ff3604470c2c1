//! The front end's copy of the store's latest restore epoch, and the quarantine it enforces
//! (`domain::restore`, decision 100).
//!
//! `serve` reads the epoch before it answers anything, then every `--restore-refresh` (so a mark
//! or a lift made through another server reaches this one within that), and at once after its
//! own admin calls. BeginUpdate asks [`RestoreGate::check_begin`]: while the epoch is quarantined
//! and `--restore-quarantine` is on, the creates of a request that is not a verifier's correction
//! are looked up, and a create of a claim that does not exist is refused (`RESTORE_QUARANTINE`).
//! The lookups cost only during a quarantine, and stop at the first absent claim.
//!
//! Owns the cache and its refresh; every rule is the domain's.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::watch;

use crate::metrics::ServerMetrics;
use topology_claims::domain::{
    self, BeginUpdate, CellId, ClaimKey, Lease, RestoreEpoch, RestoreView,
};
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;

/// Default `--restore-refresh`.
pub const DEFAULT_RESTORE_REFRESH: Duration = Duration::from_secs(2);

/// The latest restore epoch as this server last read it, and whether it enforces quarantine.
pub struct RestoreGate {
    store: Arc<dyn ClaimStore>,
    enforce: bool,
    state: RwLock<Option<RestoreEpoch>>,
    metrics: Option<Arc<ServerMetrics>>,
}

impl RestoreGate {
    /// A gate that has read nothing yet (call [`load`](Self::load) before serving).
    pub fn new(store: Arc<dyn ClaimStore>, enforce: bool) -> Self {
        Self {
            store,
            enforce,
            state: RwLock::new(None),
            metrics: None,
        }
    }

    /// Keeps the `topology_claims_restore_*` gauges in step with the epoch.
    pub fn with_metrics(mut self, metrics: Option<Arc<ServerMetrics>>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Reads the store's latest epoch.
    pub async fn load(&self) -> Result<(), ClaimsError> {
        let state = self.store.restore_state().await?;
        self.set(state);
        Ok(())
    }

    /// Keeps `state` (what the store answered to this server's own admin call), unless it is
    /// older than the epoch already kept: epochs only grow, and a periodic read that began
    /// before an admin call marked a new restore must not put the old epoch back (the
    /// quarantine would be lifted, and the cells told no restore, until the next read).
    pub fn set(&self, state: Option<RestoreEpoch>) {
        let mut kept = self.state.write().unwrap_or_else(|p| p.into_inner());
        let older = match (kept.as_ref(), state.as_ref()) {
            (Some(kept), Some(new)) => new.epoch < kept.epoch,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if older {
            return;
        }
        if let Some(metrics) = &self.metrics {
            let epoch = state.as_ref().map_or(0, |s| s.epoch);
            let pending = state
                .as_ref()
                .filter(|s| s.quarantined())
                .map_or(0, |s| s.pending_cells().count());
            metrics
                .restore_epoch
                .set(i64::try_from(epoch).unwrap_or(i64::MAX));
            metrics
                .restore_quarantine
                .set(i64::from(domain::quarantine_active(
                    state.as_ref(),
                    self.enforce,
                )));
            metrics
                .restore_cells_pending
                .set(i64::try_from(pending).unwrap_or(i64::MAX));
        }
        *kept = state;
    }

    pub fn current(&self) -> Option<RestoreEpoch> {
        self.state.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `--restore-quarantine`.
    pub fn enforce(&self) -> bool {
        self.enforce
    }

    /// Whether creates of absent claims are refused now.
    pub fn quarantine_enforced(&self) -> bool {
        domain::quarantine_active(self.current().as_ref(), self.enforce)
    }

    /// What `cell` is told in ListOutstandingLeases.
    pub fn view_for(&self, cell: &CellId) -> Option<RestoreView> {
        self.current().map(|state| state.view_for(cell))
    }

    /// The quarantine rule for one BeginUpdate (`domain::check_quarantine`); `correction` is the
    /// request's `restore_correction`.
    pub async fn check_begin(
        &self,
        request: &BeginUpdate,
        correction: bool,
    ) -> Result<(), ClaimsError> {
        let state = self.current();
        if !domain::quarantine_active(state.as_ref(), self.enforce)
            || (request.creates.is_empty() && !correction)
        {
            return Ok(());
        }
        let mut absent: Option<ClaimKey> = None;
        // A correction is judged by its cell alone: its claims need no look-up.
        for record in request.creates.iter().filter(|_| !correction) {
            match self.store.lookup_claim(&record.key).await {
                Ok(_) => {}
                Err(ClaimsError::ClaimNotFound { .. }) => {
                    absent = Some(record.key.clone());
                    break;
                }
                Err(error) => return Err(error),
            }
        }
        domain::check_quarantine(state.as_ref(), self.enforce, request, correction, |key| {
            absent.as_ref() == Some(key)
        })
    }

    /// The quarantine rule after the store granted `lease` (`domain::check_granted`): a create
    /// whose claim went away between [`RestoreGate::check_begin`]'s look-up and the store
    /// transaction is rolled back here (the cell has not heard of it, so its local transaction
    /// aborts) and refused with RESTORE_QUARANTINE. A rollback that fails is left to the cell's
    /// reconciler: the lease has no local row, and goes stale.
    pub async fn check_granted(
        &self,
        request: &BeginUpdate,
        correction: bool,
        lease: Lease,
    ) -> Result<Lease, ClaimsError> {
        let state = self.current();
        let Err(refusal) =
            domain::check_granted(state.as_ref(), self.enforce, request, correction, &lease)
        else {
            return Ok(lease);
        };
        if let Err(error) = self
            .store
            .rollback_update(&request.cell_id, lease.lease_id, None)
            .await
        {
            tracing::warn!(%error, lease_id = %lease.lease_id, cell_id = %request.cell_id,
                "rolling back a create granted during the restore quarantine failed; the cell's reconciler rolls it back");
        }
        Err(refusal)
    }

    /// Reads the epoch every `interval` until `stop` is dropped. A failed read keeps the last
    /// epoch (logged once per outage, like the health watcher).
    pub async fn refresh_periodically(
        self: Arc<Self>,
        interval: Duration,
        mut stop: watch::Receiver<()>,
    ) {
        let mut failing = false;
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                _ = tokio::time::sleep(interval) => {}
            }
            let before = self.current().map(|s| (s.epoch, s.lifted.is_some()));
            match self.load().await {
                Ok(()) => {
                    if failing {
                        tracing::info!("restore epoch readable again");
                        failing = false;
                    }
                    let after = self.current();
                    if after.as_ref().map(|s| (s.epoch, s.lifted.is_some())) != before {
                        if let Some(state) = after {
                            tracing::warn!(
                                epoch = state.epoch,
                                quarantined = state.quarantined(),
                                enforced = domain::quarantine_active(Some(&state), self.enforce),
                                pending_cells = state.pending_cells().count(),
                                "restore epoch changed"
                            );
                        }
                    }
                }
                Err(error) => {
                    if !failing {
                        tracing::warn!(%error, "could not read the restore epoch; keeping the last one read");
                        failing = true;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use topology_claims::domain::{RestoreEpoch, Timestamp};
    use topology_claims::memory::MemoryClaimStore;

    fn epoch(n: u64) -> RestoreEpoch {
        RestoreEpoch {
            epoch: n,
            backup_time: Timestamp::from_unix_micros(1),
            marked_at: Timestamp::from_unix_micros(2),
            reason: "drill".into(),
            expected_cells: Default::default(),
            reported: Default::default(),
            lifted: None,
        }
    }

    fn create(cell: &str, value: &str) -> BeginUpdate {
        use topology_claims::fixtures;
        fixtures::creates(&fixtures::cell(cell), &[fixtures::username(value)])
    }

    /// The race the chaos campaign found (TLS campaign, seed 1795894829676418659): during the
    /// quarantine a create passed the look-up because a pre-restore lease held its claim, a
    /// verifier rolled that lease back before the create's store transaction, and the store
    /// granted the now absent claim to a second cell. The gate now undoes such a grant.
    #[tokio::test]
    async fn a_create_whose_claim_went_away_after_the_look_up_is_undone_and_refused() {
        let store: Arc<dyn ClaimStore> = Arc::new(MemoryClaimStore::new());
        // Cell b's lease from before the backup holds the claim when the restore is marked.
        let held = store.begin_update(create("b", "taken")).await.unwrap();
        let gate = RestoreGate::new(Arc::clone(&store), true);
        let mut state = epoch(1);
        state.expected_cells = ["a", "b"]
            .iter()
            .map(|c| CellId::parse(c).unwrap())
            .collect();
        gate.set(Some(state));
        let request = create("a", "taken");
        // The look-up finds the claim: not absent, so not refused here.
        gate.check_begin(&request, false).await.unwrap();
        // Cell b's verifier rolls its lease back; then cell a's transaction runs.
        store
            .rollback_update(&held.cell_id, held.lease_id, None)
            .await
            .unwrap();
        let granted = store.begin_update(request.clone()).await.unwrap();
        let error = gate
            .check_granted(&request, false, granted)
            .await
            .unwrap_err();
        assert!(
            matches!(&error, ClaimsError::RestoreQuarantine { claim, .. } if claim.value == "taken"),
            "{error:?}"
        );
        // The grant was rolled back: the name is free for cell b's correction.
        assert!(matches!(
            store.lookup_claim(&request.creates[0].key).await,
            Err(ClaimsError::ClaimNotFound { .. })
        ));
    }

    #[test]
    fn a_read_older_than_the_kept_epoch_never_puts_it_back() {
        let gate = RestoreGate::new(Arc::new(MemoryClaimStore::new()), true);
        gate.set(Some(epoch(2)));
        // A periodic read that began before the admin call marked epoch 2.
        gate.set(Some(epoch(1)));
        assert_eq!(gate.current().map(|s| s.epoch), Some(2));
        gate.set(None);
        assert_eq!(gate.current().map(|s| s.epoch), Some(2));
        // The same epoch, read again (a report, a lift), and a newer one are kept.
        let mut lifted = epoch(2);
        lifted.reason = "read again".into();
        gate.set(Some(lifted));
        assert_eq!(gate.current().unwrap().reason, "read again");
        gate.set(Some(epoch(3)));
        assert_eq!(gate.current().map(|s| s.epoch), Some(3));
    }
}

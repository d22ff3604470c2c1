//! The three-phase claims transaction, as a handle the cell drives:
//!
//! 1. [`PendingUpdate::begin`] — BeginUpdate before the local transaction (lease id chosen here);
//! 2. the caller's local transaction, which records the lease id through
//!    [`LocalLeaseStore::record`](topology_claims::LocalLeaseStore::record) and calls
//!    [`PendingUpdate::check_fresh`] right before its local COMMIT (the staleness guard);
//! 3. [`PendingUpdate::finish`] — CommitUpdate and delete the local lease row if the local
//!    transaction committed, RollbackUpdate if it did not.
//!
//! The staleness guard makes reconciliation safe: a reconciler rolls back a lease missing locally
//! only once it is older than the threshold *by the server's clock since the server saw the last
//! BeginUpdate/RenewLease*; the guard refuses the local commit once the time since that request
//! was *sent*, on this process's monotonic clock, exceeds threshold − margin. Send time precedes
//! the server's time, so a local transaction can never commit after its lease became eligible for
//! rollback. Long transactions renew to move both clocks forward together.
//!
//! The same handle serves the **in-transaction order** (GitLab's Cells ADR 021): local BEGIN, the
//! application's writes, then [`PendingUpdate::begin_in_transaction`] (one overall deadline,
//! [`UpdateConfig::in_transaction_deadline`], so the open local transaction waits a bounded
//! time), the lease record, the guard, the local COMMIT and [`PendingUpdate::finish`]. A refused
//! or unanswered BeginUpdate comes back as a [`BeginFailure`]: the caller rolls back locally
//! first, then [`BeginFailure::settle`]s it (the clean-up RollbackUpdate runs with no local
//! transaction open).
//!
//! Backend crates wrap this in a closure-style helper for their database (e.g.
//! `topology_claims_sqlite::cell::transact`). Must not touch any local database itself.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::client::ClaimsClient;
use topology_claims::domain::{BeginUpdate, CellId, ClaimKey, Lease, LeaseId};
use topology_claims::error::ClaimsError;
use topology_claims::ports::LocalLeaseStore;

/// Knobs of the three-phase transaction.
#[derive(Clone, Debug)]
pub struct UpdateConfig {
    /// The reconcilers' staleness threshold (they roll back leases older than this that are
    /// missing locally). Must match the reconciler's `--staleness`.
    pub staleness: Duration,
    /// How much earlier than `staleness` the local commit is refused.
    pub safety_margin: Duration,
    /// Renew the lease this often while the local transaction runs (`None`: never).
    pub renew_every: Option<Duration>,
    /// In the in-transaction order, the longest BeginUpdate may take, retries with the same
    /// lease id included, while the local transaction stays open and holds its locks (and its
    /// connection). Default 200 ms, as GitLab's Cells ADR 021. On expiry the local transaction
    /// is rolled back and the caller gets `ServerUnavailable`.
    pub in_transaction_deadline: Duration,
    /// In the pre-flight order ([`PendingUpdate::begin`]), wait this long for claims other
    /// leases hold (`wait_for_leased`; `ClaimsClient::begin_update_waiting`) instead of
    /// failing with CLAIM_LEASED at once: for background jobs. `None` (the default): do not
    /// wait. Never used by [`PendingUpdate::begin_in_transaction`], whose local transaction
    /// holds its locks while BeginUpdate runs.
    pub lease_wait: Option<Duration>,
}

impl Default for UpdateConfig {
    fn default() -> Self {
        Self {
            staleness: Duration::from_secs(600),
            safety_margin: Duration::from_secs(60),
            renew_every: Some(Duration::from_secs(120)),
            in_transaction_deadline: Duration::from_millis(200),
            lease_wait: None,
        }
    }
}

impl UpdateConfig {
    /// The longest a lease may go unrenewed before the local commit is refused.
    pub fn commit_window(&self) -> Duration {
        self.staleness.saturating_sub(self.safety_margin)
    }
}

/// Why a three-phase transaction did not take effect (or took effect with a problem).
#[derive(Debug, thiserror::Error)]
pub enum TransactionError<E> {
    /// BeginUpdate was refused (taken, leased, not owner, invalid…) or the service was
    /// unavailable. Nothing was changed anywhere.
    #[error(transparent)]
    Claims(ClaimsError),
    /// The local transaction failed; it was rolled back and so was the lease.
    #[error("local transaction failed: {0}")]
    Local(E),
    /// The staleness guard refused the local commit: the lease went unrenewed for `elapsed`,
    /// beyond the commit window. Everything was rolled back.
    #[error("lease {lease_id} unrenewed for {elapsed:?}, beyond the commit window of {window:?}; rolled back")]
    Stale {
        lease_id: LeaseId,
        elapsed: Duration,
        window: Duration,
    },
    /// The local transaction committed, but the service had already rolled the lease back: the
    /// local records now imply claims the cell does not hold. Needs repair (the verifier does it).
    #[error("lease {lease_id} was rolled back after the local commit; claims lost: {}", claims.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    LostClaims {
        lease_id: LeaseId,
        claims: Vec<ClaimKey>,
    },
    /// Whether the local transaction committed is unknown (its COMMIT was cut off); the
    /// reconciler settles the lease to match whatever happened locally.
    #[error("outcome of the local commit of lease {lease_id} is unknown: {error}; the reconciler will settle it")]
    Indeterminate { lease_id: LeaseId, error: E },
}

/// What became of phase 3 after a successful local commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommitOutcome {
    /// CommitUpdate succeeded and the local lease row was deleted.
    Committed,
    /// CommitUpdate succeeded; deleting the local lease row failed (the reconciler removes it).
    CommittedLocalRowLeft { error: ClaimsError },
    /// CommitUpdate could not be delivered; the local row stays and the reconciler commits it.
    LeftToReconciler { error: ClaimsError },
}

/// How phase 2 ended, as reported to [`PendingUpdate::finish`].
#[derive(Debug)]
pub enum LocalEnd<T, E> {
    /// The local transaction committed (with the lease id recorded in it).
    Committed(T),
    /// The local transaction failed and was rolled back.
    Failed(E),
    /// The staleness guard refused the commit; the local transaction was rolled back.
    Stale { elapsed: Duration },
    /// The local COMMIT's outcome is unknown (the connection broke during it). The lease is
    /// neither committed nor rolled back here: the reconciler finds the local lease row (the
    /// transaction committed → CommitUpdate) or not (→ RollbackUpdate once stale).
    Indeterminate(E),
}

/// A BeginUpdate that did not take the lease. `settle` it (after any local rollback) to get the
/// error for the caller.
#[derive(Debug)]
pub struct BeginFailure {
    error: ClaimsError,
    /// Set when the request may still be applied (no answer): its lease id is rolled back.
    unconfirmed: Option<(ClaimsClient, CellId, LeaseId)>,
}

impl BeginFailure {
    pub fn error(&self) -> &ClaimsError {
        &self.error
    }

    /// A best-effort RollbackUpdate of an unconfirmed lease id (one attempt), so a request still
    /// in flight can never take the claims later; then the error, unchanged.
    pub async fn settle(self) -> ClaimsError {
        if let Some((client, cell_id, lease_id)) = self.unconfirmed {
            if let Err(cleanup) = client.rollback_once(&cell_id, lease_id).await {
                tracing::warn!(%lease_id, error = %cleanup, "could not roll back an unconfirmed lease; the reconciler will");
            }
        }
        self.error
    }
}

/// A lease taken by BeginUpdate whose local transaction has not finished yet.
pub struct PendingUpdate {
    client: ClaimsClient,
    lease: Lease,
    config: UpdateConfig,
    /// When the last successful BeginUpdate/RenewLease request was *sent*.
    fresh_since: Arc<Mutex<Instant>>,
    renewer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for PendingUpdate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingUpdate")
            .field("lease_id", &self.lease.lease_id)
            .finish()
    }
}

impl PendingUpdate {
    /// Phase 1: BeginUpdate, retried safely with a lease id chosen before the first attempt. If it
    /// finally fails as unavailable, a best-effort RollbackUpdate of that id makes sure a request
    /// still in flight can never take the claims later.
    pub async fn begin(
        client: &ClaimsClient,
        mut request: BeginUpdate,
        config: UpdateConfig,
    ) -> Result<Self, ClaimsError> {
        request.lease_id.get_or_insert_with(LeaseId::generate);
        let call = async {
            match config.lease_wait {
                Some(wait) => client.begin_update_waiting(request.clone(), wait).await,
                None => client.begin_update(request.clone()).await,
            }
        };
        match Self::begin_unsettled(client, call, &request, config.clone()).await {
            Ok(pending) => Ok(pending),
            Err(failure) => Err(failure.settle().await),
        }
    }

    /// Phase 1 of the in-transaction order, sent while the caller's local transaction is open:
    /// BeginUpdate with retries (same lease id) all within
    /// [`UpdateConfig::in_transaction_deadline`], each attempt's own deadline no longer than
    /// that, and CLAIM_LEASED returned at once even to a client configured to wait it out. On
    /// failure, roll back the local transaction, then [`BeginFailure::settle`].
    pub async fn begin_in_transaction(
        client: &ClaimsClient,
        mut request: BeginUpdate,
        config: UpdateConfig,
    ) -> Result<Self, BeginFailure> {
        request.lease_id.get_or_insert_with(LeaseId::generate);
        let deadline = config.in_transaction_deadline;
        let bounded = client.for_open_transaction(deadline);
        let call = async {
            match tokio::time::timeout(deadline, bounded.begin_update(request.clone())).await {
                Ok(answer) => answer,
                Err(_) => Err(ClaimsError::server_unavailable(format!(
                    "BeginUpdate got no answer within the in-transaction deadline of {deadline:?}"
                ))),
            }
        };
        Self::begin_unsettled(client, call, &request, config).await
    }

    /// Sends `call` (the BeginUpdate of `request`, whose lease id is set) and keeps the time it
    /// was sent for the staleness guard.
    async fn begin_unsettled(
        client: &ClaimsClient,
        call: impl std::future::Future<Output = Result<Lease, ClaimsError>>,
        request: &BeginUpdate,
        config: UpdateConfig,
    ) -> Result<Self, BeginFailure> {
        let lease_id = request.lease_id.unwrap_or_else(LeaseId::generate);
        let sent = Instant::now();
        let lease = match call.await {
            Ok(lease) => lease,
            Err(error) if error.is_unavailable() => {
                return Err(BeginFailure {
                    error,
                    unconfirmed: Some((client.clone(), request.cell_id.clone(), lease_id)),
                })
            }
            Err(error) => {
                return Err(BeginFailure {
                    error,
                    unconfirmed: None,
                })
            }
        };
        let mut pending = Self {
            client: client.clone(),
            lease,
            config,
            fresh_since: Arc::new(Mutex::new(sent)),
            renewer: None,
        };
        if let Some(every) = pending.config.renew_every {
            pending.spawn_renewal(every);
        }
        Ok(pending)
    }

    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    pub fn lease_id(&self) -> LeaseId {
        self.lease.lease_id
    }

    fn last_fresh(&self) -> Instant {
        *self.fresh_since.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The staleness guard: call right before the local COMMIT. `Err(elapsed)` means the commit
    /// must not happen (roll back locally and report [`LocalEnd::Stale`]).
    pub fn check_fresh(&self) -> Result<(), Duration> {
        let elapsed = self.last_fresh().elapsed();
        if elapsed > self.config.commit_window() {
            Err(elapsed)
        } else {
            Ok(())
        }
    }

    /// Renews the lease now (in addition to any background renewal).
    pub async fn renew(&self) -> Result<(), ClaimsError> {
        renew(&self.client, &self.lease, &self.fresh_since).await
    }

    /// Renews every `every` in the background until the update finishes.
    fn spawn_renewal(&mut self, every: Duration) {
        let (client, lease, fresh) = (
            self.client.clone(),
            self.lease.clone(),
            self.fresh_since.clone(),
        );
        self.renewer = Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(error) = renew(&client, &lease, &fresh).await {
                    tracing::warn!(lease_id = %lease.lease_id, %error, "lease renewal failed");
                }
            }
        }));
    }

    /// Phase 3, given how the local transaction ended.
    pub async fn finish<T, E, L: LocalLeaseStore>(
        mut self,
        local_end: LocalEnd<T, E>,
        local: &L,
    ) -> Result<(T, CommitOutcome), TransactionError<E>> {
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
        let (cell_id, lease_id) = (self.lease.cell_id.clone(), self.lease.lease_id);
        match local_end {
            LocalEnd::Committed(value) => match self.client.commit_update(&cell_id, lease_id).await
            {
                Ok(()) => match local.delete(lease_id).await {
                    Ok(_) => Ok((value, CommitOutcome::Committed)),
                    Err(error) => {
                        tracing::warn!(%lease_id, %error, "could not delete the local lease row; the reconciler will");
                        Ok((value, CommitOutcome::CommittedLocalRowLeft { error }))
                    }
                },
                Err(ClaimsError::LeaseRolledBack { .. }) => {
                    let claims = self
                        .lease
                        .request
                        .operations()
                        .map(|(_, r)| r.key.clone())
                        .collect();
                    tracing::error!(%lease_id, "lease rolled back after the local commit: claims lost");
                    Err(TransactionError::LostClaims { lease_id, claims })
                }
                Err(error) => {
                    tracing::warn!(%lease_id, %error, "CommitUpdate failed; the reconciler will commit");
                    Ok((value, CommitOutcome::LeftToReconciler { error }))
                }
            },
            LocalEnd::Failed(error) => {
                self.rollback_lease().await;
                Err(TransactionError::Local(error))
            }
            LocalEnd::Indeterminate(error) => {
                tracing::warn!(%lease_id, "local commit outcome unknown; leaving the lease to the reconciler");
                Err(TransactionError::Indeterminate { lease_id, error })
            }
            LocalEnd::Stale { elapsed } => {
                self.rollback_lease().await;
                Err(TransactionError::Stale {
                    lease_id,
                    elapsed,
                    window: self.config.commit_window(),
                })
            }
        }
    }

    /// Abandons the update before any local commit (e.g. the caller decided not to proceed).
    pub async fn abandon(mut self) {
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
        self.rollback_lease().await;
    }

    async fn rollback_lease(&self) {
        if let Err(error) = self
            .client
            .rollback_update(&self.lease.cell_id, self.lease.lease_id)
            .await
        {
            tracing::warn!(lease_id = %self.lease.lease_id, %error, "RollbackUpdate failed; the reconciler will roll back");
        }
    }
}

impl Drop for PendingUpdate {
    fn drop(&mut self) {
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
    }
}

async fn renew(
    client: &ClaimsClient,
    lease: &Lease,
    fresh: &Mutex<Instant>,
) -> Result<(), ClaimsError> {
    let sent = Instant::now();
    client.renew_lease(&lease.cell_id, lease.lease_id).await?;
    let mut since = fresh.lock().unwrap_or_else(|p| p.into_inner());
    if sent > *since {
        *since = sent;
    }
    Ok(())
}

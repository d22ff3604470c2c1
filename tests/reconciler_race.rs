//! The reconciler's race with a renewal (issue 23), driven step by step: the store's clock is a
//! hand-moved one and the reconciler is paused between its ListOutstandingLeases page and its
//! rollback (its local-table look-up waits for the test), so every interleaving below is forced,
//! not hoped for.
//!
//! BeginUpdate(L); the cell's renewals fail for longer than the staleness; the reconciler lists
//! L as stale; RenewLease(L) → OK; the reconciler's conditional RollbackUpdate(L) →
//! LEASE_RENEWED (left for the next pass, not an error); the cell's CommitUpdate(L) → OK.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use topology_claims::memory::{MemoryClaimStore, MemoryLocalLeaseStore, MemoryLocalTx};
use topology_claims::ports::{LocalLease, LocalLock};
use topology_claims::{ClaimState, ClaimsError, Clock, Lease, LeaseId, LocalLeaseStore, Timestamp};
use topology_claims_client::{ClaimsClient, ClientConfig, Reconciler, ReconcilerConfig};
use topology_claims_testkit::fixtures::{cell, creates, username};
use topology_claims_testkit::TestServer;

const STALENESS: Duration = Duration::from_secs(600);

/// The store's clock, moved by the test only.
#[derive(Default)]
struct HandClock(AtomicI64);

impl HandClock {
    fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_micros() as i64, Ordering::SeqCst);
    }
}

impl Clock for HandClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_unix_micros(1_700_000_000_000_000 + self.0.load(Ordering::SeqCst))
    }
}

/// The cell's local lease table, whose look-up (the reconciler's step between its list and its
/// rollback) says "listed" and then waits until the test says "go on".
#[derive(Clone)]
struct PausedLocal {
    inner: MemoryLocalLeaseStore,
    listed: Arc<Notify>,
    resume: Arc<Notify>,
}

impl LocalLeaseStore for PausedLocal {
    type Tx<'t> = MemoryLocalTx;

    async fn record(&self, tx: &mut Self::Tx<'_>, lease_id: LeaseId) -> Result<(), ClaimsError> {
        self.inner.record(tx, lease_id).await
    }

    async fn delete(&self, lease_id: LeaseId) -> Result<bool, ClaimsError> {
        self.inner.delete(lease_id).await
    }

    async fn find(&self, lease_ids: &[LeaseId]) -> Result<Vec<LocalLease>, ClaimsError> {
        self.listed.notify_one();
        self.resume.notified().await;
        self.inner.find(lease_ids).await
    }

    async fn list_older_than(
        &self,
        before: Timestamp,
        limit: usize,
    ) -> Result<Vec<LocalLease>, ClaimsError> {
        self.inner.list_older_than(before, limit).await
    }
}

impl LocalLock for PausedLocal {
    async fn try_lock(&self, name: &str, holder: &str, ttl: Duration) -> Result<bool, ClaimsError> {
        self.inner.try_lock(name, holder, ttl).await
    }

    async fn unlock(&self, name: &str, holder: &str) -> Result<(), ClaimsError> {
        self.inner.unlock(name, holder).await
    }
}

struct Race {
    server: TestServer,
    clock: Arc<HandClock>,
    client: ClaimsClient,
    local: PausedLocal,
}

async fn race() -> Race {
    let clock = Arc::new(HandClock::default());
    let store = MemoryClaimStore::with_clock(clock.clone());
    let server = TestServer::start(Arc::new(store)).await;
    let client = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    let local = PausedLocal {
        inner: MemoryLocalLeaseStore::new(),
        listed: Arc::default(),
        resume: Arc::default(),
    };
    Race {
        server,
        clock,
        client,
        local,
    }
}

/// A reconciler of cell-a with `STALENESS`, started on its own task; it pauses after listing.
fn reconcile_in_background(
    race: &Race,
) -> tokio::task::JoinHandle<Result<topology_claims_client::ReconcileReport, ClaimsError>> {
    let config = ReconcilerConfig {
        staleness: STALENESS,
        ..ReconcilerConfig::new(cell("cell-a"))
    };
    let reconciler = Reconciler::new(race.client.clone(), race.local.clone(), config);
    tokio::spawn(async move { reconciler.run_once().await })
}

/// Cell-a's lease of `name`, then the cell's renewals fail for longer than the staleness; a
/// reconciler pass starts and has read the page with the lease stale when this returns.
async fn stale_lease_listed(
    race: &Race,
    name: &str,
) -> (
    Lease,
    tokio::task::JoinHandle<Result<topology_claims_client::ReconcileReport, ClaimsError>>,
) {
    let lease = race
        .client
        .begin_update(creates(&cell("cell-a"), &[username(name)]))
        .await
        .unwrap();
    race.clock.advance(STALENESS + Duration::from_secs(1));
    let pass = reconcile_in_background(race);
    race.local.listed.notified().await;
    (lease, pass)
}

#[tokio::test]
async fn a_lease_renewed_after_the_reconciler_listed_it_is_not_rolled_back_and_commits() {
    let race = race().await;
    let a = cell("cell-a");
    let (lease, pass) = stale_lease_listed(&race, "racer").await;
    // The reconciler has read the page with L stale. The cell's renewal now gets through.
    race.client.renew_lease(&a, lease.lease_id).await.unwrap();
    race.local.resume.notify_one();
    let report = pass.await.unwrap().unwrap();

    assert_eq!(report.rolled_back, 0, "{report}");
    assert_eq!(report.left_renewed, 1, "{report}");
    assert_eq!(report.errors, 0, "LEASE_RENEWED is not an error: {report}");
    assert_eq!(
        race.client
            .lookup_claim(&username("racer").key)
            .await
            .unwrap()
            .state,
        ClaimState::Creating,
        "the lease is left as it was"
    );
    // The cell's staleness guard allows the commit (it just renewed), and the service agrees.
    race.client.commit_update(&a, lease.lease_id).await.unwrap();
    assert_eq!(
        race.client
            .lookup_claim(&username("racer").key)
            .await
            .unwrap()
            .state,
        ClaimState::Active
    );
    race.server.shutdown().await;
}

#[tokio::test]
async fn a_stale_lease_nobody_renewed_is_rolled_back_by_the_same_pass() {
    let race = race().await;
    let a = cell("cell-a");
    let (lease, pass) = stale_lease_listed(&race, "gone").await;
    race.local.resume.notify_one();
    let report = pass.await.unwrap().unwrap();

    assert_eq!(report.rolled_back, 1, "{report}");
    assert_eq!(report.left_renewed, 0, "{report}");
    assert!(matches!(
        race.client.lookup_claim(&username("gone").key).await,
        Err(ClaimsError::ClaimNotFound { .. })
    ));
    assert!(matches!(
        race.client.commit_update(&a, lease.lease_id).await,
        Err(ClaimsError::LeaseRolledBack { .. })
    ));
    race.server.shutdown().await;
}

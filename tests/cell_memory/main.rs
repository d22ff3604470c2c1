//! The cell side against the real gRPC server with an in-memory local database: the shared
//! scenarios, plus the client behaviours that do not depend on the local database (retried
//! BeginUpdate, staleness guard, renewal, typed errors, verifier).

mod verifier;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use topology_claims::domain::{DecommissionStep, LeaseSummary};
use topology_claims::memory::{MemoryClaimStore, MemoryLocalLeaseStore};
use topology_claims::{
    BeginUpdate, CellId, Claim, ClaimKey, ClaimRecord, ClaimState, ClaimStore, ClaimType,
    ClaimsError, ClaimsPage, ClaimsQuery, Lease, LeaseId, LeasesPage, LeasesQuery, LocalLeaseStore,
    OwnerType, TableName, Timestamp,
};
use topology_claims_client::{
    ClaimSource, ClaimsClient, ClientConfig, LocalClaim, LocalEnd, PendingUpdate, TransactionError,
    UpdateConfig, Verifier, VerifierConfig,
};
use topology_claims_testkit::cell::LocalDb;
use topology_claims_testkit::fixtures::{cell, creates, destroys, record_in, username};
use topology_claims_testkit::TestServer;

struct MemoryDb {
    store: MemoryLocalLeaseStore,
    users: Mutex<BTreeSet<String>>,
}

impl LocalDb for MemoryDb {
    type Store = MemoryLocalLeaseStore;

    fn lease_store(&self) -> MemoryLocalLeaseStore {
        self.store.clone()
    }

    async fn app_transaction(
        &self,
        name: &str,
        lease_id: LeaseId,
        commit: bool,
    ) -> Result<(), ClaimsError> {
        let mut tx = self.store.begin();
        self.store.record(&mut tx, lease_id).await?;
        if commit {
            self.store.commit(tx);
            self.users.lock().unwrap().insert(name.to_owned());
        }
        Ok(())
    }

    async fn committed_users(&self) -> Result<BTreeSet<String>, ClaimsError> {
        Ok(self.users.lock().unwrap().clone())
    }
}

async fn memory_db() -> MemoryDb {
    MemoryDb {
        store: MemoryLocalLeaseStore::new(),
        users: Mutex::default(),
    }
}

topology_claims_testkit::cell_scenarios!(memory_db);

async fn server() -> TestServer {
    TestServer::start(Arc::new(MemoryClaimStore::new())).await
}

fn client(server: &TestServer) -> ClaimsClient {
    ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap()
}

/// A memory store that meddles with BeginUpdate. With `delayed`, it applies the first one, then
/// answers too late for the client: a dropped response. With `held` (set by
/// [`hold_next_begin`](MeddlingStore::hold_next_begin)), it holds the next one that long before
/// applying it, even after its caller has gone (as a group-commit queue or a store transaction
/// being retried does), and keeps its answer in `late`. With `racer`, right after every
/// BeginUpdate that updates claims it has that cell try to create each of them, and looks each
/// up, recording what both saw (the window an update must never open).
struct MeddlingStore {
    inner: Arc<MemoryClaimStore>,
    delayed: Mutex<bool>,
    held: Mutex<Option<Duration>>,
    late: Arc<Mutex<Option<Result<Lease, ClaimsError>>>>,
    racer: Option<CellId>,
    seen: Mutex<Vec<SeenBegin>>,
}

/// A BeginUpdate as the store received it, and, for updates, what a racing create and a lookup
/// of each updated claim met while the lease was outstanding.
struct SeenBegin {
    request: BeginUpdate,
    raced: Vec<(Result<Lease, ClaimsError>, Result<Claim, ClaimsError>)>,
}

impl MeddlingStore {
    fn new(inner: MemoryClaimStore, delayed: bool, racer: Option<CellId>) -> Self {
        Self {
            inner: Arc::new(inner),
            delayed: Mutex::new(delayed),
            held: Mutex::default(),
            late: Arc::default(),
            racer,
            seen: Mutex::default(),
        }
    }
}

impl MeddlingStore {
    fn hold_next_begin(&self, hold: Duration) {
        *self.held.lock().unwrap() = Some(hold);
    }

    /// The held BeginUpdate's answer, once it has been applied.
    async fn late_answer(&self) -> Result<Lease, ClaimsError> {
        for _ in 0..500 {
            if let Some(answer) = self.late.lock().unwrap().clone() {
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the held BeginUpdate was not applied within 5 s");
    }
}

impl topology_claims::ports::WaitLine for MeddlingStore {}

#[async_trait]
impl ClaimStore for MeddlingStore {
    async fn begin_update(&self, request: BeginUpdate) -> Result<Lease, ClaimsError> {
        let held = self.held.lock().unwrap().take();
        if let Some(hold) = held {
            let (inner, late) = (self.inner.clone(), self.late.clone());
            let applied = tokio::spawn(async move {
                tokio::time::sleep(hold).await;
                let answer = inner.begin_update(request).await;
                *late.lock().unwrap() = Some(answer.clone());
                answer
            });
            return applied.await.expect("the held BeginUpdate");
        }
        let result = self.inner.begin_update(request.clone()).await;
        let mut raced = Vec::new();
        if let (Some(racer), Ok(_)) = (&self.racer, &result) {
            for record in &request.updates {
                let create = self
                    .inner
                    .begin_update(creates(racer, std::slice::from_ref(record)));
                raced.push((create.await, self.inner.lookup_claim(&record.key).await));
            }
        }
        self.seen.lock().unwrap().push(SeenBegin { request, raced });
        let first = std::mem::replace(&mut *self.delayed.lock().unwrap(), false);
        if first {
            tokio::time::sleep(Duration::from_millis(600)).await;
        }
        result
    }
    async fn commit_update(&self, c: &CellId, l: LeaseId) -> Result<(), ClaimsError> {
        self.inner.commit_update(c, l).await
    }
    async fn rollback_update(
        &self,
        c: &CellId,
        l: LeaseId,
        unrenewed_for: Option<Duration>,
    ) -> Result<(), ClaimsError> {
        self.inner.rollback_update(c, l, unrenewed_for).await
    }
    async fn renew_lease(&self, c: &CellId, l: LeaseId) -> Result<Lease, ClaimsError> {
        self.inner.renew_lease(c, l).await
    }
    async fn list_outstanding_leases(&self, q: &LeasesQuery) -> Result<LeasesPage, ClaimsError> {
        self.inner.list_outstanding_leases(q).await
    }
    async fn list_claims(&self, q: &ClaimsQuery) -> Result<ClaimsPage, ClaimsError> {
        self.inner.list_claims(q).await
    }
    async fn lookup_claim(&self, k: &ClaimKey) -> Result<Claim, ClaimsError> {
        self.inner.lookup_claim(k).await
    }
    async fn namespaces(
        &self,
    ) -> Result<Vec<topology_claims::domain::StoredNamespace>, ClaimsError> {
        self.inner.namespaces().await
    }
    async fn create_namespace(
        &self,
        spec: topology_claims::domain::NamespaceSpec,
        max: usize,
    ) -> Result<topology_claims::domain::StoredNamespace, ClaimsError> {
        self.inner.create_namespace(spec, max).await
    }
    async fn delete_namespace(&self, id: &str) -> Result<(), ClaimsError> {
        self.inner.delete_namespace(id).await
    }
    async fn update_namespace(
        &self,
        id: &str,
        update: topology_claims::domain::NamespaceUpdate,
    ) -> Result<topology_claims::domain::StoredNamespace, ClaimsError> {
        self.inner.update_namespace(id, update).await
    }
    async fn collect_outcomes(&self, r: Duration) -> Result<u64, ClaimsError> {
        self.inner.collect_outcomes(r).await
    }
    async fn count_claims(
        &self,
    ) -> Result<Vec<(topology_claims::domain::NamespaceId, u64)>, ClaimsError> {
        self.inner.count_claims().await
    }
    async fn lease_summary(&self) -> Result<LeaseSummary, ClaimsError> {
        self.inner.lease_summary().await
    }
    async fn decommission_step(
        &self,
        c: &CellId,
        batch: usize,
        dry_run: bool,
    ) -> Result<DecommissionStep, ClaimsError> {
        self.inner.decommission_step(c, batch, dry_run).await
    }
    async fn restore_state(
        &self,
    ) -> Result<Option<topology_claims::domain::RestoreEpoch>, topology_claims::ClaimsError> {
        self.inner.restore_state().await
    }
    async fn mark_restored(
        &self,
        request: &topology_claims::domain::MarkRestored,
    ) -> Result<topology_claims::domain::RestoreEpoch, topology_claims::ClaimsError> {
        self.inner.mark_restored(request).await
    }
    async fn report_verification_pass(
        &self,
        cell_id: &topology_claims::CellId,
        epoch: u64,
    ) -> Result<topology_claims::domain::RestoreEpoch, topology_claims::ClaimsError> {
        self.inner.report_verification_pass(cell_id, epoch).await
    }
    async fn lift_quarantine(
        &self,
        epoch: u64,
        reason: &str,
    ) -> Result<topology_claims::domain::RestoreEpoch, topology_claims::ClaimsError> {
        self.inner.lift_quarantine(epoch, reason).await
    }

    async fn read_events(
        &self,
        query: &topology_claims::domain::EventsQuery,
    ) -> Result<topology_claims::domain::EventsPage, topology_claims::ClaimsError> {
        self.inner.read_events(query).await
    }

    async fn compact_events(
        &self,
        retention: std::time::Duration,
        max_events: u64,
    ) -> Result<u64, topology_claims::ClaimsError> {
        self.inner.compact_events(retention, max_events).await
    }

    async fn acquire_verification_slot(
        &self,
        holder: &topology_claims::domain::SlotHolder,
        limit: topology_claims::domain::SlotLimit,
    ) -> Result<topology_claims::domain::SlotGrant, ClaimsError> {
        self.inner.acquire_verification_slot(holder, limit).await
    }
    async fn release_verification_slot(
        &self,
        holder: &topology_claims::domain::SlotHolder,
    ) -> Result<bool, ClaimsError> {
        self.inner.release_verification_slot(holder).await
    }
    fn retries(&self) -> u64 {
        self.inner.retries()
    }
}

#[tokio::test]
async fn begin_retried_after_a_dropped_response_yields_one_lease() {
    let store = Arc::new(MeddlingStore::new(MemoryClaimStore::new(), true, None));
    let server = TestServer::start(store.clone()).await;
    let config = ClientConfig {
        call_timeout: Duration::from_millis(200),
        ..ClientConfig::default()
    };
    let client = ClaimsClient::connect_lazy(&server.endpoint(), config).unwrap();
    let a = cell("cell-a");
    let lease = client
        .begin_update(creates(&a, &[username("once")]))
        .await
        .unwrap();
    let query = LeasesQuery::new(a.clone(), None, 10);
    let page = store.inner.list_outstanding_leases(&query).await.unwrap();
    assert_eq!(page.leases.len(), 1, "one lease, not two");
    assert_eq!(page.leases[0].lease_id, lease.lease_id);
    client.commit_update(&a, lease.lease_id).await.unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn errors_are_typed_for_the_application() {
    let server = server().await;
    let client = client(&server);
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    let lease = client
        .begin_update(creates(&a, &[username("taken")]))
        .await
        .unwrap();
    let err = client
        .begin_update(creates(&b, &[username("taken")]))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ClaimsError::ClaimLeased {
            claim: username("taken").key
        }
    );
    client.commit_update(&a, lease.lease_id).await.unwrap();
    let err = client
        .begin_update(creates(&b, &[username("taken")]))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ClaimsError::ClaimTaken {
            claim: username("taken").key
        }
    );
    assert_eq!(err.to_string(), "claim usernames/taken is already taken");
    server.shutdown().await;
}

#[tokio::test]
async fn unavailable_service_is_reported_after_retries() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let config = ClientConfig {
        max_attempts: 3,
        call_timeout: Duration::from_millis(300),
        ..ClientConfig::default()
    };
    let client = ClaimsClient::connect_lazy(&format!("http://127.0.0.1:{port}"), config).unwrap();
    let err = client
        .begin_update(creates(&cell("cell-a"), &[username("x")]))
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
}

#[tokio::test]
async fn staleness_guard_refuses_a_local_commit_past_the_window_and_rolls_back() {
    let server = server().await;
    let client = client(&server);
    let a = cell("cell-a");
    let local = MemoryLocalLeaseStore::new();
    let config = UpdateConfig {
        staleness: Duration::from_millis(400),
        safety_margin: Duration::from_millis(150),
        renew_every: None,
        ..UpdateConfig::default()
    };
    let pending = PendingUpdate::begin(&client, creates(&a, &[username("slow")]), config)
        .await
        .unwrap();
    assert!(
        pending.check_fresh().is_ok(),
        "fresh right after BeginUpdate"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let elapsed = pending
        .check_fresh()
        .expect_err("past the commit window of 250ms");
    let err = pending
        .finish::<(), String, _>(LocalEnd::Stale { elapsed }, &local)
        .await
        .unwrap_err();
    assert!(matches!(err, TransactionError::Stale { .. }), "{err:?}");
    let gone = client.lookup_claim(&username("slow").key).await;
    assert!(
        matches!(gone, Err(ClaimsError::ClaimNotFound { .. })),
        "rolled back: {gone:?}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn renewal_keeps_a_long_local_transaction_alive() {
    let server = server().await;
    let client = client(&server);
    let a = cell("cell-a");
    let local = MemoryLocalLeaseStore::new();
    let config = UpdateConfig {
        staleness: Duration::from_millis(400),
        safety_margin: Duration::from_millis(150),
        renew_every: Some(Duration::from_millis(50)),
        ..UpdateConfig::default()
    };
    let pending = PendingUpdate::begin(&client, creates(&a, &[username("long")]), config)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        pending.check_fresh().is_ok(),
        "renewal moved the window forward"
    );
    let query = LeasesQuery::new(a.clone(), None, 10);
    let page = client.list_outstanding_leases(&query).await.unwrap();
    assert!(
        page.leases[0].last_renewed_at > page.leases[0].created_at,
        "the server saw renewals"
    );
    let mut tx = local.begin();
    local.record(&mut tx, pending.lease_id()).await.unwrap();
    local.commit(tx);
    let ((), outcome) = pending
        .finish::<(), String, _>(LocalEnd::Committed(()), &local)
        .await
        .unwrap();
    assert_eq!(outcome, topology_claims_client::CommitOutcome::Committed);
    assert_eq!(
        client
            .lookup_claim(&username("long").key)
            .await
            .unwrap()
            .state,
        ClaimState::Active
    );
    assert!(
        local
            .find(&[page.leases[0].lease_id])
            .await
            .unwrap()
            .is_empty(),
        "local row deleted"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn commit_of_a_lease_rolled_back_meanwhile_names_the_lost_claims() {
    let server = server().await;
    let client = client(&server);
    let a = cell("cell-a");
    let local = MemoryLocalLeaseStore::new();
    let config = UpdateConfig {
        renew_every: None,
        ..UpdateConfig::default()
    };
    let pending = PendingUpdate::begin(&client, creates(&a, &[username("lost")]), config)
        .await
        .unwrap();
    // A (misconfigured) reconciler rolls the lease back while the local transaction commits.
    client
        .rollback_update(&a, pending.lease_id())
        .await
        .unwrap();
    let err = pending
        .finish::<(), String, _>(LocalEnd::Committed(()), &local)
        .await
        .unwrap_err();
    match err {
        TransactionError::LostClaims { claims, .. } => {
            assert_eq!(claims, vec![username("lost").key])
        }
        other => panic!("expected LostClaims, got {other:?}"),
    }
    server.shutdown().await;
}

/// A BeginUpdate whose first attempt is lost but applied later, after the retry was refused (the
/// Spanner campaign's one violation, docs/reliability.md): the client fences the lease id when it
/// hears the refusal, so the late attempt is refused too instead of leasing a claim its cell
/// believes it never got (decision 106).
#[tokio::test]
async fn a_lost_begin_applied_after_its_retry_was_refused_leases_nothing() {
    let store = Arc::new(MeddlingStore::new(MemoryClaimStore::new(), false, None));
    let server = TestServer::start(store.clone()).await;
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    let plain = client(&server);
    // cell-b's claim is being destroyed when cell-a's retry arrives: CLAIM_LEASED.
    let created = plain.begin_update(creates(&b, &[username("late")])).await;
    plain
        .commit_update(&b, created.unwrap().lease_id)
        .await
        .unwrap();
    let destroy = plain.begin_update(destroys(&b, &[username("late")])).await;
    let destroy = destroy.unwrap().lease_id;
    // cell-a's first attempt is held 1.5 s; the client gives up on it after 300 ms and retries.
    store.hold_next_begin(Duration::from_millis(1500));
    let config = ClientConfig {
        call_timeout: Duration::from_millis(300),
        ..ClientConfig::default()
    };
    let impatient = ClaimsClient::connect_lazy(&server.endpoint(), config).unwrap();
    let request = creates(&a, &[username("late")]);
    let refused = impatient.begin_update(request.clone()).await;
    assert!(
        matches!(refused, Err(ClaimsError::ClaimLeased { .. })),
        "{refused:?}"
    );
    // The destroy ends before the held attempt is applied: the claim is free by then.
    plain.commit_update(&b, destroy).await.unwrap();
    let late = store.late_answer().await;
    assert!(
        matches!(late, Err(ClaimsError::LeaseRolledBack { .. })),
        "the held attempt was applied as {late:?}"
    );
    let lookup = plain.lookup_claim(&username("late").key).await;
    assert!(
        matches!(lookup, Err(ClaimsError::ClaimNotFound { .. })),
        "{lookup:?}"
    );
}

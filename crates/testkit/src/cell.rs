//! Cell-side scenarios against the real gRPC server, generic over the cell's local database
//! ([`LocalDb`]): crashes at every phase boundary healed by one reconciler pass, concurrent
//! reconcilers acting once per lease, and the verifier repairing drift. Each backend whose
//! crate offers a `LocalLeaseStore` runs them through [`cell_scenarios!`](crate::cell_scenarios).

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::fixtures::{cell, email, username};
use crate::TestServer;
use topology_claims::domain::{BeginUpdate, CellId, ClaimState, LeaseId, LeasesQuery};
use topology_claims::error::ClaimsError;
use topology_claims::memory::MemoryClaimStore;
use topology_claims::ports::{LocalLeaseStore, LocalLock};
use topology_claims_client::{
    ClaimsClient, ClientConfig, PendingUpdate, Reconciler, ReconcilerConfig, UpdateConfig,
};

/// A cell's local database with an application table of users, for the scenarios.
pub trait LocalDb: Send + Sync {
    type Store: LocalLeaseStore + LocalLock + Clone + Send + Sync + 'static;

    /// A lease store over this database (a fresh handle; several may exist at once).
    fn lease_store(&self) -> Self::Store;

    /// The application's local transaction: inserts user `name` and records `lease_id` through
    /// `LocalLeaseStore::record` in the same transaction, then commits (or rolls back).
    fn app_transaction(
        &self,
        name: &str,
        lease_id: LeaseId,
        commit: bool,
    ) -> impl Future<Output = Result<(), ClaimsError>>;

    /// The users whose local transaction committed.
    fn committed_users(&self) -> impl Future<Output = Result<BTreeSet<String>, ClaimsError>>;
}

fn client_for(server: &TestServer) -> ClaimsClient {
    ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).expect("client")
}

fn signup(cell_id: &CellId, name: &str) -> BeginUpdate {
    BeginUpdate {
        local_transaction: None,
        cell_id: cell_id.clone(),
        lease_id: None,
        creates: vec![username(name), email(&format!("{name}@example.com"))],
        destroys: vec![],
        updates: Vec::new(),
    }
}

const STALENESS: Duration = Duration::from_millis(300);

fn no_renewal() -> UpdateConfig {
    UpdateConfig {
        staleness: STALENESS,
        safety_margin: Duration::from_millis(100),
        renew_every: None,
        ..UpdateConfig::default()
    }
}

/// Crashes at each phase boundary, then one reconciler pass past the staleness threshold:
/// every locally committed user holds its claims for the cell, nothing uncommitted keeps a
/// claim, and no lease and no local lease row remains.
pub async fn crash_at_every_phase_boundary_is_healed_by_one_reconcile_pass(db: &impl LocalDb) {
    let server = TestServer::start(Arc::new(MemoryClaimStore::new())).await;
    let client = client_for(&server);
    let cell_id = cell("cell-crash");
    let local = db.lease_store();

    // 1. Crash right after BeginUpdate: nothing local.
    let p = PendingUpdate::begin(&client, signup(&cell_id, "after-begin"), no_renewal())
        .await
        .unwrap();
    drop(p);
    // 2. Crash during the local transaction: it never commits.
    let p = PendingUpdate::begin(&client, signup(&cell_id, "during-local"), no_renewal())
        .await
        .unwrap();
    db.app_transaction("during-local", p.lease_id(), false)
        .await
        .unwrap();
    drop(p);
    // 3. Crash after the local commit, before CommitUpdate.
    let p = PendingUpdate::begin(
        &client,
        signup(&cell_id, "after-local-commit"),
        no_renewal(),
    )
    .await
    .unwrap();
    db.app_transaction("after-local-commit", p.lease_id(), true)
        .await
        .unwrap();
    drop(p);
    // 4. Crash after CommitUpdate, before the local lease row is deleted.
    let p = PendingUpdate::begin(&client, signup(&cell_id, "after-commit"), no_renewal())
        .await
        .unwrap();
    db.app_transaction("after-commit", p.lease_id(), true)
        .await
        .unwrap();
    client.commit_update(&cell_id, p.lease_id()).await.unwrap();
    drop(p);
    // 5. No crash, for contrast.
    let p = PendingUpdate::begin(&client, signup(&cell_id, "no-crash"), no_renewal())
        .await
        .unwrap();
    db.app_transaction("no-crash", p.lease_id(), true)
        .await
        .unwrap();
    p.finish::<(), ClaimsError, _>(topology_claims_client::LocalEnd::Committed(()), &local)
        .await
        .unwrap();

    tokio::time::sleep(STALENESS + Duration::from_millis(100)).await;
    let config = ReconcilerConfig {
        staleness: STALENESS,
        page_size: 2,
        ..ReconcilerConfig::new(cell_id.clone())
    };
    let report = Reconciler::new(client.clone(), local.clone(), config)
        .run_once()
        .await
        .unwrap();
    assert!(report.acted);
    assert_eq!(report.rolled_back, 2, "{report}");
    assert_eq!(report.errors, 0, "{report}");
    assert!(report.lost.is_empty(), "{report}");

    let committed = db.committed_users().await.unwrap();
    let expected: BTreeSet<String> = ["after-local-commit", "after-commit", "no-crash"]
        .map(String::from)
        .into();
    assert_eq!(committed, expected);
    for name in [
        "after-begin",
        "during-local",
        "after-local-commit",
        "after-commit",
        "no-crash",
    ] {
        for key in [
            username(name).key,
            email(&format!("{name}@example.com")).key,
        ] {
            let found = client.lookup_claim(&key).await;
            if committed.contains(name) {
                let claim = found.unwrap();
                assert_eq!(
                    (claim.cell_id.as_str(), claim.state),
                    ("cell-crash", ClaimState::Active),
                    "{key}"
                );
            } else {
                assert!(
                    matches!(found, Err(ClaimsError::ClaimNotFound { .. })),
                    "{key}: {found:?}"
                );
            }
        }
    }
    let leases = client
        .list_outstanding_leases(&LeasesQuery::new(cell_id, None, 100))
        .await
        .unwrap();
    assert!(leases.leases.is_empty(), "no outstanding lease remains");
    let far_future = topology_claims::domain::Timestamp::from_unix_micros(i64::MAX);
    assert!(
        local
            .list_older_than(far_future, 100)
            .await
            .unwrap()
            .is_empty(),
        "no local lease row remains"
    );
    server.shutdown().await;
}

/// Three reconcilers of one cell run at once: the local lock lets one act; every lease is
/// committed or rolled back exactly once in total.
pub async fn concurrent_reconcilers_act_on_each_lease_once(db: &impl LocalDb) {
    let server = TestServer::start(Arc::new(MemoryClaimStore::new())).await;
    let client = client_for(&server);
    let cell_id = cell("cell-reconcilers");
    for i in 0..20 {
        let p = PendingUpdate::begin(&client, signup(&cell_id, &format!("user{i}")), no_renewal())
            .await
            .unwrap();
        db.app_transaction(&format!("user{i}"), p.lease_id(), i % 2 == 0)
            .await
            .unwrap();
        drop(p);
    }
    tokio::time::sleep(STALENESS + Duration::from_millis(100)).await;
    let reconcilers: Vec<_> = (0..3)
        .map(|n| {
            let config = ReconcilerConfig {
                staleness: STALENESS,
                page_size: 3,
                holder: format!("reconciler-{n}"),
                ..ReconcilerConfig::new(cell_id.clone())
            };
            Reconciler::new(client.clone(), db.lease_store(), config)
        })
        .collect();
    let reports = futures::future::join_all(reconcilers.iter().map(|r| r.run_once())).await;
    let reports: Vec<_> = reports.into_iter().map(|r| r.unwrap()).collect();
    let committed: u64 = reports.iter().map(|r| r.committed).sum();
    let rolled_back: u64 = reports.iter().map(|r| r.rolled_back).sum();
    assert_eq!(
        (committed, rolled_back),
        (10, 10),
        "each lease acted on once: {reports:?}"
    );
    assert!(reports.iter().any(|r| r.acted));
    let leases = client
        .list_outstanding_leases(&LeasesQuery::new(cell_id, None, 100))
        .await
        .unwrap();
    assert!(leases.leases.is_empty());
    server.shutdown().await;
}

/// Expands to one `#[test]` per cell scenario for the [`LocalDb`] made by `$db().await`.
#[macro_export]
macro_rules! cell_scenarios {
    ($db:path) => {
        mod cell_scenarios {
            #[allow(unused_imports)]
            use super::*;
            $crate::__cell_cases!(
                $db;
                crash_at_every_phase_boundary_is_healed_by_one_reconcile_pass,
                concurrent_reconcilers_act_on_each_lease_once,
            );
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __cell_cases {
    ($db:path; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::run_async(async {
                    let db = $db().await;
                    $crate::cell::$case(&db).await;
                });
            }
        )*
    };
}

//! The shared ClaimStore and LocalLeaseStore suites, run against SQLite files. Every case (and
//! every model-test history) gets a fresh database file in its own temporary directory.

use std::time::Duration;

use async_trait::async_trait;
use rusqlite::Connection;
use tempfile::TempDir;
use topology_claims::testing::LocalLeaseFixture;
use topology_claims::{
    BeginUpdate, CellId, Claim, ClaimKey, ClaimStore, ClaimsError, ClaimsPage, ClaimsQuery, Lease,
    LeaseId, LeasesPage, LeasesQuery, LocalLeaseStore, MigrationPolicy,
};
use topology_claims_sqlite::{SqliteClaimStore, SqliteLocalLeaseStore};

/// A store on a fresh file that deletes its directory when dropped (the model test opens
/// hundreds of stores; none may be left behind).
struct TempStore {
    store: SqliteClaimStore,
    _dir: TempDir,
}

async fn store() -> TempStore {
    let dir = TempDir::new().expect("a temporary directory");
    let store = SqliteClaimStore::open(dir.path().join("claims.db"), MigrationPolicy::Apply)
        .await
        .expect("a fresh SQLite store");
    TempStore { store, _dir: dir }
}

topology_claims::claim_store_conformance!(store);

/// Plain delegation: the suite sees exactly the SQLite store.
#[async_trait]
impl ClaimStore for TempStore {
    async fn begin_update(&self, request: BeginUpdate) -> Result<Lease, ClaimsError> {
        self.store.begin_update(request).await
    }
    async fn commit_update(&self, cell_id: &CellId, lease_id: LeaseId) -> Result<(), ClaimsError> {
        self.store.commit_update(cell_id, lease_id).await
    }
    async fn rollback_update(
        &self,
        cell_id: &CellId,
        lease_id: LeaseId,
    ) -> Result<(), ClaimsError> {
        self.store.rollback_update(cell_id, lease_id).await
    }
    async fn renew_lease(&self, cell_id: &CellId, lease_id: LeaseId) -> Result<Lease, ClaimsError> {
        self.store.renew_lease(cell_id, lease_id).await
    }
    async fn list_outstanding_leases(
        &self,
        query: &LeasesQuery,
    ) -> Result<LeasesPage, ClaimsError> {
        self.store.list_outstanding_leases(query).await
    }
    async fn list_claims(&self, query: &ClaimsQuery) -> Result<ClaimsPage, ClaimsError> {
        self.store.list_claims(query).await
    }
    async fn lookup_claim(&self, key: &ClaimKey) -> Result<Claim, ClaimsError> {
        self.store.lookup_claim(key).await
    }
    async fn collect_outcomes(&self, retention: Duration) -> Result<u64, ClaimsError> {
        self.store.collect_outcomes(retention).await
    }
}

/// A cell's SQLite database: the store under test plus the application's own connection, on
/// which the local transactions run.
struct Fixture {
    store: SqliteLocalLeaseStore,
    app: Connection,
    _dir: TempDir,
}

impl LocalLeaseFixture for Fixture {
    type Store = SqliteLocalLeaseStore;

    fn store(&self) -> &Self::Store {
        &self.store
    }

    async fn record_in_transaction(
        &self,
        lease_id: LeaseId,
        commit: bool,
    ) -> Result<(), ClaimsError> {
        let mut tx = self
            .app
            .unchecked_transaction()
            .map_err(ClaimsError::internal)?;
        self.store.record(&mut tx, lease_id).await?;
        if commit { tx.commit() } else { tx.rollback() }.map_err(ClaimsError::internal)
    }
}

async fn fixture() -> Fixture {
    let dir = TempDir::new().expect("a temporary directory");
    let path = dir.path().join("cell.db");
    let store = SqliteLocalLeaseStore::open(&path)
        .await
        .expect("the local lease store");
    let app = Connection::open(&path).expect("the application's connection");
    Fixture {
        store,
        app,
        _dir: dir,
    }
}

topology_claims::local_lease_store_conformance!(fixture);

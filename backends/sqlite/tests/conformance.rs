//! The shared ClaimStore and LocalLeaseStore suites, run against SQLite files. Every case (and
//! every model-test history) gets a fresh database file in its own temporary directory.

use rusqlite::Connection;
use tempfile::TempDir;
use topology_claims::{ClaimsError, LeaseId, LocalLeaseStore, MigrationPolicy};
use topology_claims_sqlite::{SqliteClaimStore, SqliteLocalLeaseStore};
use topology_claims_testkit::LocalLeaseFixture;

/// A store on a fresh file, and its directory as the guard: the suite drops the store, then the
/// directory is deleted (the model test opens hundreds of stores; none may be left behind).
async fn store() -> (SqliteClaimStore, TempDir) {
    let dir = TempDir::new().expect("a temporary directory");
    let store = SqliteClaimStore::open(dir.path().join("claims.db"), MigrationPolicy::Apply)
        .await
        .expect("a fresh SQLite store");
    (store, dir)
}

topology_claims_testkit::claim_store_conformance!(store);
topology_claims_testkit::claim_store_watch_conformance!(store);
topology_claims_testkit::claim_store_wait_line_conformance!(store);

/// The same suite through the group-commit combiner.
mod grouped {
    async fn store() -> (
        topology_claims_server::group::GroupCommit,
        tempfile::TempDir,
    ) {
        topology_claims_testkit::grouped(super::store().await)
    }

    topology_claims_testkit::claim_store_conformance!(store);
    topology_claims_testkit::claim_store_watch_conformance!(store);
    topology_claims_testkit::claim_store_wait_line_conformance!(store);
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

topology_claims_testkit::local_lease_store_conformance!(fixture);

//! The shared ClaimStore and LocalLeaseStore suites (and the model-based proptest) against a real
//! PostgreSQL, each test in its own schema.

mod common;

use topology_claims::{ClaimsError, LeaseId, LocalLeaseStore};
use topology_claims_postgres::{tokio_postgres, PostgresClaimStore, PostgresLocalLeaseStore};
use topology_claims_testkit::LocalLeaseFixture;

async fn store() -> (PostgresClaimStore, ()) {
    match common::fresh_store().await {
        Some((store, _schema)) => (store, ()),
        None => common::skip_process(),
    }
}

topology_claims_testkit::claim_store_conformance!(store);
topology_claims_testkit::claim_store_watch_conformance!(store);
topology_claims_testkit::claim_store_wait_line_conformance!(store);

/// The same suite through the group-commit combiner.
mod grouped {
    async fn store() -> (topology_claims_server::group::GroupCommit, ()) {
        topology_claims_testkit::grouped(super::store().await)
    }

    topology_claims_testkit::claim_store_conformance!(store);
    topology_claims_testkit::claim_store_watch_conformance!(store);
    topology_claims_testkit::claim_store_wait_line_conformance!(store);
}

struct Fixture {
    store: PostgresLocalLeaseStore,
}

impl LocalLeaseFixture for Fixture {
    type Store = PostgresLocalLeaseStore;

    fn store(&self) -> &Self::Store {
        &self.store
    }

    async fn record_in_transaction(
        &self,
        lease_id: LeaseId,
        commit: bool,
    ) -> Result<(), ClaimsError> {
        let mut client = self.store.pool().get().await.map_err(common::test_error)?;
        let client: &mut tokio_postgres::Client = &mut client;
        let mut tx = client.transaction().await.map_err(common::test_error)?;
        self.store.record(&mut tx, lease_id).await?;
        if commit {
            tx.commit().await
        } else {
            tx.rollback().await
        }
        .map_err(common::test_error)
    }
}

async fn fixture() -> Fixture {
    match common::fresh_local_store().await {
        Some((_admin, _schema, store)) => Fixture { store },
        None => common::skip_process(),
    }
}

topology_claims_testkit::local_lease_store_conformance!(fixture);

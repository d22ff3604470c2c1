//! The in-memory adapters through the shared suite.

use topology_claims::memory::{MemoryClaimStore, MemoryLocalLeaseStore};
use topology_claims::{ClaimsError, LeaseId, LocalLeaseStore};
use topology_claims_testkit::LocalLeaseFixture;

async fn store() -> (MemoryClaimStore, ()) {
    (MemoryClaimStore::new(), ())
}

topology_claims_testkit::claim_store_conformance!(store, model_cases = 256);
topology_claims_testkit::claim_store_watch_conformance!(store);
topology_claims_testkit::claim_store_wait_line_conformance!(store);

/// The same suite through the group-commit combiner.
mod grouped {
    async fn store() -> (topology_claims_server::group::GroupCommit, ()) {
        topology_claims_testkit::grouped(super::store().await)
    }

    topology_claims_testkit::claim_store_conformance!(store, model_cases = 256);
    topology_claims_testkit::claim_store_watch_conformance!(store);
    topology_claims_testkit::claim_store_wait_line_conformance!(store);
}

struct Fixture(MemoryLocalLeaseStore);

impl LocalLeaseFixture for Fixture {
    type Store = MemoryLocalLeaseStore;

    fn store(&self) -> &MemoryLocalLeaseStore {
        &self.0
    }

    async fn record_in_transaction(
        &self,
        lease_id: LeaseId,
        commit: bool,
    ) -> Result<(), ClaimsError> {
        let mut tx = self.0.begin();
        self.0.record(&mut tx, lease_id).await?;
        if commit {
            self.0.commit(tx);
        }
        Ok(())
    }
}

async fn fixture() -> Fixture {
    Fixture(MemoryLocalLeaseStore::new())
}

topology_claims_testkit::local_lease_store_conformance!(fixture);

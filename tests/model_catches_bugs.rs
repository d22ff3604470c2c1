//! The model-based suite must fail for a store that breaks the protocol: a wrapper around the
//! in-memory store that forgets to refuse commits of unknown leases is caught.

use std::time::Duration;

use async_trait::async_trait;
use topology_claims::domain::{DecommissionStep, LeaseSummary};
use topology_claims::memory::MemoryClaimStore;
use topology_claims::{
    BeginUpdate, CellId, Claim, ClaimKey, ClaimStore, ClaimsError, ClaimsPage, ClaimsQuery, Lease,
    LeaseId, LeasesPage, LeasesQuery,
};

/// Answers OK to a commit of a lease it does not know instead of LEASE_NOT_FOUND.
struct ForgivingCommits(MemoryClaimStore);

impl topology_claims::ports::WaitLine for ForgivingCommits {}

#[async_trait]
impl ClaimStore for ForgivingCommits {
    async fn begin_update(&self, request: BeginUpdate) -> Result<Lease, ClaimsError> {
        self.0.begin_update(request).await
    }
    async fn commit_update(&self, cell_id: &CellId, lease_id: LeaseId) -> Result<(), ClaimsError> {
        match self.0.commit_update(cell_id, lease_id).await {
            Err(ClaimsError::LeaseNotFound { .. }) => Ok(()),
            other => other,
        }
    }
    async fn rollback_update(
        &self,
        cell_id: &CellId,
        lease_id: LeaseId,
        unrenewed_for: Option<std::time::Duration>,
    ) -> Result<(), ClaimsError> {
        self.0
            .rollback_update(cell_id, lease_id, unrenewed_for)
            .await
    }
    async fn renew_lease(&self, cell_id: &CellId, lease_id: LeaseId) -> Result<Lease, ClaimsError> {
        self.0.renew_lease(cell_id, lease_id).await
    }
    async fn list_outstanding_leases(
        &self,
        query: &LeasesQuery,
    ) -> Result<LeasesPage, ClaimsError> {
        self.0.list_outstanding_leases(query).await
    }
    async fn list_claims(&self, query: &ClaimsQuery) -> Result<ClaimsPage, ClaimsError> {
        self.0.list_claims(query).await
    }
    async fn lookup_claim(&self, key: &ClaimKey) -> Result<Claim, ClaimsError> {
        self.0.lookup_claim(key).await
    }
    async fn namespaces(
        &self,
    ) -> Result<Vec<topology_claims::domain::StoredNamespace>, ClaimsError> {
        self.0.namespaces().await
    }
    async fn create_namespace(
        &self,
        spec: topology_claims::domain::NamespaceSpec,
        max: usize,
    ) -> Result<topology_claims::domain::StoredNamespace, ClaimsError> {
        self.0.create_namespace(spec, max).await
    }
    async fn delete_namespace(&self, id: &str) -> Result<(), ClaimsError> {
        self.0.delete_namespace(id).await
    }
    async fn update_namespace(
        &self,
        id: &str,
        update: topology_claims::domain::NamespaceUpdate,
    ) -> Result<topology_claims::domain::StoredNamespace, ClaimsError> {
        self.0.update_namespace(id, update).await
    }
    async fn collect_outcomes(&self, retention: Duration) -> Result<u64, ClaimsError> {
        self.0.collect_outcomes(retention).await
    }
    async fn count_claims(
        &self,
    ) -> Result<Vec<(topology_claims::domain::NamespaceId, u64)>, ClaimsError> {
        self.0.count_claims().await
    }
    async fn lease_summary(&self) -> Result<LeaseSummary, ClaimsError> {
        self.0.lease_summary().await
    }
    async fn decommission_step(
        &self,
        cell_id: &CellId,
        batch: usize,
        dry_run: bool,
    ) -> Result<DecommissionStep, ClaimsError> {
        self.0.decommission_step(cell_id, batch, dry_run).await
    }
    async fn restore_state(
        &self,
    ) -> Result<Option<topology_claims::domain::RestoreEpoch>, topology_claims::ClaimsError> {
        self.0.restore_state().await
    }
    async fn mark_restored(
        &self,
        request: &topology_claims::domain::MarkRestored,
    ) -> Result<topology_claims::domain::RestoreEpoch, topology_claims::ClaimsError> {
        self.0.mark_restored(request).await
    }
    async fn report_verification_pass(
        &self,
        cell_id: &topology_claims::CellId,
        epoch: u64,
    ) -> Result<topology_claims::domain::RestoreEpoch, topology_claims::ClaimsError> {
        self.0.report_verification_pass(cell_id, epoch).await
    }
    async fn lift_quarantine(
        &self,
        epoch: u64,
        reason: &str,
    ) -> Result<topology_claims::domain::RestoreEpoch, topology_claims::ClaimsError> {
        self.0.lift_quarantine(epoch, reason).await
    }

    async fn read_events(
        &self,
        query: &topology_claims::domain::EventsQuery,
    ) -> Result<topology_claims::domain::EventsPage, topology_claims::ClaimsError> {
        self.0.read_events(query).await
    }

    async fn compact_events(
        &self,
        retention: std::time::Duration,
        max_events: u64,
    ) -> Result<u64, topology_claims::ClaimsError> {
        self.0.compact_events(retention, max_events).await
    }

    async fn acquire_verification_slot(
        &self,
        holder: &topology_claims::domain::SlotHolder,
        limit: topology_claims::domain::SlotLimit,
    ) -> Result<topology_claims::domain::SlotGrant, ClaimsError> {
        self.0.acquire_verification_slot(holder, limit).await
    }
    async fn release_verification_slot(
        &self,
        holder: &topology_claims::domain::SlotHolder,
    ) -> Result<bool, ClaimsError> {
        self.0.release_verification_slot(holder).await
    }
    fn retries(&self) -> u64 {
        self.0.retries()
    }
}

#[test]
#[should_panic(expected = "adapter diverged from the model")]
fn model_test_catches_a_store_that_accepts_commits_of_unknown_leases() {
    topology_claims_testkit::model::check_against_model(
        || async { (ForgivingCommits(MemoryClaimStore::new()), ()) },
        256,
    );
}

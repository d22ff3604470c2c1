//! The shared ClaimStore conformance suite and model-based property test, against the Cloud
//! Spanner emulator (a fresh database per store). Fewer model cases than the default: the
//! emulator runs one transaction at a time.

mod common;

use topology_claims_spanner::SpannerClaimStore;

async fn store() -> (SpannerClaimStore, ()) {
    (common::fresh_store(common::Mode::Plain).await, ())
}

topology_claims_testkit::claim_store_conformance!(store, model_cases = 8);
topology_claims_testkit::claim_store_watch_conformance!(store);
topology_claims_testkit::claim_store_wait_line_conformance!(store);

/// The same suite through the group-commit combiner.
mod grouped {
    async fn store() -> (topology_claims_server::group::GroupCommit, ()) {
        topology_claims_testkit::grouped(super::store().await)
    }

    topology_claims_testkit::claim_store_conformance!(store, model_cases = 8);
}

//! The shared ClaimStore conformance suite and model-based property test against the Spanner
//! store behind the combiner (`topology_claims::group::GroupCommit`): BeginUpdate, CommitUpdate
//! and RollbackUpdate go through `run_group`, one read-write transaction per group.

mod common;

use std::sync::Arc;

use topology_claims::group::{GroupCommit, GroupConfig};

async fn store() -> (GroupCommit, ()) {
    let store = common::fresh_store(common::Mode::Plain).await;
    (
        GroupCommit::new(Arc::new(store), GroupConfig::default()),
        (),
    )
}

topology_claims::claim_store_conformance!(store, model_cases = 8);

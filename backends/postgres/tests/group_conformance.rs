//! The shared ClaimStore suite (and the model-based proptest) against a real PostgreSQL with the
//! combiner on: every BeginUpdate, CommitUpdate and RollbackUpdate goes through
//! `GroupCommit` and so through the store's `run_group` (the array statements of group commit).

mod common;

use std::sync::Arc;

use topology_claims::group::{GroupCommit, GroupConfig};

async fn store() -> (GroupCommit, ()) {
    match common::fresh_store().await {
        Some((store, _schema)) => (
            GroupCommit::new(Arc::new(store), GroupConfig::default()),
            (),
        ),
        None => common::skip_process(),
    }
}

topology_claims::claim_store_conformance!(store);

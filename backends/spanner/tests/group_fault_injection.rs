//! Group commit under an emulator that aborts a share of commits at random
//! (`--enable_fault_injection`): an aborted group is re-run whole and decided afresh, so the
//! shared suite still passes behind the combiner and concurrent operations leave consistent
//! tables.

mod common;

use std::sync::Arc;

use topology_claims::group::{GroupCommit, GroupConfig};
use topology_claims::ClaimStore;

async fn store() -> (GroupCommit, ()) {
    let store = common::fresh_store(common::Mode::FaultInjection).await;
    (
        GroupCommit::new(Arc::new(store), GroupConfig::default()),
        (),
    )
}

topology_claims::claim_store_conformance!(store, model_cases = 8);

#[test]
fn aborted_groups_are_rerun_whole_and_leave_consistent_tables() {
    topology_claims::testing::run_async(async {
        // A share of commits aborts at random: run histories until some group was re-run (and
        // at least three of them).
        let mut retries = 0;
        for seed in 1..=30 {
            let (combiner, ()) = store().await;
            common::concurrent::random_operations(&combiner, seed).await;
            retries += combiner.retries();
            if retries > 0 && seed >= 3 {
                break;
            }
        }
        assert!(
            retries > 0,
            "30 histories under fault injection, no group re-run"
        );
    });
}

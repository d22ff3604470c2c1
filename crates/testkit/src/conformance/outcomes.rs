//! Lease outcomes: remembered for the retention period (so late calls learn how a lease ended),
//! then collected.

use std::time::Duration;

use crate::fixtures::{cell, creates, username};
use topology_claims::domain::ClaimState;
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;

use super::state_of;

pub async fn outcomes_are_forgotten_after_retention(store: &impl ClaimStore) {
    let a = cell("cell-a");
    let lease = store
        .begin_update(creates(&a, &[username("old-outcome")]))
        .await
        .unwrap();
    store.commit_update(&a, lease.lease_id).await.unwrap();
    store
        .collect_outcomes(Duration::from_secs(3600))
        .await
        .unwrap();
    store
        .commit_update(&a, lease.lease_id)
        .await
        .expect("still remembered within retention");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let collected = store
        .collect_outcomes(Duration::from_millis(1))
        .await
        .unwrap();
    assert!(collected >= 1, "the outcome is collected after retention");
    assert_eq!(
        store.commit_update(&a, lease.lease_id).await.unwrap_err(),
        ClaimsError::LeaseNotFound {
            lease_id: lease.lease_id
        }
    );
    assert_eq!(
        state_of(store, &username("old-outcome").key).await,
        Some(("cell-a".into(), ClaimState::Active))
    );
}

//! RenewLease: it moves `last_renewed_at` (and nothing else) of an outstanding lease, and is refused
//! for ended, unknown and other cells' leases.

use std::time::Duration;

use crate::fixtures::{cell, creates, lease_id, username};
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;

use super::leases_of;

pub async fn renew_moves_last_renewed_at(store: &impl ClaimStore) {
    let a = cell("cell-a");
    let lease = store
        .begin_update(creates(&a, &[username("zoe")]))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let renewed = store.renew_lease(&a, lease.lease_id).await.unwrap();
    assert_eq!(renewed.lease_id, lease.lease_id);
    assert_eq!(
        renewed.created_at, lease.created_at,
        "renewal keeps created_at"
    );
    assert_eq!(renewed.request, lease.request);
    assert!(
        renewed.last_renewed_at > lease.last_renewed_at,
        "renewal moves last_renewed_at"
    );
    let listed = leases_of(store, &a).await;
    assert_eq!(listed.leases[0].last_renewed_at, renewed.last_renewed_at);
    assert!(listed.server_time >= renewed.last_renewed_at);
}

pub async fn renew_of_ended_unknown_or_foreign_lease_fails(store: &impl ClaimStore) {
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    let committed_lease = store
        .begin_update(creates(&a, &[username("r1")]))
        .await
        .unwrap();
    store
        .commit_update(&a, committed_lease.lease_id)
        .await
        .unwrap();
    let rolled_back = store
        .begin_update(creates(&a, &[username("r2")]))
        .await
        .unwrap();
    store
        .rollback_update(&a, rolled_back.lease_id, None)
        .await
        .unwrap();
    let cases = [
        (
            &a,
            committed_lease.lease_id,
            ClaimsError::LeaseCommitted {
                lease_id: committed_lease.lease_id,
            },
        ),
        (
            &a,
            rolled_back.lease_id,
            ClaimsError::LeaseRolledBack {
                lease_id: rolled_back.lease_id,
            },
        ),
        (
            &a,
            lease_id(99),
            ClaimsError::LeaseNotFound {
                lease_id: lease_id(99),
            },
        ),
        (
            &b,
            committed_lease.lease_id,
            ClaimsError::NotLeaseOwner {
                lease_id: committed_lease.lease_id,
            },
        ),
    ];
    for (caller, id, expected) in cases {
        assert_eq!(store.renew_lease(caller, id).await.unwrap_err(), expected);
    }
}

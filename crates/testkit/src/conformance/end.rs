//! Ending a lease: CommitUpdate and RollbackUpdate, their effects on the claims, idempotency,
//! ownership, and the outcome each leaves for late calls.

use std::time::Duration;

use crate::fixtures::{cell, creates, destroys, email, lease_id, route, username};
use topology_claims::domain::{BeginUpdate, ClaimState};
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;

use super::{committed, leases_of, state_of};

pub async fn begin_then_commit_makes_claims_active(store: &impl ClaimStore) {
    let a = cell("cell-a");
    let batch = [
        username("alice"),
        email("alice@example.com"),
        route("alice"),
    ];
    let lease = store.begin_update(creates(&a, &batch)).await.unwrap();
    store.commit_update(&a, lease.lease_id).await.unwrap();
    for record in &batch {
        let claim = store.lookup_claim(&record.key).await.unwrap();
        assert_eq!(claim.state(), ClaimState::Active);
        assert_eq!(claim.cell_id, a);
        assert_eq!(claim.record, *record);
        assert_eq!(claim.lease, None);
    }
    assert!(
        leases_of(store, &a).await.leases.is_empty(),
        "a committed lease is no longer outstanding"
    );
}

pub async fn commit_is_idempotent(store: &impl ClaimStore) {
    let a = cell("cell-a");
    let lease = store
        .begin_update(creates(&a, &[username("liam")]))
        .await
        .unwrap();
    for _ in 0..3 {
        store.commit_update(&a, lease.lease_id).await.unwrap();
    }
    assert_eq!(
        state_of(store, &username("liam").key).await,
        Some(("cell-a".into(), ClaimState::Active))
    );
}

pub async fn commit_deletes_destroyed_claims_and_frees_them(store: &impl ClaimStore) {
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    committed(
        store,
        creates(&a, &[username("mia"), email("mia@example.com")]),
    )
    .await;
    let lease = store
        .begin_update(destroys(&a, &[username("mia")]))
        .await
        .unwrap();
    assert_eq!(
        state_of(store, &username("mia").key).await,
        Some(("cell-a".into(), ClaimState::Destroying))
    );
    store.commit_update(&a, lease.lease_id).await.unwrap();
    assert_eq!(state_of(store, &username("mia").key).await, None);
    assert_eq!(
        state_of(store, &email("mia@example.com").key).await,
        Some(("cell-a".into(), ClaimState::Active)),
        "claims outside the lease are untouched"
    );
    committed(store, creates(&b, &[username("mia")])).await;
    assert_eq!(
        state_of(store, &username("mia").key).await,
        Some(("cell-b".into(), ClaimState::Active))
    );
}

pub async fn commit_of_unknown_lease_is_not_found(store: &impl ClaimStore) {
    let err = store
        .commit_update(&cell("cell-a"), lease_id(404))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ClaimsError::LeaseNotFound {
            lease_id: lease_id(404)
        }
    );
}

pub async fn commit_of_another_cells_lease_is_denied(store: &impl ClaimStore) {
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    let lease = store
        .begin_update(creates(&a, &[username("noah")]))
        .await
        .unwrap();
    let denied = ClaimsError::NotLeaseOwner {
        lease_id: lease.lease_id,
    };
    assert_eq!(
        store.commit_update(&b, lease.lease_id).await.unwrap_err(),
        denied
    );
    assert_eq!(
        store
            .rollback_update(&b, lease.lease_id, None)
            .await
            .unwrap_err(),
        denied
    );
    assert_eq!(
        store.renew_lease(&b, lease.lease_id).await.unwrap_err(),
        denied
    );
    assert_eq!(
        state_of(store, &username("noah").key).await,
        Some(("cell-a".into(), ClaimState::Creating))
    );
    store.commit_update(&a, lease.lease_id).await.unwrap();
    assert_eq!(
        store.commit_update(&b, lease.lease_id).await.unwrap_err(),
        denied,
        "ended leases too"
    );
    assert_eq!(
        store
            .rollback_update(&b, lease.lease_id, None)
            .await
            .unwrap_err(),
        denied
    );
}

pub async fn commit_of_rolled_back_lease_fails(store: &impl ClaimStore) {
    let a = cell("cell-a");
    let lease = store
        .begin_update(creates(&a, &[username("olivia")]))
        .await
        .unwrap();
    store
        .rollback_update(&a, lease.lease_id, None)
        .await
        .unwrap();
    let err = store.commit_update(&a, lease.lease_id).await.unwrap_err();
    assert_eq!(
        err,
        ClaimsError::LeaseRolledBack {
            lease_id: lease.lease_id
        }
    );
    assert_eq!(state_of(store, &username("olivia").key).await, None);
}

pub async fn rollback_restores_destroys_and_frees_creates(store: &impl ClaimStore) {
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    committed(store, creates(&a, &[email("old@example.com")])).await;
    let request = BeginUpdate {
        local_transaction: None,
        cell_id: a.clone(),
        lease_id: None,
        creates: vec![email("new@example.com")],
        destroys: vec![email("old@example.com")],
        updates: Vec::new(),
    };
    let lease = store.begin_update(request).await.unwrap();
    store
        .rollback_update(&a, lease.lease_id, None)
        .await
        .unwrap();
    let restored = store
        .lookup_claim(&email("old@example.com").key)
        .await
        .unwrap();
    assert_eq!(
        (restored.state(), restored.cell_id.clone()),
        (ClaimState::Active, a.clone())
    );
    assert_eq!(state_of(store, &email("new@example.com").key).await, None);
    committed(store, creates(&b, &[email("new@example.com")])).await;
    assert_eq!(
        state_of(store, &email("new@example.com").key).await,
        Some(("cell-b".into(), ClaimState::Active)),
        "a rolled-back create is free for anyone"
    );
}

pub async fn rollback_is_idempotent(store: &impl ClaimStore) {
    let a = cell("cell-a");
    let lease = store
        .begin_update(creates(&a, &[username("paul")]))
        .await
        .unwrap();
    for _ in 0..3 {
        store
            .rollback_update(&a, lease.lease_id, None)
            .await
            .unwrap();
    }
    assert_eq!(state_of(store, &username("paul").key).await, None);
}

pub async fn rollback_of_committed_lease_fails(store: &impl ClaimStore) {
    let a = cell("cell-a");
    let lease = store
        .begin_update(creates(&a, &[username("quinn")]))
        .await
        .unwrap();
    store.commit_update(&a, lease.lease_id).await.unwrap();
    let err = store
        .rollback_update(&a, lease.lease_id, None)
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ClaimsError::LeaseCommitted {
            lease_id: lease.lease_id
        }
    );
    assert_eq!(
        state_of(store, &username("quinn").key).await,
        Some(("cell-a".into(), ClaimState::Active))
    );
}

pub async fn rollback_of_unknown_lease_is_remembered(store: &impl ClaimStore) {
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    let id = lease_id(11);
    store.rollback_update(&a, id, None).await.unwrap();
    store.rollback_update(&a, id, None).await.unwrap();
    // The BeginUpdate the client gave up on arrives late: refused, nothing leased.
    let late = BeginUpdate {
        lease_id: Some(id),
        ..creates(&a, &[username("rita")])
    };
    assert_eq!(
        store.begin_update(late).await.unwrap_err(),
        ClaimsError::LeaseRolledBack { lease_id: id }
    );
    assert_eq!(state_of(store, &username("rita").key).await, None);
    assert_eq!(
        store.commit_update(&a, id).await.unwrap_err(),
        ClaimsError::LeaseRolledBack { lease_id: id }
    );
    let foreign = BeginUpdate {
        lease_id: Some(id),
        ..creates(&b, &[username("rita")])
    };
    assert_eq!(
        store.begin_update(foreign).await.unwrap_err(),
        ClaimsError::LeaseIdConflict { lease_id: id }
    );
}

/// The window of the conditional-rollback cases: long enough that a store's round trip between
/// a renewal and the rollback never reaches it, short enough to wait out.
const WINDOW: Duration = Duration::from_millis(1500);

/// The reconciler's race: the lease is older than the window, but was renewed just before the
/// rollback arrives. The store measures from the renewal, by its own clock, and refuses; the
/// lease stays outstanding and the cell's commit succeeds.
pub async fn conditional_rollback_of_a_renewed_lease_is_refused_and_its_commit_succeeds(
    store: &impl ClaimStore,
) {
    let a = cell("cell-a");
    let lease = store
        .begin_update(creates(&a, &[username("renewed")]))
        .await
        .unwrap();
    tokio::time::sleep(WINDOW + Duration::from_millis(200)).await;
    store.renew_lease(&a, lease.lease_id).await.unwrap();
    assert_eq!(
        store
            .rollback_update(&a, lease.lease_id, Some(WINDOW))
            .await
            .unwrap_err(),
        ClaimsError::LeaseRenewed {
            lease_id: lease.lease_id
        }
    );
    assert_eq!(
        state_of(store, &username("renewed").key).await,
        Some(("cell-a".into(), ClaimState::Creating)),
        "a refused rollback leaves the lease as it was"
    );
    assert_eq!(leases_of(store, &a).await.leases.len(), 1);
    store.commit_update(&a, lease.lease_id).await.unwrap();
    assert_eq!(
        state_of(store, &username("renewed").key).await,
        Some(("cell-a".into(), ClaimState::Active))
    );
    // Ended leases answer as for an unconditional rollback.
    assert_eq!(
        store
            .rollback_update(&a, lease.lease_id, Some(WINDOW))
            .await
            .unwrap_err(),
        ClaimsError::LeaseCommitted {
            lease_id: lease.lease_id
        }
    );
}

/// A lease left unrenewed for the window is rolled back like an unconditional rollback, and
/// rolling it back again (conditionally or not) stays an idempotent success.
pub async fn conditional_rollback_of_an_idle_lease_succeeds(store: &impl ClaimStore) {
    let a = cell("cell-a");
    let window = Duration::from_millis(300);
    let lease = store
        .begin_update(creates(&a, &[username("idle")]))
        .await
        .unwrap();
    tokio::time::sleep(window + Duration::from_millis(100)).await;
    store
        .rollback_update(&a, lease.lease_id, Some(window))
        .await
        .unwrap();
    assert_eq!(state_of(store, &username("idle").key).await, None);
    store
        .rollback_update(&a, lease.lease_id, Some(window))
        .await
        .unwrap();
    store
        .rollback_update(&a, lease.lease_id, Some(Duration::from_secs(3600)))
        .await
        .unwrap();
    assert_eq!(
        store.commit_update(&a, lease.lease_id).await.unwrap_err(),
        ClaimsError::LeaseRolledBack {
            lease_id: lease.lease_id
        }
    );
}

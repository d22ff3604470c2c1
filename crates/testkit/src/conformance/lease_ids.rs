//! Client-chosen lease ids: a retried BeginUpdate returns the same lease, while the same id with
//! other content, from another cell, or after its lease ended is refused.

use crate::fixtures::{cell, creates, email, lease_id, username};
use topology_claims::domain::{BeginUpdate, GroupAnswer, GroupOp, LocalTransaction};
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;

use super::{leases_of, state_of};

pub async fn begin_retried_with_same_lease_id_returns_same_lease(store: &impl ClaimStore) {
    let a = cell("cell-a");
    let request = BeginUpdate {
        lease_id: Some(lease_id(21)),
        ..creates(&a, &[username("sam"), email("sam@example.com")])
    };
    let first = store.begin_update(request.clone()).await.unwrap();
    let again = store.begin_update(request.clone()).await.unwrap();
    assert_eq!(first, again, "a retried BeginUpdate returns the same lease");
    assert_eq!(
        leases_of(store, &a).await.leases.len(),
        1,
        "one lease, not two"
    );
    store.commit_update(&a, first.lease_id).await.unwrap();
    assert_eq!(
        store.begin_update(request).await.unwrap_err(),
        ClaimsError::LeaseCommitted {
            lease_id: lease_id(21)
        }
    );
}

pub async fn begin_with_same_lease_id_and_other_content_conflicts(store: &impl ClaimStore) {
    let a = cell("cell-a");
    let first = BeginUpdate {
        lease_id: Some(lease_id(22)),
        ..creates(&a, &[username("tina")])
    };
    store.begin_update(first).await.unwrap();
    let other = BeginUpdate {
        lease_id: Some(lease_id(22)),
        ..creates(&a, &[username("uma")])
    };
    assert_eq!(
        store.begin_update(other).await.unwrap_err(),
        ClaimsError::LeaseIdConflict {
            lease_id: lease_id(22)
        }
    );
    assert_eq!(state_of(store, &username("uma").key).await, None);
}

pub async fn begin_with_another_cells_lease_id_conflicts(store: &impl ClaimStore) {
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    let mine = BeginUpdate {
        lease_id: Some(lease_id(23)),
        ..creates(&a, &[username("victor")])
    };
    store.begin_update(mine).await.unwrap();
    // Same content from another cell: still a conflict, and nothing of a's lease is revealed.
    let theirs = BeginUpdate {
        lease_id: Some(lease_id(23)),
        ..creates(&b, &[username("victor")])
    };
    assert_eq!(
        store.begin_update(theirs).await.unwrap_err(),
        ClaimsError::LeaseIdConflict {
            lease_id: lease_id(23)
        }
    );
    store.commit_update(&a, lease_id(23)).await.unwrap();
    let theirs = BeginUpdate {
        lease_id: Some(lease_id(23)),
        ..creates(&b, &[username("walt")])
    };
    assert_eq!(
        store.begin_update(theirs).await.unwrap_err(),
        ClaimsError::LeaseIdConflict {
            lease_id: lease_id(23)
        },
        "an ended lease of another cell conflicts too"
    );
}

pub async fn begin_with_ended_lease_id_fails_with_its_outcome(store: &impl ClaimStore) {
    let a = cell("cell-a");
    let request = BeginUpdate {
        lease_id: Some(lease_id(24)),
        ..creates(&a, &[username("xena")])
    };
    store.begin_update(request.clone()).await.unwrap();
    store.rollback_update(&a, lease_id(24), None).await.unwrap();
    let other_content = BeginUpdate {
        creates: vec![username("yara")],
        ..request
    };
    assert_eq!(
        store.begin_update(other_content).await.unwrap_err(),
        ClaimsError::LeaseRolledBack {
            lease_id: lease_id(24)
        }
    );
}

/// The cell's local transaction is stored with the lease, returned unchanged by every call that
/// returns the original request (begin, its replay, the list, renew; lone or grouped), and is
/// part of the content a retry must repeat.
pub async fn local_transaction_is_kept_with_the_lease_and_is_part_of_its_content(
    store: &impl ClaimStore,
) {
    let a = cell("cell-a");
    let named =
        |text: &str| Some(LocalTransaction::parse_field(text, "local_transaction").unwrap());
    let request = BeginUpdate {
        lease_id: Some(lease_id(80)),
        local_transaction: named("pg:7311234567890123456:4294967298"),
        ..creates(&a, &[username("wanda")])
    };
    let lease = store.begin_update(request.clone()).await.unwrap();
    assert_eq!(lease.request, request, "kept as sent");
    assert_eq!(
        store.begin_update(request.clone()).await.unwrap(),
        lease,
        "a retry with the same local transaction replays the lease"
    );
    let listed = leases_of(store, &a).await.leases;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].request, request, "listed unchanged");
    let renewed = store.renew_lease(&a, lease_id(80)).await.unwrap();
    assert_eq!(renewed.request, request, "renew returns it unchanged");
    for other in [None, named("pg:7311234567890123456:4294967299")] {
        let retry = BeginUpdate {
            local_transaction: other,
            ..request.clone()
        };
        assert_eq!(
            store.begin_update(retry).await.unwrap_err(),
            ClaimsError::LeaseIdConflict {
                lease_id: lease_id(80)
            },
            "same id, other local transaction: other content"
        );
    }

    // Through group commit too, with a printable-ASCII value that is not PostgreSQL's format.
    let grouped = BeginUpdate {
        lease_id: Some(lease_id(81)),
        local_transaction: named("mysql:any printable ~ text"),
        ..creates(&a, &[email("wanda@example.com")])
    };
    let results = store
        .run_group(&[GroupOp::Begin {
            request: grouped.clone(),
            lease_id: lease_id(81),
        }])
        .await
        .unwrap();
    match &results[..] {
        [Ok(GroupAnswer::Begun(lease))] => assert_eq!(lease.request, grouped),
        other => panic!("expected the grouped lease, got {other:?}"),
    }
    let listed = leases_of(store, &a).await.leases;
    let found = listed.iter().find(|l| l.lease_id == lease_id(81)).unwrap();
    assert_eq!(
        found.request, grouped,
        "a grouped BeginUpdate stores it too"
    );
}

//! BeginUpdate, row by row of its status table: what a create or a destroy meets (taken, leased,
//! absent, another cell's), refusals before the store (empty batch, a claim twice), and that a
//! refused batch changes nothing, whatever its size.

use crate::fixtures::{cell, creates, destroys, email, lease_id, route, username};
use topology_claims::domain::{BeginUpdate, ClaimKey, ClaimState};
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;

use super::{committed, leases_of, state_of};

pub async fn begin_returns_the_lease_payload_with_the_original_request(store: &impl ClaimStore) {
    let a = cell("cell-a");
    let request = BeginUpdate {
        local_transaction: None,
        cell_id: a.clone(),
        lease_id: None,
        creates: vec![username("bob"), email("bob@example.com")],
        destroys: vec![],
        updates: Vec::new(),
    };
    let lease = store.begin_update(request.clone()).await.unwrap();
    assert_eq!(lease.cell_id, a);
    assert_eq!(
        lease.request, request,
        "the original request is kept as sent"
    );
    assert_eq!(lease.created_at, lease.last_renewed_at);
    assert!(lease.created_at.as_unix_micros() > 0);
    let chosen = BeginUpdate {
        lease_id: Some(lease_id(1)),
        creates: vec![route("bob")],
        ..request
    };
    let lease = store.begin_update(chosen.clone()).await.unwrap();
    assert_eq!(
        lease.lease_id,
        lease_id(1),
        "a client-chosen lease id is used"
    );
    assert_eq!(lease.request, chosen);
}

pub async fn create_of_committed_claim_is_taken(store: &impl ClaimStore) {
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    committed(store, creates(&a, &[email("carol@example.com")])).await;
    for caller in [&b, &a] {
        let err = store
            .begin_update(creates(caller, &[email("carol@example.com")]))
            .await;
        assert_eq!(
            err.unwrap_err(),
            ClaimsError::ClaimTaken {
                claim: email("carol@example.com").key
            },
            "taken for any cell, the owner's too"
        );
    }
}

/// A batch that meets several refusals is refused as its first claim's (in request order),
/// and lists every refused claim with its own refusal, so a form shows them all at once.
pub async fn every_refused_claim_of_a_batch_is_listed(store: &impl ClaimStore) {
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    committed(
        store,
        creates(&a, &[username("hal"), email("hal@example.com")]),
    )
    .await;
    store
        .begin_update(creates(&a, &[route("hal")]))
        .await
        .unwrap();
    // Sent in other forms than the holders': refusals name the claim as the caller sent it.
    let request = BeginUpdate {
        destroys: vec![username("ida")],
        ..creates(
            &b,
            &[
                username("HAL"),
                username("ivy"),
                route("hal"),
                email("Hal@Example.com"),
            ],
        )
    };
    let err = store.begin_update(request).await.unwrap_err();
    let ClaimsError::ClaimConflicts(listed) = &err else {
        panic!("expected every refusal listed, got {err:?}");
    };
    assert_eq!(
        err.refusal(),
        &ClaimsError::ClaimTaken {
            claim: ClaimKey::new(username("hal").key.namespace, "HAL")
        },
        "the first refused claim's refusal stands for the batch"
    );
    assert_eq!(err.reason(), "CLAIM_TAKEN");
    let refusals: Vec<(&str, &str, &str)> = listed
        .conflicts
        .iter()
        .map(|c| {
            (
                c.refusal.reason(),
                c.record.key.namespace.as_str(),
                c.record.display_value(),
            )
        })
        .collect();
    assert_eq!(
        refusals,
        [
            ("CLAIM_TAKEN", "usernames", "HAL"),
            ("CLAIM_LEASED", "routes", "hal"),
            ("CLAIM_TAKEN", "emails", "Hal@Example.com"),
            ("CLAIM_NOT_FOUND", "usernames", "ida"),
        ]
    );
    for conflict in &listed.conflicts {
        assert_eq!(
            conflict.refusal.claim().map(|k| k.value.as_str()),
            Some(conflict.record.display_value())
        );
    }
    assert_eq!(listed.omitted, 0);
    assert!(err.to_string().contains("and 3 more claim(s)"), "{err}");
    // Nothing was written: ivy is free.
    assert_eq!(state_of(store, &username("ivy").key).await, None);
}

pub async fn create_of_leased_claim_is_temporarily_refused(store: &impl ClaimStore) {
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    store
        .begin_update(creates(&a, &[username("dave")]))
        .await
        .unwrap();
    for caller in [&b, &a] {
        let err = store
            .begin_update(creates(caller, &[username("dave")]))
            .await
            .unwrap_err();
        assert_eq!(
            err,
            ClaimsError::ClaimLeased {
                claim: username("dave").key
            }
        );
    }
    // Leased for destruction: still leased, not taken.
    committed(store, creates(&a, &[username("erin")])).await;
    store
        .begin_update(destroys(&a, &[username("erin")]))
        .await
        .unwrap();
    let err = store
        .begin_update(creates(&b, &[username("erin")]))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ClaimsError::ClaimLeased {
            claim: username("erin").key
        }
    );
}

pub async fn destroy_of_leased_claim_is_temporarily_refused(store: &impl ClaimStore) {
    let a = cell("cell-a");
    store
        .begin_update(creates(&a, &[username("frank")]))
        .await
        .unwrap();
    let err = store
        .begin_update(destroys(&a, &[username("frank")]))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ClaimsError::ClaimLeased {
            claim: username("frank").key
        }
    );
    committed(store, creates(&a, &[username("grace")])).await;
    store
        .begin_update(destroys(&a, &[username("grace")]))
        .await
        .unwrap();
    let err = store
        .begin_update(destroys(&a, &[username("grace")]))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ClaimsError::ClaimLeased {
            claim: username("grace").key
        }
    );
}

pub async fn destroy_of_absent_claim_is_not_found(store: &impl ClaimStore) {
    let err = store
        .begin_update(destroys(&cell("cell-a"), &[username("nobody")]))
        .await;
    assert_eq!(
        err.unwrap_err(),
        ClaimsError::ClaimNotFound {
            claim: username("nobody").key
        }
    );
}

pub async fn destroy_of_another_cells_claim_is_denied(store: &impl ClaimStore) {
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    committed(store, creates(&a, &[username("heidi")])).await;
    let err = store
        .begin_update(destroys(&b, &[username("heidi")]))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ClaimsError::NotClaimOwner {
            claim: username("heidi").key
        }
    );
    // Ownership is permanent, a lease temporary: the permanent reason wins.
    store
        .begin_update(creates(&a, &[username("ivan")]))
        .await
        .unwrap();
    let err = store
        .begin_update(destroys(&b, &[username("ivan")]))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ClaimsError::NotClaimOwner {
            claim: username("ivan").key
        }
    );
    assert_eq!(
        state_of(store, &username("heidi").key).await,
        Some(("cell-a".into(), ClaimState::Active))
    );
}

pub async fn claim_twice_in_one_batch_is_a_batch_conflict(store: &impl ClaimStore) {
    let a = cell("cell-a");
    committed(store, creates(&a, &[username("judy")])).await;
    let twice_in_creates = creates(
        &a,
        &[username("new"), email("x@example.com"), username("new")],
    );
    let twice_in_destroys = destroys(&a, &[username("judy"), username("judy")]);
    let in_both = BeginUpdate {
        destroys: vec![username("judy")],
        ..creates(&a, &[username("judy")])
    };
    for (request, claim) in [
        (twice_in_creates, username("new").key),
        (twice_in_destroys, username("judy").key),
        (in_both, username("judy").key),
    ] {
        assert_eq!(
            store.begin_update(request).await.unwrap_err(),
            ClaimsError::BatchConflict { claim }
        );
    }
    assert_eq!(state_of(store, &username("new").key).await, None);
    assert_eq!(
        state_of(store, &username("judy").key).await,
        Some(("cell-a".into(), ClaimState::Active))
    );
}

pub async fn empty_batch_is_invalid(store: &impl ClaimStore) {
    let err = store
        .begin_update(creates(&cell("cell-a"), &[]))
        .await
        .unwrap_err();
    assert!(matches!(err, ClaimsError::InvalidRequest { .. }), "{err:?}");
}

pub async fn failed_batch_changes_nothing(store: &impl ClaimStore) {
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    committed(store, creates(&a, &[username("taken"), username("mine")])).await;
    let request = BeginUpdate {
        local_transaction: None,
        cell_id: b.clone(),
        lease_id: Some(lease_id(7)),
        creates: vec![username("fresh1"), username("fresh2"), username("taken")],
        destroys: vec![],
        updates: Vec::new(),
    };
    let err = store.begin_update(request).await.unwrap_err();
    assert_eq!(
        err,
        ClaimsError::ClaimTaken {
            claim: username("taken").key
        }
    );
    let mixed = BeginUpdate {
        local_transaction: None,
        cell_id: a.clone(),
        lease_id: None,
        creates: vec![username("fresh3")],
        destroys: vec![username("mine"), username("absent")],
        updates: Vec::new(),
    };
    let err = store.begin_update(mixed).await.unwrap_err();
    assert_eq!(
        err,
        ClaimsError::ClaimNotFound {
            claim: username("absent").key
        }
    );
    for absent in ["fresh1", "fresh2", "fresh3"] {
        assert_eq!(
            state_of(store, &username(absent).key).await,
            None,
            "{absent} not created"
        );
    }
    assert_eq!(
        state_of(store, &username("mine").key).await,
        Some(("cell-a".into(), ClaimState::Active))
    );
    for c in [a, b] {
        assert!(
            leases_of(store, &c).await.leases.is_empty(),
            "no lease left by a failed batch"
        );
    }
    // The failed lease id was never used: it can still be used.
    let retry = BeginUpdate {
        local_transaction: None,
        cell_id: cell("cell-b"),
        lease_id: Some(lease_id(7)),
        creates: vec![username("fresh1")],
        destroys: vec![],
        updates: Vec::new(),
    };
    store.begin_update(retry).await.unwrap();
}

pub async fn first_failing_claim_in_request_order_decides(store: &impl ClaimStore) {
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    committed(store, creates(&a, &[username("k1"), username("k2")])).await;
    store
        .begin_update(creates(&a, &[username("k3")]))
        .await
        .unwrap();
    // creates are checked before destroys, each list in order.
    let request = BeginUpdate {
        local_transaction: None,
        cell_id: b.clone(),
        lease_id: None,
        creates: vec![username("ok"), username("k3"), username("k1")],
        destroys: vec![username("k2")],
        updates: Vec::new(),
    };
    let err = store.begin_update(request).await.unwrap_err();
    assert_eq!(
        err.refusal(),
        &ClaimsError::ClaimLeased {
            claim: username("k3").key
        }
    );
    let request = BeginUpdate {
        local_transaction: None,
        cell_id: b,
        lease_id: None,
        creates: vec![username("ok")],
        destroys: vec![username("missing"), username("k2")],
        updates: Vec::new(),
    };
    let err = store.begin_update(request).await.unwrap_err();
    assert_eq!(
        err.refusal(),
        &ClaimsError::ClaimNotFound {
            claim: username("missing").key
        }
    );
}

pub async fn many_claims_in_one_batch_are_all_or_nothing(store: &impl ClaimStore) {
    let a = cell("cell-a");
    let batch: Vec<_> = (0..300)
        .map(|i| username(&format!("bulk-{i:03}")))
        .collect();
    committed(store, creates(&a, &batch[..150])).await;
    let err = store
        .begin_update(creates(&cell("cell-b"), &batch))
        .await
        .unwrap_err();
    assert_eq!(
        err.refusal(),
        &ClaimsError::ClaimTaken {
            claim: batch[0].key.clone()
        }
    );
    // 150 refused: the list is capped (at most MAX_LISTED_CONFLICTS, fewer through gRPC,
    // whose trailer is capped by bytes), the rest counted, none lost.
    let ClaimsError::ClaimConflicts(listed) = &err else {
        panic!("expected the refusals listed, got {err:?}");
    };
    assert!(listed.conflicts.len() <= topology_claims::domain::MAX_LISTED_CONFLICTS);
    assert!(listed.conflicts.len() >= 10, "{}", listed.conflicts.len());
    assert_eq!(listed.conflicts.len() + listed.omitted, 150);
    for (conflict, record) in listed.conflicts.iter().zip(&batch) {
        assert_eq!(conflict.record.key, record.key);
        assert_eq!(conflict.refusal.reason(), "CLAIM_TAKEN");
    }
    assert_eq!(state_of(store, &batch[299].key).await, None);
    let lease = store.begin_update(BeginUpdate {
        local_transaction: None,
        cell_id: a.clone(),
        lease_id: None,
        creates: batch[150..].to_vec(),
        destroys: batch[..150].to_vec(),
        updates: Vec::new(),
    });
    let lease = lease.await.unwrap();
    store.commit_update(&a, lease.lease_id).await.unwrap();
    assert_eq!(state_of(store, &batch[0].key).await, None);
    assert_eq!(
        state_of(store, &batch[299].key).await,
        Some(("cell-a".into(), ClaimState::Active))
    );
}

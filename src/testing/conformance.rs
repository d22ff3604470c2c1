//! The ClaimStore contract, one behaviour per function. Every adapter runs all of them through
//! [`claim_store_conformance!`](crate::claim_store_conformance); each gets a fresh, empty store.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::domain::{
    BeginUpdate, ClaimKey, ClaimState, ClaimType, ClaimsQuery, LeaseOp, LeasesQuery, TableName,
};
use crate::error::ClaimsError;
use crate::ports::ClaimStore;
use crate::testing::fixtures::{
    cell, creates, destroys, email, key, lease_id, record_in, route, username,
};

async fn state_of(store: &impl ClaimStore, key: &ClaimKey) -> Option<(String, ClaimState)> {
    match store.lookup_claim(key).await {
        Ok(claim) => Some((claim.cell_id.to_string(), claim.state())),
        Err(ClaimsError::ClaimNotFound { .. }) => None,
        Err(other) => panic!("lookup of {key} failed: {other}"),
    }
}

async fn leases_of(
    store: &impl ClaimStore,
    cell_id: &crate::domain::CellId,
) -> crate::domain::LeasesPage {
    let query = LeasesQuery {
        cell_id: cell_id.clone(),
        after: None,
        limit: 100,
    };
    store
        .list_outstanding_leases(&query)
        .await
        .expect("list_outstanding_leases")
}

async fn committed(store: &impl ClaimStore, request: BeginUpdate) {
    let cell_id = request.cell_id.clone();
    let lease = store.begin_update(request).await.expect("begin_update");
    store
        .commit_update(&cell_id, lease.lease_id)
        .await
        .expect("commit_update");
}

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

pub async fn begin_returns_the_lease_payload_with_the_original_request(store: &impl ClaimStore) {
    let a = cell("cell-a");
    let request = BeginUpdate {
        cell_id: a.clone(),
        lease_id: None,
        creates: vec![username("bob"), email("bob@example.com")],
        destroys: vec![],
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

pub async fn created_claims_are_routable_while_creating(store: &impl ClaimStore) {
    let a = cell("cell-a");
    let lease = store
        .begin_update(creates(&a, &[route("group/project")]))
        .await
        .unwrap();
    let claim = store
        .lookup_claim(&route("group/project").key)
        .await
        .unwrap();
    assert_eq!(claim.state(), ClaimState::Creating);
    assert_eq!(claim.cell_id, a);
    assert_eq!(
        claim.lease.map(|l| (l.lease_id, l.op)),
        Some((lease.lease_id, LeaseOp::Create))
    );
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
        cell_id: b.clone(),
        lease_id: Some(lease_id(7)),
        creates: vec![username("fresh1"), username("fresh2"), username("taken")],
        destroys: vec![],
    };
    let err = store.begin_update(request).await.unwrap_err();
    assert_eq!(
        err,
        ClaimsError::ClaimTaken {
            claim: username("taken").key
        }
    );
    let mixed = BeginUpdate {
        cell_id: a.clone(),
        lease_id: None,
        creates: vec![username("fresh3")],
        destroys: vec![username("mine"), username("absent")],
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
        cell_id: cell("cell-b"),
        lease_id: Some(lease_id(7)),
        creates: vec![username("fresh1")],
        destroys: vec![],
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
        cell_id: b.clone(),
        lease_id: None,
        creates: vec![username("ok"), username("k3"), username("k1")],
        destroys: vec![username("k2")],
    };
    let err = store.begin_update(request).await.unwrap_err();
    assert_eq!(
        err,
        ClaimsError::ClaimLeased {
            claim: username("k3").key
        }
    );
    let request = BeginUpdate {
        cell_id: b,
        lease_id: None,
        creates: vec![username("ok")],
        destroys: vec![username("missing"), username("k2")],
    };
    let err = store.begin_update(request).await.unwrap_err();
    assert_eq!(
        err,
        ClaimsError::ClaimNotFound {
            claim: username("missing").key
        }
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
        store.rollback_update(&b, lease.lease_id).await.unwrap_err(),
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
        store.rollback_update(&b, lease.lease_id).await.unwrap_err(),
        denied
    );
}

pub async fn commit_of_rolled_back_lease_fails(store: &impl ClaimStore) {
    let a = cell("cell-a");
    let lease = store
        .begin_update(creates(&a, &[username("olivia")]))
        .await
        .unwrap();
    store.rollback_update(&a, lease.lease_id).await.unwrap();
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
        cell_id: a.clone(),
        lease_id: None,
        creates: vec![email("new@example.com")],
        destroys: vec![email("old@example.com")],
    };
    let lease = store.begin_update(request).await.unwrap();
    store.rollback_update(&a, lease.lease_id).await.unwrap();
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
        store.rollback_update(&a, lease.lease_id).await.unwrap();
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
    let err = store.rollback_update(&a, lease.lease_id).await.unwrap_err();
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
    store.rollback_update(&a, id).await.unwrap();
    store.rollback_update(&a, id).await.unwrap();
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
    store.rollback_update(&a, lease_id(24)).await.unwrap();
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
        .rollback_update(&a, rolled_back.lease_id)
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

pub async fn list_outstanding_leases_pages_by_lease_id(store: &impl ClaimStore) {
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    let mut expected = BTreeSet::new();
    for i in 0..7 {
        let request = BeginUpdate {
            lease_id: Some(lease_id(100 + (i * 37) % 7)),
            ..creates(&a, &[username(&format!("l{i}"))])
        };
        expected.insert(store.begin_update(request).await.unwrap().lease_id);
    }
    let ended = store
        .begin_update(creates(&a, &[username("ended")]))
        .await
        .unwrap();
    store.commit_update(&a, ended.lease_id).await.unwrap();
    store
        .begin_update(creates(&b, &[username("other-cell")]))
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut after = None;
    let mut pages = 0;
    loop {
        let page = store
            .list_outstanding_leases(&LeasesQuery {
                cell_id: a.clone(),
                after,
                limit: 3,
            })
            .await
            .unwrap();
        pages += 1;
        assert!(page.leases.len() <= 3);
        assert!(page.leases.iter().all(|l| l.cell_id == a));
        assert!(page.leases.iter().all(|l| page.server_time >= l.created_at));
        seen.extend(page.leases.iter().map(|l| l.lease_id));
        match page.next_cursor {
            Some(cursor) => after = Some(cursor),
            None => break,
        }
        assert!(pages < 10, "pagination terminates");
    }
    assert_eq!(pages, 3);
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(seen, sorted, "ordered by lease id");
    assert_eq!(
        seen.into_iter().collect::<BTreeSet<_>>(),
        expected,
        "exactly the outstanding leases"
    );
}

pub async fn list_claims_pages_tile_the_id_space(store: &impl ClaimStore) {
    let a = cell("cell-a");
    // Records 0..12 of `users`, each implying one to three claims; other tables and cells as noise.
    let mut all = Vec::new();
    for id in 0..12i64 {
        for n in 0..(1 + id % 3) {
            let claim_type = [ClaimType::Username, ClaimType::Email, ClaimType::Routes][n as usize];
            all.push(record_in(
                TableName::Users,
                id * 10,
                claim_type,
                &format!("u{id}"),
            ));
        }
    }
    committed(store, creates(&a, &all)).await;
    committed(
        store,
        creates(
            &a,
            &[record_in(TableName::Groups, 5, ClaimType::Routes, "g")],
        ),
    )
    .await;
    committed(
        store,
        creates(
            &cell("cell-b"),
            &[record_in(TableName::Users, 15, ClaimType::Username, "b")],
        ),
    )
    .await;
    for limit in [1usize, 2, 3, 5, 1000] {
        let mut cursor = 0;
        let mut listed = Vec::new();
        let mut pages = 0;
        loop {
            let query = ClaimsQuery {
                cell_id: a.clone(),
                table_name: TableName::Users,
                cursor,
                limit,
            };
            let page = store.list_claims(&query).await.unwrap();
            pages += 1;
            assert_eq!(page.start_range, cursor, "pages are contiguous");
            assert!(page
                .claims
                .iter()
                .all(|c| (page.start_range..page.end_range).contains(&c.record.table_record_id)));
            let last_id = page.claims.last().map(|c| c.record.table_record_id);
            let before_last = page
                .claims
                .iter()
                .filter(|c| Some(c.record.table_record_id) != last_id)
                .count();
            assert!(
                page.claims.len() <= limit || before_last < limit,
                "a page exceeds its limit only to keep its last record's claims together"
            );
            listed.extend(page.claims.iter().map(|c| c.record.clone()));
            match page.next_cursor {
                Some(next) => {
                    assert_eq!(next, page.end_range);
                    cursor = next;
                }
                None => {
                    assert_eq!(
                        page.end_range,
                        i64::MAX,
                        "the last page reaches the end of the id space"
                    );
                    break;
                }
            }
            assert!(pages <= 40, "pagination terminates");
        }
        let mut expected = all.clone();
        expected.sort_by(|x, y| (x.table_record_id, &x.key).cmp(&(y.table_record_id, &y.key)));
        assert_eq!(
            listed, expected,
            "limit {limit}: every claim once, in order"
        );
    }
    let page = store
        .list_claims(&ClaimsQuery {
            cell_id: a.clone(),
            table_name: TableName::Users,
            cursor: 115,
            limit: 10,
        })
        .await
        .unwrap();
    assert!(page.claims.is_empty());
    assert_eq!(
        (page.start_range, page.end_range, page.next_cursor),
        (115, i64::MAX, None)
    );
}

pub async fn list_claims_includes_leased_claims_with_state(store: &impl ClaimStore) {
    let a = cell("cell-a");
    committed(
        store,
        creates(
            &a,
            &[record_in(TableName::Users, 1, ClaimType::Username, "kept")],
        ),
    )
    .await;
    committed(
        store,
        creates(
            &a,
            &[record_in(TableName::Users, 2, ClaimType::Username, "going")],
        ),
    )
    .await;
    store
        .begin_update(creates(
            &a,
            &[record_in(
                TableName::Users,
                3,
                ClaimType::Username,
                "coming",
            )],
        ))
        .await
        .unwrap();
    store
        .begin_update(destroys(
            &a,
            &[record_in(TableName::Users, 2, ClaimType::Username, "going")],
        ))
        .await
        .unwrap();
    let page = store
        .list_claims(&ClaimsQuery {
            cell_id: a,
            table_name: TableName::Users,
            cursor: 0,
            limit: 100,
        })
        .await
        .unwrap();
    let states: Vec<(i64, ClaimState)> = page
        .claims
        .iter()
        .map(|c| (c.record.table_record_id, c.state()))
        .collect();
    assert_eq!(
        states,
        vec![
            (1, ClaimState::Active),
            (2, ClaimState::Destroying),
            (3, ClaimState::Creating)
        ]
    );
}

pub async fn lookup_of_absent_claim_is_not_found(store: &impl ClaimStore) {
    let absent = key(ClaimType::Email, "ghost@example.com");
    assert_eq!(
        store.lookup_claim(&absent).await.unwrap_err(),
        ClaimsError::ClaimNotFound { claim: absent }
    );
}

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
        err,
        ClaimsError::ClaimTaken {
            claim: batch[0].key.clone()
        }
    );
    assert_eq!(state_of(store, &batch[299].key).await, None);
    let lease = store.begin_update(BeginUpdate {
        cell_id: a.clone(),
        lease_id: None,
        creates: batch[150..].to_vec(),
        destroys: batch[..150].to_vec(),
    });
    let lease = lease.await.unwrap();
    store.commit_update(&a, lease.lease_id).await.unwrap();
    assert_eq!(state_of(store, &batch[0].key).await, None);
    assert_eq!(
        state_of(store, &batch[299].key).await,
        Some(("cell-a".into(), ClaimState::Active))
    );
}

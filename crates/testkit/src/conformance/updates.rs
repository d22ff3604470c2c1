//! In-place updates: a claim of the caller changes owner, table and record id without ever being
//! free. Commit writes the new values (and moves the claim in ListClaims), rollback leaves it as
//! it was, the refusals come in the order of destroys, a key in two lists is a batch conflict,
//! and while the update is in flight the claim is routable as UPDATING with its old values, and
//! no other cell can take it.

use std::slice::from_ref;

use crate::fixtures::{cell, creates, destroys, moved, route, updates, username};
use topology_claims::domain::{
    BeginUpdate, ClaimState, ClaimsCursor, ClaimsQuery, LeaseOp, OwnerType, TableName,
};
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;

use super::{committed, leases_of, state_of};

/// The claims of `table` of cell `cell_id` as `(record id, value)`, first page.
async fn listed(store: &impl ClaimStore, cell_id: &str, table: TableName) -> Vec<(i64, String)> {
    let query = ClaimsQuery::new(cell(cell_id), table, ClaimsCursor::at(0), 100);
    let page = store.list_claims(&query).await.expect("list_claims");
    page.claims
        .into_iter()
        .map(|c| (c.record.table_record_id, c.record.key.value))
        .collect()
}

pub async fn update_commit_replaces_owner_and_record_in_place(store: &impl ClaimStore) {
    let a = cell("cell-a");
    let old = route("acme/app");
    committed(store, creates(&a, from_ref(&old))).await;
    let new = moved(&old, "acme", TableName::PROJECTS, 42);
    let lease = store
        .begin_update(updates(&a, from_ref(&new)))
        .await
        .unwrap();
    assert_eq!(
        lease.request.updates,
        vec![new.clone()],
        "the payload carries the new values"
    );
    store.commit_update(&a, lease.lease_id).await.unwrap();
    let claim = store.lookup_claim(&old.key).await.unwrap();
    assert_eq!(claim.record, new);
    assert_eq!((claim.cell_id, claim.lease), (a.clone(), None));
    assert!(leases_of(store, &a).await.leases.is_empty());
    assert_eq!(listed(store, "cell-a", TableName::ROUTES).await, vec![]);
    assert_eq!(
        listed(store, "cell-a", TableName::PROJECTS).await,
        vec![(42, "acme/app".to_owned())],
        "ListClaims finds the claim under its new table and record id"
    );
    store.commit_update(&a, lease.lease_id).await.unwrap();
    assert_eq!(
        store.lookup_claim(&old.key).await.unwrap().record,
        new,
        "commit is idempotent"
    );
}

pub async fn update_rollback_leaves_the_claim_as_it_was(store: &impl ClaimStore) {
    let a = cell("cell-a");
    let old = username("nora");
    committed(store, creates(&a, from_ref(&old))).await;
    let new = moved(&old, "team", TableName::GROUPS, 7);
    let lease = store.begin_update(updates(&a, &[new])).await.unwrap();
    store
        .rollback_update(&a, lease.lease_id, None)
        .await
        .unwrap();
    let claim = store.lookup_claim(&old.key).await.unwrap();
    assert_eq!((claim.record, claim.lease), (old.clone(), None));
    assert_eq!(listed(store, "cell-a", TableName::GROUPS).await, vec![]);
    assert_eq!(
        listed(store, "cell-a", TableName::USERS).await,
        vec![(1, "nora".to_owned())]
    );
    // Unleased again: it can be updated or destroyed.
    committed(store, destroys(&a, from_ref(&old))).await;
    assert_eq!(state_of(store, &old.key).await, None);
}

pub async fn update_refusals_come_in_the_order_of_destroys(store: &impl ClaimStore) {
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    let absent = username("nobody");
    let err = store.begin_update(updates(&a, from_ref(&absent))).await;
    assert_eq!(
        err.unwrap_err(),
        ClaimsError::ClaimNotFound { claim: absent.key }
    );
    // Another cell's claim, leased by its owner: NOT_CLAIM_OWNER wins over CLAIM_LEASED.
    committed(store, creates(&b, &[username("olga")])).await;
    store
        .begin_update(destroys(&b, &[username("olga")]))
        .await
        .unwrap();
    let err = store.begin_update(updates(&a, &[username("olga")])).await;
    assert_eq!(
        err.unwrap_err(),
        ClaimsError::NotClaimOwner {
            claim: username("olga").key
        }
    );
    // The caller's own claim, leased (creating, destroying, updating): CLAIM_LEASED.
    store
        .begin_update(creates(&a, &[username("pia")]))
        .await
        .unwrap();
    committed(store, creates(&a, &[username("quinn")])).await;
    store
        .begin_update(updates(&a, &[username("quinn")]))
        .await
        .unwrap();
    for name in ["pia", "quinn"] {
        let err = store.begin_update(updates(&a, &[username(name)])).await;
        assert_eq!(
            err.unwrap_err(),
            ClaimsError::ClaimLeased {
                claim: username(name).key
            }
        );
    }
    let err = store.begin_update(destroys(&a, &[username("quinn")])).await;
    assert_eq!(
        err.unwrap_err(),
        ClaimsError::ClaimLeased {
            claim: username("quinn").key
        },
        "an updating claim cannot be destroyed meanwhile"
    );
}

pub async fn a_key_in_two_of_creates_destroys_updates_is_a_batch_conflict(store: &impl ClaimStore) {
    let a = cell("cell-a");
    let rex = username("rex");
    committed(store, creates(&a, from_ref(&rex))).await;
    let new = moved(&rex, "p", TableName::PROJECTS, 2);
    let batches = [
        BeginUpdate {
            creates: vec![rex.clone()],
            ..updates(&a, from_ref(&new))
        },
        BeginUpdate {
            destroys: vec![rex.clone()],
            ..updates(&a, from_ref(&new))
        },
        updates(&a, &[new.clone(), rex.clone()]),
    ];
    for batch in batches {
        let err = store.begin_update(batch).await;
        assert_eq!(
            err.unwrap_err(),
            ClaimsError::BatchConflict {
                claim: rex.key.clone()
            }
        );
    }
    assert!(leases_of(store, &a).await.leases.is_empty());
    assert_eq!(store.lookup_claim(&rex.key).await.unwrap().record, rex);
}

pub async fn lookup_while_updating_shows_updating_with_the_old_values(store: &impl ClaimStore) {
    let a = cell("cell-a");
    let old = route("group/project");
    committed(store, creates(&a, from_ref(&old))).await;
    let lease = store
        .begin_update(updates(&a, &[moved(&old, "group", TableName::GROUPS, 9)]))
        .await
        .unwrap();
    let claim = store.lookup_claim(&old.key).await.unwrap();
    assert_eq!(claim.state(), ClaimState::Updating);
    assert_eq!(claim.record, old, "the current values until the commit");
    assert_eq!(claim.cell_id, a, "still routable to its cell");
    assert_eq!(
        claim.lease.map(|l| (l.lease_id, l.op)),
        Some((lease.lease_id, LeaseOp::Update))
    );
    let listed = listed(store, "cell-a", TableName::ROUTES).await;
    assert_eq!(listed, vec![(1, "group/project".to_owned())]);
}

pub async fn a_create_racing_an_update_is_leased_then_taken(store: &impl ClaimStore) {
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    let old = route("moving");
    committed(store, creates(&a, from_ref(&old))).await;
    let lease = store
        .begin_update(updates(
            &a,
            &[moved(&old, "new-owner", TableName::PROJECTS, 3)],
        ))
        .await
        .unwrap();
    let err = store.begin_update(creates(&b, from_ref(&old))).await;
    assert_eq!(
        err.unwrap_err(),
        ClaimsError::ClaimLeased {
            claim: old.key.clone()
        }
    );
    store.commit_update(&a, lease.lease_id).await.unwrap();
    let err = store.begin_update(creates(&b, from_ref(&old))).await;
    assert_eq!(
        err.unwrap_err(),
        ClaimsError::ClaimTaken {
            claim: old.key.clone()
        }
    );
    assert_eq!(
        state_of(store, &old.key).await,
        Some(("cell-a".into(), ClaimState::Active))
    );
}

/// Two source tables outside the legacy ones whose store numbers collide (a few hundred names
/// find a pair): stores key tables by that number and must tell the two apart by name.
fn colliding_tables() -> (TableName, TableName) {
    let mut seen = std::collections::HashMap::new();
    (0..)
        .find_map(|i| {
            let table = TableName::from_name(&format!("t{i}")).expect("a valid name");
            seen.insert(table.store_number(), table.clone())
                .map(|earlier| (earlier, table))
        })
        .expect("a collision")
}

pub async fn free_form_owner_types_and_tables_are_kept_listed_and_updated(store: &impl ClaimStore) {
    let a = cell("cell-a");
    let organization = OwnerType::from_name("organization").unwrap();
    let ssh_keys = TableName::from_name("ssh_keys").unwrap();
    let (first, second) = colliding_tables();
    let mut key = route("ssh-ed25519-abc");
    (key.owner_type, key.owner_value) = (organization.clone(), "org-7".into());
    (key.table_name, key.table_record_id) = (ssh_keys.clone(), 5);
    let mut in_first = route("in-first");
    (in_first.table_name, in_first.table_record_id) = (first.clone(), 1);
    let mut in_second = route("in-second");
    (in_second.table_name, in_second.table_record_id) = (second.clone(), 1);
    let legacy = username("legacy");
    committed(
        store,
        creates(&a, &[key.clone(), in_first, in_second, legacy]),
    )
    .await;
    let claim = store.lookup_claim(&key.key).await.unwrap();
    assert_eq!(claim.record, key, "owner type and table come back as sent");
    assert_eq!(
        listed(store, "cell-a", ssh_keys.clone()).await,
        vec![(5, "ssh-ed25519-abc".to_owned())]
    );
    assert_eq!(
        (
            listed(store, "cell-a", first).await,
            listed(store, "cell-a", second).await
        ),
        (
            vec![(1, "in-first".to_owned())],
            vec![(1, "in-second".to_owned())]
        ),
        "two tables sharing a store number list apart"
    );
    assert_eq!(
        listed(store, "cell-a", TableName::USERS).await,
        vec![(1, "legacy".to_owned())]
    );
    // An update moves the claim to another free-form table, and one back to a legacy owner.
    let deploy_keys = TableName::from_name("deploy_keys").unwrap();
    let new = moved(&key, "acme", deploy_keys.clone(), 6);
    committed(store, updates(&a, from_ref(&new))).await;
    let claim = store.lookup_claim(&key.key).await.unwrap();
    assert_eq!(claim.record, new);
    assert_eq!(claim.record.owner_type, OwnerType::PROJECT);
    assert_eq!(listed(store, "cell-a", ssh_keys).await, vec![]);
    assert_eq!(
        listed(store, "cell-a", deploy_keys).await,
        vec![(6, "ssh-ed25519-abc".to_owned())]
    );
}

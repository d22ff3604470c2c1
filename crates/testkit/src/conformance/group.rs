//! Group commit (`ClaimStore::run_group`): one store transaction decides its operations one by
//! one in arrival order, as the reference does. A later operation sees an earlier one's effect,
//! a refusal is its own result and does not abort its neighbours, and what the group committed
//! is what every later call sees.

use std::collections::BTreeMap;

use crate::fixtures::{cell, creates, destroys, lease_id, username};
use topology_claims::domain::{
    group, ClaimState, GroupAnswer, GroupOp, GroupResults, Tables, Timestamp,
};
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;

use super::{committed, state_of};

/// A result without what only the store decides (timestamps): the lease id, or the error.
fn outline(
    results: &GroupResults,
) -> Vec<Result<Option<topology_claims::domain::LeaseId>, ClaimsError>> {
    results
        .iter()
        .map(|r| match r {
            Ok(GroupAnswer::Begun(lease)) => Ok(Some(lease.lease_id)),
            Ok(GroupAnswer::Ended) => Ok(None),
            Err(e) => Err(e.clone()),
        })
        .collect()
}

pub async fn a_group_decides_each_operation_in_arrival_order(store: &impl ClaimStore) {
    let (a, b, c) = (cell("cell-a"), cell("cell-b"), cell("cell-c"));
    let (kept, fought, gone) = (username("kept"), username("fought"), username("gone"));
    committed(store, creates(&a, std::slice::from_ref(&gone))).await;
    // The reference starts from the same committed claim.
    let mut reference = Tables::default();
    let seed = creates(&a, std::slice::from_ref(&gone));
    let seed_lease = reference
        .begin_update(seed, lease_id(99), Timestamp::from_unix_micros(1))
        .unwrap();
    reference
        .commit_update(&a, seed_lease.lease_id, Timestamp::from_unix_micros(1))
        .unwrap();

    let begin = |request, n| GroupOp::Begin {
        request,
        lease_id: lease_id(n),
    };
    let ops = vec![
        // Two creates of one key: the first leases it, the second sees that lease.
        begin(creates(&a, std::slice::from_ref(&fought)), 1),
        begin(creates(&b, std::slice::from_ref(&fought)), 2),
        // The first is committed in the same group; the refused one's id is rolled back.
        GroupOp::Commit {
            cell_id: a.clone(),
            lease_id: lease_id(1),
        },
        GroupOp::Rollback {
            cell_id: b.clone(),
            lease_id: lease_id(2),
            unrenewed_for: None,
        },
        // Refusals in between change nothing: another cell's end, a destroy of a foreign claim.
        GroupOp::Commit {
            cell_id: b.clone(),
            lease_id: lease_id(1),
        },
        begin(destroys(&c, std::slice::from_ref(&gone)), 3),
        // The owner's destroy of the same claim, and an unrelated create left outstanding.
        begin(destroys(&a, std::slice::from_ref(&gone)), 4),
        begin(creates(&c, std::slice::from_ref(&kept)), 5),
        GroupOp::Commit {
            cell_id: a.clone(),
            lease_id: lease_id(4),
        },
    ];
    let results = store
        .run_group(&ops)
        .await
        .expect("the group's transaction");
    let now = Timestamp::from_unix_micros(2);
    let expected: GroupResults = ops
        .iter()
        .map(|op| group::apply_op(&mut reference, op, now))
        .collect();
    assert_eq!(outline(&results), outline(&expected));
    assert!(matches!(results[1], Err(ClaimsError::ClaimLeased { .. })));
    assert!(matches!(results[4], Err(ClaimsError::NotLeaseOwner { .. })));
    assert!(matches!(results[5], Err(ClaimsError::NotClaimOwner { .. })));

    // What the group committed is what every later call sees.
    let states: BTreeMap<&str, Option<(String, ClaimState)>> = BTreeMap::from([
        ("fought", state_of(store, &fought.key).await),
        ("gone", state_of(store, &gone.key).await),
        ("kept", state_of(store, &kept.key).await),
    ]);
    assert_eq!(
        states,
        BTreeMap::from([
            ("fought", Some(("cell-a".to_owned(), ClaimState::Active))),
            ("gone", None),
            ("kept", Some(("cell-c".to_owned(), ClaimState::Creating))),
        ])
    );
    let mut retry = creates(&b, std::slice::from_ref(&fought));
    retry.lease_id = Some(lease_id(2));
    let late = store.begin_update(retry).await.unwrap_err();
    assert!(
        matches!(late, ClaimsError::LeaseRolledBack { .. }),
        "the rolled-back id is remembered: {late:?}"
    );
    store.rollback_update(&c, lease_id(5), None).await.unwrap();
}

//! Namespaces: the store computes every key under its namespace's rules (`precis-username` for
//! the built-ins of a new store), so `John`, `john` and `ＪＯＨＮ` are one username, found by any
//! of its forms, and shown as its cell sent it.

use crate::fixtures::{cell, creates, destroys, lease_id, username};
use topology_claims::domain::{
    ClaimKey, ClaimsCursor, ClaimsQuery, NamespaceId, TableName, ValueRule,
};
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;

use super::{committed, state_of};

fn usernames() -> NamespaceId {
    NamespaceId::parse("usernames").unwrap()
}

pub async fn usernames_that_differ_in_case_or_width_are_one_claim(store: &impl ClaimStore) {
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    committed(store, creates(&a, &[username("John")])).await;
    for (caller, form) in [(&b, "john"), (&b, "ＪＯＨＮ"), (&a, "JOHN")] {
        assert_eq!(
            store
                .begin_update(creates(caller, &[username(form)]))
                .await
                .unwrap_err(),
            ClaimsError::ClaimTaken {
                claim: ClaimKey::new(usernames(), form)
            },
            "{form:?} is John's key; the refusal names the value as the caller sent it"
        );
    }
    for form in ["john", "ＪＯＨＮ", "jOhN"] {
        let claim = store
            .lookup_claim(&ClaimKey::new(usernames(), form))
            .await
            .unwrap_or_else(|e| panic!("lookup of {form:?}: {e}"));
        assert_eq!(claim.cell_id, a);
        assert_eq!(claim.record.key.value, "john", "the key");
        assert_eq!(claim.record.display_value(), "John", "as cell-a sent it");
    }
    assert_eq!(state_of(store, &username("amy").key).await, None);
}

pub async fn two_forms_of_one_name_in_a_batch_are_a_batch_conflict(store: &impl ClaimStore) {
    let a = cell("cell-a");
    let refused = store
        .begin_update(creates(&a, &[username("Amy"), username("amy")]))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, ClaimsError::BatchConflict { .. }),
        "{refused}"
    );
    assert_eq!(state_of(store, &username("amy").key).await, None);
}

pub async fn a_value_outside_the_rules_is_refused_naming_field_namespace_and_rule(
    store: &impl ClaimStore,
) {
    let a = cell("cell-a");
    match store
        .begin_update(creates(&a, &[username("ok"), username("two words")]))
        .await
    {
        Err(ClaimsError::InvalidClaimValue {
            field,
            namespace,
            rule,
            ..
        }) => {
            assert_eq!(field, "creates_claims[1].claim_value");
            assert_eq!(namespace, usernames());
            assert_eq!(rule, ValueRule::Normalization);
        }
        other => panic!("expected INVALID_CLAIM_VALUE, got {other:?}"),
    }
    assert_eq!(
        state_of(store, &username("ok").key).await,
        None,
        "all or nothing"
    );
    match store.lookup_claim(&username("☺").key).await {
        Err(ClaimsError::InvalidClaimValue { rule, .. }) => {
            assert_eq!(rule, ValueRule::Normalization)
        }
        other => panic!("a lookup applies the rules too, got {other:?}"),
    }
}

pub async fn a_destroy_by_another_form_destroys_the_claim(store: &impl ClaimStore) {
    let a = cell("cell-a");
    committed(store, creates(&a, &[username("Zoë")])).await;
    committed(store, destroys(&a, &[username("ZOË")])).await;
    assert_eq!(state_of(store, &username("zoë").key).await, None);
    committed(store, creates(&cell("cell-b"), &[username("zoë")])).await;
}

pub async fn a_replay_is_the_same_forms_and_another_form_conflicts(store: &impl ClaimStore) {
    let a = cell("cell-a");
    let first = creates(&a, &[username("ＭＩＡ")]);
    let first = topology_claims::domain::BeginUpdate {
        lease_id: Some(lease_id(7)),
        ..first
    };
    let lease = store.begin_update(first.clone()).await.unwrap();
    assert_eq!(lease.request.creates[0].display_value(), "ＭＩＡ");
    assert_eq!(lease.request.creates[0].key.value, "mia");
    let replay = store.begin_update(first.clone()).await.unwrap();
    assert_eq!(replay, lease, "the same request is the same lease");
    let other_form = topology_claims::domain::BeginUpdate {
        creates: vec![username("mia")],
        ..first
    };
    assert_eq!(
        store.begin_update(other_form).await.unwrap_err(),
        ClaimsError::LeaseIdConflict {
            lease_id: lease_id(7)
        },
        "a lease's content is what its cell sent"
    );
}

pub async fn listed_claims_carry_their_key_and_display_form(store: &impl ClaimStore) {
    let a = cell("cell-a");
    committed(store, creates(&a, &[username("Éva")])).await;
    let page = store
        .list_claims(&ClaimsQuery::new(
            a.clone(),
            TableName::Users,
            ClaimsCursor::at(0),
            10,
        ))
        .await
        .unwrap();
    let listed: Vec<(&str, &str)> = page
        .claims
        .iter()
        .map(|c| (c.record.key.value.as_str(), c.record.display_value()))
        .collect();
    assert_eq!(listed, vec![("éva", "Éva")]);
}

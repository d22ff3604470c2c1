//! Namespaces: the store computes every key under its namespace's rules (`precis-username` for
//! the built-ins of a new store), so `John`, `john` and `ＪＯＨＮ` are one username, found by any
//! of its forms, and shown as its cell sent it.

use crate::fixtures::{cell, creates, destroys, email, lease_id, record_in, route, username};
use topology_claims::domain::{
    ClaimKey, ClaimsCursor, ClaimsQuery, NamespaceId, NamespaceSpec, NamespaceUpdate,
    Normalization, StoredNamespace, TableName, ValueRule,
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
            TableName::USERS,
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

fn change() -> NamespaceUpdate {
    NamespaceUpdate::default()
}

async fn update(store: &impl ClaimStore, id: &str, update: NamespaceUpdate) -> StoredNamespace {
    store
        .update_namespace(id, update)
        .await
        .unwrap_or_else(|e| panic!("update of {id}: {e}"))
}

pub async fn namespaces_start_with_the_builtins_and_a_change_bumps_the_version(
    store: &impl ClaimStore,
) {
    let listed: Vec<(String, u64)> = store
        .namespaces()
        .await
        .unwrap()
        .iter()
        .map(|s| (s.namespace.id.to_string(), s.namespace.version))
        .collect();
    assert_eq!(
        listed,
        vec![
            ("emails".to_owned(), 1),
            ("routes".to_owned(), 1),
            ("usernames".to_owned(), 1)
        ]
    );
    let changed = update(
        store,
        "routes",
        NamespaceUpdate {
            description: Some("paths of groups and projects".into()),
            ..change()
        },
    )
    .await;
    assert_eq!(changed.namespace.version, 2);
    let read = store.namespaces().await.unwrap();
    assert!(
        read.contains(&changed),
        "the change is what the store holds"
    );
    assert_eq!(
        store
            .update_namespace("ssh-keys", change())
            .await
            .unwrap_err(),
        ClaimsError::NamespaceNotFound {
            namespace: "ssh-keys".into()
        }
    );
}

pub async fn a_deprecated_namespace_refuses_creates_only_and_replays_stand(
    store: &impl ClaimStore,
) {
    let a = cell("cell-a");
    committed(store, creates(&a, &[username("old")])).await;
    let begun = topology_claims::domain::BeginUpdate {
        lease_id: Some(lease_id(11)),
        ..creates(&a, &[username("Pending")])
    };
    let lease = store.begin_update(begun.clone()).await.unwrap();
    let deprecate = NamespaceUpdate {
        deprecated: Some(true),
        ..change()
    };
    update(store, "usernames", deprecate).await;
    assert_eq!(
        store
            .begin_update(creates(&a, &[username("new")]))
            .await
            .unwrap_err(),
        ClaimsError::NamespaceDeprecated {
            namespace: usernames()
        }
    );
    assert_eq!(
        store.begin_update(begun).await.unwrap(),
        lease,
        "a replay is decided under the rules of its first attempt"
    );
    store.commit_update(&a, lease.lease_id).await.unwrap();
    committed(store, destroys(&a, &[username("OLD")])).await;
    assert_eq!(state_of(store, &username("old").key).await, None);
    assert!(state_of(store, &username("pending").key).await.is_some());
}

pub async fn a_reserved_value_is_refused_to_creates_and_a_claimed_one_stays(
    store: &impl ClaimStore,
) {
    let a = cell("cell-a");
    committed(store, creates(&a, &[username("Admin")])).await;
    let reserve = NamespaceUpdate {
        reserved: Some(vec!["ADMIN".into(), "Root".into()]),
        ..change()
    };
    update(store, "usernames", reserve).await;
    match store
        .begin_update(creates(&cell("cell-b"), &[username("root")]))
        .await
    {
        Err(ClaimsError::InvalidClaimValue { rule, .. }) => assert_eq!(rule, ValueRule::Reserved),
        other => panic!("expected a reserved refusal, got {other:?}"),
    }
    assert_eq!(
        state_of(store, &username("admin").key).await.map(|s| s.0),
        Some(a.to_string()),
        "a reserved value already claimed stays claimed"
    );
}

pub async fn a_tighter_rule_is_applied_only_when_every_claim_passes_it(store: &impl ClaimStore) {
    let a = cell("cell-a");
    committed(
        store,
        creates(&a, &[username("abc"), username("longername")]),
    )
    .await;
    let tighten = NamespaceUpdate {
        max_chars: Some(5),
        ..change()
    };
    match store.update_namespace("usernames", tighten.clone()).await {
        Err(ClaimsError::NamespaceRulesConflict { problems, .. }) => {
            assert_eq!(problems.len(), 1, "{problems:?}");
            assert!(problems[0].contains("longername"), "{problems:?}");
        }
        other => panic!("expected NAMESPACE_RULES_CONFLICT, got {other:?}"),
    }
    committed(store, destroys(&a, &[username("longername")])).await;
    assert_eq!(
        update(store, "usernames", tighten)
            .await
            .namespace
            .rules
            .max_chars,
        5
    );
    match store.begin_update(creates(&a, &[username("sixsix")])).await {
        Err(ClaimsError::InvalidClaimValue { rule, .. }) => assert_eq!(rule, ValueRule::MaxChars),
        other => panic!("expected a max_chars refusal, got {other:?}"),
    }
    let pattern = NamespaceUpdate {
        pattern: Some(Some("^[a-z0-9/-]+$".into())),
        ..change()
    };
    committed(store, creates(&a, &[route("group/project")])).await;
    update(store, "routes", pattern).await;
    match store.begin_update(creates(&a, &[route("bad_route")])).await {
        Err(ClaimsError::InvalidClaimValue { rule, .. }) => assert_eq!(rule, ValueRule::Pattern),
        other => panic!("expected a pattern refusal, got {other:?}"),
    }
}

pub async fn a_normalization_change_rewrites_keys_unless_they_collide_or_are_leased(
    store: &impl ClaimStore,
) {
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    committed(store, creates(&a, &[email("Ann@Example.com")])).await;
    let exact = NamespaceUpdate {
        normalization: Some(Normalization::Exact),
        ..change()
    };
    update(store, "emails", exact).await;
    let found = store
        .lookup_claim(&email("Ann@Example.com").key)
        .await
        .unwrap();
    assert_eq!(
        found.record.key.value, "Ann@Example.com",
        "the key is the value again"
    );
    assert_eq!(found.record.display, None);
    assert_eq!(state_of(store, &email("ann@example.com").key).await, None);
    committed(store, creates(&b, &[email("ann@example.com")])).await;
    let precis = NamespaceUpdate {
        normalization: Some(Normalization::PrecisUsername),
        ..change()
    };
    match store.update_namespace("emails", precis.clone()).await {
        Err(ClaimsError::NamespaceRulesConflict { problems, .. }) => {
            assert!(
                problems[0].contains("would both have the key"),
                "{problems:?}"
            );
        }
        other => panic!("expected a collision, got {other:?}"),
    }
    committed(store, destroys(&b, &[email("ann@example.com")])).await;
    let leased = store
        .begin_update(creates(&b, &[email("Bob@Example.com")]))
        .await
        .unwrap();
    match store.update_namespace("emails", precis.clone()).await {
        Err(ClaimsError::NamespaceRulesConflict { problems, .. }) => {
            assert!(problems[0].contains("lease"), "{problems:?}");
        }
        other => panic!("a lease decided on the current keys must end first, got {other:?}"),
    }
    store.commit_update(&b, leased.lease_id).await.unwrap();
    update(store, "emails", precis).await;
    let found = store
        .lookup_claim(&email("ANN@EXAMPLE.COM").key)
        .await
        .unwrap();
    assert_eq!(
        (
            found.cell_id,
            found.record.key.value.as_str(),
            found.record.display_value()
        ),
        (a, "ann@example.com", "Ann@Example.com")
    );
    assert_eq!(
        state_of(store, &email("bob@example.com").key)
            .await
            .map(|s| s.0),
        Some(b.to_string())
    );
}

pub async fn a_created_namespace_takes_claims_under_its_rules_and_is_deleted_only_empty(
    store: &impl ClaimStore,
) {
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    let pages = NamespaceId::parse("pages-domains").unwrap();
    let spec = NamespaceSpec {
        pattern: Some("^[a-z0-9.-]+$".into()),
        description: "GitLab Pages domains".into(),
        ..NamespaceSpec::new("pages-domains", Normalization::AsciiCaseInsensitive)
    };
    let created = store.create_namespace(spec.clone(), 1000).await.unwrap();
    assert_eq!(created.namespace.version, 1);
    assert_eq!(created.number, pages.store_number());
    assert_eq!(
        store.create_namespace(spec, 1000).await.unwrap_err(),
        ClaimsError::NamespaceExists {
            namespace: pages.clone()
        }
    );
    let domain = |value: &str| record_in(TableName::PROJECTS, 7, pages.clone(), value);
    committed(store, creates(&a, &[domain("Example.COM")])).await;
    assert!(matches!(
        store
            .begin_update(creates(&b, &[domain("example.com")]))
            .await,
        Err(ClaimsError::ClaimTaken { .. })
    ));
    let found = store
        .lookup_claim(&ClaimKey::new(pages.clone(), "EXAMPLE.com"))
        .await
        .unwrap();
    assert_eq!(
        (
            found.cell_id.clone(),
            found.record.key.value.as_str(),
            found.record.display_value()
        ),
        (a.clone(), "example.com", "Example.COM")
    );
    match store
        .begin_update(creates(&b, &[domain("bad_domain")]))
        .await
    {
        Err(ClaimsError::InvalidClaimValue {
            rule, namespace, ..
        }) => {
            assert_eq!((rule, namespace), (ValueRule::Pattern, pages.clone()))
        }
        other => panic!("expected a pattern refusal, got {other:?}"),
    }
    let page = store
        .list_claims(&ClaimsQuery::new(
            a.clone(),
            TableName::PROJECTS,
            ClaimsCursor::at(0),
            10,
        ))
        .await
        .unwrap();
    assert_eq!(page.claims.len(), 1);
    assert_eq!(page.claims[0].record.key.namespace, pages);
    assert_eq!(
        store.delete_namespace("pages-domains").await.unwrap_err(),
        ClaimsError::NamespaceNotEmpty {
            namespace: pages.clone(),
            claims: 1
        }
    );
    assert!(matches!(
        store.delete_namespace("usernames").await,
        Err(ClaimsError::InvalidRequest { .. })
    ));
    committed(store, destroys(&a, &[domain("example.COM")])).await;
    store.delete_namespace("pages-domains").await.unwrap();
    assert!(matches!(
        store
            .lookup_claim(&ClaimKey::new(pages.clone(), "example.com"))
            .await,
        Err(ClaimsError::UnknownNamespace { .. })
    ));
    assert!(matches!(
        store
            .begin_update(creates(&a, &[domain("example.com")]))
            .await,
        Err(ClaimsError::UnknownNamespace { .. })
    ));
    assert_eq!(store.namespaces().await.unwrap().len(), 3);
}

pub async fn claims_are_counted_by_namespace_leased_ones_included(store: &impl ClaimStore) {
    assert_eq!(store.count_claims().await.unwrap(), vec![]);
    let a = cell("cell-a");
    committed(store, creates(&a, &[username("john"), username("mary")])).await;
    committed(store, creates(&a, &[route("acme")])).await;
    store
        .begin_update(creates(&a, &[email("leased@example.com")]))
        .await
        .unwrap();
    store
        .begin_update(destroys(&a, &[route("acme")]))
        .await
        .unwrap();
    let id = |text: &str| NamespaceId::parse(text).unwrap();
    assert_eq!(
        store.count_claims().await.unwrap(),
        vec![(id("emails"), 1), (id("routes"), 1), (id("usernames"), 2)]
    );
}

//! The namespace rules, value by value: keys, refusals and rule changes.
use super::*;

fn rules(normalization: Normalization) -> KeyRules {
    KeyRules {
        normalization,
        max_chars: DEFAULT_MAX_CHARS,
        pattern: None,
    }
}

fn key(normalization: Normalization, value: &str) -> String {
    rules(normalization).key_of(value).unwrap().into_owned()
}

#[test]
fn john_john_and_fullwidth_john_are_one_username_under_precis_and_three_under_exact() {
    let forms = ["John", "john", "ＪＯＨＮ"];
    let precis: BTreeSet<String> = forms
        .iter()
        .map(|v| key(Normalization::PrecisUsername, v))
        .collect();
    assert_eq!(precis, BTreeSet::from(["john".to_owned()]));
    let exact: BTreeSet<String> = forms.iter().map(|v| key(Normalization::Exact, v)).collect();
    assert_eq!(exact.len(), 3);
}

#[test]
fn ascii_case_insensitive_lowercases_ascii_letters_only() {
    assert_eq!(
        key(Normalization::AsciiCaseInsensitive, "Example.COM"),
        "example.com"
    );
    assert_eq!(key(Normalization::AsciiCaseInsensitive, "ÄB"), "Äb");
    assert_ne!(
        key(Normalization::AsciiCaseInsensitive, "ＪＯＨＮ"),
        key(Normalization::AsciiCaseInsensitive, "john")
    );
}

#[test]
fn precis_keeps_emails_and_routes_and_refuses_spaces_and_symbols() {
    assert_eq!(
        key(Normalization::PrecisUsername, "Juliet@Example.com"),
        "juliet@example.com"
    );
    assert_eq!(
        key(Normalization::PrecisUsername, "Group/Sub-Project_1.x"),
        "group/sub-project_1.x"
    );
    for value in ["two words", "smile☺", "tab\u{a0}nbsp"] {
        let refusal = rules(Normalization::PrecisUsername)
            .key_of(value)
            .unwrap_err();
        assert_eq!(refusal.rule, ValueRule::Normalization, "{value}");
        assert!(refusal.detail.contains("U+"), "{}", refusal.detail);
    }
}

#[test]
fn max_chars_counts_characters_of_the_key_not_bytes() {
    let three = KeyRules {
        max_chars: 3,
        ..rules(Normalization::PrecisUsername)
    };
    assert_eq!(three.key_of("ÉÉÉ").unwrap(), "ééé", "6 bytes, 3 characters");
    // Fullwidth letters are 3 bytes each and map to one ASCII character each.
    assert_eq!(three.key_of("ＡＢＣ").unwrap(), "abc");
    let refusal = three.key_of("abcd").unwrap_err();
    assert_eq!(refusal.rule, ValueRule::MaxChars);
    assert!(
        refusal.detail.contains("4 characters"),
        "{}",
        refusal.detail
    );
}

#[test]
fn pattern_is_matched_against_the_key() {
    let domains = KeyRules {
        pattern: Some(NamePattern::parse("^[a-z0-9.-]+$", "p").unwrap()),
        ..rules(Normalization::AsciiCaseInsensitive)
    };
    assert_eq!(
        domains.key_of("Pages.Example.COM").unwrap(),
        "pages.example.com"
    );
    let refusal = domains.key_of("under_score.com").unwrap_err();
    assert_eq!(refusal.rule, ValueRule::Pattern);
}

#[test]
fn reserved_values_are_compared_by_key_and_refuse_only_creates() {
    let mut spec = NamespaceSpec::new("usernames", Normalization::PrecisUsername);
    spec.reserved = vec!["Admin".into(), "ROOT".into()];
    let namespace = Namespace::from_spec(spec, 1).unwrap();
    let key = namespace.key_of("ADMIN", "v").unwrap();
    match namespace.check_create(&key, "creates_claims[0].claim_value") {
        Err(ClaimsError::InvalidClaimValue {
            rule, namespace, ..
        }) => {
            assert_eq!(rule, ValueRule::Reserved);
            assert_eq!(namespace.as_str(), "usernames");
        }
        other => panic!("expected a reserved refusal, got {other:?}"),
    }
    assert!(namespace.check_create("alice", "v").is_ok());
}

#[test]
fn a_deprecated_namespace_refuses_creates() {
    let mut spec = NamespaceSpec::new("old", Normalization::Exact);
    spec.deprecated = true;
    let namespace = Namespace::from_spec(spec, 1).unwrap();
    assert!(matches!(
        namespace.check_create("x", "v"),
        Err(ClaimsError::NamespaceDeprecated { .. })
    ));
    assert_eq!(
        namespace.key_of("x", "v").unwrap(),
        "x",
        "lookups still work"
    );
}

#[test]
fn namespace_ids_follow_their_grammar() {
    for ok in ["a", "ssh-keys", "pages.domains", "0", &"a".repeat(63)] {
        assert!(NamespaceId::parse(ok).is_ok(), "{ok}");
    }
    for bad in ["", "Users", "-x", ".x", "a b", "ü", &"a".repeat(64)] {
        assert!(NamespaceId::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn built_ins_stand_for_the_legacy_claim_types() {
    for claim_type in ClaimType::ALL {
        let id = NamespaceId::of_claim_type(*claim_type);
        assert_eq!(id.claim_type(), Some(*claim_type));
        let builtin = Namespace::builtin(*claim_type);
        assert_eq!(builtin.rules.normalization, Normalization::PrecisUsername);
        assert_eq!(builtin.rules.max_chars, 255);
    }
    assert_eq!(NamespaceId::parse("ssh-keys").unwrap().claim_type(), None);
}

#[test]
fn bad_definitions_are_refused_naming_the_field() {
    let field = |spec: NamespaceSpec| match Namespace::from_spec(spec, 1) {
        Err(ClaimsError::InvalidRequest { field, .. }) => field,
        other => panic!("expected InvalidRequest, got {other:?}"),
    };
    let base = NamespaceSpec::new("x", Normalization::PrecisUsername);
    assert_eq!(
        field(NamespaceSpec {
            max_chars: 0,
            ..base.clone()
        }),
        "namespace.max_chars"
    );
    assert_eq!(
        field(NamespaceSpec {
            pattern: Some("(".into()),
            ..base.clone()
        }),
        "namespace.pattern"
    );
    assert_eq!(
        field(NamespaceSpec {
            reserved: vec!["ok".into(), "not ok".into()],
            ..base.clone()
        }),
        "namespace.reserved[1]"
    );
    assert_eq!(
        field(NamespaceSpec {
            id: "Bad".into(),
            ..base
        }),
        "namespace.id"
    );
}

#[test]
fn only_rules_that_may_refuse_an_existing_claim_need_a_proof() {
    let current = Namespace::from_spec(NamespaceSpec::new("x", Normalization::Exact), 1).unwrap();
    let change = |update: NamespaceUpdate| decide_namespace_update(&current, update).unwrap();
    for free in [
        NamespaceUpdate {
            description: Some("d".into()),
            ..Default::default()
        },
        NamespaceUpdate {
            deprecated: Some(true),
            ..Default::default()
        },
        NamespaceUpdate {
            reserved: Some(vec!["admin".into()]),
            ..Default::default()
        },
        NamespaceUpdate {
            max_chars: Some(255),
            ..Default::default()
        },
        NamespaceUpdate {
            pattern: Some(None),
            ..Default::default()
        },
    ] {
        let next = change(free.clone());
        assert!(!next.needs_proof, "{free:?}");
        assert_eq!(next.next.version, 2);
    }
    for tightening in [
        NamespaceUpdate {
            normalization: Some(Normalization::PrecisUsername),
            ..Default::default()
        },
        NamespaceUpdate {
            max_chars: Some(10),
            ..Default::default()
        },
        NamespaceUpdate {
            pattern: Some(Some("^[a-z]+$".into())),
            ..Default::default()
        },
    ] {
        assert!(change(tightening.clone()).needs_proof, "{tightening:?}");
    }
}

fn claim(key: &str, display: &str) -> ProofClaim {
    ProofClaim {
        key: key.into(),
        display_value: display.into(),
        leased: false,
    }
}

#[test]
fn a_normalization_change_without_collisions_rekeys_the_claims() {
    let id = NamespaceId::parse("usernames").unwrap();
    let claims = [claim("John", "John"), claim("mary", "mary")];
    let rekeys = prove_rules(
        &id,
        &rules(Normalization::Exact),
        &rules(Normalization::PrecisUsername),
        &claims,
    )
    .unwrap();
    assert_eq!(
        rekeys,
        vec![Rekey {
            old_key: "John".into(),
            new_key: "john".into()
        }]
    );
}

#[test]
fn a_normalization_change_with_collisions_is_refused_listing_them() {
    let id = NamespaceId::parse("usernames").unwrap();
    let claims = [
        claim("John", "John"),
        claim("john", "john"),
        claim("a b", "a b"),
    ];
    match prove_rules(
        &id,
        &rules(Normalization::Exact),
        &rules(Normalization::PrecisUsername),
        &claims,
    ) {
        Err(ClaimsError::NamespaceRulesConflict { problems, more, .. }) => {
            assert_eq!(problems.len(), 2, "{problems:?}");
            assert!(
                problems[0].contains("\"John\" and \"john\""),
                "{problems:?}"
            );
            assert!(problems[1].contains("normalization"), "{problems:?}");
            assert_eq!(more, 0);
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
}

#[test]
fn a_normalization_change_waits_for_leases_on_the_namespace() {
    let id = NamespaceId::parse("x").unwrap();
    let claims = [ProofClaim {
        leased: true,
        ..claim("a", "a")
    }];
    assert!(prove_rules(
        &id,
        &rules(Normalization::Exact),
        &rules(Normalization::PrecisUsername),
        &claims
    )
    .is_err());
    let tighter = KeyRules {
        max_chars: 5,
        ..rules(Normalization::Exact)
    };
    assert_eq!(
        prove_rules(&id, &rules(Normalization::Exact), &tighter, &claims).unwrap(),
        vec![],
        "a tightening that rewrites no key does not wait for leases"
    );
}

#[test]
fn a_refused_change_lists_the_first_problems_and_counts_the_rest() {
    let id = NamespaceId::parse("x").unwrap();
    let claims: Vec<ProofClaim> = (0..25)
        .map(|i| {
            let v = format!("long-value-{i}");
            claim(&v, &v)
        })
        .collect();
    let tighter = KeyRules {
        max_chars: 4,
        ..rules(Normalization::Exact)
    };
    match prove_rules(&id, &rules(Normalization::Exact), &tighter, &claims) {
        Err(ClaimsError::NamespaceRulesConflict { problems, more, .. }) => {
            assert_eq!(problems.len(), MAX_LISTED_PROBLEMS);
            assert_eq!(more, 15);
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
}

#[test]
fn a_verify_query_names_a_namespace_by_id_or_by_its_legacy_claim_type() {
    let emails = NamespaceId::parse("emails").unwrap();
    assert_eq!(
        NamespaceId::from_name_or_legacy("email"),
        Some(emails.clone())
    );
    assert_eq!(
        NamespaceId::from_name_or_legacy("emails"),
        Some(emails.clone())
    );
    assert_eq!(NamespaceId::from_legacy_number(3), Some(emails));
    assert_eq!(
        NamespaceId::from_name_or_legacy("ssh-keys").map(|id| id.to_string()),
        Some("ssh-keys".to_owned())
    );
    assert_eq!(NamespaceId::from_name_or_legacy("Not An Id"), None);
    assert_eq!(NamespaceId::from_legacy_number(4), None);
}

proptest::proptest! {
    /// The printable-ASCII fast path of `precis-username` is the profile itself: for every
    /// ASCII string (spaces, controls and the empty string included, which take the general
    /// path) the key, or the refusal, is what `precis-profiles` says.
    #[test]
    fn the_ascii_fast_path_agrees_with_the_precis_crate(value in "[\\x00-\\x7f]{0,24}") {
        use precis_core::profile::PrecisFastInvocation;
        let crate_says = precis_profiles::UsernameCaseMapped::enforce(value.as_str())
            .map(|key| key.into_owned())
            .ok();
        let ours = Normalization::PrecisUsername
            .apply(&value)
            .map(|key| key.into_owned())
            .ok();
        proptest::prop_assert_eq!(ours, crate_says);
    }
}

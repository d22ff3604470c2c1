//! The authorization table, cell by cell.
use super::*;

fn verified(role: Role, name: &str) -> Caller {
    Caller::Verified(Principal {
        role,
        name: name.to_owned(),
        id: format!("spiffe://topology-claims/{}/{name}", role.name()),
    })
}

const CLAIMS_METHODS: [Method; 11] = [
    Method::BeginUpdate,
    Method::CommitUpdate,
    Method::RollbackUpdate,
    Method::RenewLease,
    Method::ListOutstandingLeases,
    Method::ListClaims,
    Method::StreamClaims,
    Method::LookupClaim,
    Method::AcquireVerificationSlot,
    Method::ReleaseVerificationSlot,
    Method::ReportVerificationPass,
];

const ADMIN_METHODS: [Method; 10] = [
    Method::ListLeases,
    Method::ForceRollback,
    Method::DecommissionCell,
    Method::MarkRestored,
    Method::LiftQuarantine,
    Method::GetRestoreStatus,
    Method::UpdateNamespace,
    Method::CreateNamespace,
    Method::DeleteNamespace,
    Method::CountClaims,
];

fn allowed(d: &Decision) -> bool {
    matches!(d, Decision::Allow { .. })
}

#[test]
fn only_the_admin_role_may_call_the_admin_service() {
    for method in ADMIN_METHODS {
        assert_eq!(
            Method::from_path(&format!(
                "/topology.claims.admin.v1.AdminService/{}",
                method.name()
            )),
            method
        );
        let admin = verified(Role::Admin, "ops");
        assert_eq!(
            authorize(&admin, method, ""),
            Decision::Allow { fill_cell_id: None },
            "{method:?}"
        );
        for role in [Role::Cell, Role::Router] {
            let d = authorize(&verified(role, "cell-a"), method, "cell-a");
            assert!(
                matches!(
                    d,
                    Decision::Denied {
                        reason: ROLE_NOT_ALLOWED,
                        ..
                    }
                ),
                "{role:?} {method:?}: {d:?}"
            );
        }
        assert!(matches!(
            authorize(&Caller::NoCertificate, method, ""),
            Decision::Unauthenticated { .. }
        ));
    }
}

#[test]
fn a_plaintext_server_allows_the_admin_service_only_from_loopback() {
    for method in ADMIN_METHODS {
        assert!(allowed(&authorize(
            &Caller::Anonymous { loopback: true },
            method,
            ""
        )));
        assert!(matches!(
            authorize(&Caller::Anonymous { loopback: false }, method, ""),
            Decision::Denied {
                reason: ROLE_NOT_ALLOWED,
                ..
            }
        ));
    }
}

#[test]
fn a_cell_may_call_everything_as_itself() {
    let a = verified(Role::Cell, "cell-a");
    for method in CLAIMS_METHODS {
        assert_eq!(
            authorize(&a, method, if method.has_cell_id() { "cell-a" } else { "" }),
            Decision::Allow { fill_cell_id: None },
            "{method:?}"
        );
    }
}

#[test]
fn a_cell_with_an_empty_cell_id_acts_as_itself() {
    let a = verified(Role::Cell, "cell-a");
    for method in CLAIMS_METHODS.into_iter().filter(|m| m.has_cell_id()) {
        assert_eq!(
            authorize(&a, method, ""),
            Decision::Allow {
                fill_cell_id: Some("cell-a".into())
            },
            "{method:?}"
        );
    }
}

#[test]
fn a_cell_may_not_act_as_another_cell() {
    let a = verified(Role::Cell, "cell-a");
    for method in CLAIMS_METHODS.into_iter().filter(|m| m.has_cell_id()) {
        match authorize(&a, method, "cell-b") {
            Decision::Denied { reason, message } => {
                assert_eq!(reason, CELL_ID_MISMATCH, "{method:?}");
                assert!(message.contains("cell-b"), "{message}");
            }
            other => panic!("{method:?}: {other:?}"),
        }
    }
}

#[test]
fn a_cell_may_look_up_any_claim() {
    assert!(allowed(&authorize(
        &verified(Role::Cell, "cell-a"),
        Method::LookupClaim,
        ""
    )));
}

#[test]
fn every_identified_role_may_use_the_rest_lookup_and_no_one_without_a_certificate() {
    for role in [Role::Cell, Role::Router, Role::Admin] {
        let d = authorize(&verified(role, "x"), Method::RestLookup, "");
        assert_eq!(d, Decision::Allow { fill_cell_id: None }, "{role:?}");
    }
    assert!(matches!(
        authorize(&Caller::NoCertificate, Method::RestLookup, ""),
        Decision::Unauthenticated { .. }
    ));
    assert_eq!(
        Method::from_path("/v1/claims/route/john"),
        Method::RestLookup
    );
}

#[test]
fn a_router_may_only_look_up() {
    let r = verified(Role::Router, "edge-1");
    for method in CLAIMS_METHODS {
        let d = authorize(&r, method, "cell-a");
        if method == Method::LookupClaim {
            assert!(allowed(&d), "{method:?}");
        } else {
            assert!(
                matches!(
                    d,
                    Decision::Denied {
                        reason: ROLE_NOT_ALLOWED,
                        ..
                    }
                ),
                "{method:?}: {d:?}"
            );
        }
    }
}

#[test]
fn an_admin_may_read_any_cell_and_change_nothing() {
    let admin = verified(Role::Admin, "ops");
    for method in CLAIMS_METHODS {
        let d = authorize(&admin, method, "cell-a");
        let reads = matches!(
            method,
            Method::ListOutstandingLeases
                | Method::ListClaims
                | Method::StreamClaims
                | Method::LookupClaim
        );
        if reads {
            assert_eq!(d, Decision::Allow { fill_cell_id: None }, "{method:?}");
        } else {
            assert!(
                matches!(
                    d,
                    Decision::Denied {
                        reason: ROLE_NOT_ALLOWED,
                        ..
                    }
                ),
                "{method:?}: {d:?}"
            );
        }
    }
}

#[test]
fn without_a_certificate_only_health_is_open() {
    for method in CLAIMS_METHODS
        .into_iter()
        .chain([Method::Reflection, Method::Other])
    {
        assert!(
            matches!(
                authorize(&Caller::NoCertificate, method, ""),
                Decision::Unauthenticated { .. }
            ),
            "{method:?}"
        );
    }
    assert!(allowed(&authorize(
        &Caller::NoCertificate,
        Method::Health,
        ""
    )));
    let unidentified = Caller::Unidentified {
        why: "no SAN".into(),
    };
    assert!(allowed(&authorize(&unidentified, Method::Health, "")));
    assert_eq!(
        authorize(&unidentified, Method::LookupClaim, ""),
        Decision::Unauthenticated {
            message: "no SAN".into()
        }
    );
}

#[test]
fn a_plaintext_server_trusts_every_caller() {
    for method in CLAIMS_METHODS {
        assert_eq!(
            authorize(&Caller::Anonymous { loopback: false }, method, "any-cell"),
            Decision::Allow { fill_cell_id: None }
        );
    }
}

#[test]
fn other_methods_and_reflection_follow_the_role() {
    let a = verified(Role::Cell, "cell-a");
    assert!(allowed(&authorize(&a, Method::Reflection, "")));
    assert!(matches!(
        authorize(&a, Method::Other, ""),
        Decision::Denied {
            reason: ROLE_NOT_ALLOWED,
            ..
        }
    ));
}

#[test]
fn identities_come_from_exactly_one_spiffe_uri_san() {
    let td = DEFAULT_TRUST_DOMAIN;
    let uris = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        identify(
            IdentityFrom::UriSan,
            td,
            &uris(&["spiffe://topology-claims/cell/cell-a"]),
            None
        ),
        verified(Role::Cell, "cell-a")
    );
    // Other URIs are ignored; none or two SPIFFE ids, a foreign trust domain, an unknown
    // role, extra segments or a bad cell id are not an identity.
    assert!(matches!(
        identify(
            IdentityFrom::UriSan,
            td,
            &uris(&[
                "https://example.com",
                "spiffe://topology-claims/router/edge"
            ]),
            None
        ),
        Caller::Verified(Principal {
            role: Role::Router,
            ..
        })
    ));
    for bad in [
        vec![],
        vec![
            "spiffe://topology-claims/cell/a",
            "spiffe://topology-claims/cell/b",
        ],
        vec!["spiffe://other-domain/cell/a"],
        vec!["spiffe://topology-claims/root/a"],
        vec!["spiffe://topology-claims/cell/a/b"],
        vec!["spiffe://topology-claims/cell/"],
        vec!["spiffe://topology-claims/cell/Not A Cell!"],
    ] {
        assert!(
            matches!(
                identify(IdentityFrom::UriSan, td, &uris(&bad), Some("cell-a")),
                Caller::Unidentified { .. }
            ),
            "{bad:?}"
        );
    }
}

#[test]
fn the_common_name_mode_reads_a_cell_id() {
    assert!(matches!(
        identify(IdentityFrom::CommonName, "td", &[], Some("cell-7")),
        Caller::Verified(Principal { role: Role::Cell, ref name, .. }) if name == "cell-7"
    ));
    assert!(matches!(
        identify(IdentityFrom::CommonName, "td", &[], None),
        Caller::Unidentified { .. }
    ));
}

#[test]
fn stream_claims_has_the_rights_of_list_claims() {
    assert!(Method::StreamClaims.has_cell_id() && !Method::StreamClaims.mutates());
    assert!(!Method::StreamClaims.is_admin());
    let callers = [
        verified(Role::Cell, "cell-a"),
        verified(Role::Router, "edge-1"),
        verified(Role::Admin, "ops"),
        Caller::Anonymous { loopback: false },
        Caller::NoCertificate,
    ];
    for caller in &callers {
        for cell_id in ["", "cell-a", "cell-b"] {
            assert_eq!(
                authorize(caller, Method::StreamClaims, cell_id),
                authorize(caller, Method::ListClaims, cell_id)
                    .renamed("ListClaims", "StreamClaims"),
                "{caller:?} {cell_id:?}"
            );
        }
    }
}

#[test]
fn verification_slots_are_a_cells_own_and_no_one_elses() {
    for method in [
        Method::AcquireVerificationSlot,
        Method::ReleaseVerificationSlot,
    ] {
        assert!(method.has_cell_id() && !method.is_admin(), "{method:?}");
        let a = verified(Role::Cell, "cell-a");
        assert!(allowed(&authorize(&a, method, "cell-a")), "{method:?}");
        assert_eq!(
            authorize(&a, method, ""),
            Decision::Allow {
                fill_cell_id: Some("cell-a".into())
            }
        );
        assert!(matches!(
            authorize(&a, method, "cell-b"),
            Decision::Denied {
                reason: CELL_ID_MISMATCH,
                ..
            }
        ));
        for other in [verified(Role::Router, "edge"), verified(Role::Admin, "ops")] {
            assert!(
                matches!(
                    authorize(&other, method, "cell-a"),
                    Decision::Denied {
                        reason: ROLE_NOT_ALLOWED,
                        ..
                    }
                ),
                "{other:?} {method:?}"
            );
        }
        assert!(matches!(
            authorize(&Caller::NoCertificate, method, "cell-a"),
            Decision::Unauthenticated { .. }
        ));
    }
}

impl Decision {
    /// The same decision with `from` in its message said as `to`.
    fn renamed(self, from: &str, to: &str) -> Decision {
        match self {
            Decision::Denied { reason, message } => Decision::Denied {
                reason,
                message: message.replace(from, to),
            },
            other => other,
        }
    }
}

#[test]
fn paths_name_their_methods() {
    assert_eq!(
        Method::from_path("/topology.claims.v1.ClaimsService/BeginUpdate"),
        Method::BeginUpdate
    );
    assert_eq!(
        Method::from_path("/grpc.health.v1.Health/Check"),
        Method::Health
    );
    assert_eq!(
        Method::from_path("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"),
        Method::Reflection
    );
    for method in CLAIMS_METHODS {
        assert_eq!(
            Method::from_path(&format!(
                "/topology.claims.v1.ClaimsService/{}",
                method.name()
            )),
            method
        );
    }
    assert_eq!(Method::from_path("/x.Y/Z"), Method::Other);
    assert_eq!(Method::from_path("nonsense"), Method::Other);
}

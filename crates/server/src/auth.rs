//! Who may call what: the identities of callers and the one authorization table, as pure code.
//!
//! A caller is anonymous (a plaintext server trusts every caller, as it always did) or a
//! verified principal from its client certificate: the URI SAN `spiffe://TRUST_DOMAIN/ROLE/NAME`
//! with ROLE `cell` (NAME is the cell id), `router` or `admin` (`--identity-from uri-san`, the
//! default), or a cell named by the subject CN (`--identity-from cn`, for a PKI that can only
//! set that). [`authorize`] is the table; `grpc::authz` applies it to every request before any
//! handler and before any store access. Handlers never look at identities.
//!
//! | role | allowed |
//! |---|---|
//! | cell | every ClaimsService RPC for its own `cell_id` (an empty one means its own; another is PERMISSION_DENIED `CELL_ID_MISMATCH`), the verification slots and pass reports included; LookupClaim (gRPC or REST) of any claim |
//! | router | LookupClaim and its REST form (`GET /v1/claims/…`) only |
//! | admin | ListOutstandingLeases, ListClaims, StreamClaims, LookupClaim, for any cell; the AdminService (ListLeases, ForceRollback, DecommissionCell, MarkRestored, LiftQuarantine, GetRestoreStatus, CreateNamespace, UpdateNamespace, DeleteNamespace, CountClaims) |
//! | any of the three | ListNamespaces and GetNamespace (the rules every key is computed under) |
//!
//! Anything else is PERMISSION_DENIED `ROLE_NOT_ALLOWED`. A plaintext server's anonymous callers
//! may call the AdminService only from loopback. Under TLS, a connection without a
//! client certificate reaches only `grpc.health.v1` (Kubernetes probes carry none); everything
//! else is UNAUTHENTICATED.

use std::fmt;

use topology_claims::domain::CellId;

/// The default SPIFFE trust domain (`serve --trust-domain`).
pub const DEFAULT_TRUST_DOMAIN: &str = "topology-claims";

/// What a caller may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Cell,
    Router,
    Admin,
}

impl Role {
    pub const fn name(self) -> &'static str {
        match self {
            Self::Cell => "cell",
            Self::Router => "router",
            Self::Admin => "admin",
        }
    }

    fn parse(text: &str) -> Option<Role> {
        match text {
            "cell" => Some(Self::Cell),
            "router" => Some(Self::Router),
            "admin" => Some(Self::Admin),
            _ => None,
        }
    }
}

/// A verified caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    pub role: Role,
    /// The cell id for a cell, the router's or operator's name otherwise.
    pub name: String,
    /// How it was identified: the SPIFFE id, or `cn:NAME`.
    pub id: String,
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)
    }
}

/// Who is calling, as far as the transport knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// A plaintext server: no identity, every caller trusted (loopback or `--allow-plaintext`)
    /// with the claims API; the admin API only when the peer is on `loopback`.
    Anonymous {
        loopback: bool,
    },
    /// A TLS connection without a client certificate.
    NoCertificate,
    /// A verified client certificate that does not name exactly one identity.
    Unidentified {
        why: String,
    },
    Verified(Principal),
}

/// How identities are read from a verified certificate (`serve --identity-from`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IdentityFrom {
    /// Exactly one URI SAN `spiffe://TRUST_DOMAIN/ROLE/NAME`.
    #[default]
    UriSan,
    /// The subject CN is a cell id (role cell).
    CommonName,
}

/// The principal a verified certificate names: from its URI SANs (`uris`) or its subject CN.
pub fn identify(
    from: IdentityFrom,
    trust_domain: &str,
    uris: &[String],
    common_name: Option<&str>,
) -> Caller {
    let result = match from {
        IdentityFrom::UriSan => principal_from_uris(uris, trust_domain),
        IdentityFrom::CommonName => match common_name {
            Some(cn) => CellId::parse(cn)
                .map(|_| Principal {
                    role: Role::Cell,
                    name: cn.to_owned(),
                    id: format!("cn:{cn}"),
                })
                .map_err(|e| format!("the subject CN {cn:?} is not a cell id: {e}")),
            None => Err("the certificate has no subject CN".to_owned()),
        },
    };
    match result {
        Ok(principal) => Caller::Verified(principal),
        Err(why) => Caller::Unidentified { why },
    }
}

fn principal_from_uris(uris: &[String], trust_domain: &str) -> Result<Principal, String> {
    let spiffe: Vec<&String> = uris.iter().filter(|u| u.starts_with("spiffe://")).collect();
    let [uri] = spiffe.as_slice() else {
        return Err(format!(
            "the certificate must carry exactly one URI SAN spiffe://{trust_domain}/ROLE/NAME; \
             it carries {}",
            spiffe.len()
        ));
    };
    let rest = &uri["spiffe://".len()..];
    let mut parts = rest.split('/');
    let (Some(domain), Some(role), Some(name), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("{uri} is not spiffe://TRUST_DOMAIN/ROLE/NAME"));
    };
    if domain != trust_domain {
        return Err(format!(
            "{uri} is of trust domain {domain:?}, not {trust_domain:?} (--trust-domain)"
        ));
    }
    let role = Role::parse(role)
        .ok_or_else(|| format!("{uri}: the role must be cell, router or admin"))?;
    if name.is_empty() {
        return Err(format!("{uri} names no {}", role.name()));
    }
    if role == Role::Cell {
        CellId::parse(name).map_err(|e| format!("{uri}: not a cell id: {e}"))?;
    }
    Ok(Principal {
        role,
        name: name.to_owned(),
        id: (*uri).clone(),
    })
}

/// The RPCs the table speaks of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    BeginUpdate,
    CommitUpdate,
    RollbackUpdate,
    RenewLease,
    ListOutstandingLeases,
    ListClaims,
    StreamClaims,
    LookupClaim,
    AcquireVerificationSlot,
    ReleaseVerificationSlot,
    ReportVerificationPass,
    /// `topology.claims.admin.v1.AdminService`.
    ListLeases,
    ForceRollback,
    DecommissionCell,
    MarkRestored,
    LiftQuarantine,
    GetRestoreStatus,
    ListNamespaces,
    GetNamespace,
    UpdateNamespace,
    CreateNamespace,
    DeleteNamespace,
    CountClaims,
    /// `GET /v1/claims/{namespace}/{value}` and any other path under `/v1/` (REST, `crate::rest`).
    RestLookup,
    /// `grpc.health.v1`.
    Health,
    /// Server reflection.
    Reflection,
    /// Anything else (an unknown method: the router answers UNIMPLEMENTED if allowed through).
    Other,
}

impl Method {
    /// The RPCs of `ClaimsService` and `AdminService`, in the proto's order.
    pub const RPCS: [Method; 23] = [
        Self::BeginUpdate,
        Self::CommitUpdate,
        Self::RollbackUpdate,
        Self::RenewLease,
        Self::ListOutstandingLeases,
        Self::ListClaims,
        Self::StreamClaims,
        Self::LookupClaim,
        Self::AcquireVerificationSlot,
        Self::ReleaseVerificationSlot,
        Self::ReportVerificationPass,
        Self::ListLeases,
        Self::ForceRollback,
        Self::DecommissionCell,
        Self::MarkRestored,
        Self::LiftQuarantine,
        Self::GetRestoreStatus,
        Self::ListNamespaces,
        Self::GetNamespace,
        Self::UpdateNamespace,
        Self::CreateNamespace,
        Self::DeleteNamespace,
        Self::CountClaims,
    ];

    /// The method of an HTTP/2 `:path` such as `/topology.claims.v1.ClaimsService/BeginUpdate`.
    pub fn from_path(path: &str) -> Method {
        if path.starts_with(crate::rest::PREFIX) {
            return Method::RestLookup;
        }
        let Some((service, method)) = path.trim_start_matches('/').split_once('/') else {
            return Method::Other;
        };
        match (service, method) {
            ("topology.claims.v1.ClaimsService", "BeginUpdate") => Method::BeginUpdate,
            ("topology.claims.v1.ClaimsService", "CommitUpdate") => Method::CommitUpdate,
            ("topology.claims.v1.ClaimsService", "RollbackUpdate") => Method::RollbackUpdate,
            ("topology.claims.v1.ClaimsService", "RenewLease") => Method::RenewLease,
            ("topology.claims.v1.ClaimsService", "ListOutstandingLeases") => {
                Method::ListOutstandingLeases
            }
            ("topology.claims.v1.ClaimsService", "ListClaims") => Method::ListClaims,
            ("topology.claims.v1.ClaimsService", "StreamClaims") => Method::StreamClaims,
            ("topology.claims.v1.ClaimsService", "LookupClaim") => Method::LookupClaim,
            ("topology.claims.v1.ClaimsService", "AcquireVerificationSlot") => {
                Method::AcquireVerificationSlot
            }
            ("topology.claims.v1.ClaimsService", "ReleaseVerificationSlot") => {
                Method::ReleaseVerificationSlot
            }
            ("topology.claims.v1.ClaimsService", "ReportVerificationPass") => {
                Method::ReportVerificationPass
            }
            ("topology.claims.admin.v1.AdminService", "MarkRestored") => Method::MarkRestored,
            ("topology.claims.admin.v1.AdminService", "LiftQuarantine") => Method::LiftQuarantine,
            ("topology.claims.admin.v1.AdminService", "GetRestoreStatus") => {
                Method::GetRestoreStatus
            }
            ("topology.claims.admin.v1.AdminService", "ListNamespaces") => Method::ListNamespaces,
            ("topology.claims.admin.v1.AdminService", "GetNamespace") => Method::GetNamespace,
            ("topology.claims.admin.v1.AdminService", "UpdateNamespace") => Method::UpdateNamespace,
            ("topology.claims.admin.v1.AdminService", "CreateNamespace") => Method::CreateNamespace,
            ("topology.claims.admin.v1.AdminService", "DeleteNamespace") => Method::DeleteNamespace,
            ("topology.claims.admin.v1.AdminService", "CountClaims") => Method::CountClaims,
            ("topology.claims.admin.v1.AdminService", "ListLeases") => Method::ListLeases,
            ("topology.claims.admin.v1.AdminService", "ForceRollback") => Method::ForceRollback,
            ("topology.claims.admin.v1.AdminService", "DecommissionCell") => {
                Method::DecommissionCell
            }
            ("grpc.health.v1.Health", _) => Method::Health,
            (s, _) if s.starts_with("grpc.reflection.") => Method::Reflection,
            _ => Method::Other,
        }
    }

    /// Whether it changes claims or leases (what the audit log records).
    pub const fn mutates(self) -> bool {
        matches!(
            self,
            Self::BeginUpdate
                | Self::CommitUpdate
                | Self::RollbackUpdate
                | Self::RenewLease
                | Self::ForceRollback
                | Self::DecommissionCell
                | Self::ReportVerificationPass
                | Self::MarkRestored
                | Self::LiftQuarantine
                | Self::UpdateNamespace
                | Self::CreateNamespace
                | Self::DeleteNamespace
        )
    }

    /// Whether its answer is a page of a listing (or a stream of them) that the server holds
    /// until the reader takes it: bounded per cell by `--cell-max-streams`.
    pub const fn is_listing(self) -> bool {
        matches!(
            self,
            Self::ListClaims | Self::StreamClaims | Self::ListOutstandingLeases
        )
    }

    /// Whether it is an `AdminService` RPC: the admin role's alone, audited before it acts,
    /// never limited per cell.
    pub const fn is_admin(self) -> bool {
        matches!(
            self,
            Self::ListLeases
                | Self::ForceRollback
                | Self::DecommissionCell
                | Self::MarkRestored
                | Self::LiftQuarantine
                | Self::GetRestoreStatus
                | Self::UpdateNamespace
                | Self::CreateNamespace
                | Self::DeleteNamespace
                | Self::CountClaims
        )
    }

    /// The RPC's name as the metrics and logs show it (`BeginUpdate`, `Health`, …).
    pub const fn name(self) -> &'static str {
        match self {
            Self::BeginUpdate => "BeginUpdate",
            Self::CommitUpdate => "CommitUpdate",
            Self::RollbackUpdate => "RollbackUpdate",
            Self::RenewLease => "RenewLease",
            Self::ListOutstandingLeases => "ListOutstandingLeases",
            Self::ListClaims => "ListClaims",
            Self::StreamClaims => "StreamClaims",
            Self::LookupClaim => "LookupClaim",
            Self::AcquireVerificationSlot => "AcquireVerificationSlot",
            Self::ReleaseVerificationSlot => "ReleaseVerificationSlot",
            Self::ReportVerificationPass => "ReportVerificationPass",
            Self::MarkRestored => "MarkRestored",
            Self::LiftQuarantine => "LiftQuarantine",
            Self::GetRestoreStatus => "GetRestoreStatus",
            Self::ListNamespaces => "ListNamespaces",
            Self::GetNamespace => "GetNamespace",
            Self::UpdateNamespace => "UpdateNamespace",
            Self::CreateNamespace => "CreateNamespace",
            Self::DeleteNamespace => "DeleteNamespace",
            Self::CountClaims => "CountClaims",
            Self::ListLeases => "ListLeases",
            Self::ForceRollback => "ForceRollback",
            Self::DecommissionCell => "DecommissionCell",
            Self::RestLookup => "RestLookup",
            Self::Health => "Health",
            Self::Reflection => "Reflection",
            Self::Other => "Other",
        }
    }

    /// Whether its request carries a `cell_id` (field 1) the caller must own.
    pub const fn has_cell_id(self) -> bool {
        matches!(
            self,
            Self::BeginUpdate
                | Self::CommitUpdate
                | Self::RollbackUpdate
                | Self::RenewLease
                | Self::ListOutstandingLeases
                | Self::ListClaims
                | Self::StreamClaims
                | Self::AcquireVerificationSlot
                | Self::ReleaseVerificationSlot
                | Self::ReportVerificationPass
        )
    }
}

/// What the table says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Go on; with `Some(cell)`, the request's empty `cell_id` becomes `cell` (a cell's own).
    Allow { fill_cell_id: Option<String> },
    /// UNAUTHENTICATED.
    Unauthenticated { message: String },
    /// PERMISSION_DENIED with this ErrorInfo reason.
    Denied {
        reason: &'static str,
        message: String,
    },
}

pub use topology_claims::error::{CELL_ID_MISMATCH, ROLE_NOT_ALLOWED};

/// The table: may `caller` call `method` with a request whose `cell_id` is `cell_id` (empty
/// when absent or for methods without one)?
pub fn authorize(caller: &Caller, method: Method, cell_id: &str) -> Decision {
    let allow = Decision::Allow { fill_cell_id: None };
    if method == Method::Health {
        return allow;
    }
    let principal = match caller {
        Caller::Anonymous { loopback } => {
            return if !method.is_admin() || *loopback {
                allow
            } else {
                Decision::Denied {
                    reason: ROLE_NOT_ALLOWED,
                    message: format!(
                        "{method:?} is an admin RPC: on a server without client certificates it \
                         is allowed only from loopback"
                    ),
                }
            }
        }
        Caller::NoCertificate => {
            return Decision::Unauthenticated {
                message: "a client certificate is required (only grpc.health.v1 is open without \
                          one)"
                    .to_owned(),
            }
        }
        Caller::Unidentified { why } => {
            return Decision::Unauthenticated {
                message: why.clone(),
            }
        }
        Caller::Verified(principal) => principal,
    };
    let denied = || Decision::Denied {
        reason: ROLE_NOT_ALLOWED,
        message: format!(
            "{principal} (role {}) may not call {method:?}",
            principal.role.name()
        ),
    };
    match (principal.role, method) {
        (_, Method::Reflection) => allow,
        (Role::Cell | Role::Router | Role::Admin, Method::LookupClaim | Method::RestLookup) => {
            allow
        }
        // The rules every key is computed under: anyone with an identity may read them.
        (
            Role::Cell | Role::Router | Role::Admin,
            Method::ListNamespaces | Method::GetNamespace,
        ) => allow,
        (Role::Cell, m) if m.has_cell_id() => {
            if cell_id.is_empty() {
                Decision::Allow {
                    fill_cell_id: Some(principal.name.clone()),
                }
            } else if cell_id == principal.name {
                allow
            } else {
                Decision::Denied {
                    reason: CELL_ID_MISMATCH,
                    message: format!(
                        "{principal} may act only as cell {:?}, not {cell_id:?}",
                        principal.name
                    ),
                }
            }
        }
        (
            Role::Admin,
            Method::ListOutstandingLeases | Method::ListClaims | Method::StreamClaims,
        ) => allow,
        (Role::Admin, m) if m.is_admin() => allow,
        _ => denied(),
    }
}

#[cfg(test)]
mod tests {
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
}

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
//! | cell | every ClaimsService RPC for its own `cell_id` (an empty one means its own; another is PERMISSION_DENIED `CELL_ID_MISMATCH`), the verification slots and pass reports included; LookupClaim (gRPC or REST) of any claim; WatchClaims |
//! | router | LookupClaim and its REST form (`GET /v1/claims/…`), WatchClaims |
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
    WatchClaims,
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
    pub const RPCS: [Method; 24] = [
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
        Self::WatchClaims,
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
            ("topology.claims.v1.ClaimsService", "WatchClaims") => Method::WatchClaims,
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
            Self::WatchClaims => "WatchClaims",
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
        (
            Role::Cell | Role::Router | Role::Admin,
            Method::LookupClaim | Method::RestLookup | Method::WatchClaims,
        ) => allow,
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
mod tests;

//! The one layer that applies the authorization table (`crate::auth`) to every request, before
//! any handler and before any store access: it reads the caller from the connection, the method
//! from the path and, for methods that carry one, the request's `cell_id` (field 1 of every such
//! request message) from the request body; a refusal is answered here (UNAUTHENTICATED, or
//! PERMISSION_DENIED with ErrorInfo reason `CELL_ID_MISMATCH` / `ROLE_NOT_ALLOWED`); a cell's
//! empty `cell_id` is filled in with its own, so the handler acts as that cell.
//!
//! After the table allowed a request, the per-cell limits (`grpc::cell_limits`) are applied here
//! too, since this is where the cell a request acts for is known: the verified cell's own name,
//! or on a plaintext server the request's `cell_id`. Health checks, the AdminService and the
//! admin role are never limited. A refusal is RESOURCE_EXHAUSTED with ErrorInfo `RATE_LIMITED`
//! and a RetryInfo delay.
//!
//! Every request runs inside a tracing span `request` (fields `request_id`, `method`,
//! `identity`, `peer`), so each log line emitted while handling it says which request it is
//! about; the request id is the client's `x-request-id` when sane, else a fresh one, and is
//! echoed in the response's `x-request-id` header. A `request done` line (debug) ends it.
//!
//! Owns applying the table and the limits; the table itself is `crate::auth`'s, the limits'
//! state `grpc::cell_limits`'s. Runs inside the request guard, so the body it reads is already
//! within the byte budgets.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use std::sync::Arc;
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::BodyExt;
use prost::Message;
use tonic::body::Body;
use tonic_types::StatusExt;
use tower_layer::Layer;
use tower_service::Service;
use tracing::Instrument;

use crate::auth::{authorize, Caller, Decision, Method, Role};
use crate::domain::ClaimType;
use crate::error::ClaimsError;
use crate::grpc::audit::{AdminAudit, AuditLog, AuditRecord, AuditedClaim};
use crate::grpc::cell_limits::{CellLimiter, Holding, InFlight};
use crate::grpc::listener::ConnInfo;
use crate::grpc::pb;
use crate::grpc::pb::admin as apb;
use crate::grpc::status::{code_name, to_status};

/// Builds [`Authorize`] services, writing to the audit log when there is one and applying the
/// per-cell limits when there are some.
#[derive(Clone, Debug, Default)]
pub struct AuthorizeLayer {
    pub audit: Option<Arc<AuditLog>>,
    pub limiter: Option<Arc<CellLimiter>>,
}

impl<S> Layer<S> for AuthorizeLayer {
    type Service = Authorize<S>;

    fn layer(&self, inner: S) -> Authorize<S> {
        Authorize {
            inner,
            audit: self.audit.clone(),
            limiter: self.limiter.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Authorize<S> {
    inner: S,
    audit: Option<Arc<AuditLog>>,
    limiter: Option<Arc<CellLimiter>>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> Service<http::Request<Body>> for Authorize<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<http::Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let started = Instant::now();
        let method = Method::from_path(request.uri().path());
        let info = request.extensions().get::<ConnInfo>().cloned();
        let caller = info
            .as_ref()
            .map_or(Caller::Anonymous { loopback: false }, |i| i.caller.clone());
        let audit = self.audit.clone();
        let limiter = self.limiter.clone();
        let request_id = request_id(request.headers());
        let span = tracing::info_span!(
            "request",
            request_id = %request_id,
            method = method.name(),
            identity = identity_of(&caller).0,
            peer = %info.as_ref().and_then(|i| i.remote_addr).map(|a| a.to_string()).unwrap_or_default(),
        );
        // The ready service goes with this request; a clone waits for the next one.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let handled = async move {
            let mut record = Audit::start(audit, info.as_ref(), &caller, method, started);
            let anonymous = matches!(caller, Caller::Anonymous { .. });
            // An anonymous caller's cell is the request's `cell_id`: read it for the limits too.
            // An audited admin call is read to write what it asks for before it acts.
            let needs_body = (method.has_cell_id()
                && (!anonymous || (record.is_some() && method.mutates()) || limiter.is_some()))
                || (method.is_admin() && record.is_some());
            if !needs_body {
                return match authorize(&caller, method, "") {
                    Decision::Allow { .. } => match admit(limiter.as_ref(), &caller, method, "") {
                        Ok(slot) => hold(inner.call(request).await, slot),
                        Err(error) => Ok(refuse(error, limited(record.as_mut(), method))),
                    },
                    refusal => Ok(refuse(refused(refusal), record.as_mut())),
                };
            }
            let (parts, body) = request.into_parts();
            let bytes = match body.collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(status) => return Ok(status.into_http()),
            };
            let cell_id = first_message(&bytes)
                .and_then(cell_id_field)
                .unwrap_or_default();
            match authorize(&caller, method, &cell_id) {
                Decision::Allow { fill_cell_id } => {
                    let bytes = match fill_cell_id {
                        Some(own) => with_cell_id(&bytes, &own).unwrap_or(bytes),
                        None => bytes,
                    };
                    if let Some(record) = record.as_mut() {
                        record.request(method, &bytes);
                        // An admin call acts only once the log says who asked for what.
                        if method.is_admin() {
                            if let Err(message) = record.intent() {
                                let error = ClaimsError::AuditUnavailable { message };
                                tracing::error!(%error, "admin call refused");
                                return Ok(to_status(&error).into_http());
                            }
                        }
                    }
                    let slot = match admit(limiter.as_ref(), &caller, method, &cell_id) {
                        Ok(slot) => slot,
                        Err(error) => return Ok(refuse(error, limited(record.as_mut(), method))),
                    };
                    let request = http::Request::from_parts(
                        parts,
                        Body::new(http_body_util::Full::new(bytes)),
                    );
                    let response = inner.call(request).await;
                    if let (Some(record), Ok(response)) = (record, &response) {
                        if method.mutates() {
                            record.finish_with(response.headers());
                        }
                    }
                    hold(response, slot)
                }
                refusal => {
                    if let Some(record) = record.as_mut() {
                        record.request(method, &bytes);
                    }
                    Ok(refuse(refused(refusal), record.as_mut()))
                }
            }
        };
        Box::pin(
            async move {
                let mut response = handled.await;
                if let Ok(response) = &mut response {
                    tracing::debug!(
                        code = status_in(response.headers()).0,
                        duration_ms = started.elapsed().as_secs_f64() * 1000.0,
                        "request done"
                    );
                    if let Ok(value) = http::HeaderValue::from_str(&request_id) {
                        response.headers_mut().insert(REQUEST_ID_HEADER, value);
                    }
                }
                response
            }
            .instrument(span),
        )
    }
}

/// The header a request id comes in and goes back in.
const REQUEST_ID_HEADER: &str = "x-request-id";

/// The client's `x-request-id` when it is sane (1–64 printable ASCII characters, no spaces: it
/// goes into log lines as it is), else a fresh random one (32 hex digits).
fn request_id(headers: &http::HeaderMap) -> String {
    headers
        .get(REQUEST_ID_HEADER)
        .map(http::HeaderValue::as_bytes)
        .filter(|id| !id.is_empty() && id.len() <= 64 && id.iter().all(u8::is_ascii_graphic))
        .and_then(|id| std::str::from_utf8(id).ok())
        .map_or_else(|| uuid::Uuid::new_v4().simple().to_string(), str::to_owned)
}

/// How a caller appears in logs and the audit log: its identity and role.
fn identity_of(caller: &Caller) -> (&str, &'static str) {
    match caller {
        Caller::Verified(principal) => (&principal.id, principal.role.name()),
        Caller::Anonymous { .. } => ("anonymous", ""),
        Caller::NoCertificate => ("no-certificate", ""),
        Caller::Unidentified { .. } => ("unidentified", ""),
    }
}

/// The gRPC code name and ErrorInfo reason of an answer whose status is in `headers` (a
/// trailers-only error), or OK when it is not there (the status then comes in trailers, and a
/// unary handler that answered with headers has succeeded).
fn status_in(headers: &http::HeaderMap) -> (&'static str, String) {
    match tonic::Status::from_header_map(headers) {
        Some(status) if status.code() != tonic::Code::Ok => (
            code_name(status.code()),
            status
                .get_error_details()
                .error_info()
                .map(|info| info.reason.clone())
                .unwrap_or_default(),
        ),
        _ => ("OK", String::new()),
    }
}

/// The cell whose limits a request allowed by the table counts against, if any: a verified
/// cell's own name; on a plaintext server the request's `cell_id` (for the RPCs that carry one).
/// Never for health checks, the AdminService or callers that are not cells (admins, routers).
fn limited_cell<'a>(caller: &'a Caller, method: Method, cell_id: &'a str) -> Option<&'a str> {
    if method == Method::Health || method.is_admin() {
        return None;
    }
    match caller {
        Caller::Verified(principal) if principal.role == Role::Cell => Some(&principal.name),
        Caller::Anonymous { .. } if method.has_cell_id() => Some(cell_id),
        _ => None,
    }
}

/// Applies the per-cell limits to an allowed request: its in-flight slot, or the refusal.
fn admit(
    limiter: Option<&Arc<CellLimiter>>,
    caller: &Caller,
    method: Method,
    cell_id: &str,
) -> Result<Option<InFlight>, ClaimsError> {
    match (limiter, limited_cell(caller, method, cell_id)) {
        (Some(limiter), Some(cell)) => limiter.admit(cell, method.mutates()),
        _ => Ok(None),
    }
}

/// The audit line of a request a per-cell limit refused: written like that of the call it
/// stands for, for mutating RPCs only (other refusals are counted per cell, not audited).
fn limited(audit: Option<&mut Audit>, method: Method) -> Option<&mut Audit> {
    audit.filter(|_| method.mutates())
}

/// Keeps a request's in-flight slot until its response body is done (or dropped). For unary
/// RPCs the handler has finished by then; holding on to the end of the body also covers
/// responses still being written. A request dropped before it answered frees the slot with it.
fn hold<E>(
    response: Result<http::Response<Body>, E>,
    slot: Option<InFlight>,
) -> Result<http::Response<Body>, E> {
    match slot {
        None => response,
        Some(slot) => response.map(|r| r.map(|body| Body::new(Holding::new(body, slot)))),
    }
}

/// An audit line in the making.
struct Audit {
    log: Arc<AuditLog>,
    record: AuditRecord,
    started: Instant,
}

impl Audit {
    fn start(
        log: Option<Arc<AuditLog>>,
        info: Option<&ConnInfo>,
        caller: &Caller,
        method: Method,
        started: Instant,
    ) -> Option<Audit> {
        let log = log?;
        let (identity, role) = identity_of(caller);
        Some(Audit {
            log,
            record: AuditRecord {
                peer: info
                    .and_then(|i| i.remote_addr)
                    .map(|a| a.to_string())
                    .unwrap_or_default(),
                identity: identity.to_owned(),
                role: role.to_owned(),
                method: format!("{method:?}"),
                ..AuditRecord::default()
            },
            started,
        })
    }

    /// What the request names: cell, lease, claims.
    fn request(&mut self, method: Method, body: &[u8]) {
        let Some(message) = first_message(body) else {
            return;
        };
        let r = &mut self.record;
        match method {
            Method::BeginUpdate => {
                if let Ok(request) = pb::BeginUpdateRequest::decode(message) {
                    r.cell_id = request.cell_id;
                    r.lease_id = request.lease_id;
                    let claims = |list: Vec<pb::ClaimRecord>, op: &'static str| {
                        list.into_iter().map(move |c| AuditedClaim {
                            op,
                            claim_type: ClaimType::from_number(i64::from(c.claim_type))
                                .map_or_else(|| c.claim_type.to_string(), |t| t.name().to_owned()),
                            claim_value: c.claim_value,
                        })
                    };
                    r.claims = claims(request.creates_claims, "create")
                        .chain(claims(request.destroys_claims, "destroy"))
                        .chain(claims(request.updates_claims, "update"))
                        .collect();
                }
            }
            Method::CommitUpdate | Method::RollbackUpdate | Method::RenewLease => {
                // The three share their shape: cell_id = 1, lease_id = 2.
                if let Ok(request) = pb::CommitUpdateRequest::decode(message) {
                    r.cell_id = request.cell_id;
                    r.lease_id = request.lease_id;
                }
            }
            Method::ListLeases => {
                if let Ok(request) = apb::ListLeasesRequest::decode(message) {
                    r.cell_id = request.cell_id;
                    r.admin = Some(AdminAudit {
                        older_than_seconds: seconds(request.older_than.as_ref()),
                        ..AdminAudit::default()
                    });
                }
            }
            Method::ForceRollback => {
                if let Ok(request) = apb::ForceRollbackRequest::decode(message) {
                    r.cell_id = request.cell_id;
                    r.admin = Some(AdminAudit {
                        reason: request.reason,
                        dry_run: request.dry_run,
                        older_than_seconds: seconds(request.older_than.as_ref()),
                        ..AdminAudit::default()
                    });
                }
            }
            Method::DecommissionCell => {
                if let Ok(request) = apb::DecommissionCellRequest::decode(message) {
                    r.cell_id = request.cell_id;
                    r.admin = Some(AdminAudit {
                        reason: request.reason,
                        dry_run: request.dry_run,
                        ..AdminAudit::default()
                    });
                }
            }
            _ => r.cell_id = cell_id_field(message).unwrap_or_default(),
        }
        if method.is_admin() && r.admin.is_none() {
            // Undecodable: the handler refuses it; the line still says who tried.
            r.admin = Some(AdminAudit::default());
        }
    }

    /// Writes the line that comes before an admin call acts (`stage` `intent`, no code yet);
    /// the line written when it is answered says `done`.
    fn intent(&mut self) -> Result<(), String> {
        if let Some(admin) = self.record.admin.as_mut() {
            admin.stage = "intent";
        }
        self.record.duration_ms = 0.0;
        let written = self.log.try_write(&self.record);
        if let Some(admin) = self.record.admin.as_mut() {
            admin.stage = "done";
        }
        written
    }

    /// Writes the line for an answer whose status is in `headers` (a trailers-only error), or
    /// OK when it is not there.
    fn finish_with(mut self, headers: &http::HeaderMap) {
        let (code, reason) = status_in(headers);
        self.record.code = code.to_owned();
        self.record.reason = reason;
        self.write();
    }

    fn write(&mut self) {
        self.record.duration_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        self.log.write(&self.record);
    }
}

/// Whole seconds of an optional protobuf duration (0 when absent or negative).
fn seconds(duration: Option<&prost_types::Duration>) -> u64 {
    duration.map_or(0, |d| u64::try_from(d.seconds).unwrap_or(0))
}

/// The error a refusal of the table stands for.
fn refused(decision: Decision) -> ClaimsError {
    match decision {
        Decision::Unauthenticated { message } => ClaimsError::Unauthenticated { message },
        Decision::Denied { reason, message } => ClaimsError::PermissionDenied {
            reason: reason.to_owned(),
            message,
        },
        Decision::Allow { .. } => unreachable!("only refusals are answered here"),
    }
}

fn refuse(error: ClaimsError, audit: Option<&mut Audit>) -> http::Response<Body> {
    if matches!(error, ClaimsError::RateLimited { .. }) {
        // A flooding cell would flood the log: the refusals are counted per cell instead.
        tracing::debug!(%error, "request refused");
    } else {
        tracing::info!(%error, "request refused");
    }
    if let Some(audit) = audit {
        audit.record.code = code_name(crate::grpc::status::code_of(&error)).to_owned();
        audit.record.reason = error.reason().to_owned();
        audit.write();
    }
    to_status(&error).into_http()
}

/// The first gRPC message of a body (5-byte prefix: flag, big-endian length), uncompressed.
fn first_message(body: &[u8]) -> Option<&[u8]> {
    let (prefix, rest) = body.split_at_checked(5)?;
    if prefix[0] != 0 {
        return None;
    }
    let length = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    rest.get(..length)
}

fn varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// Field 1 as a string (the last one, as protobuf decoding keeps), or `None` when the message
/// does not parse (the handler's decoder then refuses it).
fn cell_id_field(message: &[u8]) -> Option<String> {
    let mut at = 0;
    let mut found = String::new();
    while at < message.len() {
        let key = varint(message, &mut at)?;
        match key & 7 {
            0 => {
                varint(message, &mut at)?;
            }
            1 => at = at.checked_add(8)?,
            2 => {
                let length = usize::try_from(varint(message, &mut at)?).ok()?;
                let end = at.checked_add(length)?;
                let value = message.get(at..end)?;
                if key >> 3 == 1 {
                    found = String::from_utf8(value.to_vec()).ok()?;
                }
                at = end;
            }
            5 => at = at.checked_add(4)?,
            _ => return None,
        }
    }
    (at == message.len()).then_some(found)
}

/// The body with `cell_id` (field 1) set to `cell_id`: appended to the message (a later
/// occurrence wins), the length prefix adjusted.
fn with_cell_id(body: &[u8], cell_id: &str) -> Option<Bytes> {
    let message = first_message(body)?;
    let mut field = BytesMut::new();
    field.put_u8(0x0a);
    let mut length = cell_id.len();
    while length >= 0x80 {
        field.put_u8((length as u8 & 0x7f) | 0x80);
        length >>= 7;
    }
    field.put_u8(length as u8);
    field.put_slice(cell_id.as_bytes());
    let total = u32::try_from(message.len() + field.len()).ok()?;
    let mut out = BytesMut::with_capacity(5 + total as usize + body.len());
    out.put_u8(0);
    out.put_u32(total);
    out.put_slice(message);
    out.put_slice(&field);
    out.put_slice(&body[5 + message.len()..]);
    Some(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::pb;

    fn framed(message: &impl Message) -> Vec<u8> {
        let bytes = message.encode_to_vec();
        let mut out = vec![0];
        out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        out.extend_from_slice(&bytes);
        out
    }

    #[test]
    fn the_cell_id_is_read_from_every_request_that_has_one() {
        let commit = pb::CommitUpdateRequest {
            cell_id: "cell-b".into(),
            lease_id: "0b6a4cf6-3f5e-4a47-9c1e-2b8c2d9a7e10".into(),
        };
        let body = framed(&commit);
        assert_eq!(
            first_message(&body).and_then(cell_id_field).as_deref(),
            Some("cell-b")
        );
        let list = pb::ListClaimsRequest {
            cell_id: String::new(),
            table_name: 1,
            cursor: 5,
            limit: 3,
            ..Default::default()
        };
        assert_eq!(
            first_message(&framed(&list))
                .and_then(cell_id_field)
                .as_deref(),
            Some("")
        );
        assert_eq!(cell_id_field(&[0x0a, 5, b'a']), None, "truncated");
    }

    #[test]
    fn an_empty_cell_id_is_filled_in_and_the_rest_kept() {
        let request = pb::RenewLeaseRequest {
            cell_id: String::new(),
            lease_id: "0b6a4cf6-3f5e-4a47-9c1e-2b8c2d9a7e10".into(),
        };
        let body = with_cell_id(&framed(&request), "cell-a").unwrap();
        let decoded = pb::RenewLeaseRequest::decode(first_message(&body).unwrap()).unwrap();
        assert_eq!(decoded.cell_id, "cell-a");
        assert_eq!(decoded.lease_id, request.lease_id);
    }

    #[test]
    fn a_sane_request_id_is_kept_and_anything_else_replaced() {
        let mut headers = http::HeaderMap::new();
        let fresh = request_id(&headers);
        assert_eq!(fresh.len(), 32);
        assert_ne!(fresh, request_id(&headers), "fresh ids differ");
        headers.insert(REQUEST_ID_HEADER, "abc-123_X".parse().unwrap());
        assert_eq!(request_id(&headers), "abc-123_X");
        for bad in ["", "has space", &"x".repeat(65)] {
            headers.insert(REQUEST_ID_HEADER, bad.parse().unwrap());
            assert_ne!(request_id(&headers), bad, "{bad:?}");
        }
        headers.insert(REQUEST_ID_HEADER, "x".repeat(64).parse().unwrap());
        assert_eq!(request_id(&headers), "x".repeat(64));
    }

    #[test]
    fn limits_count_against_the_cell_never_admins_health_or_routers() {
        let verified = |role, name: &str| {
            Caller::Verified(crate::auth::Principal {
                role,
                name: name.to_owned(),
                id: format!("spiffe://topology-claims/{}/{name}", role.name()),
            })
        };
        let cell = verified(Role::Cell, "cell-a");
        let anonymous = Caller::Anonymous { loopback: true };
        assert_eq!(
            limited_cell(&cell, Method::BeginUpdate, "cell-a"),
            Some("cell-a")
        );
        assert_eq!(limited_cell(&cell, Method::LookupClaim, ""), Some("cell-a"));
        assert_eq!(
            limited_cell(&anonymous, Method::ListClaims, "cell-b"),
            Some("cell-b")
        );
        assert_eq!(limited_cell(&anonymous, Method::LookupClaim, ""), None);
        for method in [Method::Health, Method::ListLeases, Method::ForceRollback] {
            assert_eq!(limited_cell(&cell, method, "cell-a"), None, "{method:?}");
            assert_eq!(limited_cell(&anonymous, method, "cell-a"), None);
        }
        let admin = verified(Role::Admin, "ops");
        assert_eq!(limited_cell(&admin, Method::ListClaims, "cell-a"), None);
        let router = verified(Role::Router, "edge");
        assert_eq!(limited_cell(&router, Method::LookupClaim, ""), None);
    }
}

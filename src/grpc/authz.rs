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
//! ## Identity before bytes
//! A caller the table refuses whatever its request says (no client certificate, an
//! unidentifiable one) is answered UNAUTHENTICATED before one byte of its body is read or
//! decoded, and its audit line names no request content. Every other body this layer inspects
//! is read through a hard limit: one gRPC message of at most the server's message limit
//! (`server::max_request_message_bytes`, which follows from `--max-batch`), uncompressed. A body it cannot parse as that
//! message is refused here (INVALID_ARGUMENT, or INTERNAL / UNIMPLEMENTED for a compressed one,
//! as the gRPC spec says), never passed on: authorization fails closed. A BeginUpdate carrying
//! more claims than `--max-batch` is refused from its wire fields, before any claim is decoded.
//!
//! ## Mutations run to their end
//! A mutating call (BeginUpdate, CommitUpdate, RollbackUpdate, RenewLease, ForceRollback,
//! DecommissionCell) runs on a task of its own: when its caller goes away or
//! `--request-timeout` answers DEADLINE_EXCEEDED first, the call still finishes, and its audit
//! line is written with the store's real outcome (a BeginUpdate's line names its lease id, the
//! server's choice included).
//!
//! Owns applying the table and the limits; the table itself is `crate::auth`'s, the limits'
//! state `grpc::cell_limits`'s. Runs inside the request guard, so the body it reads is already
//! within the byte budgets; what it read stays charged, and a BeginUpdate's decoded claims are
//! charged too (`guard::DECODED_CLAIM_BYTES` each), until the handler has answered.

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
use crate::domain::{self, ClaimType};
use crate::error::ClaimsError;
use crate::grpc::audit::{AdminAudit, AuditLog, AuditRecord, AuditedClaim, REFUSED_CLAIMS_LOGGED};
use crate::grpc::cell_limits::{CellLimiter, Holding, InFlight};
use crate::grpc::guard::{Charge, RequestBudget, DECODED_CLAIM_BYTES};
use crate::grpc::listener::ConnInfo;
use crate::grpc::pb;
use crate::grpc::pb::admin as apb;
use crate::grpc::status::{code_name, to_status};

/// Builds [`Authorize`] services, writing to the audit log when there is one and applying the
/// per-cell limits when there are some.
#[derive(Clone, Debug)]
pub struct AuthorizeLayer {
    pub audit: Option<Arc<AuditLog>>,
    pub limiter: Option<Arc<CellLimiter>>,
    /// `--max-batch`: a BeginUpdate with more claims is refused before they are decoded.
    pub max_batch: usize,
    /// The largest request message the server reads (`server::max_request_message_bytes`).
    pub max_message_bytes: usize,
}

impl<S> Layer<S> for AuthorizeLayer {
    type Service = Authorize<S>;

    fn layer(&self, inner: S) -> Authorize<S> {
        Authorize {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Authorize<S> {
    inner: S,
    layer: AuthorizeLayer,
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
        let layer = self.layer.clone();
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
        let inner = std::mem::replace(&mut self.inner, clone);
        let handled = async move {
            let mut record =
                Audit::start(layer.audit.clone(), info.as_ref(), &caller, method, started);
            // Identity before bytes: a refusal that no request content can change is answered
            // before the body is read.
            if let refusal @ Decision::Unauthenticated { .. } = authorize(&caller, method, "") {
                return Ok(refuse(refused(refusal), record.as_mut()));
            }
            let anonymous = matches!(caller, Caller::Anonymous { .. });
            // An anonymous caller's cell is the request's `cell_id`: read it for the limits too.
            // An audited admin call is read to write what it asks for before it acts. Every
            // BeginUpdate is read, to refuse an oversized batch before its claims are decoded.
            let needs_body = method == Method::BeginUpdate
                || (method.has_cell_id()
                    && (!anonymous
                        || (record.is_some() && method.mutates())
                        || layer.limiter.is_some()))
                || (method.is_admin() && record.is_some());
            if !needs_body {
                return match authorize(&caller, method, "") {
                    Decision::Allow { .. } => {
                        match admit(layer.limiter.as_ref(), &caller, method, "") {
                            Ok(slot) => {
                                let held = slot.map(|slot| Held {
                                    _read: Body::empty(),
                                    _decoded: None,
                                    _slot: Some(slot),
                                });
                                run(inner, request, method, record, held).await
                            }
                            Err(error) => Ok(refuse(error, limited(record.as_mut(), method))),
                        }
                    }
                    refusal => Ok(refuse(refused(refusal), record.as_mut())),
                };
            }
            let (parts, mut body) = request.into_parts();
            let bytes = match read_message(&mut body, layer.max_message_bytes).await {
                Ok(bytes) => bytes,
                Err(status) => return Ok(refuse_status(status, "", record.as_mut())),
            };
            let message = match the_message(&bytes, parts.headers.get("grpc-encoding")) {
                Ok(message) => bytes.slice_ref(message),
                Err(status) => return Ok(refuse_status(status, "", record.as_mut())),
            };
            let shape = match RequestShape::read(method, &message) {
                Ok(shape) => shape,
                Err(why) => {
                    let error = ClaimsError::invalid(
                        "request",
                        format!("the body is not a {} message: {why}", method.name()),
                    );
                    return Ok(refuse(error, record.as_mut()));
                }
            };
            match authorize(&caller, method, &shape.cell_id) {
                Decision::Allow { fill_cell_id } => {
                    if let Err(error) = domain::check_batch_size(shape.claims, layer.max_batch) {
                        if let Some(record) = record.as_mut() {
                            record.request(method, &message, REFUSED_CLAIMS_LOGGED);
                        }
                        return Ok(refuse(error, record.as_mut()));
                    }
                    if let Some(record) = record.as_mut() {
                        record.request(method, &message, usize::MAX);
                        if let Some(own) = &fill_cell_id {
                            own.clone_into(&mut record.record.cell_id);
                        }
                    }
                    let bytes = match &fill_cell_id {
                        Some(own) => with_cell_id(&bytes, own).unwrap_or(bytes),
                        None => bytes,
                    };
                    if let Some(record) = record.as_mut() {
                        // An admin call acts only once the log says who asked for what.
                        if method.is_admin() {
                            if let Err(message) = record.intent().await {
                                let error = ClaimsError::AuditUnavailable { message };
                                tracing::error!(%error, "admin call refused");
                                return Ok(to_status(&error).into_http());
                            }
                        }
                    }
                    // The decoded claims are charged before the decoder makes them, and held
                    // with the bytes read until the handler has answered.
                    let decoded = match parts.extensions.get::<RequestBudget>() {
                        Some(budget) if shape.claims > 0 => {
                            match budget.charge_server(shape.claims * DECODED_CLAIM_BYTES) {
                                Ok(charge) => Some(charge),
                                Err(status) => {
                                    return Ok(refuse_status(status, "", record.as_mut()))
                                }
                            }
                        }
                        _ => None,
                    };
                    let slot = match admit(layer.limiter.as_ref(), &caller, method, &shape.cell_id)
                    {
                        Ok(slot) => slot,
                        Err(error) => return Ok(refuse(error, limited(record.as_mut(), method))),
                    };
                    let request = http::Request::from_parts(parts, Body::new(Replay::data(bytes)));
                    let held = Held {
                        _read: body,
                        _decoded: decoded,
                        _slot: slot,
                    };
                    run(inner, request, method, record, Some(held)).await
                }
                refusal => {
                    if let Some(record) = record.as_mut() {
                        record.request(method, &message, REFUSED_CLAIMS_LOGGED);
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

/// What a request holds until its answer is done: the body it was read from (whose bytes stay
/// charged to the budgets), the charge for its decoded claims, its per-cell in-flight slot.
struct Held {
    _read: Body,
    _decoded: Option<Charge>,
    _slot: Option<InFlight>,
}

/// Calls the handler. A mutating call runs on a task of its own, so that it ends (and its audit
/// line is written with the real outcome) even when its caller goes away first.
async fn run<S>(
    mut inner: S,
    request: http::Request<Body>,
    method: Method,
    record: Option<Audit>,
    held: Option<Held>,
) -> Result<http::Response<Body>, S::Error>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    if !method.mutates() {
        return hold(inner.call(request).await, held);
    }
    let task = tokio::spawn(
        async move {
            let response = inner.call(request).await;
            let response = match (record, response) {
                (Some(record), Ok(response)) => Ok(record.finish(method, response).await),
                (_, response) => response,
            };
            hold(response, held)
        }
        .in_current_span(),
    );
    match task.await {
        Ok(response) => response,
        Err(error) => {
            tracing::error!(%error, "the handler task failed");
            Ok(tonic::Status::internal(format!("{} failed: {error}", method.name())).into_http())
        }
    }
}

/// Reads the request's body up to its end through a hard limit: at most one gRPC message of at
/// most `max_message_bytes` (the guard already refused a larger declared length).
async fn read_message(body: &mut Body, max_message_bytes: usize) -> Result<Bytes, tonic::Status> {
    let mut buffered = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        if let Ok(data) = frame.into_data() {
            if buffered.len() + data.len() > 5 + max_message_bytes {
                return Err(tonic::Status::invalid_argument(format!(
                    "a request carries one message of at most {max_message_bytes} bytes; this \
                     body is longer"
                )));
            }
            buffered.extend_from_slice(&data);
        }
    }
    Ok(buffered.freeze())
}

/// The one uncompressed message of a unary request body, or the status its refusal gets.
fn the_message<'b>(
    body: &'b [u8],
    encoding: Option<&http::HeaderValue>,
) -> Result<&'b [u8], tonic::Status> {
    let Some((prefix, rest)) = body.split_at_checked(5) else {
        return Err(tonic::Status::invalid_argument(
            "the request body holds no complete gRPC message prefix",
        ));
    };
    match prefix[0] {
        0 => {}
        // gRPC: a compressed flag with no (or the identity) encoding is INTERNAL; an encoding
        // the server does not accept is UNIMPLEMENTED. This server accepts none, so the bytes
        // checked here are always the bytes the handler decodes.
        1 => {
            return Err(match encoding.and_then(|e| e.to_str().ok()) {
                Some(name) if name != "identity" => tonic::Status::unimplemented(format!(
                    "grpc-encoding {name:?} is not accepted: send requests uncompressed"
                )),
                _ => tonic::Status::internal(
                    "a compressed message without a grpc-encoding: send requests uncompressed",
                ),
            })
        }
        flag => {
            return Err(tonic::Status::invalid_argument(format!(
                "the gRPC message flag is {flag}, not 0 (uncompressed)"
            )))
        }
    }
    let length = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    match rest.len().cmp(&length) {
        std::cmp::Ordering::Equal => Ok(rest),
        std::cmp::Ordering::Less => Err(tonic::Status::invalid_argument(format!(
            "the request message declares {length} bytes but the body ends after {}",
            rest.len()
        ))),
        std::cmp::Ordering::Greater => Err(tonic::Status::invalid_argument(
            "a unary request carries exactly one message; this body has more",
        )),
    }
}

/// What authorization needs of a request message, read from its wire fields without decoding
/// it: the `cell_id` (field 1, for the methods that carry one) and, of a BeginUpdate, how many
/// claims it carries (fields 2, 3, 5).
#[derive(Debug, Default, PartialEq)]
struct RequestShape {
    cell_id: String,
    claims: usize,
}

impl RequestShape {
    fn read(method: Method, message: &[u8]) -> Result<Self, String> {
        let mut shape = RequestShape::default();
        for field in Fields::new(message) {
            let (number, value) = field?;
            match (number, value) {
                (1, Value::Bytes(bytes)) if method.has_cell_id() => {
                    shape.cell_id = String::from_utf8(bytes.to_vec())
                        .map_err(|_| "cell_id (field 1) is not UTF-8".to_owned())?;
                }
                (1, _) if method.has_cell_id() => {
                    return Err("cell_id (field 1) is not a string".into())
                }
                (2 | 3 | 5, _) if method == Method::BeginUpdate => shape.claims += 1,
                _ => {}
            }
        }
        Ok(shape)
    }
}

/// A field's value on the wire.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Value<'m> {
    Varint,
    Fixed,
    Bytes(&'m [u8]),
}

/// The fields of a protobuf message in wire order; an error ends it.
struct Fields<'m> {
    message: &'m [u8],
    at: usize,
    failed: bool,
}

impl<'m> Fields<'m> {
    fn new(message: &'m [u8]) -> Self {
        Fields {
            message,
            at: 0,
            failed: false,
        }
    }

    fn next_field(&mut self) -> Result<(u64, Value<'m>), String> {
        let key = varint(self.message, &mut self.at).ok_or("a field key is cut short")?;
        let number = key >> 3;
        if number == 0 {
            return Err("field number 0".into());
        }
        let skip = |at: &mut usize, n: usize, len: usize| -> Result<(), String> {
            *at = at
                .checked_add(n)
                .filter(|end| *end <= len)
                .ok_or_else(|| format!("field {number} runs past the end"))?;
            Ok(())
        };
        let value = match key & 7 {
            0 => {
                varint(self.message, &mut self.at).ok_or("a varint is cut short")?;
                Value::Varint
            }
            1 => {
                skip(&mut self.at, 8, self.message.len())?;
                Value::Fixed
            }
            2 => {
                let length = varint(self.message, &mut self.at)
                    .and_then(|l| usize::try_from(l).ok())
                    .ok_or("a length is cut short")?;
                let start = self.at;
                skip(&mut self.at, length, self.message.len())?;
                Value::Bytes(&self.message[start..self.at])
            }
            5 => {
                skip(&mut self.at, 4, self.message.len())?;
                Value::Fixed
            }
            wire => return Err(format!("field {number} has wire type {wire}")),
        };
        Ok((number, value))
    }
}

impl<'m> Iterator for Fields<'m> {
    type Item = Result<(u64, Value<'m>), String>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.at >= self.message.len() {
            return None;
        }
        let field = self.next_field();
        self.failed = field.is_err();
        Some(field)
    }
}

/// A body replayed from bytes already read: the data, then the trailers (a response's
/// grpc-status).
struct Replay {
    data: Option<Bytes>,
    trailers: Option<http::HeaderMap>,
}

impl Replay {
    fn data(data: Bytes) -> Self {
        Replay {
            data: Some(data),
            trailers: None,
        }
    }
}

impl http_body::Body for Replay {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, tonic::Status>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(data))));
        }
        Poll::Ready(
            self.trailers
                .take()
                .map(|t| Ok(http_body::Frame::trailers(t))),
        )
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
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

/// Keeps what a request holds (its in-flight slot, its budget charges) until its response body
/// is done (or dropped). For unary RPCs the handler has finished by then; holding on to the end
/// of the body also covers responses still being written. A request dropped before it answered
/// frees them with it.
fn hold<E>(
    response: Result<http::Response<Body>, E>,
    held: Option<Held>,
) -> Result<http::Response<Body>, E> {
    match held {
        None => response,
        Some(held) => response.map(|r| r.map(|body| Body::new(Holding::new(body, held)))),
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

    /// What the request names: cell, lease, claims (at most `claims_logged` of them; all are
    /// counted). Read from the wire fields, decoding only the claims it lists.
    fn request(&mut self, method: Method, message: &[u8], claims_logged: usize) {
        let r = &mut self.record;
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        match method {
            Method::BeginUpdate => {
                for (number, value) in Fields::new(message).map_while(Result::ok) {
                    let Value::Bytes(bytes) = value else { continue };
                    let op = match number {
                        1 => {
                            r.cell_id = text(bytes);
                            continue;
                        }
                        4 => {
                            r.lease_id = text(bytes);
                            continue;
                        }
                        2 => "create",
                        3 => "destroy",
                        5 => "update",
                        _ => continue,
                    };
                    r.claim_count += 1;
                    if r.claims.len() < claims_logged {
                        let c = pb::ClaimRecord::decode(bytes).unwrap_or_default();
                        r.claims.push(AuditedClaim {
                            op,
                            claim_type: ClaimType::from_number(i64::from(c.claim_type))
                                .map_or_else(|| c.claim_type.to_string(), |t| t.name().to_owned()),
                            claim_value: c.claim_value,
                        });
                    }
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
            _ => {
                if let Ok(shape) = RequestShape::read(method, message) {
                    r.cell_id = shape.cell_id;
                }
            }
        }
        if method.is_admin() && r.admin.is_none() {
            // Undecodable: the handler refuses it; the line still says who tried.
            r.admin = Some(AdminAudit::default());
        }
    }

    /// Writes, and syncs, the line that comes before an admin call acts (`stage` `intent`, no
    /// code yet); the line written when it is answered says `done`.
    async fn intent(&mut self) -> Result<(), String> {
        let mut line = self.record.clone();
        if let Some(admin) = line.admin.as_mut() {
            admin.stage = "intent";
        }
        line.duration_ms = 0.0;
        if let Some(admin) = self.record.admin.as_mut() {
            admin.stage = "done";
        }
        self.log.write_durable(line).await
    }

    /// Writes the line of an answered call: its code from the headers (a trailers-only error)
    /// or the trailers, and a BeginUpdate's lease id from its response when the server chose
    /// it. The response is read whole (one small unary message) and replayed unchanged.
    async fn finish(
        mut self,
        method: Method,
        response: http::Response<Body>,
    ) -> http::Response<Body> {
        if tonic::Status::from_header_map(response.headers()).is_some() {
            let (code, reason) = status_in(response.headers());
            self.write_outcome(code, reason);
            return response;
        }
        let (parts, body) = response.into_parts();
        match body.collect().await {
            Ok(collected) => {
                let trailers = collected.trailers().cloned().unwrap_or_default();
                let data = collected.to_bytes();
                if method == Method::BeginUpdate && self.record.lease_id.is_empty() {
                    if let Some(lease) = first_message(&data)
                        .and_then(|m| pb::BeginUpdateResponse::decode(m).ok())
                        .and_then(|r| r.lease_payload)
                    {
                        self.record.lease_id = lease.lease_id;
                    }
                }
                let (code, reason) = status_in(&trailers);
                self.write_outcome(code, reason);
                let replay = Replay {
                    data: Some(data),
                    trailers: Some(trailers),
                };
                http::Response::from_parts(parts, Body::new(replay))
            }
            Err(status) => {
                self.write_outcome(code_name(status.code()), String::new());
                status.into_http()
            }
        }
    }

    fn write_outcome(&mut self, code: &str, reason: String) {
        code.clone_into(&mut self.record.code);
        self.record.reason = reason;
        self.write();
    }

    fn write(&mut self) {
        self.record.duration_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        self.log.write(std::mem::take(&mut self.record));
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
    let status = to_status(&error);
    if let Some(audit) = audit {
        audit.write_outcome(code_name(status.code()), error.reason().to_owned());
    }
    status.into_http()
}

/// A refusal of a body this layer could not read or parse.
fn refuse_status(
    status: tonic::Status,
    reason: &str,
    audit: Option<&mut Audit>,
) -> http::Response<Body> {
    tracing::info!(
        code = code_name(status.code()),
        message = status.message(),
        "request refused"
    );
    if let Some(audit) = audit {
        audit.write_outcome(code_name(status.code()), reason.to_owned());
    }
    status.into_http()
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

    fn cell_id_of(method: Method, body: &[u8]) -> Option<String> {
        let message = the_message(body, None).ok()?;
        RequestShape::read(method, message).ok().map(|s| s.cell_id)
    }

    #[test]
    fn the_cell_id_is_read_from_every_request_that_has_one() {
        let commit = pb::CommitUpdateRequest {
            cell_id: "cell-b".into(),
            lease_id: "0b6a4cf6-3f5e-4a47-9c1e-2b8c2d9a7e10".into(),
        };
        assert_eq!(
            cell_id_of(Method::CommitUpdate, &framed(&commit)).as_deref(),
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
            cell_id_of(Method::ListClaims, &framed(&list)).as_deref(),
            Some("")
        );
        for (what, message) in [
            ("truncated", vec![0x0a, 5, b'a']),
            ("not UTF-8", vec![0x0a, 2, 0xC3, 0x28]),
            ("a varint cell_id", vec![0x08, 1]),
            ("field number 0", vec![0x00, 1]),
            ("a tag with no end", vec![0xFF; 16]),
            ("wire type 7", vec![0x0F]),
        ] {
            assert!(
                RequestShape::read(Method::CommitUpdate, &message).is_err(),
                "{what}"
            );
        }
    }

    #[test]
    fn claims_are_counted_from_the_wire_without_decoding_them() {
        // Two million empty ClaimRecords (0x12 0x00): counted, nothing materialized.
        let mut message = vec![0x0a, 6];
        message.extend_from_slice(b"cell-b");
        for _ in 0..2_000_000 {
            message.extend_from_slice(&[0x12, 0x00]);
        }
        message.extend_from_slice(&[0x1a, 0x00, 0x2a, 0x00]);
        let shape = RequestShape::read(Method::BeginUpdate, &message).unwrap();
        assert_eq!(shape.claims, 2_000_002);
        assert_eq!(shape.cell_id, "cell-b");
        assert!(domain::check_batch_size(shape.claims, 1000).is_err());
        assert!(domain::check_batch_size(1000, 1000).is_ok());
    }

    #[test]
    fn a_body_that_is_not_one_plain_message_is_refused() {
        let message = pb::CommitUpdateRequest::default().encode_to_vec();
        let mut body = framed(&pb::CommitUpdateRequest {
            cell_id: "a".into(),
            ..Default::default()
        });
        assert!(the_message(&body, None).is_ok());
        let code = |body: &[u8], encoding: Option<&str>| {
            let header = encoding.map(|e| http::HeaderValue::from_str(e).unwrap());
            the_message(body, header.as_ref()).unwrap_err().code()
        };
        let mut compressed = body.clone();
        compressed[0] = 1;
        assert_eq!(code(&compressed, None), tonic::Code::Internal);
        assert_eq!(code(&compressed, Some("gzip")), tonic::Code::Unimplemented);
        compressed[0] = 7;
        assert_eq!(code(&compressed, None), tonic::Code::InvalidArgument);
        assert_eq!(
            code(&body[..3], None),
            tonic::Code::InvalidArgument,
            "cut prefix"
        );
        assert_eq!(
            code(&body[..body.len() - 1], None),
            tonic::Code::InvalidArgument
        );
        body.extend_from_slice(&framed(&pb::CommitUpdateRequest::default()));
        assert_eq!(
            code(&body, None),
            tonic::Code::InvalidArgument,
            "two messages"
        );
        assert_eq!(code(&[], None), tonic::Code::InvalidArgument, "no message");
        assert!(message.is_empty());
    }

    #[test]
    fn an_empty_cell_id_is_filled_in_and_the_rest_kept() {
        let request = pb::RenewLeaseRequest {
            cell_id: String::new(),
            lease_id: "0b6a4cf6-3f5e-4a47-9c1e-2b8c2d9a7e10".into(),
        };
        let body = with_cell_id(&framed(&request), "cell-a").unwrap();
        let decoded = pb::RenewLeaseRequest::decode(the_message(&body, None).unwrap()).unwrap();
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

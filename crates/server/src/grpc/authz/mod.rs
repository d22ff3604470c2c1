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

use tonic::body::Body;
use tonic_types::StatusExt;
use tower_layer::Layer;
use tower_service::Service;
use tracing::Instrument;

mod record;
mod wire;

use crate::auth::{authorize, Caller, Decision, Method, Role};
use crate::grpc::audit::{AuditLog, REFUSED_CLAIMS_LOGGED};
use crate::grpc::cell_limits::{CellLimiter, Holding, InFlight};
use crate::grpc::guard::{Charge, RequestBudget, DECODED_CLAIM_BYTES};
use crate::grpc::listener::ConnInfo;
use crate::grpc::responses::{ResponseLimits, StreamSlot};
use crate::grpc::status::{code_name, to_status};
use record::Audit;
use topology_claims::domain;
use topology_claims::error::ClaimsError;
use wire::{read_message, the_message, with_cell_id, Replay, RequestShape};

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
    /// `--cell-max-streams` and `--stall-timeout`.
    pub responses: Arc<ResponseLimits>,
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
        let announce_version = method == Method::Health;
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
                        || layer.limiter.is_some()
                        || method.is_listing()))
                || (method.is_admin() && record.is_some());
            if !needs_body {
                return match authorize(&caller, method, "") {
                    Decision::Allow { .. } => match admit(&layer, &caller, method, "") {
                        Ok((slot, stream)) => {
                            let held = (slot.is_some() || stream.is_some()).then(|| Held {
                                _read: Body::empty(),
                                _decoded: None,
                                _slot: slot,
                                _stream: stream,
                            });
                            watched(
                                run(inner, request, method, record, held).await,
                                &layer,
                                method,
                            )
                        }
                        Err(error) => Ok(refuse(error, limited(record.as_mut(), method))),
                    },
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
                    let (slot, stream) = match admit(&layer, &caller, method, &shape.cell_id) {
                        Ok(slots) => slots,
                        Err(error) => return Ok(refuse(error, limited(record.as_mut(), method))),
                    };
                    let request = http::Request::from_parts(parts, Body::new(Replay::data(bytes)));
                    let held = Held {
                        _read: body,
                        _decoded: decoded,
                        _slot: slot,
                        _stream: stream,
                    };
                    watched(
                        run(inner, request, method, record, Some(held)).await,
                        &layer,
                        method,
                    )
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
                    if let Ok(mut value) = http::HeaderValue::from_str(&request_id) {
                        // A value that never repeats: HPACK's "never indexed" literal, so it
                        // does not churn the connection's header tables (both ends' work).
                        value.set_sensitive(true);
                        response.headers_mut().insert(REQUEST_ID_HEADER, value);
                    }
                    if announce_version {
                        // What `topology-claims status` shows as the server's build.
                        let version = http::HeaderValue::from_static(env!("CARGO_PKG_VERSION"));
                        response.headers_mut().insert(VERSION_HEADER, version);
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
    /// A listing's place under `--cell-max-streams`.
    _stream: Option<StreamSlot>,
}

/// Calls the handler. A mutating call runs on a task of its own, so that it ends (and its audit
/// line is written with the real outcome) even when its caller goes away first. It is polled
/// once here first: a call that ends at once (the in-memory store's, a refusal) has nothing left
/// for a task to finish, and skips the spawn, its hand-off and its wake-up (docs/benchmarks.md).
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
    if method == Method::WatchClaims {
        // A stream's line is written when it opens (its answer's head), never at its end: the
        // audit log records watch starts, not events.
        let response = inner.call(request).await;
        if let (Some(mut record), Ok(response)) = (record, &response) {
            let (code, reason) = status_in(response.headers());
            record.write_outcome(code, reason);
        }
        return hold(response, held);
    }
    if !method.mutates() {
        return hold(inner.call(request).await, held);
    }
    // Boxed: polled here, then (if pending) moved to the task as a pointer.
    let mut call = Box::pin(
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
    // A panic is contained as the task's would be: the caller gets INTERNAL.
    let first = std::future::poll_fn(|cx| {
        let polled =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call.as_mut().poll(cx)));
        Poll::Ready(polled)
    })
    .await;
    let failed = |why: &dyn std::fmt::Display| {
        tracing::error!(%why, "the handler task failed");
        Ok(tonic::Status::internal(format!("{} failed: {why}", method.name())).into_http())
    };
    match first {
        Ok(Poll::Ready(response)) => return response,
        Ok(Poll::Pending) => {}
        Err(_) => return failed(&"the handler panicked"),
    }
    match tokio::spawn(call).await {
        Ok(response) => response,
        Err(error) => failed(&error),
    }
}

/// The header a request id comes in and goes back in.
const REQUEST_ID_HEADER: &str = "x-request-id";
/// The server's version, on health answers (`topology-claims status` reads it).
pub const VERSION_HEADER: &str = "x-topology-claims-version";

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

/// Applies the per-cell limits to an allowed request: its in-flight slot and, for a listing,
/// its place under `--cell-max-streams`; or the refusal.
fn admit(
    layer: &AuthorizeLayer,
    caller: &Caller,
    method: Method,
    cell_id: &str,
) -> Result<(Option<InFlight>, Option<StreamSlot>), ClaimsError> {
    let Some(cell) = limited_cell(caller, method, cell_id) else {
        return Ok((None, None));
    };
    let stream = if method.is_listing() {
        Some(layer.responses.admit(cell)?)
    } else {
        None
    };
    let slot = match &layer.limiter {
        Some(limiter) => limiter.admit(cell, method.mutates())?,
        None => None,
    };
    Ok((slot, stream))
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

/// A listing's response under the stall watchdog (`--stall-timeout`); others as they are.
fn watched<E>(
    response: Result<http::Response<Body>, E>,
    layer: &AuthorizeLayer,
    method: Method,
) -> Result<http::Response<Body>, E> {
    if !method.is_listing() {
        return response;
    }
    response.map(|r| r.map(|body| layer.responses.watch(body)))
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

#[cfg(test)]
mod tests {
    use super::*;

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

    /// What the handler of [`run`]'s tests does.
    #[derive(Clone, Copy, Debug)]
    enum Mode {
        AtOnce,
        AfterAWait,
        PanicAtOnce,
        PanicAfterAWait,
    }

    /// A handler that answers OK (or panics) at once or after one wait, recording the tokio
    /// task that polled it last.
    #[derive(Clone)]
    struct Handler {
        mode: Mode,
        last_task: Arc<std::sync::Mutex<Option<tokio::task::Id>>>,
    }

    impl Service<http::Request<Body>> for Handler {
        type Response = http::Response<Body>;
        type Error = std::convert::Infallible;
        type Future = BoxFuture<Result<http::Response<Body>, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<Body>) -> Self::Future {
            let (mode, last_task) = (self.mode, Arc::clone(&self.last_task));
            Box::pin(async move {
                if matches!(mode, Mode::AfterAWait | Mode::PanicAfterAWait) {
                    tokio::task::yield_now().await;
                }
                *last_task.lock().unwrap() = tokio::task::try_id();
                if matches!(mode, Mode::PanicAtOnce | Mode::PanicAfterAWait) {
                    panic!("the handler fails");
                }
                Ok(http::Response::new(Body::empty()))
            })
        }
    }

    #[tokio::test]
    async fn a_mutation_that_ends_at_once_is_not_spawned_and_a_panic_is_answered_internal() {
        let here = tokio::spawn(async {
            let mut seen = Vec::new();
            for mode in [
                Mode::AtOnce,
                Mode::AfterAWait,
                Mode::PanicAtOnce,
                Mode::PanicAfterAWait,
            ] {
                let handler = Handler {
                    mode,
                    last_task: Arc::default(),
                };
                let request = http::Request::new(Body::empty());
                let response = run(handler.clone(), request, Method::BeginUpdate, None, None)
                    .await
                    .unwrap();
                let status = tonic::Status::from_header_map(response.headers());
                let code = status.map_or(tonic::Code::Ok, |s| s.code());
                let task = *handler.last_task.lock().unwrap();
                seen.push((mode, code, task == tokio::task::try_id()));
            }
            seen
        });
        let seen = here.await.unwrap();
        let summary: Vec<_> = seen.iter().map(|(_, code, same)| (*code, *same)).collect();
        assert_eq!(
            summary,
            [
                // Ended at the first poll: answered on the caller's own task.
                (tonic::Code::Ok, true),
                // Pending at first: finished on a task of its own.
                (tonic::Code::Ok, false),
                // A panic, inline or on the task: INTERNAL, never a lost answer.
                (tonic::Code::Internal, true),
                (tonic::Code::Internal, false),
            ],
            "{seen:?}"
        );
    }
}

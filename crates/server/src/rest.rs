//! REST lookups on the serve port, for HTTP routers: `GET /v1/claims/{namespace}/{value}`
//! answers the claim as JSON, with cache headers (docs/api.md, "REST"; `docs/openapi.json`).
//!
//! Served by the same tonic server as gRPC (axum routes beside the services, HTTP/1.1 and
//! HTTP/2), so every request crosses the same listener limits, TLS, request guard and
//! authorization layer first; the table names it `Method::RestLookup` and allows it to routers,
//! cells and admins, as LookupClaim.
//!
//! Owns the JSON shape and the HTTP face of a status: [`RestAnswers`] is the one place where an
//! error on a REST path, whichever layer answered it (the guard, the authorization layer, the
//! handler), becomes a JSON body with the ErrorInfo reason and its HTTP status, and where every
//! REST answer gets its `Cache-Control`. Decides nothing: the store resolves the key under the
//! namespace's rules as LookupClaim does.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::routing::{any, get};
use bytes::Bytes;
use http::{header, HeaderValue, StatusCode};
use tonic::body::Body;
use tonic::{Code, Status};
use tonic_types::StatusExt;
use tower_layer::Layer;
use tower_service::Service;

use crate::grpc::status::{code_name, to_status};
use topology_claims::domain::{Claim, ClaimState};
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;
use topology_claims_proto::{convert, pb};

/// Every REST path starts with this; any other path is gRPC's.
pub const PREFIX: &str = "/v1/";

/// The lookup route, in axum's syntax.
pub const LOOKUP_ROUTE: &str = "/v1/claims/{namespace}/{value}";

/// `serve --rest-max-age`: how long a router may cache a found claim.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(5);

/// `serve --rest-negative-max-age`: how long a router may cache a 404. Short, since a claim
/// leased a moment later is routable at once.
pub const DEFAULT_NEGATIVE_MAX_AGE: Duration = Duration::from_secs(1);

/// The REST face's knobs (`serve --rest`, `--rest-max-age`, `--rest-negative-max-age`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestConfig {
    pub max_age: Duration,
    pub negative_max_age: Duration,
}

impl Default for RestConfig {
    fn default() -> Self {
        Self {
            max_age: DEFAULT_MAX_AGE,
            negative_max_age: DEFAULT_NEGATIVE_MAX_AGE,
        }
    }
}

/// The REST routes, to merge beside the gRPC services.
pub fn routes(store: Arc<dyn ClaimStore>) -> axum::Router {
    axum::Router::new()
        .route(LOOKUP_ROUTE, get(lookup))
        .route("/v1/{*rest}", any(no_such_path))
        .with_state(store)
}

async fn lookup(
    State(store): State<Arc<dyn ClaimStore>>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> http::Response<Body> {
    let Ok(Path((namespace, value))) = path else {
        return to_status(&ClaimsError::invalid(
            "value",
            "the path is not /v1/claims/{namespace}/{value} with valid percent-encoded UTF-8",
        ))
        .into_http();
    };
    let request = pb::LookupClaimRequest {
        claim_type: 0,
        claim_value: value,
        namespace,
    };
    let found = match convert::claim_key_from_pb(&request) {
        Ok(key) => store.lookup_claim(&key).await,
        Err(error) => Err(error),
    };
    match found {
        Ok(claim) => {
            let mut answer = json(StatusCode::OK, claim_json(&claim));
            if let Ok(tag) = HeaderValue::from_str(&format!("\"{}\"", claim.revision)) {
                answer.headers_mut().insert(header::ETAG, tag);
            }
            answer
        }
        Err(error) => to_status(&error).into_http(),
    }
}

async fn no_such_path(uri: http::Uri) -> http::Response<Body> {
    Status::not_found(format!(
        "no REST resource at {}: lookups are GET {LOOKUP_ROUTE}",
        uri.path()
    ))
    .into_http()
}

/// A found claim as the REST answer's JSON object.
pub fn claim_json(claim: &Claim) -> serde_json::Value {
    let record = &claim.record;
    serde_json::json!({
        "namespace": record.key.namespace.to_string(),
        "value": record.display_value(),
        "key": record.key.value,
        "cell_id": claim.cell_id.as_str(),
        "state": state_name(claim.state()),
        "owner_type": record.owner_type.name(),
        "owner_value": record.owner_value,
        "source_table": record.table_name.name(),
        "source_record_id": record.table_record_id,
        "revision": claim.revision,
    })
}

/// A claim state as REST and the docs name it.
pub fn state_name(state: ClaimState) -> &'static str {
    match state {
        ClaimState::Active => "active",
        ClaimState::Creating => "creating",
        ClaimState::Destroying => "destroying",
        ClaimState::Updating => "updating",
    }
}

/// The HTTP status of a gRPC code (the mapping of google.rpc.Code's documentation, as
/// grpc-gateway applies it).
pub fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A REST error answer: `{"error": REASON, "code": GRPC_CODE, "message": …, "metadata": {…}}`,
/// REASON being the ErrorInfo reason gRPC sends (or the code's name when there is none), with
/// a `Retry-After` when the status carries a RetryInfo.
pub fn error_answer(status: &Status) -> http::Response<Body> {
    let details = status.get_error_details();
    let info = details.error_info();
    let reason = info.map_or_else(|| code_name(status.code()).to_owned(), |i| i.reason.clone());
    let metadata: serde_json::Map<String, serde_json::Value> = info
        .map(|i| {
            i.metadata
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect()
        })
        .unwrap_or_default();
    let mut answer = json(
        http_status(status.code()),
        serde_json::json!({
            "error": reason,
            "code": code_name(status.code()),
            "message": status.message(),
            "metadata": metadata,
        }),
    );
    if let Some(delay) = details.retry_info().and_then(|r| r.retry_delay) {
        let seconds = delay.as_secs_f64().ceil().max(1.0) as u64;
        answer
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    answer
}

fn json(status: StatusCode, value: serde_json::Value) -> http::Response<Body> {
    let mut bytes = serde_json::to_vec(&value).unwrap_or_default();
    bytes.push(b'\n');
    let mut answer = http::Response::new(Body::new(http_body_util::Full::new(Bytes::from(bytes))));
    *answer.status_mut() = status;
    answer.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    answer
}

/// The outermost layer: on REST paths, a gRPC-shaped error answer (trailers-only, from any
/// inner layer or the handler) becomes [`error_answer`], and every answer gets its
/// `Cache-Control` (`max-age` for a found claim, the negative one for a 404, `no-store` for
/// anything else). Other paths pass untouched.
#[derive(Clone, Copy, Debug)]
pub struct RestAnswersLayer {
    pub config: RestConfig,
}

impl<S> Layer<S> for RestAnswersLayer {
    type Service = RestAnswers<S>;

    fn layer(&self, inner: S) -> RestAnswers<S> {
        RestAnswers {
            inner,
            config: self.config,
        }
    }
}

#[derive(Clone, Debug)]
pub struct RestAnswers<S> {
    inner: S,
    config: RestConfig,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> Service<http::Request<Body>> for RestAnswers<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>> + Send + 'static,
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
        let rest = request.uri().path().starts_with(PREFIX);
        let answer = self.inner.call(request);
        if !rest {
            return Box::pin(answer);
        }
        let config = self.config;
        Box::pin(async move { answer.await.map(|answer| rest_answer(answer, config)) })
    }
}

fn rest_answer(answer: http::Response<Body>, config: RestConfig) -> http::Response<Body> {
    let mut answer = match Status::from_header_map(answer.headers()) {
        Some(status) if status.code() != Code::Ok => error_answer(&status),
        _ => answer,
    };
    let cache = match answer.status() {
        StatusCode::OK => format!("max-age={}", config.max_age.as_secs()),
        StatusCode::NOT_FOUND => format!("max-age={}", config.negative_max_age.as_secs()),
        _ => "no-store".to_owned(),
    };
    if let Ok(value) = HeaderValue::from_str(&cache) {
        answer.headers_mut().insert(header::CACHE_CONTROL, value);
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[test]
    fn every_grpc_code_has_an_http_status_and_errors_are_never_200() {
        for number in 1..=16 {
            let code = Code::from_i32(number);
            assert_ne!(http_status(code), StatusCode::OK, "{code:?}");
        }
        assert_eq!(http_status(Code::NotFound), StatusCode::NOT_FOUND);
        assert_eq!(http_status(Code::InvalidArgument), StatusCode::BAD_REQUEST);
        assert_eq!(http_status(Code::PermissionDenied), StatusCode::FORBIDDEN);
    }

    #[tokio::test]
    async fn an_error_answer_carries_the_reason_and_a_retry_after() {
        let error = ClaimsError::RateLimited {
            cell_id: "cell-a".to_owned(),
            limit: "--cell-rate",
            retry_after: Duration::from_millis(1500),
        };
        let answer = rest_answer(to_status(&error).into_http(), RestConfig::default());
        assert_eq!(answer.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(answer.headers()[header::RETRY_AFTER], "2");
        assert_eq!(answer.headers()[header::CACHE_CONTROL], "no-store");
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(value["error"], "RATE_LIMITED");
        assert_eq!(value["code"], "RESOURCE_EXHAUSTED");
    }
}

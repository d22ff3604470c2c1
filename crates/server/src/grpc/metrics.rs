//! The outermost tower layer: counts every request by RPC and gRPC code, times it, and counts
//! claim conflicts by the ErrorInfo reason of the answer
//! (`crate::metrics::ServerMetrics`). Outermost, so refusals of the inner layers (byte budgets,
//! timeouts, authorization, per-cell limits) are counted too.
//!
//! Owns recording only; reads the answer's status, never decides one.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tonic::body::Body;
use tonic_types::StatusExt;
use tower_layer::Layer;
use tower_service::Service;

use crate::auth::Method;
use crate::grpc::status::code_name;
use crate::metrics::{ServerMetrics, CONFLICT_REASONS};

/// Builds [`RecordMetrics`] services.
#[derive(Clone)]
pub struct MetricsLayer {
    pub metrics: Option<Arc<ServerMetrics>>,
}

impl<S> Layer<S> for MetricsLayer {
    type Service = RecordMetrics<S>;

    fn layer(&self, inner: S) -> RecordMetrics<S> {
        RecordMetrics {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

#[derive(Clone)]
pub struct RecordMetrics<S> {
    inner: S,
    metrics: Option<Arc<ServerMetrics>>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> Service<http::Request<Body>> for RecordMetrics<S>
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
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let Some(metrics) = self.metrics.clone() else {
            return Box::pin(inner.call(request));
        };
        let method = Method::from_path(request.uri().path());
        let started = Instant::now();
        Box::pin(async move {
            let response = inner.call(request).await;
            if let Ok(response) = &response {
                record(&metrics, method, response.headers(), started);
            }
            response
        })
    }
}

/// Records an answer whose status is in `headers` (every error of a unary RPC is a
/// trailers-only answer), or OK when it is not there.
fn record(metrics: &ServerMetrics, method: Method, headers: &http::HeaderMap, started: Instant) {
    let name = method.name();
    metrics
        .request_duration
        .with_label_values(&[name])
        .observe(started.elapsed().as_secs_f64());
    let status = tonic::Status::from_header_map(headers);
    let code = status.as_ref().map_or(tonic::Code::Ok, |s| s.code());
    metrics
        .requests
        .with_label_values(&[name, code_name(code)])
        .inc();
    let Some(status) = status.filter(|s| s.code() != tonic::Code::Ok) else {
        return;
    };
    let details = status.get_error_details();
    let Some(info) = details.error_info() else {
        return;
    };
    // RATE_LIMITED is counted by the limiter itself, under its bounded cell keys.
    if let Some(reason) = CONFLICT_REASONS.iter().find(|r| **r == info.reason) {
        metrics.claim_conflicts.with_label_values(&[reason]).inc();
    }
}

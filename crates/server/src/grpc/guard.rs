//! The tower layer every request passes before any handler: it charges each gRPC message of
//! the request body against the budgets of request bytes in flight, and bounds the whole request
//! (reading the body included) by `--request-timeout`.
//!
//! Which budgets a request is charged to follows from who the transport says is calling, known
//! before any byte of the body (decision 075):
//! - its connection's (`--max-request-bytes-per-connection`), always;
//! - a verified caller (a cell, a router, an operator): the server's (`--max-request-bytes`) and
//!   its own share of it (`--cell-max-request-bytes`), so one cell can never spend it all;
//! - a caller without a verified identity on a TLS listener, and every caller of the plaintext
//!   `--health-listen` port: a small budget of their own (`--max-anonymous-request-bytes`),
//!   never the cells';
//! - a caller of a plaintext server (trusted, decision 061): the server's.
//!
//! A message is charged its *declared* length as soon as its 5-byte gRPC prefix arrives,
//! because that is what the decoder reserves for it; a message over a budget fails at once with
//! RESOURCE_EXHAUSTED naming the limit. So a client that opens many streams, declares large
//! messages and sends all but their last byte pins at most the budgets, never more. The charge
//! is held until the request's body is dropped (when the message is decoded, or the request
//! ends). A declared length above the method's message-size limit (256 bytes for a health check,
//! which carries only a service name) is refused at once (OUT_OF_RANGE, naming the limit),
//! before any of its bytes are read: nothing reaches authorization or a decoder that these
//! budgets did not admit.
//!
//! The same budgets are handed to later layers as a request extension ([`RequestBudget`]):
//! authorization charges a BeginUpdate's decoded claims to the server's budget
//! ([`DECODED_CLAIM_BYTES`] each) before the decoder materializes them, and keeps what it read
//! charged until the handler has answered, so the budget bounds requests being decoded and
//! handled, not only bytes arriving.
//!
//! Owns these bounds only: it reads the transport's identity, decides nothing from it but the
//! budget, and knows no protocol rule.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::body::Body;
use tonic::Status;
use tower_layer::Layer;
use tower_service::Service;

use crate::auth::Caller;
use crate::grpc::limits::{ServerLimits, MAX_HEALTH_REQUEST_BYTES};
use crate::grpc::listener::{ConnInfo, ServerStats};

/// The path prefix of `grpc.health.v1.Health`'s methods.
const HEALTH_PATH: &str = "/grpc.health.v1.Health/";

/// Verified callers whose byte shares are remembered; past it, the shares nobody holds are
/// forgotten (a share in use is never dropped, so no caller escapes its bound).
const CALLER_SHARES_KEPT: usize = 4096;

/// Builds [`RequestGuard`]s sharing one server-wide byte budget.
#[derive(Clone)]
pub struct RequestGuardLayer {
    total: Arc<Semaphore>,
    anonymous: Arc<Semaphore>,
    shares: Arc<Mutex<HashMap<String, Arc<Semaphore>>>>,
    limits: Arc<ServerLimits>,
    max_message_bytes: usize,
    stats: Arc<ServerStats>,
    /// Every caller is charged to the anonymous budget (the plaintext `--health-listen` port).
    untrusted_listener: bool,
}

impl RequestGuardLayer {
    /// `max_message_bytes`: the server's message-size limit (a larger declared length is refused).
    pub fn new(limits: &ServerLimits, max_message_bytes: usize, stats: Arc<ServerStats>) -> Self {
        Self {
            total: Arc::new(Semaphore::new(limits.request_bytes_total)),
            anonymous: Arc::new(Semaphore::new(limits.request_bytes_anonymous)),
            shares: Arc::default(),
            limits: Arc::new(limits.clone()),
            max_message_bytes,
            stats,
            untrusted_listener: false,
        }
    }

    /// For a listener nobody is identified on and nobody is trusted on (`--health-listen`):
    /// every request is charged to the anonymous budget.
    pub fn untrusted(mut self) -> Self {
        self.untrusted_listener = true;
        self
    }

    /// The budget a caller's bytes come out of, and its own share of it, if any.
    fn pool_of(&self, caller: Option<&Caller>) -> (Pool, Option<Arc<Semaphore>>) {
        match caller {
            _ if self.untrusted_listener => (Pool::Anonymous, None),
            Some(Caller::Verified(principal)) => (Pool::Server, Some(self.share_of(&principal.id))),
            Some(Caller::NoCertificate | Caller::Unidentified { .. }) => (Pool::Anonymous, None),
            Some(Caller::Anonymous { .. }) | None => (Pool::Server, None),
        }
    }

    fn share_of(&self, id: &str) -> Arc<Semaphore> {
        let mut shares = self.shares.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(share) = shares.get(id) {
            return Arc::clone(share);
        }
        if shares.len() >= CALLER_SHARES_KEPT {
            shares.retain(|_, share| Arc::strong_count(share) > 1);
        }
        let share = Arc::new(Semaphore::new(self.limits.request_bytes_per_cell));
        shares.insert(id.to_owned(), Arc::clone(&share));
        share
    }

    /// The largest message `path` may declare.
    fn max_message_bytes(&self, path: &str) -> usize {
        if path.starts_with(HEALTH_PATH) {
            self.max_message_bytes.min(MAX_HEALTH_REQUEST_BYTES)
        } else {
            self.max_message_bytes
        }
    }
}

/// The budget a request's bytes come out of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pool {
    Server,
    Anonymous,
}

impl<S> Layer<S> for RequestGuardLayer {
    type Service = RequestGuard<S>;

    fn layer(&self, inner: S) -> RequestGuard<S> {
        RequestGuard {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct RequestGuard<S> {
    inner: S,
    layer: RequestGuardLayer,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> Service<http::Request<Body>> for RequestGuard<S>
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

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        let info = request.extensions().get::<ConnInfo>();
        let connection = info.map(|info| Arc::clone(&info.request_bytes));
        let (pool, share) = self.layer.pool_of(info.map(|info| &info.caller));
        let method = request.uri().path().to_owned();
        let layer = self.layer.clone();
        let budget = RequestBudget {
            max_message_bytes: layer.max_message_bytes(&method),
            layer: layer.clone(),
            connection,
            pool,
            share,
        };
        request.extensions_mut().insert(budget.clone());
        let request = request.map(|body| {
            Body::new(BudgetedBody {
                inner: body,
                budget,
                held: Charge::default(),
                framing: Framing::default(),
            })
        });
        let response = self.inner.call(request);
        let timeout = layer.limits.request_timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, response).await {
                Ok(answer) => answer,
                Err(_) => {
                    ServerStats::count(&layer.stats.requests_timed_out);
                    tracing::warn!(%method, ?timeout, "request timed out");
                    Ok(Status::deadline_exceeded(format!(
                        "{method} took longer than the server's --request-timeout {timeout:?}"
                    ))
                    .into_http())
                }
            }
        })
    }
}

/// Bytes a decoded claim of a BeginUpdate is charged (its protobuf struct, its domain struct,
/// their strings' allocations and the batch check's set entry: about 250 bytes measured for
/// short values; a claim's own value bytes are already charged as wire bytes).
pub const DECODED_CLAIM_BYTES: usize = 256;

/// The byte budgets a request is charged to: the server's and its connection's. A request
/// extension, so that later layers charge what they are about to hold.
#[derive(Clone)]
pub struct RequestBudget {
    layer: RequestGuardLayer,
    connection: Option<Arc<Semaphore>>,
    pool: Pool,
    /// The verified caller's own share of the server's budget.
    share: Option<Arc<Semaphore>>,
    /// The largest message this request's method may declare.
    max_message_bytes: usize,
}

/// Bytes taken from the budgets, given back when dropped.
#[derive(Default)]
pub struct Charge {
    total: Option<OwnedSemaphorePermit>,
    share: Option<OwnedSemaphorePermit>,
    connection: Option<OwnedSemaphorePermit>,
}

impl Charge {
    fn keep(&mut self, more: Charge) {
        keep(&mut self.total, more.total);
        keep(&mut self.share, more.share);
        keep(&mut self.connection, more.connection);
    }
}

/// A request body whose buffered bytes are charged to the budgets until it is dropped.
struct BudgetedBody {
    inner: Body,
    budget: RequestBudget,
    held: Charge,
    framing: Framing,
}

/// Where the body is in its gRPC message framing: a 5-byte prefix (compressed flag, length),
/// then that many bytes, repeated.
#[derive(Default)]
struct Framing {
    prefix: [u8; 5],
    prefix_len: usize,
    body_left: usize,
}

impl Framing {
    /// Walks `data`; returns the declared length of every message whose prefix completes in it.
    fn declared(&mut self, mut data: &[u8]) -> Vec<usize> {
        let mut lengths = Vec::new();
        while !data.is_empty() {
            if self.body_left > 0 {
                let n = self.body_left.min(data.len());
                self.body_left -= n;
                data = &data[n..];
                continue;
            }
            let n = (5 - self.prefix_len).min(data.len());
            self.prefix[self.prefix_len..self.prefix_len + n].copy_from_slice(&data[..n]);
            self.prefix_len += n;
            data = &data[n..];
            if self.prefix_len == 5 {
                let p = self.prefix;
                let length = u32::from_be_bytes([p[1], p[2], p[3], p[4]]) as usize;
                lengths.push(length);
                self.body_left = length;
                self.prefix_len = 0;
            }
        }
        lengths
    }
}

fn keep(slot: &mut Option<OwnedSemaphorePermit>, permit: Option<OwnedSemaphorePermit>) {
    match (slot.as_mut(), permit) {
        (Some(held), Some(permit)) => held.merge(permit),
        (None, permit) => *slot = permit,
        (Some(_), None) => {}
    }
}

impl RequestBudget {
    /// Takes `bytes` from the caller's budgets and the connection's, or refuses naming the one
    /// that is spent.
    pub fn charge(&self, bytes: usize) -> Result<Charge, Status> {
        let mut charge = self.charge_server(bytes)?;
        if let Some(connection) = &self.connection {
            let limit = self.layer.limits.request_bytes_per_connection;
            charge.connection = Some(self.take(
                connection,
                bytes,
                "--max-request-bytes-per-connection",
                limit,
            )?);
        }
        Ok(charge)
    }

    /// Takes `bytes` from the caller's budgets only: its pool (the server's, or the anonymous
    /// callers') and its own share of it. What a request holds beyond its wire bytes is charged
    /// this way: a connection's budget bounds what one peer can make the server buffer.
    pub fn charge_server(&self, bytes: usize) -> Result<Charge, Status> {
        let limits = &self.layer.limits;
        let share = match &self.share {
            Some(share) => Some(self.take(
                share,
                bytes,
                "--cell-max-request-bytes",
                limits.request_bytes_per_cell,
            )?),
            None => None,
        };
        let total = match self.pool {
            Pool::Server => self.take(
                &self.layer.total,
                bytes,
                "--max-request-bytes",
                limits.request_bytes_total,
            )?,
            Pool::Anonymous => self.take(
                &self.layer.anonymous,
                bytes,
                "--max-anonymous-request-bytes",
                limits.request_bytes_anonymous,
            )?,
        };
        Ok(Charge {
            total: Some(total),
            share,
            connection: None,
        })
    }

    fn take(
        &self,
        budget: &Arc<Semaphore>,
        bytes: usize,
        flag: &str,
        limit: usize,
    ) -> Result<OwnedSemaphorePermit, Status> {
        let over = || self.over(flag, limit);
        let n = u32::try_from(bytes).map_err(|_| over())?;
        Arc::clone(budget)
            .try_acquire_many_owned(n)
            .map_err(|_| over())
    }

    fn over(&self, flag: &str, limit: usize) -> Status {
        ServerStats::count(&self.layer.stats.requests_over_byte_budget);
        Status::resource_exhausted(format!(
            "request bytes in flight are over {flag} ({limit} bytes); retry with backoff"
        ))
    }
}

impl HttpBody for BudgetedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                for length in self.framing.declared(data) {
                    let limit = self.budget.max_message_bytes;
                    if length > limit {
                        ServerStats::count(&self.budget.layer.stats.requests_over_byte_budget);
                        let what = if limit < self.budget.layer.max_message_bytes {
                            "a health check carries only a service name"
                        } else {
                            "what a batch of --max-batch claims can need"
                        };
                        return Poll::Ready(Some(Err(Status::out_of_range(format!(
                            "a request message of {length} bytes is over the server's limit of \
                             {limit} bytes ({what})"
                        )))));
                    }
                    match self.budget.charge(5 + length) {
                        Ok(charge) => self.held.keep(charge),
                        Err(status) => return Poll::Ready(Some(Err(status))),
                    }
                }
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_held_until_the_body_is_dropped_and_refused_past_a_budget() {
        let limits = ServerLimits {
            request_bytes_per_connection: 100,
            request_bytes_total: 150,
            ..ServerLimits::default()
        };
        let layer = RequestGuardLayer::new(&limits, 4 << 20, Arc::default());
        let connection = Arc::new(Semaphore::new(limits.request_bytes_per_connection));
        let budget = |layer: &RequestGuardLayer| RequestBudget {
            layer: layer.clone(),
            connection: Some(Arc::clone(&connection)),
            pool: Pool::Server,
            share: None,
            max_message_bytes: 4 << 20,
        };
        let mut first = Charge::default();
        first.keep(budget(&layer).charge(60).unwrap());
        first.keep(budget(&layer).charge(30).unwrap());
        assert_eq!(connection.available_permits(), 10);
        assert_eq!(layer.total.available_permits(), 60);
        let error = budget(&layer).charge(20).err().unwrap();
        assert_eq!(error.code(), tonic::Code::ResourceExhausted);
        assert!(error
            .message()
            .contains("--max-request-bytes-per-connection"));
        // What is held beyond the wire bytes counts against the server's budget only.
        let decoded = budget(&layer).charge_server(20).unwrap();
        assert_eq!(connection.available_permits(), 10);
        assert_eq!(layer.total.available_permits(), 40);
        drop(decoded);
        // Another connection hits the server-wide budget instead.
        let other = RequestBudget {
            connection: None,
            ..budget(&layer)
        };
        let held = other.charge(60).unwrap();
        let error = other.charge(1).err().unwrap();
        assert!(
            error.message().contains("--max-request-bytes ("),
            "{}",
            error.message()
        );
        drop(first);
        drop(held);
        assert_eq!(connection.available_permits(), 100);
        assert_eq!(layer.total.available_permits(), 150);
    }

    #[test]
    fn a_cell_spends_only_its_share_and_anonymous_callers_only_their_own_budget() {
        let limits = ServerLimits {
            request_bytes_total: 400,
            request_bytes_per_cell: 100,
            request_bytes_anonymous: 300,
            ..ServerLimits::default()
        };
        let layer = RequestGuardLayer::new(&limits, 4 << 20, Arc::default());
        let budget = |caller: Caller| {
            let (pool, share) = layer.pool_of(Some(&caller));
            RequestBudget {
                layer: layer.clone(),
                connection: None,
                pool,
                share,
                max_message_bytes: 4 << 20,
            }
        };
        let cell = |name: &str| {
            Caller::Verified(crate::auth::Principal {
                role: crate::auth::Role::Cell,
                name: name.to_owned(),
                id: format!("spiffe://t/cell/{name}"),
            })
        };
        let held = budget(cell("cell-2")).charge(100).unwrap();
        let error = budget(cell("cell-2")).charge(1).err().unwrap();
        assert!(
            error.message().contains("--cell-max-request-bytes (100"),
            "{}",
            error.message()
        );
        // Another cell still has its share, from what the first left of the server's budget.
        let other = budget(cell("cell-1")).charge(100).unwrap();
        assert_eq!(layer.total.available_permits(), 200);
        // Callers without an identity spend their own budget, never the server's.
        let anonymous = budget(Caller::NoCertificate).charge(300).unwrap();
        let error = budget(Caller::Unidentified { why: "x".into() })
            .charge(1)
            .err()
            .unwrap();
        assert!(
            error
                .message()
                .contains("--max-anonymous-request-bytes (300"),
            "{}",
            error.message()
        );
        assert_eq!(layer.total.available_permits(), 200);
        // A plaintext server's callers are trusted: the server's budget, no share.
        drop(
            budget(Caller::Anonymous { loopback: true })
                .charge(200)
                .unwrap(),
        );
        // On the health port every caller is anonymous.
        let health = layer.clone().untrusted();
        assert_eq!(health.pool_of(Some(&cell("cell-1"))).0, Pool::Anonymous);
        drop((held, other, anonymous));
        assert_eq!(layer.total.available_permits(), 400);
        assert_eq!(layer.anonymous.available_permits(), 300);
    }

    #[test]
    fn a_health_check_may_declare_256_bytes_at_most() {
        let layer = RequestGuardLayer::new(&ServerLimits::default(), 1 << 20, Arc::default());
        assert_eq!(layer.max_message_bytes("/grpc.health.v1.Health/Check"), 256);
        assert_eq!(layer.max_message_bytes("/grpc.health.v1.Health/Watch"), 256);
        assert_eq!(
            layer.max_message_bytes("/topology.claims.v1.ClaimsService/BeginUpdate"),
            1 << 20
        );
    }

    #[test]
    fn message_prefixes_are_found_across_chunk_boundaries() {
        let mut framing = Framing::default();
        // Message of 3 bytes, then the prefix of one of 70000 bytes split over two chunks.
        let mut stream = vec![0, 0, 0, 0, 3, 7, 7, 7, 0];
        stream.extend_from_slice(&70_000u32.to_be_bytes());
        assert_eq!(framing.declared(&stream[..7]), vec![3]);
        assert_eq!(framing.declared(&stream[7..11]), Vec::<usize>::new());
        assert_eq!(framing.declared(&stream[11..]), vec![70_000]);
        assert_eq!(framing.declared(&[0; 69_999]), Vec::<usize>::new());
        assert_eq!(framing.declared(&[0, 0, 0, 0, 0, 0]), vec![0]);
    }
}

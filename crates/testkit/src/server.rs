//! [`TestServer`]: the real gRPC server (`grpc::server::serve`) on an ephemeral 127.0.0.1 port
//! in the test's own runtime, for end-to-end tests over TCP.
//!
//! Test scaffolding only: it panics when the server cannot start or fails, which is the test
//! failing.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use topology_claims_proto::pb::admin::admin_service_client::AdminServiceClient;

use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;
use topology_claims_client::decode::claims_client;
use topology_claims_proto::pb::claims_service_client::ClaimsServiceClient;
use topology_claims_server::grpc::server::{serve, ServerConfig};

/// A running in-process server. Dropping it without [`shutdown`](Self::shutdown) stops it too,
/// without waiting.
pub struct TestServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ClaimsError>>>,
}

impl TestServer {
    /// Starts a server over `store` with the default [`ServerConfig`].
    pub async fn start(store: Arc<dyn ClaimStore>) -> TestServer {
        Self::start_with(store, ServerConfig::default()).await
    }

    /// Starts a server over `store` with `config` (e.g. a small `max_batch`).
    pub async fn start_with(store: Arc<dyn ClaimStore>, config: ServerConfig) -> TestServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind an ephemeral port on 127.0.0.1");
        let addr = listener.local_addr().expect("the bound address");
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            // A dropped sender (the TestServer dropped) stops the server as well.
            let _ = stopped.await;
        };
        let task = tokio::spawn(serve(listener, store, config, shutdown));
        TestServer {
            addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// The ClaimsService alone over `store` (default settings: no authorization, limits or
    /// admin API) without the methods named in `hidden` (e.g. `"StreamClaims"`), as a server
    /// that predates them: their paths are routed as an unknown method, which tonic answers
    /// UNIMPLEMENTED.
    pub async fn start_without(
        store: Arc<dyn ClaimStore>,
        hidden: &'static [&'static str],
    ) -> TestServer {
        use topology_claims_proto::pb::claims_service_server::ClaimsServiceServer;
        use topology_claims_server::grpc::{ClaimsServiceImpl, ServiceConfig};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind an ephemeral port on 127.0.0.1");
        let addr = listener.local_addr().expect("the bound address");
        let (stop, stopped) = oneshot::channel::<()>();
        let service =
            ClaimsServiceServer::new(ClaimsServiceImpl::new(store, ServiceConfig::default()));
        let server = tonic::transport::Server::builder()
            .layer(tower_layer::layer_fn(move |inner| Without {
                inner,
                hidden,
            }))
            .add_service(service)
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async move {
                    let _ = stopped.await;
                },
            );
        let task = tokio::spawn(async move {
            server
                .await
                .map_err(|e| ClaimsError::internal(format!("test server: {e}")))
        });
        TestServer {
            addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A client on a fresh connection, accepting responses as large as ours do
    /// (`topology_claims_client::decode::claims_client`).
    pub async fn client(&self) -> ClaimsServiceClient<Channel> {
        let channel = Channel::from_shared(self.endpoint())
            .expect("a valid endpoint")
            .connect()
            .await
            .unwrap_or_else(|e| panic!("connect to the test server at {}: {e}", self.endpoint()));
        claims_client(channel)
    }

    /// An AdminService client on a fresh connection (the test server listens on loopback, so
    /// the plaintext admin API is open to it).
    pub async fn admin_client(&self) -> AdminServiceClient<Channel> {
        let channel = Channel::from_shared(self.endpoint())
            .expect("a valid endpoint")
            .connect()
            .await
            .unwrap_or_else(|e| panic!("connect to the test server at {}: {e}", self.endpoint()));
        AdminServiceClient::new(channel)
    }

    /// Stops accepting, waits for in-flight requests to finish and the server to return.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => panic!("the test server failed: {e}"),
                Err(e) => panic!("the test server task failed: {e}"),
            }
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Hides the ClaimsService methods named in `hidden` from the service behind it.
#[derive(Clone)]
struct Without<S> {
    inner: S,
    hidden: &'static [&'static str],
}

impl<S, B> tower_service::Service<http::Request<B>> for Without<S>
where
    S: tower_service::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> S::Future {
        let method = request
            .uri()
            .path()
            .strip_prefix("/topology.claims.v1.ClaimsService/");
        if method.is_some_and(|m| self.hidden.contains(&m)) {
            let mut parts = request.uri().clone().into_parts();
            parts.path_and_query = Some(http::uri::PathAndQuery::from_static(
                "/topology.claims.v1.ClaimsService/NotYetInvented",
            ));
            if let Ok(uri) = http::Uri::from_parts(parts) {
                *request.uri_mut() = uri;
            }
        }
        self.inner.call(request)
    }
}

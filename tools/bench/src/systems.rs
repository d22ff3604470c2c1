//! The systems a benchmark run measures side by side, and one client connection to each:
//! the claims service over real gRPC (a `serve` child or `--server URL`), and the baselines —
//! the adapter's SQL run directly (`raw_sql`), etcd (`etcd`) and the empty gRPC server
//! (`noop`, through the same client code as the service).
//!
//! Owns the uniform begin/commit interface the load loop drives. Must not measure or report.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tonic::transport::Channel;
use topology_claims::LeaseId;
use topology_claims_client::decode::claims_client;
use topology_claims_client::{server_endpoint, ClientTls};
use topology_claims_proto::convert::begin_update_to_pb;
use topology_claims_proto::pb;
use topology_claims_proto::pb::claims_service_client::ClaimsServiceClient;
use topology_claims_proto::status::from_status;

use super::etcd::{EtcdConn, EtcdServer};
pub use super::raw_sql::PgSchema;
use super::raw_sql::{SqlConn, SqlMode, SqlTarget};
use super::workload::{client_cell, Batch, Reason};
use topology_claims_harness::pki::DevPki;
use topology_claims_harness::serve::ServeChild;

/// A system under test.
pub enum System {
    /// The claims service through gRPC.
    Service {
        /// `memory`, `postgres`, `sqlite`, or `server` for `--server URL`.
        label: String,
        endpoint: String,
        /// The `serve` child, when the bench started it (`--store`).
        child: Option<ServeChild>,
        /// The store's PostgreSQL database and schema (for the bulk loader of the scale checks).
        postgres: Option<PgSchema>,
        /// Mutual TLS: each client connects over https:// with its cell's certificate.
        tls: Option<Arc<BenchTls>>,
        /// The child's `--metrics-listen` address, scraped for the combiner's batch sizes.
        metrics: Option<SocketAddr>,
    },
    /// The adapter's statements, executed directly with tokio-postgres.
    RawSql(Arc<SqlTarget>),
    /// etcd on loopback.
    Etcd(EtcdServer),
    /// The claims gRPC service with empty handlers (`noop`), a child process.
    Noop(ServeChild),
}

impl System {
    pub fn label(&self) -> String {
        match self {
            Self::Service { label, .. } => label.clone(),
            Self::RawSql(target) => target.mode.label().to_owned(),
            Self::Etcd(_) => "etcd".to_owned(),
            Self::Noop(_) => "noop".to_owned(),
        }
    }

    pub fn is_baseline(&self) -> bool {
        !matches!(self, Self::Service { .. })
    }

    /// Whether the system stores its data in PostgreSQL (for the ratios that make sense).
    pub fn on_postgres(&self) -> bool {
        match self {
            Self::Service { postgres, .. } => postgres.is_some(),
            Self::RawSql(_) => true,
            Self::Etcd(_) | Self::Noop(_) => false,
        }
    }

    /// The pid of the process that serves requests, if the bench owns it.
    pub fn server_pid(&self) -> Option<u32> {
        match self {
            Self::Service { child, .. } => child.as_ref().map(|c| c.pid()),
            Self::RawSql(_) => None,
            Self::Etcd(server) => Some(server.pid()),
            Self::Noop(child) => Some(child.pid()),
        }
    }

    /// Where the server exports its metrics, when the bench started it with an endpoint.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        match self {
            Self::Service { metrics, .. } => *metrics,
            _ => None,
        }
    }

    /// Fails when a child the system depends on has died.
    pub fn check_alive(&mut self) -> Result<(), String> {
        match self {
            Self::Service {
                child: Some(child), ..
            } => child.check_alive(),
            Self::Etcd(server) => server.check_alive(),
            Self::Noop(child) => child.check_alive(),
            _ => Ok(()),
        }
    }

    /// The connection of benchmark client `client` (acting for [`client_cell`]`(client)`).
    pub async fn connect(&self, client: usize) -> Result<Conn, String> {
        Ok(match self {
            Self::Service { .. } => {
                Conn::Grpc(self.grpc_conn(&client_cell(client).to_string()).await?)
            }
            Self::RawSql(target) => Conn::Sql(Box::new(SqlConn::connect(target).await?)),
            Self::Etcd(server) => Conn::Etcd(EtcdConn::connect(&server.endpoint).await?),
            Self::Noop(child) => Conn::Grpc(GrpcConn::connect(&child.endpoint(), None).await?),
        })
    }

    /// A gRPC connection to the service acting for `cell` (its certificate under TLS).
    pub async fn grpc_conn(&self, cell: &str) -> Result<GrpcConn, String> {
        let Self::Service { endpoint, tls, .. } = self else {
            return Err(format!("{} is not the claims service", self.label()));
        };
        let tls = match tls {
            Some(tls) => Some(tls.for_cell(cell)?),
            None => None,
        };
        GrpcConn::connect(endpoint, tls.as_ref()).await
    }
}

/// The bench's mutual TLS: a development PKI in a temporary directory (removed on drop) and a
/// client certificate per cell id, issued the first time a connection acts for it.
pub struct BenchTls {
    pki: DevPki,
    certs: Mutex<HashMap<String, ClientTls>>,
}

impl BenchTls {
    pub fn create() -> Result<BenchTls, String> {
        let dir = std::env::temp_dir().join(format!(
            "topology-claims-bench-pki-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        Ok(BenchTls {
            pki: DevPki::create(&dir)?,
            certs: Mutex::new(HashMap::new()),
        })
    }

    /// `--tls-cert/--tls-key/--tls-client-ca` of a TLS `serve` child.
    pub fn serve_args(&self) -> Vec<String> {
        self.pki.serve_args()
    }

    fn for_cell(&self, cell: &str) -> Result<ClientTls, String> {
        let mut certs = self.certs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tls) = certs.get(cell) {
            return Ok(tls.clone());
        }
        let tls = tokio::task::block_in_place(|| self.pki.client_tls("cell", cell))?;
        certs.insert(cell.to_owned(), tls.clone());
        Ok(tls)
    }
}

impl Drop for BenchTls {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.pki.dir());
    }
}

/// What the load loops drive: BeginUpdate and CommitUpdate of a batch on one connection, one
/// pair at a time. [`Conn`] is every real system; the open loop's tests use a fake one.
pub trait PairConn: Send + 'static {
    /// BeginUpdate of `batch` under the client-chosen `lease`.
    fn begin(
        &mut self,
        batch: &Batch,
        lease: LeaseId,
    ) -> impl std::future::Future<Output = Result<(), Reason>> + Send;

    /// CommitUpdate of the lease the last successful `begin` took.
    fn commit(
        &mut self,
        batch: &Batch,
        lease: LeaseId,
    ) -> impl std::future::Future<Output = Result<(), Reason>> + Send;
}

impl PairConn for Conn {
    async fn begin(&mut self, batch: &Batch, lease: LeaseId) -> Result<(), Reason> {
        Conn::begin(self, batch, lease).await
    }

    async fn commit(&mut self, batch: &Batch, lease: LeaseId) -> Result<(), Reason> {
        Conn::commit(self, batch, lease).await
    }
}

/// One client's connection to a system.
pub enum Conn {
    Grpc(GrpcConn),
    Sql(Box<SqlConn>),
    Etcd(EtcdConn),
}

impl Conn {
    /// BeginUpdate of `batch` under the client-chosen `lease`.
    pub async fn begin(&mut self, batch: &Batch, lease: LeaseId) -> Result<(), Reason> {
        match self {
            Self::Grpc(conn) => conn.begin(batch, lease).await,
            Self::Sql(conn) => conn.begin(batch, lease).await,
            Self::Etcd(conn) => conn.begin(batch).await,
        }
    }

    /// CommitUpdate of the lease the last successful `begin` took.
    pub async fn commit(&mut self, batch: &Batch, lease: LeaseId) -> Result<(), Reason> {
        match self {
            Self::Grpc(conn) => conn.commit(batch, lease).await,
            Self::Sql(conn) => conn.commit(batch, lease).await,
            Self::Etcd(conn) => conn.commit(batch).await,
        }
    }
}

/// The generated gRPC client on its own HTTP/2 connection (one per benchmark client).
pub struct GrpcConn {
    client: ClaimsServiceClient<Channel>,
}

impl GrpcConn {
    /// `tls`: over https:// with that client configuration (the endpoint must say https://).
    pub async fn connect(endpoint: &str, tls: Option<&ClientTls>) -> Result<Self, String> {
        let channel = server_endpoint(endpoint, tls)
            .map_err(|e| e.to_string())?
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(|e| format!("cannot connect to {endpoint}: {e}"))?;
        Ok(Self {
            client: claims_client(channel),
        })
    }

    pub fn client(&self) -> ClaimsServiceClient<Channel> {
        self.client.clone()
    }

    async fn begin(&mut self, batch: &Batch, lease: LeaseId) -> Result<(), Reason> {
        let request = begin_update_to_pb(&batch.to_begin_update(lease));
        self.client
            .begin_update(request)
            .await
            .map(drop)
            .map_err(|status| from_status(&status).reason().to_owned())
    }

    async fn commit(&mut self, batch: &Batch, lease: LeaseId) -> Result<(), Reason> {
        let request = pb::CommitUpdateRequest {
            cell_id: batch.cell.to_string(),
            lease_id: lease.to_string(),
        };
        self.client
            .commit_update(request)
            .await
            .map(drop)
            .map_err(|status| from_status(&status).reason().to_owned())
    }
}

/// Which baselines to run (`--baselines`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Baseline {
    RawSql,
    RawSqlPipelined,
    Etcd,
    Noop,
}

impl std::str::FromStr for Baseline {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim() {
            "raw-sql" => Ok(Self::RawSql),
            "raw-sql-pipelined" => Ok(Self::RawSqlPipelined),
            "etcd" => Ok(Self::Etcd),
            "noop" => Ok(Self::Noop),
            other => Err(format!(
                "unknown baseline {other:?}; expected raw-sql, raw-sql-pipelined, etcd or noop"
            )),
        }
    }
}

impl Baseline {
    pub fn sql_mode(self) -> Option<SqlMode> {
        match self {
            Self::RawSql => Some(SqlMode::Naive),
            Self::RawSqlPipelined => Some(SqlMode::Pipelined),
            Self::Etcd | Self::Noop => None,
        }
    }
}

/// Sets the built-in namespaces of the (empty) store behind `endpoint` to `normalization`, for
/// `--variant-normalization`.
pub async fn set_builtins(endpoint: &str, normalization: &str) -> Result<(), String> {
    use topology_claims_proto::pb::admin::{
        admin_service_client::AdminServiceClient, Normalization, UpdateNamespaceRequest,
    };
    let to = match normalization {
        "exact" => Normalization::Exact,
        "ascii-case-insensitive" => Normalization::AsciiCaseInsensitive,
        "precis-username" => Normalization::PrecisUsername,
        other => {
            return Err(format!(
                "--variant-normalization: unknown normalization {other:?}; one of exact, \
                 ascii-case-insensitive, precis-username"
            ))
        }
    };
    let mut admin = AdminServiceClient::connect(endpoint.to_owned())
        .await
        .map_err(|e| format!("--variant-normalization: connecting to {endpoint}: {e}"))?;
    for id in ["routes", "usernames", "emails"] {
        admin
            .update_namespace(UpdateNamespaceRequest {
                id: id.to_owned(),
                normalization: to as i32,
                reason: "bench --variant-normalization".to_owned(),
                ..Default::default()
            })
            .await
            .map_err(|s| format!("--variant-normalization: {id}: {}", s.message()))?;
    }
    Ok(())
}

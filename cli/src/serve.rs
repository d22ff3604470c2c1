//! `topology-claims serve`: opens the store (applying or refusing pending migrations), binds the
//! listener, runs `topology_claims_server::grpc::server::serve` until SIGINT/SIGTERM, and exits 0 after
//! the drain.
//!
//! Owns process wiring only; the server itself is the core's.

use std::io::Write;
use std::num::NonZeroU32;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use std::path::PathBuf;
use std::sync::Arc;

use topology_claims::{ClaimStore, MigrationPolicy};
use topology_claims_server::auth::{IdentityFrom, DEFAULT_TRUST_DOMAIN};
use topology_claims_server::group::{GroupCommit, GroupConfig};
use topology_claims_server::grpc::audit::{AuditLog, ClaimValues};
use topology_claims_server::grpc::cell_limits::{CellLimits, CellRate};
use topology_claims_server::grpc::health::HealthConfig;
use topology_claims_server::grpc::limits::{ServerLimits, DEFAULT_ANONYMOUS_REQUEST_BYTES};
use topology_claims_server::grpc::server::{
    max_request_message_bytes, serve, HealthListener, ServerConfig,
};
use topology_claims_server::grpc::tls::{ServerTls, TlsFiles};
use topology_claims_server::metrics::{catch_up, ServerMetrics};

use crate::metrics_args::MetricsArgs;

use crate::store::{self, StoreOptions, StoreUrl};
use topology_claims::config::{parse_duration, parse_nonzero_duration};

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (HOST:PORT). Port 0 picks a free port; the line `listening on
    /// HOST:PORT` shows the real one.
    #[arg(
        long,
        env = "TOPOLOGY_CLAIMS_LISTEN",
        default_value = "127.0.0.1:50051",
        value_parser = crate::env::address
    )]
    listen: String,

    /// A second address (HOST:PORT) serving only the gRPC health service, in plaintext, with the
    /// same statuses as the main listener: for probes that cannot speak TLS, such as Kubernetes'
    /// built-in gRPC probes (docs/deployment.md). It serves nothing else, so it is allowed off
    /// loopback. Default: none (health on the main listener only). Prints `health on HOST:PORT`.
    #[arg(long, env = "TOPOLOGY_CLAIMS_HEALTH_LISTEN", value_parser = crate::env::address)]
    health_listen: Option<String>,

    /// Store URL: memory: (lost on exit), sqlite://PATH (sqlite:///abs/path for an absolute
    /// path) or postgres://USER@HOST:PORT/DB.
    #[arg(
        long,
        env = "TOPOLOGY_CLAIMS_STORE",
        default_value = "sqlite://topology-claims.db"
    )]
    store: String,

    #[command(flatten)]
    store_options: StoreOptions,

    /// Refuse to start (exit 1) when the store has pending schema migrations, instead of
    /// applying them; run `topology-claims migrate` first.
    #[arg(long, env = "TOPOLOGY_CLAIMS_NO_MIGRATE", value_parser = crate::env::switch)]
    no_migrate: bool,

    /// Most claims (creates + destroys + updates) one BeginUpdate may carry; larger batches are
    /// INVALID_ARGUMENT, refused before their claims are decoded. It also sets the largest
    /// request message the server reads: 64 KiB + 1 KiB per claim (1,088 KiB for 1000), at
    /// most 4 MiB whatever this says; a longer one is OUT_OF_RANGE before it is read.
    #[arg(long, env = "TOPOLOGY_CLAIMS_MAX_BATCH", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_batch: u32,

    /// Budget of one ListOutstandingLeases / ListClaims response in encoded bytes: a page stops
    /// before it (as well as at its limit) and its cursor continues where it stopped. At least
    /// 64 KiB; keep it well under the 4 MiB gRPC clients accept by default.
    #[arg(long, env = "TOPOLOGY_CLAIMS_MAX_RESPONSE_BYTES", default_value_t = 1024 * 1024,
          value_parser = clap::value_parser!(u32).range(65_536..=4_000_000))]
    max_response_bytes: u32,

    /// Most namespaces the store may hold (`admin namespaces create` beyond it is refused with
    /// TOO_MANY_NAMESPACES): each is read by the BeginUpdates that name it, and listed by the
    /// metrics.
    #[arg(long, env = "TOPOLOGY_CLAIMS_MAX_NAMESPACES", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(3..=10_000))]
    max_namespaces: u32,

    /// How long committed / rolled-back lease outcomes are remembered, so late retries get
    /// LEASE_COMMITTED / LEASE_ROLLED_BACK rather than LEASE_NOT_FOUND. Units: ms, s, m, h, d.
    #[arg(long, env = "TOPOLOGY_CLAIMS_OUTCOME_RETENTION", default_value = "24h",
          value_parser = parse_duration)]
    outcome_retention: Duration,

    /// How often outcomes past retention are collected. Units: ms, s, m, h, d; not zero.
    #[arg(long, env = "TOPOLOGY_CLAIMS_GC_INTERVAL", default_value = "5m",
          value_parser = parse_nonzero_duration)]
    gc_interval: Duration,

    /// Verifiers (`verify` sidecars) of all cells that may run at once, fleet-wide: each holds a
    /// verification slot kept in the store, so every server on the store shares the limit. The
    /// rest wait. 0: unlimited.
    #[arg(
        long,
        env = "TOPOLOGY_CLAIMS_MAX_CONCURRENT_VERIFICATIONS",
        default_value_t = 8
    )]
    max_concurrent_verifications: u32,

    /// Verification slots one cell may hold at once (its `verify` sidecars), so that one cell
    /// cannot take the fleet's slots: above it, that cell waits while other cells still take
    /// the free ones. 0: no cap beyond --max-concurrent-verifications.
    #[arg(
        long,
        env = "TOPOLOGY_CLAIMS_MAX_VERIFICATIONS_PER_CELL",
        default_value_t = 1
    )]
    max_verifications_per_cell: u32,

    /// How long a verification slot lasts unless its verifier renews it (every third of it):
    /// the slot of a verifier that died frees after this. Units: ms, s, m, h, d; not zero.
    #[arg(long, env = "TOPOLOGY_CLAIMS_VERIFICATION_SLOT_TTL", default_value = "60s",
          value_parser = parse_nonzero_duration)]
    verification_slot_ttl: Duration,

    /// After SIGINT/SIGTERM, how long in-flight requests may take to finish before the process
    /// exits anyway. Units: ms, s, m, h, d.
    #[arg(long, env = "TOPOLOGY_CLAIMS_DRAIN_TIMEOUT", default_value = "30s",
          value_parser = parse_duration)]
    drain_timeout: Duration,

    /// While the store's latest restore from a backup is quarantined (`admin mark-restored`,
    /// until every cell re-verifies or `admin lift-quarantine`), refuse creates of claims that do
    /// not exist with RESTORE_QUARANTINE, since such a name may be a claim the restore lost.
    /// off: serve them, accepting that a lost claim may go to a second cell (decision 100).
    /// on | off (or true/false, yes/no, 1/0).
    #[arg(long, env = "TOPOLOGY_CLAIMS_RESTORE_QUARANTINE", default_value = "on",
          action = clap::ArgAction::Set, value_parser = crate::env::switch)]
    restore_quarantine: bool,

    /// How often the restore epoch is read from the store again: how soon a mark or a lift made
    /// through another server applies on this one. Units: ms, s, m, h, d.
    #[arg(long, env = "TOPOLOGY_CLAIMS_RESTORE_REFRESH", default_value = "2s",
          value_parser = parse_duration)]
    restore_refresh: Duration,

    /// Group commit: BeginUpdate, CommitUpdate and RollbackUpdate calls that arrive while the
    /// store is busy share one store transaction, each still decided on its own
    /// (docs/architecture.md, "Group commit"). A lone call runs at once either way. The
    /// in-memory store has no transaction to share and always runs calls directly. on | off
    /// (or true/false, yes/no, 1/0).
    #[arg(long, env = "TOPOLOGY_CLAIMS_GROUP_COMMIT", default_value = "on",
          action = clap::ArgAction::Set, value_parser = crate::env::switch)]
    group_commit: bool,

    /// Most calls one group-commit store transaction carries. On PostgreSQL a transaction holds
    /// at most 308 locks whatever the group's size; a group of more than 64 lease ids (or 128
    /// claim keys) locks whole stripes and runs alone among operations on them
    /// (docs/backends/postgres.md, "Lock budget").
    #[arg(long, env = "TOPOLOGY_CLAIMS_GROUP_MAX", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    group_max: u32,

    /// Most claims one group-commit store transaction carries. A BeginUpdate with more runs in
    /// a store transaction of its own beside the groups (and so do the CommitUpdate and
    /// RollbackUpdate of its lease), so that a small call never waits behind another cell's
    /// large batches (decision 104).
    #[arg(long, env = "TOPOLOGY_CLAIMS_GROUP_MAX_CLAIMS", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    group_max_claims: u32,

    /// Large calls (BeginUpdates of more than --group-max-claims claims, and the ends of their
    /// leases) in store transactions at once; large begins take turns one at a time whatever
    /// it is. 1: a small call waits behind at most one large transaction. More gives a bulk load
    /// more throughput at the small calls' expense (docs/benchmarks.md, "Fairness").
    #[arg(long, env = "TOPOLOGY_CLAIMS_GROUP_LARGE_PARALLELISM", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    group_large_parallelism: u32,

    /// Group-commit store transactions in flight at once; more requests queue and share the
    /// next ones. Fewer means larger groups and less store CPU per call. 0: this machine's CPU
    /// count, at most what the store can run at once (PostgreSQL --pg-pool-size, the Spanner
    /// session pool; 1 for SQLite, memory and the Spanner emulator).
    #[arg(long, env = "TOPOLOGY_CLAIMS_GROUP_PARALLELISM", default_value_t = 0)]
    group_parallelism: u32,

    #[command(flatten)]
    limits: LimitArgs,

    #[command(flatten)]
    cell_limits: CellLimitArgs,

    #[command(flatten)]
    tls: TlsArgs,

    #[command(flatten)]
    metrics: MetricsArgs,

    #[command(flatten)]
    rest: crate::router_args::RestArgs,

    #[command(flatten)]
    watch: crate::router_args::WatchArgs,

    #[command(flatten)]
    waits: crate::wait_args::WaitArgs,

    /// How often the lease gauges (topology_claims_leases_outstanding, _oldest_lease_age_seconds)
    /// are refreshed with one store query, whatever the number of scrapes. Units: ms, s, m, h,
    /// d; not zero.
    #[arg(long, env = "TOPOLOGY_CLAIMS_METRICS_REFRESH_INTERVAL", default_value = "15s",
          value_parser = parse_nonzero_duration)]
    metrics_refresh_interval: Duration,

    /// How often the claims gauge (topology_claims_claims{namespace}) counts every claim by
    /// namespace: one read of every claim, so keep it rare on a large store. 0: never (the
    /// series stay absent). Units: ms, s, m, h, d.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CLAIMS_GAUGE_INTERVAL", default_value = "5m",
          value_parser = parse_duration)]
    claims_gauge_interval: Duration,
}

/// Mutual TLS and caller identity (docs/security.md).
#[derive(Args, Debug)]
struct TlsArgs {
    /// The server's certificate chain (PEM). With --tls-key, the server speaks TLS only.
    #[arg(long, env = "TOPOLOGY_CLAIMS_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,

    /// The server certificate's private key (PEM).
    #[arg(long, env = "TOPOLOGY_CLAIMS_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,

    /// CA bundle (PEM; several roots allowed, e.g. one per region, or old and new during a
    /// rotation) that client certificates are verified against. Callers are identified by
    /// their certificate and authorized by role; without a certificate only grpc.health.v1
    /// answers. SIGHUP re-reads the certificate, the key and this bundle.
    #[arg(long, env = "TOPOLOGY_CLAIMS_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,

    /// The SPIFFE trust domain of client identities: spiffe://TRUST_DOMAIN/ROLE/NAME.
    #[arg(long, env = "TOPOLOGY_CLAIMS_TRUST_DOMAIN", default_value = DEFAULT_TRUST_DOMAIN)]
    trust_domain: String,

    /// Where a client certificate's identity is read: uri-san (exactly one URI SAN
    /// spiffe://TRUST_DOMAIN/ROLE/NAME; roles cell, router, admin) or cn (the subject CN is a
    /// cell id, for a PKI that can only set the CN).
    #[arg(long, env = "TOPOLOGY_CLAIMS_IDENTITY_FROM", default_value = "uri-san",
          value_parser = ["uri-san", "cn"])]
    identity_from: String,

    /// Append one JSON line per mutating RPC and per authentication or authorization refusal
    /// to this file (docs/security.md, "Audit log"). SIGHUP reopens it (logrotate).
    #[arg(long, env = "TOPOLOGY_CLAIMS_AUDIT_LOG")]
    audit_log: Option<PathBuf>,

    /// How the audit log writes claim values, which can be personal data (emails): clear (as
    /// sent), hmac (HMAC-SHA256 under --audit-hash-key-file: a known value can be searched for,
    /// none read back) or omit. Default: hmac when --audit-hash-key-file is given, else clear
    /// (docs/security.md, "Audit log", says why).
    #[arg(long, env = "TOPOLOGY_CLAIMS_AUDIT_CLAIM_VALUES", value_parser = ["clear", "hmac", "omit"],
          requires = "audit_log")]
    audit_claim_values: Option<String>,

    /// The key (at least 16 bytes) of --audit-claim-values hmac.
    #[arg(
        long,
        env = "TOPOLOGY_CLAIMS_AUDIT_HASH_KEY_FILE",
        requires = "audit_log"
    )]
    audit_hash_key_file: Option<PathBuf>,

    /// Bytes of audit lines that may wait for the audit log's writer thread (at least 64 KiB).
    /// A request never waits for the disk: when the queue is full its line is dropped and
    /// counted (`topology_claims_audit_lines_dropped_total`); admin calls still wait for their
    /// synced intent line. Line sizes: docs/security.md, "Audit log".
    #[arg(long, env = "TOPOLOGY_CLAIMS_AUDIT_QUEUE_BYTES", default_value_t = 64 * 1024 * 1024,
          value_parser = clap::value_parser!(u32).range(65_536..))]
    audit_queue_bytes: u32,

    /// Serve plaintext (no identities: every caller trusted) on an address that is not
    /// loopback. Without it, such a --listen is refused; see docs/security.md.
    #[arg(long, env = "TOPOLOGY_CLAIMS_ALLOW_PLAINTEXT", value_parser = crate::env::switch)]
    allow_plaintext: bool,
}

impl TlsArgs {
    /// The audit log, if asked for.
    fn audit(&self) -> Result<Option<Arc<AuditLog>>, String> {
        let Some(path) = &self.audit_log else {
            return Ok(None);
        };
        let key =
            match &self.audit_hash_key_file {
                Some(file) => Some(std::fs::read(file).map_err(|e| {
                    format!("cannot read the audit hash key {}: {e}", file.display())
                })?),
                None => None,
            };
        let mode = self.audit_claim_values.as_deref().unwrap_or(match key {
            Some(_) => "hmac",
            None => "clear",
        });
        let values = match (mode, key.as_deref()) {
            ("hmac", Some(key)) => ClaimValues::Hmac(key),
            ("hmac", None) => {
                return Err("--audit-claim-values hmac needs its key: --audit-hash-key-file".into())
            }
            (mode, Some(_)) => {
                return Err(format!(
                    "--audit-hash-key-file is the key of --audit-claim-values hmac, not of {mode}"
                ))
            }
            ("omit", None) => ClaimValues::Omit,
            _ => ClaimValues::Clear,
        };
        AuditLog::open(path, values, self.audit_queue_bytes as usize)
            .map(|log| Some(Arc::new(log)))
            .map_err(|e| e.to_string())
    }

    /// The TLS configuration, or `None` for plaintext (refused off loopback unless allowed).
    fn server_tls(&self, listen: &str, http1: bool) -> Result<Option<Arc<ServerTls>>, String> {
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            let loopback = listen
                .parse::<std::net::SocketAddr>()
                .map(|addr| addr.ip().is_loopback())
                .unwrap_or_else(|_| listen.starts_with("localhost:"));
            if !loopback && !self.allow_plaintext {
                return Err(format!(
                    "refusing to serve plaintext on {listen}, which is not a loopback address: \
                     without TLS any client can act as any cell. Give --tls-cert, --tls-key and \
                     --tls-client-ca (docs/security.md), or --allow-plaintext behind a network \
                     you trust"
                ));
            }
            return Ok(None);
        };
        let identity_from = if self.identity_from == "cn" {
            IdentityFrom::CommonName
        } else {
            IdentityFrom::UriSan
        };
        let files = TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: self.tls_client_ca.clone(),
        };
        ServerTls::new(files, identity_from, self.trust_domain.clone())
            .map(|tls| Some(Arc::new(if http1 { tls.with_http1() } else { tls })))
            .map_err(|e| e.to_string())
    }
}

/// The transport's bounds (docs/reliability.md, "Limits": what a client sees at each one).
#[derive(Args, Debug)]
struct LimitArgs {
    /// Most open connections; one more is answered with an HTTP/2 GOAWAY and closed.
    #[arg(long, env = "TOPOLOGY_CLAIMS_MAX_CONNECTIONS", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_connections: u32,

    /// HTTP/2 MAX_CONCURRENT_STREAMS of every connection (requests in flight on one
    /// connection; clients queue the rest).
    #[arg(long, env = "TOPOLOGY_CLAIMS_MAX_STREAMS", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    max_streams: u32,

    /// Bytes of request bodies the whole server buffers for requests not yet complete; a
    /// request past it fails RESOURCE_EXHAUSTED.
    #[arg(long, env = "TOPOLOGY_CLAIMS_MAX_REQUEST_BYTES", default_value_t = 64 * 1024 * 1024,
          value_parser = clap::value_parser!(u32).range(65_536..))]
    max_request_bytes: u32,

    /// The same budget for one connection.
    #[arg(long, env = "TOPOLOGY_CLAIMS_MAX_REQUEST_BYTES_PER_CONNECTION",
          default_value_t = 8 * 1024 * 1024, value_parser = clap::value_parser!(u32).range(65_536..))]
    max_request_bytes_per_connection: u32,

    /// One verified caller's (a cell's) share of --max-request-bytes, charged as its frames
    /// arrive. Default: a quarter of --max-request-bytes, and at least one largest message.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CELL_MAX_REQUEST_BYTES",
          value_parser = clap::value_parser!(u32).range(65_536..))]
    cell_max_request_bytes: Option<u32>,

    /// Bytes in flight of every caller without a verified identity (no client certificate on
    /// a TLS listener; anyone on --health-listen): a budget of their own, never the cells'.
    #[arg(long, env = "TOPOLOGY_CLAIMS_MAX_ANONYMOUS_REQUEST_BYTES",
          default_value_t = DEFAULT_ANONYMOUS_REQUEST_BYTES as u32,
          value_parser = clap::value_parser!(u32).range(4_096..))]
    max_anonymous_request_bytes: u32,

    /// Most TLS connections without a verified identity (health probes without a client
    /// certificate); one more is told GOAWAY naming this flag. Default: 1/8 of
    /// --max-connections.
    #[arg(long, env = "TOPOLOGY_CLAIMS_MAX_ANONYMOUS_CONNECTIONS",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_anonymous_connections: Option<u32>,

    /// Most TLS handshakes in flight from one peer address (IPv6: from one /64); one more
    /// connection from it is closed at once. Default: 1/8 of --max-connections.
    #[arg(long, env = "TOPOLOGY_CLAIMS_MAX_HANDSHAKES_PER_ADDRESS",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_handshakes_per_address: Option<u32>,

    /// A new connection must finish its TLS handshake and send the HTTP/2 client preface within
    /// this of its accept (a total deadline). Units: ms, s, m.
    #[arg(long, env = "TOPOLOGY_CLAIMS_HANDSHAKE_TIMEOUT", default_value = "10s",
          value_parser = parse_nonzero_duration)]
    handshake_timeout: Duration,

    /// A connection whose peer sends nothing at all for this long is closed. Must exceed
    /// --keepalive-interval + --keepalive-timeout. Units: ms, s, m.
    #[arg(long, env = "TOPOLOGY_CLAIMS_IDLE_TIMEOUT", default_value = "2m",
          value_parser = parse_nonzero_duration)]
    idle_timeout: Duration,

    /// How often the server sends an HTTP/2 PING on every connection. Units: ms, s, m.
    #[arg(long, env = "TOPOLOGY_CLAIMS_KEEPALIVE_INTERVAL", default_value = "30s",
          value_parser = parse_nonzero_duration)]
    keepalive_interval: Duration,

    /// A connection whose PING is not answered within this is closed. Units: ms, s, m.
    #[arg(long, env = "TOPOLOGY_CLAIMS_KEEPALIVE_TIMEOUT", default_value = "20s",
          value_parser = parse_nonzero_duration)]
    keepalive_timeout: Duration,

    /// Longest time one request may take (reading its body included); DEADLINE_EXCEEDED
    /// after it. A client's shorter deadline wins. Units: ms, s, m.
    #[arg(long, env = "TOPOLOGY_CLAIMS_REQUEST_TIMEOUT", default_value = "30s",
          value_parser = parse_nonzero_duration)]
    request_timeout: Duration,

    /// List and stream calls (ListClaims, StreamClaims, ListOutstandingLeases) one cell may have
    /// open at once, until their responses are read; one more is refused RESOURCE_EXHAUSTED
    /// (RATE_LIMITED, limit=cell-max-streams).
    #[arg(long, env = "TOPOLOGY_CLAIMS_CELL_MAX_STREAMS", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    cell_max_streams: u32,

    /// A list or stream response whose reader takes nothing for this long is dropped (its page
    /// freed, the stream ended CANCELLED). Units: ms, s, m.
    #[arg(long, env = "TOPOLOGY_CLAIMS_STALL_TIMEOUT", default_value = "30s",
          value_parser = parse_nonzero_duration)]
    stall_timeout: Duration,

    /// How often the store is probed for the ClaimsService health status. Units: ms, s, m.
    #[arg(long, env = "TOPOLOGY_CLAIMS_HEALTH_INTERVAL", default_value = "5s",
          value_parser = parse_nonzero_duration)]
    health_interval: Duration,

    /// A probe not answered within this counts as the store being down. Units: ms, s, m.
    #[arg(long, env = "TOPOLOGY_CLAIMS_HEALTH_TIMEOUT", default_value = "2s",
          value_parser = parse_nonzero_duration)]
    health_timeout: Duration,
}

impl LimitArgs {
    fn limits(&self, max_batch: usize) -> ServerLimits {
        ServerLimits {
            max_connections: self.max_connections as usize,
            max_concurrent_streams: self.max_streams,
            request_bytes_per_connection: self.max_request_bytes_per_connection as usize,
            request_bytes_total: self.max_request_bytes as usize,
            request_bytes_per_cell: self.cell_max_request_bytes.map_or_else(
                || {
                    ServerLimits::default_per_cell(
                        self.max_request_bytes as usize,
                        max_request_message_bytes(max_batch),
                    )
                },
                |bytes| bytes as usize,
            ),
            request_bytes_anonymous: self.max_anonymous_request_bytes as usize,
            max_anonymous_connections: self.max_anonymous_connections.map_or_else(
                || ServerLimits::default_anonymous_connections(self.max_connections as usize),
                |n| n as usize,
            ),
            max_handshakes_per_address: self.max_handshakes_per_address.map_or_else(
                || ServerLimits::default_anonymous_connections(self.max_connections as usize),
                |n| n as usize,
            ),
            handshake_timeout: self.handshake_timeout,
            idle_timeout: self.idle_timeout,
            keepalive_interval: self.keepalive_interval,
            keepalive_timeout: self.keepalive_timeout,
            request_timeout: self.request_timeout,
            cell_max_streams: self.cell_max_streams as usize,
            stall_timeout: self.stall_timeout,
            ..ServerLimits::default()
        }
    }
}

/// Per-cell limits (docs/reliability.md, "Per-cell limits"). A cell over one gets
/// RESOURCE_EXHAUSTED with ErrorInfo RATE_LIMITED and a RetryInfo delay. Never applied to
/// health checks, the AdminService or the admin role.
#[derive(Args, Debug)]
struct CellLimitArgs {
    /// Most mutating RPCs (BeginUpdate, CommitUpdate, RollbackUpdate, RenewLease) of one cell in
    /// flight at once. 0: no limit.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CELL_MAX_IN_FLIGHT", default_value_t = 0)]
    cell_max_in_flight: u32,

    /// Requests per second of one cell, on average: `100` or `100/s` (fractions allowed:
    /// `0.5/s`). Default: no limit.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CELL_RATE", value_parser = parse_rate)]
    cell_rate: Option<f64>,

    /// The size of each cell's token bucket: how many requests a cell that was quiet may send
    /// at once before it is held to --cell-rate. Default: the rate rounded up, at least 1.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CELL_BURST", requires = "cell_rate",
          value_parser = clap::value_parser!(u32).range(1..))]
    cell_burst: Option<u32>,
}

impl CellLimitArgs {
    fn cell_limits(&self) -> CellLimits {
        CellLimits {
            max_in_flight: (self.cell_max_in_flight > 0)
                .then_some(self.cell_max_in_flight as usize),
            rate: self.cell_rate.map(|per_second| CellRate {
                per_second,
                burst: NonZeroU32::new(
                    self.cell_burst.unwrap_or_else(|| default_burst(per_second)),
                )
                .unwrap_or(NonZeroU32::MIN),
            }),
        }
    }
}

/// The burst when none is given: one second's worth of requests, at least one.
fn default_burst(per_second: f64) -> u32 {
    per_second.ceil().clamp(1.0, f64::from(u32::MAX)) as u32
}

/// `--cell-rate`: `R` or `R/s`, a positive number of requests per second.
fn parse_rate(text: &str) -> Result<f64, String> {
    let number = text.trim().strip_suffix("/s").unwrap_or(text.trim());
    match number.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate >= 1e-6 => Ok(rate),
        _ => Err(format!(
            "{text:?} is not a rate: give requests per second as a positive number, `100` or `100/s`"
        )),
    }
}

pub async fn run(args: ServeArgs) -> ExitCode {
    match run_inner(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn run_inner(args: ServeArgs) -> Result<(), String> {
    // Installed before the server announces itself, so a signal sent right after the
    // `listening on` line drains instead of killing the process.
    let shutdown = shutdown_signal()?;
    let store_url: StoreUrl = args.store.parse()?;
    let limits = args.limits.limits(args.max_batch as usize);
    limits.validate().map_err(|e| e.to_string())?;
    let cell_limits = args.cell_limits.cell_limits();
    cell_limits.validate().map_err(|e| e.to_string())?;
    let tls = args.tls.server_tls(&args.listen, args.rest.rest)?;
    let audit = args.tls.audit()?;
    raise_open_file_limit(limits.max_connections);
    // Every listener is bound before the store opens: a taken or malformed address fails before
    // any migration. Connections queue until the server accepts them, once the store is open.
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot read the bound address: {e}"))?;
    let health_listener = match &args.health_listen {
        Some(health) => {
            let bound = tokio::net::TcpListener::bind(health)
                .await
                .map_err(|e| format!("--health-listen {health}: cannot listen: {e}"))?;
            let addr = bound.local_addr().map_err(|e| {
                format!("--health-listen {health}: cannot read the bound address: {e}")
            })?;
            Some((HealthListener::new(bound), addr))
        }
        None => None,
    };
    let metrics_listener = args.metrics.listen().await?;

    // Applying at open (rather than a separate `migrate` first) keeps it one step for the
    // adapter, which logs each migration it applies.
    let policy = if args.no_migrate {
        MigrationPolicy::Refuse
    } else {
        MigrationPolicy::Apply
    };
    let store = store::open(&store_url, policy, &args.store_options)
        .await
        .map_err(|e| format!("opening {store_url}: {e}"))?;
    let metrics = args.metrics.metrics_listen.as_ref().map(|_| {
        let rpcs = topology_claims_server::auth::Method::RPCS.map(|m| m.name());
        Arc::new(ServerMetrics::new().with_methods(&rpcs))
    });
    if args.group_commit && !store.group_commit_saves() {
        tracing::info!("group commit skipped: this store has no transaction for calls to share");
    }
    let store: Arc<dyn ClaimStore> = if args.group_commit && store.group_commit_saves() {
        let config = GroupConfig {
            max: args.group_max as usize,
            max_claims: args.group_max_claims as usize,
            large_parallelism: args.group_large_parallelism as usize,
            parallelism: Some(if args.group_parallelism > 0 {
                args.group_parallelism as usize
            } else {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                cores.min(store.group_parallelism())
            }),
            lone_direct: true,
        };
        let mut group = GroupCommit::new(store, config);
        if let Some(metrics) = &metrics {
            let sizes = metrics.group_batch_size.clone();
            group = group.with_observer(Arc::new(move |n| sizes.observe(n as f64)));
        }
        tracing::info!(
            group_max = config.max,
            group_max_claims = config.max_claims,
            group_large_parallelism = config.large_parallelism,
            parallelism = group.parallelism(),
            "group commit on"
        );
        Arc::new(group)
    } else {
        store
    };

    let mut metrics_addr = None;
    let metrics = match metrics {
        Some(metrics) => {
            let render = {
                let (metrics, store, audit, tls) = (
                    Arc::clone(&metrics),
                    Arc::clone(&store),
                    audit.clone(),
                    tls.clone(),
                );
                Arc::new(move || {
                    if let Some(tls) = &tls {
                        let expiries = tls.expiries();
                        for (name, at) in [
                            ("server", expiries.server),
                            ("client_ca", expiries.client_ca),
                        ] {
                            if let Some(at) = at {
                                metrics
                                    .tls_certificate_expiry
                                    .with_label_values(&[name])
                                    .set(at as f64);
                            }
                        }
                    }
                    // Counters kept elsewhere, read (never queried) at scrape time.
                    catch_up(&metrics.store_retries, store.retries());
                    if let Some(pool) = store.pool_status() {
                        let as_gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
                        let by_state = &metrics.store_pool_connections;
                        by_state
                            .with_label_values(&["in_use"])
                            .set(as_gauge(pool.in_use));
                        by_state
                            .with_label_values(&["idle"])
                            .set(as_gauge(pool.idle));
                        metrics.store_pool_max.set(as_gauge(pool.max));
                        metrics.store_pool_waiting.set(as_gauge(pool.waiting));
                    }
                    if let Some(audit) = &audit {
                        catch_up(
                            &metrics.audit_write_failures,
                            audit.failures.load(std::sync::atomic::Ordering::Relaxed),
                        );
                        catch_up(
                            &metrics.audit_lines_dropped,
                            audit.dropped.load(std::sync::atomic::Ordering::Relaxed),
                        );
                    }
                    metrics.render()
                })
            };
            if let Some(listener) = metrics_listener {
                metrics_addr = Some(crate::metrics_args::serve(listener, render)?);
            }
            Some(metrics)
        }
        None => None,
    };
    let config = ServerConfig {
        max_batch: args.max_batch as usize,
        max_response_bytes: args.max_response_bytes as usize,
        outcome_retention: args.outcome_retention,
        gc_interval: args.gc_interval,
        drain_timeout: args.drain_timeout,
        limits,
        health: HealthConfig {
            interval: args.limits.health_interval,
            timeout: args.limits.health_timeout,
        },
        tls: tls.clone(),
        audit: audit.clone(),
        metrics: metrics.clone(),
        metrics_refresh: args.metrics_refresh_interval,
        claims_gauge_interval: args.claims_gauge_interval,
        cell_limits,
        max_concurrent_verifications: args.max_concurrent_verifications,
        max_verifications_per_cell: args.max_verifications_per_cell,
        verification_slot_ttl: args.verification_slot_ttl,
        health_listener: health_listener
            .as_ref()
            .map(|(listener, _)| listener.clone()),
        restore_quarantine: args.restore_quarantine,
        restore_refresh: args.restore_refresh,
        max_namespaces: args.max_namespaces as usize,
        rest: args.rest.config(),
        watch: args.watch.config(),
        waits: args.waits.config(),
    };
    reload_on_sighup(tls, audit.clone())?;
    tracing::info!(%addr, store = %store_url, max_batch = config.max_batch,
        outcome_retention = ?config.outcome_retention, "serving");
    let server = tokio::spawn(serve(listener, store, config, shutdown));

    // The listener is bound, so connections queue from here on and the server task accepts them.
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on {addr}")
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("cannot write to stdout: {e}"))?;
    if let Some((_, bound)) = &health_listener {
        writeln!(stdout, "health on {bound}")
            .and_then(|()| stdout.flush())
            .map_err(|e| format!("cannot write to stdout: {e}"))?;
    }
    drop(stdout);
    if let Some(bound) = metrics_addr {
        crate::metrics_args::announce(bound)?;
    }

    let served = server.await;
    // Every request answered before the drain ended has queued its line: write them all.
    if let Some(audit) = audit {
        let _ = tokio::task::spawn_blocking(move || audit.close_blocking()).await;
    }
    match served {
        Ok(Ok(())) => {
            tracing::info!("drained; exiting");
            Ok(())
        }
        Ok(Err(e)) => Err(format!("server failed: {e}")),
        Err(e) => Err(format!("server task failed: {e}")),
    }
}

/// Raises the soft limit of open files to the hard limit: every connection is a descriptor, and
/// the default soft limit (often 1024) is below what `--max-connections` may need. Says so
/// when even the hard limit is too low for `max_connections` plus the store's own descriptors.
#[cfg(unix)]
#[allow(clippy::unnecessary_cast)] // rlim_t is u64 on Linux, not on every unix
fn raise_open_file_limit(max_connections: usize) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed by pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    // Headroom for the store's connections, log files and the listener.
    let needed = max_connections as u64 + 64;
    if (limit.rlim_cur as u64) < needed {
        tracing::warn!(
            open_files = limit.rlim_cur as u64,
            max_connections,
            "the open-file limit is below --max-connections + 64; connections past it wait for \
             descriptors (raise `ulimit -n` or LimitNOFILE=)"
        );
    }
}

#[cfg(not(unix))]
fn raise_open_file_limit(_: usize) {}

/// On every SIGHUP: re-reads the TLS files (a failed reload keeps the old configuration) and
/// reopens the audit log (logrotate). Without either, SIGHUP is left to its default.
#[cfg(unix)]
fn reload_on_sighup(
    tls: Option<Arc<ServerTls>>,
    audit: Option<Arc<AuditLog>>,
) -> Result<(), String> {
    use tokio::signal::unix::{signal, SignalKind};
    if tls.is_none() && audit.is_none() {
        return Ok(());
    }
    let mut hangup =
        signal(SignalKind::hangup()).map_err(|e| format!("cannot handle SIGHUP: {e}"))?;
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            if let Some(tls) = &tls {
                match tls.reload() {
                    Ok(()) => tracing::info!("SIGHUP: TLS certificate, key and client CA re-read"),
                    Err(error) => tracing::error!(
                        %error,
                        "SIGHUP: TLS files not reloaded; still serving with the previous ones"
                    ),
                }
            }
            if let Some(audit) = &audit {
                match audit.reopen() {
                    Ok(()) => tracing::info!("SIGHUP: audit log reopened"),
                    Err(error) => tracing::error!(%error, "SIGHUP: audit log not reopened"),
                }
            }
        }
    });
    Ok(())
}

#[cfg(not(unix))]
fn reload_on_sighup(_: Option<Arc<ServerTls>>, _: Option<Arc<AuditLog>>) -> Result<(), String> {
    Ok(())
}

/// Completes on SIGINT or SIGTERM (on Ctrl-C elsewhere).
#[cfg(unix)]
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()> + Send + 'static, String> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt =
        signal(SignalKind::interrupt()).map_err(|e| format!("cannot handle SIGINT: {e}"))?;
    let mut terminate =
        signal(SignalKind::terminate()).map_err(|e| format!("cannot handle SIGTERM: {e}"))?;
    Ok(async move {
        let name = tokio::select! {
            _ = interrupt.recv() => "SIGINT",
            _ = terminate.recv() => "SIGTERM",
        };
        tracing::info!(signal = name, "shutdown requested");
    })
}

#[cfg(not(unix))]
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()> + Send + 'static, String> {
    Ok(async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!("cannot wait for Ctrl-C: {e}; stopping");
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_is_a_number_with_or_without_per_second() {
        assert_eq!(parse_rate("100"), Ok(100.0));
        assert_eq!(parse_rate("100/s"), Ok(100.0));
        assert_eq!(parse_rate("0.5/s"), Ok(0.5));
        for bad in ["", "/s", "0", "-1", "fast", "100/m", "inf", "NaN"] {
            assert!(parse_rate(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_default_burst_is_a_second_of_the_rate_and_at_least_one() {
        assert_eq!(default_burst(100.0), 100);
        assert_eq!(default_burst(2.5), 3);
        assert_eq!(default_burst(0.1), 1);
    }
}

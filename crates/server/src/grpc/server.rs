//! Runs the gRPC server on a bound listener: the `ClaimsService`, the `AdminService`, `grpc.health.v1` (the service's
//! status following the store, `health`) and server reflection (v1), under the transport bounds
//! of `limits` (`listener` for connections, `guard` for requests) and the per-cell limits of
//! `cell_limits` (applied by `authz`), a graceful drain on shutdown,
//! and the background collection of old lease outcomes.
//!
//! Owns process-level wiring only. Must not decide protocol questions or pick status codes;
//! choosing and opening the store is the caller's (the CLI parses store URLs).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::service::Routes;
use tonic::transport::Server;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::ServingStatus;

use crate::grpc::admin::AdminServiceImpl;
use crate::grpc::audit::AuditLog;
use crate::grpc::authz::AuthorizeLayer;
use crate::grpc::cell_limits::{CellLimiter, CellLimits};
use crate::grpc::guard::RequestGuardLayer;
use crate::grpc::health::{watch_store, HealthConfig};
use crate::grpc::lease_wait::{WaitConfig, WaitMetrics, WaitingRoom};
use crate::grpc::limits::{ServerLimits, MAX_HEALTH_REQUEST_BYTES};
use crate::grpc::listener::{self, ServerStats};
use crate::grpc::metrics::MetricsLayer;
use crate::grpc::pb;
use crate::grpc::pb::admin::admin_service_server::AdminServiceServer;
use crate::grpc::pb::claims_service_server::ClaimsServiceServer;
use crate::grpc::responses::ResponseLimits;
use crate::grpc::service::{ClaimsServiceImpl, ServiceConfig};
use crate::grpc::tls::ServerTls;
use crate::grpc::watch::{WatchConfig, WatchHub};
use crate::metrics::ServerMetrics;
use crate::rest::{RestAnswersLayer, RestConfig};
use crate::restore::RestoreGate;
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;

/// Encoded bytes one claim of a valid BeginUpdate can take, with room to spare: a ClaimRecord
/// with two maximal 255-byte strings, its enums and record id is about 535 bytes.
pub const MAX_CLAIM_RECORD_BYTES: usize = 1024;

/// What a request needs besides its claims (cell id, lease id, any other request's fields).
pub const REQUEST_BASE_BYTES: usize = 64 * 1024;

/// The ceiling of [`max_request_message_bytes`] (tonic's default), whatever `--max-batch` says.
pub const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// The largest request message the server reads or decodes: what a valid batch of `max_batch`
/// claims can need ([`REQUEST_BASE_BYTES`] + `max_batch` × [`MAX_CLAIM_RECORD_BYTES`]; 1,088 KiB
/// for the default 1000), never more than [`MAX_REQUEST_BYTES`]. A message declaring more is
/// refused with OUT_OF_RANGE as soon as its 5-byte prefix arrives, before its bytes are read.
pub fn max_request_message_bytes(max_batch: usize) -> usize {
    max_batch
        .saturating_mul(MAX_CLAIM_RECORD_BYTES)
        .saturating_add(REQUEST_BASE_BYTES)
        .min(MAX_REQUEST_BYTES)
}

/// The server's knobs.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Most claims one BeginUpdate may carry (`--max-batch`).
    pub max_batch: usize,
    /// Budget of one list response in encoded bytes (`--max-response-bytes`).
    pub max_response_bytes: usize,
    /// How long committed / rolled-back outcomes are remembered (`--outcome-retention`), so
    /// late retries get LEASE_COMMITTED / LEASE_ROLLED_BACK instead of LEASE_NOT_FOUND.
    pub outcome_retention: Duration,
    /// How often outcomes past retention are collected. Must not be zero.
    pub gc_interval: Duration,
    /// How long the drain after the shutdown signal may take before the server returns anyway,
    /// leaving connections that did not finish (a hung request, a client that never answers
    /// the HTTP/2 GOAWAY handshake) to be closed by the process exit.
    pub drain_timeout: Duration,
    /// Connections, streams, bytes in flight and timeouts.
    pub limits: ServerLimits,
    /// How the store is probed for the health status.
    pub health: HealthConfig,
    /// TLS (and with a client CA, client certificates and authorization); `None`: plaintext,
    /// every caller trusted.
    pub tls: Option<Arc<ServerTls>>,
    /// The audit log (`--audit-log`).
    pub audit: Option<Arc<AuditLog>>,
    /// Where requests are counted and the lease gauges kept (`--metrics-listen`); `None`: no
    /// metrics.
    pub metrics: Option<Arc<ServerMetrics>>,
    /// How often the lease gauges are refreshed from the store (`--metrics-refresh-interval`).
    pub metrics_refresh: Duration,
    /// How often the claims gauge counts every claim (`--claims-gauge-interval`); zero: never.
    pub claims_gauge_interval: Duration,
    /// Per-cell rate and concurrency limits (`--cell-rate`, `--cell-max-in-flight`); off by
    /// default.
    pub cell_limits: CellLimits,
    /// Verification slots of the fleet (`--max-concurrent-verifications`, 0: unlimited).
    pub max_concurrent_verifications: u32,
    /// Slots one cell may hold at once (`--max-verifications-per-cell`, 0: no cap beyond the
    /// fleet's).
    pub max_verifications_per_cell: u32,
    /// Their time-to-live (`--verification-slot-ttl`); a request may only shorten it.
    pub verification_slot_ttl: Duration,
    /// A second listener serving only `grpc.health.v1`, in plaintext, with the same statuses
    /// (`--health-listen`): for probes that cannot speak TLS, such as Kubernetes' built-in gRPC
    /// probes. `None`: health is served on the main listener only.
    pub health_listener: Option<HealthListener>,
    /// Refuse creates of absent claims while the store's latest restore is quarantined
    /// (`--restore-quarantine on|off`, on by default; decision 100).
    pub restore_quarantine: bool,
    /// How often the restore epoch is read again (`--restore-refresh`): how soon a mark or a lift
    /// made through another server applies here.
    pub restore_refresh: Duration,
    /// Most namespaces the store may hold (`serve --max-namespaces`).
    pub max_namespaces: usize,
    /// REST lookups on the same port (`--rest on`, the default; `crate::rest`); `None`: gRPC
    /// only, and connections must open with the HTTP/2 preface.
    pub rest: Option<RestConfig>,
    /// The change feed (WatchClaims): watchers, polling, retention.
    pub watch: WatchConfig,
    /// BeginUpdates waiting for a leased claim (`--max-lease-wait`, `--max-lease-waiters`).
    pub waits: WaitConfig,
}

/// The bound `--health-listen` listener, carried in a [`ServerConfig`] (clones share it; the
/// server takes it once).
#[derive(Clone, Debug)]
pub struct HealthListener(Arc<std::sync::Mutex<Option<TcpListener>>>);

impl HealthListener {
    pub fn new(listener: TcpListener) -> Self {
        Self(Arc::new(std::sync::Mutex::new(Some(listener))))
    }

    fn take(&self) -> Option<TcpListener> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            max_batch: topology_claims::domain::DEFAULT_MAX_BATCH,
            max_response_bytes: crate::grpc::service::DEFAULT_MAX_RESPONSE_BYTES,
            outcome_retention: Duration::from_secs(24 * 60 * 60),
            gc_interval: Duration::from_secs(5 * 60),
            drain_timeout: Duration::from_secs(30),
            limits: ServerLimits::default(),
            health: HealthConfig::default(),
            tls: None,
            audit: None,
            metrics: None,
            metrics_refresh: crate::metrics::DEFAULT_REFRESH_INTERVAL,
            claims_gauge_interval: crate::metrics::DEFAULT_CLAIMS_GAUGE_INTERVAL,
            cell_limits: CellLimits::default(),
            max_concurrent_verifications:
                topology_claims::domain::DEFAULT_MAX_CONCURRENT_VERIFICATIONS,
            max_verifications_per_cell: topology_claims::domain::DEFAULT_MAX_VERIFICATIONS_PER_CELL,
            verification_slot_ttl: topology_claims::domain::DEFAULT_VERIFICATION_SLOT_TTL,
            health_listener: None,
            restore_quarantine: true,
            restore_refresh: crate::restore::DEFAULT_RESTORE_REFRESH,
            max_namespaces: topology_claims::domain::DEFAULT_MAX_NAMESPACES,
            rest: Some(RestConfig::default()),
            watch: WatchConfig::default(),
            waits: WaitConfig::default(),
        }
    }
}

/// The service name the health service reports SERVING for.
pub const SERVICE_NAME: &str = pb::claims_service_server::SERVICE_NAME;

/// Serves until `shutdown` completes, then stops accepting, lets in-flight requests finish (for
/// at most `drain_timeout`) and returns. Health turns NOT_SERVING as soon as the drain starts.
pub async fn serve(
    listener: TcpListener,
    store: Arc<dyn ClaimStore>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ClaimsError> {
    if config.gc_interval.is_zero() {
        return Err(ClaimsError::Configuration {
            message: "the outcome collection interval must not be zero".to_owned(),
        });
    }
    config.limits.validate()?;
    if config.metrics.is_some() && config.metrics_refresh.is_zero() {
        return Err(ClaimsError::Configuration {
            message: "--metrics-refresh-interval must not be zero".to_owned(),
        });
    }
    let limiter = CellLimiter::new(
        &config.cell_limits,
        config.metrics.as_ref().map(|m| m.rate_limited.clone()),
    )?;
    if config.health.interval.is_zero() || config.health.timeout.is_zero() {
        return Err(ClaimsError::Configuration {
            message: "--health-interval and --health-timeout must not be zero".to_owned(),
        });
    }
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status(SERVICE_NAME, ServingStatus::Serving)
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(pb::admin::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        // google.rpc.ErrorInfo / BadRequest, so reflection clients (grpcurl) can print details.
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| ClaimsError::internal(format!("server reflection: {e}")))?;
    if config.restore_refresh.is_zero() {
        return Err(ClaimsError::Configuration {
            message: "--restore-refresh must not be zero".to_owned(),
        });
    }
    // Read before the first request: a restored store quarantines from the first BeginUpdate.
    let restore = Arc::new(
        RestoreGate::new(Arc::clone(&store), config.restore_quarantine)
            .with_metrics(config.metrics.clone()),
    );
    restore.load().await.map_err(|error| match error {
        ClaimsError::Unavailable { message } => ClaimsError::Unavailable {
            message: format!("reading the restore epoch at start: {message}"),
        },
        other => other,
    })?;
    if let Some(state) = restore.current() {
        tracing::info!(
            epoch = state.epoch,
            quarantined = state.quarantined(),
            enforced = restore.quarantine_enforced(),
            pending_cells = state.pending_cells().count(),
            "the store was restored from a backup"
        );
    }
    let max_message_bytes = max_request_message_bytes(config.max_batch);
    let rest_store = Arc::clone(&store);
    let watch_hub = WatchHub::with_metrics(
        Arc::clone(&store),
        WatchConfig {
            max_response_bytes: config.max_response_bytes,
            ..config.watch
        },
        config.metrics.as_deref(),
    );
    let room = WaitingRoom::new(
        config.waits,
        config.metrics.as_deref().map(|m| WaitMetrics {
            waiters: m.lease_waiters.clone(),
            wait_seconds: m.lease_wait_seconds.clone(),
            outcomes: m.lease_wait_outcomes.clone(),
        }),
    );
    let claims = ClaimsServiceServer::new(
        ClaimsServiceImpl::new(
            Arc::clone(&store),
            ServiceConfig {
                max_batch: config.max_batch,
                max_response_bytes: config.max_response_bytes,
                max_concurrent_verifications: config.max_concurrent_verifications,
                max_verifications_per_cell: config.max_verifications_per_cell,
                verification_slot_ttl: config.verification_slot_ttl,
            },
        )
        .with_restore(Arc::clone(&restore))
        .with_watch(Arc::clone(&watch_hub))
        .with_waits(Arc::clone(&room)),
    )
    .max_decoding_message_size(max_message_bytes);
    let admin = AdminServiceServer::new(
        AdminServiceImpl::new(Arc::clone(&store), config.max_response_bytes)
            .with_restore(Arc::clone(&restore))
            .with_max_namespaces(config.max_namespaces),
    )
    .max_decoding_message_size(max_message_bytes);

    let (stop_tx, stop_rx) = watch::channel(());
    let (draining_tx, mut draining_rx) = watch::channel(false);
    let health_draining = draining_rx.clone();
    let waiting = tokio::spawn(room.follow(Arc::clone(&store), watch_hub.head(), stop_rx.clone()));
    let follower = tokio::spawn(watch_hub.run(stop_rx.clone()));
    let gc = tokio::spawn(collect_outcomes_periodically(
        Arc::clone(&store),
        config.outcome_retention,
        config.gc_interval,
        stop_rx.clone(),
    ));
    let refresher = config.metrics.clone().map(|metrics| {
        tokio::spawn(refresh_lease_gauges(
            Arc::clone(&store),
            metrics,
            config.metrics_refresh,
            stop_rx.clone(),
        ))
    });
    let claims_refresher = config
        .metrics
        .clone()
        .filter(|_| !config.claims_gauge_interval.is_zero())
        .map(|metrics| {
            tokio::spawn(refresh_claims_gauge(
                Arc::clone(&store),
                metrics,
                config.claims_gauge_interval,
                stop_rx.clone(),
            ))
        });
    let restore_refresher = tokio::spawn(
        Arc::clone(&restore).refresh_periodically(config.restore_refresh, stop_rx.clone()),
    );
    let watcher = tokio::spawn(watch_store(
        store,
        health.clone(),
        SERVICE_NAME,
        config.health,
        stop_rx,
    ));
    let signal = async move {
        shutdown.await;
        tracing::info!("shutting down: draining in-flight requests");
        health
            .set_service_status(SERVICE_NAME, ServingStatus::NotServing)
            .await;
        health
            .set_service_status("", ServingStatus::NotServing)
            .await;
        drop(stop_tx);
        let _ = draining_tx.send(true);
    };
    let drain_deadline = async move {
        if draining_rx.wait_for(|draining| *draining).await.is_ok() {
            tokio::time::sleep(config.drain_timeout).await;
        } else {
            // The server returned without a shutdown signal: only its own result matters.
            std::future::pending::<()>().await;
        }
    };
    let mut limits = config.limits.clone();
    limits.accept_http1 = config.rest.is_some();
    let limits = &limits;
    let health_only = config
        .health_listener
        .as_ref()
        .and_then(HealthListener::take)
        .map(|listener| {
            tokio::spawn(serve_health_only(
                listener,
                health_service.clone(),
                limits.clone(),
                health_draining,
            ))
        });
    let stats = Arc::new(ServerStats::default());
    let incoming = listener::incoming(listener, limits, Arc::clone(&stats), config.tls.clone());
    let routes = Routes::default()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(claims)
        .add_service(admin);
    let routes = match config.rest {
        Some(_) => Routes::from(
            routes
                .into_axum_router()
                .merge(crate::rest::routes(Arc::clone(&rest_store))),
        ),
        None => routes,
    };
    let server = Server::builder()
        .accept_http1(config.rest.is_some())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .http2_max_header_list_size(limits.max_header_list_bytes)
        .http2_keepalive_interval(Some(limits.keepalive_interval))
        .http2_keepalive_timeout(Some(limits.keepalive_timeout))
        .layer(RestAnswersLayer {
            config: config.rest.unwrap_or_default(),
        })
        .layer(MetricsLayer {
            metrics: config.metrics.clone(),
        })
        .layer(RequestGuardLayer::new(limits, max_message_bytes, stats))
        .layer(AuthorizeLayer {
            audit: config.audit.clone(),
            limiter,
            max_batch: config.max_batch,
            max_message_bytes,
            responses: ResponseLimits::new(
                limits.cell_max_streams,
                limits.stall_timeout,
                config.metrics.as_ref().map(|m| m.responses_stalled.clone()),
            )?,
        })
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, signal);
    let result = tokio::select! {
        result = server => result,
        () = drain_deadline => {
            tracing::warn!(
                timeout = ?config.drain_timeout,
                "drain timed out; returning with connections still open"
            );
            Ok(())
        }
    };
    gc.abort();
    follower.abort();
    waiting.abort();
    watcher.abort();
    restore_refresher.abort();
    let _ = restore_refresher.await;
    if let Some(health_only) = health_only {
        health_only.abort();
        let _ = health_only.await;
    }
    let _ = gc.await;
    let _ = watcher.await;
    for refresher in [refresher, claims_refresher].into_iter().flatten() {
        refresher.abort();
        let _ = refresher.await;
    }
    result.map_err(|e| ClaimsError::internal(format!("gRPC server failed: {e}")))
}

/// Serves `grpc.health.v1` alone on `listener`, in plaintext, under the main listener's
/// connection limits, until the drain starts (its statuses are NOT_SERVING by then). It reads
/// nothing but health requests, of 256 bytes at most, charged to the anonymous callers' byte
/// budget: no claim, identity or store is reachable through it, and what it buffers is bounded.
async fn serve_health_only<H: Health>(
    listener: TcpListener,
    health: HealthServer<H>,
    limits: ServerLimits,
    mut draining: watch::Receiver<bool>,
) {
    let stats = Arc::new(ServerStats::default());
    let incoming = listener::incoming(listener, &limits, Arc::clone(&stats), None);
    let stop = async move {
        let _ = draining.wait_for(|draining| *draining).await;
    };
    // Nobody is identified here: every request is charged to the anonymous budget, and a health
    // request may declare MAX_HEALTH_REQUEST_BYTES at most.
    let guard = RequestGuardLayer::new(&limits, MAX_HEALTH_REQUEST_BYTES, stats).untrusted();
    let served = Server::builder()
        .max_concurrent_streams(limits.max_concurrent_streams)
        .http2_max_header_list_size(limits.max_header_list_bytes)
        .layer(guard)
        .add_service(health)
        .serve_with_incoming_shutdown(incoming, stop)
        .await;
    if let Err(error) = served {
        tracing::warn!(%error, "the health listener (--health-listen) failed");
    }
}

/// Ticks every `interval` (the first at once) until `stop` closes: the loop of the periodic
/// tasks below (`while ticks.next().await { … }`).
struct Ticks {
    ticker: tokio::time::Interval,
    stop: watch::Receiver<()>,
}

impl Ticks {
    fn new(interval: Duration, stop: watch::Receiver<()>) -> Self {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self { ticker, stop }
    }

    /// Waits for the next tick: false once `stop` closed.
    async fn next(&mut self) -> bool {
        tokio::select! {
            _ = self.ticker.tick() => true,
            _ = self.stop.changed() => false,
        }
    }
}

/// Reads the store's lease summary every `interval` (first right away) into the lease gauges
/// until `stop` closes: one query per interval, whatever the number of scrapes. A cell whose
/// leases all ended shows 0 rather than vanishing; `store_up` says whether the read worked.
async fn refresh_lease_gauges(
    store: Arc<dyn ClaimStore>,
    metrics: Arc<ServerMetrics>,
    interval: Duration,
    stop: watch::Receiver<()>,
) {
    let mut ticks = Ticks::new(interval, stop);
    let mut known = std::collections::BTreeSet::new();
    while ticks.next().await {
        match store.lease_summary().await {
            Ok(summary) => {
                let mut seen = std::collections::BTreeSet::new();
                for cell in &summary.cells {
                    let name = cell.cell_id.as_str();
                    metrics
                        .leases_outstanding
                        .with_label_values(&[name])
                        .set(i64::try_from(cell.outstanding).unwrap_or(i64::MAX));
                    metrics
                        .oldest_lease_age
                        .with_label_values(&[name])
                        .set(cell.oldest_age(summary.server_time).as_secs_f64());
                    seen.insert(name.to_owned());
                }
                for gone in known.difference(&seen) {
                    let gone: &str = gone;
                    metrics.leases_outstanding.with_label_values(&[gone]).set(0);
                    metrics.oldest_lease_age.with_label_values(&[gone]).set(0.0);
                }
                known.extend(seen);
                metrics.store_up.set(1);
                metrics.lease_summary_time.set(crate::metrics::unix_now());
            }
            Err(error) => {
                metrics.store_up.set(0);
                tracing::debug!(%error, "reading the lease summary for the metrics failed");
            }
        }
    }
}

/// Counts the claims of every namespace each `interval` (first right away) into the claims gauge
/// until `stop` closes: a series for each namespace the store holds (0 when it has no claim), a
/// deleted namespace's series removed, so the series are at most the namespaces.
async fn refresh_claims_gauge(
    store: Arc<dyn ClaimStore>,
    metrics: Arc<ServerMetrics>,
    interval: Duration,
    stop: watch::Receiver<()>,
) {
    let mut ticks = Ticks::new(interval, stop);
    let mut known = std::collections::BTreeSet::new();
    while ticks.next().await {
        let read = async {
            Ok::<_, ClaimsError>((store.namespaces().await?, store.count_claims().await?))
        };
        match read.await {
            Ok((namespaces, counts)) => {
                let counts: std::collections::HashMap<_, _> = counts.into_iter().collect();
                let mut seen = std::collections::BTreeSet::new();
                for namespace in &namespaces {
                    let id = &namespace.namespace.id;
                    let count = counts.get(id).copied().unwrap_or(0);
                    metrics
                        .claims
                        .with_label_values(&[id.as_str()])
                        .set(i64::try_from(count).unwrap_or(i64::MAX));
                    seen.insert(id.to_string());
                }
                for gone in known.difference(&seen) {
                    let _ = metrics.claims.remove_label_values(&[gone.as_str()]);
                }
                known = seen;
                metrics.claims_gauge_time.set(crate::metrics::unix_now());
            }
            Err(error) => tracing::warn!(%error, "counting the claims for the claims gauge failed"),
        }
    }
}

/// Collects outcomes past `retention` every `interval` (first right away) until `stop` closes.
async fn collect_outcomes_periodically(
    store: Arc<dyn ClaimStore>,
    retention: Duration,
    interval: Duration,
    stop: watch::Receiver<()>,
) {
    let mut ticks = Ticks::new(interval, stop);
    while ticks.next().await {
        match store.collect_outcomes(retention).await {
            Ok(0) => tracing::debug!("no lease outcomes past retention"),
            Ok(n) => tracing::info!(collected = n, "collected lease outcomes past retention"),
            // A failed round is retried at the next tick; outcomes only accumulate meanwhile.
            Err(error) => tracing::warn!(%error, "collecting lease outcomes failed"),
        }
    }
}

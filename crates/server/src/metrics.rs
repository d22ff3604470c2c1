//! Prometheus metrics: the series of the server and of the two sidecars, and the `/metrics`
//! endpoint that serves them in the Prometheus text format (`--metrics-listen`).
//!
//! Owns metric names, labels and help texts (one place, so dashboards, the alert rules in
//! `deploy/prometheus/alerts.yml` and `docs/operations.md` can trust them) and the endpoint.
//! Recording requests is `grpc::metrics`' job; the lease gauges are refreshed by the server on
//! an interval (`grpc::server`), never by a scrape. Must not query a store itself.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::Full;
use hyper::body::Bytes;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use topology_claims::error::ClaimsError;

/// Connections the endpoint serves at once; more wait in the accept queue.
const MAX_SCRAPERS: usize = 8;
/// A scraper that has not sent its request headers by then is dropped.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Default `--metrics-refresh-interval`: how often the server reads the lease summary.
pub const DEFAULT_REFRESH_INTERVAL: Duration = Duration::from_secs(15);

/// Default `--claims-gauge-interval`: how often the server counts every claim by namespace (one
/// scan of the claims, so much rarer than the lease summary).
pub const DEFAULT_CLAIMS_GAUGE_INTERVAL: Duration = Duration::from_secs(5 * 60);

/// The ErrorInfo reasons counted as claim conflicts.
pub const CONFLICT_REASONS: [&str; 7] = [
    "CLAIM_TAKEN",
    "CLAIM_LEASED",
    "NOT_CLAIM_OWNER",
    "CLAIM_NOT_FOUND",
    "BATCH_CONFLICT",
    "LEASE_ID_CONFLICT",
    "RESTORE_QUARANTINE",
];

fn register<C: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    collector: C,
) -> C {
    // Names are constants of this module: a clash is a bug caught by the first test.
    registry
        .register(Box::new(collector.clone()))
        .expect("metric names are unique");
    collector
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(
        registry,
        IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    register(
        registry,
        IntCounter::with_opts(Opts::new(name, help)).expect("valid metric"),
    )
}

fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    register(
        registry,
        GaugeVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

/// Registers the standard `process_*` series of this process (CPU seconds, resident and virtual
/// memory, open and maximum file descriptors, start time; Linux) in `registry`: the server's and
/// the sidecars'.
pub fn register_process(registry: &Registry) {
    #[cfg(target_os = "linux")]
    registry
        .register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
        .expect("process_* names are unique in a registry");
}

fn build_info(registry: &Registry) {
    let info = register(
        registry,
        IntGaugeVec::new(
            Opts::new(
                "topology_claims_build_info",
                "Always 1; the version of the running binary as a label.",
            ),
            &["version"],
        )
        .expect("valid metric"),
    );
    info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
}

/// The unix time now, in seconds.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Raises `counter` to `total` (a cumulative count kept elsewhere, read at scrape time).
pub fn catch_up(counter: &IntCounter, total: u64) {
    let seen = counter.get();
    if total > seen {
        counter.inc_by(total - seen);
    }
}

/// The server's series.
#[derive(Clone)]
pub struct ServerMetrics {
    registry: Registry,
    pub requests: IntCounterVec,
    pub request_duration: HistogramVec,
    pub claim_conflicts: IntCounterVec,
    pub leases_outstanding: IntGaugeVec,
    pub oldest_lease_age: GaugeVec,
    pub store_retries: IntCounter,
    pub rate_limited: IntCounterVec,
    /// List and stream responses dropped because their reader took nothing for
    /// `--stall-timeout` (`grpc::responses`).
    pub responses_stalled: IntCounter,
    pub audit_write_failures: IntCounter,
    pub audit_lines_dropped: IntCounter,
    pub store_up: IntGauge,
    pub lease_summary_time: prometheus::Gauge,
    /// Claims (leased ones included) of each namespace the store holds: one series per
    /// namespace, so at most `--max-namespaces` (`ClaimStore::count_claims`).
    pub claims: IntGaugeVec,
    pub claims_gauge_time: prometheus::Gauge,
    /// Calls per group-commit store transaction (`--group-commit on`).
    pub group_batch_size: prometheus::Histogram,
    /// The store's latest restore epoch (0: never restored), whether its quarantine is enforced,
    /// and the expected cells that have not reported a verification pass (`crate::restore`).
    pub restore_epoch: IntGauge,
    pub restore_quarantine: IntGauge,
    pub restore_cells_pending: IntGauge,
    /// `notAfter` of the server's certificate and of the client CA bundle's earliest.
    pub tls_certificate_expiry: GaugeVec,
    /// The store's connection pool (`ClaimStore::pool_status`): connections by state, its
    /// maximum, and transactions waiting for one.
    pub store_pool_connections: IntGaugeVec,
    pub store_pool_max: IntGauge,
    pub store_pool_waiting: IntGauge,
    /// Open WatchClaims streams, and the change feed's revision this server has read
    /// (`grpc::watch`).
    pub watchers: IntGauge,
    pub watch_revision: IntGauge,
    /// From a change (its claim's `updated_at`) to its event being sent to a watcher.
    pub watch_lag: prometheus::Histogram,
    /// BeginUpdates waiting for a leased claim now, how long waits took, and how they ended
    /// (`grpc::lease_wait`).
    pub lease_waiters: IntGauge,
    pub lease_wait_seconds: prometheus::Histogram,
    pub lease_wait_outcomes: IntCounterVec,
}

impl ServerMetrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        build_info(&registry);
        register_process(&registry);
        let request_duration = register(
            &registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "topology_claims_request_duration_seconds",
                    "Time from a request's arrival to its answer, by RPC.",
                )
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0,
                ]),
                &["method"],
            )
            .expect("valid metric"),
        );
        let leases_outstanding = register(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "topology_claims_leases_outstanding",
                    "Outstanding leases of each cell (refreshed every --metrics-refresh-interval).",
                ),
                &["cell_id"],
            )
            .expect("valid metric"),
        );
        let store_up = register(
            &registry,
            IntGauge::with_opts(Opts::new(
                "topology_claims_store_up",
                "1 when the last lease-summary read of the store succeeded, 0 when it failed.",
            ))
            .expect("valid metric"),
        );
        Self {
            requests: counter_vec(
                &registry,
                "topology_claims_requests_total",
                "Requests answered, by RPC and gRPC status code name.",
                &["method", "code"],
            ),
            request_duration,
            claim_conflicts: counter_vec(
                &registry,
                "topology_claims_claim_conflicts_total",
                "Requests refused by a claim conflict, by ErrorInfo reason.",
                &["reason"],
            ),
            leases_outstanding,
            oldest_lease_age: gauge_vec(
                &registry,
                "topology_claims_oldest_lease_age_seconds",
                "Age of each cell's oldest outstanding lease by the store's clock \
                 (server_time - created_at); 0 when the cell has none.",
                &["cell_id"],
            ),
            store_retries: counter(
                &registry,
                "topology_claims_store_retries_total",
                "Store transactions retried (contention, aborts, lost connections).",
            ),
            rate_limited: counter_vec(
                &registry,
                "topology_claims_rate_limited_total",
                "Requests refused by a per-cell limit (--cell-rate, --cell-max-in-flight).",
                &["cell_id"],
            ),
            responses_stalled: counter(
                &registry,
                "topology_claims_responses_stalled_total",
                "List and stream responses dropped because their reader took nothing for \
                 --stall-timeout.",
            ),
            audit_write_failures: counter(
                &registry,
                "topology_claims_audit_write_failures_total",
                "Audit log lines that could not be written.",
            ),
            audit_lines_dropped: counter(
                &registry,
                "topology_claims_audit_lines_dropped_total",
                "Audit log lines dropped because the writer's queue was full (--audit-queue-lines).",
            ),
            store_up,
            lease_summary_time: register(
                &registry,
                prometheus::Gauge::with_opts(Opts::new(
                    "topology_claims_lease_gauges_refreshed_timestamp_seconds",
                    "Unix time the lease gauges were last refreshed from the store.",
                ))
                .expect("valid metric"),
            ),
            claims: register(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        "topology_claims_claims",
                        "Claims of each namespace, leased ones included (one count of every claim \
                         every --claims-gauge-interval).",
                    ),
                    &["namespace"],
                )
                .expect("valid metric"),
            ),
            claims_gauge_time: register(
                &registry,
                prometheus::Gauge::with_opts(Opts::new(
                    "topology_claims_claims_counted_timestamp_seconds",
                    "Unix time the claims gauge was last refreshed from the store (0: never).",
                ))
                .expect("valid metric"),
            ),
            group_batch_size: register(
                &registry,
                prometheus::Histogram::with_opts(
                    HistogramOpts::new(
                        "topology_claims_group_commit_batch_size",
                        "BeginUpdate / CommitUpdate / RollbackUpdate calls carried by each \
                         group-commit store transaction (_count: transactions, _sum: calls).",
                    )
                    .buckets(vec![
                        1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0,
                    ]),
                )
                .expect("valid metric"),
            ),
            restore_epoch: int_gauge(
                &registry,
                "topology_claims_restore_epoch",
                "The store's latest restore epoch (admin mark-restored); 0 if it was never \
                 restored from a backup.",
            ),
            restore_quarantine: int_gauge(
                &registry,
                "topology_claims_restore_quarantine",
                "1 while this server refuses creates of absent claims (RESTORE_QUARANTINE) until \
                 the cells re-verify after a restore; 0 otherwise.",
            ),
            store_pool_connections: register(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        "topology_claims_store_pool_connections",
                        "Open connections of the store's pool by state (in_use, idle); absent \
                         for stores without a pool (memory, SQLite, Spanner).",
                    ),
                    &["state"],
                )
                .expect("valid metric"),
            ),
            store_pool_max: int_gauge(
                &registry,
                "topology_claims_store_pool_max_connections",
                "Most connections the store's pool opens (--pg-pool-size); 0 without a pool.",
            ),
            store_pool_waiting: int_gauge(
                &registry,
                "topology_claims_store_pool_waiting",
                "Store transactions waiting for a pooled connection now.",
            ),
            watchers: int_gauge(
                &registry,
                "topology_claims_watchers",
                "Open WatchClaims streams (at most --max-watchers).",
            ),
            watch_revision: int_gauge(
                &registry,
                "topology_claims_watch_revision",
                "The change feed's revision this server has read: every change up to it is \
                 readable by its watchers (0 on a store without a change feed).",
            ),
            watch_lag: register(
                &registry,
                prometheus::Histogram::with_opts(
                    HistogramOpts::new(
                        "topology_claims_watch_lag_seconds",
                        "From a change of a claim (its updated_at, the store's clock) to its \
                         event being sent to a watcher: one observation per page a stream sends, \
                         its newest change (deletes left out).",
                    )
                    .buckets(vec![
                        0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    ]),
                )
                .expect("valid metric"),
            ),
            lease_waiters: int_gauge(
                &registry,
                "topology_claims_lease_waiters",
                "BeginUpdates waiting for a leased claim now (wait_for_leased; at most \
                 --max-lease-waiters).",
            ),
            lease_wait_seconds: register(
                &registry,
                prometheus::Histogram::with_opts(
                    HistogramOpts::new(
                        "topology_claims_lease_wait_seconds",
                        "How long BeginUpdates waited for a leased claim, however the wait ended.",
                    )
                    .buckets(vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0]),
                )
                .expect("valid metric"),
            ),
            lease_wait_outcomes: register(
                &registry,
                IntCounterVec::new(
                    Opts::new(
                        "topology_claims_lease_wait_outcomes_total",
                        "Waits for a leased claim by how they ended: granted (a lease), refused \
                         (another refusal, e.g. CLAIM_TAKEN), timed_out (CLAIM_LEASED after the \
                         wait), over_cap (CLAIM_LEASED at once: --max-lease-waiters reached), no_line \
                         (CLAIM_LEASED at once: the store's wait line could not be joined).",
                    ),
                    &["outcome"],
                )
                .expect("valid metric"),
            ),
            tls_certificate_expiry: gauge_vec(
                &registry,
                "topology_claims_tls_certificate_expiry_seconds",
                "Unix time at which a certificate of the server expires (its notAfter): \
                 certificate=\"server\" (--tls-cert's first) or \"client_ca\" (the earliest of \
                 --tls-client-ca). Follows SIGHUP reloads; absent without TLS.",
                &["certificate"],
            ),
            restore_cells_pending: int_gauge(
                &registry,
                "topology_claims_restore_cells_pending",
                "Cells the latest restore waits for that have not reported a verification pass \
                 (0 once lifted).",
            ),
            registry,
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The exposition of every series, and of every family at all: a family with no series yet
    /// (the per-cell ones on a store without leases, `rate_limited_total` before a refusal) is
    /// still announced with its HELP and TYPE, so a scrape shows from the start what exists.
    pub fn render(&self) -> String {
        let mut text = render(&self.registry);
        let families: [(&dyn prometheus::core::Collector, &str); 8] = [
            (&self.store_pool_connections, "gauge"),
            (&self.tls_certificate_expiry, "gauge"),
            (&self.requests, "counter"),
            (&self.request_duration, "histogram"),
            (&self.claim_conflicts, "counter"),
            (&self.leases_outstanding, "gauge"),
            (&self.oldest_lease_age, "gauge"),
            (&self.rate_limited, "counter"),
        ];
        for (family, kind) in families {
            for desc in family.desc() {
                if !text.contains(&format!("# TYPE {} ", desc.fq_name)) {
                    let help = desc.help.replace('\\', "\\\\").replace('\n', "\\n");
                    text.push_str(&format!(
                        "# HELP {name} {help}\n# TYPE {name} {kind}\n",
                        name = desc.fq_name
                    ));
                }
            }
        }
        text
    }

    /// Starts the series of every RPC at zero: `requests_total{code="OK"}` and an empty
    /// `request_duration_seconds` per method, so rates and ratios exist before the first call.
    pub fn with_methods(self, methods: &[&str]) -> Self {
        for method in methods {
            self.requests.with_label_values(&[method, "OK"]);
            self.request_duration.with_label_values(&[method]);
        }
        self
    }
}

fn int_gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    register(
        registry,
        IntGauge::with_opts(Opts::new(name, help)).expect("valid metric"),
    )
}

impl std::fmt::Debug for ServerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerMetrics")
    }
}

impl Default for ServerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The exposition of `registry` in the Prometheus text format (0.0.4).
pub fn render(registry: &Registry) -> String {
    let mut buffer = Vec::new();
    if let Err(error) = TextEncoder::new().encode(&registry.gather(), &mut buffer) {
        tracing::error!(%error, "encoding the metrics failed");
    }
    String::from_utf8(buffer).unwrap_or_default()
}

/// Serves `GET /metrics` (the text of `render()`, called per scrape) on `listener` until
/// `shutdown` completes. Any other path is 404, any other method 405. At most
/// [`MAX_SCRAPERS`] connections are served at once, and a client has
/// [`HEADER_READ_TIMEOUT`] to send its request.
pub async fn serve_metrics(
    listener: TcpListener,
    render: Arc<dyn Fn() -> String + Send + Sync>,
    shutdown: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(MAX_SCRAPERS));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            _ = &mut shutdown => return,
            permit = Arc::clone(&slots).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
        };
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors and the like: wait instead of spinning.
                    tracing::warn!(%error, "metrics endpoint: accept failed");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            },
        };
        let render = Arc::clone(&render);
        tokio::spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |request| {
                let render = Arc::clone(&render);
                async move { Ok::<_, Infallible>(respond(&request, &*render)) }
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .keep_alive(true)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            if let Err(error) = served {
                tracing::debug!(%error, %peer, "metrics connection ended with an error");
            }
        });
    }
}

fn respond<B>(
    request: &hyper::Request<B>,
    render: &(dyn Fn() -> String + Send + Sync),
) -> hyper::Response<Full<Bytes>> {
    let reply = |status: u16, content_type: &str, body: String| {
        hyper::Response::builder()
            .status(status)
            .header(hyper::header::CONTENT_TYPE, content_type)
            .body(Full::new(Bytes::from(body)))
            .unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new())))
    };
    if request.uri().path() != "/metrics" {
        return reply(
            404,
            "text/plain; charset=utf-8",
            "not found; metrics are at /metrics\n".into(),
        );
    }
    if request.method() != hyper::Method::GET && request.method() != hyper::Method::HEAD {
        return reply(405, "text/plain; charset=utf-8", "use GET\n".into());
    }
    reply(200, prometheus::TEXT_FORMAT, render())
}

/// Binds the metrics listener (`--metrics-listen`), with an error naming the flag.
pub async fn bind(addr: &str) -> Result<TcpListener, ClaimsError> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| ClaimsError::Configuration {
            message: format!("--metrics-listen {addr}: cannot listen: {e}"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_exposition_names_every_series() {
        let metrics = ServerMetrics::new();
        metrics
            .requests
            .with_label_values(&["BeginUpdate", "OK"])
            .inc();
        metrics
            .request_duration
            .with_label_values(&["BeginUpdate"])
            .observe(0.002);
        metrics
            .claim_conflicts
            .with_label_values(&["CLAIM_TAKEN"])
            .inc();
        metrics
            .leases_outstanding
            .with_label_values(&["cell-a"])
            .set(2);
        metrics
            .oldest_lease_age
            .with_label_values(&["cell-a"])
            .set(3.5);
        metrics.rate_limited.with_label_values(&["cell-a"]).inc();
        let text = render(metrics.registry());
        for series in [
            "topology_claims_requests_total{code=\"OK\",method=\"BeginUpdate\"} 1",
            "topology_claims_request_duration_seconds_bucket",
            "topology_claims_claim_conflicts_total{reason=\"CLAIM_TAKEN\"} 1",
            "topology_claims_leases_outstanding{cell_id=\"cell-a\"} 2",
            "topology_claims_oldest_lease_age_seconds{cell_id=\"cell-a\"} 3.5",
            "topology_claims_store_retries_total 0",
            "topology_claims_responses_stalled_total 0",
            "topology_claims_rate_limited_total{cell_id=\"cell-a\"} 1",
            "topology_claims_audit_write_failures_total 0",
            "topology_claims_audit_lines_dropped_total 0",
            "topology_claims_watchers 0",
            "topology_claims_watch_revision 0",
            "topology_claims_watch_lag_seconds_count 0",
            "topology_claims_build_info{version=\"",
        ] {
            assert!(text.contains(series), "{series} missing from:\n{text}");
        }
    }

    #[test]
    fn catch_up_only_moves_forward() {
        let c = IntCounter::new("x_total", "x").unwrap();
        catch_up(&c, 5);
        catch_up(&c, 3);
        assert_eq!(c.get(), 5);
        catch_up(&c, 7);
        assert_eq!(c.get(), 7);
    }
}

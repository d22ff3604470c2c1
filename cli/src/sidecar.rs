//! The sidecar commands any cell runs next to its application, whatever its language:
//! `reconcile` (heal leases left between the three phases) and `verify` (compare the cell's
//! records with the service and correct drift). Both talk to the service over gRPC and to the
//! cell's own database (`--local-db sqlite://PATH` or `postgres://…`).
//!
//! Owns flags, local-database wiring and progress printing; the logic is `topology_claims_client`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use topology_claims::domain::SlotCap;
use topology_claims::{CellId, ClaimsError, LocalLeaseStore, LocalLock, TableName};
use topology_claims_client::{
    ClaimSource, ClaimsClient, ClientConfig, Reconciler, ReconcilerConfig, SlotEvent, Verifier,
    VerifierConfig, VerifyReport,
};

use topology_claims::config::{parse_duration, parse_nonzero_duration, StoreUrl};
use topology_claims_client::metrics::{ReconcileMetrics, VerifyMetrics};
use topology_claims_server::metrics::render;

use crate::client_tls::ServerArgs;
use crate::metrics_args::MetricsArgs;

/// Where the cell's own database is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LocalDbUrl {
    Sqlite(PathBuf),
    Postgres(String),
}

impl std::str::FromStr for LocalDbUrl {
    type Err = String;

    fn from_str(url: &str) -> Result<Self, String> {
        match url.parse::<StoreUrl>() {
            Ok(StoreUrl::Sqlite(path)) => Ok(Self::Sqlite(path)),
            Ok(StoreUrl::Postgres(url)) => Ok(Self::Postgres(url)),
            other => {
                let scheme = match other {
                    Ok(StoreUrl::Memory) => "memory",
                    Ok(StoreUrl::Spanner(_)) => "spanner",
                    _ => url.split_once(':').map(|(s, _)| s).unwrap_or(""),
                };
                Err(format!(
                    "unsupported local database URL (scheme {scheme:?}); use sqlite://PATH or postgres://USER@HOST:PORT/DB"
                ))
            }
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct CellArgs {
    #[command(flatten)]
    to: ServerArgs,

    /// This cell's id.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CELL_ID", value_parser = parse_cell_id)]
    cell_id: CellId,

    /// The cell's own database, holding its `leases_outstanding` table: sqlite://PATH or
    /// postgres://USER@HOST:PORT/DB (also ?host=/var/run/postgresql). On PostgreSQL, the
    /// primary: the reconciler asks it whether a lease's local transaction aborted (a standby
    /// is never asked; its leases wait for the staleness).
    #[arg(long, env = "TOPOLOGY_CLAIMS_LOCAL_DB")]
    local_db: LocalDbUrl,

    /// Deadline of one call to the service (each call is retried on UNAVAILABLE). A duration: a
    /// whole number and a unit (ms, s, m, h, d), e.g. 500ms, 5s.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CALL_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    call_timeout: Duration,
}

fn parse_cell_id(text: &str) -> Result<CellId, String> {
    CellId::parse(text).map_err(|e| e.to_string())
}

#[derive(Args, Debug)]
pub struct ReconcileArgs {
    #[command(flatten)]
    cell: CellArgs,

    /// Leases missing locally are rolled back once unrenewed for this long (by the server's
    /// clock). Must equal the staleness the cell's application uses. A duration: a whole number
    /// and a unit (ms, s, m, h, d), e.g. 10m.
    #[arg(long, env = "TOPOLOGY_CLAIMS_STALENESS", default_value = "10m", value_parser = parse_duration)]
    staleness: Duration,

    /// Time between passes. A duration: a whole number and a unit (ms, s, m, h, d), e.g. 60s.
    #[arg(long, env = "TOPOLOGY_CLAIMS_RECONCILE_INTERVAL", default_value = "60s", value_parser = parse_duration)]
    interval: Duration,

    /// Run one pass and exit (exit status 0 if it ran or another reconciler held the lock, 2 if
    /// it failed). Env: true/false, 1/0, yes/no, on/off.
    #[arg(long, env = "TOPOLOGY_CLAIMS_RECONCILE_ONCE",
          value_parser = crate::env::switch)]
    once: bool,

    /// Leases per ListOutstandingLeases page (1..=1000). A page also stops before the server's
    /// --max-response-bytes, so large leases come fewer per page.
    #[arg(long, env = "TOPOLOGY_CLAIMS_PAGE_SIZE", default_value_t = 100,
          value_parser = clap::value_parser!(u16).range(1..=1000))]
    page_size: u16,

    #[command(flatten)]
    metrics: MetricsArgs,
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    #[command(flatten)]
    cell: CellArgs,

    /// The verifier's source of truth: a TOML file with one SQL query per table (see
    /// docs/cell-integration.md).
    #[arg(
        long,
        env = "TOPOLOGY_CLAIMS_VERIFY_SOURCE",
        default_value = "verify.toml"
    )]
    source: PathBuf,

    /// Print the differences and change nothing (the saved cursor included). Env: true/false,
    /// 1/0, yes/no, on/off.
    #[arg(long, env = "TOPOLOGY_CLAIMS_VERIFY_DRY_RUN",
          value_parser = crate::env::switch)]
    dry_run: bool,

    /// Records and claims younger than this are left alone (they may still be in flight). A
    /// duration: a whole number and a unit (ms, s, m, h, d), e.g. 1h.
    #[arg(long, env = "TOPOLOGY_CLAIMS_VERIFY_RECENT", default_value = "1h", value_parser = parse_duration)]
    recent: Duration,

    /// Stop after this long (resumable from the saved cursor). A duration: a whole number and a
    /// unit (ms, s, m, h, d), e.g. 30m. Default: no limit.
    #[arg(long, env = "TOPOLOGY_CLAIMS_VERIFY_TIME_BUDGET", value_parser = parse_duration)]
    time_budget: Option<Duration>,

    /// Where the cursor is saved so an interrupted run resumes. Default:
    /// .topology-claims-verify-<cell>.cursor in the working directory.
    #[arg(long, env = "TOPOLOGY_CLAIMS_VERIFY_CURSOR_FILE")]
    cursor_file: Option<PathBuf>,

    /// ListClaims page size (1..=10000). A page also stops before the server's
    /// --max-response-bytes; a record whose claims alone fill a page is split over pages and
    /// compared whole.
    #[arg(long, env = "TOPOLOGY_CLAIMS_VERIFY_PAGE_SIZE", default_value_t = 1000,
          value_parser = clap::value_parser!(u16).range(1..=10000))]
    page_size: u16,

    /// Read the service's claims with ListClaims paging (one request per page) instead of one
    /// StreamClaims stream per table: the same pages and cursor, for servers or proxies where
    /// streaming misbehaves, and for comparing the two. Env: true/false, 1/0, yes/no, on/off.
    #[arg(long, env = "TOPOLOGY_CLAIMS_VERIFY_NO_STREAM",
          value_parser = crate::env::switch)]
    no_stream: bool,

    /// Most claims per correcting BeginUpdate (1..=1000).
    #[arg(long, env = "TOPOLOGY_CLAIMS_VERIFY_CHUNK", default_value_t = 1000,
          value_parser = clap::value_parser!(u16).range(1..=1000))]
    chunk: u16,

    /// Run again this long after each run ends, until SIGINT/SIGTERM (a long-lived sidecar
    /// whose metrics Prometheus scrapes). Units: ms, s, m, h, d. Default: one run, then exit.
    #[arg(long, env = "TOPOLOGY_CLAIMS_VERIFY_EVERY", value_parser = parse_nonzero_duration)]
    every: Option<Duration>,

    #[command(flatten)]
    metrics: MetricsArgs,
}

fn client(args: &CellArgs) -> Result<ClaimsClient, ClaimsError> {
    let config = ClientConfig {
        call_timeout: args.call_timeout,
        tls: args.to.tls.load()?,
        ..ClientConfig::default()
    };
    ClaimsClient::connect_lazy(&args.to.server, config)
}

/// Exit status of a sidecar that could not do its work: bad flags or verify source, the cell's
/// database or the claims server unreachable (in `reconcile --once` or `verify`).
const EXIT_ERROR: u8 = 2;
/// Exit status of a `verify` run that finished but could not apply every correction (a claim
/// taken by another cell, a refused lease): the summary's `failed=N`; needs a human.
const EXIT_CORRECTIONS_FAILED: u8 = 1;
/// Exit status of a `verify` run stopped because its verification slot was lost (it expired and
/// another verifier took it): nothing is wrong with the cell; the cursor is saved, run again.
const EXIT_SLOT_LOST: u8 = 3;

fn fail(error: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {error}");
    ExitCode::from(EXIT_ERROR)
}

pub async fn reconcile(args: ReconcileArgs) -> ExitCode {
    let client = match client(&args.cell) {
        Ok(client) => client,
        Err(e) => return fail(e),
    };
    let config = ReconcilerConfig {
        staleness: args.staleness,
        page_size: usize::from(args.page_size),
        ..ReconcilerConfig::new(args.cell.cell_id.clone())
    };
    let result = match &args.cell.local_db {
        LocalDbUrl::Sqlite(path) => {
            match topology_claims_sqlite::SqliteLocalLeaseStore::open(path).await {
                Ok(local) => run_reconciler(Reconciler::new(client, local, config), &args).await,
                Err(e) => Err(e),
            }
        }
        LocalDbUrl::Postgres(url) => {
            let options = topology_claims_postgres::PostgresOptions {
                pool_size: 2,
                ..Default::default()
            };
            match connect_postgres_local(url, options).await {
                Ok(local) => run_reconciler(Reconciler::new(client, local, config), &args).await,
                Err(e) => Err(e),
            }
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

/// The cell's PostgreSQL lease store, with its tables created if missing (as for SQLite).
async fn connect_postgres_local(
    url: &str,
    options: topology_claims_postgres::PostgresOptions,
) -> Result<topology_claims_postgres::PostgresLocalLeaseStore, ClaimsError> {
    let local = topology_claims_postgres::PostgresLocalLeaseStore::connect(url, options).await?;
    local.ensure_schema().await?;
    Ok(local)
}

async fn run_reconciler<L: LocalLeaseStore + LocalLock>(
    reconciler: Reconciler<L>,
    args: &ReconcileArgs,
) -> Result<(), ClaimsError> {
    let metrics = ReconcileMetrics::new();
    topology_claims_server::metrics::register_process(metrics.registry());
    let cell = args.cell.cell_id.to_string();
    metrics.init(&cell);
    let exposed = metrics.clone();
    args.metrics
        .start(Arc::new(move || render(exposed.registry())))
        .await
        .map_err(|message| ClaimsError::Configuration { message })?;
    if args.once {
        let pass = reconciler.run_once().await;
        metrics.observe(&cell, &pass);
        println!("reconcile {}: {}", args.cell.cell_id, pass?);
        return Ok(());
    }
    eprintln!(
        "reconciling cell {} every {:?} (staleness {:?}); Ctrl-C to stop",
        args.cell.cell_id, args.interval, args.staleness
    );
    reconciler
        .run(args.interval, shutdown_signal(), |pass| {
            metrics.observe(&cell, pass)
        })
        .await;
    Ok(())
}

/// `verify.toml`: `[tables.<name>] query = "…"` for each table to verify.
fn load_source_file(path: &PathBuf) -> Result<BTreeMap<TableName, String>, ClaimsError> {
    let text = std::fs::read_to_string(path).map_err(|e| ClaimsError::Configuration {
        message: format!("cannot read verify source {}: {e}", path.display()),
    })?;
    let parsed: toml::Table = text.parse().map_err(|e| ClaimsError::Configuration {
        message: format!("verify source {} is not valid TOML: {e}", path.display()),
    })?;
    let tables = parsed
        .get("tables")
        .and_then(|t| t.as_table())
        .ok_or_else(|| ClaimsError::Configuration {
            message: format!(
                "verify source {} has no [tables.<name>] sections",
                path.display()
            ),
        })?;
    let mut queries = BTreeMap::new();
    for (name, section) in tables {
        // Any source table name the service takes: the cell's claims name it (source_table).
        let table = TableName::parse_name(name, "").map_err(|e| {
            let problem = match e {
                ClaimsError::InvalidRequest { description, .. } => description,
                other => other.to_string(),
            };
            ClaimsError::Configuration {
                message: format!(
                    "verify source: [tables.{name:?}] is not a source table name: {problem}"
                ),
            }
        })?;
        let query = section
            .get("query")
            .and_then(|q| q.as_str())
            .ok_or_else(|| ClaimsError::Configuration {
                message: format!("verify source: [tables.{name}] needs a query = \"…\" string"),
            })?;
        queries.insert(table, query.to_owned());
    }
    if queries.is_empty() {
        return Err(ClaimsError::Configuration {
            message: "verify source lists no tables".into(),
        });
    }
    Ok(queries)
}

pub async fn verify(args: VerifyArgs) -> ExitCode {
    let queries = match load_source_file(&args.source) {
        Ok(queries) => queries,
        Err(e) => return fail(e),
    };
    let client = match client(&args.cell) {
        Ok(client) => client,
        Err(e) => return fail(e),
    };
    let cell_id = args.cell.cell_id.clone();
    let config =
        VerifierConfig {
            recent: args.recent,
            page_size: usize::from(args.page_size),
            stream: !args.no_stream,
            chunk: usize::from(args.chunk),
            dry_run: args.dry_run,
            time_budget: args.time_budget,
            cursor_file: Some(args.cursor_file.clone().unwrap_or_else(|| {
                PathBuf::from(format!(".topology-claims-verify-{cell_id}.cursor"))
            })),
            ..VerifierConfig::new(cell_id, queries.keys().cloned().collect())
        };
    let metrics = VerifyMetrics::new();
    topology_claims_server::metrics::register_process(metrics.registry());
    metrics.init(config.cell_id.as_str());
    let exposed = metrics.clone();
    if let Err(e) = args
        .metrics
        .start(Arc::new(move || render(exposed.registry())))
        .await
    {
        return fail(e);
    }
    let runs = Runs {
        config: &config,
        metrics: &metrics,
        every: args.every,
    };
    let result = match &args.cell.local_db {
        LocalDbUrl::Sqlite(path) => {
            match topology_claims_sqlite::cell::SqliteQuerySource::open(path, queries) {
                Ok(source) => {
                    runs.run(
                        Verifier::new(client, source, config.clone()).on_slot(print_slot_event),
                    )
                    .await
                }
                Err(e) => Err(e),
            }
        }
        LocalDbUrl::Postgres(url) => {
            match topology_claims_postgres::cell::PostgresQuerySource::connect(url, queries).await {
                Ok(source) => {
                    runs.run(
                        Verifier::new(client, source, config.clone()).on_slot(print_slot_event),
                    )
                    .await
                }
                Err(e) => Err(e),
            }
        }
    };
    match result {
        Ok(report) if report.corrections_failed > 0 => {
            eprintln!(
                "error: {} correction(s) failed and need manual intervention (see the log above)",
                report.corrections_failed
            );
            ExitCode::from(EXIT_CORRECTIONS_FAILED)
        }
        Ok(_) => ExitCode::SUCCESS,
        Err(e @ ClaimsError::VerificationSlotLost { .. }) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_SLOT_LOST)
        }
        Err(e) => fail(e),
    }
}

/// One stderr line per slot event, stamped with the wall clock as RFC 3339 UTC to the
/// millisecond (`at=2026-11-27T15:10:13.248Z`) so that operators and tests can line up the runs
/// of several cells.
fn print_slot_event(event: &SlotEvent) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let at = prost_types::Timestamp {
        seconds: i64::try_from(now.as_secs()).unwrap_or(i64::MAX),
        // Milliseconds: the stamp lines up runs, it does not time them.
        nanos: i32::try_from(now.subsec_millis() * 1_000_000).unwrap_or(0),
    };
    match event {
        SlotEvent::Waiting {
            in_use,
            limit: SlotCap::Fleet,
            retry_in,
            ..
        } => eprintln!(
            "waiting for a verification slot ({in_use} in use), retrying in {:.1}s",
            retry_in.as_secs_f64()
        ),
        SlotEvent::Waiting {
            in_use,
            max,
            limit: SlotCap::PerCell,
            retry_in,
        } => eprintln!(
            "waiting for a verification slot (this cell holds {in_use} of the {max} one cell may, \
             --max-verifications-per-cell), retrying in {:.1}s",
            retry_in.as_secs_f64()
        ),
        SlotEvent::Taken { in_use } => {
            eprintln!("verification slot taken at={at} ({in_use} in use)")
        }
        SlotEvent::Released => eprintln!("verification slot released at={at}"),
        SlotEvent::Lost => eprintln!(
            "verification slot lost at={at}: it expired before its renewal and another verifier holds it; stopping"
        ),
        SlotEvent::Unsupported => {
            eprintln!("the claims server has no verification slots; verifying without one")
        }
    }
}

/// One verify run, or (with `--every`) runs until SIGINT/SIGTERM, recorded in the metrics.
struct Runs<'a> {
    config: &'a VerifierConfig,
    metrics: &'a VerifyMetrics,
    every: Option<Duration>,
}

impl Runs<'_> {
    async fn run<S: ClaimSource>(
        &self,
        verifier: Verifier<S>,
    ) -> Result<VerifyReport, ClaimsError> {
        let Some(every) = self.every else {
            return self.run_once(&verifier).await;
        };
        eprintln!(
            "verifying cell {} every {every:?} after each run; Ctrl-C to stop",
            self.config.cell_id
        );
        let shutdown = shutdown_signal();
        tokio::pin!(shutdown);
        loop {
            match self.run_once(&verifier).await {
                Ok(report) if report.corrections_failed > 0 => tracing::error!(
                    failed = report.corrections_failed,
                    "corrections failed and need manual intervention (see the log above)"
                ),
                Ok(_) => {}
                Err(error) => tracing::error!(%error, "verify run failed"),
            }
            tokio::select! {
                _ = &mut shutdown => return Ok(VerifyReport::default()),
                _ = tokio::time::sleep(every) => {}
            }
        }
    }

    async fn run_once<S: ClaimSource>(
        &self,
        verifier: &Verifier<S>,
    ) -> Result<VerifyReport, ClaimsError> {
        let config = self.config;
        let cell = config.cell_id.as_str();
        let mut printed = 0;
        let mut recorded = VerifyReport::default();
        let result = verifier
            .run(|report| {
                if config.dry_run {
                    for d in &report.discrepancies[printed..] {
                        println!("{d}");
                    }
                    printed = report.discrepancies.len();
                }
                self.metrics.progress(cell, &recorded, report);
                recorded = report.clone();
                eprintln!("progress: {report}");
            })
            .await;
        if let Ok(report) = &result {
            self.metrics.progress(cell, &recorded, report);
        }
        self.metrics.finished(cell, &result);
        let report = result?;
        println!(
            "verify {}{}: {report}",
            config.cell_id,
            if config.dry_run { " (dry run)" } else { "" }
        );
        Ok(report)
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

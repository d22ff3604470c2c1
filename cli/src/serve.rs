//! `topology-claims serve`: opens the store (applying or refusing pending migrations), binds the
//! listener, runs `topology_claims::grpc::server::serve` until SIGINT/SIGTERM, and exits 0 after
//! the drain.
//!
//! Owns process wiring only; the server itself is the core's.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use topology_claims::grpc::server::{serve, ServerConfig};
use topology_claims::MigrationPolicy;

use crate::store::{self, StoreOptions, StoreUrl};
use topology_claims::config::{parse_duration, parse_nonzero_duration};

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (HOST:PORT). Port 0 picks a free port; the line `listening on
    /// HOST:PORT` shows the real one.
    #[arg(
        long,
        env = "TOPOLOGY_CLAIMS_LISTEN",
        default_value = "127.0.0.1:50051"
    )]
    listen: String,

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
    #[arg(long, env = "TOPOLOGY_CLAIMS_NO_MIGRATE")]
    no_migrate: bool,

    /// Most claims (creates + destroys) one BeginUpdate may carry; larger batches are
    /// INVALID_ARGUMENT. Requests above 4 MiB are refused whatever this says.
    #[arg(long, env = "TOPOLOGY_CLAIMS_MAX_BATCH", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_batch: u32,

    /// Budget of one ListOutstandingLeases / ListClaims response in encoded bytes: a page stops
    /// before it (as well as at its limit) and its cursor continues where it stopped. At least
    /// 64 KiB; keep it well under the 4 MiB gRPC clients accept by default.
    #[arg(long, env = "TOPOLOGY_CLAIMS_MAX_RESPONSE_BYTES", default_value_t = 1024 * 1024,
          value_parser = clap::value_parser!(u32).range(65_536..=4_000_000))]
    max_response_bytes: u32,

    /// How long committed / rolled-back lease outcomes are remembered, so late retries get
    /// LEASE_COMMITTED / LEASE_ROLLED_BACK rather than LEASE_NOT_FOUND. Units: ms, s, m, h, d.
    #[arg(long, env = "TOPOLOGY_CLAIMS_OUTCOME_RETENTION", default_value = "24h",
          value_parser = parse_duration)]
    outcome_retention: Duration,

    /// How often outcomes past retention are collected. Units: ms, s, m, h, d; not zero.
    #[arg(long, env = "TOPOLOGY_CLAIMS_GC_INTERVAL", default_value = "5m",
          value_parser = parse_nonzero_duration)]
    gc_interval: Duration,

    /// After SIGINT/SIGTERM, how long in-flight requests may take to finish before the process
    /// exits anyway. Units: ms, s, m, h, d.
    #[arg(long, env = "TOPOLOGY_CLAIMS_DRAIN_TIMEOUT", default_value = "30s",
          value_parser = parse_duration)]
    drain_timeout: Duration,
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

    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot read the bound address: {e}"))?;
    let config = ServerConfig {
        max_batch: args.max_batch as usize,
        max_response_bytes: args.max_response_bytes as usize,
        outcome_retention: args.outcome_retention,
        gc_interval: args.gc_interval,
        drain_timeout: args.drain_timeout,
    };
    tracing::info!(%addr, store = %store_url, max_batch = config.max_batch,
        outcome_retention = ?config.outcome_retention, "serving");
    let server = tokio::spawn(serve(listener, store, config, shutdown));

    // The listener is bound, so connections queue from here on and the server task accepts them.
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on {addr}")
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("cannot write to stdout: {e}"))?;
    drop(stdout);

    match server.await {
        Ok(Ok(())) => {
            tracing::info!("drained; exiting");
            Ok(())
        }
        Ok(Err(e)) => Err(format!("server failed: {e}")),
        Err(e) => Err(format!("server task failed: {e}")),
    }
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

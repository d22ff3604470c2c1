//! The `topology-claims` binary, the product operators install: `serve` (the gRPC server over a
//! store chosen by URL), `migrate`, the operator commands against a running server (`lookup`,
//! `leases`), administrative actions (`admin`), the two cell sidecars (`reconcile`, `verify`) and `certs`, a development PKI for
//! mutual TLS.
//!
//! Owns argument parsing, process wiring (logging, signals, exit codes) and printing. Must not
//! hold protocol rules or storage code (the core's and the backends'), nor anything only a
//! benchmark, a fault campaign or a test needs (those are `tools/`).

mod admin;
mod admin_namespaces;
mod admin_restore;
mod backup;
mod certs;
mod claim_cmd;
mod client_tls;
mod confirm;
mod env;
mod metrics_args;
mod ops;
mod router_args;
mod serve;
mod sidecar;
mod status;
mod store;
mod wait_args;
mod watch_cmd;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use crate::store::StoreUrl;

/// Globally unique claims (usernames, emails, routes) owned by exactly one cell:
/// lease-first, commit-later coordination for cell-based platforms.
#[derive(Parser, Debug)]
#[command(name = "topology-claims", version)]
struct Cli {
    /// Log line format on stderr: text (for people) or json (one JSON object per line, for log
    /// pipelines; docs/operations.md, "Log format").
    #[arg(long, global = true, env = "TOPOLOGY_CLAIMS_LOG_FORMAT", default_value = "text",
          value_parser = ["text", "json"])]
    log_format: String,

    /// Threads of the async runtime that runs every request (tokio workers). 0: one per CPU
    /// core (tokio's default). On a small machine shared with the store, fewer threads mean
    /// fewer cross-thread wake-ups per request (docs/benchmarks.md, "What each step bought").
    #[arg(long, global = true, env = "TOPOLOGY_CLAIMS_WORKER_THREADS", default_value_t = 0,
          value_parser = clap::value_parser!(u16).range(0..=1024))]
    worker_threads: u16,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the gRPC server (ClaimsService, grpc.health.v1, server reflection).
    ///
    /// Prints one line `listening on HOST:PORT` to stdout once it accepts connections; logs go to
    /// stderr (filter with RUST_LOG, default info). SIGINT/SIGTERM drain in-flight requests and
    /// exit 0.
    // Boxed: its flags make it several times the size of the other commands.
    Serve(Box<serve::ServeArgs>),
    /// Apply the store's pending schema migrations and exit.
    Migrate(MigrateArgs),
    /// Show which cell holds a claim. Exit status: 0 found, 1 not found, 2 error.
    Lookup(ops::LookupArgs),
    /// Take one claim for a cell from the shell (BeginUpdate, then CommitUpdate): to try the
    /// service or fix one name by hand. A claim with no record in the cell's database is drift
    /// for that cell's verifier, which destroys it. Exit status: 0 claimed, 1 refused (taken,
    /// leased, …), 2 error.
    Claim(claim_cmd::ClaimArgs),
    /// Give back one claim of a cell from the shell (a destroy, committed). Exit status: 0
    /// released, 1 refused (not found, another cell's, leased), 2 error.
    Release(claim_cmd::ClaimArgs),
    /// Follow the change feed (WatchClaims): one JSON line per event, from now or from
    /// --from REVISION, until interrupted. Exit status: 0 the server ended the stream (resume
    /// with --from), 1 WATCH_COMPACTED (look up again), 2 error.
    Watch(watch_cmd::WatchArgs),
    /// Ask a server's grpc.health.v1 whether it serves: readiness (its store answers) by
    /// default, liveness with --service "". Works over mutual TLS and against --health-listen.
    /// Exit status: 0 SERVING, 1 not serving (says why), 2 could not ask.
    Health(ops::HealthArgs),
    /// What a server is and how it does: its version, whether it and its store serve, the
    /// store's restore epoch (admin role) and when its TLS certificate expires. Exit status: 0
    /// the server and its store serve, 1 one of them does not, 2 could not ask.
    Status(status::StatusArgs),
    /// List a cell's outstanding leases with their age by the server's clock.
    Leases(ops::LeasesArgs),
    /// Sidecar: heal a cell's leases left between the three phases (commit those recorded
    /// locally, roll back stale ones that are not). One reconciler per cell acts at a time.
    ///
    /// Exit status: 0 the pass ran or another reconciler held the lock (--once), or stopped by
    /// SIGINT/SIGTERM; 2 error (bad flags, the cell's database or, with --once, the claims server
    /// unreachable). Without --once a failed pass is logged and retried at the next interval.
    Reconcile(sidecar::ReconcileArgs),
    /// Sidecar: compare a cell's records with the service's claims and correct drift.
    ///
    /// Exit status: 0 the run finished or reached --time-budget with every correction applied
    /// (or a dry run); 1 some corrections failed (the summary's failed=N; they need manual
    /// intervention); 2 error (bad flags or verify source, the cell's database or the claims
    /// server unreachable); 3 stopped because its verification slot was lost (it expired and
    /// another verifier took it; resumable from the saved cursor).
    Verify(sidecar::VerifyArgs),
    /// Administrative actions (admin role): list leases, force-rollback a downed cell's leases,
    /// decommission a cell. Exit status: 0 done, 1 not confirmed, 2 error.
    Admin(admin::AdminArgs),
    /// Write a consistent backup of a SQLite or PostgreSQL store (a SQLite store file), also
    /// while `serve` runs on it. Exit status: 0 written, 1 error (nothing is overwritten).
    Backup(backup::BackupArgs),
    /// Fill a SQLite or PostgreSQL store from a backup (stop `serve` first). Exit status: 0
    /// restored, 1 error. Then follow docs/operations.md, "After a restore".
    Restore(backup::RestoreArgs),
    /// Create a development PKI: a CA, server certificates and client certificates whose
    /// identity is spiffe://TRUST_DOMAIN/ROLE/NAME (see docs/security.md). Exit status: 0
    /// written, 1 error (nothing is overwritten without --force).
    Certs(certs::CertsArgs),
}

#[derive(Args, Debug)]
struct MigrateArgs {
    /// Store URL: memory:, sqlite://PATH (sqlite:///abs/path for an absolute path) or
    /// postgres://USER@HOST:PORT/DB.
    #[arg(
        long,
        env = "TOPOLOGY_CLAIMS_STORE",
        default_value = "sqlite://topology-claims.db"
    )]
    store: String,

    #[command(flatten)]
    store_options: store::StoreOptions,

    /// Spanner stores: create the database (and, on the emulator, its instance) with the whole
    /// schema if it does not exist. For development and the emulator.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CREATE_DATABASE", value_parser = env::switch)]
    create_database: bool,
}

fn main() -> ExitCode {
    env::drop_empty_variables();
    let cli: Cli = env::parse();
    init_logging(cli.log_format == "json");
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if cli.worker_threads > 0 {
        builder.worker_threads(usize::from(cli.worker_threads));
    }
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => serve::run(*args).await,
            Command::Migrate(args) => migrate(args).await,
            Command::Lookup(args) => ops::lookup(args).await,
            Command::Claim(args) => claim_cmd::run(args, false).await,
            Command::Release(args) => claim_cmd::run(args, true).await,
            Command::Watch(args) => watch_cmd::run(args).await,
            Command::Health(args) => ops::health(args).await,
            Command::Status(args) => status::run(args).await,
            Command::Leases(args) => ops::leases(args).await,
            Command::Reconcile(args) => sidecar::reconcile(args).await,
            Command::Verify(args) => sidecar::verify(args).await,
            Command::Admin(args) => admin::run(args).await,
            Command::Certs(args) => certs::run(args),
            Command::Backup(args) => backup::backup(args).await,
            Command::Restore(args) => backup::restore(args).await,
        }
    })
}

/// Logs to stderr (stdout is for results and the `listening on` line), filtered by RUST_LOG;
/// with `json`, one JSON object per line: the event's fields at the top level, and the fields
/// of the span it happened in (a request's id, method, identity and peer) under `span`.
fn init_logging(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .init();
    } else {
        builder.with_ansi(std::io::stderr().is_terminal()).init();
    }
}

async fn migrate(args: MigrateArgs) -> ExitCode {
    let store: StoreUrl = match args.store.parse() {
        Ok(store) => store,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::FAILURE;
        }
    };
    match store::migrate(&store, &args.store_options, args.create_database).await {
        Ok(applied) if applied.is_empty() => {
            println!("schema is up to date");
            ExitCode::SUCCESS
        }
        Ok(applied) => {
            for name in applied {
                println!("applied migration {name}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: migrating {store}: {e}");
            ExitCode::FAILURE
        }
    }
}

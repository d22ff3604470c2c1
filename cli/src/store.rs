//! Store URLs (`--store`): which [`ClaimStore`] adapter to open, and where.
//!
//! The core parses the URL ([`StoreUrl`]); this is the one place that links each scheme to its
//! backend crate: adding a backend is one arm in [`open`] and one in [`migrate`]. Schemas and
//! migrations belong to each backend crate.

use std::sync::Arc;

use std::time::Duration;

use clap::Args;
use topology_claims::memory::MemoryClaimStore;
use topology_claims::{ClaimStore, ClaimsError, MigrationPolicy};
use topology_claims_postgres::{PostgresClaimStore, PostgresOptions};
#[cfg(feature = "spanner")]
use topology_claims_spanner::{SpannerClaimStore, SpannerOptions};
use topology_claims_sqlite::{SqliteClaimStore, SqliteOptions, Synchronous};

use topology_claims::config::{parse_duration, parse_nonzero_duration};

/// Backend knobs, shared by every command that opens a store.
#[derive(Args, Debug, Clone)]
pub struct StoreOptions {
    /// SQLite stores: when a commit reaches the disk. full: every write transaction is fsynced
    /// before its answer, so answered writes survive an OS crash or power loss. normal: fsync
    /// only at checkpoints; faster, still safe against a crash of the server process, but an OS
    /// crash or power loss can lose the last answered writes (decision 073). normal | full.
    #[arg(long, env = "TOPOLOGY_CLAIMS_SQLITE_SYNCHRONOUS", default_value = "full",
          value_parser = ["normal", "full"])]
    pub sqlite_synchronous: String,

    /// PostgreSQL stores: most connections in the pool (size it to the concurrent requests the
    /// server should run against the database; see docs/backends/postgres.md). Each connection's
    /// transaction holds at most 308 entries of PostgreSQL's lock table: keep 308 × the pool
    /// sizes of all servers under max_locks_per_transaction × (max_connections +
    /// max_prepared_transactions), 6,400 by default ("Lock budget" there).
    #[arg(long, env = "TOPOLOGY_CLAIMS_PG_POOL_SIZE", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub pg_pool_size: u32,

    /// PostgreSQL stores: statement_timeout of every connection (0s disables it). Units: ms, s, m.
    #[arg(long, env = "TOPOLOGY_CLAIMS_PG_STATEMENT_TIMEOUT", default_value = "5s",
          value_parser = parse_duration)]
    pub pg_statement_timeout: Duration,

    /// Spanner stores: most sessions open at once (= concurrent store operations of this
    /// process); a request waits up to --spanner-rpc-timeout for a free one.
    #[arg(long, env = "TOPOLOGY_CLAIMS_SPANNER_SESSION_POOL_SIZE", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub spanner_session_pool_size: u32,

    /// Spanner stores: bound on one RPC and on waiting for a session; an unreachable Spanner
    /// makes requests fail UNAVAILABLE after it. Units: ms, s, m; not zero.
    #[arg(long, env = "TOPOLOGY_CLAIMS_SPANNER_RPC_TIMEOUT", default_value = "10s",
          value_parser = parse_nonzero_duration)]
    pub spanner_rpc_timeout: Duration,

    /// Spanner stores: what a commit gets per row it writes, on top of --spanner-rpc-timeout,
    /// since Spanner's work on a commit grows with its size (a group of 3,000 rows: 10s + 15s);
    /// at most the 30s transaction deadline (or --spanner-rpc-timeout, if longer). 0s: every
    /// commit gets --spanner-rpc-timeout. Units: ms, s, m.
    #[arg(long, env = "TOPOLOGY_CLAIMS_SPANNER_COMMIT_TIME_PER_ROW", default_value = "5ms",
          value_parser = parse_duration)]
    pub spanner_commit_time_per_row: Duration,
}

impl StoreOptions {
    #[cfg(feature = "spanner")]
    fn spanner(&self) -> SpannerOptions {
        SpannerOptions {
            session_pool_size: self.spanner_session_pool_size as usize,
            rpc_timeout: self.spanner_rpc_timeout,
            commit_time_per_row: self.spanner_commit_time_per_row,
            ..SpannerOptions::default()
        }
    }

    fn sqlite(&self) -> SqliteOptions {
        SqliteOptions {
            synchronous: if self.sqlite_synchronous == "normal" {
                Synchronous::Normal
            } else {
                Synchronous::Full
            },
        }
    }

    fn postgres(&self) -> PostgresOptions {
        PostgresOptions {
            pool_size: self.pg_pool_size as usize,
            statement_timeout: self.pg_statement_timeout,
            ..PostgresOptions::default()
        }
    }
}

/// The store URL (parsed by the core) with what this binary does with it.
pub use topology_claims::config::StoreUrl;

#[cfg(not(feature = "spanner"))]
fn without_spanner() -> ClaimsError {
    ClaimsError::Configuration {
        message: "store scheme spanner:// is not supported by this build (built without the \
                  `spanner` feature)"
            .into(),
    }
}

/// Opens the store `url` names; pending schema migrations are applied or refused per `policy`.
pub async fn open(
    url: &StoreUrl,
    policy: MigrationPolicy,
    options: &StoreOptions,
) -> Result<Arc<dyn ClaimStore>, ClaimsError> {
    Ok(match url {
        StoreUrl::Memory => Arc::new(MemoryClaimStore::new()),
        StoreUrl::Sqlite(path) => {
            let options = options.sqlite();
            if options.synchronous == Synchronous::Normal {
                tracing::warn!(
                    store = %path.display(),
                    "--sqlite-synchronous normal: commits reach the disk only at checkpoints; \
                     an OS crash or power loss can lose the last acknowledged writes (begun \
                     leases, commits, rollbacks), and cells then act on answers the store no \
                     longer has"
                );
            }
            Arc::new(SqliteClaimStore::open_with_options(path, options, policy).await?)
        }
        StoreUrl::Postgres(url) => {
            Arc::new(PostgresClaimStore::connect(url, options.postgres(), policy).await?)
        }
        #[cfg(feature = "spanner")]
        StoreUrl::Spanner(url) => {
            Arc::new(SpannerClaimStore::connect(url, options.spanner(), policy).await?)
        }
        #[cfg(not(feature = "spanner"))]
        StoreUrl::Spanner(_) => return Err(without_spanner()),
    })
}

/// Applies pending schema migrations; returns the names of those applied.
/// `create_database` (spanner:// only) creates the database, and on the emulator its
/// instance, first.
pub async fn migrate(
    url: &StoreUrl,
    options: &StoreOptions,
    create_database: bool,
) -> Result<Vec<String>, ClaimsError> {
    match url {
        #[cfg(feature = "spanner")]
        StoreUrl::Spanner(url) => {
            topology_claims_spanner::migrate(url, options.spanner(), create_database).await
        }
        _ if create_database => Err(ClaimsError::Configuration {
            message: "--create-database is for spanner:// stores (SQLite creates its file; \
                          create a PostgreSQL database with createdb)"
                .into(),
        }),
        // Nothing persists, so there is no schema to migrate.
        StoreUrl::Memory => Ok(Vec::new()),
        StoreUrl::Sqlite(path) => topology_claims_sqlite::migrate(path).await,
        StoreUrl::Postgres(url) => {
            topology_claims_postgres::migrate_with(url, &options.postgres()).await
        }
        #[cfg(not(feature = "spanner"))]
        StoreUrl::Spanner(_) => Err(without_spanner()),
    }
}

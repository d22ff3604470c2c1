//! Store URLs (`--store`): which [`ClaimStore`] adapter to open, and where.
//!
//! One enum arm per scheme; adding a backend (`postgres://`, `spanner://`) is one arm here plus
//! its `open` / `migrate` lines. Owns URL parsing and adapter selection only: schemas and
//! migrations belong to each backend crate.
//!
//! Store URLs may carry credentials (`postgres://user:password@host/db`): they are parsed after
//! clap (so a rejected value is not echoed) and `Display` must never print a password.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use std::time::Duration;

use clap::Args;
use topology_claims::memory::MemoryClaimStore;
use topology_claims::{ClaimStore, ClaimsError, MigrationPolicy};
use topology_claims_postgres::{PostgresClaimStore, PostgresOptions};
#[cfg(feature = "spanner")]
use topology_claims_spanner::{SpannerClaimStore, SpannerOptions};
use topology_claims_sqlite::SqliteClaimStore;

use crate::duration::parse_duration;

/// What `--store` accepts, for messages.
pub const SUPPORTED: &str = "memory: (in-process, lost on exit), sqlite://PATH (a file; \
     sqlite://relative/path.db or sqlite:///absolute/path.db), postgres://USER@HOST:PORT/DB \
     (also postgresql://, ?host=/var/run/postgresql for a socket) and \
     spanner://projects/P/instances/I/databases/D";

/// Schemes this binary knows but was built without (`--no-default-features`).
const PLANNED: &[&str] = if cfg!(feature = "spanner") {
    &[]
} else {
    &["spanner"]
};

/// Backend knobs, shared by every command that opens a store.
#[derive(Args, Debug, Clone)]
pub struct StoreOptions {
    /// PostgreSQL stores: most connections in the pool (size it to the concurrent requests the
    /// server should run against the database; see docs/backends/postgres.md).
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
          value_parser = crate::duration::parse_nonzero_duration)]
    pub spanner_rpc_timeout: Duration,
}

impl StoreOptions {
    #[cfg(feature = "spanner")]
    fn spanner(&self) -> SpannerOptions {
        SpannerOptions {
            session_pool_size: self.spanner_session_pool_size as usize,
            rpc_timeout: self.spanner_rpc_timeout,
            ..SpannerOptions::default()
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

/// A parsed `--store` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreUrl {
    /// `memory:`: the in-memory reference store.
    Memory,
    /// `sqlite://PATH`: a SQLite database file.
    Sqlite(PathBuf),
    /// `postgres://…`, verbatim for the driver; may hold a password, so never displayed as is.
    Postgres(String),
    /// `spanner://projects/P/instances/I/databases/D` (holds no secret).
    #[cfg(feature = "spanner")]
    Spanner(String),
}

#[cfg(feature = "spanner")]
fn parse_spanner(url: &str) -> Option<Result<StoreUrl, String>> {
    url.starts_with(topology_claims_spanner::URL_SCHEME)
        .then(|| {
            topology_claims_spanner::DatabaseName::parse(url)
                .map(|_| StoreUrl::Spanner(url.to_owned()))
                .map_err(|e| e.to_string())
        })
}

#[cfg(not(feature = "spanner"))]
fn parse_spanner(_: &str) -> Option<Result<StoreUrl, String>> {
    None
}

impl FromStr for StoreUrl {
    type Err = String;

    fn from_str(url: &str) -> Result<Self, String> {
        if url == "memory:" || url == "memory://" {
            return Ok(Self::Memory);
        }
        if let Some(path) = url.strip_prefix("sqlite://") {
            if path.is_empty() {
                return Err(format!(
                    "store URL {url:?} has no file path; use sqlite://PATH, e.g. sqlite://topology-claims.db"
                ));
            }
            return Ok(Self::Sqlite(PathBuf::from(path)));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Self::Postgres(url.to_owned()));
        }
        if let Some(parsed) = parse_spanner(url) {
            return parsed;
        }
        // Only the scheme is echoed: the rest of a database URL may hold a password.
        match url.split_once(':') {
            Some((scheme @ ("memory" | "sqlite"), _)) => {
                Err(format!("malformed {scheme} store URL; supported: {SUPPORTED}"))
            }
            Some((scheme, _)) if PLANNED.contains(&scheme) => Err(format!(
                "store scheme {scheme}:// is not supported by this build yet; supported: {SUPPORTED}"
            )),
            Some((scheme, _)) if !scheme.is_empty() && !scheme.contains('/') => Err(format!(
                "unknown store scheme {scheme:?}; supported: {SUPPORTED}"
            )),
            _ => Err(format!("store URL without a scheme; supported: {SUPPORTED}")),
        }
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Memory => f.write_str("memory:"),
            Self::Sqlite(path) => write!(f, "sqlite://{}", path.display()),
            Self::Postgres(url) => f.write_str(&topology_claims_postgres::redacted_url(url)),
            #[cfg(feature = "spanner")]
            Self::Spanner(url) => f.write_str(url),
        }
    }
}

impl StoreUrl {
    /// Opens the store; pending schema migrations are applied or refused per `policy`.
    pub async fn open(
        &self,
        policy: MigrationPolicy,
        options: &StoreOptions,
    ) -> Result<Arc<dyn ClaimStore>, ClaimsError> {
        Ok(match self {
            Self::Memory => Arc::new(MemoryClaimStore::new()),
            Self::Sqlite(path) => Arc::new(SqliteClaimStore::open(path, policy).await?),
            Self::Postgres(url) => {
                Arc::new(PostgresClaimStore::connect(url, options.postgres(), policy).await?)
            }
            #[cfg(feature = "spanner")]
            Self::Spanner(url) => {
                Arc::new(SpannerClaimStore::connect(url, options.spanner(), policy).await?)
            }
        })
    }

    /// Applies pending schema migrations; returns the names of those applied.
    /// `create_database` (spanner:// only) creates the database, and on the emulator its
    /// instance, first.
    pub async fn migrate(
        &self,
        options: &StoreOptions,
        create_database: bool,
    ) -> Result<Vec<String>, ClaimsError> {
        match self {
            #[cfg(feature = "spanner")]
            Self::Spanner(url) => {
                topology_claims_spanner::migrate(url, options.spanner(), create_database).await
            }
            _ if create_database => Err(ClaimsError::Configuration {
                message: "--create-database is for spanner:// stores (SQLite creates its file; \
                          create a PostgreSQL database with createdb)"
                    .into(),
            }),
            // Nothing persists, so there is no schema to migrate.
            Self::Memory => Ok(Vec::new()),
            Self::Sqlite(path) => topology_claims_sqlite::migrate(path).await,
            Self::Postgres(url) => {
                topology_claims_postgres::migrate_with(url, &options.postgres()).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_and_sqlite_urls_are_understood() {
        assert_eq!("memory:".parse(), Ok(StoreUrl::Memory));
        assert_eq!(
            "sqlite://claims.db".parse(),
            Ok(StoreUrl::Sqlite("claims.db".into()))
        );
        assert_eq!(
            "sqlite://data/claims.db".parse(),
            Ok(StoreUrl::Sqlite("data/claims.db".into()))
        );
        assert_eq!(
            "sqlite:///var/lib/claims.db".parse(),
            Ok(StoreUrl::Sqlite("/var/lib/claims.db".into()))
        );
    }

    #[test]
    fn sqlite_url_without_a_path_is_refused() {
        let error = "sqlite://".parse::<StoreUrl>().unwrap_err();
        assert!(error.contains("no file path"), "{error}");
    }

    #[test]
    fn postgres_urls_are_understood_and_displayed_without_the_password() {
        let url: StoreUrl = "postgres://admin:hunter2@db/claims".parse().unwrap();
        assert_eq!(
            url,
            StoreUrl::Postgres("postgres://admin:hunter2@db/claims".into())
        );
        assert_eq!(url.to_string(), "postgres://admin@db:5432/claims");
        assert!(matches!(
            "postgresql://u@h/d".parse(),
            Ok(StoreUrl::Postgres(_))
        ));
    }

    #[test]
    #[cfg(feature = "spanner")]
    fn spanner_urls_are_understood_and_checked() {
        let url = "spanner://projects/p/instances/i/databases/d";
        assert_eq!(url.parse(), Ok(StoreUrl::Spanner(url.to_owned())));
        assert!("spanner://projects/p".parse::<StoreUrl>().is_err());
    }

    #[test]
    #[cfg(not(feature = "spanner"))]
    fn spanner_is_named_as_missing_from_this_build() {
        let error = "spanner://projects/p/instances/i/databases/d"
            .parse::<StoreUrl>()
            .unwrap_err();
        assert!(error.contains("spanner://"), "{error}");
    }

    #[test]
    fn unknown_schemes_and_bare_paths_list_the_supported_ones() {
        for bad in [
            "mysql://x",
            "claims.db",
            "/tmp/claims.db",
            "",
            "sqlite:claims.db",
            "memory:x",
        ] {
            let error = bad.parse::<StoreUrl>().unwrap_err();
            assert!(error.contains("supported: memory:"), "{bad}: {error}");
        }
    }

    #[test]
    fn display_round_trips() {
        for url in ["memory:", "sqlite://claims.db", "sqlite:///abs/claims.db"] {
            assert_eq!(url.parse::<StoreUrl>().unwrap().to_string(), url);
        }
    }
}

//! The bench's PostgreSQL housekeeping: fresh schemas of its own and their removal, VACUUM
//! ANALYZE between groups, the settings that decide its numbers, and the warning when a run
//! would need more sessions than the server allows.
//!
//! Owns talking to PostgreSQL about the run; the statements measured live in `raw_sql` and the
//! adapter.

use std::time::Duration;

use serde_json::json;
use topology_claims::config::StoreUrl;
use topology_claims_harness::postgres::quote_ident;
use topology_claims_postgres::PostgresOptions;

use super::raw_sql;
use super::systems::PgSchema;
use super::{BenchArgs, TlsMode};

pub async fn drop_schema(pg: &PgSchema) -> Result<(), String> {
    let client = topology_claims_harness::postgres::connect(&pg.url).await?;
    topology_claims_harness::postgres::drop_schema(&client, &pg.schema).await
}

/// `VACUUM ANALYZE` of the adapter's tables in a bench schema (one statement per call: VACUUM
/// cannot run inside the implicit transaction of a multi-statement query).
pub async fn vacuum_schema(pg: &PgSchema) -> Result<(), String> {
    let config = topology_claims_postgres::tokio_postgres::Config::from_str_url(&pg.url)?;
    let client = raw_sql::connect(&config).await?;
    let schema = quote_ident(&pg.schema);
    for table in ["claims", "leases", "lease_outcomes"] {
        client
            .batch_execute(&format!("VACUUM ANALYZE {schema}.{table}"))
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// What autovacuum would do (it is off on the bench's PostgreSQL), for every schema: the dead
/// row versions of the last segments go and statistics are fresh, so no segment pays for the
/// ones before it. Unmeasured; a failure is a warning, not the end of a long run.
pub async fn vacuum_schemas<'a>(schemas: impl IntoIterator<Item = &'a PgSchema>) {
    for pg in schemas {
        if let Err(e) = vacuum_schema(pg).await {
            eprintln!("warning: VACUUM ANALYZE of {} failed: {e}", pg.schema);
        }
    }
}

/// The PostgreSQL settings that decide its numbers (durability, maintenance, memory).
pub async fn postgres_settings(url: &str) -> serde_json::Value {
    let read = async {
        let config = topology_claims_postgres::tokio_postgres::Config::from_str_url(url)?;
        let client = raw_sql::connect(&config).await?;
        let rows = client
            .query(
                "SELECT name, setting FROM pg_settings WHERE name = ANY($1)",
                &[&vec![
                    "server_version",
                    "fsync",
                    "synchronous_commit",
                    "autovacuum",
                    "shared_buffers",
                    "max_connections",
                    "wal_level",
                ]],
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(
            rows.iter()
                .filter_map(|row| {
                    Some((
                        row.try_get::<_, String>(0).ok()?,
                        json!(row.try_get::<_, String>(1).ok()?),
                    ))
                })
                .collect::<serde_json::Map<_, _>>(),
        )
    };
    read.await
        .map(serde_json::Value::Object)
        .unwrap_or_else(|e| json!({ "error": e }))
}

/// The `--pg-pool-size` of a `serve` command line (its last one), else the product's default.
pub fn pg_pool_size(args: &[String]) -> u64 {
    let mut size = PostgresOptions::default().pool_size as u64;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let value = match arg.strip_prefix("--pg-pool-size") {
            Some("") => args.next().map(String::as_str),
            Some(rest) => rest.strip_prefix('='),
            None => None,
        };
        if let Some(n) = value.and_then(|v| v.parse().ok()) {
            size = n;
        }
    }
    size
}

/// Warns when the run's PostgreSQL sessions at their peak (every PostgreSQL server's full pool,
/// which it keeps for the whole run, plus a raw-SQL baseline's connection per client, plus the
/// bench's own) do not fit in `max_connections` beside the sessions already open: a segment
/// would then fail with "too many clients" part-way through a long run.
pub async fn warn_about_postgres_connections(args: &BenchArgs, url: &str) {
    let base: Vec<String> = args.serve_args.clone();
    let variants: Vec<Vec<String>> = if args.serve_variants.is_empty() {
        vec![base.clone()]
    } else {
        args.serve_variants
            .iter()
            .map(|v| base.iter().chain(&v.args).cloned().collect())
            .collect()
    };
    let tls_copies = if args.tls == TlsMode::Both { 2 } else { 1 };
    let pools: u64 = args.store.iter().filter(|u| is_postgres(u)).count() as u64
        * tls_copies
        * variants.iter().map(|a| pg_pool_size(a)).sum::<u64>();
    let raw_sql = if args.baselines.iter().any(|b| b.sql_mode().is_some()) {
        if args.open.any(args.slo.slo) {
            u64::from(args.open.max_in_flight)
        } else {
            args.clients.iter().copied().max().unwrap_or(0) as u64
        }
    } else {
        0
    };
    // The CPU reader's session and the one that vacuums between groups.
    let needed = pools + raw_sql + 2;
    let read = async {
        let config = topology_claims_postgres::tokio_postgres::Config::from_str_url(url)?;
        let client = raw_sql::connect(&config).await?;
        let row = client
            .query_one(
                "SELECT current_setting('max_connections')::bigint, \
                        (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')",
                &[],
            )
            .await
            .map_err(|e| e.to_string())?;
        // Less this session, which closes before the servers start.
        Ok::<_, String>((row.get::<_, i64>(0), row.get::<_, i64>(1) - 1))
    };
    match read.await {
        Ok((max, open)) if needed as i64 + open > max => eprintln!(
            "warning: this run needs up to {needed} PostgreSQL sessions ({pools} in the servers' \
             pools, {raw_sql} for a raw-SQL baseline, 2 of the bench's), {open} are open already \
             and max_connections is {max}: segments may fail with \"too many clients\""
        ),
        Ok(_) => {}
        Err(e) => eprintln!("warning: cannot count PostgreSQL sessions: {e}"),
    }
}

/// `from_str` with the error as a message that never echoes the URL (it may hold a password).
pub trait FromStrUrl: Sized {
    fn from_str_url(url: &str) -> Result<Self, String>;
}

impl FromStrUrl for topology_claims_postgres::tokio_postgres::Config {
    fn from_str_url(url: &str) -> Result<Self, String> {
        url.parse().map_err(|e| {
            format!(
                "invalid PostgreSQL URL {}: {e}",
                topology_claims_postgres::redacted_url(url)
            )
        })
    }
}

pub fn is_postgres(url: &str) -> bool {
    matches!(url.parse(), Ok(StoreUrl::Postgres(_)))
}

/// A schema of the bench's own with the adapter's tables.
pub async fn fresh_schema(url: &str, name: String) -> Result<PgSchema, String> {
    let options = PostgresOptions {
        schema: Some(name.clone()),
        ..Default::default()
    };
    topology_claims_postgres::migrate_with(url, &options)
        .await
        .map_err(|e| format!("preparing PostgreSQL schema {name}: {e}"))?;
    Ok(PgSchema {
        url: url.to_owned(),
        schema: name,
    })
}

/// `--variant-sql NAME=SQL`, repeatable.
#[derive(clap::Args, Debug, Clone)]
pub struct VariantSql {
    /// `NAME=SQL`: right after the schema of --serve-variant NAME is made (its tables empty, its
    /// server not started yet) run SQL in it on PostgreSQL, e.g. `--serve-variant feed=
    /// --serve-variant no-feed= --variant-sql 'no-feed=ALTER TABLE claims DISABLE TRIGGER USER'`:
    /// what the change feed's triggers cost, A/B in one run. Repeatable.
    #[arg(long = "variant-sql", env = "TOPOLOGY_CLAIMS_BENCH_VARIANT_SQL")]
    pub statements: Vec<String>,
}

impl VariantSql {
    /// Runs the SQL given for `variant` in `pg`'s schema (nothing without a variant or SQL).
    pub async fn run(&self, variant: Option<&String>, pg: &PgSchema) -> Result<(), String> {
        let Some(variant) = variant else {
            return Ok(());
        };
        for (_, sql) in self
            .statements
            .iter()
            .filter_map(|s| s.split_once('='))
            .filter(|(name, _)| name == variant)
        {
            let client = topology_claims_harness::postgres::connect(&pg.url).await?;
            let statement = format!("SET search_path TO {}; {sql}", quote_ident(&pg.schema));
            client
                .batch_execute(&statement)
                .await
                .map_err(|e| format!("--variant-sql {variant}: {e}"))?;
            eprintln!("bench: {variant}: ran {sql:?} in {}", pg.schema);
        }
        Ok(())
    }
}

/// Whether PostgreSQL answers at `url` (for the smoke run's choice).
pub async fn postgres_reachable(url: &str) -> Result<(), String> {
    let config = topology_claims_postgres::tokio_postgres::Config::from_str_url(url)?;
    let client = tokio::time::timeout(Duration::from_secs(5), raw_sql::connect(&config))
        .await
        .map_err(|_| "no answer within 5s".to_owned())??;
    client
        .simple_query("SELECT 1")
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_size_is_the_last_one_given_else_the_default() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let default = PostgresOptions::default().pool_size as u64;
        assert_eq!(pg_pool_size(&[]), default);
        assert_eq!(pg_pool_size(&args(&["--pg-pool-size=8"])), 8);
        assert_eq!(
            pg_pool_size(&args(&["--pg-pool-size", "8", "--pg-pool-size=32"])),
            32
        );
        assert_eq!(pg_pool_size(&args(&["--group-max=4"])), default);
    }
}

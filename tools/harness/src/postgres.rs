//! PostgreSQL for tests and tools: where the test server is, and temporary schemas.
//!
//! A temporary schema is named `<prefix><unix seconds>_<random hex>`, always quoted in SQL, and
//! dropped by its owner; schemas of the same prefix left behind by a killed run are swept by the
//! next one once they are older than the caller says.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_postgres::{Client, NoTls};

use topology_claims::config::redact_url as redact;

use crate::with_causes;

/// The test server's URL (`TOPOLOGY_CLAIMS_TEST_POSTGRES_URL`).
pub const URL_ENV: &str = "TOPOLOGY_CLAIMS_TEST_POSTGRES_URL";
/// Its default: the machine's PostgreSQL, database `test` (scripts/ensure-services.sh).
pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// `$TOPOLOGY_CLAIMS_TEST_POSTGRES_URL`, else [`DEFAULT_URL`].
pub fn test_url() -> String {
    std::env::var(URL_ENV).unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// `name` as a quoted SQL identifier (`"a""b"` for `a"b`).
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A fresh, unique schema name with `prefix` (not created).
pub fn schema_name(prefix: &str) -> String {
    format!("{prefix}{}_{:016x}", unix_seconds(), fastrand::u64(..))
}

/// One connection to `url` (its I/O driven on a spawned task), within 10 s.
pub async fn connect(url: &str) -> Result<Client, String> {
    let connected =
        tokio::time::timeout(Duration::from_secs(10), tokio_postgres::connect(url, NoTls))
            .await
            .map_err(|_| format!("no answer from PostgreSQL at {} within 10s", redact(url)))?;
    let (client, connection) = connected.map_err(|e| {
        format!(
            "cannot connect to PostgreSQL at {}: {}",
            redact(url),
            with_causes(&e)
        )
    })?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// Creates schema `name`.
pub async fn create_schema(client: &Client, name: &str) -> Result<(), String> {
    client
        .batch_execute(&format!("CREATE SCHEMA {}", quote_ident(name)))
        .await
        .map_err(|e| format!("creating PostgreSQL schema {name}: {}", with_causes(&e)))
}

/// Drops schema `name` and everything in it (quietly: PostgreSQL's NOTICE lists every object).
pub async fn drop_schema(client: &Client, name: &str) -> Result<(), String> {
    client
        .batch_execute(&format!(
            "SET client_min_messages = warning; DROP SCHEMA IF EXISTS {} CASCADE",
            quote_ident(name)
        ))
        .await
        .map_err(|e| format!("dropping PostgreSQL schema {name}: {}", with_causes(&e)))
}

/// Drops the schemas named by [`schema_name`]`(prefix)` that are older than `older_than` (best
/// effort: a failure leaves them for the next sweep).
pub async fn sweep_stale_schemas(client: &Client, prefix: &str, older_than: Duration) {
    let Ok(rows) = client
        .query(
            "SELECT nspname::text FROM pg_namespace WHERE starts_with(nspname, $1)",
            &[&prefix],
        )
        .await
    else {
        return;
    };
    let now = unix_seconds();
    for row in rows {
        let Ok(name) = row.try_get::<_, String>(0) else {
            continue;
        };
        let created = name
            .strip_prefix(prefix)
            .and_then(|rest| rest.split('_').next())
            .and_then(|secs| secs.parse::<u64>().ok());
        if created.is_some_and(|secs| now.saturating_sub(secs) > older_than.as_secs()) {
            let _ = drop_schema(client, &name).await;
        }
    }
}

/// `url` whose sessions use `schema` as their search_path and carry `application_name` (so a
/// run's backends can be told apart). URL (`postgres://…`) or key=value form. Refuses a URL that
/// sets either already: two settings would silently fight.
pub fn url_with_search_path(
    url: &str,
    schema: &str,
    application_name: &str,
) -> Result<String, String> {
    if url.contains("options=") || url.contains("application_name=") {
        return Err(
            "the search_path and application_name are set here; remove `options` and \
             `application_name` from the PostgreSQL URL"
                .into(),
        );
    }
    let plain = |s: &str| {
        s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    if !plain(schema) || !plain(application_name) {
        return Err(format!(
            "schema {schema:?} and application name {application_name:?} must be plain identifiers"
        ));
    }
    Ok(
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let separator = if url.contains('?') { '&' } else { '?' };
            format!(
            "{url}{separator}options=-c%20search_path%3D{schema}&application_name={application_name}"
        )
        } else {
            format!("{url} options='-c search_path={schema}' application_name={application_name}")
        },
    )
}

/// A schema of its own on a PostgreSQL server, for one test or one tool run. Drop it with
/// [`TempSchema::drop`] (async); a run killed before that leaves it to the next sweep.
pub struct TempSchema {
    pub admin_url: String,
    pub name: String,
}

impl TempSchema {
    /// Creates `<prefix><secs>_<random>` on the server at `admin_url`, after sweeping this
    /// prefix's schemas older than `stale_after`.
    pub async fn create(
        admin_url: &str,
        prefix: &str,
        stale_after: Duration,
    ) -> Result<TempSchema, String> {
        let client = connect(admin_url).await?;
        sweep_stale_schemas(&client, prefix, stale_after).await;
        let name = schema_name(prefix);
        create_schema(&client, &name).await?;
        Ok(TempSchema {
            admin_url: admin_url.to_owned(),
            name,
        })
    }

    /// The admin URL whose sessions work in this schema.
    pub fn url(&self, application_name: &str) -> Result<String, String> {
        url_with_search_path(&self.admin_url, &self.name, application_name)
    }

    /// Drops the schema and everything in it.
    pub async fn drop(self) -> Result<(), String> {
        let client = connect(&self.admin_url).await?;
        drop_schema(&client, &self.name).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("tc_1"), "\"tc_1\"");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }

    #[test]
    fn search_path_goes_into_either_url_form() {
        assert_eq!(
            url_with_search_path("postgres://u@h/d", "tc_bench_1", "tc-bench-1").unwrap(),
            "postgres://u@h/d?options=-c%20search_path%3Dtc_bench_1&application_name=tc-bench-1"
        );
        assert_eq!(
            url_with_search_path("postgres://u@/d?host=/run/pg", "s", "a").unwrap(),
            "postgres://u@/d?host=/run/pg&options=-c%20search_path%3Ds&application_name=a"
        );
        assert_eq!(
            url_with_search_path("host=/run/pg dbname=d", "s", "a").unwrap(),
            "host=/run/pg dbname=d options='-c search_path=s' application_name=a"
        );
        assert!(url_with_search_path("postgres://u@h/d?options=-c%20x%3D1", "s", "a").is_err());
        assert!(url_with_search_path("postgres://u@h/d", "Bad Name", "a").is_err());
    }

    #[test]
    fn schema_names_carry_their_prefix_and_age() {
        let name = schema_name("tc_test_");
        let secs: u64 = name["tc_test_".len()..]
            .split('_')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(secs > 1_700_000_000);
    }
}

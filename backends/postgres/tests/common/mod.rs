//! Shared set-up of the PostgreSQL tests: where the server is, what happens when it is not
//! there, and a fresh schema per store so tests run in parallel on one database.
//!
//! The server is read from `TOPOLOGY_CLAIMS_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`). When it cannot be reached: with `CI=true` the test
//! fails; otherwise one line `postgres tests skipped: <why>` is printed and the test returns.
#![allow(dead_code)] // each test binary uses a different part of this module

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_postgres::Client;
use topology_claims::{ClaimsError, MigrationPolicy};
use topology_claims_harness::postgres as pg;
pub use topology_claims_harness::postgres::URL_ENV;
use topology_claims_postgres::{
    ensure_local_schema, PostgresClaimStore, PostgresLocalLeaseStore, PostgresOptions,
};

/// Test schemas are named `tc_test_<unix seconds>_<random>`; those older than this are dropped
/// by the next run, so the database does not grow forever.
const SCHEMA_PREFIX: &str = "tc_test_";
const STALE_AFTER: Duration = Duration::from_secs(3600);

pub fn url() -> String {
    pg::test_url()
}

/// An admin connection to the test server, or `None` when the tests must be skipped (after
/// printing why). Panics in CI: an unreachable PostgreSQL fails the run there.
pub async fn admin() -> Option<Client> {
    let url = url();
    let why = match pg::connect(&url).await {
        Ok(client) => {
            sweep_stale_schemas(&client).await;
            return Some(client);
        }
        Err(why) => format!("{URL_ENV}: {why}"),
    };
    if topology_claims_harness::in_ci() {
        panic!("PostgreSQL is required when CI=true: {why}");
    }
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        // Straight to the process's stdout: the test harness captures println! of passing tests.
        let mut out = std::io::stdout();
        let _ = writeln!(out, "postgres tests skipped: {why}");
        let _ = out.flush();
    }
    None
}

/// For the shared conformance macros, whose factories must return a store: when PostgreSQL is
/// not there (outside CI), say so once and end this test process successfully.
pub fn skip_process() -> ! {
    std::process::exit(0)
}

/// A fresh, unique schema name (not yet created).
pub fn fresh_schema_name() -> String {
    pg::schema_name(SCHEMA_PREFIX)
}

/// Options for a test store in its own `schema`.
pub fn options(schema: &str) -> PostgresOptions {
    PostgresOptions {
        schema: Some(schema.to_owned()),
        pool_size: 4,
        ..Default::default()
    }
}

/// A migrated store in a fresh schema, or `None` (skipped).
pub async fn fresh_store() -> Option<(PostgresClaimStore, String)> {
    fresh_store_with(|options| options).await
}

/// Like [`fresh_store`], with the options adjusted by `adjust`.
pub async fn fresh_store_with(
    adjust: impl FnOnce(PostgresOptions) -> PostgresOptions,
) -> Option<(PostgresClaimStore, String)> {
    admin().await?;
    let schema = fresh_schema_name();
    let store =
        PostgresClaimStore::connect(&url(), adjust(options(&schema)), MigrationPolicy::Apply)
            .await
            .unwrap_or_else(|e| panic!("open a store in schema {schema}: {e}"));
    Some((store, schema))
}

/// A local lease store with its tables (`LOCAL_LEASES_DDL`) in a fresh schema, plus the admin
/// connection and the schema name, or `None` (skipped).
pub async fn fresh_local_store() -> Option<(Client, String, PostgresLocalLeaseStore)> {
    let admin = admin().await?;
    let schema = fresh_schema_name();
    let store = PostgresLocalLeaseStore::connect(&url(), options(&schema))
        .await
        .unwrap_or_else(|e| panic!("open a local lease store in schema {schema}: {e}"));
    let client = store.pool().get().await.expect("a pooled connection");
    ensure_local_schema(&**client)
        .await
        .expect("create leases_outstanding");
    drop(client);
    Some((admin, schema, store))
}

/// Drops a test schema (best effort: a leftover is swept by a later run).
pub async fn drop_schema(admin: &Client, schema: &str) {
    let _ = pg::drop_schema(admin, schema).await;
}

/// Drops test schemas older than an hour, once per test process.
async fn sweep_stale_schemas(client: &Client) {
    static SWEPT: AtomicBool = AtomicBool::new(false);
    if !SWEPT.swap(true, Ordering::Relaxed) {
        pg::sweep_stale_schemas(client, SCHEMA_PREFIX, STALE_AFTER).await;
    }
}

/// A test-side error as the core's error type.
pub fn test_error(e: impl std::fmt::Display) -> ClaimsError {
    ClaimsError::internal(e.to_string())
}

/// `op`'s answer and the round trips `store` counted while it ran (the table in `store.rs`).
pub async fn trips<T>(
    store: &PostgresClaimStore,
    op: impl std::future::Future<Output = T>,
) -> (T, u64) {
    let before = store.round_trips();
    let out = op.await;
    (out, store.round_trips() - before)
}

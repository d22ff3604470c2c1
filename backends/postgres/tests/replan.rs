//! A store opened on an empty database must not keep the plans PostgreSQL made for empty tables
//! as the tables grow (decision 120): a pooled connection drops its cached plans every
//! `REPLAN_EVERY` uses. Shown on a private cluster with `pg_stat_statements`, in table and index
//! pages read per execution (not time): BeginUpdate's read of its claims scans the whole
//! `claims` table under the plan made when the table was empty, and reads a few index pages
//! once the connection has planned again.
#![cfg(unix)]

use tokio_postgres::Client;
use topology_claims::{ClaimStore, MigrationPolicy};
use topology_claims_harness::postgres as pg;
use topology_claims_harness::private_postgres::PrivatePostgres;
use topology_claims_postgres::baseline::SELECT_CLAIMS_FOR_UPDATE;
use topology_claims_postgres::{PostgresClaimStore, PostgresOptions, REPLAN_EVERY};
use topology_claims_testkit::fixtures::{cell, creates, username};

/// Executions, plans made, and pages read per execution of BeginUpdate's claims read since the
/// last reset.
async fn claims_read(admin: &Client) -> (i64, i64, f64) {
    let row = admin
        .query_one(
            "SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(plans), 0)::bigint, \
             coalesce(sum(shared_blks_hit + shared_blks_read), 0)::float8 \
             FROM pg_stat_statements WHERE query = $1",
            &[&SELECT_CLAIMS_FOR_UPDATE],
        )
        .await
        .expect("read pg_stat_statements");
    let (calls, plans, pages): (i64, i64, f64) = (row.get(0), row.get(1), row.get(2));
    (calls, plans, pages / (calls.max(1) as f64))
}

async fn reset(admin: &Client) {
    admin
        .execute("SELECT pg_stat_statements_reset()", &[])
        .await
        .expect("reset pg_stat_statements");
}

/// `n` BeginUpdate + CommitUpdate pairs of one new username each.
async fn pairs(store: &PostgresClaimStore, from: usize, n: usize) {
    let a = cell("cell-a");
    for i in from..from + n {
        let lease = store
            .begin_update(creates(&a, &[username(&format!("user-{i}"))]))
            .await
            .expect("BeginUpdate");
        store
            .commit_update(&a, lease.lease_id)
            .await
            .expect("CommitUpdate");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_made_on_an_empty_store_are_made_again_as_it_grows() {
    let cluster = match tokio::task::block_in_place(|| {
        PrivatePostgres::start_with_settings("shared_preload_libraries = 'pg_stat_statements'")
    }) {
        Ok(cluster) => cluster,
        Err(why) if !topology_claims_harness::in_ci() => {
            println!("replan test skipped: no private PostgreSQL: {why}");
            return;
        }
        Err(why) => panic!("CI=true needs a private PostgreSQL cluster: {why}"),
    };
    let url = cluster.url();
    let admin = pg::connect(&url)
        .await
        .expect("connect to the private cluster");
    admin
        .batch_execute("CREATE EXTENSION pg_stat_statements")
        .await
        .expect("pg_stat_statements");
    // One connection, so every pair below uses the same one and its plan cache.
    let options = PostgresOptions {
        pool_size: 1,
        ..PostgresOptions::default()
    };
    let store = PostgresClaimStore::connect(&url, options, MigrationPolicy::Apply)
        .await
        .expect("open the store");

    // Planned while `claims` is empty, then 20,000 claims arrive (a bulk load, another server).
    pairs(&store, 0, 10).await;
    admin
        .batch_execute(
            "INSERT INTO claims (claim_type, claim_value, owner_type, owner_value, table_name, \
             table_record_id, cell_id, created_at, updated_at) \
             SELECT 2, 'bulk-' || g, 1, g::text, 1, g, 'cell-z', now(), now() \
             FROM generate_series(1, 20000) AS g",
        )
        .await
        .expect("load 20,000 claims");
    reset(&admin).await;
    pairs(&store, 10, 10).await;
    let (calls, _, stale) = claims_read(&admin).await;
    assert_eq!(
        calls, 10,
        "BeginUpdate's claims read, executed once per pair"
    );
    // The plan made for an empty table reads the whole table: ~150 pages of 20,000 rows.
    assert!(
        stale > 50.0,
        "the plan made on an empty table should scan the table: {stale} pages per read"
    );

    // After REPLAN_EVERY uses of the connection (two per pair), it plans again.
    pairs(&store, 20, REPLAN_EVERY / 2 + 10).await;
    reset(&admin).await;
    pairs(&store, 100_000, 10).await;
    let (calls, plans, fresh) = claims_read(&admin).await;
    println!("pages per BeginUpdate claims read: {stale:.1} under the empty-table plan, {fresh:.1} after");
    assert_eq!(calls, 10);
    assert!(plans <= 1, "planned once at most after the reset: {plans}");
    assert!(
        fresh < 20.0,
        "a plan made on 20,000 claims looks the key up: {fresh} pages per read (was {stale})"
    );
}

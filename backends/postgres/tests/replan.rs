//! A store opened on an empty database must not keep the plans PostgreSQL made for empty tables
//! as the tables grow. Shown on a private cluster with `pg_stat_statements`, in table and index
//! pages read per execution (not time):
//! - BeginUpdate's read of its claims looks each key up whatever the plan was made on (decision
//!   122): under a plan made while `claims` was empty, 20,000 claims later, and under a plan
//!   made on 2,000 claims never analysed, it reads a few index pages, not the table (written as
//!   a semi-join, it scanned the whole table: 248 pages at 20,000 claims);
//! - a pooled connection still plans its statements again every `REPLAN_EVERY` uses (decision
//!   120), for the statements whose plans follow the table sizes.
//!
//! And, on another private cluster, that a compaction pass of the change feed reads what it
//! removes, not the whole log (decision 124).
#![cfg(unix)]

use std::time::Duration;
use tokio_postgres::Client;

use topology_claims::{ClaimStore, MigrationPolicy};
use topology_claims_harness::postgres as pg;
use topology_claims_harness::private_postgres::PrivatePostgres;
use topology_claims_postgres::baseline::SELECT_CLAIMS_FOR_UPDATE;
use topology_claims_postgres::{PostgresClaimStore, PostgresOptions, COMPACT_BATCH, REPLAN_EVERY};
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

/// A private cluster with `pg_stat_statements`, and a connection to its database; `None` (the
/// test passes without running) outside CI when no private cluster can start.
async fn cluster_with_statistics(test: &str) -> Option<(PrivatePostgres, Client)> {
    let cluster = match tokio::task::block_in_place(|| {
        PrivatePostgres::start_with_settings(
            "shared_preload_libraries = 'pg_stat_statements'\npg_stat_statements.track_planning = on",
        )
    }) {
        Ok(cluster) => cluster,
        Err(why) if !topology_claims_harness::in_ci() => {
            println!("{test} skipped: no private PostgreSQL: {why}");
            return None;
        }
        Err(why) => panic!("CI=true needs a private PostgreSQL cluster: {why}"),
    };
    let admin = pg::connect(&cluster.url())
        .await
        .expect("connect to the private cluster");
    admin
        .batch_execute("CREATE EXTENSION pg_stat_statements")
        .await
        .expect("pg_stat_statements");
    Some((cluster, admin))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_made_on_an_empty_store_are_made_again_as_it_grows() {
    let Some((cluster, admin)) = cluster_with_statistics("replan test").await else {
        return;
    };
    let url = cluster.url();
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
    bulk_load(&admin, 1, 20_000).await;
    reset(&admin).await;
    pairs(&store, 10, 10).await;
    let (calls, plans, early) = claims_read(&admin).await;
    assert_eq!(
        calls, 10,
        "BeginUpdate's claims read, executed once per pair"
    );
    assert_eq!(plans, 0, "still the plan made on the empty table");
    // One primary-key probe per key: a few index pages and the heap page, not the 248 pages the
    // semi-join read over 20,000 rows.
    assert!(
        early < 20.0,
        "the plan made on an empty table should look the key up: {early} pages per read"
    );

    // After REPLAN_EVERY uses of the connection (two per pair), it plans again.
    pairs(&store, 20, REPLAN_EVERY / 2 + 10).await;
    let (_, replanned, _) = claims_read(&admin).await;
    reset(&admin).await;
    pairs(&store, 100_000, 10).await;
    let (calls, plans, fresh) = claims_read(&admin).await;
    println!("pages per BeginUpdate claims read: {early:.1} under the empty-table plan, {fresh:.1} after");
    assert!(
        replanned >= 1,
        "the connection planned the read again within {} uses",
        REPLAN_EVERY + 20
    );
    assert_eq!(calls, 10);
    assert!(plans <= 1, "planned once at most after the reset: {plans}");
    assert!(
        fresh < 20.0,
        "a plan made on 20,000 claims looks the key up: {fresh} pages per read (was {early})"
    );

    // A young store: 2,000 claims, never analysed, planned now. PostgreSQL knows the table's
    // size but assumes ten keys per array: as a semi-join the read was a hash join over a scan
    // of the table (decision 122).
    admin
        .batch_execute("CREATE DATABASE young")
        .await
        .expect("create the young store's database");
    let young_url = format!("{}/young", url.rsplit_once('/').expect("a database").0);
    let young = PostgresClaimStore::connect(
        &young_url,
        PostgresOptions {
            pool_size: 1,
            ..PostgresOptions::default()
        },
        MigrationPolicy::Apply,
    )
    .await
    .expect("open the young store");
    let young_admin = pg::connect(&young_url)
        .await
        .expect("connect to the young store");
    bulk_load(&young_admin, 1, 2_000).await;
    // The first pair plans on the 2,000 claims; the next ten are counted (without planning).
    pairs(&young, 0, 1).await;
    reset(&admin).await;
    pairs(&young, 1, 10).await;
    let (calls, plans, young_pages) = claims_read(&admin).await;
    println!(
        "pages per BeginUpdate claims read in a young store of 2,000 claims: {young_pages:.1}"
    );
    assert_eq!((calls, plans), (10, 0), "the plan made on 2,000 claims");
    assert!(
        young_pages < 10.0,
        "the read should look its key up: {young_pages} pages (the table has 2,000 claims)"
    );
}

/// The claims of cell-a numbered `first..=last` (usernames `bulk-N`), written straight to the
/// table in one transaction (a bulk load; the change feed's triggers write one event per claim).
async fn bulk_load(admin: &Client, first: i32, last: i32) {
    let claim_type = username("x").key.namespace_number() as i16;
    admin
        .execute(
            "INSERT INTO claims (claim_type, claim_value, owner_type, owner_value, table_name, \
             table_record_id, cell_id, created_at, updated_at) \
             SELECT $1::int2, 'bulk-' || g, 1, g::text, 1, g, 'cell-a', now(), now() \
             FROM generate_series($2::int4, $3::int4) AS g",
            &[&claim_type, &first, &last],
        )
        .await
        .expect("bulk load of claims");
}

/// Pages read by every statement since the last reset (the store's compaction pass: nothing
/// else runs on the cluster meanwhile), and the statements' texts.
async fn pages_read(admin: &Client) -> (f64, Vec<String>) {
    let rows = admin
        .query(
            "SELECT (shared_blks_hit + shared_blks_read)::float8, query FROM pg_stat_statements \
             WHERE query NOT LIKE '%pg_stat_statements%'",
            &[],
        )
        .await
        .expect("read pg_stat_statements");
    let pages = rows.iter().map(|row| row.get::<_, f64>(0)).sum();
    (pages, rows.iter().map(|row| row.get(1)).collect())
}

async fn events(admin: &Client) -> i64 {
    admin
        .query_one("SELECT count(*) FROM claim_events", &[])
        .await
        .expect("count the events")
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_pass_reads_what_it_removes_not_the_log() {
    let Some((cluster, admin)) = cluster_with_statistics("compaction test").await else {
        return;
    };
    let options = PostgresOptions {
        pool_size: 1,
        ..PostgresOptions::default()
    };
    let store = PostgresClaimStore::connect(&cluster.url(), options, MigrationPolicy::Apply)
        .await
        .expect("open the store");
    // 30,000 events in 30 revisions: 30 transactions of 1,000 claims each.
    for batch in 0..30 {
        bulk_load(&admin, batch * 1000 + 1, batch * 1000 + 1000).await;
    }
    assert_eq!(events(&admin).await, 30_000);
    let pages: i64 = admin
        .query_one(
            "SELECT pg_relation_size('claim_events') / current_setting('block_size')::bigint",
            &[],
        )
        .await
        .expect("the log's size")
        .get(0);
    let hour = Duration::from_secs(3600);

    // Nothing to remove: the pass reads the oldest events and the sequence, not the log. (A
    // first pass fills the connection's caches, whose catalog reads would count too.)
    assert_eq!(store.compact_events(hour, 1_000_000).await.unwrap(), 0);
    reset(&admin).await;
    assert_eq!(store.compact_events(hour, 1_000_000).await.unwrap(), 0);
    let (idle, statements) = pages_read(&admin).await;
    println!("a compaction pass with nothing to remove read {idle} pages (the log has {pages})");
    assert!(
        statements.iter().any(|q| q.contains("claim_events_seq")),
        "the estimate from the sequence ran: {statements:#?}"
    );
    assert!(
        idle < 20.0 && (idle as i64) < pages / 10,
        "a pass with nothing to remove read {idle} pages of a {pages}-page log: {statements:#?}"
    );

    // Over the cap by 20,000: one pass removes the 20 oldest revisions, no more.
    let removed = store.compact_events(hour, 10_000).await.unwrap();
    assert_eq!(removed, COMPACT_BATCH.min(20_000));
    assert_eq!(events(&admin).await, 10_000);
    // At the cap now, as the estimate from the sequence sees it too.
    assert_eq!(store.compact_events(hour, 10_000).await.unwrap(), 0);

    // Past the retention: the rest goes, whole revisions, oldest first.
    let removed = store
        .compact_events(Duration::ZERO, u64::MAX)
        .await
        .unwrap();
    assert_eq!(removed, 10_000);
    assert_eq!(events(&admin).await, 0);
    assert_eq!(store.compact_events(Duration::ZERO, 1).await.unwrap(), 0);
}

//! Group commit in the real binary: with `--group-commit on` (the default) concurrent pairs share
//! store transactions (the batch-size histogram shows groups of more than one call) and every
//! pair still gets its own answer; with `off` no group forms. Both on the embedded SQLite store,
//! whose single writer makes requests queue. Bad values of the flags are refused by name. And
//! fairness: a small cell's calls keep their tail beside another cell's large batches, on
//! PostgreSQL and SQLite (decision 104).
#![cfg(unix)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{run, scrape, text, value, Server, PATIENCE};
use topology_claims::ClaimState;
use topology_claims_client::{ClaimsClient, ClientConfig};
use topology_claims_testkit::fixtures::{cell, creates, username};

const TASKS: usize = 24;
const PAIRS_PER_TASK: usize = 8;

fn start(dir: &Path, group_commit: &str) -> Server {
    let db = dir.join(format!("claims-{group_commit}.db"));
    let store = format!("sqlite://{}", db.display());
    Server::start(
        dir,
        &[
            "--listen",
            "127.0.0.1:0",
            "--store",
            &store,
            "--group-commit",
            group_commit,
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    )
}

/// Runs TASKS concurrent tasks of PAIRS_PER_TASK begin+commit pairs of unique claims, and checks
/// every pair's answers and the claims' final state.
async fn pairs(server: &Server, label: &str) {
    let client = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let client = client.clone();
            let label = label.to_owned();
            tokio::spawn(async move {
                let me = cell(&format!("cell-{}", t % 3));
                for p in 0..PAIRS_PER_TASK {
                    let name = username(&format!("{label}-{t}-{p}"));
                    let lease = client
                        .begin_update(creates(&me, std::slice::from_ref(&name)))
                        .await?;
                    client.commit_update(&me, lease.lease_id).await?;
                    let claim = client.lookup_claim(&name.key).await?;
                    assert_eq!(claim.state, ClaimState::Active, "{name:?}");
                    assert_eq!(claim.cell_id, me);
                }
                Ok::<_, topology_claims::ClaimsError>(())
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    // A conflicting create still gets its own refusal.
    let taken = username(&format!("{label}-0-0"));
    let refused = client
        .begin_update(creates(&cell("cell-other"), &[taken]))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, topology_claims::ClaimsError::ClaimTaken { .. }),
        "{refused:?}"
    );
}

fn histogram(metrics: SocketAddr) -> (f64, f64, f64) {
    let text = scrape(metrics);
    let series = "topology_claims_group_commit_batch_size";
    let count = value(&text, &format!("{series}_count"), &[]).unwrap_or(0.0);
    let sum = value(&text, &format!("{series}_sum"), &[]).unwrap_or(0.0);
    let singles = value(&text, &format!("{series}_bucket"), &[("le", "1")]).unwrap_or(0.0);
    (count, sum, singles)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_pairs_share_store_transactions_only_with_group_commit_on() {
    let dir = tempfile::tempdir().unwrap();
    let calls = (TASKS * PAIRS_PER_TASK * 2 + 1) as f64;

    let path = dir.path().to_owned();
    let on = tokio::task::spawn_blocking(move || start(&path, "on"))
        .await
        .unwrap();
    let metrics = on.child.metrics_addr(PATIENCE).unwrap();
    pairs(&on, "on").await;
    let (groups, carried, singles) = histogram(metrics);
    println!("group commit on: {carried} calls in {groups} store transactions ({singles} alone)");
    assert_eq!(
        carried, calls,
        "every begin and commit went through a group"
    );
    assert!(
        groups < carried && singles < groups,
        "no group carried more than one call ({groups} groups, {carried} calls)"
    );
    drop(on);

    let path = dir.path().to_owned();
    let off = tokio::task::spawn_blocking(move || start(&path, "off"))
        .await
        .unwrap();
    let metrics = off.child.metrics_addr(PATIENCE).unwrap();
    pairs(&off, "off").await;
    assert_eq!(
        histogram(metrics),
        (0.0, 0.0, 0.0),
        "--group-commit off forms no group"
    );
}

#[test]
fn bad_group_flags_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    for (args, named) in [
        (["--group-commit", "maybe"], "--group-commit"),
        (["--group-max", "0"], "--group-max"),
    ] {
        let out = run(
            dir.path(),
            &[
                &["serve", "--listen", "127.0.0.1:0", "--store", "memory:"][..],
                &args[..],
            ]
            .concat(),
        );
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(stderr.contains(named), "{args:?}: {stderr}");
    }
}

/// The p99 of `samples` (milliseconds).
fn p99(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[(samples.len() * 99 / 100).min(samples.len() - 1)]
}

fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// A small cell's 1-claim BeginUpdate + RollbackUpdate loop for `duration`: its begins' latencies.
async fn small_loop(client: &ClaimsClient, tag: &str, duration: Duration) -> Vec<f64> {
    let small = cell("cell-small");
    let started = std::time::Instant::now();
    let mut latencies = Vec::new();
    let mut n = 0;
    while started.elapsed() < duration {
        let record = username(&format!("small-{tag}-{n}"));
        n += 1;
        let begun = std::time::Instant::now();
        let lease = client
            .begin_update(creates(&small, &[record]))
            .await
            .unwrap_or_else(|e| panic!("the small cell's BeginUpdate {n}: {e}"));
        latencies.push(begun.elapsed().as_secs_f64() * 1000.0);
        client
            .rollback_update(&small, lease.lease_id)
            .await
            .unwrap_or_else(|e| panic!("the small cell's RollbackUpdate {n}: {e}"));
    }
    latencies
}

/// Fairness (issue 34, decision 104): beside 8 loops of another cell's 1,000-claim begin and
/// rollback pairs, a small cell's 1-claim BeginUpdate median over 10 s stays under a third of the
/// large BeginUpdates' median, on a server with its defaults (group commit on) on `store`.
/// Returns (quiet p99, loaded p99, small pairs loaded, large pairs).
async fn small_cell_beside_large_batches(store: &str) -> (f64, f64, usize, usize) {
    const LOOPS: usize = 8;
    const CLAIMS: usize = 1000;
    let dir = tempfile::tempdir().unwrap();
    let server = tokio::task::spawn_blocking({
        let (dir, store) = (dir.path().to_owned(), store.to_owned());
        // More flags for the benchmark's A/B (docs/benchmarks.md, "Fairness"), e.g.
        // `--group-large-parallelism 8`; none in the test run.
        let extra = std::env::var("TOPOLOGY_CLAIMS_TEST_FAIRNESS_FLAGS").unwrap_or_default();
        move || {
            let mut args = vec!["--listen", "127.0.0.1:0", "--store", &store];
            args.extend(extra.split_whitespace());
            Server::start(&dir, &args)
        }
    })
    .await
    .unwrap();
    // One attempt per call: a failure must surface here, not be retried away by the client.
    let config = ClientConfig {
        max_attempts: 1,
        call_timeout: Duration::from_secs(60),
        ..ClientConfig::default()
    };
    let connect = || ClaimsClient::connect_lazy(&server.endpoint(), config.clone()).unwrap();
    let client = connect();
    // Warm the connections and statements, then the quiet run.
    small_loop(&client, "warm", Duration::from_secs(1)).await;
    let mut quiet = small_loop(&client, "quiet", Duration::from_secs(5)).await;

    let stop = Arc::new(AtomicBool::new(false));
    let mut loops = Vec::new();
    for l in 0..LOOPS {
        let (client, stop) = (connect(), stop.clone());
        loops.push(tokio::spawn(async move {
            let big = cell("cell-big");
            let mut rounds = 0usize;
            let mut latencies = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let records: Vec<_> = (0..CLAIMS)
                    .map(|i| username(&format!("big-{l}-{rounds}-{i}")))
                    .collect();
                let begun = std::time::Instant::now();
                let lease = client
                    .begin_update(creates(&big, &records))
                    .await
                    .map_err(|e| format!("loop {l} BeginUpdate: {e}"))?;
                latencies.push(begun.elapsed().as_secs_f64() * 1000.0);
                client
                    .rollback_update(&big, lease.lease_id)
                    .await
                    .map_err(|e| format!("loop {l} RollbackUpdate: {e}"))?;
                rounds += 1;
            }
            Ok::<_, String>((rounds, latencies))
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut loaded = small_loop(&client, "loaded", Duration::from_secs(10)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut batches, mut large) = (0, Vec::new());
    for handle in loops {
        let (rounds, latencies) = handle.await.unwrap().unwrap_or_else(|e| panic!("{e}"));
        batches += rounds;
        large.extend(latencies);
    }
    let loaded_n = loaded.len();
    assert!(batches > 0, "the large loops ran");
    let (quiet_median, loaded_median) = (median(&mut quiet), median(&mut loaded));
    let (quiet_p99, loaded_p99) = (p99(&mut quiet), p99(&mut loaded));
    let large_median = median(&mut large);
    let bound = large_median / 3.0;
    println!(
        "{store}: small cell's BeginUpdate median / p99: {quiet_median:.1} / {quiet_p99:.1} ms \
         quiet, {loaded_median:.1} / {loaded_p99:.1} ms beside {LOOPS} loops of {CLAIMS}-claim \
         batches ({loaded_n} small pairs, {batches} large pairs in 10 s, large BeginUpdate \
         median {large_median:.1} ms); bound {bound:.1} ms"
    );
    // A ratio measured in one run, so a machine busy with other tests slows both sides: a small
    // call that shares its transactions with large batches waits about as long as they take
    // (before decision 104, 36 small pairs in 10 s), one that runs beside them does not. The
    // latency objective itself is the benchmark's (docs/benchmarks.md, "Fairness").
    assert!(
        loaded_median <= bound,
        "the small cell's median {loaded_median:.1} ms > a third of the large batches' \
         {large_median:.1} ms"
    );
    drop(server);
    (quiet_p99, loaded_p99, loaded_n, batches)
}

/// Before large batches ran beside the groups, taking turns (decision 104), the small cell's
/// p99 went from 3.1 ms to 155.6 ms here (36 small pairs in 10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_small_cells_begins_keep_their_tail_beside_another_cells_large_batches_on_postgres() {
    let Some(db) = common::pg::FreshDb::create().await else {
        return;
    };
    small_cell_beside_large_batches(&db.url).await;
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_small_cells_begins_keep_their_tail_beside_another_cells_large_batches_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    small_cell_beside_large_batches(&format!(
        "sqlite://{}",
        dir.path().join("fair.db").display()
    ))
    .await;
}

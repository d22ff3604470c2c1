//! Group commit in the real binary: with `--group-commit on` (the default) concurrent pairs share
//! store transactions (the batch-size histogram shows groups of more than one call) and every
//! pair still gets its own answer; with `off` no group forms. Both on the embedded SQLite store,
//! whose single writer makes requests queue. Bad values of the flags are refused by name.
#![cfg(unix)]

mod common;

use std::net::SocketAddr;
use std::path::Path;

use common::{run, scrape, text, value, Server, PATIENCE};
use topology_claims::cell::{ClaimsClient, ClientConfig};
use topology_claims::testing::fixtures::{cell, creates, username};
use topology_claims::ClaimState;

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

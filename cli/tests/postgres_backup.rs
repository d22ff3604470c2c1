//! `topology-claims backup` and `restore` of a PostgreSQL store through the real binary: a
//! backup taken while `serve` keeps committing is one snapshot (a SQLite store file), restored
//! into an empty database that `serve` then serves with every claim committed before it and its
//! namespaces; a restore is refused while a server uses the target and over rows without
//! --replace; the restore drill's `mark-restored` runs on it. Connection from
//! TOPOLOGY_CLAIMS_TEST_POSTGRES_URL (default postgres://postgres@127.0.0.1:5432/test);
//! unreachable → fails when CI=true, else one skip line.
#![cfg(unix)]

mod common;

use common::pg::FreshDb;
use common::traffic::{claim, Traffic};
use common::{run, text, Server};
use topology_claims::ClaimState;
use topology_claims_client::{ClaimsClient, ClientConfig};
use topology_claims_proto::pb::claims_service_client::ClaimsServiceClient;
use topology_claims_testkit::fixtures::{cell, creates, username};

async fn serve(dir: &std::path::Path, store: &str) -> Server {
    let (dir, store) = (dir.to_owned(), store.to_owned());
    tokio::task::spawn_blocking(move || {
        Server::start(
            &dir,
            &[
                "--listen",
                "127.0.0.1:0",
                "--store",
                &store,
                "--drain-timeout",
                "1s",
            ],
        )
    })
    .await
    .unwrap()
}

async fn cli(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    let (dir, args): (_, Vec<String>) =
        (dir.to_owned(), args.iter().map(|a| a.to_string()).collect());
    tokio::task::spawn_blocking(move || {
        run(&dir, &args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_backup_under_traffic_restores_into_an_empty_database_and_serves() {
    let (Some(source), Some(target)) = (FreshDb::create().await, FreshDb::create().await) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let server = serve(&d, &source.url).await;
    let client = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    for i in 0..30 {
        claim(&client, &format!("Before-{i}")).await;
    }
    let held = client
        .begin_update(creates(&cell("cell-b"), &[username("held")]))
        .await
        .unwrap();
    let made = cli(
        &d,
        &[
            "admin",
            "--server",
            &server.endpoint(),
            "namespaces",
            "create",
            "ssh-keys",
            "--normalization",
            "exact",
            "--reason",
            "test",
        ],
    )
    .await;
    assert!(made.status.success(), "{}", text(&made.stderr));

    let traffic = Traffic::start(&client);
    let file = d.join("pg-backup.db");
    let backup = [
        "backup",
        "--store",
        &source.url,
        "--to",
        file.to_str().unwrap(),
    ];
    let output = cli(&d, &backup).await;
    let during = traffic.stop().await;
    assert!(output.status.success(), "{}", text(&output.stderr));
    let said = text(&output.stdout);
    assert!(said.starts_with("backup written: "), "{said}");
    assert!(
        text(&output.stderr).contains("backup: claims: "),
        "{}",
        text(&output.stderr)
    );
    let again = cli(&d, &backup).await;
    assert!(!again.status.success(), "never overwritten");

    // The target must be at this binary's schema: migrate it, then restore.
    let migrated = cli(&d, &["migrate", "--store", &target.url]).await;
    assert!(migrated.status.success(), "{}", text(&migrated.stderr));
    let restore = [
        "restore",
        "--from",
        file.to_str().unwrap(),
        "--store",
        &target.url,
    ];
    // A server on the target holds the serving lock: refused, nothing written.
    let busy = serve(&d, &target.url).await;
    let refused = cli(&d, &restore).await;
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("is using"),
        "{}",
        text(&refused.stderr)
    );
    drop(busy);
    let restored = cli(&d, &restore).await;
    assert!(restored.status.success(), "{}", text(&restored.stderr));
    assert!(
        text(&restored.stdout).contains("mark-restored"),
        "{}",
        text(&restored.stdout)
    );
    // Over rows, only with --replace.
    let over = cli(&d, &restore).await;
    assert!(
        text(&over.stderr).contains("--replace"),
        "{}",
        text(&over.stderr)
    );
    let replaced = cli(&d, &[&restore[..], &["--replace"]].concat()).await;
    assert!(replaced.status.success(), "{}", text(&replaced.stderr));

    // Served: the claims committed before the backup, the lease it held, the namespace it had.
    let server2 = serve(&d, &target.url).await;
    let restored_client =
        ClaimsClient::connect_lazy(&server2.endpoint(), ClientConfig::default()).unwrap();
    for i in 0..30 {
        let name = format!("before-{i}");
        let view = restored_client
            .lookup_claim(&username(&name).key)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            (view.cell_id, view.state),
            (cell("cell-a"), ClaimState::Active)
        );
        assert_eq!(view.record.display_value(), format!("Before-{i}"));
    }
    // Decision 117: the restore refused every watch from before it; a cache resumes from the
    // revisions it looks up.
    let mut raw = ClaimsServiceClient::connect(server2.endpoint())
        .await
        .unwrap();
    let watch = |start_revision| topology_claims_proto::pb::WatchClaimsRequest {
        start_revision,
        ..Default::default()
    };
    let refused = raw.watch_claims(watch(1)).await.unwrap_err();
    let topology_claims::ClaimsError::WatchCompacted {
        compact_revision, ..
    } = topology_claims_proto::status::from_status(&refused)
    else {
        panic!("{refused:?}");
    };
    let looked_up = restored_client
        .lookup_claim(&username("before-0").key)
        .await
        .unwrap();
    assert!(
        looked_up.revision + 1 >= compact_revision,
        "{compact_revision}"
    );
    raw.watch_claims(watch(looked_up.revision + 1))
        .await
        .expect("a watch from what the restored store answers");
    let leased = restored_client
        .lookup_claim(&username("held").key)
        .await
        .unwrap();
    assert_eq!(leased.state, ClaimState::Creating);
    let listed = cli(
        &d,
        &[
            "admin",
            "--server",
            &server2.endpoint(),
            "namespaces",
            "list",
        ],
    )
    .await;
    assert!(
        text(&listed.stdout).contains("ssh-keys"),
        "{}",
        text(&listed.stdout)
    );
    restored_client
        .commit_update(&cell("cell-b"), held.lease_id)
        .await
        .expect("the restored lease commits");
    // The restore drill: mark the restore (a quarantine until the cells re-verify).
    let marked = cli(
        &d,
        &[
            "admin",
            "--server",
            &server2.endpoint(),
            "mark-restored",
            "--backup-time",
            "2026-01-01T00:00:00Z",
            "--reason",
            "drill",
            "--yes",
        ],
    )
    .await;
    assert!(marked.status.success(), "{}", text(&marked.stderr));
    println!("{during} claims were committed while the backup ran");
    drop(server2);
    drop(server);
}

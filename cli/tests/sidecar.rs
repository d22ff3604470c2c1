//! The sidecar commands through the real binary: `reconcile --once` commits a lease recorded in
//! the cell's SQLite database and rolls back a stale one that is not; `verify` finds and repairs
//! each kind of drift (`--dry-run` first changes nothing), and a second run finds nothing.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use topology_claims::cell::{ClaimsClient, ClientConfig};
use topology_claims::memory::MemoryClaimStore;
use topology_claims::testing::fixtures::{cell, creates, record_in};
use topology_claims::testing::TestServer;
use topology_claims::{ClaimKey, ClaimType, ClaimsError, TableName};

fn run(args: &[&str]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_topology-claims"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run topology-claims");
    eprintln!(
        "stderr of {args:?}:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn local_db(path: &Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).unwrap();
    topology_claims_sqlite::ensure_local_schema(&conn).unwrap();
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS users (id INTEGER PRIMARY KEY, name TEXT NOT NULL, created_at INTEGER NOT NULL)",
    )
    .unwrap();
    conn
}

#[tokio::test]
async fn reconcile_once_commits_recorded_leases_and_rolls_back_stale_unrecorded_ones() {
    let server = TestServer::start(Arc::new(MemoryClaimStore::new())).await;
    let client = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("cell.db");
    let conn = local_db(&db_path);
    let a = cell("cell-a");
    let user = |name: &str| record_in(TableName::Users, 1, ClaimType::Username, name);
    let recorded = client
        .begin_update(creates(&a, &[user("kept")]))
        .await
        .unwrap();
    let orphan = client
        .begin_update(creates(&a, &[user("orphan")]))
        .await
        .unwrap();
    conn.execute(
        "INSERT INTO leases_outstanding (lease_id, created_at, updated_at) VALUES (?1, 0, 0)",
        [recorded.lease_id.to_string()],
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;

    let local = format!("sqlite://{}", db_path.display());
    let server_url = server.endpoint();
    let args: Vec<String> = [
        "reconcile",
        "--once",
        "--server",
        &server_url,
        "--cell-id",
        "cell-a",
        "--local-db",
        &local,
        "--staleness",
        "1s",
    ]
    .map(String::from)
    .into();
    let output = tokio::task::spawn_blocking(move || {
        run(&args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .unwrap();
    assert!(output.status.success());
    let out = stdout(&output);
    assert!(
        out.contains("committed=1") && out.contains("rolled_back=1"),
        "{out}"
    );

    let kept = client
        .lookup_claim(&ClaimKey::new(ClaimType::Username, "kept"))
        .await
        .unwrap();
    assert_eq!(kept.state, topology_claims::ClaimState::Active);
    let gone = client
        .lookup_claim(&ClaimKey::new(ClaimType::Username, "orphan"))
        .await;
    assert!(
        matches!(gone, Err(ClaimsError::ClaimNotFound { .. })),
        "{gone:?}"
    );
    let rows: i64 = conn
        .query_row("SELECT COUNT(*) FROM leases_outstanding", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 0, "the committed lease's local row is deleted");
    let _ = orphan;
    server.shutdown().await;
}

#[tokio::test]
async fn verify_repairs_drift_after_a_dry_run_and_then_finds_nothing() {
    let server = TestServer::start(Arc::new(MemoryClaimStore::new())).await;
    let client = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("cell.db");
    let conn = local_db(&db_path);
    for (id, name) in [(1, "u1"), (2, "u2"), (3, "u3"), (4, "u4"), (5, "u5")] {
        conn.execute(
            "INSERT INTO users (id, name, created_at) VALUES (?1, ?2, 1000)",
            (id, name),
        )
        .unwrap();
    }
    let a = cell("cell-a");
    let claim = |id: i64, name: &str, owner: &str| {
        let mut record = record_in(TableName::Users, id, ClaimType::Username, name);
        record.owner_value = owner.to_owned();
        record
    };
    // Service: u1, u2 match; u3 has another owner value (different); u6 has no record (extra);
    // u4 and u5 are missing.
    for record in [
        claim(1, "u1", "1"),
        claim(2, "u2", "2"),
        claim(3, "u3", "someone"),
        claim(6, "u6", "6"),
    ] {
        let lease = client.begin_update(creates(&a, &[record])).await.unwrap();
        client.commit_update(&a, lease.lease_id).await.unwrap();
    }
    let source = dir.path().join("verify.toml");
    std::fs::write(
        &source,
        r#"
[tables.users]
query = "SELECT id, 'username', name, 'user', CAST(id AS TEXT), created_at FROM users WHERE id >= ?1 AND id < ?2"
"#,
    )
    .unwrap();
    let local = format!("sqlite://{}", db_path.display());
    let cursor = dir.path().join("cursor");
    let server_url = server.endpoint();
    let base: Vec<String> = [
        "verify",
        "--server",
        &server_url,
        "--cell-id",
        "cell-a",
        "--local-db",
        &local,
        "--source",
        source.to_str().unwrap(),
        "--recent",
        "0s",
        "--page-size",
        "2",
        "--cursor-file",
        cursor.to_str().unwrap(),
    ]
    .map(String::from)
    .into();
    let verify = |extra: &[&str]| {
        let mut args = base.clone();
        args.extend(extra.iter().map(|s| s.to_string()));
        async move {
            tokio::task::spawn_blocking(move || {
                run(&args.iter().map(String::as_str).collect::<Vec<_>>())
            })
            .await
            .unwrap()
        }
    };

    let dry = verify(&["--dry-run"]).await;
    assert!(dry.status.success());
    let out = stdout(&dry);
    assert_eq!(out.matches("missing ").count(), 2, "{out}");
    assert_eq!(out.matches("different ").count(), 1, "{out}");
    assert_eq!(out.matches("extra ").count(), 1, "{out}");
    assert!(out.contains("missing=2 different=1 extra=1"), "{out}");
    assert!(
        client
            .lookup_claim(&ClaimKey::new(ClaimType::Username, "u6"))
            .await
            .is_ok(),
        "dry run changed nothing"
    );

    let fix = verify(&[]).await;
    assert!(fix.status.success());
    let out = stdout(&fix);
    assert!(
        out.contains("missing=2 different=1 extra=1") && out.contains("corrected=5 failed=0"),
        "{out}"
    );
    let u3 = client
        .lookup_claim(&ClaimKey::new(ClaimType::Username, "u3"))
        .await
        .unwrap();
    assert_eq!(u3.record.owner_value, "3");
    assert!(client
        .lookup_claim(&ClaimKey::new(ClaimType::Username, "u5"))
        .await
        .is_ok());
    let u6 = client
        .lookup_claim(&ClaimKey::new(ClaimType::Username, "u6"))
        .await;
    assert!(
        matches!(u6, Err(ClaimsError::ClaimNotFound { .. })),
        "{u6:?}"
    );

    let again = verify(&[]).await;
    assert!(again.status.success());
    let out = stdout(&again);
    assert!(
        out.contains("missing=0 different=0 extra=0") && out.contains("corrected=0"),
        "{out}"
    );
    server.shutdown().await;
}

#[test]
fn verify_with_a_bad_source_file_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("verify.toml");
    std::fs::write(&source, "[tables.nonsense]\nquery = \"SELECT 1\"\n").unwrap();
    let db = dir.path().join("cell.db");
    drop(local_db(&db));
    let local = format!("sqlite://{}", db.display());
    let output = run(&[
        "verify",
        "--cell-id",
        "c",
        "--local-db",
        &local,
        "--source",
        source.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(2));
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(err.contains("unknown table \"nonsense\""), "{err}");
}

//! The sidecar commands through the real binary: `reconcile --once` commits a lease recorded in
//! the cell's SQLite database and rolls back a stale one that is not; `verify` finds and repairs
//! each kind of drift (`--dry-run` first changes nothing), and a second run finds nothing. A dry
//! run leaves the saved cursor alone; failed corrections exit 1; every flag has an environment
//! variable and every duration its unit in `--help`; an unreachable claims server, a scheme-less
//! `--server` and a query with too few columns are reported as such, each cause said once.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use topology_claims::memory::MemoryClaimStore;
use topology_claims::{ClaimKey, ClaimType, ClaimsError, TableName};
use topology_claims_client::{ClaimsClient, ClientConfig};
use topology_claims_testkit::fixtures::{cell, creates, record_in};
use topology_claims_testkit::TestServer;

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

/// `DIR/verify.toml` with the query of [`local_db`]'s `users` table: one username claim per user.
fn users_source(dir: &Path) -> std::path::PathBuf {
    let source = dir.join("verify.toml");
    std::fs::write(
        &source,
        r#"
[tables.users]
query = "SELECT id, 'username', name, 'user', CAST(id AS TEXT), created_at FROM users WHERE id >= ?1 AND id < ?2"
"#,
    )
    .unwrap();
    source
}

#[tokio::test]
async fn reconcile_once_commits_recorded_leases_and_rolls_back_stale_unrecorded_ones() {
    let server = TestServer::start(Arc::new(MemoryClaimStore::new())).await;
    let client = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("cell.db");
    let conn = local_db(&db_path);
    let a = cell("cell-a");
    let user = |name: &str| record_in(TableName::USERS, 1, ClaimType::Username, name);
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
        let mut record = record_in(TableName::USERS, id, ClaimType::Username, name);
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
    let source = users_source(dir.path());
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
        // Two creates, one destroy, and one update for the difference (never destroy + create).
        out.contains("missing=2 different=1 extra=1") && out.contains("corrected=4 failed=0"),
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
    std::fs::write(&source, "[tables.\"ssh keys\"]\nquery = \"SELECT 1\"\n").unwrap();
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
    assert!(
        err.contains("[tables.\"ssh keys\"] is not a source table name"),
        "{err}"
    );
}

/// A cell database with users 1..=`users` (all old), its verify.toml, and the `verify` flags
/// for them against `server` with page size 1.
struct VerifySetup {
    dir: tempfile::TempDir,
    args: Vec<String>,
}

impl VerifySetup {
    fn new(server: &str, users: i64) -> VerifySetup {
        let dir = tempfile::tempdir().unwrap();
        let db_path = dir.path().join("cell.db");
        let conn = local_db(&db_path);
        for id in 1..=users {
            conn.execute(
                "INSERT INTO users (id, name, created_at) VALUES (?1, ?2, 1000)",
                (id, format!("u{id}")),
            )
            .unwrap();
        }
        let source = users_source(dir.path());
        let args = [
            "verify",
            "--server",
            server,
            "--cell-id",
            "cell-a",
            "--local-db",
            &format!("sqlite://{}", db_path.display()),
            "--source",
            source.to_str().unwrap(),
            "--recent",
            "0s",
            "--page-size",
            "1",
            "--cursor-file",
            dir.path().join("cursor").to_str().unwrap(),
        ]
        .map(String::from)
        .into();
        VerifySetup { dir, args }
    }

    fn cursor(&self) -> std::path::PathBuf {
        self.dir.path().join("cursor")
    }

    /// Runs `verify` with the extra flags and environment (nothing else from the test's own
    /// environment).
    async fn run(&self, extra: &[&str], env: &[(&str, &str)]) -> Output {
        let mut args = self.args.clone();
        args.extend(extra.iter().map(|s| s.to_string()));
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let dir = self.dir.path().to_owned();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut command = common::command(&dir, &args);
            command.env("RUST_LOG", "warn").envs(env);
            let output = command.output().expect("run topology-claims");
            eprintln!(
                "stderr of {args:?}:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            output
        })
        .await
        .unwrap()
    }
}

#[tokio::test]
async fn verify_dry_run_leaves_the_saved_cursor_where_it_was() {
    let server = TestServer::start(Arc::new(MemoryClaimStore::new())).await;
    let setup = VerifySetup::new(&server.endpoint(), 9);
    std::fs::write(setup.cursor(), "users=2\n").unwrap();

    for _ in 0..3 {
        let dry = setup.run(&["--dry-run"], &[]).await;
        assert_eq!(dry.status.code(), Some(0));
        let out = stdout(&dry);
        assert!(out.contains("(dry run)"), "{out}");
        assert_eq!(
            std::fs::read_to_string(setup.cursor()).unwrap(),
            "users=2\n",
            "a dry run changes nothing, its cursor included"
        );
    }
    // A dry run stopped by its time budget moves nothing either.
    let dry = setup.run(&["--dry-run", "--time-budget", "1ms"], &[]).await;
    assert_eq!(dry.status.code(), Some(0));
    assert_eq!(
        std::fs::read_to_string(setup.cursor()).unwrap(),
        "users=2\n"
    );

    // The real run then starts at the saved cursor and checks every record from there.
    let real = setup.run(&[], &[]).await;
    assert_eq!(real.status.code(), Some(0));
    let out = stdout(&real);
    assert!(
        out.contains("records=8 ") && out.contains("missing=8"),
        "{out}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn verify_exits_1_when_a_correction_fails() {
    let server = TestServer::start(Arc::new(MemoryClaimStore::new())).await;
    let client = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    // Another cell holds u1: cell-a's correction (create u1) is refused as CLAIM_TAKEN.
    let b = cell("cell-b");
    let lease = client
        .begin_update(creates(
            &b,
            &[record_in(TableName::USERS, 1, ClaimType::Username, "u1")],
        ))
        .await
        .unwrap();
    client.commit_update(&b, lease.lease_id).await.unwrap();
    let setup = VerifySetup::new(&server.endpoint(), 2);

    let output = setup.run(&[], &[]).await;
    let out = stdout(&output);
    assert!(out.contains("corrected=1 failed=1"), "{out}");
    assert_eq!(output.status.code(), Some(1), "{out}");
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(err.contains("manual intervention"), "{err}");

    // A dry run reports the same discrepancy but corrects nothing, so nothing failed.
    let dry = setup.run(&["--dry-run"], &[]).await;
    assert_eq!(dry.status.code(), Some(0));
    server.shutdown().await;
}

#[tokio::test]
async fn sidecar_switches_have_environment_variables() {
    let server = TestServer::start(Arc::new(MemoryClaimStore::new())).await;
    let setup = VerifySetup::new(&server.endpoint(), 1);
    let dry = setup
        .run(&[], &[("TOPOLOGY_CLAIMS_VERIFY_DRY_RUN", "true")])
        .await;
    assert_eq!(dry.status.code(), Some(0));
    let out = stdout(&dry);
    assert!(
        out.contains("(dry run)") && out.contains("missing=1"),
        "{out}"
    );
    assert!(
        matches!(
            client_lookup(&server.endpoint(), "u1").await,
            Err(ClaimsError::ClaimNotFound { .. })
        ),
        "TOPOLOGY_CLAIMS_VERIFY_DRY_RUN=true changed nothing"
    );

    // TOPOLOGY_CLAIMS_RECONCILE_ONCE: one pass and exit (without it, the sidecar would run on).
    let db = setup.dir.path().join("cell.db");
    let local = format!("sqlite://{}", db.display());
    let server_url = server.endpoint();
    let dir = setup.dir.path().to_owned();
    let output = tokio::task::spawn_blocking(move || {
        let mut command = common::command(
            &dir,
            &[
                "reconcile",
                "--server",
                &server_url,
                "--cell-id",
                "cell-a",
                "--local-db",
                &local,
            ],
        );
        command
            .env("TOPOLOGY_CLAIMS_RECONCILE_ONCE", "1")
            .stdout(std::process::Stdio::piped());
        let mut child = command.spawn().unwrap();
        let started = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if started.elapsed() > common::PATIENCE {
                let _ = child.kill();
                panic!("reconcile with TOPOLOGY_CLAIMS_RECONCILE_ONCE=1 did not exit");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert!(stdout(&output).contains("reconcile cell-a:"));
    server.shutdown().await;
}

#[tokio::test]
async fn verify_no_stream_pages_with_list_claims_and_repairs_the_same_drift() {
    let server = TestServer::start(Arc::new(MemoryClaimStore::new())).await;
    let setup = VerifySetup::new(&server.endpoint(), 3);
    let fix = setup.run(&["--no-stream"], &[]).await;
    assert_eq!(fix.status.code(), Some(0));
    let out = stdout(&fix);
    assert!(
        out.contains("records=3") && out.contains("missing=3") && out.contains("corrected=3"),
        "{out}"
    );
    // The switch's variable: the second run pages too, and finds nothing left to do.
    let again = setup
        .run(&[], &[("TOPOLOGY_CLAIMS_VERIFY_NO_STREAM", "yes")])
        .await;
    assert_eq!(again.status.code(), Some(0));
    let out = stdout(&again);
    assert!(
        out.contains("records=3") && out.contains("missing=0 different=0 extra=0"),
        "{out}"
    );
    server.shutdown().await;
}

async fn client_lookup(
    endpoint: &str,
    name: &str,
) -> Result<topology_claims::ClaimState, ClaimsError> {
    let client = ClaimsClient::connect_lazy(endpoint, ClientConfig::default()).unwrap();
    client
        .lookup_claim(&ClaimKey::new(ClaimType::Username, name))
        .await
        .map(|c| c.state)
}

#[test]
fn sidecar_help_names_every_environment_variable_units_and_exit_statuses() {
    let dir = tempfile::tempdir().unwrap();
    let help = |command: &str| {
        let output = common::run(dir.path(), &[command, "--help"]);
        assert!(output.status.success());
        common::text(&output.stdout)
    };
    let reconcile = help("reconcile");
    for needle in [
        "TOPOLOGY_CLAIMS_RECONCILE_ONCE",
        "TOPOLOGY_CLAIMS_STALENESS",
        "Exit status",
    ] {
        assert!(reconcile.contains(needle), "{needle}: {reconcile}");
    }
    let verify = help("verify");
    for needle in [
        "TOPOLOGY_CLAIMS_VERIFY_DRY_RUN",
        "TOPOLOGY_CLAIMS_VERIFY_TIME_BUDGET",
        "Exit status",
        "1 some corrections failed",
    ] {
        assert!(verify.contains(needle), "{needle}: {verify}");
    }
    // Every long option of the sidecars has an environment variable, every duration its unit.
    for (name, text) in [("reconcile", &reconcile), ("verify", &verify)] {
        let options = text
            .split("\n\n")
            .map(str::trim_start)
            .filter(|block| block.starts_with("--"));
        for option in options {
            assert!(option.contains("[env: "), "{name}: {option}");
            if [
                "staleness",
                "interval",
                "recent",
                "time-budget",
                "call-timeout",
            ]
            .iter()
            .any(|f| option.starts_with(&format!("--{f} ")))
            {
                assert!(option.contains("(ms, s, m, h, d)"), "{name}: {option}");
            }
        }
    }
}

/// A local port nothing listens on.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[test]
fn sidecars_name_an_unreachable_claims_server_and_say_each_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cell.db");
    drop(local_db(&db));
    let local = format!("sqlite://{}", db.display());
    let source = users_source(dir.path());
    let source = source.to_str().unwrap().to_owned();
    let refused = format!("http://127.0.0.1:{}", closed_port());
    let scheme_less = format!("127.0.0.1:{}", closed_port());
    for command in [
        vec!["reconcile", "--once"],
        vec!["verify", "--source", &source],
    ] {
        let sidecar = |server: &str| {
            let args = [
                command.clone(),
                vec![
                    "--server",
                    server,
                    "--cell-id",
                    "cell-a",
                    "--local-db",
                    &local,
                    "--call-timeout",
                    "1s",
                ],
            ]
            .concat();
            let output = common::run(dir.path(), &args);
            let err = common::text(&output.stderr);
            eprintln!("{args:?}:\n{err}");
            assert_eq!(output.status.code(), Some(2), "{args:?}: {err}");
            err
        };

        let err = sidecar(&refused);
        assert!(
            err.contains(&format!("the claims server at {refused}")),
            "names the server and its URL: {err}"
        );
        assert!(err.contains("Connection refused"), "{err}");
        assert_eq!(err.matches("tcp connect error").count(), 1, "{err}");

        let err = sidecar(&scheme_less);
        assert!(err.contains("use http://HOST:PORT"), "{err}");
        assert_eq!(err.matches("scheme is missing").count(), 1, "{err}");
    }
}

#[test]
fn verify_reports_a_query_with_too_few_columns_as_a_column_count() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cell.db");
    drop(local_db(&db));
    let source = dir.path().join("verify.toml");
    // created_at left out.
    std::fs::write(
        &source,
        "[tables.users]\nquery = \"SELECT id, 'username', name, 'user', CAST(id AS TEXT) FROM users WHERE id >= ?1 AND id < ?2\"\n",
    )
    .unwrap();
    let output = common::run(
        dir.path(),
        &[
            "verify",
            "--server",
            &format!("http://127.0.0.1:{}", closed_port()),
            "--cell-id",
            "cell-a",
            "--local-db",
            &format!("sqlite://{}", db.display()),
            "--source",
            source.to_str().unwrap(),
        ],
    );
    assert_eq!(output.status.code(), Some(2));
    let err = common::text(&output.stderr);
    assert!(
        err.contains("verify query for table users returns 5 columns; expected 6: table_record_id, claim_type, claim_value, owner_type, owner_value, created_at"),
        "{err}"
    );
}

/// A claims server from before the verification slots answers UNIMPLEMENTED to
/// AcquireVerificationSlot: `verify` says once (even at info level, where the library logs too)
/// that it verifies without a slot, and does its work.
#[tokio::test]
async fn verify_against_a_server_without_slots_runs_without_one_and_says_so_once() {
    let store = Arc::new(MemoryClaimStore::new());
    let server = TestServer::start_without(
        store,
        &["AcquireVerificationSlot", "ReleaseVerificationSlot"],
    )
    .await;
    let setup = VerifySetup::new(&server.endpoint(), 3);
    let output = setup.run(&[], &[("RUST_LOG", "info")]).await;
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(
        stderr
            .matches("the claims server has no verification slots; verifying without one")
            .count(),
        1,
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("verification slot").count(),
        1,
        "no slot taken or released: {stderr}"
    );
    let out = stdout(&output);
    assert!(
        out.contains("missing=3") && out.contains("corrected=3 failed=0"),
        "{out}"
    );
    server.shutdown().await;
}

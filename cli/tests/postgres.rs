//! The real binary with PostgreSQL: `serve --store postgres://…` on a fresh database keeps its
//! data across a restart, `migrate` finds the schema up to date, `reconcile` works against a
//! cell database on PostgreSQL, and concurrent 1,000-claim batches stay within PostgreSQL's
//! default lock table. A lease naming its local transaction (`pg:<system_identifier>:<xid8>`) is
//! listed with it; `reconcile --once` rolls it back at once when that transaction aborted (or its
//! client was killed), leaves it while the transaction runs and commits it with its row, and
//! leaves another cluster's or an unnamed one for the staleness rule. Connection from TOPOLOGY_CLAIMS_TEST_POSTGRES_URL (default
//! postgres://postgres@127.0.0.1:5432/test); unreachable → fails when CI=true, else one skip line.
#![cfg(unix)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::pg::{base_url, with_database, FreshDb, PgCell};
use common::{command, run, text, Server};
use topology_claims::{
    BeginUpdate, ClaimState, ClaimsError, LeaseId, LeasesQuery, LocalTransaction,
    PgLocalTransaction,
};
use topology_claims_client::{ClaimsClient, ClientConfig};
use topology_claims_postgres::tokio_postgres::{self, NoTls};
use topology_claims_testkit::fixtures::{cell, creates, username};

#[tokio::test]
async fn serve_on_postgres_keeps_data_across_a_restart_and_reconcile_uses_a_postgres_cell_db() {
    let Some(db) = FreshDb::create().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = db.url.clone();
    let store = url.clone();
    let server = tokio::task::spawn_blocking({
        let dir = dir.path().to_owned();
        move || {
            Server::start(
                &dir,
                &[
                    "--listen",
                    "127.0.0.1:0",
                    "--store",
                    &store,
                    "--pg-pool-size",
                    "4",
                ],
            )
        }
    })
    .await
    .unwrap();
    let client = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    let a = cell("cell-a");
    let lease = client
        .begin_update(creates(&a, &[username("pg-alice")]))
        .await
        .unwrap();
    client.commit_update(&a, lease.lease_id).await.unwrap();
    let status = tokio::task::spawn_blocking(move || server.stop_with("TERM"))
        .await
        .unwrap();
    assert!(status.success(), "serve exits 0 on SIGTERM: {status:?}");

    let migrate = run(dir.path(), &["migrate", "--store", &url]);
    assert!(migrate.status.success(), "{}", text(&migrate.stderr));
    assert!(
        text(&migrate.stdout).contains("schema is up to date"),
        "{}",
        text(&migrate.stdout)
    );

    let store = url.clone();
    let server = tokio::task::spawn_blocking({
        let dir = dir.path().to_owned();
        move || {
            Server::start(
                &dir,
                &["--listen", "127.0.0.1:0", "--store", &store, "--no-migrate"],
            )
        }
    })
    .await
    .unwrap();
    let client = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    let claim = client
        .lookup_claim(&username("pg-alice").key)
        .await
        .unwrap();
    assert_eq!(
        (claim.cell_id.as_str(), claim.state),
        ("cell-a", ClaimState::Active),
        "survived the restart"
    );

    // The cell's own database is PostgreSQL too (the same database here: the service's tables
    // are named so that they never clash with a cell's `leases_outstanding`).
    let recorded = client
        .begin_update(creates(&a, &[username("pg-kept")]))
        .await
        .unwrap();
    client
        .begin_update(creates(&a, &[username("pg-orphan")]))
        .await
        .unwrap();
    let (cell_db, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(connection);
    topology_claims_postgres::ensure_local_schema(&cell_db)
        .await
        .unwrap();
    cell_db
        .execute(
            "INSERT INTO leases_outstanding (lease_id, created_at, updated_at) VALUES ($1, now(), now())",
            &[recorded.lease_id.as_uuid()],
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (endpoint, local) = (server.endpoint(), url.clone());
    let dir_path = dir.path().to_owned();
    let output = tokio::task::spawn_blocking(move || {
        run(
            &dir_path,
            &[
                "reconcile",
                "--once",
                "--server",
                &endpoint,
                "--cell-id",
                "cell-a",
                "--local-db",
                &local,
                "--staleness",
                "1s",
            ],
        )
    })
    .await
    .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let out = text(&output.stdout);
    assert!(
        out.contains("committed=1") && out.contains("rolled_back=1"),
        "{out}"
    );
    // The tables exist (created as the docs say): the sidecar's own check logs nothing about
    // them, no "NOTICE: relation … already exists, skipping" at info level.
    let err = text(&output.stderr);
    assert!(
        !err.contains("already exists") && !err.contains("NOTICE"),
        "{err}"
    );
    assert_eq!(
        client
            .lookup_claim(&username("pg-kept").key)
            .await
            .unwrap()
            .state,
        ClaimState::Active
    );
    let orphan = client.lookup_claim(&username("pg-orphan").key).await;
    assert!(
        matches!(orphan, Err(ClaimsError::ClaimNotFound { .. })),
        "{orphan:?}"
    );

    drop(server);
    drop(cell_db);
    db.drop_database().await;
}

/// `serve` with its defaults on `db`, from async code.
async fn serve_with_defaults(dir: &std::path::Path, db: &FreshDb) -> Server {
    let (dir, store) = (dir.to_owned(), db.url.clone());
    tokio::task::spawn_blocking(move || {
        Server::start(&dir, &["--listen", "127.0.0.1:0", "--store", &store])
    })
    .await
    .unwrap()
}

/// A client that makes one attempt per call: a failure must surface in the test, not be retried
/// away by the client.
fn one_attempt_client(server: &Server) -> ClaimsClient {
    let config = ClientConfig {
        max_attempts: 1,
        call_timeout: Duration::from_secs(60),
        ..ClientConfig::default()
    };
    ClaimsClient::connect_lazy(&server.endpoint(), config).unwrap()
}

/// Concurrent BeginUpdates of a cell's largest batches on a PostgreSQL with the default lock
/// settings (`max_locks_per_transaction` 64, `max_connections` 100): 48 batches of 1,000 claims,
/// released together against a server with its defaults (group commit on, `--max-batch` 1000,
/// `--pg-pool-size` 16), all succeed at the first attempt, while another cell's begin/commit
/// loop running at the same time never sees an error. One advisory lock per claim key filled
/// the shared lock table here ("out of shared memory", UNAVAILABLE); the store's locks per
/// transaction are now bounded (docs/backends/postgres.md, "Lock budget").
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_thousand_claim_batches_fit_in_the_default_lock_table() {
    const BATCHES: usize = 48;
    const CLAIMS: usize = 1000;
    let Some(db) = FreshDb::create().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = serve_with_defaults(dir.path(), &db).await;
    let connect = || one_attempt_client(&server);

    let stop = Arc::new(AtomicBool::new(false));
    let other_cell = tokio::spawn({
        let (client, stop) = (connect(), stop.clone());
        async move {
            let other = cell("cell-other");
            let mut rounds = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let record = username(&format!("other-{rounds}"));
                let lease = client
                    .begin_update(creates(&other, &[record]))
                    .await
                    .map_err(|e| format!("BeginUpdate of round {rounds}: {e}"))?;
                client
                    .commit_update(&other, lease.lease_id)
                    .await
                    .map_err(|e| format!("CommitUpdate of round {rounds}: {e}"))?;
                rounds += 1;
            }
            Ok::<u32, String>(rounds)
        }
    });

    let big = cell("cell-big");
    let barrier = Arc::new(tokio::sync::Barrier::new(BATCHES));
    let mut batches = Vec::new();
    for batch in 0..BATCHES {
        let (client, barrier, big) = (connect(), barrier.clone(), big.clone());
        let records: Vec<_> = (0..CLAIMS)
            .map(|i| username(&format!("big-{batch}-{i}")))
            .collect();
        batches.push(tokio::spawn(async move {
            barrier.wait().await;
            let begun = client.begin_update(creates(&big, &records)).await;
            (client, begun)
        }));
    }
    let mut failures = Vec::new();
    let mut begun = Vec::new();
    for (batch, handle) in batches.into_iter().enumerate() {
        match handle.await.unwrap() {
            (client, Ok(lease)) => begun.push((batch, client, lease.lease_id)),
            (_, Err(e)) => failures.push(format!("batch {batch}: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {BATCHES} BeginUpdates of {CLAIMS} claims failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // Half committed, half rolled back, again all at once.
    let ends: Vec<_> = begun
        .into_iter()
        .map(|(batch, client, lease_id)| {
            let big = big.clone();
            tokio::spawn(async move {
                let ended = if batch % 2 == 0 {
                    client.commit_update(&big, lease_id).await
                } else {
                    client.rollback_update(&big, lease_id).await
                };
                ended.map_err(|e| format!("batch {batch}: {e}"))
            })
        })
        .collect();
    for end in ends {
        end.await.unwrap().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = other_cell
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("the other cell's loop failed: {e}"));
    assert!(rounds > 0, "the other cell's loop ran");

    let client = connect();
    let kept = client
        .lookup_claim(&username(&format!("big-0-{}", CLAIMS - 1)).key)
        .await
        .unwrap();
    assert_eq!(kept.state, ClaimState::Active, "batch 0 was committed");
    let undone = client.lookup_claim(&username("big-1-0").key).await;
    assert!(
        matches!(undone, Err(ClaimsError::ClaimNotFound { .. })),
        "batch 1 was rolled back: {undone:?}"
    );
    drop(server);
    db.drop_database().await;
}

#[test]
fn sidecars_name_a_missing_cell_database_or_role() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("verify.toml");
    std::fs::write(&source, "[tables.users]\nquery = \"SELECT 1\"\n").unwrap();
    let source = source.to_str().unwrap().to_owned();
    let base = base_url();
    let no_role = {
        let (scheme, rest) = base.split_once("://").unwrap();
        let host = rest.split_once('@').map_or(rest, |(_, host)| host);
        format!("{scheme}://tc_no_such_role@{host}")
    };
    for (url, cause) in [
        (
            with_database(&base, "tc_no_such_db"),
            "database \"tc_no_such_db\" does not exist",
        ),
        (no_role, "role \"tc_no_such_role\" does not exist"),
    ] {
        for command in [
            vec!["reconcile", "--once"],
            vec!["verify", "--source", &source],
        ] {
            let args = [command, vec!["--cell-id", "cell-a", "--local-db", &url]].concat();
            let output = run(dir.path(), &args);
            let err = text(&output.stderr);
            if std::env::var("CI").as_deref() != Ok("true") && err.contains("Connection refused") {
                println!("postgres tests skipped: {err}");
                return;
            }
            assert_eq!(output.status.code(), Some(2), "{args:?}: {err}");
            assert!(err.contains(cause), "{args:?}: {err}");
            assert!(!err.contains("creating a new object"), "{args:?}: {err}");
        }
    }
}

#[test]
fn verify_reports_a_postgres_query_with_too_few_columns_as_a_column_count() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("verify.toml");
    std::fs::write(
        &source,
        "[tables.emails]\nquery = \"SELECT $1::bigint, 'email', 'a@example.com', 'user', '1' WHERE $2::bigint > 0\"\n",
    )
    .unwrap();
    let url = base_url();
    let output = run(
        dir.path(),
        &[
            "verify",
            "--server",
            "http://127.0.0.1:9",
            "--cell-id",
            "cell-a",
            "--local-db",
            &url,
            "--source",
            source.to_str().unwrap(),
        ],
    );
    let err = text(&output.stderr);
    if std::env::var("CI").as_deref() != Ok("true") && err.contains("Connection refused") {
        println!("postgres tests skipped: {err}");
        return;
    }
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(
        err.contains("verify query for table emails returns 5 columns; expected 6: table_record_id, claim_type, claim_value, owner_type, owner_value, created_at"),
        "{err}"
    );
}

/// A cell on PostgreSQL whose leases name their local transaction (`pg:<system_identifier>:<xid8>`),
/// a `serve` on memory, and `reconcile --once` at the default staleness (10 minutes).
type LocalTransactionCell = PgCell;

impl PgCell {
    /// A connection of the cell's application, with its connection task (abort it to kill the
    /// client without a goodbye).
    async fn connect(&self) -> (tokio_postgres::Client, tokio::task::JoinHandle<()>) {
        let (client, connection) = tokio_postgres::connect(&self.db.url, NoTls).await.unwrap();
        let task = tokio::spawn(async move {
            let _ = connection.await;
        });
        (client, task)
    }

    /// BEGINs on `app` and returns the transaction's `local_transaction`, as a cell computes it.
    async fn begin_local(app: &tokio_postgres::Client) -> LocalTransaction {
        app.batch_execute("BEGIN").await.unwrap();
        let text: String = app
            .query_one(
                "SELECT 'pg:' || (SELECT system_identifier FROM pg_control_system()) || ':' || pg_current_xact_id()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        LocalTransaction::parse_field(&text, "local_transaction").unwrap()
    }

    /// BeginUpdate of username `name` naming `local`.
    async fn lease(&self, name: &str, local: Option<LocalTransaction>) -> LeaseId {
        let request = BeginUpdate {
            local_transaction: local,
            ..creates(&cell("cell-a"), &[username(name)])
        };
        self.client.begin_update(request).await.unwrap().lease_id
    }

    /// An application connection with an open local transaction that leased username `name`
    /// (naming itself) and recorded the lease, uncommitted.
    async fn leased_in_open_transaction(
        &self,
        name: &str,
    ) -> (tokio_postgres::Client, tokio::task::JoinHandle<()>, LeaseId) {
        let (app, task) = self.connect().await;
        let local = Self::begin_local(&app).await;
        let lease_id = self.lease(name, Some(local)).await;
        Self::record(&app, lease_id).await;
        (app, task, lease_id)
    }

    async fn record(app: &tokio_postgres::Client, lease_id: LeaseId) {
        app.execute(
            "INSERT INTO leases_outstanding (lease_id, created_at, updated_at) VALUES ($1, now(), now())",
            &[lease_id.as_uuid()],
        )
        .await
        .unwrap();
    }

    /// `reconcile --once` with `extra` flags; its report line.
    async fn reconcile(&self, extra: &[&str]) -> String {
        let mut args: Vec<String> = [
            "reconcile",
            "--once",
            "--server",
            &self.server.endpoint(),
            "--cell-id",
            "cell-a",
            "--local-db",
            &self.db.url,
        ]
        .map(String::from)
        .into();
        args.extend(extra.iter().map(|s| s.to_string()));
        let dir = self.dir.path().to_owned();
        let output = tokio::task::spawn_blocking(move || {
            run(&dir, &args.iter().map(String::as_str).collect::<Vec<_>>())
        })
        .await
        .unwrap();
        assert!(output.status.success(), "{}", text(&output.stderr));
        text(&output.stdout)
    }

    async fn state(&self, name: &str) -> Option<ClaimState> {
        match self.client.lookup_claim(&username(name).key).await {
            Ok(claim) => Some(claim.state),
            Err(ClaimsError::ClaimNotFound { .. }) => None,
            Err(error) => panic!("lookup of {name}: {error}"),
        }
    }

    async fn stop(self) {
        drop(self.server);
        self.db.drop_database().await;
    }
}

/// Waits until the backend of `pid` has gone (it noticed its client's dropped connection and
/// aborted the open transaction).
async fn wait_for_backend_exit(admin: &tokio_postgres::Client, pid: i32) {
    for _ in 0..200 {
        let alive: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .await
            .unwrap()
            .get(0);
        if alive == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("backend {pid} did not exit after its client was killed");
}

#[tokio::test]
async fn a_lease_naming_its_local_transaction_is_listed_with_it_unchanged() {
    let Some(cell_a) = LocalTransactionCell::start().await else {
        return;
    };
    let (app, _task) = cell_a.connect().await;
    let local = LocalTransactionCell::begin_local(&app).await;
    let lease_id = cell_a.lease("lt-listed", Some(local.clone())).await;
    let page = cell_a
        .client
        .list_outstanding_leases(&LeasesQuery::new(cell("cell-a"), None, 10))
        .await
        .unwrap();
    assert_eq!(page.leases.len(), 1);
    assert_eq!(page.leases[0].lease_id, lease_id);
    assert_eq!(
        page.leases[0].request.local_transaction,
        Some(local.clone())
    );

    let (endpoint, dir) = (cell_a.server.endpoint(), cell_a.dir.path().to_owned());
    let output = tokio::task::spawn_blocking(move || {
        run(
            &dir,
            &["leases", "--server", &endpoint, "--cell-id", "cell-a"],
        )
    })
    .await
    .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let out = text(&output.stdout);
    assert!(
        out.contains(&format!("local transaction {local}")),
        "the operator's listing shows it: {out}"
    );
    app.batch_execute("ROLLBACK").await.unwrap();
    drop(app);
    cell_a.stop().await;
}

#[tokio::test]
async fn reconcile_once_rolls_back_the_leases_of_aborted_and_killed_local_transactions_at_once() {
    let Some(cell_a) = LocalTransactionCell::start().await else {
        return;
    };
    // The application rolls its transaction back (and, like a crashed cell, never calls
    // RollbackUpdate).
    let (app, _task, _) = cell_a.leased_in_open_transaction("lt-aborted").await;
    app.batch_execute("ROLLBACK").await.unwrap();

    // The client is killed with its transaction open: the connection drops without a goodbye.
    let (killed_app, task, _) = cell_a.leased_in_open_transaction("lt-killed").await;
    let pid: i32 = killed_app
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    task.abort();
    let _ = task.await;
    drop(killed_app);
    wait_for_backend_exit(&cell_a.db.admin, pid).await;

    assert_eq!(cell_a.state("lt-aborted").await, Some(ClaimState::Creating));
    let out = cell_a.reconcile(&[]).await;
    assert!(
        out.contains("rolled_back=2") && out.contains("rolled_back_aborted=2"),
        "both rolled back in the first pass, at the default 10-minute staleness: {out}"
    );
    assert_eq!(cell_a.state("lt-aborted").await, None, "free again");
    assert_eq!(cell_a.state("lt-killed").await, None, "free again");
    drop(app);
    cell_a.stop().await;
}

#[tokio::test]
async fn reconcile_once_leaves_an_open_local_transaction_then_commits_it_with_its_row() {
    let Some(cell_a) = LocalTransactionCell::start().await else {
        return;
    };
    let (app, _task, _) = cell_a.leased_in_open_transaction("lt-open").await;

    let out = cell_a.reconcile(&[]).await;
    assert!(
        out.contains("rolled_back=0")
            && out.contains("committed=0")
            && out.contains("left_young=1"),
        "in progress: left alone: {out}"
    );
    assert_eq!(cell_a.state("lt-open").await, Some(ClaimState::Creating));

    app.batch_execute("COMMIT").await.unwrap();
    let out = cell_a.reconcile(&[]).await;
    assert!(out.contains("committed=1"), "committed with its row: {out}");
    assert_eq!(cell_a.state("lt-open").await, Some(ClaimState::Active));
    drop(app);
    cell_a.stop().await;
}

#[tokio::test]
async fn reconcile_once_leaves_another_clusters_or_an_unnamed_transactions_lease_for_staleness() {
    let Some(cell_a) = LocalTransactionCell::start().await else {
        return;
    };
    // An aborted transaction, but named with another cluster's system identifier: this
    // cluster cannot vouch for it.
    let (app, _task) = cell_a.connect().await;
    let local = LocalTransactionCell::begin_local(&app).await;
    app.batch_execute("ROLLBACK").await.unwrap();
    let named = PgLocalTransaction::parse(&local).unwrap();
    let foreign = PgLocalTransaction {
        system_identifier: named.system_identifier ^ 1,
        ..named
    };
    cell_a
        .lease("lt-foreign", Some(foreign.to_local_transaction()))
        .await;
    cell_a.lease("lt-unnamed", None).await;

    let out = cell_a.reconcile(&[]).await;
    assert!(
        out.contains("rolled_back=0") && out.contains("left_young=2"),
        "both wait for the staleness: {out}"
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let out = cell_a.reconcile(&["--staleness", "1s"]).await;
    assert!(
        out.contains("rolled_back=2") && out.contains("rolled_back_aborted=0"),
        "then stale, rolled back by today's rule: {out}"
    );
    assert_eq!(cell_a.state("lt-foreign").await, None);
    assert_eq!(cell_a.state("lt-unnamed").await, None);
    drop(app);
    cell_a.stop().await;
}

#[tokio::test]
async fn reconcile_logs_why_a_young_lease_waits_once_not_on_every_pass() {
    let Some(cell_a) = LocalTransactionCell::start().await else {
        return;
    };
    let (app, _task, lease_id) = cell_a.leased_in_open_transaction("lt-logged").await;
    let mut reconciler = command(
        cell_a.dir.path(),
        &[
            "reconcile",
            "--server",
            &cell_a.server.endpoint(),
            "--cell-id",
            "cell-a",
            "--local-db",
            &cell_a.db.url,
            "--interval",
            "100ms",
        ],
    );
    reconciler
        .env("RUST_LOG", "topology_claims=debug")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = reconciler.spawn().unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    child.kill().unwrap();
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let (err, out) = (text(&output.stderr), text(&output.stdout));
    let passes = err.matches("reconcile pass").count() + out.matches("left_young=1").count();
    assert!(passes >= 3, "several passes ran: {err}{out}");
    let fallbacks = err
        .lines()
        .filter(|line| {
            line.contains("left for the staleness rule") && line.contains(&lease_id.to_string())
        })
        .count();
    assert_eq!(fallbacks, 1, "logged once, with why (in progress): {err}");
    assert!(
        err.contains("its local transaction is in progress"),
        "{err}"
    );
    app.batch_execute("ROLLBACK").await.unwrap();
    drop(app);
    cell_a.stop().await;
}

/// A store that is up to date starts without PostgreSQL's NOTICEs ("relation … already exists,
/// skipping") in the log: they are not news, and the driver would log each at INFO.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_up_to_date_store_starts_without_postgres_notices_in_the_log() {
    let Some(db) = FreshDb::create().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for round in ["first", "second"] {
        let out = command(dir.path(), &["migrate", "--store", &db.url])
            .env("RUST_LOG", "info")
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert!(out.status.success(), "{round} migrate: {err}");
        assert!(
            !err.contains("NOTICE") && !err.contains("skipping"),
            "{round} migrate: {err}"
        );
    }
    db.drop_database().await;
}

/// TLS to PostgreSQL (the local cluster serves Debian's snake-oil certificate, CN and SAN
/// `localhost`): `sslmode=require` encrypts every connection of the store (pg_stat_ssl says
/// so), `verify-ca` checks the chain to `sslrootcert`, `verify-full` also the host name, and a
/// mismatch is refused at start naming the certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_speaks_tls_to_postgres_as_sslmode_says() {
    const SNAKE_OIL: &str = "/etc/ssl/certs/ssl-cert-snakeoil.pem";
    let Some(db) = FreshDb::create().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let localhost = db.url.replace("127.0.0.1", "localhost");
    for (url, app) in [
        (format!("{}?sslmode=require&application_name=tc_tls_require", db.url), "tc_tls_require"),
        (
            format!("{}?sslmode=verify-ca&sslrootcert={SNAKE_OIL}&application_name=tc_tls_ca", db.url),
            "tc_tls_ca",
        ),
        (
            format!("{localhost}?sslmode=verify-full&sslrootcert={SNAKE_OIL}&application_name=tc_tls_full"),
            "tc_tls_full",
        ),
    ] {
        let (d, store) = (dir.path().to_owned(), url.clone());
        let server = tokio::task::spawn_blocking(move || {
            Server::start(&d, &["--listen", "127.0.0.1:0", "--store", &store])
        })
        .await
        .unwrap();
        let client = one_attempt_client(&server);
        client
            .lookup_claim(&username("nobody").key)
            .await
            .expect_err("not found, over TLS");
        // A cell's own database takes the same parameters (the sidecars' --local-db).
        let (d, endpoint, local) = (dir.path().to_owned(), server.endpoint(), url.clone());
        let pass = tokio::task::spawn_blocking(move || {
            run(
                &d,
                &[
                    "reconcile", "--once", "--server", &endpoint, "--cell-id", "cell-tls",
                    "--local-db", &local,
                ],
            )
        })
        .await
        .unwrap();
        assert!(pass.status.success(), "{url}: {}", text(&pass.stderr));
        let rows = db
            .admin
            .query(
                "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
                 WHERE a.application_name = $1",
                &[&app],
            )
            .await
            .unwrap();
        assert!(!rows.is_empty(), "{url}: the store's connections are listed");
        assert!(
            rows.iter().all(|r| r.get::<_, bool>(0)),
            "{url}: every connection encrypted"
        );
        tokio::task::spawn_blocking(move || server.stop_with("TERM"))
            .await
            .unwrap();
    }
    // verify-full against 127.0.0.1: the certificate names localhost only.
    let out = run(
        dir.path(),
        &[
            "migrate",
            "--store",
            &format!("{}?sslmode=verify-full&sslrootcert={SNAKE_OIL}", db.url),
        ],
    );
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    db.drop_database().await;
}

/// The store's pool is in the metrics on PostgreSQL: its connections by state, its maximum
/// (`--pg-pool-size`) and the transactions waiting for one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_pool_is_in_the_metrics() {
    let Some(db) = FreshDb::create().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (d, store) = (dir.path().to_owned(), db.url.clone());
    let server = tokio::task::spawn_blocking(move || {
        Server::start(
            &d,
            &[
                "--listen",
                "127.0.0.1:0",
                "--store",
                &store,
                "--pg-pool-size",
                "5",
                "--metrics-listen",
                "127.0.0.1:0",
            ],
        )
    })
    .await
    .unwrap();
    let metrics = server.child.metrics_addr(common::PATIENCE).unwrap();
    let client = one_attempt_client(&server);
    let a = cell("cell-pool");
    let lease = client
        .begin_update(creates(&a, &[username("pooled")]))
        .await
        .unwrap();
    client.commit_update(&a, lease.lease_id).await.unwrap();
    let text = common::scrape(metrics);
    let gauge = |name: &str, labels: &[(&str, &str)]| {
        common::value(&text, name, labels).unwrap_or_else(|| panic!("{name} missing:\n{text}"))
    };
    assert_eq!(
        gauge("topology_claims_store_pool_max_connections", &[]),
        5.0
    );
    let open = gauge(
        "topology_claims_store_pool_connections",
        &[("state", "in_use")],
    ) + gauge(
        "topology_claims_store_pool_connections",
        &[("state", "idle")],
    );
    assert!(
        (1.0..=5.0).contains(&open),
        "connections opened and kept: {open}"
    );
    assert_eq!(gauge("topology_claims_store_pool_waiting", &[]), 0.0);
    tokio::task::spawn_blocking(move || server.stop_with("TERM"))
        .await
        .unwrap();
    db.drop_database().await;
}

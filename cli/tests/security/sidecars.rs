//! The cell side and its sidecars over mutual TLS against PostgreSQL.

use super::*;

/// The cell side over mutual TLS against PostgreSQL: the three-phase transaction of a Rust cell
/// (its local database on PostgreSQL), then `reconcile` and `verify` with `--tls-*` flags.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cell_side_and_its_sidecars_run_over_mtls_against_postgres() {
    use topology_claims::{ClaimState, ClaimType, TableName};
    use topology_claims_client::{ClaimsClient, ClientConfig, ClientTls, UpdateConfig};
    use topology_claims_harness::postgres::{self as pg, TempSchema};
    use topology_claims_postgres::{PostgresLocalLeaseStore, PostgresOptions};
    use topology_claims_testkit::fixtures::{cell, creates, record_in};

    let pki = Pki::new();
    pki.client(
        "cell-a",
        Some("spiffe://topology-claims/cell/cell-a"),
        false,
        false,
    );
    let schema =
        match TempSchema::create(&pg::test_url(), "tc_sec_", Duration::from_secs(3600)).await {
            Ok(schema) => schema,
            Err(why) if !topology_claims_harness::in_ci() => {
                println!("postgres security test skipped: {why}");
                return;
            }
            Err(why) => panic!("CI=true needs PostgreSQL: {why}"),
        };
    let url = schema.url("tc-sec").unwrap();
    let server = pki.start_on(&url, &[]);
    let (ca, cert, key) = (
        pki.path("ca.pem"),
        pki.path("cell-a.pem"),
        pki.path("cell-a-key.pem"),
    );
    let tls = ClientTls::from_files(&ca, Some((&cert, &key)))
        .unwrap()
        .with_server_name("localhost");
    let endpoint = format!("https://{}", server.addr);
    let client = ClaimsClient::connect_lazy(
        &endpoint,
        ClientConfig {
            tls: Some(tls),
            ..ClientConfig::default()
        },
    )
    .unwrap();

    // The cell's database: its application table and leases_outstanding, in the same schema.
    let options = PostgresOptions {
        schema: Some(schema.name.clone()),
        ..PostgresOptions::default()
    };
    let leases = PostgresLocalLeaseStore::connect(&pg::test_url(), options)
        .await
        .unwrap();
    leases.ensure_schema().await.unwrap();
    let mut db = pg::connect(&url).await.unwrap();
    db.batch_execute("CREATE TABLE users (id bigint PRIMARY KEY, name text NOT NULL, created_at timestamptz NOT NULL DEFAULT now() - interval '2 hours')")
        .await
        .unwrap();
    let a = cell("cell-a");
    let user = |id: i64, name: &str| record_in(TableName::USERS, id, ClaimType::Username, name);

    // Three phases: lease, local commit recording the lease, commit.
    let ((), _) = topology_claims_postgres::cell::transact::<
        _,
        topology_claims_postgres::tokio_postgres::Error,
        _,
    >(
        &client,
        &mut db,
        &leases,
        creates(&a, &[user(1, "tls-alice")]),
        UpdateConfig::default(),
        |tx| {
            Box::pin(async move {
                tx.execute("INSERT INTO users (id, name) VALUES (1, 'tls-alice')", &[])
                    .await?;
                Ok(())
            })
        },
    )
    .await
    .unwrap();
    assert_eq!(
        client
            .lookup_claim(&user(1, "tls-alice").key)
            .await
            .unwrap()
            .state,
        ClaimState::Active
    );

    // A crash after BeginUpdate: the reconciler over mTLS rolls the stale lease back.
    client
        .begin_update(creates(&a, &[user(2, "tls-orphan")]))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let tls_flags = [
        "--tls-ca",
        ca.to_str().unwrap(),
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--tls-server-name",
        "localhost",
    ];
    let dir = pki.dir.path().to_owned();
    let args: Vec<String> = [
        "reconcile",
        "--once",
        "--server",
        &endpoint,
        "--cell-id",
        "cell-a",
        "--local-db",
        &url,
        "--staleness",
        "1s",
    ]
    .iter()
    .chain(tls_flags.iter())
    .map(|s| s.to_string())
    .collect();
    let output = tokio::task::spawn_blocking({
        let dir = dir.clone();
        move || common::run(&dir, &args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        text(&output.stdout).contains("rolled_back=1"),
        "{}",
        text(&output.stdout)
    );

    // Drift the verifier corrects over mTLS: a local user without its claim.
    db.batch_execute("INSERT INTO users (id, name) VALUES (3, 'tls-missing')")
        .await
        .unwrap();
    let source = pki.path("verify.toml");
    std::fs::write(
        &source,
        "[tables.users]\nquery = \"SELECT id, 'username', name, 'user', CAST(id AS TEXT), CAST(EXTRACT(EPOCH FROM created_at) AS BIGINT) FROM users WHERE id >= $1 AND id < $2\"\n",
    )
    .unwrap();
    let args: Vec<String> = [
        "verify",
        "--server",
        &endpoint,
        "--cell-id",
        "cell-a",
        "--local-db",
        &url,
        "--source",
        source.to_str().unwrap(),
        "--recent",
        "0s",
        "--cursor-file",
        pki.path("cursor").to_str().unwrap(),
    ]
    .iter()
    .chain(tls_flags.iter())
    .map(|s| s.to_string())
    .collect();
    let output = tokio::task::spawn_blocking(move || {
        common::run(&dir, &args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "{}\n{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    assert_eq!(
        client
            .lookup_claim(&user(3, "tls-missing").key)
            .await
            .unwrap()
            .cell_id
            .as_str(),
        "cell-a",
        "the verifier created the missing claim over mTLS"
    );
    drop(server);
    drop(db);
    let _ = schema.drop().await;
}

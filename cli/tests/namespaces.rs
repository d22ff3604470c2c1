//! `topology-claims admin namespaces` through the real binary: list and get (text and
//! `--json`), a namespace created and claimed in, an update refused with its collisions listed
//! (exit 2, the reason on stderr) and one applied, all persisted across a restart of the server
//! on SQLite and PostgreSQL; a non-empty namespace not deleted; every change audited; under
//! mutual TLS a cell may read the namespaces but not create or change them.
#![cfg(unix)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::{command, text, Server};
use topology_claims_client::{ClaimsClient, ClientConfig};
use topology_claims_testkit::fixtures::{cell, creates, email};

fn serve_args(store: &str, audit: &Path) -> Vec<String> {
    // A client channel of this test may still be open at a stop: do not wait 30 s for it.
    [
        "--listen",
        "127.0.0.1:0",
        "--drain-timeout",
        "1s",
        "--store",
        store,
        "--audit-log",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([audit.to_str().unwrap().to_owned()])
    .collect()
}

/// Runs `topology-claims admin --server … namespaces ARGS`.
async fn namespaces(dir: &Path, server: &Server, args: &[&str]) -> std::process::Output {
    let endpoint = server.endpoint();
    let mut full = vec!["admin", "--server", &endpoint, "namespaces"];
    full.extend_from_slice(args);
    let mut command = command(dir, &full);
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

async fn commit_in(server: &Server, cell_id: &str, namespace: &str, value: &str) {
    let record = topology_claims_testkit::fixtures::record_in(
        topology_claims::TableName::PROJECTS,
        1,
        topology_claims::domain::NamespaceId::parse(namespace).unwrap(),
        value,
    );
    let client = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    let lease = client
        .begin_update(creates(&cell(cell_id), &[record]))
        .await
        .unwrap();
    client
        .commit_update(&cell(cell_id), lease.lease_id)
        .await
        .unwrap();
}

async fn commit(server: &Server, cell_id: &str, value: &str) {
    let client = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    let lease = client
        .begin_update(creates(&cell(cell_id), &[email(value)]))
        .await
        .unwrap();
    client
        .commit_update(&cell(cell_id), lease.lease_id)
        .await
        .unwrap();
}

fn json(output: &std::process::Output) -> serde_json::Value {
    assert!(output.status.success(), "{}", text(&output.stderr));
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&output.stdout)))
}

async fn round_trip(dir: &Path, store: &str) {
    let audit = dir.join("audit.log");
    let server = Server::start_async(dir, serve_args(store, &audit)).await;
    let listed = namespaces(dir, &server, &["list"]).await;
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let table = text(&listed.stdout);
    for id in ["emails", "routes", "usernames"] {
        assert!(
            table.contains(id) && table.contains("precis-username"),
            "{table}"
        );
    }
    commit(&server, "cell-a", "Ann@Example.com").await;
    // To exact (keys rewritten), a second claim only exact tells apart, then back: refused.
    let exact = namespaces(
        dir,
        &server,
        &[
            "update",
            "emails",
            "--normalization",
            "exact",
            "--reason",
            "test",
            "--json",
        ],
    )
    .await;
    assert_eq!(json(&exact)["normalization"], "exact");
    commit(&server, "cell-b", "ann@example.com").await;
    let counted = namespaces(dir, &server, &["count", "--json"]).await;
    assert_eq!(json(&counted), serde_json::json!({"emails": 2}));
    let refused = namespaces(
        dir,
        &server,
        &[
            "update",
            "emails",
            "--normalization",
            "precis-username",
            "--reason",
            "test",
        ],
    )
    .await;
    assert_eq!(refused.status.code(), Some(2));
    let said = text(&refused.stderr);
    assert!(
        said.contains("NAMESPACE_RULES_CONFLICT") && said.contains("Ann@Example.com"),
        "{said}"
    );
    let reserved = namespaces(
        dir,
        &server,
        &[
            "update",
            "usernames",
            "--reserved",
            "admin,root",
            "--deprecated",
            "false",
            "--reason",
            "test",
        ],
    )
    .await;
    assert!(reserved.status.success(), "{}", text(&reserved.stderr));
    let created = namespaces(
        dir,
        &server,
        &[
            "create",
            "pages-domains",
            "--normalization",
            "ascii-case-insensitive",
            "--pattern",
            "^[a-z0-9.-]+$",
            "--description",
            "Pages domains",
            "--reason",
            "test",
            "--json",
        ],
    )
    .await;
    assert_eq!(json(&created)["version"], 1);
    commit_in(&server, "cell-a", "pages-domains", "Docs.Example.COM").await;
    let log = std::fs::read_to_string(&audit).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("\"method\":\"CreateNamespace\"")
                && l.contains("pages-domains: created")),
        "{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("\"method\":\"UpdateNamespace\"")
                && l.contains("usernames: reserved=")
                && l.contains("\"stage\":\"done\"")),
        "{log}"
    );
    server.stop_with("TERM");

    // A new server on the same store: the rules are the store's.
    let server = Server::start_async(dir, serve_args(store, &audit)).await;
    let emails = json(&namespaces(dir, &server, &["get", "emails", "--json"]).await);
    assert_eq!(
        (emails["normalization"].as_str(), emails["version"].as_u64()),
        (Some("exact"), Some(2))
    );
    let usernames = json(&namespaces(dir, &server, &["get", "usernames", "--json"]).await);
    assert_eq!(usernames["reserved"], serde_json::json!(["admin", "root"]));
    // The created namespace and its claim outlive the server; a non-empty one is not deleted,
    // and without a terminal nor --yes nothing is called.
    let client = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    let claim = client
        .lookup_claim(&topology_claims::ClaimKey::new(
            topology_claims::domain::NamespaceId::parse("pages-domains").unwrap(),
            "docs.example.com",
        ))
        .await
        .unwrap();
    assert_eq!(claim.record.display_value(), "Docs.Example.COM");
    drop(client);
    let unconfirmed = namespaces(dir, &server, &["delete", "pages-domains", "--reason", "t"]).await;
    assert_eq!(
        unconfirmed.status.code(),
        Some(1),
        "{}",
        text(&unconfirmed.stderr)
    );
    let not_empty = namespaces(
        dir,
        &server,
        &["delete", "pages-domains", "--reason", "t", "--yes"],
    )
    .await;
    assert_eq!(not_empty.status.code(), Some(2));
    assert!(
        text(&not_empty.stderr).contains("NAMESPACE_NOT_EMPTY"),
        "{}",
        text(&not_empty.stderr)
    );
    let missing = namespaces(dir, &server, &["get", "ssh-keys"]).await;
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        text(&missing.stderr).contains("NAMESPACE_NOT_FOUND"),
        "{}",
        text(&missing.stderr)
    );
    server.stop_with("TERM");
}

#[tokio::test]
async fn namespace_rules_round_trip_and_persist_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("claims.db").display());
    round_trip(dir.path(), &store).await;
}

#[tokio::test]
async fn namespace_rules_round_trip_and_persist_on_postgres() {
    use topology_claims_harness::postgres::{test_url, TempSchema};
    let schema =
        match TempSchema::create(&test_url(), "tc_namespaces_", Duration::from_secs(3600)).await {
            Ok(schema) => schema,
            Err(e) if topology_claims_harness::in_ci() => panic!("PostgreSQL with CI=true: {e}"),
            Err(e) => {
                println!("postgres test skipped: {e}");
                return;
            }
        };
    let dir = tempfile::tempdir().unwrap();
    round_trip(dir.path(), &schema.url("tc-namespaces").unwrap()).await;
    schema.drop().await.unwrap();
}

#[tokio::test]
async fn a_cell_reads_the_namespaces_but_only_an_admin_changes_them() {
    use topology_claims_harness::pki::DevPki;
    std::env::set_var("TOPOLOGY_CLAIMS_BIN", common::BIN);
    let dir = tempfile::tempdir().unwrap();
    let pki = DevPki::create(&dir.path().join("pki")).unwrap();
    let audit = dir.path().join("audit.log");
    let mut args = serve_args("memory:", &audit);
    args.extend(pki.serve_args());
    let server = Server::start_async(dir.path(), args).await;
    let endpoint = format!("https://localhost:{}", server.child.addr.port());
    let as_role = |role: &str, name: &str, call: &[&str]| {
        let args = [&["namespaces"], call].concat();
        common::admin_as(dir.path(), &pki, &endpoint, (role, name), &args)
    };
    let read = as_role("cell", "cell-a", &["list", "--json"]);
    assert!(read.status.success(), "{}", text(&read.stderr));
    // Counting reads every claim: the admin role's alone.
    let count = as_role("cell", "cell-a", &["count"]);
    assert_eq!(count.status.code(), Some(2), "{}", text(&count.stderr));
    assert!(as_role("admin", "ops", &["count"]).status.success());
    let change = [
        "update",
        "usernames",
        "--deprecated",
        "true",
        "--reason",
        "test",
    ];
    let refused = as_role("cell", "cell-a", &change);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        text(&refused.stderr).contains("ROLE_NOT_ALLOWED"),
        "{}",
        text(&refused.stderr)
    );
    let done = as_role("admin", "ops", &change);
    assert!(done.status.success(), "{}", text(&done.stderr));
    assert!(
        text(&done.stdout).contains("deprecated:     true"),
        "{}",
        text(&done.stdout)
    );
    server.stop_with("TERM");
}

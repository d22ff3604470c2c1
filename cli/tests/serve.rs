//! The real `topology-claims` binary: `serve` on an ephemeral port over a SQLite temp file,
//! signals, restarts, migrations, and the operator commands against it.
#![cfg(unix)]

use std::path::{Path, PathBuf};

use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use topology_claims::{ClaimType, OwnerType, TableName};
use topology_claims_proto::pb;
use topology_claims_proto::pb::claims_service_client::ClaimsServiceClient;

mod common;

use common::{command, run, text, Server};

fn sqlite_url(path: &Path) -> String {
    format!("sqlite://{}", path.display())
}

fn temp() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let db = dir.path().join("claims.db");
    (dir, db)
}

fn email_claim(value: &str) -> pb::ClaimRecord {
    pb::ClaimRecord {
        claim_type: ClaimType::Email.number(),
        claim_value: value.to_owned(),
        owner: OwnerType::USER.number(),
        owner_value: "user-42".to_owned(),
        table_name: TableName::EMAILS.number(),
        table_record_id: 4242,
        ..Default::default()
    }
}

async fn client(server: &Server) -> ClaimsServiceClient<tonic::transport::Channel> {
    ClaimsServiceClient::connect(server.endpoint())
        .await
        .expect("connect to serve")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_prints_the_real_port_answers_health_checks_and_exits_0_on_sigterm() {
    let (dir, db) = temp();
    let server = Server::start(
        dir.path(),
        &["--listen", "127.0.0.1:0", "--store", &sqlite_url(&db)],
    );
    let port: u16 = server
        .addr
        .strip_prefix("127.0.0.1:")
        .expect("127.0.0.1:PORT")
        .parse()
        .expect("a port");
    assert_ne!(port, 0, "the real port is printed");

    let channel = tonic::transport::Endpoint::from_shared(server.endpoint())
        .expect("an endpoint")
        .connect()
        .await
        .expect("connect");
    let mut health = HealthClient::new(channel);
    for service in ["", "topology.claims.v1.ClaimsService"] {
        let answer = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("health check");
        assert_eq!(
            answer.into_inner().status(),
            ServingStatus::Serving,
            "{service:?}"
        );
    }
    drop(health);
    let status = server.stop_with("TERM");
    assert_eq!(
        status.code(),
        Some(0),
        "SIGTERM drains and exits 0: {status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_drains_and_exits_0_too() {
    let (dir, _) = temp();
    // One runtime worker (`--worker-threads`): serves and drains the same.
    let server = Server::start(
        dir.path(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--store",
            "memory:",
            "--worker-threads",
            "1",
        ],
    );
    let mut client = client(&server).await;
    client
        .begin_update(pb::BeginUpdateRequest {
            cell_id: "cell-a".into(),
            creates_claims: vec![email_claim("one-worker@example.com")],
            ..Default::default()
        })
        .await
        .expect("served by one worker");
    drop(client);
    let status = tokio::task::spawn_blocking(move || server.stop_with("INT"))
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[test]
fn worker_threads_out_of_range_is_refused_naming_the_flag() {
    let (dir, _) = temp();
    serve_refuses_env(
        dir.path(),
        "TOPOLOGY_CLAIMS_WORKER_THREADS",
        "5000",
        "--worker-threads",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_written_through_serve_survives_sigterm_and_a_restart_on_the_same_file() {
    let (dir, db) = temp();
    let store = sqlite_url(&db);
    let args = ["--listen", "127.0.0.1:0", "--store", store.as_str()];
    let server = Server::start(dir.path(), &args);
    let mut c = client(&server).await;
    let claim = email_claim("kept@example.com");
    let lease = c
        .begin_update(pb::BeginUpdateRequest {
            cell_id: "cell-a".into(),
            creates_claims: vec![claim.clone()],
            ..Default::default()
        })
        .await
        .expect("BeginUpdate")
        .into_inner()
        .lease_payload
        .expect("payload");
    c.commit_update(pb::CommitUpdateRequest {
        cell_id: "cell-a".into(),
        lease_id: lease.lease_id.clone(),
    })
    .await
    .expect("CommitUpdate");
    // A second lease stays outstanding across the restart.
    let open = c
        .begin_update(pb::BeginUpdateRequest {
            cell_id: "cell-a".into(),
            creates_claims: vec![email_claim("pending@example.com")],
            ..Default::default()
        })
        .await
        .expect("BeginUpdate")
        .into_inner()
        .lease_payload
        .expect("payload");
    drop(c);
    assert_eq!(server.stop_with("TERM").code(), Some(0));

    let server = Server::start(dir.path(), &args);
    let mut c = client(&server).await;
    let found = c
        .lookup_claim(pb::LookupClaimRequest {
            claim_type: ClaimType::Email.number(),
            claim_value: "kept@example.com".into(),
            ..Default::default()
        })
        .await
        .expect("the claim survived the restart")
        .into_inner();
    assert_eq!(found.cell_id, "cell-a");
    assert_eq!(found.state(), pb::ClaimState::Active);
    // The committed outcome survived too: a retried commit is still an idempotent success.
    c.commit_update(pb::CommitUpdateRequest {
        cell_id: "cell-a".into(),
        lease_id: lease.lease_id.clone(),
    })
    .await
    .expect("commit is idempotent after a restart");

    // The operator commands against it.
    let out = run(
        dir.path(),
        &[
            "lookup",
            "--server",
            &server.endpoint(),
            "--type",
            "email",
            "--value",
            "kept@example.com",
        ],
    );
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "lookup of a present claim: {stdout} {}",
        text(&out.stderr)
    );
    for expected in [
        "emails kept@example.com",
        "cell-a",
        "active",
        "user user-42",
        "emails id 4242",
        "created_at",
    ] {
        assert!(
            stdout.contains(expected),
            "{expected:?} missing from:\n{stdout}"
        );
    }
    let out = run(
        dir.path(),
        &[
            "lookup",
            "--server",
            &server.endpoint(),
            "--namespace",
            "emails",
            "--value",
            "absent@example.com",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "lookup of an absent claim exits 1"
    );
    assert!(
        text(&out.stderr).contains("not found"),
        "{}",
        text(&out.stderr)
    );

    let out = run(
        dir.path(),
        &[
            "leases",
            "--server",
            &server.endpoint(),
            "--cell-id",
            "cell-a",
            "--limit",
            "1",
        ],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout} {}", text(&out.stderr));
    assert!(
        stdout.contains(&open.lease_id),
        "the outstanding lease is listed:\n{stdout}"
    );
    assert!(
        !stdout.contains(&lease.lease_id),
        "the committed lease is not:\n{stdout}"
    );
    assert!(
        stdout.contains("1 outstanding lease(s) of cell cell-a"),
        "{stdout}"
    );
    let out = run(
        dir.path(),
        &[
            "leases",
            "--server",
            &server.endpoint(),
            "--cell-id",
            "bad cell",
        ],
    );
    assert_ne!(out.status.code(), Some(0));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("INVALID_REQUEST") && stderr.contains("cell_id"),
        "reason, not a Debug dump: {stderr}"
    );
    assert!(!stderr.contains("Status {"), "{stderr}");
    drop(c);
    assert_eq!(server.stop_with("TERM").code(), Some(0));
}

#[test]
fn no_migrate_on_a_fresh_file_exits_non_zero_with_a_clear_message() {
    let (dir, db) = temp();
    let out = run(
        dir.path(),
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            &sqlite_url(&db),
            "--no-migrate",
        ],
    );
    assert!(!out.status.success(), "refused");
    assert!(
        !text(&out.stdout).contains("listening on"),
        "{}",
        text(&out.stdout)
    );
    let stderr = text(&out.stderr);
    assert!(stderr.contains("migrations pending"), "{stderr}");
    assert!(
        stderr.contains("topology-claims migrate"),
        "says what to do: {stderr}"
    );
}

#[test]
fn migrate_then_serve_with_no_migrate_works() {
    let (dir, db) = temp();
    let store = sqlite_url(&db);
    let out = run(dir.path(), &["migrate", "--store", &store]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("applied migration"),
        "{}",
        text(&out.stdout)
    );
    let out = run(dir.path(), &["migrate", "--store", &store]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout).trim(), "schema is up to date");

    let server = Server::start(
        dir.path(),
        &["--listen", "127.0.0.1:0", "--store", &store, "--no-migrate"],
    );
    assert_eq!(server.stop_with("TERM").code(), Some(0));
}

#[test]
fn the_store_url_and_durations_can_come_from_the_environment() {
    let (dir, db) = temp();
    let mut command = command(dir.path(), &["migrate"]);
    command.env("TOPOLOGY_CLAIMS_STORE", sqlite_url(&db));
    let out = command.output().expect("run migrate");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        db.exists(),
        "migrate used the store from TOPOLOGY_CLAIMS_STORE"
    );

    serve_refuses_env(
        dir.path(),
        "TOPOLOGY_CLAIMS_OUTCOME_RETENTION",
        "soon",
        "invalid duration",
    );
}

#[test]
fn a_taken_port_fails_before_the_store_is_opened_or_migrated() {
    let (dir, db) = temp();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let store = sqlite_url(&db);
    for flag in ["--listen", "--health-listen", "--metrics-listen"] {
        let mut args = vec!["serve", "--store", &store];
        if flag != "--listen" {
            args.extend(["--listen", "127.0.0.1:0"]);
        }
        args.extend([flag, &taken]);
        let out = run(dir.path(), &args);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("cannot listen"),
            "{flag}: {}",
            text(&out.stderr)
        );
        assert!(!db.exists(), "{flag}: the store was opened (and migrated)");
    }
}

/// `serve` on the memory store with `name=value` in its environment fails, and its stderr
/// says `expected`.
fn serve_refuses_env(dir: &Path, name: &str, value: &str, expected: &str) {
    let mut command = command(
        dir,
        &["serve", "--listen", "127.0.0.1:0", "--store", "memory:"],
    );
    command.env(name, value);
    let out = command.output().expect("run serve");
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains(expected),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn an_unreachable_postgres_store_fails_clearly_without_echoing_the_password() {
    let (dir, _) = temp();
    let url = "postgres://admin:hunter2@127.0.0.1:1/claims";
    for args in [
        vec!["serve", "--listen", "127.0.0.1:0", "--store", url],
        vec!["migrate", "--store", url],
    ] {
        let out = run(dir.path(), &args);
        assert!(!out.status.success(), "{args:?}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains("cannot connect to PostgreSQL"), "{stderr}");
        assert!(
            stderr.contains("postgres://admin@127.0.0.1:1/claims"),
            "{stderr}"
        );
        assert!(!stderr.contains("hunter2"), "{stderr}");
        assert!(!text(&out.stdout).contains("listening on"));
    }
}

#[test]
fn a_bad_store_url_exits_non_zero_with_a_clear_message() {
    let (dir, _) = temp();
    for (url, expected) in [
        ("mysql://db/claims", "unknown store scheme"),
        ("claims.db", "without a scheme"),
        ("sqlite://", "no file path"),
        (
            "postgresql-ish://admin:hunter2@db/claims",
            "unknown store scheme",
        ),
    ] {
        for subcommand in ["serve", "migrate"] {
            let args = match subcommand {
                "serve" => vec!["serve", "--listen", "127.0.0.1:0", "--store", url],
                _ => vec!["migrate", "--store", url],
            };
            let out = run(dir.path(), &args);
            assert!(!out.status.success(), "{subcommand} --store {url}");
            let stderr = text(&out.stderr);
            assert!(
                stderr.contains(expected),
                "{subcommand} --store {url}: {stderr}"
            );
            if url != "sqlite://" {
                assert!(
                    stderr.contains("supported: memory:"),
                    "lists the supported schemes: {stderr}"
                );
            }
            assert!(
                !stderr.contains("hunter2"),
                "never echoes credentials: {stderr}"
            );
            assert!(!text(&out.stdout).contains("listening on"));
        }
    }
}

/// A client whose runtime is blocked never answers the HTTP/2 shutdown handshake, like one
/// behind a partition: the drain gives up after --drain-timeout and the server still exits 0.
#[test]
fn serve_exits_after_the_drain_timeout_when_a_client_never_lets_go() {
    let (dir, _) = temp();
    let server = Server::start(
        dir.path(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--store",
            "memory:",
            "--drain-timeout",
            "1s",
        ],
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _frozen = runtime.block_on(async {
        let mut c = client(&server).await;
        c.lookup_claim(pb::LookupClaimRequest {
            claim_type: ClaimType::Email.number(),
            claim_value: "x".into(),
            ..Default::default()
        })
        .await
        .expect_err("absent");
        c
    });
    // The runtime is not driven while we wait: the client's connection task cannot react.
    let status = server.stop_with("TERM");
    assert_eq!(status.code(), Some(0), "{status:?}");
}

/// `serve` with `vars` in its environment: `Ok` once it announced its port (then stopped), or
/// its exit code and stderr.
fn serve_with_env(dir: &Path, args: &[&str], vars: &[(&str, &str)]) -> Result<(), (i32, String)> {
    let mut serve = command(dir, &[&["serve"], args].concat());
    serve
        .envs(vars.iter().copied())
        .stderr(std::process::Stdio::piped());
    match topology_claims_harness::serve::ServeChild::start(serve) {
        Ok(child) => {
            drop(child);
            Ok(())
        }
        Err(_) => {
            let mut again = command(dir, &[&["serve"], args].concat());
            let out = again
                .envs(vars.iter().copied())
                .output()
                .expect("run serve");
            Err((out.status.code().unwrap_or(-1), text(&out.stderr)))
        }
    }
}

#[test]
fn the_environment_reads_empty_as_unset_every_switch_word_alike_and_names_a_bad_variable() {
    let (dir, db) = temp();
    let store = sqlite_url(&db);
    let open = ["--listen", "0.0.0.0:0", "--store", "memory:"];
    // One vocabulary for every switch, from a flag's variable.
    for word in ["true", "1", "yes", "on", "YES"] {
        serve_with_env(
            dir.path(),
            &open,
            &[("TOPOLOGY_CLAIMS_ALLOW_PLAINTEXT", word)],
        )
        .unwrap_or_else(|e| panic!("ALLOW_PLAINTEXT={word}: {e:?}"));
    }
    for word in ["false", "0", "no", "off"] {
        let (code, stderr) = serve_with_env(
            dir.path(),
            &open,
            &[("TOPOLOGY_CLAIMS_ALLOW_PLAINTEXT", word)],
        )
        .expect_err(word);
        assert_eq!(code, 1, "ALLOW_PLAINTEXT={word}: {stderr}");
        assert!(stderr.contains("refusing to serve plaintext"), "{stderr}");
    }
    for (var, word) in [
        ("TOPOLOGY_CLAIMS_GROUP_COMMIT", "yes"),
        ("TOPOLOGY_CLAIMS_RESTORE_QUARANTINE", "false"),
        ("TOPOLOGY_CLAIMS_NO_MIGRATE", "0"),
    ] {
        serve_with_env(
            dir.path(),
            &["--listen", "127.0.0.1:0", "--store", "memory:"],
            &[(var, word)],
        )
        .unwrap_or_else(|e| panic!("{var}={word}: {e:?}"));
    }
    // An empty variable is unset: the default applies.
    serve_with_env(
        dir.path(),
        &["--listen", "127.0.0.1:0", "--store", "memory:"],
        &[
            ("TOPOLOGY_CLAIMS_HEALTH_LISTEN", ""),
            ("TOPOLOGY_CLAIMS_GROUP_COMMIT", ""),
        ],
    )
    .expect("empty variables are unset");
    // A bad value names the variable that carried it, and is refused before the store is
    // opened (no database file, no migration).
    for (var, bad, why) in [
        ("TOPOLOGY_CLAIMS_GROUP_COMMIT", "maybe", "is not a switch"),
        (
            "TOPOLOGY_CLAIMS_HEALTH_LISTEN",
            "nonsense",
            "is not HOST:PORT",
        ),
        (
            "TOPOLOGY_CLAIMS_METRICS_LISTEN",
            "host:port",
            "is not a number",
        ),
    ] {
        let (code, stderr) = serve_with_env(
            dir.path(),
            &["--listen", "127.0.0.1:0", "--store", &store],
            &[(var, bad)],
        )
        .expect_err(var);
        assert_eq!(code, 2, "{var}={bad}: {stderr}");
        assert!(
            stderr.contains(&format!("environment variable {var}")) && stderr.contains(why),
            "{var}={bad}: {stderr}"
        );
        assert!(
            !db.exists(),
            "{var}={bad}: nothing opened before the configuration is whole"
        );
    }
}

#[test]
fn claim_lookup_and_release_from_the_shell() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        dir.path(),
        &["--listen", "127.0.0.1:0", "--store", "memory:"],
    );
    let s = server.endpoint();
    let cli = |args: &[&str]| {
        let out = run(
            dir.path(),
            &[&[args[0], "--server", &s], &args[1..]].concat(),
        );
        (out.status.code(), text(&out.stdout) + &text(&out.stderr))
    };
    let claim = ["--namespace", "usernames", "--value", "alice"];
    for (args, code, says) in [
        (
            &[&["claim", "--cell-id", "cell-a"], &claim[..]].concat(),
            0,
            "claimed usernames \"alice\" for cell cell-a",
        ),
        (
            &[&["claim", "--cell-id", "cell-b"], &claim[..]].concat(),
            1,
            "refused: CLAIM_TAKEN",
        ),
        (&[&["lookup"], &claim[..]].concat(), 0, "cell:       cell-a"),
        (
            &[&["release", "--cell-id", "cell-b"], &claim[..]].concat(),
            1,
            "refused: NOT_CLAIM_OWNER",
        ),
        (
            &[&["release", "--cell-id", "cell-a"], &claim[..]].concat(),
            0,
            "released usernames \"alice\"",
        ),
        (&[&["lookup"], &claim[..]].concat(), 1, "not found"),
        (
            &[
                "claim",
                "--cell-id",
                "cell-a",
                "--namespace",
                "ssh-keys",
                "--value",
                "x",
            ][..]
                .to_vec(),
            1,
            "refused: UNKNOWN_NAMESPACE",
        ),
    ] {
        let (got, output) = cli(args);
        assert_eq!(got, Some(code), "{args:?}: {output}");
        assert!(output.contains(says), "{args:?}: {output}");
    }
}

//! The metrics endpoints of the real binary: `serve --metrics-listen` moves its series with
//! scripted traffic (each conflict under its reason, the oldest-lease gauge growing while a
//! lease is held, then back to 0), and the `reconcile` and `verify` sidecars expose their
//! passes and runs. `promtool check metrics` validates every endpoint.
#![cfg(unix)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{command, get, scrape, value, Server, PATIENCE};
use topology_claims::memory::MemoryClaimStore;
use topology_claims_client::{ClaimsClient, ClientConfig};
use topology_claims_testkit::fixtures::{cell, creates, destroys, username};
use topology_claims_testkit::TestServer;

/// Runs `promtool check metrics` on `text` and fails with its complaints.
fn promtool_accepts(text: &str) {
    let promtool = std::env::var("TOPOLOGY_CLAIMS_PROMTOOL").unwrap_or_else(|_| "promtool".into());
    let mut child = match Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) if topology_claims_harness::in_ci() => panic!("{promtool} with CI=true: {e}"),
        Err(e) => {
            println!(
                "promtool check skipped: {promtool}: {e} (scripts/ensure-services.sh installs it)"
            );
            return;
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "promtool check metrics:\n{}{}\n--- exposition:\n{text}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Scrapes until `ready` holds (the gauges refresh on an interval).
fn scrape_until(addr: SocketAddr, what: &str, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let text = scrape(addr);
        if ready(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "{what} never showed:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test]
async fn server_metrics_move_with_traffic_and_pass_promtool() {
    let dir = tempfile::tempdir().unwrap();
    let dir_path = dir.path().to_owned();
    let server = tokio::task::spawn_blocking(move || {
        Server::start(
            &dir_path,
            &[
                "--listen",
                "127.0.0.1:0",
                "--store",
                "memory:",
                "--metrics-listen",
                "127.0.0.1:0",
                "--metrics-refresh-interval",
                "100ms",
                "--claims-gauge-interval",
                "100ms",
                "--drain-timeout",
                "1s",
            ],
        )
    })
    .await
    .unwrap();
    let metrics = server.child.metrics_addr(PATIENCE).unwrap();
    assert_eq!(get(metrics, "/").0, 404);
    // The claims gauge has a series for each namespace from its first count, 0 when empty.
    let idle = scrape_until(metrics, "the first claims count", |t| {
        value(t, "topology_claims_claims", &[("namespace", "usernames")]) == Some(0.0)
    });
    assert_eq!(
        value(
            &idle,
            "topology_claims_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        Some(1.0)
    );
    promtool_accepts(&idle);
    // The process's own series (the prometheus crate's process collector).
    for series in [
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ] {
        assert!(
            value(&idle, series, &[]).is_some_and(|v| v > 0.0),
            "{series} on the server:\n{idle}"
        );
    }
    // Every family is announced from the start, and every RPC's series start at zero.
    for family in [
        "topology_claims_leases_outstanding",
        "topology_claims_oldest_lease_age_seconds",
        "topology_claims_rate_limited_total",
        "topology_claims_claim_conflicts_total",
        "topology_claims_request_duration_seconds",
    ] {
        assert!(
            idle.contains(&format!("# TYPE {family} ")),
            "{family} announced on an idle server:\n{idle}"
        );
    }
    for method in ["BeginUpdate", "LookupClaim", "ForceRollback"] {
        assert_eq!(
            value(
                &idle,
                "topology_claims_requests_total",
                &[("method", method), ("code", "OK")]
            ),
            Some(0.0),
            "{method}"
        );
        assert_eq!(
            value(
                &idle,
                "topology_claims_request_duration_seconds_count",
                &[("method", method)]
            ),
            Some(0.0),
            "{method}"
        );
    }

    let client = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    let taken = client
        .begin_update(creates(&a, &[username("taken")]))
        .await
        .unwrap();
    client.commit_update(&a, taken.lease_id).await.unwrap();
    let held = client
        .begin_update(creates(&a, &[username("held")]))
        .await
        .unwrap();
    for (request, reason) in [
        (creates(&b, &[username("taken")]), "CLAIM_TAKEN"),
        (creates(&b, &[username("held")]), "CLAIM_LEASED"),
        (destroys(&b, &[username("taken")]), "NOT_CLAIM_OWNER"),
    ] {
        let refused = client.begin_update(request).await.unwrap_err();
        assert_eq!(refused.reason(), reason);
    }

    let text = scrape_until(metrics, "the held lease", |t| {
        value(
            t,
            "topology_claims_leases_outstanding",
            &[("cell_id", "cell-a")],
        ) == Some(1.0)
    });
    let count = |method: &str, code: &str| {
        value(
            &text,
            "topology_claims_requests_total",
            &[("method", method), ("code", code)],
        )
    };
    assert_eq!(count("BeginUpdate", "OK"), Some(2.0));
    assert_eq!(count("CommitUpdate", "OK"), Some(1.0));
    assert_eq!(count("BeginUpdate", "ALREADY_EXISTS"), Some(1.0));
    assert_eq!(count("BeginUpdate", "FAILED_PRECONDITION"), Some(1.0));
    assert_eq!(count("BeginUpdate", "PERMISSION_DENIED"), Some(1.0));
    for reason in ["CLAIM_TAKEN", "CLAIM_LEASED", "NOT_CLAIM_OWNER"] {
        assert_eq!(
            value(
                &text,
                "topology_claims_claim_conflicts_total",
                &[("reason", reason)]
            ),
            Some(1.0),
            "{reason}"
        );
    }
    assert_eq!(
        value(
            &text,
            "topology_claims_request_duration_seconds_count",
            &[("method", "BeginUpdate")]
        ),
        Some(5.0)
    );
    assert_eq!(value(&text, "topology_claims_store_up", &[]), Some(1.0));
    assert_eq!(
        value(&text, "topology_claims_store_retries_total", &[]),
        Some(0.0)
    );
    promtool_accepts(&text);

    // The oldest-lease gauge grows while the lease is held, by the store's clock.
    let age = |t: &str| {
        value(
            t,
            "topology_claims_oldest_lease_age_seconds",
            &[("cell_id", "cell-a")],
        )
        .unwrap()
    };
    let first = age(&text);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let later = scrape_until(metrics, "an older lease", |t| age(t) >= first + 1.0);
    assert!(age(&later) < first + 30.0, "{}", age(&later));

    client.commit_update(&a, held.lease_id).await.unwrap();
    let ended = scrape_until(metrics, "no lease left", |t| {
        value(
            t,
            "topology_claims_leases_outstanding",
            &[("cell_id", "cell-a")],
        ) == Some(0.0)
    });
    let counted = scrape_until(metrics, "two usernames counted", |t| {
        value(t, "topology_claims_claims", &[("namespace", "usernames")]) == Some(2.0)
    });
    for namespace in ["emails", "routes"] {
        let count = value(
            &counted,
            "topology_claims_claims",
            &[("namespace", namespace)],
        );
        assert_eq!(count, Some(0.0), "{namespace}");
    }
    assert_eq!(age(&ended), 0.0);
    drop(client);
    server.stop_with("TERM");
}

/// Starts a sidecar with `--metrics-listen 127.0.0.1:0` and reads its `metrics on` line.
fn sidecar(dir: &Path, args: &[&str]) -> (Child, SocketAddr) {
    let mut args = args.to_vec();
    args.extend(["--metrics-listen", "127.0.0.1:0"]);
    let mut child = command(dir, &args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = lines.next().expect("a first line").unwrap();
    std::thread::spawn(move || for _ in lines {});
    let addr = line
        .strip_prefix("metrics on ")
        .unwrap_or_else(|| panic!("expected `metrics on`, got {line:?}"))
        .parse()
        .unwrap();
    (child, addr)
}

#[tokio::test]
async fn sidecar_metrics_report_passes_and_runs() {
    let server = TestServer::start(Arc::new(MemoryClaimStore::new())).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cell.db");
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        topology_claims_sqlite::ensure_local_schema(&conn).unwrap();
        conn.execute_batch(
            "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT NOT NULL, created_at INTEGER NOT NULL);
             INSERT INTO users VALUES (1, 'u1', 1000), (2, 'u2', 1000), (3, 'u3', 1000);",
        )
        .unwrap();
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
    let endpoint = server.endpoint();
    let local_db = format!("sqlite://{}", db.display());
    let common_args = [
        "--server",
        &endpoint,
        "--cell-id",
        "cell-a",
        "--local-db",
        &local_db,
    ];

    let dir_path = dir.path().to_owned();
    let reconcile_args: Vec<String> = ["reconcile", "--interval", "200ms"]
        .iter()
        .chain(common_args.iter())
        .map(|s| s.to_string())
        .collect();
    let (text, mut child) = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = reconcile_args.iter().map(String::as_str).collect();
        let (child, addr) = sidecar(&dir_path, &args);
        let text = scrape_until(addr, "two reconcile passes", |t| {
            value(
                t,
                "topology_claims_reconcile_passes_total",
                &[("cell_id", "cell-a"), ("result", "ok")],
            )
            .is_some_and(|n| n >= 2.0)
        });
        (text, child)
    })
    .await
    .unwrap();
    let _ = child.kill();
    assert!(
        value(&text, "process_resident_memory_bytes", &[]).is_some_and(|v| v > 0.0),
        "the sidecar's own process series:\n{text}"
    );
    let _ = child.wait();
    let last = value(
        &text,
        "topology_claims_reconcile_last_success_timestamp_seconds",
        &[("cell_id", "cell-a")],
    )
    .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!((now - 60.0..=now + 1.0).contains(&last), "{last} vs {now}");
    assert_eq!(
        value(
            &text,
            "topology_claims_reconcile_passes_total",
            &[("result", "error")]
        ),
        Some(0.0)
    );
    promtool_accepts(&text);

    let dir_path = dir.path().to_owned();
    let verify_args: Vec<String> = [
        "verify",
        "--every",
        "1h",
        "--recent",
        "0s",
        "--source",
        source.to_str().unwrap(),
        "--cursor-file",
        dir.path().join("cursor").to_str().unwrap(),
    ]
    .iter()
    .chain(common_args.iter())
    .map(|s| s.to_string())
    .collect();
    let (text, mut child) = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = verify_args.iter().map(String::as_str).collect();
        let (child, addr) = sidecar(&dir_path, &args);
        let text = scrape_until(addr, "a complete verify run", |t| {
            value(
                t,
                "topology_claims_verify_runs_total",
                &[("result", "complete")],
            ) == Some(1.0)
        });
        (text, child)
    })
    .await
    .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let cell = ("cell_id", "cell-a");
    assert_eq!(
        value(
            &text,
            "topology_claims_verify_records_checked_total",
            &[cell]
        ),
        Some(3.0)
    );
    assert_eq!(
        value(
            &text,
            "topology_claims_verify_discrepancies_total",
            &[cell, ("kind", "missing")]
        ),
        Some(3.0)
    );
    assert_eq!(
        value(
            &text,
            "topology_claims_verify_corrections_total",
            &[cell, ("result", "applied")]
        ),
        Some(3.0)
    );
    assert!(value(
        &text,
        "topology_claims_verify_last_completed_timestamp_seconds",
        &[cell]
    )
    .is_some_and(|t| t > 0.0));
    promtool_accepts(&text);
    server.shutdown().await;
}

#[tokio::test]
async fn rate_limited_requests_and_failed_audit_writes_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let dir_path = dir.path().to_owned();
    let server = tokio::task::spawn_blocking(move || {
        Server::start(
            &dir_path,
            &[
                "--listen",
                "127.0.0.1:0",
                "--store",
                "memory:",
                "--metrics-listen",
                "127.0.0.1:0",
                "--cell-rate",
                "1/s",
                "--cell-burst",
                "1",
                // Every write to /dev/full fails (ENOSPC).
                "--audit-log",
                "/dev/full",
            ],
        )
    })
    .await
    .unwrap();
    let metrics = server.child.metrics_addr(PATIENCE).unwrap();
    let mut raw = topology_claims_proto::pb::claims_service_client::ClaimsServiceClient::connect(
        server.endpoint(),
    )
    .await
    .unwrap();
    let mut limited = 0;
    for n in 0..5 {
        let request = topology_claims_proto::pb::RollbackUpdateRequest {
            cell_id: "cell-a".into(),
            lease_id: format!("00000000-0000-4000-8000-00000000000{n}"),
            unrenewed_for: None,
        };
        if let Err(status) = raw.rollback_update(request).await {
            assert_eq!(status.code(), tonic::Code::ResourceExhausted);
            limited += 1;
        }
    }
    assert!(limited >= 3, "{limited} of 5 limited");
    // Audit lines are written by a thread of their own, after the answers: wait for the failures
    // to be counted (a few seconds at most) before reading every series.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = scrape(metrics);
        let counted = value(&text, "topology_claims_audit_write_failures_total", &[])
            .is_some_and(|n| n >= 1.0);
        if counted || std::time::Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        value(
            &text,
            "topology_claims_rate_limited_total",
            &[("cell_id", "cell-a")]
        ),
        Some(f64::from(limited))
    );
    assert_eq!(
        value(
            &text,
            "topology_claims_requests_total",
            &[("method", "RollbackUpdate"), ("code", "RESOURCE_EXHAUSTED")]
        ),
        Some(f64::from(limited))
    );
    // Each answered rollback was audited, and each audit line failed.
    assert!(
        value(&text, "topology_claims_audit_write_failures_total", &[]).is_some_and(|n| n >= 1.0),
        "{text}"
    );
    promtool_accepts(&text);
    drop(raw);
    server.stop_with("TERM");
}

//! The admin runbooks through the real binary, on every backend: `admin force-rollback` frees a
//! downed cell's claims and its late CommitUpdate gets LEASE_ROLLED_BACK; `admin decommission`
//! of a cell with 100,000 claims runs in batches, survives a kill (of the server, or of the
//! command on the memory store) and resumes, leaves every other cell's claims alone, and the
//! cell's later BeginUpdate is refused; every admin call is in the audit log. Plus, on memory:
//! a non-admin certificate is PERMISSION_DENIED, an admin one is served, an audit log that
//! cannot be written refuses the call, and `force-rollback --older-than` spares a lease renewed
//! within the window.
#![cfg(unix)]

mod common;
#[cfg(feature = "spanner")]
#[path = "../../backends/spanner/tests/common/mod.rs"]
mod emulator;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{command, text, Server};
use futures::StreamExt;
use topology_claims::{CellId, ClaimsError, LeaseId};
use topology_claims_client::{ClaimsClient, ClientConfig};
use topology_claims_proto::pb::admin as apb;
use topology_claims_proto::pb::admin::admin_service_client::AdminServiceClient;
use topology_claims_testkit::fixtures::{cell, creates, username};

/// Claims of the decommissioned cell (the figure); the Spanner emulator, which runs one
/// transaction at a time at a few seconds per 1,000-claim batch, gets a tenth of it (see
/// `admin_runbooks_on_spanner`).
const DOOMED_CLAIMS: usize = 100_000;
/// Claims of the cell that must be left alone.
const KEPT_CLAIMS: usize = 2_000;
const BATCH: usize = 1_000;

fn client(server: &Server) -> ClaimsClient {
    // A 1,000-claim batch takes seconds on the Spanner emulator (one transaction at a time).
    let config = ClientConfig {
        call_timeout: Duration::from_secs(60),
        ..ClientConfig::default()
    };
    ClaimsClient::connect_lazy(&server.endpoint(), config).unwrap()
}

async fn start(dir: &Path, args: Vec<String>) -> Server {
    Server::start_async(dir, args).await
}

fn serve_args(store: &str, audit: &Path) -> Vec<String> {
    [
        "--listen",
        "127.0.0.1:0",
        "--store",
        store,
        "--audit-log",
        audit.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Runs `topology-claims admin …` to completion.
async fn admin(dir: &Path, server: &Server, args: &[&str]) -> std::process::Output {
    let mut full = vec!["admin", "--server"];
    let endpoint = server.endpoint();
    full.push(&endpoint);
    full.extend_from_slice(args);
    let mut command = command(dir, &full);
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

/// Commits `count` username claims `{prefix}-{i}` for `cell_id`, `BATCH` per lease,
/// `parallel` leases at a time.
async fn seed(
    client: &ClaimsClient,
    cell_id: &CellId,
    prefix: &str,
    count: usize,
    parallel: usize,
) {
    let batches: Vec<Vec<_>> = (0..count)
        .collect::<Vec<_>>()
        .chunks(BATCH)
        .map(|chunk| {
            chunk
                .iter()
                .map(|i| username(&format!("{prefix}-{i}")))
                .collect()
        })
        .collect();
    futures::stream::iter(batches)
        .map(|records| async move {
            let lease = client
                .begin_update(creates(cell_id, &records))
                .await
                .expect("seed begin");
            client
                .commit_update(cell_id, lease.lease_id)
                .await
                .expect("seed commit");
        })
        .buffer_unordered(parallel)
        .collect::<Vec<()>>()
        .await;
}

/// How many of `{prefix}-0..count` exist, looked up 16 at a time.
async fn existing(client: &ClaimsClient, prefix: &str, count: usize) -> usize {
    futures::stream::iter(0..count)
        .map(|i| async move {
            match client
                .lookup_claim(&username(&format!("{prefix}-{i}")).key)
                .await
            {
                Ok(_) => 1,
                Err(ClaimsError::ClaimNotFound { .. }) => 0,
                Err(other) => panic!("lookup {prefix}-{i}: {other}"),
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<usize>>()
        .await
        .into_iter()
        .sum()
}

/// What the store under test needs: its URL and whether it outlives the server process.
struct Backend {
    store: String,
    durable: bool,
    /// Seeding leases at a time (the Spanner emulator runs one transaction at a time).
    parallel: usize,
    /// Claims of the cell to decommission.
    doomed_claims: usize,
}

async fn runbooks(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.log");
    let mut server = start(dir.path(), serve_args(&backend.store, &audit)).await;
    let claims = client(&server);
    let (down, keep, doomed) = (cell("down-cell"), cell("keep-cell"), cell("old-cell"));

    // --- Cell down: its lease is left between the phases.
    let stuck = claims
        .begin_update(creates(&down, &[username("stuck-1"), username("stuck-2")]))
        .await
        .unwrap();
    let listed = admin(dir.path(), &server, &["leases", "--cell-id", "down-cell"]).await;
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    assert!(
        text(&listed.stdout).contains(&stuck.lease_id.to_string()),
        "{}",
        text(&listed.stdout)
    );
    let dry = admin(
        dir.path(),
        &server,
        &[
            "force-rollback",
            "--cell-id",
            "down-cell",
            "--reason",
            "cell down",
            "--dry-run",
        ],
    )
    .await;
    assert!(dry.status.success(), "{}", text(&dry.stderr));
    assert!(
        text(&dry.stderr).contains("1 outstanding lease(s)"),
        "{}",
        text(&dry.stderr)
    );
    assert!(claims.lookup_claim(&username("stuck-1").key).await.is_ok());
    let unconfirmed = admin(
        dir.path(),
        &server,
        &[
            "force-rollback",
            "--cell-id",
            "down-cell",
            "--reason",
            "cell down",
        ],
    )
    .await;
    assert_eq!(
        unconfirmed.status.code(),
        Some(1),
        "no terminal and no --yes: not confirmed, exit 1"
    );
    let said = text(&unconfirmed.stderr);
    assert!(
        said.contains("not confirmed: nothing was changed") && said.contains("--yes"),
        "{said}"
    );
    let rolled = admin(
        dir.path(),
        &server,
        &[
            "force-rollback",
            "--cell-id",
            "down-cell",
            "--reason",
            "cell down",
            "--yes",
        ],
    )
    .await;
    assert!(rolled.status.success(), "{}", text(&rolled.stderr));
    assert!(
        text(&rolled.stdout).contains("1 lease(s) rolled back (2 claims)"),
        "{}",
        text(&rolled.stdout)
    );
    assert!(
        !text(&rolled.stdout).contains("would roll back"),
        "a confirmed run prints only what it does: {}",
        text(&rolled.stdout)
    );
    for value in ["stuck-1", "stuck-2"] {
        assert!(matches!(
            claims.lookup_claim(&username(value).key).await,
            Err(ClaimsError::ClaimNotFound { .. })
        ));
    }
    assert!(matches!(
        claims.commit_update(&down, stuck.lease_id).await,
        Err(ClaimsError::LeaseRolledBack { .. })
    ));

    // --- Cell decommissioned: 100k claims, a kill in the middle, a resume.
    let seeding = Instant::now();
    let doomed_claims = backend.doomed_claims;
    seed(&claims, &doomed, "old", doomed_claims, backend.parallel).await;
    seed(&claims, &keep, "keep", KEPT_CLAIMS, backend.parallel).await;
    eprintln!(
        "seeded {doomed_claims} + {KEPT_CLAIMS} claims in {:?}",
        seeding.elapsed()
    );
    let decommission = |endpoint: String, yes: bool| {
        let mut args = vec![
            "admin".to_owned(),
            "--server".to_owned(),
            endpoint,
            "decommission".to_owned(),
            "--cell-id".to_owned(),
            "old-cell".to_owned(),
            "--reason".to_owned(),
            "region retired".to_owned(),
        ];
        if yes {
            args.push("--yes".to_owned());
        }
        args
    };
    let args = decommission(server.endpoint(), true);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut first = command(dir.path(), &args)
        .stderr(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut progress = BufReader::new(first.stderr.take().unwrap()).lines();
    let started = Instant::now();
    loop {
        let line = progress
            .next()
            .expect("a progress line before the end")
            .unwrap();
        if line.starts_with("progress:") {
            break;
        }
    }
    if backend.durable {
        // The server dies mid-run; the store keeps what the finished steps did.
        server.child.kill();
    } else {
        let _ = first.kill();
    }
    let _ = first.wait();
    if backend.durable {
        server = start(dir.path(), serve_args(&backend.store, &audit)).await;
    }
    drop(claims);
    let claims = client(&server);
    let left = admin(
        dir.path(),
        &server,
        &[
            "decommission",
            "--cell-id",
            "old-cell",
            "--reason",
            "check",
            "--dry-run",
        ],
    )
    .await;
    assert!(left.status.success(), "{}", text(&left.stderr));
    let remaining: usize = text(&left.stdout)
        .split_whitespace()
        .find_map(|w| w.parse().ok())
        .expect("a count in the dry run");
    assert!(
        remaining > 0 && remaining < doomed_claims,
        "the kill must land mid-run: {remaining} left"
    );
    assert!(
        text(&left.stderr).contains("already decommissioned: resuming"),
        "{}",
        text(&left.stderr)
    );
    assert!(matches!(
        claims
            .begin_update(creates(&doomed, &[username("late")]))
            .await,
        Err(ClaimsError::CellDecommissioned { .. })
    ));
    let args = decommission(server.endpoint(), true);
    let args: Vec<&str> = args[3..].iter().map(String::as_str).collect();
    let resumed = admin(dir.path(), &server, &args).await;
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    eprintln!(
        "decommission of {doomed_claims} claims with a kill took {:?}: {}",
        started.elapsed(),
        text(&resumed.stdout).trim()
    );
    assert!(
        text(&resumed.stdout).contains(&format!("{remaining} claim(s) deleted")),
        "{}",
        text(&resumed.stdout)
    );
    assert!(text(&resumed.stderr).contains("progress:"));
    assert_eq!(existing(&claims, "old", doomed_claims).await, 0);
    assert_eq!(existing(&claims, "keep", KEPT_CLAIMS).await, KEPT_CLAIMS);
    // A decommissioned cell's claims are free for others.
    let reuse = claims
        .begin_update(creates(&keep, &[username("old-7")]))
        .await
        .unwrap();
    claims.commit_update(&keep, reuse.lease_id).await.unwrap();

    // --- Every admin call is in the audit log, the acting ones before and after.
    // The writer is a thread of its own: wait until the last acting call's `done` line is in.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let lines: Vec<serde_json::Value> = loop {
        let log = std::fs::read_to_string(&audit).unwrap();
        let lines: Vec<serde_json::Value> = log
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let done = lines
            .iter()
            .filter(|l| l["method"] == "ForceRollback" && l["stage"] == "done")
            .count();
        if done >= 2 || std::time::Instant::now() > deadline {
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let admin_lines = |method: &str, stage: &str| {
        lines
            .iter()
            .filter(|l| l["method"] == method && l["stage"] == stage)
            .count()
    };
    assert!(admin_lines("ListLeases", "intent") >= 1);
    // --dry-run: 1 call; unconfirmed: none (nothing can be confirmed without a terminal);
    // --yes: it acts at once, with no preview.
    assert_eq!(admin_lines("ForceRollback", "intent"), 2);
    assert_eq!(admin_lines("ForceRollback", "done"), 2);
    let dry = |l: &&serde_json::Value| l["method"] == "ForceRollback" && l["dry_run"] == true;
    assert_eq!(
        lines.iter().filter(dry).count(),
        2,
        "--dry-run's intent and done, no other"
    );
    assert!(admin_lines("DecommissionCell", "intent") >= doomed_claims / BATCH);
    let acted = lines
        .iter()
        .find(|l| l["method"] == "ForceRollback" && l["dry_run"] == false)
        .unwrap();
    assert_eq!(acted["admin_reason"], "cell down");
    assert_eq!(acted["cell_id"], "down-cell");
    assert_eq!(acted["identity"], "anonymous");
    // The `done` line of the acting call says what it did: the leases, their count, the claims.
    let did = lines
        .iter()
        .find(|l| l["method"] == "ForceRollback" && l["stage"] == "done" && l["dry_run"] == false)
        .unwrap();
    let count = did["lease_count"]
        .as_u64()
        .expect("lease_count on the done line");
    assert!(count >= 1, "{did}");
    assert_eq!(
        did["lease_ids"].as_array().unwrap().len() as u64,
        count.min(100),
        "{did}"
    );
    assert!(did["released_claims"].as_u64().is_some(), "{did}");
    // Idle clients would hold the drain open.
    drop(claims);
    server.stop_with("TERM");
}

#[tokio::test]
async fn admin_runbooks_on_memory() {
    runbooks(Backend {
        store: "memory:".into(),
        durable: false,
        parallel: 4,
        doomed_claims: DOOMED_CLAIMS,
    })
    .await;
}

/// `older_than` is idle time, judged by the store's clock: of two leases of a cell older than
/// the window, the one renewed 0 s ago is spared and commits; the one left idle is rolled back.
/// `admin leases` shows both ages.
#[tokio::test]
async fn force_rollback_older_than_spares_a_lease_renewed_within_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.log");
    let server = start(dir.path(), serve_args("memory:", &audit)).await;
    let claims = client(&server);
    let down = cell("down-cell");
    let idle = claims
        .begin_update(creates(&down, &[username("idle-1")]))
        .await
        .unwrap();
    let alive = claims
        .begin_update(creates(&down, &[username("alive-1")]))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    claims.renew_lease(&down, alive.lease_id).await.unwrap();

    let listed = admin(dir.path(), &server, &["leases", "--cell-id", "down-cell"]).await;
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let listing = text(&listed.stdout);
    assert!(listing.contains("unrenewed"), "{listing}");
    // (age, unrenewed) of a lease's row.
    let ages = |lease: LeaseId| {
        let line = listing
            .lines()
            .find(|l| l.starts_with(&lease.to_string()))
            .unwrap();
        let columns: Vec<Duration> = line
            .split_whitespace()
            .skip(2)
            .take(2)
            .map(|d| topology_claims::config::parse_duration(d).unwrap())
            .collect();
        (columns[0], columns[1])
    };
    let two = Duration::from_secs(2);
    let (idle_age, idle_unrenewed) = ages(idle.lease_id);
    let (alive_age, alive_unrenewed) = ages(alive.lease_id);
    assert!(idle_age >= two && idle_unrenewed >= two, "{listing}");
    assert!(alive_age >= two && alive_unrenewed < two, "{listing}");

    // Renewed 0 s ago, as a live cell does every second.
    claims.renew_lease(&down, alive.lease_id).await.unwrap();

    let rolled = admin(
        dir.path(),
        &server,
        &[
            "force-rollback",
            "--cell-id",
            "down-cell",
            "--older-than",
            "2s",
            "--reason",
            "cell down?",
            "--yes",
        ],
    )
    .await;
    assert!(rolled.status.success(), "{}", text(&rolled.stderr));
    let out = text(&rolled.stdout);
    assert!(
        out.contains(&format!("rolled back lease {}", idle.lease_id)),
        "{out}"
    );
    assert!(!out.contains(&alive.lease_id.to_string()), "{out}");
    assert!(out.contains("1 lease(s) rolled back (1 claims)"), "{out}");
    assert!(matches!(
        claims.lookup_claim(&username("idle-1").key).await,
        Err(ClaimsError::ClaimNotFound { .. })
    ));
    claims.commit_update(&down, alive.lease_id).await.unwrap();
    assert!(claims.lookup_claim(&username("alive-1").key).await.is_ok());
    drop(claims);
    server.stop_with("TERM");
}

#[tokio::test]
async fn admin_runbooks_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    runbooks(Backend {
        store: format!("sqlite://{}", dir.path().join("claims.db").display()),
        durable: true,
        parallel: 4,
        doomed_claims: DOOMED_CLAIMS,
    })
    .await;
}

#[tokio::test]
async fn admin_runbooks_on_postgres() {
    use topology_claims_harness::postgres::{test_url, TempSchema};
    let schema = match TempSchema::create(&test_url(), "tc_admin_", Duration::from_secs(3600)).await
    {
        Ok(schema) => schema,
        Err(e) if topology_claims_harness::in_ci() => panic!("PostgreSQL with CI=true: {e}"),
        Err(e) => {
            println!("postgres test skipped: {e}");
            return;
        }
    };
    runbooks(Backend {
        store: schema.url("tc-admin").unwrap(),
        durable: true,
        parallel: 4,
        doomed_claims: DOOMED_CLAIMS,
    })
    .await;
    schema.drop().await.unwrap();
}

#[cfg(feature = "spanner")]
#[tokio::test]
async fn admin_runbooks_on_spanner() {
    let emulator = emulator::start(emulator::Mode::Plain);
    let dir = tempfile::tempdir().unwrap();
    let url = "spanner://projects/admin-project/instances/admin-instance/databases/claims";
    std::env::set_var("SPANNER_EMULATOR_HOST", &emulator.host);
    let migrate = command(
        dir.path(),
        &["migrate", "--create-database", "--store", url],
    )
    .output()
    .unwrap();
    assert!(migrate.status.success(), "{}", text(&migrate.stderr));
    runbooks(Backend {
        store: url.into(),
        durable: true,
        parallel: 1,
        // 100,000 takes over 15 minutes on the emulator; the batching, the kill and the resume
        // are the same at 10,000 (PostgreSQL and SQLite run the full figure).
        doomed_claims: DOOMED_CLAIMS / 10,
    })
    .await;
}

#[tokio::test]
async fn only_the_admin_role_reaches_the_admin_service_under_mutual_tls() {
    use topology_claims_harness::pki::DevPki;
    std::env::set_var("TOPOLOGY_CLAIMS_BIN", common::BIN);
    let dir = tempfile::tempdir().unwrap();
    let pki = DevPki::create(&dir.path().join("pki")).unwrap();
    let audit = dir.path().join("audit.log");
    let mut args = serve_args("memory:", &audit);
    args.extend(pki.serve_args());
    let server = start(dir.path(), args).await;
    let endpoint = format!("https://localhost:{}", server.child.addr.port());
    let as_role = |role: &str, name: &str| {
        let call = [
            "decommission",
            "--cell-id",
            "cell-a",
            "--reason",
            "test",
            "--dry-run",
        ];
        common::admin_as(dir.path(), &pki, &endpoint, (role, name), &call)
    };
    for (role, name) in [("cell", "cell-a"), ("router", "edge")] {
        let refused = as_role(role, name);
        assert_eq!(refused.status.code(), Some(2), "{role}");
        assert!(
            text(&refused.stderr).contains("ROLE_NOT_ALLOWED"),
            "{role}: {}",
            text(&refused.stderr)
        );
    }
    let served = as_role("admin", "ops");
    assert!(served.status.success(), "{}", text(&served.stderr));
    assert!(text(&served.stdout).contains("would delete 0 claim(s)"));
    let log = std::fs::read_to_string(&audit).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("\"method\":\"DecommissionCell\"")
                && l.contains("spiffe://topology-claims/admin/ops")
                && l.contains("\"stage\":\"intent\"")),
        "{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("\"method\":\"DecommissionCell\"")
                && l.contains("spiffe://topology-claims/cell/cell-a")
                && l.contains("ROLE_NOT_ALLOWED")),
        "{log}"
    );
    server.stop_with("TERM");
}

#[tokio::test]
async fn an_admin_call_that_cannot_be_audited_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // Opening /dev/full for appending works; every write to it fails (ENOSPC).
    let server = start(dir.path(), serve_args("memory:", Path::new("/dev/full"))).await;
    let claims = client(&server);
    let a = cell("cell-a");
    let lease = claims
        .begin_update(creates(&a, &[username("kept")]))
        .await
        .unwrap();
    let refused = admin(
        dir.path(),
        &server,
        &[
            "force-rollback",
            "--cell-id",
            "cell-a",
            "--reason",
            "test",
            "--yes",
        ],
    )
    .await;
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        text(&refused.stderr).contains("AUDIT_UNAVAILABLE"),
        "{}",
        text(&refused.stderr)
    );
    // Nothing was rolled back: the cell still commits its lease.
    claims.commit_update(&a, lease.lease_id).await.unwrap();
    drop(claims);
    server.stop_with("TERM");
}

/// The restore commands on memory: `restore-status` of a store never restored; `mark-restored`
/// refuses a malformed and a future backup time, naming it; a mark starts the quarantine (a
/// create of an absent claim is RESTORE_QUARANTINE, one of an existing claim is taken as ever, a
/// verifier's correction goes through) and shows in the metrics; `lift-quarantine` of another
/// epoch is refused, of the right one ends it; both calls are in the audit log.
#[tokio::test]
async fn restore_marks_and_lifts_are_audited_and_show_in_the_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.log");
    let mut args = serve_args("memory:", &audit);
    args.extend(["--metrics-listen", "127.0.0.1:0"].map(String::from));
    let server = start(dir.path(), args).await;
    let metrics = server.child.metrics_addr(common::PATIENCE).unwrap();
    let claims = client(&server);
    let a = cell("cell-a");
    let lease = claims
        .begin_update(creates(&a, &[username("held")]))
        .await
        .unwrap();
    claims.commit_update(&a, lease.lease_id).await.unwrap();

    let never = admin(dir.path(), &server, &["restore-status"]).await;
    assert!(text(&never.stdout).contains("never marked restored"));
    let malformed = admin(
        dir.path(),
        &server,
        &[
            "mark-restored",
            "--backup-time",
            "yesterday",
            "--reason",
            "x",
            "--yes",
        ],
    )
    .await;
    assert_eq!(malformed.status.code(), Some(2));
    assert!(text(&malformed.stderr).contains("--backup-time \"yesterday\" is not an RFC 3339 time"));
    let future = admin(
        dir.path(),
        &server,
        &[
            "mark-restored",
            "--backup-time",
            "2999-01-01T00:00:00Z",
            "--reason",
            "x",
            "--yes",
        ],
    )
    .await;
    assert_eq!(future.status.code(), Some(2));
    assert!(
        text(&future.stderr).contains("backup_time"),
        "{}",
        text(&future.stderr)
    );

    // Impossible times are refused, never clamped or carried into the seconds.
    let mut raw = AdminServiceClient::connect(server.endpoint())
        .await
        .unwrap();
    for (seconds, nanos) in [
        (i64::MIN, 0),
        (-62_135_596_801, 0),
        (253_402_300_800, 0),
        (0, -1),
        (0, 2_000_000_000),
    ] {
        let refused = raw
            .mark_restored(apb::MarkRestoredRequest {
                backup_time: Some(prost_types::Timestamp { seconds, nanos }),
                reason: "impossible".into(),
                expect_cells: vec![],
            })
            .await
            .expect_err("an impossible backup_time");
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().contains("backup_time"), "{refused:?}");
    }

    let mark = admin(
        dir.path(),
        &server,
        &[
            "mark-restored",
            "--backup-time",
            "2026-01-01T00:00:00Z",
            "--reason",
            "INC-1",
            "--yes",
        ],
    )
    .await;
    assert!(mark.status.success(), "{}", text(&mark.stderr));
    let shown = text(&mark.stdout);
    assert!(
        shown.contains("restore epoch:   1") && shown.contains("pending   cell-a"),
        "{shown}"
    );
    let scraped = common::scrape(metrics);
    assert_eq!(
        common::value(&scraped, "topology_claims_restore_epoch", &[]),
        Some(1.0)
    );
    assert_eq!(
        common::value(&scraped, "topology_claims_restore_quarantine", &[]),
        Some(1.0)
    );
    assert_eq!(
        common::value(&scraped, "topology_claims_restore_cells_pending", &[]),
        Some(1.0)
    );

    let b = cell("cell-b");
    let refused = claims
        .begin_update(creates(&b, &[username("lost")]))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, ClaimsError::RestoreQuarantine { epoch: 1, .. }),
        "{refused:?}"
    );
    let taken = claims
        .begin_update(creates(&b, &[username("held")]))
        .await
        .unwrap_err();
    assert!(matches!(taken, ClaimsError::ClaimTaken { .. }), "{taken:?}");
    let correction = claims
        .begin_correction(creates(&a, &[username("lost")]))
        .await
        .unwrap();
    claims.commit_update(&a, correction.lease_id).await.unwrap();

    let wrong = admin(
        dir.path(),
        &server,
        &[
            "lift-quarantine",
            "--epoch",
            "2",
            "--reason",
            "ops",
            "--yes",
        ],
    )
    .await;
    assert_eq!(wrong.status.code(), Some(2));
    assert!(
        text(&wrong.stderr).contains("RESTORE_EPOCH_MISMATCH"),
        "{}",
        text(&wrong.stderr)
    );
    let lift = admin(
        dir.path(),
        &server,
        &[
            "lift-quarantine",
            "--epoch",
            "1",
            "--reason",
            "cell-a is gone",
            "--yes",
        ],
    )
    .await;
    assert!(lift.status.success(), "{}", text(&lift.stderr));
    assert!(
        text(&lift.stdout).contains("lifted at"),
        "{}",
        text(&lift.stdout)
    );
    let scraped = common::scrape(metrics);
    assert_eq!(
        common::value(&scraped, "topology_claims_restore_quarantine", &[]),
        Some(0.0)
    );
    claims
        .begin_update(creates(&b, &[username("fresh")]))
        .await
        .unwrap();

    let log = std::fs::read_to_string(&audit).unwrap();
    for (method, reason) in [
        ("MarkRestored", "INC-1"),
        ("LiftQuarantine", "cell-a is gone"),
    ] {
        assert!(
            log.lines()
                .any(|l| l.contains(&format!("\"method\":\"{method}\"")) && l.contains(reason)),
            "{method} not audited:\n{log}"
        );
    }
    // The lines say what was asked and what came of it.
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let line = |method: &str, stage: &str, reason: &str| {
        lines
            .iter()
            .find(|l| l["method"] == method && l["stage"] == stage && l["admin_reason"] == reason)
            .unwrap_or_else(|| panic!("no {method} {stage} line:\n{log}"))
    };
    let marked = line("MarkRestored", "done", "INC-1");
    assert_eq!(
        marked["backup_time"], "2026-01-01T00:00:00.000Z",
        "{marked}"
    );
    assert_eq!(marked["epoch"], 1, "{marked}");
    assert_eq!(
        line("LiftQuarantine", "intent", "cell-a is gone")["epoch"],
        1
    );
    assert_eq!(line("LiftQuarantine", "done", "cell-a is gone")["epoch"], 1);
    let impossible = line("MarkRestored", "intent", "impossible");
    assert!(
        impossible["backup_time"]
            .as_str()
            .unwrap()
            .contains("seconds"),
        "{impossible}"
    );
    let corrected = lines
        .iter()
        .filter(|l| l["method"] == "BeginUpdate" && l["restore_correction"] == true)
        .count();
    assert_eq!(
        corrected, 1,
        "the correction is audited with its flag:\n{log}"
    );
    drop(claims);
    tokio::task::spawn_blocking(move || server.stop_with("TERM"))
        .await
        .unwrap();
}

//! The fleet-wide verification limit through the real binary: with
//! `serve --max-concurrent-verifications 1`, three `verify` processes of three cells started at
//! once take turns (the intervals in which each held its slot, from its stderr lines, never
//! overlap) and all finish; the slot of a verifier killed with SIGKILL frees after its
//! time-to-live, so the next verifier gets it; and a verifier paused past its slot's
//! time-to-live, whose slot another verifier took meanwhile, stops when it resumes, says so and
//! exits 3. The cap of one cell (`--max-verifications-per-cell`, or its env var): with 4 slots,
//! one cell gets at most its cap, refused with RetryInfo above it, while other cells still get
//! the free slots.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{command, Server, PATIENCE};
use tonic::transport::{Channel, Endpoint};
use tonic::Code;
use topology_claims::{domain::SlotCap, ClaimsError};
use topology_claims_proto::pb;
use topology_claims_proto::pb::claims_service_client::ClaimsServiceClient;
use topology_claims_proto::status::{from_status, retry_delay};

/// A cell's SQLite database with `users` users (none claimed yet: each is a correction) and its
/// verify.toml.
fn cell_db(dir: &Path, cell: &str, users: i64) -> (PathBuf, PathBuf) {
    let db = dir.join(format!("{cell}.db"));
    let conn = rusqlite::Connection::open(&db).unwrap();
    topology_claims_sqlite::ensure_local_schema(&conn).unwrap();
    conn.execute_batch(
        "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT NOT NULL, created_at INTEGER NOT NULL)",
    )
    .unwrap();
    let tx = conn.unchecked_transaction().unwrap();
    for id in 1..=users {
        tx.execute(
            "INSERT INTO users (id, name, created_at) VALUES (?1, ?2, 1000)",
            (id, format!("{cell}-user-{id}")),
        )
        .unwrap();
    }
    tx.commit().unwrap();
    let source = dir.join(format!("{cell}.toml"));
    std::fs::write(
        &source,
        r#"
[tables.users]
query = "SELECT id, 'username', name, 'user', CAST(id AS TEXT), created_at FROM users WHERE id >= ?1 AND id < ?2"
"#,
    )
    .unwrap();
    (db, source)
}

/// A `verify` child of `cell` whose stderr lines arrive, as they are written, on the receiver.
fn spawn_verify(
    dir: &Path,
    server: &Server,
    cell: &str,
    users: i64,
) -> (Child, mpsc::Receiver<String>) {
    let (db, source) = cell_db(dir, cell, users);
    let local = format!("sqlite://{}", db.display());
    let cursor = dir.join(format!("{cell}.cursor"));
    let mut child = command(
        dir,
        &[
            "verify",
            "--server",
            &server.endpoint(),
            "--cell-id",
            cell,
            "--local-db",
            &local,
            "--source",
            source.to_str().unwrap(),
            "--recent",
            "0s",
            "--page-size",
            "1",
            "--chunk",
            "1",
            "--cursor-file",
            cursor.to_str().unwrap(),
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn verify");
    let stderr = child.stderr.take().unwrap();
    let (lines, received) = mpsc::channel();
    let cell = cell.to_owned();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if !line.starts_with("progress:") {
                eprintln!("[{cell}] {line}");
            }
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    (child, received)
}

/// The `at=` stamp (RFC 3339) of the first line containing `what`, as unix milliseconds,
/// waiting for it.
fn stamp(lines: &mpsc::Receiver<String>, what: &str, seen: &mut Vec<String>) -> u128 {
    let line = wait_for(lines, seen, |l| l.contains(what));
    let at = line.split("at=").nth(1).expect("an at= stamp");
    let text = at.split_whitespace().next().unwrap().trim_end_matches(':');
    let time: prost_types::Timestamp = text
        .parse()
        .unwrap_or_else(|e| panic!("at={text} is not RFC 3339: {e:?}"));
    assert!(text.ends_with('Z'), "UTC: {text}");
    (time.seconds as u128) * 1000 + (time.nanos as u128) / 1_000_000
}

/// The first line that is `what`, waiting for it.
fn wait_for(
    lines: &mpsc::Receiver<String>,
    seen: &mut Vec<String>,
    what: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(line) = seen.iter().find(|l| what(l)) {
            return line.clone();
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => seen.push(line),
            Err(e) => panic!("no such line within {PATIENCE:?} ({e}); saw {seen:?}"),
        }
    }
}

/// Waits for `child`, at most [`PATIENCE`] (a guard against a hang, never a speed assertion).
fn wait(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("verify did not finish within {PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn serve(dir: &Path, extra: &[&str]) -> Server {
    let store = format!("sqlite://{}", dir.join("claims.db").display());
    let args = [&["--listen", "127.0.0.1:0", "--store", &store], extra].concat();
    Server::start(dir, &args)
}

/// A server with one verification slot of time-to-live `ttl`.
fn one_slot(dir: &Path, ttl: &str) -> Server {
    serve(
        dir,
        &[
            "--max-concurrent-verifications",
            "1",
            "--verification-slot-ttl",
            ttl,
        ],
    )
}

#[test]
fn with_one_slot_three_verifiers_take_turns_and_all_finish() {
    let dir = tempfile::tempdir().unwrap();
    // A short ttl: waiters ask again within a sixth of it (about a second), so the turns are quick.
    let server = one_slot(dir.path(), "6s");
    let mut runs: Vec<(Child, mpsc::Receiver<String>)> = ["cell-a", "cell-b", "cell-c"]
        .into_iter()
        .map(|cell| spawn_verify(dir.path(), &server, cell, 400))
        .collect();
    let mut held: Vec<(u128, u128)> = Vec::new();
    let mut waited = false;
    for (child, lines) in &mut runs {
        let mut seen = Vec::new();
        let taken = stamp(lines, "verification slot taken", &mut seen);
        let released = stamp(lines, "verification slot released", &mut seen);
        assert!(wait(child).success(), "every verifier finishes with exit 0");
        seen.extend(lines.try_iter());
        waited |= seen
            .iter()
            .any(|l| l.contains("waiting for a verification slot (1 in use), retrying in"));
        held.push((taken, released));
    }
    held.sort();
    for pair in held.windows(2) {
        assert!(
            pair[0].1 <= pair[1].0,
            "slot intervals overlap: {pair:?} (all: {held:?})"
        );
    }
    assert!(waited, "at least one verifier reported that it waited");
    server.stop_with("TERM");
}

#[test]
fn a_killed_verifiers_slot_frees_after_its_time_to_live() {
    let dir = tempfile::tempdir().unwrap();
    let server = one_slot(dir.path(), "2s");
    // Many records: the first verifier is still running when it is killed.
    let (mut first, first_lines) = spawn_verify(dir.path(), &server, "cell-a", 5_000);
    stamp(&first_lines, "verification slot taken", &mut Vec::new());
    first.kill().expect("SIGKILL the first verifier");
    first.wait().unwrap();
    let killed = Instant::now();

    let (mut second, second_lines) = spawn_verify(dir.path(), &server, "cell-b", 5);
    let mut seen = Vec::new();
    stamp(&second_lines, "verification slot taken", &mut seen);
    let took = killed.elapsed();
    assert!(wait(&mut second).success());
    assert!(
        seen.iter()
            .any(|l| l.contains("waiting for a verification slot (1 in use)")),
        "the dead verifier's slot was held until it expired: {seen:?}"
    );
    // Bounded, not a speed assertion: the ttl, plus a retry hint (at most a sixth of the ttl) and
    // its jitter, with room for a busy machine.
    assert!(
        took < Duration::from_secs(2 + 4 + 10),
        "the slot freed after its ttl; the second verifier got it {took:?} after the kill"
    );
    server.stop_with("TERM");
}

#[test]
fn a_verifier_that_lost_its_slot_stops_says_why_and_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let server = one_slot(dir.path(), "2s");
    // Many records: both verifiers are still running when the first resumes.
    let (mut first, first_lines) = spawn_verify(dir.path(), &server, "cell-a", 5_000);
    let mut first_seen = Vec::new();
    stamp(&first_lines, "verification slot taken", &mut first_seen);
    // Paused (as a stalled process or host would be), it renews nothing: the slot expires.
    let pid = first.id();
    let signal = |name| topology_claims_harness::process::signal(pid, name).unwrap();
    signal("STOP");
    let (mut second, second_lines) = spawn_verify(dir.path(), &server, "cell-b", 5_000);
    let mut second_seen = Vec::new();
    stamp(&second_lines, "verification slot taken", &mut second_seen);
    signal("CONT");

    let status = wait(&mut first);
    first_seen.extend(first_lines.iter());
    assert_eq!(status.code(), Some(3), "{first_seen:#?}");
    let said = |what: &str| first_seen.iter().filter(|l| l.contains(what)).count();
    assert_eq!(said("verification slot lost at="), 1, "{first_seen:#?}");
    assert_eq!(
        said("error: verification slot of cell-a/"),
        1,
        "one error line names the slot: {first_seen:#?}"
    );
    assert_eq!(
        said("the run stopped and the next run resumes from its saved cursor"),
        1,
        "{first_seen:#?}"
    );
    assert_eq!(
        said("verification slot released"),
        0,
        "a lost slot is not given back: the other verifier holds it: {first_seen:#?}"
    );
    // It stopped between two correcting leases, long before the end of its 5,000 records (the
    // service holds none of them, so they are all one page, whose end it never reached).
    assert!(
        !first_seen.iter().any(|l| l.starts_with("progress:")),
        "{first_seen:#?}"
    );

    let _ = second.kill();
    second.wait().unwrap();
    server.stop_with("TERM");
}

async fn slots_client(server: &Server) -> ClaimsServiceClient<Channel> {
    let channel = Endpoint::from_shared(server.endpoint())
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect");
    ClaimsServiceClient::new(channel)
}

/// One AcquireVerificationSlot of `cell`/`holder`: the slots in use after it, or the refusal.
async fn acquire(
    client: &mut ClaimsServiceClient<Channel>,
    cell: &str,
    holder: &str,
) -> Result<u32, tonic::Status> {
    let request = pb::AcquireVerificationSlotRequest {
        cell_id: cell.to_owned(),
        holder: holder.to_owned(),
        ttl: None,
    };
    client
        .acquire_verification_slot(request)
        .await
        .map(|response| response.get_ref().in_use)
}

/// Asserts that `refusal` is VERIFICATION_SLOTS_BUSY of `limit`, with a RetryInfo delay.
fn assert_busy(refusal: &tonic::Status, limit: SlotCap, held: u32, max: u32) {
    assert_eq!(refusal.code(), Code::ResourceExhausted, "{refusal:?}");
    match from_status(refusal) {
        ClaimsError::VerificationSlotsBusy {
            in_use,
            max: limit_max,
            limit: refused_by,
            ..
        } => assert_eq!((refused_by, in_use, limit_max), (limit, held, max)),
        other => panic!("expected VERIFICATION_SLOTS_BUSY, got {other:?}"),
    }
    let delay = retry_delay(refusal).expect("a RetryInfo delay");
    assert!(delay > Duration::ZERO, "{delay:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_four_slots_one_cell_gets_its_cap_of_one_and_other_cells_still_get_slots() {
    let dir = tempfile::tempdir().unwrap();
    // The cap is the default (1): only the fleet-wide limit is set.
    let server = serve(dir.path(), &["--max-concurrent-verifications", "4"]);
    let mut client = slots_client(&server).await;
    assert_eq!(acquire(&mut client, "cell-a", "h1").await.unwrap(), 1);
    // A buggy cron starting verifiers over and over: every further holder of cell-a is refused.
    for holder in ["h2", "h3", "h4", "h5"] {
        let refusal = acquire(&mut client, "cell-a", holder).await.unwrap_err();
        assert_busy(&refusal, SlotCap::PerCell, 1, 1);
    }
    // The holder keeps its slot by renewing it.
    assert_eq!(acquire(&mut client, "cell-a", "h1").await.unwrap(), 1);
    // Other cells take the free slots, up to the fleet's limit.
    assert_eq!(acquire(&mut client, "cell-b", "h1").await.unwrap(), 2);
    assert_eq!(acquire(&mut client, "cell-c", "h1").await.unwrap(), 3);
    assert_eq!(acquire(&mut client, "cell-d", "h1").await.unwrap(), 4);
    let refusal = acquire(&mut client, "cell-e", "h1").await.unwrap_err();
    assert_busy(&refusal, SlotCap::Fleet, 4, 4);
    server.stop_with("TERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cap_per_cell_comes_from_its_environment_variable_too() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("claims.db").display());
    let mut serve = command(
        dir.path(),
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            &store,
            "--max-concurrent-verifications",
            "4",
        ],
    );
    serve
        .env("TOPOLOGY_CLAIMS_MAX_VERIFICATIONS_PER_CELL", "2")
        .stderr(Stdio::inherit());
    let child = topology_claims_harness::serve::ServeChild::start(serve)
        .unwrap_or_else(|e| panic!("serve: {e}"));
    let server = Server {
        addr: child.addr.to_string(),
        child,
    };
    let mut client = slots_client(&server).await;
    assert_eq!(acquire(&mut client, "cell-a", "h1").await.unwrap(), 1);
    assert_eq!(acquire(&mut client, "cell-a", "h2").await.unwrap(), 2);
    let refusal = acquire(&mut client, "cell-a", "h3").await.unwrap_err();
    assert_busy(&refusal, SlotCap::PerCell, 2, 2);
    assert_eq!(acquire(&mut client, "cell-b", "h1").await.unwrap(), 3);
    server.stop_with("TERM");
}

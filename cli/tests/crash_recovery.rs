//! Exact crash recovery, measured (docs/reliability.md, "Crash recovery, measured"): a cell
//! *process* on a PostgreSQL local database is SIGKILLed in the in-transaction order, after
//! BeginUpdate and before its local COMMIT, while `topology-claims reconcile` runs every second
//! at the default 10-minute staleness.
//!
//! - The lease names its local transaction (`pg:<system_identifier>:<xid8>`): PostgreSQL ends
//!   the dead client's transaction as `aborted`, and the reconciler frees the claim at its next
//!   pass (decision 080).
//! - The lease names none (the pre-flight order, or a cell that does not send it): the claim
//!   stays CLAIM_LEASED; after five passes it still is, and with the staleness shortened to 3 s
//!   it is freed only once unrenewed for that long — 10 minutes at the default.
//! - The process is killed after its local COMMIT (before CommitUpdate): the lease is committed
//!   at the next pass, as before.
//!
//! `harness = false`: this executable is both the test and the killed cell process (`child`).
//! It prints the times it measured; the assertions bound them loosely (a hung pass, not speed).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, ExitCode, Stdio};
use std::time::{Duration, Instant};

use common::command;
use common::pg::PgCell;
use topology_claims::{ClaimState, ClaimsError};
use topology_claims_client::{ClaimsClient, ClientConfig, PendingUpdate, UpdateConfig};
use topology_claims_postgres::cell::local_transaction_of;
use topology_claims_postgres::record_in;
use topology_claims_postgres::tokio_postgres::{self, NoTls};
use topology_claims_testkit::fixtures::{cell, creates, username};

/// How the killed cell process leaves its work.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// BeginUpdate naming the local transaction, the lease row inserted, no COMMIT.
    Named,
    /// The same without `local_transaction`.
    Unnamed,
    /// As `Named`, then the local COMMIT, and no CommitUpdate.
    Committed,
}

impl Mode {
    fn arg(self) -> &'static str {
        match self {
            Mode::Named => "named",
            Mode::Unnamed => "unnamed",
            Mode::Committed => "committed",
        }
    }

    fn parse(text: &str) -> Option<Mode> {
        [Mode::Named, Mode::Unnamed, Mode::Committed]
            .into_iter()
            .find(|m| m.arg() == text)
    }
}

/// Guards against a reconciler that never acts; never a speed assertion.
const PATIENCE: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    match args.get(1).map(String::as_str) {
        Some("child") => runtime.block_on(child(&args[2..])),
        // `cargo test -- --list` (and nextest) ask a test binary for its tests.
        _ if args.iter().any(|a| a == "--list") => {
            println!("crash_recovery: test");
            ExitCode::SUCCESS
        }
        _ => {
            runtime.block_on(measure());
            println!("test result: ok. 1 passed");
            ExitCode::SUCCESS
        }
    }
}

/// The cell process: `child ENDPOINT DB_URL NAME MODE`. Leases username NAME from inside an open
/// local transaction, prints `ready`, and waits to be killed.
async fn child(args: &[String]) -> ExitCode {
    let [endpoint, url, name, mode] = args else {
        eprintln!("usage: crash_recovery child ENDPOINT DB_URL NAME named|unnamed|committed");
        return ExitCode::from(2);
    };
    let mode = Mode::parse(mode).expect("a mode");
    let (mut db, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    let client = ClaimsClient::connect_lazy(endpoint, ClientConfig::default()).unwrap();
    let tx = db.transaction().await.unwrap();
    let id: i64 = tx
        .query_one("INSERT INTO users (name) VALUES ($1) RETURNING id", &[name])
        .await
        .unwrap()
        .get(0);
    let mut record = username(name);
    record.table_record_id = id;
    let mut request = creates(&cell("cell-a"), &[record]);
    if mode != Mode::Unnamed {
        request.local_transaction = Some(local_transaction_of(&tx).await.unwrap());
    }
    let pending = PendingUpdate::begin_in_transaction(&client, request, UpdateConfig::default())
        .await
        .unwrap_or_else(|failure| panic!("BeginUpdate: {}", failure.error()));
    record_in(&tx, pending.lease_id()).await.unwrap();
    if mode == Mode::Committed {
        tx.commit().await.unwrap();
    } else {
        // Keeps the transaction open (and its connection) until the process dies.
        std::mem::forget(tx);
    }
    println!("ready {}", pending.lease_id());
    tokio::time::sleep(Duration::from_secs(3600)).await;
    ExitCode::SUCCESS
}

impl PgCell {
    /// Starts a cell process in `mode` leasing `name`, waits for its `ready`, checks the claim
    /// is leased, and SIGKILLs it. Returns when it was killed.
    async fn kill_cell_process(&self, name: &str, mode: Mode) -> Instant {
        let exe = std::env::current_exe().unwrap();
        let mut child = std::process::Command::new(exe)
            .args([
                "child",
                &self.server.endpoint(),
                &self.db.url,
                name,
                mode.arg(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the cell process");
        let stdout = child.stdout.take().unwrap();
        let line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line).map(|_| line)
        })
        .await
        .unwrap()
        .unwrap();
        assert!(line.starts_with("ready "), "cell process said {line:?}");
        assert_eq!(self.state(name).await, Some(ClaimState::Creating));
        kill(&mut child);
        Instant::now()
    }

    async fn state(&self, name: &str) -> Option<ClaimState> {
        match self.client.lookup_claim(&username(name).key).await {
            Ok(claim) => Some(claim.state),
            Err(ClaimsError::ClaimNotFound { .. }) => None,
            Err(error) => panic!("lookup of {name}: {error}"),
        }
    }

    /// Polls until `name`'s state is `want`; the time from `since`.
    async fn until(&self, name: &str, want: Option<ClaimState>, since: Instant) -> Duration {
        loop {
            let state = self.state(name).await;
            if state == want {
                return since.elapsed();
            }
            assert!(
                since.elapsed() < PATIENCE,
                "{name} still {state:?} after {PATIENCE:?}, waiting for {want:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `reconcile` every second with `extra` flags, as a sidecar (killed on drop).
    fn reconciler(&self, extra: &[&str]) -> KillOnDrop {
        let endpoint = self.server.endpoint();
        let mut args = vec![
            "reconcile",
            "--server",
            &endpoint,
            "--cell-id",
            "cell-a",
            "--local-db",
            &self.db.url,
            "--interval",
            "1s",
        ];
        args.extend_from_slice(extra);
        let mut command = command(self.dir.path(), &args);
        command.stdout(Stdio::null()).stderr(Stdio::inherit());
        KillOnDrop(command.spawn().expect("start reconcile"))
    }
}

struct KillOnDrop(Child);

impl KillOnDrop {
    /// Stops the sidecar the way an orchestrator does (SIGTERM) and waits for it to exit.
    fn terminate(mut self) {
        let pid = libc::pid_t::try_from(self.0.id()).expect("a pid");
        // SAFETY: kill(2) on our own child's pid, which we have not waited for yet.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        kill(&mut self.0);
    }
}

fn kill(child: &mut Child) {
    // SIGKILL: no goodbye to PostgreSQL or the service.
    let _ = child.kill();
    let _ = child.wait();
}

fn summary(times: &mut [Duration]) -> String {
    times.sort();
    let ms = |d: Duration| d.as_millis();
    format!(
        "n={} min {} ms, median {} ms, max {} ms",
        times.len(),
        ms(times[0]),
        ms(times[times.len() / 2]),
        ms(times[times.len() - 1])
    )
}

async fn measure() {
    let Some(f) = PgCell::start().await else {
        return;
    };
    let cell_db = &f.local;
    cell_db
        .batch_execute("CREATE TABLE users (id bigserial PRIMARY KEY, name text UNIQUE NOT NULL)")
        .await
        .unwrap();

    // After: the reconciler every second at the default staleness (10 minutes).
    let sidecar = f.reconciler(&[]);
    let mut freed = Vec::new();
    for i in 0..5 {
        let name = format!("named-{i}");
        let killed = f.kill_cell_process(&name, Mode::Named).await;
        freed.push(f.until(&name, None, killed).await);
    }
    let mut committed = Vec::new();
    for i in 0..3 {
        let name = format!("committed-{i}");
        let killed = f.kill_cell_process(&name, Mode::Committed).await;
        committed.push(f.until(&name, Some(ClaimState::Active), killed).await);
    }
    let rows: i64 = cell_db
        .query_one("SELECT count(*) FROM leases_outstanding", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        rows, 0,
        "the reconciler deletes the rows of the leases it committed"
    );

    // Before: without local_transaction the claim waits for the staleness threshold.
    let killed = f.kill_cell_process("unnamed", Mode::Unnamed).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        f.state("unnamed").await,
        Some(ClaimState::Creating),
        "five passes at the default staleness leave a lease without local_transaction alone"
    );
    // SIGTERM, not SIGKILL: the sidecar ends its pass and releases the reconciler lock. Killed
    // mid-pass it would hold the lock for its 120 s TTL, and the next reconciler would wait.
    sidecar.terminate();
    let shortened = f.reconciler(&["--staleness", "8s"]);
    let stale_freed = f.until("unnamed", None, killed).await;
    drop(shortened);
    assert!(
        stale_freed >= Duration::from_secs(8),
        "freed after {stale_freed:?}, before the 8 s staleness"
    );

    println!(
        "crash recovery, reconciler every 1 s:\n  \
         killed before local COMMIT, with local_transaction, default staleness: freed after {}\n  \
         killed after local COMMIT: committed after {}\n  \
         killed before local COMMIT, without local_transaction: still leased after 5 passes; \
         with the staleness shortened to 8 s, freed after {} ms",
        summary(&mut freed),
        summary(&mut committed),
        stale_freed.as_millis()
    );
    drop(f.server);
    f.db.drop_database().await;
}

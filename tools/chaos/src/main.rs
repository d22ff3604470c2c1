//! `topology-claims-chaos`: a fault campaign against real server processes (the
//! `topology-claims` binary, found beside this one, on PATH, or at `--bin` / `TOPOLOGY_CLAIMS_BIN`).
//!
//! M simulated cells (each with its own local SQLite database and the real cell-side client)
//! run random creates, destroys and conflicting takes over a small shared key space, through a
//! misbehaving TCP proxy, against one or two `serve` processes on a shared store, while faults
//! are injected — first swept deterministically over every phase boundary, then at random
//! (seeded). Every cell's reconciler runs in the background as its sidecar would. Then the
//! faults stop, each reconciler runs once past the staleness threshold, and two checkers judge
//! the recorded history: the state after healing (`invariants`) and per-key linearizability
//! against the pure domain model (`linearizability`). With `store-restore` (once per campaign,
//! `restore`) the store is restored from a backup taken mid-workload and marked restored before
//! the cells are let back in; linearizability is then checked whole only on the keys the restore
//! could not touch, and the restore's own invariants (`restore_check`) are judged too. The
//! summary is printed; any violation prints the seed and a minimal history, and exits 1.
//!
//! Owns the campaign's orchestration. Must not hold protocol rules (the client, the reconciler
//! and the service are the real ones) nor storage code.

mod cell;
#[cfg(test)]
mod concurrent;
mod faults;
mod fleet;
mod history;
mod invariants;
mod linearizability;
mod local;
mod model;
mod phases;
mod proxy;
mod recovery;
mod report;
mod restore;
mod restore_check;
mod router;
mod verify;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use tokio::sync::watch;
use topology_claims::LeasesQuery;
use topology_claims_client::{
    Backoff, ClaimsClient, ClientConfig, ClientTls, Reconciler, ReconcilerConfig, UpdateConfig,
};

use crate::cell::{Boundary, CellContext, Crash, Sabotage, SimCell, Tally};
use crate::faults::{FaultKind, Injector};
use crate::fleet::{Backing, Fleet};
use crate::history::{Answer, Call, ErrorKind, History, TxOp};
use crate::invariants::FinalState;
use crate::linearizability::Verdict;
use crate::local::LocalDbSpec;
use crate::phases::{probe_fates, sidecar, sweep_case, worker};
use crate::proxy::Proxy;
use crate::recovery::Recovery;
use crate::router::Router;
use topology_claims::config::parse_nonzero_duration;
use topology_claims_harness::pki::DevPki;

/// Fault campaign: simulated cells against real server processes while clients crash at every
/// phase, servers are killed, connections dropped, delayed and reset; then checks the healed
/// state and per-key linearizability. Prints a summary; exit 1 on any violation
/// (docs/reliability.md).
#[derive(Parser, Debug)]
#[command(name = "topology-claims-chaos", version)]
pub struct ChaosArgs {
    /// The topology-claims binary whose servers are attacked (default: the one built beside this
    /// tool, else the PATH's).
    #[arg(long = "bin", env = "TOPOLOGY_CLAIMS_BIN")]
    bin: Option<PathBuf>,

    /// Simulated cells, each with its own local SQLite database, client and reconciler.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CHAOS_CELLS", default_value_t = 8,
          value_parser = clap::value_parser!(u16).range(1..=100))]
    cells: u16,

    /// Of --cells, how many keep their local database on the campaign's own PostgreSQL
    /// cluster (a schema each; needs --store private-postgres:) and use the in-transaction
    /// order, naming their transaction in `local_transaction`, so their crashes happen inside
    /// open local transactions and their reconcilers roll those leases back at once. The
    /// others use SQLite and the pre-flight order; only they drift and run verifiers.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CHAOS_PG_CELLS", default_value_t = 0)]
    pg_cells: u16,

    /// Claim transactions of the random phase (the deterministic sweep before it adds its
    /// own: about 230 with 8 cells). `--long` raises it to at least 10000.
    #[arg(
        long,
        env = "TOPOLOGY_CLAIMS_CHAOS_TRANSACTIONS",
        default_value_t = 2000
    )]
    transactions: u64,

    /// Seed of every random choice (operations, keys, crash points, fault schedule). Thread
    /// timing is not reproducible, so a seed reproduces the schedule, not the interleaving.
    /// Default: from the clock (printed).
    #[arg(long, env = "TOPOLOGY_CLAIMS_CHAOS_SEED")]
    seed: Option<u64>,

    /// Size of the key space all cells share (small: many conflicting takes).
    #[arg(long, env = "TOPOLOGY_CLAIMS_CHAOS_KEYS", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    keys: u32,

    /// The servers' store: memory: (one server, no server-kill), sqlite://PATH,
    /// postgres://USER@HOST:PORT/DB (a fresh schema is created there and dropped after a
    /// passing run), private-postgres: (a throwaway PostgreSQL cluster of the campaign's own,
    /// which `pg-restart` crashes; initdb/pg_ctl from TOPOLOGY_CLAIMS_CHAOS_PG_BIN or
    /// pg_config), or spanner-emulator: (a Cloud Spanner emulator of the campaign's own,
    /// started with --enable_fault_injection). Default: a fresh SQLite file in the work
    /// directory.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CHAOS_STORE")]
    store: Option<String>,

    /// Server processes sharing the store (1 or 2); the proxy spreads connections over them.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CHAOS_SERVERS", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(1..=2))]
    servers: u8,

    /// Faults to inject: all, none, or a comma-separated list of crash-after-begin,
    /// crash-in-local-tx, crash-after-local-commit, crash-after-commit, server-kill,
    /// pg-terminate (PostgreSQL stores only), pg-restart (private-postgres: only),
    /// store-restore (once: backup mid-workload, restore, mark-restored; sqlite:// and
    /// private-postgres: stores without --pg-cells), proxy-drop, proxy-delay, proxy-reset. A
    /// kind the store cannot take is skipped with a note.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CHAOS_FAULTS", default_value = "all")]
    faults: String,

    /// Long mode: at least 10000 transactions.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CHAOS_LONG")]
    long: bool,

    /// Write the whole history (every call with its times and answer) to this file.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CHAOS_HISTORY")]
    history: Option<PathBuf>,

    /// The reconcilers' staleness threshold; cells refuse a local commit after half of it.
    /// Units: ms, s, m.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CHAOS_STALENESS", default_value = "2s",
          value_parser = parse_nonzero_duration)]
    staleness: Duration,

    /// Where the cells' databases, the SQLite store and the server logs go. Default: a fresh
    /// directory under the system's temp dir, removed after a passing run.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CHAOS_WORK_DIR")]
    work_dir: Option<PathBuf>,

    /// A deliberately broken cell, to see the checkers catch it: skip-lease-record (the cell
    /// commits locally without recording its lease). For testing the campaign itself.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CHAOS_SABOTAGE")]
    sabotage: Option<Sabotage>,

    /// Fraction of the random phase's steps in which a cell changes one of its records outside
    /// the protocol (deletes it, or changes its owner): drift for the verifiers to correct.
    /// 0: none.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CHAOS_DRIFT", default_value_t = 0.02,
          value_parser = parse_fraction)]
    drift: f64,

    /// Mutual TLS: a development PKI is made in the work directory (by `topology-claims
    /// certs`), every server serves TLS and requires client certificates, and each cell
    /// connects over https:// with its own certificate, `spiffe://topology-claims/cell/ID`.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CHAOS_TLS")]
    tls: bool,
}

/// Each transaction of the random phase crashes with this probability (at a random boundary).
pub(crate) const CRASH_RATE: f64 = 0.03;
/// Search steps per key before the linearizability checker gives up (reported, and a failure).
const SEARCH_BUDGET: u64 = 5_000_000;
const SHRINK_TIME: Duration = Duration::from_secs(30);

fn main() -> ExitCode {
    let args = ChaosArgs::parse();
    let bin = args.bin.clone();
    topology_claims_harness::run_tool(bin.as_deref(), run(args))
}

async fn run(args: ChaosArgs) -> ExitCode {
    // On SIGINT/SIGTERM the campaign is dropped, and with it the server processes
    // (`kill_on_drop`), so an interrupted run leaves nothing behind.
    let outcome = tokio::select! {
        outcome = campaign(args) => outcome,
        signal = interrupted() => Err(format!("{signal}: campaign abandoned, servers stopped")),
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

#[cfg(unix)]
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut interrupt), Ok(mut terminate)) => tokio::select! {
            _ = interrupt.recv() => "SIGINT",
            _ = terminate.recv() => "SIGTERM",
        },
        _ => std::future::pending().await,
    }
}

#[cfg(not(unix))]
async fn interrupted() -> &'static str {
    let _ = tokio::signal::ctrl_c().await;
    "Ctrl-C"
}

/// The cells' client: short deadlines and few retries, so faults turn into lost outcomes
/// quickly instead of stalling the campaign; `tls` with the cell's own certificate.
fn client_config(tls: Option<ClientTls>) -> ClientConfig {
    ClientConfig {
        call_timeout: Duration::from_millis(750),
        max_attempts: 4,
        backoff: Backoff {
            initial: Duration::from_millis(25),
            max: Duration::from_millis(250),
        },
        connect_timeout: Duration::from_millis(500),
        tls,
        retry_claim_leased: None,
    }
}

fn parse_fraction(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
        _ => Err(format!("{text:?} is not a fraction between 0 and 1")),
    }
}

fn seeded(seed: u64, stream: u64) -> fastrand::Rng {
    fastrand::Rng::with_seed(seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

async fn campaign(args: ChaosArgs) -> Result<bool, String> {
    let started = Instant::now();
    let seed = args.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let transactions = if args.long {
        args.transactions.max(10_000)
    } else {
        args.transactions
    };
    let (cells_n, keys, servers) = (args.cells, args.keys, usize::from(args.servers));
    let mut faults = FaultKind::parse_list(&args.faults)?;
    println!("chaos: seed {seed}");

    let (work_dir, temporary) = match &args.work_dir {
        Some(dir) => (dir.clone(), false),
        None => (
            std::env::temp_dir().join(format!(
                "topology-claims-chaos-{}-{:08x}",
                std::process::id(),
                fastrand::u32(..)
            )),
            true,
        ),
    };
    std::fs::create_dir_all(&work_dir)
        .map_err(|e| format!("creating {}: {e}", work_dir.display()))?;

    let backing = Arc::new(Backing::prepare(args.store.as_deref(), &work_dir).await?);
    if args.pg_cells > 0 && !backing.is_private_postgres() {
        return Err("--pg-cells needs --store private-postgres: (the cells' schemas live on the campaign's own cluster)".into());
    }
    if args.pg_cells >= cells_n {
        return Err(format!(
            "--pg-cells {} must leave at least one of the {cells_n} --cells on SQLite (the external faults pause SQLite cells)",
            args.pg_cells
        ));
    }
    if !backing.survives_restarts() && servers > 1 {
        return Err("memory: cannot be shared by two servers; use sqlite:// or postgres://".into());
    }
    let notes = faults::drop_inapplicable(&mut faults, &backing, args.pg_cells);

    // One certificate per cell: a cell may act only as itself, so each cell's clients (its
    // worker, its reconciler, the probes of its leases) present that cell's identity.
    let pki = if args.tls {
        let dir = work_dir.join("pki");
        Some(tokio::task::block_in_place(|| DevPki::create(&dir))?)
    } else {
        None
    };
    let mut cell_tls = Vec::new();
    if let Some(pki) = &pki {
        for i in 0..cells_n {
            let name = model::cell_id(i).to_string();
            cell_tls.push(tokio::task::block_in_place(|| {
                pki.client_tls("cell", &name)
            })?);
        }
    }
    let proxy = Arc::new(Proxy::start(servers).await?);
    let mut serve_args = pki.as_ref().map(DevPki::serve_args).unwrap_or_default();
    // Fewer verification slots than cells: the verifiers wait for each other.
    serve_args.extend([
        "--max-concurrent-verifications".to_owned(),
        verify::MAX_CONCURRENT_VERIFICATIONS.to_string(),
    ]);
    let fleet = Fleet::start(servers, &backing, Arc::clone(&proxy), &work_dir, serve_args).await?;
    let fleet = Arc::new(tokio::sync::Mutex::new(fleet));
    let injector = Arc::new(Injector::new(
        Arc::clone(&fleet),
        Arc::clone(&proxy),
        Arc::clone(&backing),
    ));
    let history = Arc::new(History::new());
    let tally = Arc::new(Tally::default());
    let update = UpdateConfig {
        staleness: args.staleness,
        safety_margin: args.staleness / 2,
        renew_every: None,
        ..UpdateConfig::default()
    };
    let ctx = Arc::new(CellContext {
        history: Arc::clone(&history),
        tally: Arc::clone(&tally),
        injector: Arc::clone(&injector),
        update,
        lease_wait: Duration::from_millis(200),
        sabotage: args.sabotage,
        drifted: Default::default(),
        recovery: Arc::new(Recovery::default()),
    });
    // The proxy forwards raw TCP, so TLS runs end to end between a cell and a server; the
    // server's certificate has the proxy's address, 127.0.0.1, as an IP SAN.
    let endpoint = if pki.is_some() {
        proxy.endpoint().replacen("http://", "https://", 1)
    } else {
        proxy.endpoint()
    };
    let client = |cell: u16| {
        let tls = cell_tls.get(usize::from(cell)).cloned();
        ClaimsClient::connect_lazy(&endpoint, client_config(tls)).map_err(|e| e.to_string())
    };
    let mut cells = Vec::new();
    for i in 0..cells_n {
        let spec = if i >= cells_n - args.pg_cells {
            backing.cell_schema(i).await?
        } else {
            LocalDbSpec::Sqlite(work_dir.join(format!("cell-{i:02}.db")))
        };
        cells
            .push(SimCell::open(i, spec, client(i)?, Arc::clone(&ctx), seed ^ u64::from(i)).await?);
    }

    // The reconciler sidecars, running all along as they would in production.
    let (stop_reconcilers, reconcilers_stopped) = watch::channel(false);
    let mut sidecars = Vec::new();
    for cell in &cells {
        let local = cell.spec().leases().await?;
        let config = ReconcilerConfig {
            staleness: args.staleness,
            page_size: 50,
            lock_ttl: Duration::from_secs(10),
            holder: format!("chaos-reconciler-{:02}", cell.index),
            ..ReconcilerConfig::new(model::cell_id(cell.index))
        };
        let reconciler = Reconciler::new(client(cell.index)?, local, config);
        sidecars.push(tokio::spawn(sidecar(
            reconciler,
            cell.index,
            Arc::clone(&tally),
            seeded(seed, 1000 + u64::from(cell.index)),
            reconcilers_stopped.clone(),
        )));
    }

    // The verify sidecars, running all along too: the real verifier with slots, correcting
    // what it finds while the cells' transactions and the reconcilers race it.
    let verify_stats = Arc::new(verify::VerifyStats::default());
    let committed = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut verifiers = Vec::new();
    for cell in &cells {
        let Some(path) = cell.spec().sqlite_path() else {
            continue;
        };
        let verifier = verify::verifier(
            cell.index,
            path,
            client(cell.index)?,
            Arc::clone(&history),
            Arc::clone(&verify_stats),
            Arc::clone(&committed),
        )?;
        let sidecar = tokio::spawn(verify::sidecar(
            verifier,
            cell.index,
            Arc::clone(&verify_stats),
            seeded(seed, 2000 + u64::from(cell.index)),
            reconcilers_stopped.clone(),
        ));
        verifiers.push((cell.index, sidecar));
    }

    // How long the leases of crashed transactions stay outstanding (recovery.rs).
    let recovery_watch = tokio::spawn(recovery::watch(
        Arc::clone(&ctx.recovery),
        (0..cells_n).map(&client).collect::<Result<Vec<_>, _>>()?,
        reconcilers_stopped.clone(),
    ));

    // 1. The deterministic sweep: every crash point on every cell, for a create and for a
    //    destroy; then every external fault at every phase boundary. Each case is retried
    //    until its transaction got far enough for the fault to fire.
    let mut rng = seeded(seed, 1);
    let crashes: Vec<Crash> = Crash::ALL
        .into_iter()
        .filter(|c| faults.contains(&c.fault()))
        .collect();
    let mut unswept = Vec::new();
    // 20 retries of a case span twice the staleness (at least 4 s): a key an earlier crash
    // left leased is free again by then.
    let retry_after = (args.staleness / 10).max(Duration::from_millis(200));
    ctx.recovery.set_sweeping(true);
    for cell in cells.iter_mut() {
        for &crash in &crashes {
            for op in [TxOp::Create, TxOp::Destroy] {
                let fault = crash.fault();
                if !sweep_case(
                    cell,
                    keys,
                    &injector,
                    fault,
                    op,
                    Some(crash),
                    None,
                    &mut rng,
                    retry_after,
                )
                .await
                {
                    unswept.push(format!("c{:02} {} on a {op:?}", cell.index, fault.name()));
                }
            }
        }
    }
    ctx.recovery.set_sweeping(false);
    let externals: Vec<FaultKind> = faults
        .iter()
        .copied()
        .filter(|k| !k.is_crash() && !k.is_once())
        .collect();
    // The SQLite cells (the pre-flight order pauses at every boundary).
    let paused = usize::from(cells_n - args.pg_cells);
    let mut turn = 0usize;
    for &kind in &externals {
        for boundary in Boundary::ALL {
            let cell = &mut cells[turn % paused];
            let op = if turn.is_multiple_of(2) {
                TxOp::Create
            } else {
                TxOp::Destroy
            };
            turn += 1;
            let pause = Some((boundary, kind));
            if !sweep_case(
                cell,
                keys,
                &injector,
                kind,
                op,
                None,
                pause,
                &mut rng,
                retry_after,
            )
            .await
            {
                unswept.push(format!("{} at {boundary:?}", kind.name()));
            }
            // Each case starts from a healthy service.
            injector.heal().await?;
        }
    }
    let swept = tally
        .counts()
        .iter()
        .filter(|(k, _)| k.starts_with("transactions:"))
        .map(|(_, n)| n)
        .sum::<u64>();

    // 2. The random phase: all cells at once, faults on a seeded schedule.
    let remaining = Arc::new(AtomicU64::new(transactions));
    let (stop_faults, faults_stopped) = watch::channel(false);
    let schedule = tokio::spawn(faults::random_schedule(
        Arc::clone(&injector),
        faults.clone(),
        seeded(seed, 2),
        faults_stopped,
    ));
    // The store restore (restore.rs), once, at points of the random phase drawn from the seed.
    let hold = Arc::new(restore::Hold::default());
    let restoring = match faults.contains(&FaultKind::StoreRestore) {
        true => Some(tokio::spawn(
            restore::StoreRestore {
                injector: Arc::clone(&injector),
                fleet: Arc::clone(&fleet),
                backing: Arc::clone(&backing),
                history: Arc::clone(&history),
                hold: Arc::clone(&hold),
                clients: (0..cells_n).map(&client).collect::<Result<Vec<_>, _>>()?,
                admin_tls: restore::admin_tls(pki.as_ref())?,
                backup_path: work_dir.join("store.backup"),
                plan: restore::Plan::draw(transactions, &mut seeded(seed, 3)),
                budget: transactions,
            }
            .run(Arc::clone(&remaining)),
        )),
        false => None,
    };
    // The router beside the cells (router.rs); its REST client speaks plaintext only.
    let router = match pki {
        None => Some(Router::start(&endpoint, client(0)?, keys, seed ^ 0x5eed).await),
        Some(_) => None,
    };
    let workers: Vec<_> = cells
        .into_iter()
        .map(|cell| {
            let plan = (keys, crashes.clone(), args.drift);
            tokio::spawn(worker(
                cell,
                Arc::clone(&remaining),
                plan,
                Arc::clone(&hold),
            ))
        })
        .collect();
    let mut cells = Vec::new();
    for worker in workers {
        cells.push(
            worker
                .await
                .map_err(|e| format!("a cell worker failed: {e}"))?,
        );
    }
    let window = match restoring {
        Some(task) => task
            .await
            .map_err(|e| format!("the store-restore task failed: {e}"))?
            .map_err(|e| injector.machinery_error(e))
            .ok(),
        None => None,
    };
    let _ = stop_faults.send(true);
    let _ = schedule.await;
    // The leases the restore may have changed, and their keys (restore_check.rs).
    let (uncertain, touched) = window.as_ref().map_or_else(Default::default, |w| {
        let uncertain = restore_check::uncertain_leases(&history.snapshot(), w);
        let touched = restore_check::touched_keys(&history.snapshot(), &uncertain);
        (uncertain, touched)
    });

    // 3. Healing: faults end, the sidecars stop, and once every lease is past the staleness
    //    threshold each cell's reconciler runs once more; then each verifier, which must find
    //    nothing.
    injector.heal().await?;
    let _ = stop_reconcilers.send(true);
    let mut stopped_verifiers = Vec::new();
    for (index, verifier) in verifiers {
        stopped_verifiers.push((
            index,
            verifier
                .await
                .map_err(|e| format!("a verify sidecar failed: {e}"))?,
        ));
    }
    let _ = recovery_watch.await;
    let mut reconcilers = Vec::new();
    let mut background_passes = 0;
    for sidecar in sidecars {
        let (reconciler, passes) = sidecar
            .await
            .map_err(|e| format!("a reconciler sidecar failed: {e}"))?;
        background_passes += passes;
        reconcilers.push(reconciler);
    }
    tokio::time::sleep(args.staleness + args.staleness / 2 + Duration::from_millis(500)).await;
    let (final_passes, final_errors) = phases::final_reconcile(&reconcilers, &tally).await;

    // The first pass after healing corrects the drift the background runs had not reached
    // yet (and only that); the second must find nothing at all.
    let drifted = ctx
        .drifted
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let explained = restore_check::with_touched(&drifted, &touched, cells_n);
    let mut unexplained = Vec::new();
    // A probe client per cell: RenewLease and ListOutstandingLeases of a cell need its identity
    // under TLS (LookupClaim is allowed to every cell).
    let probes = (0..cells_n).map(&client).collect::<Result<Vec<_>, _>>()?;
    // Every cell's repair pass comes before any cell's last pass. After a store restore, three
    // rounds: a cell's correction may wait on another cell's lease that predates the restore,
    // which only that cell's verifier ends; and a fix a cell needs after it reported its pass is
    // an ordinary create, refused until the quarantine lifts (once every cell reported), so the
    // third round runs once every cell's view shows the lift.
    let mut repairs = BTreeMap::new();
    let rounds = if window.is_some() { 3 } else { 1 };
    for round in 1..=rounds {
        if window.is_some() && round == rounds {
            restore::final_views(&probes).await;
        }
        for (index, verifier) in &stopped_verifiers {
            let repair = verify::final_pass(verifier).await;
            if let Ok(report) = &repair {
                verify_stats.repaired_after_healing(report);
                unexplained.extend(
                    verify::not_drift(*index, report, &explained)
                        .into_iter()
                        .map(|d| format!("c{index:02}: {d}")),
                );
            }
            repairs.insert(*index, repair);
        }
    }
    let mut final_verify = Vec::new();
    for (index, verifier) in &stopped_verifiers {
        let last = verify::final_pass(verifier).await;
        if let Ok(report) = &last {
            verify_stats.final_pass(report);
        }
        let repair = repairs.remove(index).unwrap_or_else(|| last.clone());
        final_verify.push((*index, repair.and(last)));
    }

    // 4. Probes: each lease's final fate and each key's final claim, into the history.
    let probe = &probes[0];
    probe_fates(&history, &probes).await;
    let mut final_state = FinalState::default();
    for key in 0..keys {
        let id = history.invoke(u16::MAX, Call::Lookup { key });
        let answer = match probe.lookup_claim(&model::claim_key(key)).await {
            Ok(view) => Answer::Found {
                cell: model::cell_index(&view.cell_id).unwrap_or(u16::MAX),
                state: view.state,
            },
            Err(e) => Answer::from_error(&e),
        };
        history.complete(id, answer);
        let claim = match answer {
            Answer::Found { cell, state } => Some((cell, state)),
            Answer::Err(ErrorKind::ClaimNotFound) => None,
            other => return Err(format!("final lookup of k{key} failed: {other}")),
        };
        final_state.claims.insert(key, claim);
    }
    history.add_ghosts();
    if window.is_none() {
        // A restored store forgets the leases taken after its backup: restore_check's business.
        final_state.forgotten = history.forgotten_leases();
    }

    // 5. The checkers.
    let mut record_leases = Vec::new();
    for cell in &mut cells {
        record_leases.push((cell.index, cell.record_leases()?));
        final_state.local_records.push(cell.records().await?);
        final_state.local_lease_rows.push(cell.lease_rows().await?);
        let page = probes[usize::from(cell.index)]
            .list_outstanding_leases(&LeasesQuery::new(model::cell_id(cell.index), None, 1000))
            .await
            .map_err(|e| format!("listing outstanding leases: {e}"))?;
        final_state.outstanding_leases.push(page.leases.len());
    }
    final_state.lost = tally
        .lost_leases()
        .into_iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let events = history.snapshot();
    let committed = committed.lock().unwrap_or_else(|p| p.into_inner()).clone();
    final_state.verifier_freed_held = verify::held_when_freed(&committed, &events)
        .into_iter()
        .map(|f| (f.cell, f.key, f.lease))
        .collect();
    let after_restore = match &window {
        Some(w) => restore_check::not_explained_by_restore(&committed, w, &touched),
        None => committed.clone(),
    };
    final_state.unexplained_corrections = verify::not_explained_by_drift(&after_restore, &drifted)
        .into_iter()
        .map(|c| (c.cell, c.key, c.op, c.lease))
        .collect();
    final_state.unexplained_repairs = unexplained;
    final_state.final_verify = final_verify
        .iter()
        .map(|(cell, pass)| {
            let pass = match pass {
                Ok(report) => Ok(report
                    .discrepancies
                    .iter()
                    .map(ToString::to_string)
                    .collect()),
                Err(error) => Err(error.clone()),
            };
            (*cell, pass)
        })
        .collect();
    // In the sweep, nothing but the crash happens: a lease naming its aborted transaction must
    // be rolled back by the reconciler's early rule, before the staleness rule could.
    final_state.recovery_bound = args.staleness;
    final_state.slow_recoveries = ctx.recovery.slow_in_sweep(args.staleness);
    let mut invariant_violations = invariants::check(&final_state);
    let router_line = match router {
        Some(router) => {
            let (violations, line) = router.finish().await;
            invariant_violations.extend(violations);
            line
        }
        None => "not run (--tls: the example's REST client is plaintext)".to_owned(),
    };
    invariant_violations.extend(restore_check::committed_leases_kept(
        &record_leases,
        &events,
    ));
    if window.is_some() {
        let views = restore::final_views(&probes).await;
        invariant_violations.extend(restore_check::quarantine_lifted(&views));
    }
    if let Some(path) = &args.history {
        report::write_history(path, seed, &events)?;
    }
    let per_key = match &window {
        Some(w) => restore_check::per_key(&events, w, &uncertain, &touched),
        None => linearizability::by_key(&linearizability::simplify(&events)),
    };
    let keys_checked = per_key.len();
    let verdicts = tokio::task::spawn_blocking(move || {
        per_key
            .into_iter()
            .map(|(key, events)| {
                let started = Instant::now();
                let verdict = linearizability::check_key(&events, SEARCH_BUDGET, SHRINK_TIME);
                tracing::debug!(key, calls = events.len(), elapsed = ?started.elapsed(), ?verdict, "checked");
                (key, verdict)
            })
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|e| format!("the linearizability checker failed: {e}"))?;
    let mut not_linearizable = Vec::new();
    let mut inconclusive = Vec::new();
    for (key, verdict) in verdicts {
        match verdict {
            Verdict::Linearizable => {}
            Verdict::Violation { minimal } => not_linearizable.push((key, minimal)),
            Verdict::Inconclusive => inconclusive.push(key),
        }
    }

    // 6. Report and clean up.
    fleet.lock().await.stop_all().await;
    let (restarts, start_retries) = {
        let fleet = fleet.lock().await;
        (fleet.restarts, fleet.start_retries)
    };
    let fired = injector.counts();
    let mut machinery_errors = injector.errors();
    machinery_errors.extend(
        unswept
            .into_iter()
            .map(|case| format!("sweep case never reached its fault: {case}")),
    );
    let (named, unnamed) = ctx.recovery.distributions();
    let mut header = vec![
        ("seed", seed.to_string()),
        ("store", backing.describe()),
        ("servers", servers.to_string()),
        ("cells", cells_n.to_string()),
        ("keys", keys.to_string()),
        (
            "transactions",
            format!(
                "{} ({swept} in the sweep, {transactions} random)",
                swept + transactions
            ),
        ),
        ("staleness", format!("{:?}", args.staleness)),
        (
            "cells on PostgreSQL",
            format!(
                "{} (in-transaction order, naming their local transaction)",
                args.pg_cells
            ),
        ),
        ("time to free, with local_transaction", named.describe()),
        ("time to free, without", unnamed.describe()),
        (
            "server restarts",
            format!("{restarts} (+{start_retries} starts that failed and were retried)"),
        ),
        ("proxy connections", proxy.connections().to_string()),
        ("router cache", router_line),
        (
            "lease waits",
            crate::cell::lease_waits_line(cells_n, args.pg_cells),
        ),
    ];
    if faults.contains(&FaultKind::StoreRestore) {
        let refused = tally
            .counts()
            .get("ended: refused RestoreQuarantine")
            .copied();
        let sizes = (touched.len(), uncertain.len(), keys_checked);
        header.extend(restore::summary(
            window.as_ref(),
            sizes,
            refused.unwrap_or(0),
        ));
    }
    for note in &notes {
        header.push(("note", (*note).to_owned()));
    }
    if let Some(sabotage) = args.sabotage {
        header.push(("SABOTAGE", format!("{sabotage:?}")));
    }
    let summary = report::Summary {
        header,
        duration: started.elapsed(),
        events: &events,
        endings: tally
            .counts()
            .into_iter()
            .filter(|(k, _)| !k.starts_with("transactions:"))
            .collect(),
        faults: faults
            .iter()
            .map(|k| (*k, fired.get(k).copied().unwrap_or(0)))
            .collect(),
        reconcile: vec![
            ("background passes", background_passes),
            ("final passes", final_passes),
            ("final passes that had to be repeated", final_errors),
        ],
        verify: verify_stats.lines(),
        invariants: &invariant_violations,
        keys_checked,
        linearizability: &not_linearizable,
        inconclusive: &inconclusive,
        machinery_errors: &machinery_errors,
        seed,
    };
    let passed = summary.passed();
    eprint!("{}", summary.render_failures());
    print!("{}", summary.render());
    if passed {
        backing.drop_schema().await;
        if temporary {
            let _ = std::fs::remove_dir_all(&work_dir);
        }
    } else {
        println!("work directory kept: {}", work_dir.display());
        if let Some(kept) = backing.keep_for_study() {
            println!("{kept}");
        }
    }
    Ok(passed)
}

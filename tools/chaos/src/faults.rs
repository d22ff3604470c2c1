//! The fault kinds, their injection, and the random schedule.
//!
//! | kind | injected by |
//! |---|---|
//! | `crash-after-begin`, `crash-in-local-tx`, `crash-after-local-commit`, `crash-after-commit` | the cell itself (see `cell.rs`): its work is dropped at that boundary |
//! | `server-kill` | SIGKILL of a server process, restarted on the same store after a short outage |
//! | `pg-terminate` | `pg_terminate_backend` of every PostgreSQL connection of the servers |
//! | `pg-restart` | the campaign's own PostgreSQL cluster (`private-postgres:`) crashed with `pg_ctl stop -m immediate`, started again after an outage (WAL recovery) |
//! | `store-restore` | once per campaign, by `restore.rs`: a backup while serving, more traffic, then every server stopped, the backup restored, `admin mark-restored` before the cells are let back in (SQLite and `private-postgres:` stores) |
//! | `proxy-drop` | the proxy holds all bytes for a window, then closes every connection (what it held is lost) |
//! | `proxy-delay` | the proxy delays every chunk for a window |
//! | `proxy-reset` | the proxy aborts every open connection with RST |
//!
//! Windows (drop, delay) and restarts run in the background, so the calls that follow meet
//! them; [`Injector::heal`] waits for all of them and brings every server back.
//! [`Injector::quiet`] holds every injection off (for the backup and the restore of
//! `store-restore`, which a `pg-restart` must not cut). Owns the mechanics of misbehaving; must
//! not judge the outcome.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::fleet::{Backing, Fleet};
use crate::proxy::{Mode, Proxy};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    CrashAfterBegin,
    CrashInLocalTx,
    CrashAfterLocalCommit,
    CrashAfterCommit,
    ServerKill,
    PgTerminate,
    PgRestart,
    StoreRestore,
    ProxyDrop,
    ProxyDelay,
    ProxyReset,
}

impl FaultKind {
    pub const ALL: [FaultKind; 11] = [
        FaultKind::CrashAfterBegin,
        FaultKind::CrashInLocalTx,
        FaultKind::CrashAfterLocalCommit,
        FaultKind::CrashAfterCommit,
        FaultKind::ServerKill,
        FaultKind::PgTerminate,
        FaultKind::PgRestart,
        FaultKind::StoreRestore,
        FaultKind::ProxyDrop,
        FaultKind::ProxyDelay,
        FaultKind::ProxyReset,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::CrashAfterBegin => "crash-after-begin",
            FaultKind::CrashInLocalTx => "crash-in-local-tx",
            FaultKind::CrashAfterLocalCommit => "crash-after-local-commit",
            FaultKind::CrashAfterCommit => "crash-after-commit",
            FaultKind::ServerKill => "server-kill",
            FaultKind::PgTerminate => "pg-terminate",
            FaultKind::PgRestart => "pg-restart",
            FaultKind::StoreRestore => "store-restore",
            FaultKind::ProxyDrop => "proxy-drop",
            FaultKind::ProxyDelay => "proxy-delay",
            FaultKind::ProxyReset => "proxy-reset",
        }
    }

    pub fn is_crash(self) -> bool {
        matches!(
            self,
            FaultKind::CrashAfterBegin
                | FaultKind::CrashInLocalTx
                | FaultKind::CrashAfterLocalCommit
                | FaultKind::CrashAfterCommit
        )
    }

    /// Whether the fault is injected at moments of its own (once per campaign), not by the
    /// sweep or the random schedule.
    pub fn is_once(self) -> bool {
        self == FaultKind::StoreRestore
    }

    /// Parses `--faults`: `all`, `none`, or a comma-separated list of names.
    pub fn parse_list(text: &str) -> Result<Vec<FaultKind>, String> {
        match text.trim() {
            "all" => return Ok(FaultKind::ALL.to_vec()),
            "none" | "" => return Ok(Vec::new()),
            _ => {}
        }
        let mut kinds = Vec::new();
        for name in text.split(',').map(str::trim) {
            let kind = FaultKind::ALL
                .into_iter()
                .find(|k| k.name() == name)
                .ok_or_else(|| {
                    let known: Vec<&str> = FaultKind::ALL.iter().map(|k| k.name()).collect();
                    format!(
                        "unknown fault {name:?}; known: all, none, {}",
                        known.join(", ")
                    )
                })?;
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        kinds.sort();
        Ok(kinds)
    }
}

/// Removes from `faults` the kinds the store cannot take (a note for each one asked for), and
/// says what else the summary should note.
pub fn drop_inapplicable(
    faults: &mut Vec<FaultKind>,
    backing: &Backing,
    pg_cells: u16,
) -> Vec<&'static str> {
    let skips = [
        (
            FaultKind::ServerKill,
            !backing.survives_restarts(),
            "server-kill skipped: memory: forgets everything on restart",
        ),
        (
            FaultKind::PgTerminate,
            !backing.is_postgres(),
            "pg-terminate skipped: the store is not PostgreSQL",
        ),
        (
            FaultKind::PgRestart,
            !backing.is_private_postgres(),
            "pg-restart skipped: the store is not a private-postgres: cluster",
        ),
        (
            FaultKind::StoreRestore,
            !backing.can_restore(),
            "store-restore skipped: the campaign backs up and restores only a sqlite:// or private-postgres: store",
        ),
        (
            FaultKind::StoreRestore,
            pg_cells > 0,
            "store-restore skipped: the --pg-cells run no verifier, so a restore's quarantine would never lift",
        ),
    ];
    let mut notes = Vec::new();
    for (kind, skip, note) in skips {
        if skip && faults.contains(&kind) {
            notes.push(note);
            faults.retain(|k| *k != kind);
        }
    }
    if backing.is_spanner() {
        notes.push("the emulator aborts about 5% of commits on purpose (--enable_fault_injection)");
    }
    notes
}

/// Injects external faults and counts every fault (crashes are counted by the cells).
pub struct Injector {
    fleet: Arc<tokio::sync::Mutex<Fleet>>,
    proxy: Arc<Proxy>,
    backing: Arc<Backing>,
    counts: Mutex<BTreeMap<FaultKind, u64>>,
    /// Background windows and restarts, awaited by `heal`.
    background: Mutex<Vec<JoinHandle<()>>>,
    /// The proxy window that owns the mode; a window ends only its own mode.
    window: Arc<AtomicU64>,
    errors: Arc<Mutex<Vec<String>>>,
    /// Read by every injection, written by [`Injector::quiet`].
    quiet: tokio::sync::RwLock<()>,
}

impl Injector {
    pub fn new(
        fleet: Arc<tokio::sync::Mutex<Fleet>>,
        proxy: Arc<Proxy>,
        backing: Arc<Backing>,
    ) -> Injector {
        Injector {
            fleet,
            proxy,
            backing,
            counts: Mutex::new(BTreeMap::new()),
            background: Mutex::new(Vec::new()),
            window: Arc::new(AtomicU64::new(0)),
            errors: Arc::new(Mutex::new(Vec::new())),
            quiet: tokio::sync::RwLock::new(()),
        }
    }

    pub fn count(&self, kind: FaultKind) {
        *self
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(kind)
            .or_default() += 1;
    }

    pub fn counts(&self) -> BTreeMap<FaultKind, u64> {
        self.counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Problems of the injection machinery itself (a server that would not restart…).
    pub fn errors(&self) -> Vec<String> {
        self.errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Records a problem of the injection machinery (it fails the run).
    pub fn machinery_error(&self, error: String) {
        tracing::error!(%error, "fault machinery");
        self.errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(error);
    }

    /// Holds every further injection off until the guard is dropped, and heals what is under
    /// way (windows end, servers and the database come back).
    pub async fn quiet(&self) -> Result<tokio::sync::RwLockWriteGuard<'_, ()>, String> {
        let guard = self.quiet.write().await;
        self.heal().await?;
        Ok(guard)
    }

    fn background(&self, task: JoinHandle<()>) {
        let mut tasks = self.background.lock().unwrap_or_else(|p| p.into_inner());
        tasks.retain(|t| !t.is_finished());
        tasks.push(task);
    }

    fn open_window(
        &self,
        mode: Mode,
        length: Duration,
        then: impl FnOnce(&Proxy) + Send + 'static,
    ) {
        let id = self.window.fetch_add(1, Ordering::SeqCst) + 1;
        self.proxy.set_mode(mode);
        let (proxy, window) = (Arc::clone(&self.proxy), Arc::clone(&self.window));
        self.background(tokio::spawn(async move {
            tokio::time::sleep(length).await;
            then(&proxy);
            // A later window owns the mode now: leave it to that one.
            if window.load(Ordering::SeqCst) == id {
                proxy.set_mode(Mode::Pass);
            }
        }));
    }

    /// Injects one external fault with parameters drawn from `rng`.
    pub async fn inject(&self, kind: FaultKind, rng: &mut fastrand::Rng) -> Result<(), String> {
        let _quiet = self.quiet.read().await;
        match kind {
            FaultKind::ServerKill => {
                if !self.backing.survives_restarts() {
                    return Ok(());
                }
                let mut fleet = self.fleet.lock().await;
                let slot = rng.usize(..fleet.len());
                fleet.kill(slot).await;
                drop(fleet);
                self.count(kind);
                let outage = Duration::from_millis(rng.u64(20..400));
                let (fleet, errors) = (Arc::clone(&self.fleet), Arc::clone(&self.errors));
                self.background(tokio::spawn(async move {
                    tokio::time::sleep(outage).await;
                    if let Err(e) = fleet.lock().await.ensure_running(slot).await {
                        tracing::error!(error = %e, "could not restart a killed server");
                        errors.lock().unwrap_or_else(|p| p.into_inner()).push(e);
                    }
                }));
            }
            FaultKind::PgTerminate => {
                if self.backing.is_postgres() {
                    let n = self.backing.terminate_connections().await?;
                    tracing::debug!(terminated = n, "pg_terminate_backend");
                    self.count(kind);
                }
            }
            FaultKind::PgRestart => {
                if let Some(guard) = self.backing.crash_postgres()? {
                    self.count(kind);
                    let outage = Duration::from_millis(rng.u64(100..1000));
                    let (backing, errors) = (Arc::clone(&self.backing), Arc::clone(&self.errors));
                    self.background(tokio::spawn(async move {
                        if let Err(e) = backing.start_postgres_after(guard, outage).await {
                            tracing::error!(error = %e, "could not restart PostgreSQL");
                            errors.lock().unwrap_or_else(|p| p.into_inner()).push(e);
                        }
                    }));
                }
            }
            FaultKind::ProxyDrop => {
                let length = Duration::from_millis(rng.u64(100..800));
                self.open_window(Mode::Hold, length, |proxy| proxy.drop_connections());
                self.count(kind);
            }
            FaultKind::ProxyDelay => {
                let delay = Duration::from_millis(rng.u64(10..300));
                let length = Duration::from_millis(rng.u64(200..1500));
                self.open_window(Mode::Delay(delay), length, |_| {});
                self.count(kind);
            }
            FaultKind::ProxyReset => {
                self.proxy.reset_connections();
                self.count(kind);
            }
            FaultKind::StoreRestore => {
                return Err(
                    "store-restore is injected once, by the restore task (restore.rs)".into(),
                )
            }
            crash => {
                return Err(format!(
                    "{} is a client crash: the cell injects it",
                    crash.name()
                ))
            }
        }
        Ok(())
    }

    /// Ends every fault: waits for the windows and restarts, lets bytes flow, starts any
    /// server that is down.
    pub async fn heal(&self) -> Result<(), String> {
        let tasks: Vec<JoinHandle<()>> =
            std::mem::take(&mut *self.background.lock().unwrap_or_else(|p| p.into_inner()));
        for task in tasks {
            let _ = task.await;
        }
        self.window.fetch_add(1, Ordering::SeqCst);
        self.proxy.set_mode(Mode::Pass);
        if let Err(e) = self.backing.ensure_up().await {
            self.errors
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(e.clone());
            return Err(e);
        }
        let result = self.fleet.lock().await.ensure_all_running().await;
        if let Err(e) = &result {
            self.errors
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(e.clone());
        }
        result
    }
}

/// Injects a random external fault every 100–700 ms until `stop` turns true.
pub async fn random_schedule(
    injector: Arc<Injector>,
    kinds: Vec<FaultKind>,
    mut rng: fastrand::Rng,
    mut stop: watch::Receiver<bool>,
) {
    let kinds: Vec<FaultKind> = kinds
        .into_iter()
        .filter(|k| !k.is_crash() && !k.is_once())
        .collect();
    if kinds.is_empty() {
        return;
    }
    loop {
        let pause = Duration::from_millis(rng.u64(100..700));
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
        let kind = kinds[rng.usize(..kinds.len())];
        if let Err(error) = injector.inject(kind, &mut rng).await {
            tracing::warn!(%error, fault = kind.name(), "fault injection failed");
        }
    }
}

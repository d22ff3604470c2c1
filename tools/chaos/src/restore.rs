//! The `store-restore` fault: the claims store goes back in time, as after a disaster recovery
//! (decision 100, docs/operations.md "After a restore"). Injected once per campaign, in the random
//! phase, at two points drawn from the seed ([`Plan`]):
//!
//! 1. **Backup**, while serving: the other faults are held off ([`Injector::quiet`]: a
//!    `pg-restart` must not cut the dump), each cell's outstanding leases are listed (what the
//!    checkers need to know which leases the restore may touch), and the store is backed up
//!    (`topology-claims backup`, or `pg_dump -n` of the campaign's schema). The cells go on.
//! 2. **Restore**, a few percent of the transactions later: the cells' workers are held before
//!    their next transaction ([`Hold`]; the ones under way finish first), every server is
//!    stopped, the backup restored, and `serve` started where the proxy does not send the cells
//!    (only the operator reaches it); `admin mark-restored --backup-time … --expect-cell …` (every
//!    cell: a cell whose first claim came after the backup is not in the restored store) is run
//!    against it directly, the other servers start (reading the epoch at start), and only then the
//!    proxy routes traffic again and the workers go on. The reconcile and verify sidecars never
//!    stop: their calls fail while the proxy has no server, as a cell's would.
//!
//! What it records ([`Window`]) is judged by `restore_check.rs`. Owns the mechanics; must not
//! judge the outcome.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;
use topology_claims::domain::RestoreView;
use topology_claims::{LeaseId, LeasesQuery};
use topology_claims_client::ClaimsClient;
use topology_claims_harness::pki::DevPki;
use topology_claims_harness::serve::{clean_command, product_binary};
use topology_claims_server::restore::DEFAULT_RESTORE_REFRESH;

use crate::faults::{FaultKind, Injector};
use crate::fleet::{Backing, Fleet};
use crate::history::History;
use crate::model;

/// How long the restore waits for the transactions under way before it stops the servers.
const DRAIN: Duration = Duration::from_secs(15);

/// Holds the cells' workers before their next transaction while the store is swapped.
pub struct Hold {
    open: watch::Sender<bool>,
    busy: AtomicUsize,
}

/// A worker's transaction under way (the restore waits for it).
pub struct Busy<'a>(&'a Hold);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Default for Hold {
    fn default() -> Self {
        Hold {
            open: watch::channel(true).0,
            busy: AtomicUsize::new(0),
        }
    }
}

impl Hold {
    /// Waits while the cells are held; the guard marks a transaction under way.
    pub async fn enter(&self) -> Busy<'_> {
        loop {
            self.busy.fetch_add(1, Ordering::SeqCst);
            if *self.open.borrow() {
                return Busy(self);
            }
            self.busy.fetch_sub(1, Ordering::SeqCst);
            let mut open = self.open.subscribe();
            let _ = open.wait_for(|open| *open).await;
        }
    }

    /// Holds the workers and waits (at most `within`) for the transactions under way; `false`
    /// if some were still running.
    async fn close(&self, within: Duration) -> bool {
        self.open.send_replace(false);
        let deadline = Instant::now() + within;
        while self.busy.load(Ordering::SeqCst) > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    fn open(&self) {
        self.open.send_replace(true);
    }
}

/// When the restore happens, as thresholds of the random phase's remaining transactions.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub backup_when_left: u64,
    pub restore_when_left: u64,
}

impl Plan {
    /// The backup after 25–55 % of the `budget`, the restore 5–12 % of it later: the workload
    /// goes on for at least a third after the restore.
    pub fn draw(budget: u64, rng: &mut fastrand::Rng) -> Plan {
        let share =
            |low: u64, high: u64, rng: &mut fastrand::Rng| budget * rng.u64(low..=high) / 100;
        let backup_when_left = budget - share(25, 55, rng);
        let between = share(5, 12, rng).max(1);
        Plan {
            backup_when_left,
            restore_when_left: backup_when_left.saturating_sub(between),
        }
    }
}

/// What happened, in the history's clock (microseconds since the campaign started).
#[derive(Clone, Debug)]
pub struct Window {
    /// Before the outstanding leases were listed.
    pub listed_from: u64,
    /// After they were listed, before the backup began: the history before it is the store's
    /// own, whatever the restore did after.
    pub cut: u64,
    /// Every cell's leases outstanding at the listing; `None` if a listing failed.
    pub listed: Option<BTreeSet<LeaseId>>,
    /// When the cells were let back in, the restore marked.
    pub restored: u64,
    pub backup_time: String,
    /// Random-phase transactions begun before the backup, and between it and the restore.
    pub transactions_before: u64,
    pub transactions_between: u64,
    /// From stopping the servers to routing traffic again.
    pub outage: Duration,
    /// What `mark-restored` printed first (the epoch).
    pub mark: String,
}

impl Window {
    /// The summary's line.
    pub fn describe(&self) -> String {
        let seconds = |us: u64| us as f64 / 1e6;
        format!(
            "backup at {:.1}s after {} random transactions ({}), restored at {:.1}s {} transactions later, servers out {} ms; {}",
            seconds(self.cut),
            self.transactions_before,
            self.backup_time,
            seconds(self.restored),
            self.transactions_between,
            self.outage.as_millis(),
            self.mark
        )
    }
}

/// Each cell's view of the latest restore (ListOutstandingLeases' `restore`), read until every
/// view says the quarantine is lifted or twice the servers' `--restore-refresh` has passed: a
/// server other than the one that took the last report learns of the lift at its next refresh.
pub async fn final_views(clients: &[ClaimsClient]) -> Vec<(u16, Option<RestoreView>)> {
    let deadline = Instant::now() + 2 * DEFAULT_RESTORE_REFRESH;
    loop {
        let mut views = Vec::new();
        for (cell, client) in clients.iter().enumerate() {
            let cell = cell as u16;
            let query = LeasesQuery::new(model::cell_id(cell), None, 1);
            let view = match client.list_outstanding_leases(&query).await {
                Ok(page) => page.restore,
                Err(error) => {
                    tracing::warn!(%error, cell, "reading the restore view");
                    None
                }
            };
            views.push((cell, view));
        }
        let lifted = views
            .iter()
            .all(|(_, view)| view.as_ref().is_some_and(|v| !v.quarantined));
        if lifted || Instant::now() >= deadline {
            return views;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The admin CLI's TLS flags for the campaign's `pki` (an admin certificate issued now); none
/// without TLS.
pub fn admin_tls(pki: Option<&DevPki>) -> Result<Vec<String>, String> {
    let Some(pki) = pki else {
        return Ok(Vec::new());
    };
    let pair = tokio::task::block_in_place(|| pki.issue_client("admin", "chaos"))?;
    let path = |p: &std::path::Path| p.display().to_string();
    Ok(vec![
        "--tls-ca".into(),
        path(&pki.ca()),
        "--tls-cert".into(),
        path(&pair.cert),
        "--tls-key".into(),
        path(&pair.key),
    ])
}

/// The summary's lines: the restore, the keys it touched (`touched` of `keys_checked`, through
/// `uncertain` leases), and the creates the quarantine `refused`.
pub fn summary(
    window: Option<&Window>,
    (touched, uncertain, keys_checked): (usize, usize, usize),
    refused: u64,
) -> Vec<(&'static str, String)> {
    let mut lines = Vec::new();
    if let Some(window) = window {
        lines.push(("store restore", window.describe()));
        lines.push((
            "restore: keys touched",
            format!("{touched} of {keys_checked} checked for linearizability only up to the backup ({uncertain} leases the restore may have changed)"),
        ));
    }
    lines.push((
        "RESTORE_QUARANTINE refusals",
        format!("{refused} creates refused while quarantined (temporary: the cells moved on)"),
    ));
    lines
}

/// Everything the restore works with.
pub struct StoreRestore {
    pub injector: Arc<Injector>,
    pub fleet: Arc<tokio::sync::Mutex<Fleet>>,
    pub backing: Arc<Backing>,
    pub history: Arc<History>,
    pub hold: Arc<Hold>,
    /// One client per cell, with the cell's identity (ListOutstandingLeases).
    pub clients: Vec<ClaimsClient>,
    /// `admin`'s connection flags under TLS (`--tls-ca`, `--tls-cert`, `--tls-key` of an admin
    /// certificate); empty for plaintext.
    pub admin_tls: Vec<String>,
    pub backup_path: PathBuf,
    pub plan: Plan,
    /// The random phase's transactions.
    pub budget: u64,
}

impl StoreRestore {
    /// Waits for the plan's points of the random phase (`remaining` transactions) and injects
    /// the restore; the cells are let back in whatever happens.
    pub async fn run(self, remaining: Arc<AtomicU64>) -> Result<Window, String> {
        let left = || remaining.load(Ordering::SeqCst);
        while left() > self.plan.backup_when_left {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let quiet = self.injector.quiet().await?;
        let transactions_before = self.budget - left();
        let listed_from = self.history.now();
        let listed = self.outstanding().await;
        let cut = self.history.now();
        let backup_time = prost_types::Timestamp::from(SystemTime::now()).to_string();
        self.backing
            .backup(&self.backup_path)
            .await
            .map_err(|e| format!("store-restore backup: {e}"))?;
        drop(quiet);
        tracing::info!(%backup_time, "store-restore: backed up while serving");

        while left() > self.plan.restore_when_left {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let transactions_between = self.budget - left() - transactions_before;
        if !self.hold.close(DRAIN).await {
            tracing::warn!(
                "store-restore: transactions still under way after {DRAIN:?}; restoring anyway"
            );
        }
        let swapped = self.swap_store(&backup_time).await;
        self.hold.open();
        let (outage, mark) = swapped?;
        let restored = self.history.now();
        self.injector.count(FaultKind::StoreRestore);
        Ok(Window {
            listed_from,
            cut,
            listed,
            restored,
            backup_time,
            transactions_before,
            transactions_between,
            outage,
            mark,
        })
    }

    /// Every cell's outstanding leases (each listing tried a few times); `None` if one failed.
    async fn outstanding(&self) -> Option<BTreeSet<LeaseId>> {
        let mut leases = BTreeSet::new();
        for (cell, client) in self.clients.iter().enumerate() {
            let id = model::cell_id(cell as u16);
            let mut after = None;
            let mut failures = 0;
            loop {
                match client
                    .list_outstanding_leases(&LeasesQuery::new(id.clone(), after, 1000))
                    .await
                {
                    Ok(page) => {
                        leases.extend(page.leases.iter().map(|l| l.lease_id));
                        match page.next_cursor {
                            Some(cursor) => after = Some(cursor),
                            None => break,
                        }
                    }
                    Err(error) if failures < 3 => {
                        failures += 1;
                        tracing::debug!(%error, cell, "listing outstanding leases before the backup");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(error) => {
                        tracing::warn!(%error, cell, "could not list outstanding leases before the backup: every lease begun before it counts as touched");
                        return None;
                    }
                }
            }
        }
        Some(leases)
    }

    /// Stops every server, restores the backup, marks it through a server the cells cannot
    /// reach, starts the others and routes traffic again. Returns the outage and the mark.
    async fn swap_store(&self, backup_time: &str) -> Result<(Duration, String), String> {
        let _quiet = self.injector.quiet().await?;
        let mut fleet = self.fleet.lock().await;
        let started = Instant::now();
        fleet.set_routed(false);
        fleet.stop_all().await;
        let marked = self.restore_and_mark(&mut fleet, backup_time).await;
        fleet.set_routed(true);
        Ok((started.elapsed(), marked?))
    }

    async fn restore_and_mark(
        &self,
        fleet: &mut Fleet,
        backup_time: &str,
    ) -> Result<String, String> {
        self.backing
            .restore(&self.backup_path)
            .await
            .map_err(|e| format!("store-restore restore: {e}"))?;
        fleet.ensure_running(0).await?;
        let addr = fleet
            .addr(0)
            .ok_or("store-restore: server 0 is not running after the restore")?;
        let mark = self.mark(addr, backup_time).await?;
        fleet.ensure_all_running().await?;
        Ok(mark)
    }

    /// `topology-claims admin --server ADDR mark-restored …`, expecting every cell.
    async fn mark(&self, addr: std::net::SocketAddr, backup_time: &str) -> Result<String, String> {
        let exe = product_binary()?;
        let scheme = if self.admin_tls.is_empty() {
            "http"
        } else {
            "https"
        };
        let server = format!("{scheme}://{addr}");
        let mut args: Vec<String> = vec!["admin".into(), "--server".into(), server];
        args.extend(self.admin_tls.iter().cloned());
        args.extend(
            [
                "mark-restored",
                "--backup-time",
                backup_time,
                "--reason",
                "chaos campaign: store-restore",
                "--yes",
            ]
            .map(String::from),
        );
        for cell in 0..self.clients.len() {
            args.push("--expect-cell".into());
            args.push(model::cell_id(cell as u16).to_string());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = tokio::process::Command::from(clean_command(&exe, &args))
            .kill_on_drop(true)
            .output();
        let output = tokio::time::timeout(Duration::from_secs(60), output)
            .await
            .map_err(|_| "admin mark-restored took over 60 s".to_owned())?
            .map_err(|e| format!("running admin mark-restored: {e}"))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            return Err(format!(
                "admin mark-restored failed ({}): {} {}",
                output.status,
                stdout.trim(),
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        let epoch = stdout
            .lines()
            .find(|l| l.contains("epoch"))
            .unwrap_or("marked")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        Ok(epoch)
    }
}

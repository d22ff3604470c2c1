//! Time to free: for every transaction that crashed before its local commit (after BeginUpdate,
//! or inside the local transaction), how long its lease stayed outstanding, i.e. its claim
//! blocked for everyone. A watcher polls each such cell's ListOutstandingLeases every
//! [`POLL`] and notes when the lease left it (the reconciler rolled it back).
//!
//! - With `local_transaction` (the PostgreSQL cells, in-transaction order): the reconciler
//!   rolls the lease back at its next pass, because PostgreSQL reports the transaction
//!   `aborted` (decision 080).
//! - Without (the SQLite cells, pre-flight order): only once the lease is older than the
//!   staleness threshold.
//!
//! The invariant (checked in `invariants.rs`): in the deterministic sweep, where no other fault
//! is injected, every crashed lease that names its transaction is freed sooner than the
//! staleness threshold, i.e. by the early rollback, not by the fallback rule.
//!
//! Owns the measurement. Must not decide protocol questions.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use topology_claims::{LeaseId, LeasesQuery};
use topology_claims_client::ClaimsClient;

use crate::model;

/// How often the watcher looks.
pub const POLL: Duration = Duration::from_millis(100);

struct Crashed {
    cell: u16,
    lease: LeaseId,
    named: bool,
    in_sweep: bool,
    at: Instant,
    freed: Option<Duration>,
}

/// The crashed leases and when each was freed.
#[derive(Default)]
pub struct Recovery {
    sweeping: AtomicBool,
    crashed: Mutex<Vec<Crashed>>,
}

/// The summary of one kind of crashed lease.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Distribution {
    pub crashed: usize,
    /// Seen freed while the campaign ran (the rest were freed by the final passes).
    pub freed: Vec<Duration>,
}

impl Distribution {
    /// `n=…, p50 …, p90 …, max …` of the freed ones.
    pub fn describe(&self) -> String {
        let mut times = self.freed.clone();
        times.sort();
        let at = |q: f64| {
            let i = ((times.len() as f64 * q).ceil() as usize).clamp(1, times.len()) - 1;
            format!("{:.2}s", times[i].as_secs_f64())
        };
        if times.is_empty() {
            return format!(
                "{} crashed, none seen freed before the final passes",
                self.crashed
            );
        }
        format!(
            "{} crashed, {} freed while running: p50 {}, p90 {}, max {}",
            self.crashed,
            times.len(),
            at(0.5),
            at(0.9),
            at(1.0)
        )
    }
}

impl Recovery {
    /// Marks whether the deterministic sweep (no other fault) is running.
    pub fn set_sweeping(&self, sweeping: bool) {
        self.sweeping.store(sweeping, Ordering::SeqCst);
    }

    /// A transaction of `cell` crashed before its local commit, leaving `lease` outstanding;
    /// `named`: the lease carries its `local_transaction`.
    pub fn crashed(&self, cell: u16, lease: LeaseId, named: bool) {
        self.lock().push(Crashed {
            cell,
            lease,
            named,
            in_sweep: self.sweeping.load(Ordering::SeqCst),
            at: Instant::now(),
            freed: None,
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Crashed>> {
        self.crashed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cells with a crashed lease not seen freed yet.
    fn waiting_cells(&self) -> Vec<u16> {
        let mut cells: Vec<u16> = self
            .lock()
            .iter()
            .filter(|c| c.freed.is_none())
            .map(|c| c.cell)
            .collect();
        cells.dedup();
        cells.sort_unstable();
        cells.dedup();
        cells
    }

    /// One look at `cell`'s outstanding leases.
    async fn look(&self, cell: u16, client: &ClaimsClient) {
        let query = LeasesQuery::new(model::cell_id(cell), None, 1000);
        let Ok(page) = client.list_outstanding_leases(&query).await else {
            return; // a fault; look again next time
        };
        if page.next_cursor.is_some() {
            return; // more than a page outstanding: cannot tell, look again
        }
        let outstanding: Vec<LeaseId> = page.leases.iter().map(|l| l.lease_id).collect();
        let now = Instant::now();
        for crashed in self.lock().iter_mut() {
            if crashed.cell == cell
                && crashed.freed.is_none()
                && !outstanding.contains(&crashed.lease)
            {
                crashed.freed = Some(now.duration_since(crashed.at));
            }
        }
    }

    /// (with `local_transaction`, without).
    pub fn distributions(&self) -> (Distribution, Distribution) {
        let mut by_kind: BTreeMap<bool, Distribution> = BTreeMap::new();
        for crashed in self.lock().iter() {
            let d = by_kind.entry(crashed.named).or_default();
            d.crashed += 1;
            d.freed.extend(crashed.freed);
        }
        (
            by_kind.remove(&true).unwrap_or_default(),
            by_kind.remove(&false).unwrap_or_default(),
        )
    }

    /// Leases of the sweep that named their transaction and were not freed within `bound`:
    /// (cell, lease, time to free or `None` if never seen freed).
    pub fn slow_in_sweep(&self, bound: Duration) -> Vec<(u16, LeaseId, Option<Duration>)> {
        self.lock()
            .iter()
            .filter(|c| c.named && c.in_sweep && c.freed.is_none_or(|t| t >= bound))
            .map(|c| (c.cell, c.lease, c.freed))
            .collect()
    }
}

/// Watches until `stop`, and then once more.
pub async fn watch(
    recovery: std::sync::Arc<Recovery>,
    clients: Vec<ClaimsClient>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        for cell in recovery.waiting_cells() {
            if let Some(client) = clients.get(usize::from(cell)) {
                recovery.look(cell, client).await;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
    }
}

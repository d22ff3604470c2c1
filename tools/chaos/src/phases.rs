//! What runs on each cell during the campaign: its worker (the random phase), the sweep's
//! cases, its reconciler sidecar, and the probes of its leases' fates after healing.
//!
//! Owns the cells' loops. Must not hold protocol rules (the client, the reconciler and the
//! service are the real ones) nor checks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;
use topology_claims_client::{ClaimsClient, Reconciler};

use crate::cell::{Boundary, Crash, Drift, SimCell, Tally};
use crate::faults::{FaultKind, Injector};
use crate::history::{Answer, Call, ErrorKind, Event, History, TxOp};
use crate::local::CellLeases;
use crate::model;
use crate::restore::Hold;
use crate::CRASH_RATE;

/// One cell's share of the random phase: until the shared budget of transactions is spent,
/// an occasional lookup, then a destroy of a key it holds, or a create of a random key (taken,
/// leased or free: conflicting takes are the point), now and then a destroy of a key it does
/// not hold, crashing at a random boundary now and then. After a transaction whose outcome was
/// lost it pauses a little, as an application says "try again later". With probability
/// `drift` a step first changes one of its records outside the protocol. While `hold` is
/// closed (a store restore) it waits before its next step.
pub async fn worker(
    mut cell: SimCell,
    remaining: Arc<AtomicU64>,
    (keys, crashes, drift): (u32, Vec<Crash>, f64),
    hold: Arc<Hold>,
) -> SimCell {
    loop {
        let _busy = hold.enter().await;
        if remaining
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_err()
        {
            break;
        }
        if cell.rng().f64() < 0.2 {
            let key = cell.rng().u32(..keys);
            cell.lookup(key).await;
        }
        let held: Vec<u32> = cell
            .records()
            .await
            .unwrap_or_default()
            .into_iter()
            .collect();
        if !held.is_empty() && cell.rng().f64() < drift {
            let key = held[cell.rng().usize(..held.len())];
            // More reassignments than deletions: a reassigned record is still the cell's, so
            // its own destroys often end the drift before a verifier sees it.
            let kind = if cell.rng().f64() < 0.3 {
                Drift::Forget
            } else {
                Drift::Reassign
            };
            if let Err(error) = cell.drift(kind, key) {
                tracing::warn!(%error, "drift failed");
            }
            continue;
        }
        let (op, key) = if !held.is_empty() && cell.rng().f64() < 0.35 {
            let key = held[cell.rng().usize(..held.len())];
            // Sometimes the owner tries to take its own claim again: refused as taken.
            let op = if cell.rng().f64() < 0.9 {
                TxOp::Destroy
            } else {
                TxOp::Create
            };
            (op, key)
        } else {
            let key = cell.rng().u32(..keys);
            let op = if held.contains(&key) || cell.rng().f64() < 0.1 {
                TxOp::Destroy
            } else {
                TxOp::Create
            };
            (op, key)
        };
        let crash = if !crashes.is_empty() && cell.rng().f64() < CRASH_RATE {
            Some(crashes[cell.rng().usize(..crashes.len())])
        } else {
            None
        };
        if cell.transaction(op, key, crash, None).await == Answer::Unknown {
            let pause = Duration::from_millis(cell.rng().u64(50..250));
            tokio::time::sleep(pause).await;
        }
    }
    cell
}

/// One case of the sweep: a `op` transaction on `cell` with `crash` or `pause`, retried (on
/// a free key for a create, on a held key for a destroy) until the fault fired, at most 20
/// times, `retry_after` apart (long enough, in all, for an earlier crash's lease on the key to
/// go stale and be rolled back). Returns whether it fired.
#[allow(clippy::too_many_arguments)]
pub async fn sweep_case(
    cell: &mut SimCell,
    keys: u32,
    injector: &Injector,
    fault: FaultKind,
    op: TxOp,
    crash: Option<Crash>,
    pause: Option<(Boundary, FaultKind)>,
    rng: &mut fastrand::Rng,
    retry_after: Duration,
) -> bool {
    let fired = |injector: &Injector| injector.counts().get(&fault).copied().unwrap_or(0);
    let before = fired(injector);
    for _ in 0..20 {
        let Some(free) = free_key(cell, keys, rng).await else {
            continue;
        };
        let key = if op == TxOp::Destroy {
            // Take a key first, to have something to destroy.
            let held: Vec<u32> = cell
                .records()
                .await
                .unwrap_or_default()
                .into_iter()
                .collect();
            match held.get(rng.usize(..held.len().max(1))).copied() {
                Some(key) => key,
                None => {
                    cell.transaction(TxOp::Create, free, None, None).await;
                    continue;
                }
            }
        } else {
            free
        };
        cell.transaction(op, key, crash, pause).await;
        if fired(injector) > before {
            return true;
        }
        // Refused (the key is leased by an earlier crash, say): give the reconciler a moment.
        tokio::time::sleep(retry_after).await;
    }
    false
}

/// A key the service has no claim for right now (by LookupClaim), if one is found soon.
async fn free_key(cell: &mut SimCell, keys: u32, rng: &mut fastrand::Rng) -> Option<u32> {
    for _ in 0..keys.saturating_mul(2) {
        let key = rng.u32(..keys);
        if cell.lookup(key).await == Answer::Err(ErrorKind::ClaimNotFound) {
            return Some(key);
        }
    }
    None
}

/// A cell's reconciler sidecar: a pass every 0.4–0.9 s until told to stop (the running pass
/// finishes first). Returns the reconciler and how many passes it made.
pub async fn sidecar(
    reconciler: Reconciler<CellLeases>,
    cell: u16,
    tally: Arc<Tally>,
    mut rng: fastrand::Rng,
    mut stop: watch::Receiver<bool>,
) -> (Reconciler<CellLeases>, u64) {
    let mut passes = 0;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(rng.u64(400..900))) => {}
            _ = stop.wait_for(|stopped| *stopped) => return (reconciler, passes),
        }
        passes += 1;
        match reconciler.run_once().await {
            Ok(report) => {
                for lease in report.lost {
                    tally.lost(cell, lease);
                }
            }
            Err(error) => tracing::debug!(cell, %error, "reconcile pass failed (faults are on)"),
        }
    }
}

/// Each reconciler's pass after healing: once past the threshold, again only if the pass could
/// not finish (then it counts), up to five times. Returns (passes, passes repeated).
pub async fn final_reconcile(reconcilers: &[Reconciler<CellLeases>], tally: &Tally) -> (u64, u64) {
    let (mut passes, mut errors) = (0, 0);
    for (index, reconciler) in reconcilers.iter().enumerate() {
        for attempt in 0..5 {
            passes += 1;
            match reconciler.run_once().await {
                Ok(report) => {
                    let done = report.acted && report.errors == 0;
                    if !done {
                        errors += 1;
                        tracing::warn!(cell = index, %report, attempt, "final reconcile pass incomplete");
                    }
                    for lease in report.lost {
                        tally.lost(index as u16, lease);
                    }
                    if done {
                        break;
                    }
                }
                Err(error) => {
                    errors += 1;
                    tracing::warn!(cell = index, %error, attempt, "final reconcile pass failed");
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    (passes, errors)
}

/// Attempts of one lease's probe while it has no answer (an unavailable store: the Spanner
/// emulator aborting a crowd of read-write transactions, say), [`PROBE_PAUSE`] apart.
const PROBE_ATTEMPTS: u32 = 10;
const PROBE_PAUSE: Duration = Duration::from_millis(300);

/// Probes every lease of the history (RenewLease by its cell, after healing) and records its
/// fate: committed, rolled back, never heard of. An ended lease is unchanged by the probe, so an
/// attempt without an answer is repeated; a fate still unknown after that is recorded unknown
/// (the checker then assumes nothing about how the lease ended).
pub async fn probe_fates(history: &Arc<History>, probes: &[ClaimsClient]) {
    let begins: Vec<Event> = history
        .snapshot()
        .into_iter()
        .filter(|e| matches!(e.call, Call::Begin { .. }))
        .collect();
    futures::stream::iter(begins.iter().map(|begin| {
        let history = Arc::clone(history);
        let probe = probes[usize::from(begin.cell)].clone();
        async move {
            let Call::Begin { lease, key, .. } = begin.call else {
                return;
            };
            let id = history.invoke(begin.cell, Call::Probe { lease, key });
            let mut answer = Answer::Unknown;
            for attempt in 1..=PROBE_ATTEMPTS {
                answer = match probe.renew_lease(&model::cell_id(begin.cell), lease).await {
                    Ok(_) => Answer::Ok,
                    Err(e) => Answer::from_error(&e),
                };
                if answer != Answer::Unknown {
                    break;
                }
                if attempt < PROBE_ATTEMPTS {
                    tokio::time::sleep(PROBE_PAUSE).await;
                }
            }
            history.complete(id, answer);
        }
    }))
    .buffer_unordered(16)
    .collect::<Vec<()>>()
    .await;
}

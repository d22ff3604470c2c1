//! The cells' verifiers: the real `topology_claims_client::Verifier` (what the `verify` sidecar
//! runs), one per cell, reading the cell's SQLite database through the sidecar's own query
//! source (`SqliteQuerySource` with a verify query over `records`), taking a verification slot
//! from the servers, and run again and again while faults are injected, racing the cell's
//! transactions and its reconciler. After healing each runs once more, and that pass must find
//! nothing.
//!
//! Every call of a correcting lease goes into the history (so the linearizability checker judges
//! the verifier's writes like any cell's), and each destroy it commits is checked against the
//! cell's records: the claim it freed must not be held by a record that was committed before the
//! correction began.
//!
//! Owns the verifiers' wiring and bookkeeping. Must not hold verification logic (the library's
//! verifier is the one under test).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension};
use tokio::sync::watch;
use topology_claims::{ClaimsError, LeaseId, LeaseOp, TableName};
use topology_claims_client::verifier::{CorrectionCall, CorrectionEvent};
use topology_claims_client::{
    ClaimsClient, Discrepancy, SlotSettings, Verifier, VerifierConfig, VerifyReport,
};
use topology_claims_sqlite::cell::SqliteQuerySource;

use crate::cell::begin_answer;
use crate::history::{Answer, Call, Event, History, TxOp};
use crate::model;

/// The verifiers' slot time-to-live: short, so that a pause in renewals (a partition, a
/// delayed proxy) can lose a slot during the campaign.
pub const SLOT_TTL: Duration = Duration::from_secs(3);
/// Fleet-wide slots for the campaign's servers: fewer than cells, so verifiers wait.
pub const MAX_CONCURRENT_VERIFICATIONS: u32 = 3;
/// A page of ten keys: each run reads several pages (of the stream or of ListClaims).
const PAGE_SIZE: usize = 10;

/// Counts of all verifiers together, for the summary.
#[derive(Default)]
pub struct VerifyStats {
    pub runs: AtomicU64,
    pub runs_failed: AtomicU64,
    pub runs_slot_lost: AtomicU64,
    pub discrepancies: AtomicU64,
    pub applied: AtomicU64,
    pub withdrawn: AtomicU64,
    pub refused: AtomicU64,
    /// Committed corrections by kind.
    pub created: AtomicU64,
    pub updated: AtomicU64,
    pub destroyed: AtomicU64,
    /// Discrepancies of the first pass after healing (drift not corrected yet), of the last.
    pub after_healing: AtomicU64,
    pub final_pass: AtomicU64,
}

impl VerifyStats {
    fn add_report(&self, report: &VerifyReport) {
        self.discrepancies.fetch_add(
            report.missing + report.different + report.extra,
            Ordering::Relaxed,
        );
        self.applied
            .fetch_add(report.corrections_applied, Ordering::Relaxed);
        self.withdrawn
            .fetch_add(report.corrections_withdrawn, Ordering::Relaxed);
        self.refused
            .fetch_add(report.corrections_failed, Ordering::Relaxed);
    }

    pub fn repaired_after_healing(&self, report: &VerifyReport) {
        self.add_report(report);
        self.after_healing
            .fetch_add(report.discrepancies.len() as u64, Ordering::Relaxed);
    }

    pub fn final_pass(&self, report: &VerifyReport) {
        self.final_pass
            .fetch_add(report.discrepancies.len() as u64, Ordering::Relaxed);
    }

    /// The summary's lines.
    pub fn lines(&self) -> Vec<(&'static str, u64)> {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("runs during the campaign", n(&self.runs)),
            ("runs that failed (faults)", n(&self.runs_failed)),
            ("runs stopped: slot lost", n(&self.runs_slot_lost)),
            ("discrepancies found (all runs)", n(&self.discrepancies)),
            ("corrections committed (all runs)", n(&self.applied)),
            ("  of them creates", n(&self.created)),
            ("  of them updates", n(&self.updated)),
            ("  of them destroys", n(&self.destroyed)),
            (
                "corrections withdrawn (records changed)",
                n(&self.withdrawn),
            ),
            ("corrections failed (races, faults)", n(&self.refused)),
            (
                "drift left for the first pass after healing",
                n(&self.after_healing),
            ),
            ("discrepancies in the final pass", n(&self.final_pass)),
        ]
    }
}

/// A correction a verifier committed; for a destroy, with the cell's record of the key read
/// right after.
#[derive(Clone, Debug)]
pub struct Committed {
    pub cell: u16,
    pub key: u32,
    pub op: LeaseOp,
    pub lease: LeaseId,
    /// When the correction's BeginUpdate was invoked.
    pub begun_at: u64,
    /// The lease id of the cell's record of `key`, if it had one after the commit (destroys).
    pub record_lease: Option<LeaseId>,
}

/// Committed corrections on keys the campaign never drifted. Without drift the protocol keeps
/// records and claims in step (a missing, different or extra claim outside a race is a lost or
/// stray claim), and a race never gets past the correction's second look at the records: each
/// of these is a violation the verifier papered over.
pub fn not_explained_by_drift(
    committed: &[Committed],
    drifted: &BTreeSet<(u16, u32)>,
) -> Vec<Committed> {
    committed
        .iter()
        .filter(|c| !drifted.contains(&(c.cell, c.key)))
        .cloned()
        .collect()
}

/// Committed destroys whose claim was held by a record that was there before the correction
/// began (its creating lease had taken the claim before the correction's BeginUpdate was sent):
/// the verifier freed a claim the cell's committed records hold. Those are violations.
pub fn held_when_freed(freed: &[Committed], events: &[Event]) -> Vec<Committed> {
    let taken: HashMap<LeaseId, u64> = events
        .iter()
        .filter_map(|e| match (e.call, e.answer, e.ret) {
            (Call::Begin { lease, .. }, Answer::Ok, Some(ret)) => Some((lease, ret)),
            _ => None,
        })
        .collect();
    freed
        .iter()
        .filter(|f| {
            f.op == LeaseOp::Destroy
                && f.record_lease
                    .and_then(|lease| taken.get(&lease))
                    .is_some_and(|&taken_at| taken_at < f.begun_at)
        })
        .cloned()
        .collect()
}

/// Puts a verifier's correcting calls into the history, and reads the cell's record after each
/// destroy it commits.
struct Recorder {
    cell: u16,
    history: Arc<History>,
    stats: Arc<VerifyStats>,
    records: Mutex<Connection>,
    /// The history ids of calls sent and not yet answered.
    pending: Mutex<HashMap<(LeaseId, CorrectionCallKey), usize>>,
    /// When each lease's BeginUpdate was invoked.
    begun: Mutex<HashMap<LeaseId, u64>>,
    committed: Arc<Mutex<Vec<Committed>>>,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum CorrectionCallKey {
    Begin,
    Commit,
    Rollback,
}

impl Recorder {
    fn observe(&self, event: &CorrectionEvent<'_>) {
        // The campaign's verifiers correct one claim per lease (chunk 1): one key each.
        let Some(key) = event.records.first().and_then(|r| model::key_index(&r.key)) else {
            return;
        };
        let lease = event.lease_id;
        let (call, slot) = match event.call {
            CorrectionCall::Begin => {
                let op = match event.op {
                    LeaseOp::Create => TxOp::Create,
                    LeaseOp::Destroy => TxOp::Destroy,
                    LeaseOp::Update => TxOp::Update,
                };
                (Call::Begin { lease, op, key }, CorrectionCallKey::Begin)
            }
            CorrectionCall::Commit => (Call::Commit { lease, key }, CorrectionCallKey::Commit),
            CorrectionCall::Rollback => {
                (Call::Rollback { lease, key }, CorrectionCallKey::Rollback)
            }
        };
        let Some(result) = event.answer else {
            let id = self.history.invoke(self.cell, call);
            if slot == CorrectionCallKey::Begin {
                if let Some(at) = self.history.invoked_at(id) {
                    self.begun
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(lease, at);
                }
            }
            self.pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert((lease, slot), id);
            return;
        };
        let id = self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(lease, slot));
        let answer = match (result, slot) {
            (Ok(()), _) => Answer::Ok,
            (Err(error), CorrectionCallKey::Begin) => begin_answer(error),
            (Err(error), _) => Answer::from_error(error),
        };
        if let Some(id) = id {
            self.history.complete(id, answer);
        }
        if slot != CorrectionCallKey::Commit || result.is_err() {
            return;
        }
        let counter = match event.op {
            LeaseOp::Create => &self.stats.created,
            LeaseOp::Update => &self.stats.updated,
            LeaseOp::Destroy => &self.stats.destroyed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let begun_at = self
            .begun
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&lease)
            .copied()
            .unwrap_or(0);
        let committed = Committed {
            cell: self.cell,
            key,
            op: event.op,
            lease,
            begun_at,
            record_lease: match event.op {
                LeaseOp::Destroy => self.record_lease(key),
                _ => None,
            },
        };
        self.committed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(committed);
    }

    /// The lease that created the cell's record of `key`, if it has one now.
    fn record_lease(&self, key: u32) -> Option<LeaseId> {
        let db = self.records.lock().unwrap_or_else(|p| p.into_inner());
        let lease: Option<String> = db
            .query_row(
                "SELECT lease_id FROM records WHERE key = ?1",
                [key],
                |row| row.get(0),
            )
            .optional()
            .unwrap_or_else(|e| {
                tracing::warn!(key, error = %e, "reading a record after a verifier's destroy");
                None
            });
        lease.and_then(|l| LeaseId::parse(&l).ok())
    }
}

/// The discrepancies of `report` (cell `cell`'s) on keys the campaign did not drift.
pub fn not_drift(
    cell: u16,
    report: &VerifyReport,
    drifted: &BTreeSet<(u16, u32)>,
) -> Vec<Discrepancy> {
    report
        .discrepancies
        .iter()
        .filter(|d| {
            let record = match d {
                Discrepancy::Missing(r) | Discrepancy::Extra(r) => r,
                Discrepancy::Different { local, .. } => local,
            };
            model::key_index(&record.key).is_none_or(|key| !drifted.contains(&(cell, key)))
        })
        .cloned()
        .collect()
}

/// The verify query of a campaign cell: one username claim per record, as `model::record`.
fn query(cell: u16) -> String {
    format!(
        "SELECT key, 'username', 'chaos-k' || printf('%04d', key), 'user', \
         COALESCE(owner_value, '{}'), created_at FROM records WHERE key >= ?1 AND key < ?2",
        model::cell_id(cell)
    )
}

/// The verifier of cell `cell` over its database at `path`, recording into `history`.
pub fn verifier(
    cell: u16,
    path: &Path,
    client: ClaimsClient,
    history: Arc<History>,
    stats: Arc<VerifyStats>,
    committed: Arc<Mutex<Vec<Committed>>>,
) -> Result<Verifier<SqliteQuerySource>, String> {
    let queries = BTreeMap::from([(TableName::USERS, query(cell))]);
    let source = SqliteQuerySource::open(path, queries)
        .map_err(|e| format!("verify source of {}: {e}", path.display()))?;
    let records = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .and_then(|db| db.busy_timeout(Duration::from_secs(5)).map(|()| db))
        .map_err(|e| format!("opening {}: {e}", path.display()))?;
    let config = VerifierConfig {
        // Nothing is left alone for being young: every race with the cell's transactions is
        // run, and must be decided safely.
        recent: Duration::ZERO,
        page_size: PAGE_SIZE,
        chunk: 1,
        slot: Some(SlotSettings {
            holder: format!("chaos-verifier-{cell:02}"),
            ttl: Some(SLOT_TTL),
        }),
        ..VerifierConfig::new(model::cell_id(cell), vec![TableName::USERS])
    };
    let recorder = Recorder {
        cell,
        history,
        stats,
        records: Mutex::new(records),
        pending: Mutex::default(),
        begun: Mutex::default(),
        committed,
    };
    Ok(Verifier::new(client, source, config).on_correction(move |e| recorder.observe(e)))
}

/// A cell's verify sidecar: a run every 0.5–1.5 s until told to stop (the running run finishes
/// first). Returns the verifier.
pub async fn sidecar(
    verifier: Verifier<SqliteQuerySource>,
    cell: u16,
    stats: Arc<VerifyStats>,
    mut rng: fastrand::Rng,
    mut stop: watch::Receiver<bool>,
) -> Verifier<SqliteQuerySource> {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(rng.u64(500..1500))) => {}
            _ = stop.wait_for(|stopped| *stopped) => return verifier,
        }
        stats.runs.fetch_add(1, Ordering::Relaxed);
        match verifier.run(|_| {}).await {
            Ok(report) => stats.add_report(&report),
            Err(ClaimsError::VerificationSlotLost { .. }) => {
                stats.runs_slot_lost.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                stats.runs_failed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(cell, %error, "verify run failed (faults are on)");
            }
        }
    }
}

/// The final pass of each verifier after healing: what it found (must be nothing), or why it
/// could not finish after a few attempts.
pub async fn final_pass(verifier: &Verifier<SqliteQuerySource>) -> Result<VerifyReport, String> {
    let mut last = String::new();
    for _ in 0..3 {
        match verifier.run(|_| {}).await {
            Ok(report) if report.finished => return Ok(report),
            Ok(report) => last = format!("did not finish: {report}"),
            Err(error) => last = error.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn begin(lease: LeaseId, ret: u64) -> Event {
        Event {
            id: 0,
            cell: 0,
            call: Call::Begin {
                lease,
                op: TxOp::Create,
                key: 1,
            },
            invoke: ret - 1,
            ret: Some(ret),
            answer: Answer::Ok,
        }
    }

    #[test]
    fn a_destroy_is_a_violation_only_if_the_record_was_taken_before_it_began() {
        let (old, new, verifier) = (
            LeaseId::generate(),
            LeaseId::generate(),
            LeaseId::generate(),
        );
        let events = [begin(old, 100), begin(new, 300)];
        let freed = |record_lease| Committed {
            cell: 0,
            key: 1,
            op: LeaseOp::Destroy,
            lease: verifier,
            begun_at: 200,
            record_lease,
        };
        let held = held_when_freed(&[freed(Some(old)), freed(Some(new)), freed(None)], &events);
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].record_lease, Some(old));
    }

    #[test]
    fn only_corrections_on_drifted_keys_are_explained() {
        let committed = |cell, key| Committed {
            cell,
            key,
            op: LeaseOp::Create,
            lease: LeaseId::generate(),
            begun_at: 0,
            record_lease: None,
        };
        let drifted = BTreeSet::from([(0, 1)]);
        let left = not_explained_by_drift(&[committed(0, 1), committed(1, 1)], &drifted);
        assert_eq!((left.len(), left[0].cell), (1, 1));
    }
}

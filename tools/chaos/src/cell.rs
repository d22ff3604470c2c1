//! A simulated cell: its own local SQLite database (an application table `records` plus the
//! protocol's `leases_outstanding`), the real cell-side client, and a worker doing random claim
//! transactions over the shared key space: creates, destroys, and conflicting takes of keys
//! other cells hold or are changing.
//!
//! A transaction without an injected fault runs through the real helper,
//! `topology_claims_sqlite::cell::transact`. One with a fault runs the same phases one by one
//! (`PendingUpdate::begin`, the local transaction with `record_sync` and `check_fresh`,
//! `PendingUpdate::finish`) so that it can "crash" at a phase boundary (the process's work is
//! dropped: the pending update is dropped, an open local transaction rolls back) or pause there
//! while an external fault is injected.
//!
//! Cells on PostgreSQL (`--pg-cells`) use the in-transaction order instead (`in_tx.rs`).
//!
//! Every call goes into the history. Owns the cell's local database and its bookkeeping; must
//! not decide protocol questions (the client and the service do).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, TransactionBehavior};
use topology_claims::{CellId, ClaimsError, LeaseId, LocalLeaseStore, Timestamp};
use topology_claims_client::{
    ClaimsClient, CommitOutcome, LocalEnd, PendingUpdate, TransactionError, UpdateConfig,
};
use topology_claims_sqlite::cell::transact;
use topology_claims_sqlite::{ensure_local_schema, SqliteLocalLeaseStore};

use crate::local::{CellLeases, LocalDbSpec, PgConnection};
use crate::recovery::Recovery;

use crate::faults::{FaultKind, Injector};
use crate::history::{Answer, Call, ErrorKind, History, TxOp};
use crate::model;

mod in_tx;

/// Where a client crash happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crash {
    AfterBegin,
    InLocalTx,
    AfterLocalCommit,
    AfterCommit,
}

impl Crash {
    pub const ALL: [Crash; 4] = [
        Crash::AfterBegin,
        Crash::InLocalTx,
        Crash::AfterLocalCommit,
        Crash::AfterCommit,
    ];

    pub fn fault(self) -> FaultKind {
        match self {
            Crash::AfterBegin => FaultKind::CrashAfterBegin,
            Crash::InLocalTx => FaultKind::CrashInLocalTx,
            Crash::AfterLocalCommit => FaultKind::CrashAfterLocalCommit,
            Crash::AfterCommit => FaultKind::CrashAfterCommit,
        }
    }
}

/// A phase boundary at which the deterministic sweep injects an external fault. (Inside the
/// local transaction nothing talks to the service, so "before the local transaction" stands
/// for it.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Boundary {
    BeforeBegin,
    AfterBegin,
    AfterLocalCommit,
    AfterCommit,
}

impl Boundary {
    pub const ALL: [Boundary; 4] = [
        Boundary::BeforeBegin,
        Boundary::AfterBegin,
        Boundary::AfterLocalCommit,
        Boundary::AfterCommit,
    ];
}

/// How each claim transaction ended, for the summary.
#[derive(Default)]
pub struct Tally {
    counts: Mutex<BTreeMap<String, u64>>,
    /// Leases whose claims were lost after the local commit (each one is a violation).
    lost: Mutex<Vec<(u16, LeaseId)>>,
}

impl Tally {
    pub fn add(&self, what: impl Into<String>) {
        *self
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(what.into())
            .or_default() += 1;
    }

    pub fn lost(&self, cell: u16, lease: LeaseId) {
        self.add("claims lost");
        self.lost
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((cell, lease));
    }

    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn lost_leases(&self) -> Vec<(u16, LeaseId)> {
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Deliberate bugs, to show the checkers catch them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Sabotage {
    /// The local transaction does not record the lease id: a crash after the local commit then
    /// looks like an uncommitted transaction to the reconciler, which rolls the lease back.
    SkipLeaseRecord,
}

/// What the parts of a cell share.
pub struct CellContext {
    pub history: Arc<History>,
    pub tally: Arc<Tally>,
    pub injector: Arc<Injector>,
    pub update: UpdateConfig,
    /// How long the waiting cell's BeginUpdate waits for leased claims (`wait_for_leased`,
    /// pre-flight order only; `waits`).
    pub lease_wait: std::time::Duration,
    pub sabotage: Option<Sabotage>,
    /// Keys whose local record a cell changed outside the protocol (drift for the verifiers).
    pub drifted: Mutex<BTreeSet<(u16, u32)>>,
    /// The leases of transactions that crashed before their local commit, and when each was
    /// freed.
    pub recovery: Arc<Recovery>,
}

/// A local change outside the protocol, as an application bug or a restore would make: what the
/// verifiers exist to find and correct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drift {
    /// The record is deleted without destroying its claim: an *extra* claim (a destroy).
    Forget,
    /// The record's owner changes without telling the service: a *different* claim (one
    /// in-place update).
    Reassign,
}

pub struct SimCell {
    pub index: u16,
    id: CellId,
    spec: LocalDbSpec,
    db: Db,
    leases: CellLeases,
    client: ClaimsClient,
    ctx: Arc<CellContext>,
    rng: fastrand::Rng,
}

const APP_DDL: &str = "\
CREATE TABLE IF NOT EXISTS records (
    key         INTEGER NOT NULL PRIMARY KEY,
    lease_id    TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    -- The claim's owner value when it is not the cell's id (only drift sets it).
    owner_value TEXT
);";

/// The application's connection to the cell's local database.
enum Db {
    Sqlite(Connection),
    Postgres(PgConnection),
}

/// Opens (creating) a cell database with the application's table and the lease table.
fn open_db(path: &Path) -> Result<Connection, String> {
    let db = Connection::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
    db.busy_timeout(std::time::Duration::from_secs(5))
        .and_then(|()| db.execute_batch("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"))
        .and_then(|()| db.execute_batch(APP_DDL))
        .map_err(|e| format!("preparing {}: {e}", path.display()))?;
    ensure_local_schema(&db).map_err(|e| format!("preparing {}: {e}", path.display()))?;
    Ok(db)
}

/// Whether cell `index` waits for leased claims: c01 only. More waiting cells stretch more
/// begins over other cells' calls, and the linearizability search over a key grows with the
/// calls that overlap (one extra waiting cell already left a key undecided within the search
/// budget once in a dozen loaded runs).
pub fn waits(index: u16) -> bool {
    index == 1
}

/// The summary's line: which cells wait (the PostgreSQL cells, the last `pg_cells`, take the
/// in-transaction order, which never waits).
pub fn lease_waits_line(cells: u16, pg_cells: u16) -> String {
    let waiting: Vec<String> = (0..cells.saturating_sub(pg_cells))
        .filter(|i| waits(*i))
        .map(|i| format!("c{i:02}"))
        .collect();
    format!("{} (wait_for_leased 200 ms)", waiting.join(" "))
}

impl SimCell {
    /// The cell's update configuration: the campaign's, with a lease wait on waiting cells.
    fn update_config(&self) -> UpdateConfig {
        UpdateConfig {
            lease_wait: waits(self.index).then_some(self.ctx.lease_wait),
            ..self.ctx.update.clone()
        }
    }

    pub async fn open(
        index: u16,
        spec: LocalDbSpec,
        client: ClaimsClient,
        ctx: Arc<CellContext>,
        seed: u64,
    ) -> Result<SimCell, String> {
        let db = match (&spec, spec.app_url()) {
            (LocalDbSpec::Sqlite(path), _) => Db::Sqlite(open_db(path)?),
            (_, Some(url)) => Db::Postgres(PgConnection::open(&url?).await?),
            (LocalDbSpec::Postgres { .. }, None) => unreachable!("a PostgreSQL cell has a URL"),
        };
        let leases = spec.leases().await?;
        Ok(SimCell {
            index,
            id: model::cell_id(index),
            spec,
            db,
            leases,
            client,
            ctx,
            rng: fastrand::Rng::with_seed(seed),
        })
    }

    pub fn spec(&self) -> &LocalDbSpec {
        &self.spec
    }

    /// Whether the cell uses the in-transaction order (on PostgreSQL, naming its transaction).
    pub fn in_transaction_order(&self) -> bool {
        matches!(self.db, Db::Postgres(_))
    }

    pub fn rng(&mut self) -> &mut fastrand::Rng {
        &mut self.rng
    }

    /// The keys of the committed local records.
    pub async fn records(&mut self) -> Result<BTreeSet<u32>, String> {
        let db = match &mut self.db {
            Db::Sqlite(db) => db,
            Db::Postgres(db) => return db.records().await,
        };
        let mut select = db
            .prepare("SELECT key FROM records")
            .map_err(|e| format!("reading records: {e}"))?;
        let keys = select
            .query_map([], |row| row.get::<_, u32>(0))
            .and_then(|rows| rows.collect::<rusqlite::Result<BTreeSet<u32>>>())
            .map_err(|e| format!("reading records: {e}"))?;
        Ok(keys)
    }

    /// Each committed local record's key and the lease that created it (SQLite cells; the
    /// PostgreSQL cells, which never see a store restore, answer none).
    pub fn record_leases(&self) -> Result<BTreeMap<u32, LeaseId>, String> {
        let Db::Sqlite(db) = &self.db else {
            return Ok(BTreeMap::new());
        };
        let read = |e: rusqlite::Error| format!("reading the records of c{:02}: {e}", self.index);
        let mut select = db
            .prepare("SELECT key, lease_id FROM records")
            .map_err(read)?;
        let rows = select
            .query_map([], |row| {
                Ok((row.get::<_, u32>(0)?, row.get::<_, String>(1)?))
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(read)?;
        rows.into_iter()
            .map(|(key, lease)| {
                LeaseId::parse(&lease)
                    .map(|lease| (key, lease))
                    .map_err(|e| {
                        format!(
                            "c{:02}'s record of k{key}: lease {lease:?}: {e}",
                            self.index
                        )
                    })
            })
            .collect()
    }

    /// Changes the local record of `key` (one the cell holds) outside the protocol. Cells on
    /// PostgreSQL do not drift: they run no verifier in the campaign.
    pub fn drift(&mut self, drift: Drift, key: u32) -> Result<(), String> {
        let Db::Sqlite(db) = &self.db else {
            return Ok(());
        };
        let changed = match drift {
            Drift::Forget => db.execute("DELETE FROM records WHERE key = ?1", [key]),
            Drift::Reassign => {
                let owner = format!("{}-moved-{}", self.id, self.rng.u8(..4));
                db.execute(
                    "UPDATE records SET owner_value = ?2 WHERE key = ?1",
                    (key, owner),
                )
            }
        }
        .map_err(|e| format!("drift {drift:?} of k{key}: {e}"))?;
        if changed > 0 {
            self.ctx
                .drifted
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert((self.index, key));
            self.ctx.tally.add(match drift {
                Drift::Forget => "drift: record forgotten (extra claim)",
                Drift::Reassign => "drift: owner changed (different claim)",
            });
        }
        Ok(())
    }

    /// Rows left in `leases_outstanding`.
    pub async fn lease_rows(&self) -> Result<usize, String> {
        let far = Timestamp::from_unix_micros(i64::MAX);
        self.leases
            .list_older_than(far, 1_000_000)
            .await
            .map(|rows| rows.len())
            .map_err(|e| format!("reading leases_outstanding: {e}"))
    }

    /// LookupClaim of `key`, recorded.
    pub async fn lookup(&mut self, key: u32) -> Answer {
        let history = &self.ctx.history;
        let id = history.invoke(self.index, Call::Lookup { key });
        let answer = match self.client.lookup_claim(&model::claim_key(key)).await {
            Ok(view) => Answer::Found {
                cell: model::cell_index(&view.cell_id).unwrap_or(u16::MAX),
                state: view.state,
            },
            Err(e) => Answer::from_error(&e),
        };
        history.complete(id, answer);
        answer
    }

    /// One claim transaction on `key`, crashing or pausing for a fault as asked. Returns the
    /// BeginUpdate's answer.
    pub async fn transaction(
        &mut self,
        op: TxOp,
        key: u32,
        crash: Option<Crash>,
        pause: Option<(Boundary, FaultKind)>,
    ) -> Answer {
        self.ctx.tally.add(match op {
            TxOp::Create => "transactions: create",
            TxOp::Destroy => "transactions: destroy",
            TxOp::Update => "transactions: update",
        });
        if self.in_transaction_order() {
            // External faults pause SQLite cells only (the sweep picks them).
            self.in_transaction(op, key, crash).await
        } else if crash.is_none() && pause.is_none() && self.ctx.sabotage.is_none() {
            self.transact(op, key).await
        } else {
            self.phase_by_phase(op, key, crash, pause).await
        }
    }

    /// The whole transaction through the real SQLite helper.
    async fn transact(&mut self, op: TxOp, key: u32) -> Answer {
        let (index, history) = (self.index, Arc::clone(&self.ctx.history));
        let lease = LeaseId::generate();
        let request = model::request(index, lease, op, key);
        let invoked = history.now();
        // When the local transaction's body ran: BeginUpdate had answered by then, and
        // CommitUpdate / RollbackUpdate had not been sent yet.
        let body_at = AtomicU64::new(0);
        let config = self.update_config();
        let (Db::Sqlite(db), CellLeases::Sqlite(leases)) = (&mut self.db, &self.leases) else {
            unreachable!("the pre-flight order runs on SQLite cells")
        };
        let result = transact(&self.client, db, leases, request, config, |tx| {
            body_at.store(history.now(), Ordering::Relaxed);
            write_record(tx, op, key, lease)
        })
        .await;
        let ended = history.now();
        let body = match body_at.load(Ordering::Relaxed) {
            0 => ended,
            at => at,
        };
        self.settle(result, (lease, op, key), (invoked, body, body, ended))
    }

    /// Records a whole transaction's calls in the history: BeginUpdate from `invoked`, answered
    /// by `answered`, and the end (CommitUpdate or RollbackUpdate) from `ending` to `ended`.
    /// Each interval holds the real call's.
    fn settle<E: std::fmt::Display>(
        &self,
        result: Result<((), CommitOutcome), TransactionError<E>>,
        (lease, op, key): (LeaseId, TxOp, u32),
        (invoked, answered, ending, ended): (u64, u64, u64, u64),
    ) -> Answer {
        let (index, history) = (self.index, &self.ctx.history);
        let begin = Call::Begin { lease, op, key };
        let commit = Call::Commit { lease, key };
        let rollback = Call::Rollback { lease, key };
        let tally = &self.ctx.tally;
        match result {
            Err(TransactionError::Claims(error)) => {
                let answer = begin_answer(&error);
                history.push(index, begin, invoked, Some(ended), answer);
                tally.add(refusal(&error));
                return answer;
            }
            Err(TransactionError::Local(error)) => {
                history.push(index, begin, invoked, Some(answered), Answer::Ok);
                // `finish` rolls the lease back but does not say whether that succeeded.
                history.push(index, rollback, ending, Some(ended), Answer::Unknown);
                tracing::warn!(cell = index, %error, "local transaction failed");
                tally.add("ended: local transaction failed");
            }
            Err(TransactionError::Stale { .. }) => {
                history.push(index, begin, invoked, Some(answered), Answer::Ok);
                history.push(index, rollback, ending, Some(ended), Answer::Unknown);
                tally.add("ended: stale, rolled back");
            }
            Err(TransactionError::Indeterminate { .. }) => {
                // Whether the local COMMIT happened is unknown; the reconciler settles the lease.
                history.push(index, begin, invoked, Some(answered), Answer::Ok);
                tally.add("ended: local commit indeterminate");
            }
            Err(TransactionError::LostClaims { .. }) => {
                history.push(index, begin, invoked, Some(answered), Answer::Ok);
                let lost = Answer::Err(ErrorKind::LeaseRolledBack);
                history.push(index, commit, ending, Some(ended), lost);
                tally.lost(index, lease);
            }
            Ok(((), outcome)) => {
                history.push(index, begin, invoked, Some(answered), Answer::Ok);
                let answer = commit_answer(&outcome);
                history.push(index, commit, ending, Some(ended), answer);
                tally.add(match answer {
                    Answer::Ok => "ended: committed",
                    _ => "ended: commit left to the reconciler",
                });
            }
        }
        Answer::Ok
    }

    async fn at(&mut self, here: Boundary, pause: Option<(Boundary, FaultKind)>) {
        if let Some((boundary, kind)) = pause {
            if boundary == here {
                let injector = Arc::clone(&self.ctx.injector);
                if let Err(error) = injector.inject(kind, &mut self.rng).await {
                    tracing::warn!(%error, fault = kind.name(), "fault injection failed");
                }
            }
        }
    }

    fn crashed(&self, crash: Crash) -> Answer {
        self.ctx.injector.count(crash.fault());
        self.ctx
            .tally
            .add(format!("ended: {}", crash.fault().name()));
        Answer::Ok
    }

    async fn phase_by_phase(
        &mut self,
        op: TxOp,
        key: u32,
        crash: Option<Crash>,
        pause: Option<(Boundary, FaultKind)>,
    ) -> Answer {
        let (index, history) = (self.index, Arc::clone(&self.ctx.history));
        let lease = LeaseId::generate();
        self.at(Boundary::BeforeBegin, pause).await;
        let id = history.invoke(index, Call::Begin { lease, op, key });
        let request = model::request(index, lease, op, key);
        let pending = match PendingUpdate::begin(&self.client, request, self.update_config()).await
        {
            Ok(pending) => {
                history.complete(id, Answer::Ok);
                pending
            }
            Err(error) => {
                let answer = begin_answer(&error);
                history.complete(id, answer);
                self.ctx.tally.add(refusal(&error));
                return answer;
            }
        };
        self.at(Boundary::AfterBegin, pause).await;
        if crash == Some(Crash::AfterBegin) {
            drop(pending);
            self.ctx.recovery.crashed(index, lease, false);
            return self.crashed(Crash::AfterBegin);
        }

        let record_lease = self.ctx.sabotage != Some(Sabotage::SkipLeaseRecord);
        let (Db::Sqlite(db), CellLeases::Sqlite(leases)) = (&mut self.db, &self.leases) else {
            unreachable!("the pre-flight order runs on SQLite cells")
        };
        let local = local_phase(
            db,
            leases,
            &pending,
            (op, key, lease),
            record_lease,
            crash == Some(Crash::InLocalTx),
        );
        let rollback = Call::Rollback { lease, key };
        let end = match local {
            LocalPhase::Crashed => {
                drop(pending);
                self.ctx.recovery.crashed(index, lease, false);
                return self.crashed(Crash::InLocalTx);
            }
            LocalPhase::Committed => None,
            LocalPhase::Stale(elapsed) => Some((LocalEnd::Stale { elapsed }, "stale")),
            LocalPhase::Failed(error) => {
                tracing::warn!(cell = index, %error, "local transaction failed");
                Some((LocalEnd::Failed(error), "local transaction failed"))
            }
        };
        if let Some((end, why)) = end {
            let id = history.invoke(index, rollback);
            let _ = pending.finish::<(), _, _>(end, &self.leases).await;
            history.complete(id, Answer::Unknown);
            self.ctx.tally.add(format!("ended: {why}, rolled back"));
            return Answer::Ok;
        }
        self.after_local_commit(pending, (lease, key), crash, pause)
            .await
    }

    /// Phase 3 of a transaction whose local commit happened, with a crash or pause as asked.
    async fn after_local_commit(
        &mut self,
        pending: PendingUpdate,
        (lease, key): (LeaseId, u32),
        crash: Option<Crash>,
        pause: Option<(Boundary, FaultKind)>,
    ) -> Answer {
        let (index, history) = (self.index, Arc::clone(&self.ctx.history));
        self.at(Boundary::AfterLocalCommit, pause).await;
        if crash == Some(Crash::AfterLocalCommit) {
            drop(pending);
            return self.crashed(Crash::AfterLocalCommit);
        }

        let commit = Call::Commit { lease, key };
        let split_commit = crash == Some(Crash::AfterCommit)
            || pause.is_some_and(|(b, _)| b == Boundary::AfterCommit);
        if split_commit {
            // `finish` without its last step, so the crash or fault lands between CommitUpdate
            // and the deletion of the local lease row.
            let id = history.invoke(index, commit);
            let result = self.client.commit_update(&self.id, lease).await;
            let answer = result
                .as_ref()
                .map_or_else(Answer::from_error, |()| Answer::Ok);
            history.complete(id, answer);
            if matches!(result, Err(ClaimsError::LeaseRolledBack { .. })) {
                self.ctx.tally.lost(index, lease);
            }
            self.at(Boundary::AfterCommit, pause).await;
            drop(pending);
            if crash == Some(Crash::AfterCommit) {
                return self.crashed(Crash::AfterCommit);
            }
            if result.is_ok() {
                let _ = self.leases.delete(lease).await;
            }
            self.ctx.tally.add(match answer {
                Answer::Ok => "ended: committed",
                _ => "ended: commit left to the reconciler",
            });
            return Answer::Ok;
        }
        let id = history.invoke(index, commit);
        match pending
            .finish::<(), String, _>(LocalEnd::Committed(()), &self.leases)
            .await
        {
            Ok(((), outcome)) => {
                let answer = commit_answer(&outcome);
                history.complete(id, answer);
                self.ctx.tally.add(match answer {
                    Answer::Ok => "ended: committed",
                    _ => "ended: commit left to the reconciler",
                });
            }
            Err(TransactionError::LostClaims { .. }) => {
                history.complete(id, Answer::Err(ErrorKind::LeaseRolledBack));
                self.ctx.tally.lost(index, lease);
            }
            Err(other) => {
                history.complete(id, Answer::Unknown);
                tracing::warn!(cell = index, error = %other, "unexpected end of a committed transaction");
            }
        }
        Answer::Ok
    }
}

/// The answer recorded for a BeginUpdate that failed. Besides unavailability, "lease rolled
/// back / committed" is unknown too: the client retried, so an earlier attempt may have taken
/// the lease before something ended it.
pub fn begin_answer(error: &ClaimsError) -> Answer {
    match error {
        ClaimsError::LeaseRolledBack { .. } | ClaimsError::LeaseCommitted { .. } => Answer::Unknown,
        other => Answer::from_error(other),
    }
}

fn commit_answer(outcome: &CommitOutcome) -> Answer {
    match outcome {
        CommitOutcome::Committed | CommitOutcome::CommittedLocalRowLeft { .. } => Answer::Ok,
        CommitOutcome::LeftToReconciler { error } => Answer::from_error(error),
    }
}

fn refusal(error: &ClaimsError) -> String {
    match ErrorKind::of(error) {
        None => {
            tracing::debug!(%error, "BeginUpdate outcome unknown");
            "ended: begin outcome unknown".to_owned()
        }
        Some(kind) => format!("ended: refused {kind:?}"),
    }
}

enum LocalPhase {
    Committed,
    Crashed,
    Stale(std::time::Duration),
    Failed(rusqlite::Error),
}

/// The application's change for this transaction.
fn write_record(
    tx: &rusqlite::Transaction<'_>,
    op: TxOp,
    key: u32,
    lease: LeaseId,
) -> Result<(), rusqlite::Error> {
    match op {
        TxOp::Create => tx
            .prepare_cached(
                "INSERT INTO records (key, lease_id, created_at) VALUES (?1, ?2, unixepoch())",
            )?
            .execute((key, lease.to_string()))
            .map(drop),
        TxOp::Destroy => tx
            .prepare_cached("DELETE FROM records WHERE key = ?1")?
            .execute([key])
            .map(drop),
        // The record's values are the claim's; an update changes none of them here.
        TxOp::Update => Ok(()),
    }
}

/// Phase 2, as `transact` does it, with an optional crash before the commit. Synchronous: the
/// `!Send` SQLite transaction never lives across an await.
fn local_phase(
    db: &mut Connection,
    leases: &SqliteLocalLeaseStore,
    pending: &PendingUpdate,
    (op, key, lease): (TxOp, u32, LeaseId),
    record_lease: bool,
    crash: bool,
) -> LocalPhase {
    let tx = match db.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => return LocalPhase::Failed(e),
    };
    if let Err(e) = write_record(&tx, op, key, lease) {
        return LocalPhase::Failed(e);
    }
    if record_lease {
        if let Err(e) = leases.record_sync(&tx, lease) {
            return LocalPhase::Failed(e);
        }
    }
    if crash {
        // Dropping the open transaction rolls it back, as the death of the process would.
        return LocalPhase::Crashed;
    }
    if let Err(elapsed) = pending.check_fresh() {
        return LocalPhase::Stale(elapsed);
    }
    match tx.commit() {
        Ok(()) => LocalPhase::Committed,
        Err(e) => LocalPhase::Failed(e),
    }
}

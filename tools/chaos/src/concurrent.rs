//! The concurrent model test of group commit: many tasks issue random BeginUpdate / CommitUpdate
//! / RollbackUpdate / LookupClaim calls at once, through the combiner (`topology_claims_server::group`),
//! over a few keys, against a real store. Then:
//! - every key's history must be linearizable against the pure model (the campaign's checker,
//!   [`crate::linearizability`]);
//! - the store's final state must equal the model's state after that linearization (the model
//!   replayed in an order the answers admit, i.e. the commit order);
//! - no lease may be left outstanding, and the combiner must actually have formed groups.
//!
//! No faults are injected: every call must get a definite answer. A deliberately broken group
//! decider ([`Broken`]) shows that the checks catch the bugs a combiner could have.
//!
//! Owns the workload and the final comparison. Must not decide protocol questions: the model is
//! `Tables`, through [`crate::model::apply`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use topology_claims::domain::{
    self, group, DecommissionStep, GroupOp, GroupResults, GroupSnapshot, LeaseSummary, SlotGrant,
    SlotHolder, SlotLimit, Tables,
};
use topology_claims::{
    BeginUpdate, CellId, Claim, ClaimKey, ClaimStore, ClaimsError, ClaimsPage, ClaimsQuery, Lease,
    LeaseId, LeasesPage, LeasesQuery, Timestamp,
};
use topology_claims_server::group::{GroupCommit, GroupConfig};

use crate::history::{Answer, Call, Event, History, TxOp};
use crate::linearizability::{self, Verdict};
use crate::model;

/// Search steps per key.
const BUDGET: u64 = 5_000_000;

/// The shape of one run.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    pub tasks: usize,
    /// Leases each task begins (each with its end and extra calls).
    pub leases_per_task: usize,
    pub keys: u32,
    pub cells: u16,
}

/// What one run saw.
#[derive(Debug)]
pub struct Report {
    pub calls: usize,
    pub batches: u64,
    pub operations: u64,
    /// Groups of more than one call.
    pub shared_batches: u64,
    /// Everything that failed a check; empty when the run passed.
    pub violations: Vec<String>,
}

fn answer_of<T>(result: &Result<T, ClaimsError>) -> Answer {
    match result {
        Ok(_) => Answer::Ok,
        Err(e) => Answer::from_error(e),
    }
}

/// One call, recorded in `history`.
async fn call(store: &GroupCommit, history: &History, cell: u16, call: Call) -> Answer {
    let id = history.invoke(cell, call);
    let caller = model::cell_id(cell);
    let answer = match call {
        Call::Begin { lease, op, key } => answer_of(
            &store
                .begin_update(model::request(cell, lease, op, key))
                .await,
        ),
        Call::Commit { lease, .. } => answer_of(&store.commit_update(&caller, lease).await),
        Call::Rollback { lease, .. } => {
            answer_of(&store.rollback_update(&caller, lease, None).await)
        }
        Call::Lookup { key } => match store.lookup_claim(&model::claim_key(key)).await {
            Ok(claim) => Answer::Found {
                cell: model::cell_index(&claim.cell_id).unwrap_or(u16::MAX),
                state: claim.state(),
            },
            Err(e) => Answer::from_error(&e),
        },
        Call::Probe { .. } | Call::Ghost { .. } => unreachable!("not issued by this workload"),
    };
    history.complete(id, answer);
    answer
}

/// One task's calls: random leases with their ends, replays, foreign ends and lookups.
async fn task(store: Arc<GroupCommit>, history: Arc<History>, workload: Workload, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    for _ in 0..workload.leases_per_task {
        let cell = rng.u16(0..workload.cells);
        let key = rng.u32(0..workload.keys);
        if rng.u8(0..100) < 15 {
            call(&store, &history, cell, Call::Lookup { key }).await;
        }
        let lease = LeaseId::generate();
        let op = if rng.u8(0..100) < 65 {
            TxOp::Create
        } else {
            TxOp::Destroy
        };
        let begun = call(&store, &history, cell, Call::Begin { lease, op, key }).await;
        if begun == Answer::Ok && rng.u8(0..100) < 10 {
            // A retry of the same begin: replayed.
            call(&store, &history, cell, Call::Begin { lease, op, key }).await;
        }
        if rng.u8(0..100) < 10 {
            // Another cell may not end this lease.
            let other = (cell + 1) % workload.cells;
            call(&store, &history, other, Call::Commit { lease, key }).await;
        }
        // Every lease ends (a refused begin's id is rolled back and remembered).
        let end = if begun == Answer::Ok && rng.u8(0..100) < 65 {
            Call::Commit { lease, key }
        } else {
            Call::Rollback { lease, key }
        };
        call(&store, &history, cell, end).await;
        if rng.u8(0..100) < 10 {
            // Ends are idempotent.
            call(&store, &history, cell, end).await;
        }
    }
}

/// Runs `workload` through a combiner over `store` and checks the result.
pub async fn run(store: Arc<dyn ClaimStore>, config: GroupConfig, workload: Workload) -> Report {
    let combiner = Arc::new(GroupCommit::new(Arc::clone(&store), config));
    let history = Arc::new(History::new());
    let seed = fastrand::u64(..);
    let tasks: Vec<_> = (0..workload.tasks)
        .map(|i| {
            tokio::spawn(task(
                Arc::clone(&combiner),
                Arc::clone(&history),
                workload,
                seed.wrapping_add(i as u64),
            ))
        })
        .collect();
    let mut violations = Vec::new();
    for task in tasks {
        if let Err(e) = task.await {
            violations.push(format!("a task failed: {e}"));
        }
    }
    let events = history.snapshot();
    for event in &events {
        if matches!(event.answer, Answer::Unknown | Answer::Pending) {
            violations.push(format!("no definite answer (the store failed): {event}"));
        }
    }
    if violations.is_empty() {
        check_keys(&*store, &events, workload, &mut violations).await;
        check_no_leases_left(&*store, workload, &mut violations).await;
    }
    let stats = combiner.stats();
    let sizes = stats.size_distribution();
    Report {
        calls: events.len(),
        batches: stats.batches.load(std::sync::atomic::Ordering::Relaxed),
        operations: stats.operations.load(std::sync::atomic::Ordering::Relaxed),
        shared_batches: sizes.iter().skip(1).map(|(_, n)| n).sum(),
        violations,
    }
}

/// Per key: linearizable, and the store ends where the linearized model ends.
async fn check_keys(
    store: &dyn ClaimStore,
    events: &[Event],
    workload: Workload,
    violations: &mut Vec<String>,
) {
    let by_key = linearizability::by_key(events);
    for key in 0..workload.keys {
        let history = by_key.get(&key).map(Vec::as_slice).unwrap_or_default();
        let model = match linearizability::final_state(history, BUDGET) {
            Ok(model) => model,
            Err(Verdict::Violation { minimal }) => {
                let lines: Vec<String> = minimal.iter().map(|e| format!("  {e}")).collect();
                violations.push(format!(
                    "key {key}: not linearizable:\n{}",
                    lines.join("\n")
                ));
                continue;
            }
            Err(verdict) => {
                violations.push(format!("key {key}: {verdict:?}"));
                continue;
            }
        };
        let claim_key = model::claim_key(key);
        let expected = model
            .claims
            .get(&claim_key)
            .map(|c| (c.cell_id.clone(), c.state(), c.record.clone()));
        let actual = match store.lookup_claim(&claim_key).await {
            Ok(c) => Some((c.cell_id.clone(), c.state(), c.record.clone())),
            Err(ClaimsError::ClaimNotFound { .. }) => None,
            Err(e) => {
                violations.push(format!("key {key}: final lookup failed: {e}"));
                continue;
            }
        };
        if actual != expected {
            violations.push(format!(
                "key {key}: the store ends with {actual:?}, the model replayed in commit order \
                 with {expected:?}"
            ));
        }
    }
}

async fn check_no_leases_left(
    store: &dyn ClaimStore,
    workload: Workload,
    violations: &mut Vec<String>,
) {
    for cell in 0..workload.cells {
        let query = LeasesQuery {
            cell_id: model::cell_id(cell),
            after: None,
            limit: 100,
            max_bytes: domain::DEFAULT_MAX_RESPONSE_BYTES,
        };
        match store.list_outstanding_leases(&query).await {
            Ok(page) if page.leases.is_empty() => {}
            Ok(page) => violations.push(format!(
                "cell {cell}: {} leases still outstanding after every lease ended",
                page.leases.len()
            )),
            Err(e) => violations.push(format!("cell {cell}: listing leases failed: {e}")),
        }
    }
}

/// How [`Broken`] gets group commit wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Breakage {
    /// A refused call aborts its whole group: nothing commits, every call gets the refusal.
    RefusalAbortsGroup,
    /// Every call is decided against the group's starting state, not its predecessors' effects:
    /// two creates of one key in one group are both accepted.
    NoOverlay,
}

/// An in-memory store whose `run_group` is deliberately wrong (the checks must catch it).
pub struct Broken {
    tables: Mutex<Tables>,
    breakage: Breakage,
    clock: Mutex<i64>,
}

impl Broken {
    pub fn new(breakage: Breakage) -> Self {
        Self {
            tables: Mutex::default(),
            breakage,
            clock: Mutex::new(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now(&self) -> Timestamp {
        let mut clock = self.clock.lock().unwrap_or_else(|p| p.into_inner());
        *clock += 1;
        Timestamp::from_unix_micros(*clock)
    }
}

fn snapshot_of(tables: &Tables) -> GroupSnapshot {
    GroupSnapshot {
        claims: tables.claims.values().cloned().collect(),
        leases: tables.leases.values().cloned().collect(),
        outcomes: tables.outcomes.values().cloned().collect(),
        decommissioned: tables
            .decommissioned
            .iter()
            .map(|(c, t)| (c.clone(), *t))
            .collect(),
        namespaces: tables.namespaces.clone(),
    }
}

impl topology_claims::ports::WaitLine for Broken {}

#[async_trait]
impl ClaimStore for Broken {
    async fn begin_update(&self, request: BeginUpdate) -> Result<Lease, ClaimsError> {
        let now = self.now();
        self.lock().begin_update(request, LeaseId::generate(), now)
    }

    async fn commit_update(&self, cell_id: &CellId, lease_id: LeaseId) -> Result<(), ClaimsError> {
        let now = self.now();
        self.lock().commit_update(cell_id, lease_id, now)
    }

    async fn rollback_update(
        &self,
        cell_id: &CellId,
        lease_id: LeaseId,
        unrenewed_for: Option<Duration>,
    ) -> Result<(), ClaimsError> {
        let now = self.now();
        self.lock()
            .rollback_update(cell_id, lease_id, unrenewed_for, now)
    }

    async fn renew_lease(&self, cell_id: &CellId, lease_id: LeaseId) -> Result<Lease, ClaimsError> {
        let now = self.now();
        self.lock().renew_lease(cell_id, lease_id, now)
    }

    async fn list_outstanding_leases(
        &self,
        query: &LeasesQuery,
    ) -> Result<LeasesPage, ClaimsError> {
        let now = self.now();
        Ok(self.lock().list_outstanding_leases(query, now))
    }

    async fn list_claims(&self, query: &ClaimsQuery) -> Result<ClaimsPage, ClaimsError> {
        Ok(self.lock().list_claims(query))
    }

    async fn lookup_claim(&self, key: &ClaimKey) -> Result<Claim, ClaimsError> {
        self.lock().lookup_claim(key)
    }

    async fn namespaces(
        &self,
    ) -> Result<Vec<topology_claims::domain::StoredNamespace>, ClaimsError> {
        Ok(self.lock().namespaces.iter().cloned().collect())
    }

    async fn create_namespace(
        &self,
        spec: topology_claims::domain::NamespaceSpec,
        max: usize,
    ) -> Result<topology_claims::domain::StoredNamespace, ClaimsError> {
        self.lock().create_namespace(spec, max)
    }

    async fn delete_namespace(&self, id: &str) -> Result<(), ClaimsError> {
        self.lock().delete_namespace(id)
    }

    async fn update_namespace(
        &self,
        id: &str,
        update: topology_claims::domain::NamespaceUpdate,
    ) -> Result<topology_claims::domain::StoredNamespace, ClaimsError> {
        self.lock().update_namespace(id, update)
    }

    async fn collect_outcomes(&self, retention: Duration) -> Result<u64, ClaimsError> {
        let now = self.now();
        Ok(self.lock().collect_outcomes(now, retention))
    }

    async fn count_claims(
        &self,
    ) -> Result<Vec<(topology_claims::domain::NamespaceId, u64)>, ClaimsError> {
        Ok(self.lock().count_claims())
    }

    async fn lease_summary(&self) -> Result<LeaseSummary, ClaimsError> {
        let now = self.now();
        Ok(self.lock().lease_summary(now))
    }

    async fn decommission_step(
        &self,
        cell_id: &CellId,
        batch: usize,
        dry_run: bool,
    ) -> Result<DecommissionStep, ClaimsError> {
        let now = self.now();
        self.lock().decommission_step(cell_id, batch, dry_run, now)
    }

    async fn restore_state(
        &self,
    ) -> Result<Option<topology_claims::domain::RestoreEpoch>, topology_claims::ClaimsError> {
        Ok(self.lock().restore.clone())
    }
    async fn mark_restored(
        &self,
        request: &topology_claims::domain::MarkRestored,
    ) -> Result<topology_claims::domain::RestoreEpoch, topology_claims::ClaimsError> {
        let now = self.now();
        self.lock().mark_restored(request, now)
    }
    async fn report_verification_pass(
        &self,
        cell_id: &topology_claims::CellId,
        epoch: u64,
    ) -> Result<topology_claims::domain::RestoreEpoch, topology_claims::ClaimsError> {
        let now = self.now();
        self.lock().report_verification_pass(cell_id, epoch, now)
    }
    async fn lift_quarantine(
        &self,
        epoch: u64,
        reason: &str,
    ) -> Result<topology_claims::domain::RestoreEpoch, topology_claims::ClaimsError> {
        let now = self.now();
        self.lock().lift_quarantine(epoch, reason, now)
    }

    async fn read_events(
        &self,
        _: &topology_claims::domain::EventsQuery,
    ) -> Result<topology_claims::domain::EventsPage, topology_claims::ClaimsError> {
        Err(topology_claims::ClaimsError::Unsupported {
            what: "this test double keeps no change feed".to_owned(),
        })
    }

    async fn compact_events(
        &self,
        _: std::time::Duration,
        _: u64,
    ) -> Result<u64, topology_claims::ClaimsError> {
        Ok(0)
    }

    async fn acquire_verification_slot(
        &self,
        holder: &SlotHolder,
        limit: SlotLimit,
    ) -> Result<SlotGrant, ClaimsError> {
        let now = self.now();
        self.lock().acquire_verification_slot(holder, limit, now)
    }

    async fn release_verification_slot(&self, holder: &SlotHolder) -> Result<bool, ClaimsError> {
        Ok(self.lock().release_verification_slot(holder))
    }

    async fn run_group(&self, ops: &[GroupOp]) -> Result<GroupResults, ClaimsError> {
        let now = self.now();
        let mut tables = self.lock();
        match self.breakage {
            Breakage::RefusalAbortsGroup => {
                let decision = domain::decide_group(snapshot_of(&tables), ops, now);
                if let Some(Err(refusal)) = decision.results.iter().find(|r| r.is_err()) {
                    let refusal = refusal.clone();
                    return Ok(ops.iter().map(|_| Err(refusal.clone())).collect());
                }
                group::apply_writes(&mut tables, &decision.writes);
                Ok(decision.results)
            }
            Breakage::NoOverlay => {
                let start = snapshot_of(&tables);
                let mut results = Vec::with_capacity(ops.len());
                for op in ops {
                    let decision =
                        domain::decide_group(start.clone(), std::slice::from_ref(op), now);
                    group::apply_writes(&mut tables, &decision.writes);
                    results.extend(decision.results);
                }
                Ok(results)
            }
        }
    }

    fn retries(&self) -> u64 {
        0
    }
}

/// The tests of every backend share these.
#[cfg(test)]
pub(crate) mod support {
    use super::*;

    pub const WORKLOAD: Workload = Workload {
        tasks: 16,
        leases_per_task: 25,
        keys: 4,
        cells: 3,
    };

    /// Runs and demands a clean report in which groups formed.
    pub async fn passes(store: Arc<dyn ClaimStore>, config: GroupConfig, workload: Workload) {
        assert!(
            clean_run(store, config, workload).await,
            "no group carried more than one call: the test did not exercise group commit"
        );
    }

    /// Runs and demands a clean report; says whether a group carried more than one call.
    pub async fn clean_run(
        store: Arc<dyn ClaimStore>,
        config: GroupConfig,
        workload: Workload,
    ) -> bool {
        let report = run(store, config, workload).await;
        eprintln!(
            "concurrent model test: {} calls, {} groups carrying {} operations, {} shared",
            report.calls, report.batches, report.operations, report.shared_batches
        );
        assert!(
            report.violations.is_empty(),
            "violations:\n{}",
            report.violations.join("\n")
        );
        report.shared_batches > 0
    }

    /// Runs against a broken decider until the checks catch it (at most 20 runs of well under
    /// a second: whether two conflicting calls share a group depends on scheduling, and 5 runs
    /// once missed it in a CI run).
    pub async fn caught(breakage: Breakage) -> Vec<String> {
        for _ in 0..20 {
            let report = run(
                Arc::new(Broken::new(breakage)),
                GroupConfig::default(),
                WORKLOAD,
            )
            .await;
            if !report.violations.is_empty() {
                return report.violations;
            }
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::support::*;
    use super::*;
    use topology_claims::memory::MemoryClaimStore;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn memory_through_the_combiner_is_linearizable() {
        // The memory store answers at once: whether calls queue into shared groups depends on
        // scheduling, and a loaded machine can run every call alone. Every run must be clean;
        // one of at most 20, each on a fresh store, must have shared a group.
        for _ in 0..20 {
            let store = Arc::new(MemoryClaimStore::new());
            if clean_run(store, GroupConfig::default(), WORKLOAD).await {
                return;
            }
        }
        panic!("no group carried more than one call in 20 runs: group commit was not exercised");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refusal_that_aborts_its_group_is_caught() {
        let violations = caught(Breakage::RefusalAbortsGroup).await;
        assert!(!violations.is_empty(), "the broken combiner went unnoticed");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_conflicting_creates_in_one_group_are_caught() {
        let violations = caught(Breakage::NoOverlay).await;
        assert!(!violations.is_empty(), "the broken combiner went unnoticed");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_through_the_combiner_is_linearizable() {
        let dir = tempfile::TempDir::new().expect("a temporary directory");
        let store = topology_claims_sqlite::SqliteClaimStore::open(
            dir.path().join("claims.db"),
            topology_claims::MigrationPolicy::Apply,
        )
        .await
        .expect("a SQLite store");
        passes(Arc::new(store), GroupConfig::default(), WORKLOAD).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_through_the_combiner_is_linearizable() {
        use topology_claims_harness::postgres::{test_url, TempSchema};
        let schema = TempSchema::create(&test_url(), "chaos_group_", Duration::from_secs(3600))
            .await
            .expect("a temporary schema");
        let url = schema.url("chaos-group").expect("the schema's URL");
        let store = topology_claims_postgres::PostgresClaimStore::connect(
            &url,
            topology_claims_postgres::PostgresOptions::default(),
            topology_claims::MigrationPolicy::Apply,
        )
        .await
        .expect("a PostgreSQL store");
        // Fewer groups in flight than the pool has connections, so that several multi-call
        // groups run at once (the pool size alone would rarely make requests queue).
        let config = GroupConfig {
            max: 8,
            parallelism: Some(3),
            ..GroupConfig::default()
        };
        passes(Arc::new(store), config, WORKLOAD).await;
        schema.drop().await.expect("dropping the schema");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn spanner_emulator_through_the_combiner_is_linearizable() {
        use topology_claims_harness::spanner::{emulator_binary, Emulator, Mode};
        use topology_claims_spanner::{SpannerClaimStore, SpannerOptions};
        if let Err(why) = emulator_binary() {
            assert!(
                !topology_claims_harness::in_ci(),
                "CI=true needs the emulator: {why}"
            );
            eprintln!("spanner concurrent model test skipped: {why}");
            return;
        }
        let emulator = Emulator::start(Mode::Plain, &std::env::temp_dir()).expect("the emulator");
        let url = "spanner://projects/chaos/instances/chaos/databases/group-commit";
        let options = SpannerOptions {
            session_pool_size: 8,
            emulator_host: Some(emulator.host.clone()),
            ..SpannerOptions::default()
        };
        topology_claims_spanner::migrate(url, options.clone(), true)
            .await
            .expect("creating the database");
        let store =
            SpannerClaimStore::connect(url, options, topology_claims::MigrationPolicy::Refuse)
                .await
                .expect("a Spanner store");
        // The emulator runs one read-write transaction at a time: a smaller history.
        let workload = Workload {
            tasks: 8,
            leases_per_task: 8,
            ..WORKLOAD
        };
        passes(Arc::new(store), GroupConfig::default(), workload).await;
    }
}

//! Model-based property test: random sequences of begin (creates, destroys and in-place updates)
//! / commit / rollback / renew / lookup / decommission / restore (mark, report, lift) steps from three cells over six keys (so conflicts are frequent), run against the pure model
//! ([`Tables`]) and the adapter side by side. Every outcome must match the model's, the
//! protocol invariants must hold after every step, and the final state must equal the model's.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};

use crate::fixtures::{cell, lease_id, record_in};
use topology_claims::domain::{
    BeginUpdate, CellId, Claim, ClaimKey, ClaimRecord, ClaimType, ClaimsCursor, ClaimsQuery,
    DecommissionStep, Lease, LeaseId, LeasesQuery, LocalTransaction, MarkRestored, OwnerType,
    RestoreEpoch, TableName, Tables, Timestamp,
};
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;

const CELLS: usize = 3;
const KEYS: usize = 6;
const LEASE_IDS: u128 = 8;
const RECORD_IDS: i64 = 4;

/// One step of a generated history.
#[derive(Clone, Debug)]
pub enum Command {
    Begin {
        cell: usize,
        lease: Option<u128>,
        creates: Vec<(usize, i64)>,
        destroys: Vec<(usize, i64)>,
        /// `(key, new record id, moves to the emails table)`: the new values of an update.
        updates: Vec<(usize, i64, bool)>,
        /// The local transaction named (`pg:1:N`), if any: a retry may name another one.
        local: Option<u8>,
    },
    Commit {
        cell: usize,
        lease: u128,
    },
    /// `unrenewed_for`: unconditional, or a condition every outstanding lease meets (zero) or
    /// none does (an hour: histories take seconds), so the model at its constant clock and the
    /// adapter at its own agree.
    Rollback {
        cell: usize,
        lease: u128,
        unrenewed_for: Option<Duration>,
    },
    Renew {
        cell: usize,
        lease: u128,
    },
    Lookup {
        key: usize,
    },
    /// One decommission step of `cell` deleting up to `batch` claims (or counting them).
    Decommission {
        cell: usize,
        batch: usize,
        dry_run: bool,
    },
    /// `admin mark-restored`, naming `expect` besides the cells the store knows.
    MarkRestored {
        expect: Option<usize>,
    },
    /// `cell`'s verification pass report of the latest epoch plus `ahead` (1: a wrong epoch).
    Report {
        cell: usize,
        ahead: u64,
    },
    /// `admin lift-quarantine` of the latest epoch plus `ahead`.
    Lift {
        ahead: u64,
    },
}

fn cell_of(n: usize) -> CellId {
    cell(&format!("cell-{n}"))
}

fn key_of(n: usize) -> ClaimKey {
    let claim_type = [ClaimType::Username, ClaimType::Email][n % 2];
    ClaimKey::new(claim_type, format!("k{}", n / 2))
}

/// The form a cell sends key `k`'s value in, chosen by `record_id`: as is, capitalized, or
/// fullwidth. Under the built-ins' `precis-username` the three are one key, so the suite
/// creates, destroys and updates a claim through forms other than the one that created it.
fn form_of(k: &ClaimKey, record_id: i64) -> String {
    match record_id.rem_euclid(3) {
        0 => k.value.clone(),
        1 => k.value.to_uppercase(),
        _ => k
            .value
            .chars()
            .map(|c| match c {
                'a'..='z' => char::from_u32(c as u32 - 'a' as u32 + 0xFF41).unwrap_or(c),
                '0'..='9' => char::from_u32(c as u32 - '0' as u32 + 0xFF10).unwrap_or(c),
                _ => c,
            })
            .collect(),
    }
}

fn record_of(key: usize, record_id: i64) -> ClaimRecord {
    let k = key_of(key);
    record_in(
        TableName::USERS,
        record_id,
        k.namespace.clone(),
        &form_of(&k, record_id),
    )
}

/// The new values of an update of `key`: another owner, and the record `record_id` of `users` or
/// (`moved`) `emails`, so a commit moves the claim within the ListClaims index or across tables.
fn updated_record_of(key: usize, record_id: i64, moved: bool) -> ClaimRecord {
    let table = if moved {
        TableName::EMAILS
    } else {
        TableName::USERS
    };
    let k = key_of(key);
    ClaimRecord {
        display: None,
        owner_type: OwnerType::GROUP,
        owner_value: format!("moved-{}", k.value),
        ..record_in(
            table,
            record_id,
            k.namespace.clone(),
            &form_of(&k, record_id),
        )
    }
}

fn command() -> impl Strategy<Value = Command> {
    let cell = 0..CELLS;
    let lease = 0..LEASE_IDS;
    let claims = || proptest::collection::vec((0..KEYS, 0..RECORD_IDS), 0..3);
    prop_oneof![
        5 => (
            cell.clone(),
            proptest::option::weighted(0.85, lease.clone()),
            claims(),
            claims(),
            proptest::collection::vec((0..KEYS, 0..RECORD_IDS, proptest::bool::weighted(0.3)), 0..3),
            proptest::option::of(0..2u8),
        )
            .prop_map(|(cell, lease, creates, destroys, updates, local)| Command::Begin {
                cell,
                lease,
                creates,
                destroys,
                updates,
                local,
            }),
        3 => (cell.clone(), lease.clone()).prop_map(|(cell, lease)| Command::Commit { cell, lease }),
        2 => (
            cell.clone(),
            lease.clone(),
            proptest::sample::select(vec![None, Some(Duration::ZERO), Some(Duration::from_secs(3600))]),
        )
            .prop_map(|(cell, lease, unrenewed_for)| Command::Rollback { cell, lease, unrenewed_for }),
        1 => (cell, lease).prop_map(|(cell, lease)| Command::Renew { cell, lease }),
        1 => (0..KEYS).prop_map(|key| Command::Lookup { key }),
        // Rare: a decommissioned cell begins nothing for the rest of the history.
        1 => (0..CELLS, 1..4usize, proptest::bool::weighted(0.3))
            .prop_map(|(cell, batch, dry_run)| Command::Decommission { cell, batch, dry_run }),
        1 => proptest::option::of(0..CELLS + 1).prop_map(|expect| Command::MarkRestored { expect }),
        1 => (0..CELLS, proptest::sample::select(vec![0u64, 0, 0, 1]))
            .prop_map(|(cell, ahead)| Command::Report { cell, ahead }),
        1 => proptest::sample::select(vec![0u64, 0, 1]).prop_map(|ahead| Command::Lift { ahead }),
    ]
}

/// A result with timestamps blanked out, for comparing the adapter with the model.
#[derive(PartialEq, Eq)]
enum Observed {
    Lease(Lease),
    Claim(Claim),
    Step(DecommissionStep),
    Restore(RestoreEpoch),
    Done,
    Error(ClaimsError),
}

impl fmt::Debug for Observed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Observed::Lease(l) => write!(f, "Ok(lease {} of {})", l.lease_id, l.cell_id),
            Observed::Claim(c) => write!(
                f,
                "Ok(claim {} of {} lease {:?})",
                c.key(),
                c.cell_id,
                c.lease
            ),
            Observed::Step(s) => write!(f, "Ok({s:?})"),
            Observed::Restore(r) => write!(f, "Ok({r:?})"),
            Observed::Done => write!(f, "Ok(())"),
            Observed::Error(e) => write!(f, "Err({e:?})"),
        }
    }
}

const ZERO: Timestamp = Timestamp::from_unix_micros(0);

fn blank_lease(mut lease: Lease) -> Lease {
    lease.created_at = ZERO;
    lease.last_renewed_at = ZERO;
    lease
}

/// The store's readings blanked out: its clock, and its revisions (each store numbers them its
/// own way; `conformance::watch` checks them).
fn blank_claim(mut claim: Claim) -> Claim {
    claim.created_at = ZERO;
    claim.updated_at = ZERO;
    claim.revision = 0;
    claim
}

/// The backup time of every generated mark: not after any store's clock.
const BACKUP_TIME: Timestamp = ZERO;

/// An epoch with the store's clock readings blanked out.
fn blank_epoch(mut epoch: RestoreEpoch) -> RestoreEpoch {
    epoch.marked_at = ZERO;
    for at in epoch.reported.values_mut() {
        *at = ZERO;
    }
    if let Some((at, _)) = epoch.lifted.as_mut() {
        *at = ZERO;
    }
    epoch
}

fn observe<T>(result: Result<T, ClaimsError>, f: impl FnOnce(T) -> Observed) -> Observed {
    match result {
        Ok(value) => f(value),
        Err(err) => Observed::Error(err),
    }
}

/// Runs `cases` random histories against fresh stores from `factory` and the model; panics with
/// the minimal failing history.
///
/// `factory` follows the contract of [`claim_store_conformance!`](crate::claim_store_conformance):
/// it returns `(store, guard)`, and `guard` is kept alive until the history's store is dropped.
pub fn check_against_model<S, G, F, Fut>(factory: F, cases: u32)
where
    S: ClaimStore,
    F: Fn() -> Fut,
    Fut: Future<Output = (S, G)>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime for the model test");
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let strategy = proptest::collection::vec(command(), 1..40);
    let result = runner.run(&strategy, |history| {
        runtime.block_on(async {
            // (store, guard): the tuple drops the store first, then the guard.
            let fresh = factory().await;
            run_history(&fresh.0, &history).await
        })
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(reason, history)) => {
            panic!("adapter diverged from the model: {reason}\nminimal history:\n{history:#?}")
        }
        Err(TestError::Abort(reason)) => panic!("model test aborted: {reason}"),
    }
}

async fn run_history<S: ClaimStore>(store: &S, history: &[Command]) -> Result<(), TestCaseError> {
    let mut model = Tables::default();
    for (step, command) in history.iter().enumerate() {
        let (actual, expected) = apply(store, &mut model, command).await;
        if let Observed::Error(
            ClaimsError::Unavailable { .. }
            | ClaimsError::ServerUnavailable { .. }
            | ClaimsError::Internal { .. },
        ) = actual
        {
            return Err(TestCaseError::fail(format!(
                "step {step} {command:?}: store failed: {actual:?}"
            )));
        }
        if actual != expected {
            return Err(TestCaseError::fail(format!(
                "step {step} {command:?}: adapter answered {actual:?}, model {expected:?}"
            )));
        }
        check_invariants(store, &model)
            .await
            .map_err(|e| TestCaseError::fail(format!("after step {step} {command:?}: {e}")))?;
    }
    check_final_state(store, &model)
        .await
        .map_err(TestCaseError::fail)
}

async fn apply<S: ClaimStore>(
    store: &S,
    model: &mut Tables,
    command: &Command,
) -> (Observed, Observed) {
    match command {
        Command::Begin {
            cell,
            lease,
            creates,
            destroys,
            updates,
            local,
        } => {
            let request = BeginUpdate {
                local_transaction: local.map(|n| {
                    LocalTransaction::parse_field(&format!("pg:1:{n}"), "local_transaction")
                        .expect("a valid local transaction")
                }),
                cell_id: cell_of(*cell),
                lease_id: lease.map(lease_id),
                creates: creates.iter().map(|(k, r)| record_of(*k, *r)).collect(),
                destroys: destroys.iter().map(|(k, r)| record_of(*k, *r)).collect(),
                updates: updates
                    .iter()
                    .map(|(k, r, moved)| updated_record_of(*k, *r, *moved))
                    .collect(),
            };
            let actual = store.begin_update(request.clone()).await;
            // A server-chosen id is whatever the adapter picked; the model takes the same one.
            let fresh = actual
                .as_ref()
                .map(|l| l.lease_id)
                .unwrap_or_else(|_| LeaseId::generate());
            let expected = model.begin_update(request, fresh, ZERO);
            (
                observe(actual, |l| Observed::Lease(blank_lease(l))),
                observe(expected, |l| Observed::Lease(blank_lease(l))),
            )
        }
        Command::Commit { cell, lease } => {
            let (c, id) = (cell_of(*cell), lease_id(*lease));
            let actual = store.commit_update(&c, id).await;
            let expected = model.commit_update(&c, id, ZERO);
            (
                observe(actual, |_| Observed::Done),
                observe(expected, |_| Observed::Done),
            )
        }
        Command::Rollback {
            cell,
            lease,
            unrenewed_for,
        } => {
            let (c, id) = (cell_of(*cell), lease_id(*lease));
            let actual = store.rollback_update(&c, id, *unrenewed_for).await;
            let expected = model.rollback_update(&c, id, *unrenewed_for, ZERO);
            (
                observe(actual, |_| Observed::Done),
                observe(expected, |_| Observed::Done),
            )
        }
        Command::Renew { cell, lease } => {
            let (c, id) = (cell_of(*cell), lease_id(*lease));
            let actual = store.renew_lease(&c, id).await;
            let expected = model.renew_lease(&c, id, ZERO);
            (
                observe(actual, |l| Observed::Lease(blank_lease(l))),
                observe(expected, |l| Observed::Lease(blank_lease(l))),
            )
        }
        Command::Lookup { key } => {
            let actual = store.lookup_claim(&key_of(*key)).await;
            let expected = model.lookup_claim(&key_of(*key));
            (
                observe(actual, |c| Observed::Claim(blank_claim(c))),
                observe(expected, |c| Observed::Claim(blank_claim(c))),
            )
        }
        Command::Decommission {
            cell,
            batch,
            dry_run,
        } => {
            let c = cell_of(*cell);
            let actual = store.decommission_step(&c, *batch, *dry_run).await;
            let expected = model.decommission_step(&c, *batch, *dry_run, ZERO);
            (
                observe(actual, Observed::Step),
                observe(expected, Observed::Step),
            )
        }
        Command::MarkRestored { expect } => {
            // A cell beyond the history's three: one the store cannot know.
            let request = MarkRestored {
                backup_time: BACKUP_TIME,
                reason: "model".to_owned(),
                expect_cells: expect.iter().map(|n| cell_of(*n)).collect(),
            };
            let actual = store.mark_restored(&request).await;
            let expected = model.mark_restored(&request, ZERO);
            (
                observe(actual, |e| Observed::Restore(blank_epoch(e))),
                observe(expected, |e| Observed::Restore(blank_epoch(e))),
            )
        }
        Command::Report { cell, ahead } => {
            let (c, epoch) = (cell_of(*cell), latest_epoch(model) + ahead);
            let actual = store.report_verification_pass(&c, epoch).await;
            let expected = model.report_verification_pass(&c, epoch, ZERO);
            (
                observe(actual, |e| Observed::Restore(blank_epoch(e))),
                observe(expected, |e| Observed::Restore(blank_epoch(e))),
            )
        }
        Command::Lift { ahead } => {
            let epoch = latest_epoch(model) + ahead;
            let actual = store.lift_quarantine(epoch, "model").await;
            let expected = model.lift_quarantine(epoch, "model", ZERO);
            (
                observe(actual, |e| Observed::Restore(blank_epoch(e))),
                observe(expected, |e| Observed::Restore(blank_epoch(e))),
            )
        }
    }
}

/// The model's latest restore epoch (0: never marked).
fn latest_epoch(model: &Tables) -> u64 {
    model.restore.as_ref().map_or(0, |r| r.epoch)
}

async fn outstanding<S: ClaimStore>(store: &S) -> Result<BTreeMap<LeaseId, Lease>, String> {
    let mut leases = BTreeMap::new();
    for n in 0..CELLS {
        let mut after = None;
        loop {
            let query = LeasesQuery::new(cell_of(n), after, 3);
            let page = store
                .list_outstanding_leases(&query)
                .await
                .map_err(|e| e.to_string())?;
            for lease in page.leases {
                if lease.cell_id != cell_of(n) {
                    return Err(format!(
                        "lease {} of {} listed for cell-{n}",
                        lease.lease_id, lease.cell_id
                    ));
                }
                leases.insert(lease.lease_id, blank_lease(lease));
            }
            match page.next_cursor {
                Some(cursor) => after = Some(cursor),
                None => break,
            }
        }
    }
    Ok(leases)
}

async fn claims<S: ClaimStore>(store: &S) -> Result<BTreeMap<ClaimKey, Claim>, String> {
    let mut claims = BTreeMap::new();
    for n in 0..KEYS {
        match store.lookup_claim(&key_of(n)).await {
            Ok(claim) => {
                claims.insert(key_of(n), blank_claim(claim));
            }
            Err(ClaimsError::ClaimNotFound { .. }) => {}
            Err(other) => return Err(format!("lookup failed: {other}")),
        }
    }
    Ok(claims)
}

/// The protocol invariants, read through the adapter's public API.
async fn check_invariants<S: ClaimStore>(store: &S, model: &Tables) -> Result<(), String> {
    let leases = outstanding(store).await?;
    let claims = claims(store).await?;
    for claim in claims.values() {
        if let Some(held) = claim.lease {
            let lease = leases.get(&held.lease_id).ok_or_else(|| {
                format!(
                    "claim {} carries lease {} which is not outstanding",
                    claim.key(),
                    held.lease_id
                )
            })?;
            if lease.cell_id != claim.cell_id {
                return Err(format!(
                    "claim {} of {} is leased by {}",
                    claim.key(),
                    claim.cell_id,
                    lease.cell_id
                ));
            }
        }
    }
    for lease in leases.values() {
        for (op, record) in lease.request.operations() {
            let carried = claims.get(&record.key).and_then(|c| c.lease);
            if carried.map(|l| (l.lease_id, l.op)) != Some((lease.lease_id, op)) {
                return Err(format!(
                    "lease {} should hold {} for {op:?}, but the claim carries {carried:?}",
                    lease.lease_id, record.key
                ));
            }
        }
    }
    let expected: BTreeSet<LeaseId> = model.leases.keys().copied().collect();
    let actual: BTreeSet<LeaseId> = leases.keys().copied().collect();
    if actual != expected {
        return Err(format!(
            "outstanding leases {actual:?}, model has {expected:?}"
        ));
    }
    Ok(())
}

async fn check_final_state<S: ClaimStore>(store: &S, model: &Tables) -> Result<(), String> {
    let actual = store
        .restore_state()
        .await
        .map_err(|e| e.to_string())?
        .map(blank_epoch);
    let expected = model.restore.clone().map(blank_epoch);
    if actual != expected {
        return Err(format!(
            "final restore epoch differs:\nadapter {actual:#?}\nmodel {expected:#?}"
        ));
    }
    let expected: BTreeMap<ClaimKey, Claim> = model
        .claims
        .iter()
        .map(|(k, c)| (k.clone(), blank_claim(c.clone())))
        .collect();
    let actual = claims(store).await?;
    if actual != expected {
        return Err(format!(
            "final claims differ:\nadapter {actual:#?}\nmodel {expected:#?}"
        ));
    }
    let expected: BTreeMap<LeaseId, Lease> = model
        .leases
        .iter()
        .map(|(id, l)| (*id, blank_lease(l.clone())))
        .collect();
    let actual = outstanding(store).await?;
    if actual != expected {
        return Err(format!(
            "final leases differ:\nadapter {actual:#?}\nmodel {expected:#?}"
        ));
    }
    for (n, table) in (0..CELLS).flat_map(|n| [(n, TableName::USERS), (n, TableName::EMAILS)]) {
        // Limit 2 splits every record with three or more claims: the key cursor is compared too.
        let mut cursor_query = ClaimsQuery::new(cell_of(n), table.clone(), ClaimsCursor::at(0), 2);
        loop {
            let actual = store
                .list_claims(&cursor_query)
                .await
                .map_err(|e| e.to_string())?;
            let expected = model.list_claims(&cursor_query);
            let strip = |page: &topology_claims::domain::ClaimsPage| {
                (
                    page.claims
                        .iter()
                        .cloned()
                        .map(blank_claim)
                        .collect::<Vec<_>>(),
                    page.start_range,
                    page.end_range,
                    page.next_cursor.clone(),
                )
            };
            if strip(&actual) != strip(&expected) {
                return Err(format!(
                    "ListClaims page differs for cell-{n} table {table} at cursor {:?}",
                    cursor_query.cursor
                ));
            }
            match actual.next_cursor {
                Some(next) => cursor_query.cursor = next,
                None => break,
            }
        }
    }
    Ok(())
}

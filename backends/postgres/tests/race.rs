//! 32 concurrent clients race BeginUpdate over overlapping claim sets through the real gRPC
//! server backed by PostgreSQL: exactly one owner per claim, only protocol refusals (never an
//! internal or unavailable error), and no deadlock. And BeginUpdates racing a decommission step
//! of their cell: the cell advisory lock lets exactly one side win.
//! Each race runs twice: on the store alone and behind the group-commit combiner.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tokio::sync::Barrier;
use tokio::task::JoinSet;
use tonic::Code;
use topology_claims::{
    BeginUpdate, CellId, ClaimKey, ClaimRecord, ClaimState, ClaimStore, ClaimType, ClaimsError,
    TableName,
};
use topology_claims_postgres::{PostgresClaimStore, PostgresOptions};
use topology_claims_proto::convert::begin_update_to_pb;
use topology_claims_proto::pb::CommitUpdateRequest;
use topology_claims_server::group::{GroupCommit, GroupConfig};
use topology_claims_testkit::fixtures::{cell, record_in};
use topology_claims_testkit::TestServer;

const TASKS: usize = 32;
const CELLS: usize = 4;
const KEYS: usize = 16;

fn claim(round: &str, k: usize) -> ClaimRecord {
    record_in(
        TableName::USERS,
        k as i64,
        ClaimType::Username,
        &format!("{round}-k{k}"),
    )
}

/// Three overlapping keys per task, so most keys are wanted by several tasks at once.
fn keys_of(task: usize) -> BTreeSet<usize> {
    [task % KEYS, (task * 7 + 3) % KEYS, (task * 5 + 1) % KEYS]
        .into_iter()
        .collect()
}

/// What one racing client got.
enum Raced {
    /// Leased (and committed) these claims for this cell.
    Won(CellId, Vec<ClaimKey>),
    /// Refused with a protocol status.
    Refused(Code),
}

async fn race(server: &TestServer, requests: Vec<BeginUpdate>) -> Vec<Raced> {
    let barrier = Arc::new(Barrier::new(requests.len()));
    let mut tasks = JoinSet::new();
    for request in requests {
        let mut client = server.client().await;
        let barrier = Arc::clone(&barrier);
        tasks.spawn(async move {
            barrier.wait().await;
            let keys: Vec<ClaimKey> = request.operations().map(|(_, r)| r.key.clone()).collect();
            match client.begin_update(begin_update_to_pb(&request)).await {
                Ok(response) => {
                    let payload = response
                        .into_inner()
                        .lease_payload
                        .expect("a lease payload");
                    let commit = CommitUpdateRequest {
                        cell_id: request.cell_id.to_string(),
                        lease_id: payload.lease_id,
                    };
                    client
                        .commit_update(commit)
                        .await
                        .expect("commit of a won lease");
                    Raced::Won(request.cell_id.clone(), keys)
                }
                Err(status) => match status.code() {
                    // CLAIM_TAKEN, CLAIM_LEASED, CLAIM_NOT_FOUND: the protocol's answers to a race.
                    code @ (Code::AlreadyExists | Code::FailedPrecondition | Code::NotFound) => {
                        Raced::Refused(code)
                    }
                    _ => panic!("a racing BeginUpdate failed outside the protocol: {status:?}"),
                },
            }
        });
    }
    let mut results = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        results.push(joined.expect("a racing client task"));
    }
    results
}

/// How many clients were refused, by status code.
fn refusals(results: &[Raced]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for result in results {
        if let Raced::Refused(code) = result {
            *counts.entry(format!("{code:?}")).or_default() += 1;
        }
    }
    counts
}

/// Per key, the cells whose lease on it won.
fn winners(results: &[Raced]) -> BTreeMap<ClaimKey, Vec<CellId>> {
    let mut winners: BTreeMap<ClaimKey, Vec<CellId>> = BTreeMap::new();
    for result in results {
        if let Raced::Won(cell_id, keys) = result {
            for key in keys {
                winners
                    .entry(key.clone())
                    .or_default()
                    .push(cell_id.clone());
            }
        }
    }
    winners
}

/// The store the service runs on: the PostgreSQL store itself, or the group-commit combiner in
/// front of it (`serve --group-commit on`), whose groups take every lock of their operations.
/// Two groups at a time (fewer than the pool's connections), so racing calls share groups.
fn service(store: &Arc<PostgresClaimStore>, grouped: bool) -> Arc<dyn ClaimStore> {
    if grouped {
        let config = GroupConfig {
            parallelism: Some(2),
            ..GroupConfig::default()
        };
        Arc::new(GroupCommit::new(
            Arc::clone(store) as Arc<dyn ClaimStore>,
            config,
        ))
    } else {
        Arc::clone(store) as Arc<dyn ClaimStore>
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_begin_updates_through_grpc_leave_exactly_one_owner_per_claim() {
    racing_begin_updates_leave_exactly_one_owner_per_claim(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_begin_updates_through_the_combiner_leave_exactly_one_owner_per_claim() {
    racing_begin_updates_leave_exactly_one_owner_per_claim(true).await;
}

async fn racing_begin_updates_leave_exactly_one_owner_per_claim(grouped: bool) {
    let Some((store, schema)) =
        common::fresh_store_with(|o| PostgresOptions { pool_size: 8, ..o }).await
    else {
        return;
    };
    let store = Arc::new(store);
    let server = TestServer::start(service(&store, grouped)).await;

    // Round 1: creates only.
    let creates: Vec<BeginUpdate> = (0..TASKS)
        .map(|t| BeginUpdate {
            local_transaction: None,
            cell_id: cell(&format!("cell-{}", t % CELLS)),
            lease_id: None,
            creates: keys_of(t).into_iter().map(|k| claim("one", k)).collect(),
            destroys: vec![],
            updates: Vec::new(),
        })
        .collect();
    let results = race(&server, creates).await;
    let won = winners(&results);
    assert!(!won.is_empty(), "some batch must win");
    let refused = refusals(&results);
    assert!(
        refused
            .keys()
            .all(|code| matches!(code.as_str(), "AlreadyExists" | "FailedPrecondition")),
        "creates are refused only as CLAIM_TAKEN or CLAIM_LEASED: {refused:?}"
    );
    assert!(!refused.is_empty(), "overlapping batches must collide");
    let mut owners = BTreeMap::new();
    for k in 0..KEYS {
        let key = claim("one", k).key;
        let cells = won.get(&key).cloned().unwrap_or_default();
        assert!(cells.len() <= 1, "{key} was won by {cells:?}");
        match store.lookup_claim(&key).await {
            Ok(found) => {
                assert_eq!(
                    Some(&found.cell_id),
                    cells.first(),
                    "{key}: owner is the winner"
                );
                assert_eq!(found.state(), ClaimState::Active);
                owners.insert(key, found.cell_id);
            }
            Err(ClaimsError::ClaimNotFound { .. }) => assert!(cells.is_empty(), "{key} lost"),
            Err(e) => panic!("lookup {key}: {e}"),
        }
    }

    // Round 2: every task destroys all round-1 claims of its cell and creates new overlapping
    // ones: destroys race destroys (same cell), creates race creates (all cells).
    let destroys: Vec<BeginUpdate> = (0..TASKS)
        .map(|t| {
            let cell_id = cell(&format!("cell-{}", t % CELLS));
            let mine: Vec<ClaimRecord> = (0..KEYS)
                .map(|k| claim("one", k))
                .filter(|r| owners.get(&r.key) == Some(&cell_id))
                .collect();
            BeginUpdate {
                local_transaction: None,
                cell_id,
                lease_id: None,
                creates: keys_of(t + 1)
                    .into_iter()
                    .map(|k| claim("two", k))
                    .collect(),
                destroys: mine,
                updates: Vec::new(),
            }
        })
        .collect();
    let results = race(&server, destroys).await;
    let won = winners(&results);
    for k in 0..KEYS {
        for round in ["one", "two"] {
            let key = claim(round, k).key;
            let cells = won.get(&key).cloned().unwrap_or_default();
            assert!(cells.len() <= 1, "{key} was leased by {cells:?} at once");
            let present = store.lookup_claim(&key).await.map(|c| c.cell_id);
            match (round, cells.first()) {
                // A destroyed claim is gone; an undestroyed one still belongs to its owner.
                ("one", Some(_)) => assert!(present.is_err(), "{key} destroyed"),
                ("one", None) => assert_eq!(present.ok(), owners.get(&key).cloned(), "{key} kept"),
                (_, winner) => {
                    assert_eq!(present.ok().as_ref(), winner, "{key}: owner is the winner")
                }
            }
        }
    }

    let stats = store.stats();
    println!("race: {stats:?}, round 2 refusals {:?}", refusals(&results));
    assert_eq!(
        stats.deadlocks, 0,
        "lock order prevents deadlocks: {stats:?}"
    );
    server.shutdown().await;
    if let Some(admin) = common::admin().await {
        common::drop_schema(&admin, &schema).await;
    }
}

/// BeginUpdates of one cell racing its first decommission step (READ COMMITTED): the cell lock
/// lets exactly one side win. Either the step is refused for the leases that got in first, or
/// it marks the cell and every BeginUpdate after it is refused; never a lease outstanding in a
/// decommissioned cell.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_decommission_step_racing_begin_updates_never_leaves_a_lease_in_a_decommissioned_cell() {
    decommission_step_racing_begin_updates(false).await;
}

/// The same race with the BeginUpdates in groups: a group's shared cell locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_decommission_step_racing_grouped_begin_updates_never_leaves_a_lease_in_a_decommissioned_cell(
) {
    decommission_step_racing_begin_updates(true).await;
}

async fn decommission_step_racing_begin_updates(grouped: bool) {
    const ROUNDS: usize = 12;
    const BEGINS: usize = 6;
    let Some((pg, schema)) =
        common::fresh_store_with(|o| PostgresOptions { pool_size: 8, ..o }).await
    else {
        return;
    };
    let store = service(&Arc::new(pg), grouped);
    let mut stepped = 0;
    for round in 0..ROUNDS {
        let doomed = cell(&format!("doomed-{round}"));
        let barrier = Arc::new(Barrier::new(BEGINS + 1));
        let mut begins = JoinSet::new();
        for b in 0..BEGINS {
            let (store, barrier, doomed) =
                (Arc::clone(&store), Arc::clone(&barrier), doomed.clone());
            begins.spawn(async move {
                let request = BeginUpdate {
                    local_transaction: None,
                    cell_id: doomed,
                    lease_id: None,
                    creates: vec![claim(&format!("dc{round}"), b)],
                    destroys: vec![],
                    updates: Vec::new(),
                };
                barrier.wait().await;
                store.begin_update(request).await
            });
        }
        let step = {
            let (store, doomed) = (Arc::clone(&store), doomed.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                store.decommission_step(&doomed, 100, false).await
            })
        };
        let mut leased = 0u64;
        while let Some(begun) = begins.join_next().await {
            match begun.expect("task") {
                Ok(_) => leased += 1,
                Err(ClaimsError::CellDecommissioned { .. }) => {}
                Err(other) => panic!("round {round}: BeginUpdate failed: {other}"),
            }
        }
        let outstanding = store
            .lease_summary()
            .await
            .unwrap()
            .cells
            .into_iter()
            .find(|c| c.cell_id == doomed)
            .map_or(0, |c| c.outstanding);
        assert_eq!(
            outstanding, leased,
            "round {round}: every lease that began is outstanding"
        );
        match step.await.expect("task") {
            Ok(step) => {
                stepped += 1;
                assert!(!step.already_decommissioned);
                assert_eq!(
                    leased, 0,
                    "round {round}: a lease began in a decommissioned cell"
                );
            }
            Err(ClaimsError::CellHasOutstandingLeases { outstanding, .. }) => {
                assert!(
                    outstanding >= 1 && outstanding <= leased,
                    "round {round}: refused for {outstanding} of {leased}"
                );
            }
            Err(other) => panic!("round {round}: decommission step failed: {other}"),
        }
    }
    tracing::info!(stepped, "decommission steps that won their race");
    if let Some(admin) = common::admin().await {
        common::drop_schema(&admin, &schema).await;
    }
}

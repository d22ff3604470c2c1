//! Group commit on PostgreSQL: a group of any size is one transaction of a fixed number of
//! statements in two round trips, decided one operation at a time; and random concurrent
//! BeginUpdate / CommitUpdate / RollbackUpdate calls through the combiner leave the store
//! consistent. (The cross-backend concurrent model test lives in the core's testing suite; this
//! is the smoke test of the PostgreSQL statements.)

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use tokio::sync::Barrier;
use tokio::task::JoinSet;
use topology_claims::domain::{GroupAnswer, GroupOp, GroupResults};
use topology_claims::{
    BeginUpdate, CellId, ClaimRecord, ClaimStore, ClaimType, ClaimsError, LeaseId, TableName,
};
use topology_claims_postgres::{PostgresClaimStore, PostgresOptions};
use topology_claims_server::group::{GroupCommit, GroupConfig};
use topology_claims_testkit::fixtures::{cell, creates, destroys, moved, record_in, username};

fn begin(request: BeginUpdate, n: u128) -> GroupOp {
    GroupOp::Begin {
        request,
        lease_id: topology_claims_testkit::fixtures::lease_id(n),
    }
}

async fn run_group(store: &PostgresClaimStore, ops: &[GroupOp]) -> (GroupResults, u64) {
    let before = store.round_trips();
    let results = store.run_group(ops).await.expect("the group commits");
    (results, store.round_trips() - before)
}

#[tokio::test]
async fn a_group_of_any_size_takes_two_round_trips_and_decides_each_operation_alone() {
    // One pooled connection: statements are prepared by the first group only.
    let Some((store, schema)) =
        common::fresh_store_with(|o| PostgresOptions { pool_size: 1, ..o }).await
    else {
        return;
    };
    assert_eq!(store.group_parallelism(), 1);
    let (a, b) = (cell("cell-a"), cell("cell-b"));

    // A refusal in the middle aborts nothing; a begin and its commit in one group commit the
    // claim without ever writing the lease.
    let warm = [
        begin(creates(&a, &[username("x"), username("moving")]), 1),
        begin(creates(&b, &[username("x")]), 2),
        GroupOp::Commit {
            cell_id: a.clone(),
            lease_id: topology_claims_testkit::fixtures::lease_id(1),
        },
    ];
    let (results, _) = run_group(&store, &warm).await;
    assert!(matches!(results[0], Ok(GroupAnswer::Begun(_))));
    assert_eq!(
        results[1],
        Err(ClaimsError::ClaimLeased {
            claim: username("x").key
        })
    );
    assert_eq!(results[2], Ok(GroupAnswer::Ended));
    let x = store.lookup_claim(&username("x").key).await.unwrap();
    assert!(x.lease.is_none() && x.cell_id == a, "{x:?}");

    // 40 operations of every kind (inserts, deletes, updates of claims; inserts and deletes of
    // leases; outcomes): still two round trips.
    let mut ops = Vec::new();
    for n in 0..30 {
        ops.push(begin(
            creates(&a, &[username(&format!("new-{n}"))]),
            100 + n,
        ));
    }
    ops.push(begin(destroys(&a, &[username("x")]), 200));
    let update = moved(&username("moving"), "p", TableName::PROJECTS, 7);
    ops.push(begin(
        BeginUpdate {
            updates: vec![update.clone()],
            ..creates(&a, &[username("other")])
        },
        201,
    ));
    for n in 0..4 {
        let lease_id = topology_claims_testkit::fixtures::lease_id(100 + n);
        ops.push(GroupOp::Commit {
            cell_id: a.clone(),
            lease_id,
        });
        ops.push(GroupOp::Rollback {
            cell_id: a.clone(),
            lease_id: topology_claims_testkit::fixtures::lease_id(110 + n),
            unrenewed_for: None,
        });
    }
    let (results, trips) = run_group(&store, &ops).await;
    assert_eq!(trips, 2, "a group of {} operations", ops.len());
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    // The update of a claim leased in the same group, committed in a later group.
    let (results, trips) = run_group(
        &store,
        &[
            GroupOp::Commit {
                cell_id: a.clone(),
                lease_id: topology_claims_testkit::fixtures::lease_id(201),
            },
            GroupOp::Commit {
                cell_id: a.clone(),
                lease_id: topology_claims_testkit::fixtures::lease_id(200),
            },
        ],
    )
    .await;
    assert_eq!(trips, 2);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let moved_claim = store.lookup_claim(&update.key).await.unwrap();
    assert_eq!(moved_claim.record, update);
    assert!(moved_claim.lease.is_none());
    assert!(matches!(
        store.lookup_claim(&username("x").key).await,
        Err(ClaimsError::ClaimNotFound { .. })
    ));

    // Nothing to write (refused, replayed, already done): one round trip, no COMMIT.
    let (results, trips) = run_group(
        &store,
        &[
            begin(creates(&b, &[username("other")]), 300),
            begin(creates(&a, &[username("new-5")]), 105),
            GroupOp::Commit {
                cell_id: a.clone(),
                lease_id: topology_claims_testkit::fixtures::lease_id(100),
            },
            GroupOp::Rollback {
                cell_id: a.clone(),
                lease_id: topology_claims_testkit::fixtures::lease_id(100),
                unrenewed_for: None,
            },
        ],
    )
    .await;
    assert_eq!(trips, 1);
    assert!(matches!(results[0], Err(ClaimsError::ClaimTaken { .. })));
    assert!(
        matches!(results[1], Ok(GroupAnswer::Begun(_))),
        "replayed: {results:?}"
    );
    assert_eq!(results[2], Ok(GroupAnswer::Ended));
    assert!(matches!(
        results[3],
        Err(ClaimsError::LeaseCommitted { .. })
    ));
    if let Some(admin) = common::admin().await {
        common::drop_schema(&admin, &schema).await;
    }
}

const TASKS: usize = 40;
const OPS_PER_TASK: usize = 5;
const KEYS: usize = 8;
const GROUP_MAX: usize = 8;

fn key_record(k: usize, record_id: i64) -> ClaimRecord {
    record_in(
        TableName::USERS,
        record_id,
        ClaimType::Username,
        &format!("k{k}"),
    )
}

/// A random BeginUpdate of one or two of the keys: creates, destroys or updates.
fn random_begin(rng: &mut fastrand::Rng, cells: &[CellId]) -> BeginUpdate {
    let cell_id = cells[rng.usize(..cells.len())].clone();
    let mut keys: Vec<usize> = (0..rng.usize(1..=2)).map(|_| rng.usize(..KEYS)).collect();
    keys.sort_unstable();
    keys.dedup();
    let records: Vec<ClaimRecord> = keys
        .iter()
        .map(|&k| key_record(k, rng.i64(1..1000)))
        .collect();
    match rng.u8(..4) {
        0 | 1 => creates(&cell_id, &records),
        2 => destroys(&cell_id, &records),
        _ => BeginUpdate {
            updates: records,
            ..creates(&cell_id, &[])
        },
    }
}

/// Errors a racing client may get: the protocol's refusals, never a store failure.
fn is_refusal(error: &ClaimsError) -> bool {
    !matches!(
        error,
        ClaimsError::Internal { .. } | ClaimsError::Unavailable { .. }
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_concurrent_operations_through_the_combiner_keep_the_store_consistent() {
    let Some((store, schema)) = common::fresh_store().await else {
        return;
    };
    let store = Arc::new(store);
    // Small groups, so several multi-operation groups over the same keys run at once (each on
    // its own connection) and contend for locks and inserts.
    let config = GroupConfig {
        max: GROUP_MAX,
        parallelism: None,
        lone_direct: false,
        ..GroupConfig::default()
    };
    let group = GroupCommit::new(store.clone(), config);
    assert_eq!(group.parallelism(), common::options(&schema).pool_size);
    let cells = [cell("cell-a"), cell("cell-b")];
    let seed = fastrand::u64(..);
    println!("seed {seed}");
    let begun: Arc<Mutex<Vec<(CellId, LeaseId)>>> = Arc::default();
    let barrier = Arc::new(Barrier::new(TASKS));
    let mut tasks = JoinSet::new();
    for task in 0..TASKS {
        let (group, cells, begun, barrier) =
            (group.clone(), cells.clone(), begun.clone(), barrier.clone());
        tasks.spawn(async move {
            let mut rng = fastrand::Rng::with_seed(seed ^ task as u64);
            let mut failures = Vec::new();
            for _ in 0..OPS_PER_TASK {
                // Every task's next operation at once: a burst the combiner cuts into groups.
                barrier.wait().await;
                let known = {
                    let begun = begun.lock().unwrap();
                    (!begun.is_empty()).then(|| begun[rng.usize(..begun.len())].clone())
                };
                let (cell_id, lease_id) =
                    known.unwrap_or_else(|| (cells[0].clone(), LeaseId::generate()));
                let result = match rng.u8(..4) {
                    0 | 1 => match group.begin_update(random_begin(&mut rng, &cells)).await {
                        Ok(lease) => {
                            begun.lock().unwrap().push((lease.cell_id, lease.lease_id));
                            Ok(())
                        }
                        Err(e) => Err(e),
                    },
                    2 => group.commit_update(&cell_id, lease_id).await,
                    _ => group.rollback_update(&cell_id, lease_id, None).await,
                };
                if let Err(e) = result {
                    if !is_refusal(&e) {
                        failures.push(e);
                    }
                }
            }
            failures
        });
    }
    let failures: Vec<ClaimsError> = tasks.join_all().await.into_iter().flatten().collect();
    assert!(failures.is_empty(), "store failures: {failures:?}");

    let stats = group.stats();
    let batched: u64 = stats
        .size_distribution()
        .iter()
        .skip(1)
        .map(|(_, n)| n)
        .sum();
    println!(
        "groups {:?}, store {:?}",
        stats.size_distribution(),
        store.stats()
    );
    assert!(batched > 0, "no group of more than one operation formed");

    // The invariants, read straight from the tables.
    let admin = common::admin().await.expect("the server is there");
    let q = |table: &str| format!("SELECT * FROM \"{schema}\".{table}");
    let claims = admin
        .query(
            &format!("SELECT claim_value, cell_id, lease_id, lease_op FROM \"{schema}\".claims"),
            &[],
        )
        .await
        .unwrap();
    let leases = admin
        .query(
            &format!("SELECT lease_id, cell_id FROM \"{schema}\".leases"),
            &[],
        )
        .await
        .unwrap();
    let outcomes = admin.query(&q("lease_outcomes"), &[]).await.unwrap();
    let lease_cells: BTreeMap<uuid::Uuid, String> = leases
        .iter()
        .map(|r| (r.get::<_, uuid::Uuid>(0), r.get::<_, String>(1)))
        .collect();
    let ended: BTreeSet<uuid::Uuid> = outcomes.iter().map(|r| r.get(0)).collect();
    assert!(
        lease_cells.keys().all(|id| !ended.contains(id)),
        "a lease both outstanding and ended"
    );
    let mut carried: BTreeMap<uuid::Uuid, BTreeSet<String>> = BTreeMap::new();
    for row in &claims {
        let (value, cell_id): (String, String) = (row.get(0), row.get(1));
        if let Some(lease_id) = row.get::<_, Option<uuid::Uuid>>(2) {
            assert_eq!(
                lease_cells.get(&lease_id),
                Some(&cell_id),
                "claim {value} carries lease {lease_id}, which is not an outstanding lease of its cell"
            );
            carried.entry(lease_id).or_default().insert(value);
        }
    }
    // Every outstanding lease carries exactly the keys of its request: no key is named by two
    // outstanding leases, and none lost its lease marker.
    let mut owner_of: BTreeMap<String, LeaseId> = BTreeMap::new();
    for cell_id in &cells {
        let page = store
            .list_outstanding_leases(&topology_claims::LeasesQuery {
                cell_id: cell_id.clone(),
                after: None,
                limit: 1000,
                max_bytes: usize::MAX,
            })
            .await
            .unwrap();
        for lease in page.leases {
            let keys: BTreeSet<String> = lease
                .request
                .operations()
                .map(|(_, r)| r.key.value.clone())
                .collect();
            for key in &keys {
                if let Some(other) = owner_of.insert(key.clone(), lease.lease_id) {
                    panic!("{key} is named by leases {other} and {}", lease.lease_id);
                }
            }
            assert_eq!(
                carried.get(lease.lease_id.as_uuid()),
                Some(&keys),
                "lease {}",
                lease.lease_id
            );
        }
    }
    assert_eq!(carried.len(), lease_cells.len());
    common::drop_schema(&admin, &schema).await;
}

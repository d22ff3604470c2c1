//! What is particular to the Spanner store's group commit (`run_group`) beyond the shared suite:
//! a group decided operation by operation in one transaction, stamped with its commit
//! timestamp; a group too large for one commit split in order; and many concurrent operations
//! through the combiner over a few keys, after which the tables are consistent.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use topology_claims::domain::{GroupAnswer, GroupOp};
use topology_claims::group::{GroupCommit, GroupConfig};
use topology_claims::testing::fixtures::{
    cell, creates, destroys, lease_id, moved, updates, username,
};
use topology_claims::{
    BeginUpdate, CellId, ClaimStore, ClaimsError, Lease, LeaseId, LeaseOp, LeasesQuery, TableName,
};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

fn begin(request: BeginUpdate, id: LeaseId) -> GroupOp {
    GroupOp::Begin {
        request,
        lease_id: id,
    }
}

fn begun(answer: &Result<GroupAnswer, ClaimsError>) -> Lease {
    match answer {
        Ok(GroupAnswer::Begun(lease)) => lease.clone(),
        other => panic!("expected a lease, got {other:?}"),
    }
}

/// Every outstanding lease of `cell_id`.
async fn outstanding(store: &impl ClaimStore, cell_id: &CellId) -> Vec<Lease> {
    let page = store
        .list_outstanding_leases(&LeasesQuery::new(cell_id.clone(), None, 1000))
        .await
        .expect("list_outstanding_leases");
    assert!(page.next_cursor.is_none(), "one page holds them all");
    page.leases
}

#[test]
fn a_group_is_decided_op_by_op_and_stamped_with_its_commit_timestamp() {
    runtime().block_on(async {
        let store = common::fresh_store(common::Mode::Plain).await;
        let (a, b) = (cell("cell-a"), cell("cell-b"));
        let (k, j) = (username("grouped-k"), username("grouped-j"));
        let ops = [
            begin(creates(&a, &[k.clone()]), lease_id(1)),
            begin(creates(&b, &[k.clone()]), lease_id(2)),
            GroupOp::Commit {
                cell_id: a.clone(),
                lease_id: lease_id(1),
            },
            begin(creates(&b, &[j.clone()]), lease_id(3)),
            GroupOp::Rollback {
                cell_id: b.clone(),
                lease_id: lease_id(4),
            },
        ];
        let results = store.run_group(&ops).await.expect("the group commits");
        assert_eq!(results.len(), ops.len());
        let first = begun(&results[0]);
        assert_eq!(
            results[1],
            Err(ClaimsError::ClaimLeased {
                claim: k.key.clone()
            }),
            "the second create sees the first one's lease"
        );
        assert_eq!(results[2], Ok(GroupAnswer::Ended));
        let third = begun(&results[3]);
        assert_eq!(
            results[4],
            Ok(GroupAnswer::Ended),
            "an unknown lease's rollback is remembered"
        );

        // One commit: everything written carries its timestamp, and the answers say so.
        assert_eq!(first.created_at, third.created_at);
        assert_eq!(first.created_at, first.last_renewed_at);
        let claim = store.lookup_claim(&k.key).await.unwrap();
        assert_eq!((claim.cell_id.clone(), claim.lease), (a.clone(), None));
        assert_eq!(claim.created_at, first.created_at);
        assert_eq!(claim.updated_at, first.created_at);
        assert_eq!(outstanding(&store, &b).await, vec![third.clone()]);
        assert!(outstanding(&store, &a).await.is_empty());
        let leased = store.lookup_claim(&j.key).await.unwrap();
        assert_eq!(leased.created_at, third.created_at);

        // Replays and the remembered outcomes, in a second group.
        let again = store
            .run_group(&[
                begin(creates(&b, &[j.clone()]), lease_id(3)),
                GroupOp::Commit {
                    cell_id: a.clone(),
                    lease_id: lease_id(1),
                },
                GroupOp::Commit {
                    cell_id: b.clone(),
                    lease_id: lease_id(4),
                },
            ])
            .await
            .unwrap();
        assert_eq!(begun(&again[0]), third, "a replay answers the stored lease");
        assert_eq!(again[1], Ok(GroupAnswer::Ended));
        assert!(
            again[2].is_err(),
            "a rolled-back lease does not commit: {:?}",
            again[2]
        );
        store.close().await;
    });
}

#[test]
fn updates_and_destroys_in_one_group_rewrite_whole_rows() {
    runtime().block_on(async {
        let store = common::fresh_store(common::Mode::Plain).await;
        let a = cell("cell-a");
        let (k, j) = (username("whole-k"), username("whole-j"));
        let setup = store
            .run_group(&[
                begin(creates(&a, &[k.clone(), j.clone()]), lease_id(1)),
                GroupOp::Commit {
                    cell_id: a.clone(),
                    lease_id: lease_id(1),
                },
            ])
            .await
            .unwrap();
        let created = begun(&setup[0]).created_at;
        let new_k = moved(&k, "project-7", TableName::Routes, 7);
        let results = store
            .run_group(&[
                begin(updates(&a, &[new_k.clone()]), lease_id(2)),
                begin(destroys(&a, &[j.clone()]), lease_id(3)),
                GroupOp::Commit {
                    cell_id: a.clone(),
                    lease_id: lease_id(2),
                },
                GroupOp::Commit {
                    cell_id: a.clone(),
                    lease_id: lease_id(3),
                },
                // Created again by another cell, in the same group: the row is rewritten whole.
                begin(creates(&cell("cell-b"), &[j.clone()]), lease_id(4)),
            ])
            .await
            .unwrap();
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        let updated_at = begun(&results[0]).created_at;
        let claim = store.lookup_claim(&k.key).await.unwrap();
        assert_eq!(claim.record, new_k);
        assert_eq!(claim.lease, None);
        assert_eq!(
            claim.created_at, created,
            "an update keeps the creation time"
        );
        assert_eq!(claim.updated_at, updated_at);
        let again = store.lookup_claim(&j.key).await.unwrap();
        assert_eq!(again.cell_id, cell("cell-b"));
        assert_eq!(
            again.lease.map(|l| (l.lease_id, l.op)),
            Some((lease_id(4), LeaseOp::Create))
        );
        assert_eq!(again.created_at, updated_at, "created again by this group");
        store.close().await;
    });
}

#[test]
fn a_group_too_large_for_one_commit_is_split_in_order() {
    runtime().block_on(async {
        let store = common::fresh_store(common::Mode::Plain).await;
        let a = cell("cell-a");
        let batch = |n: usize| -> Vec<_> {
            (0..1000)
                .map(|i| username(&format!("bulk-{n}-{i:04}")))
                .collect()
        };
        let mut ops = Vec::new();
        for n in 0..4 {
            ops.push(begin(creates(&a, &batch(n)), lease_id(n as u128 + 1)));
        }
        // Touches the first batch again: must see it begun, whichever part it ends up in.
        ops.push(begin(destroys(&a, &batch(0)[..1]), lease_id(9)));
        ops.push(GroupOp::Commit {
            cell_id: a.clone(),
            lease_id: lease_id(4),
        });
        let results = store.run_group(&ops).await.expect("the group commits");
        let leases: Vec<Lease> = results[..4].iter().map(begun).collect();
        assert!(
            leases[0].created_at < leases[3].created_at,
            "more than one commit: {:?} .. {:?}",
            leases[0].created_at,
            leases[3].created_at
        );
        assert_eq!(
            results[4],
            Err(ClaimsError::ClaimLeased {
                claim: batch(0)[0].key.clone()
            })
        );
        assert_eq!(results[5], Ok(GroupAnswer::Ended));
        let last = store.lookup_claim(&batch(3)[999].key).await.unwrap();
        assert_eq!(last.lease, None);
        assert_eq!(outstanding(&store, &a).await.len(), 3);
        store.close().await;
    });
}

/// One task's script: a begin of a few of the keys, then (mostly) its commit or rollback.
#[derive(Clone, Debug)]
struct Script {
    cell: CellId,
    request: BeginUpdate,
    end: Option<bool>,
}

#[test]
fn concurrent_operations_through_the_combiner_form_groups_and_keep_the_tables_consistent() {
    runtime().block_on(async {
        let store = common::fresh_store(common::Mode::Plain).await;
        let combiner = GroupCommit::new(Arc::new(store), GroupConfig::default());
        let keys: Vec<_> = (0..6).map(|i| username(&format!("hot-{i}"))).collect();
        let cells = [cell("cell-a"), cell("cell-b"), cell("cell-c")];
        let mut rng = fastrand::Rng::with_seed(17);
        let scripts: Vec<Script> = (0..32)
            .map(|_| {
                let cell = cells[rng.usize(..cells.len())].clone();
                let mut chosen = BTreeSet::new();
                for _ in 0..rng.usize(1..=2) {
                    chosen.insert(rng.usize(..keys.len()));
                }
                let records: Vec<_> = chosen.iter().map(|&i| keys[i].clone()).collect();
                let request = match rng.usize(..3) {
                    0 => creates(&cell, &records),
                    1 => destroys(&cell, &records),
                    _ => updates(
                        &cell,
                        &records
                            .iter()
                            .map(|r| moved(r, "p", TableName::Routes, rng.i64(1..9)))
                            .collect::<Vec<_>>(),
                    ),
                };
                let end = match rng.usize(..4) {
                    0 => None,
                    n => Some(n < 3),
                };
                Script { cell, request, end }
            })
            .collect();
        // A first round makes claims to destroy and update.
        for cell in &cells {
            let lease = combiner.begin_update(creates(cell, &keys[..2])).await;
            if let Ok(lease) = lease {
                combiner.commit_update(cell, lease.lease_id).await.unwrap();
            }
        }
        let before = combiner
            .stats()
            .operations
            .load(std::sync::atomic::Ordering::Relaxed);
        let tasks: Vec<_> = scripts
            .iter()
            .cloned()
            .map(|script| {
                let combiner = combiner.clone();
                tokio::spawn(async move {
                    let lease = match combiner.begin_update(script.request.clone()).await {
                        Ok(lease) => lease,
                        Err(refusal) => {
                            assert!(
                                matches!(
                                    refusal,
                                    ClaimsError::ClaimTaken { .. }
                                        | ClaimsError::ClaimLeased { .. }
                                        | ClaimsError::ClaimNotFound { .. }
                                        | ClaimsError::NotClaimOwner { .. }
                                ),
                                "a refusal of the protocol, not of the store: {refusal:?}"
                            );
                            return (None, None);
                        }
                    };
                    let ended = match script.end {
                        None => None,
                        Some(commit) => {
                            let ended = if commit {
                                combiner.commit_update(&script.cell, lease.lease_id).await
                            } else {
                                combiner.rollback_update(&script.cell, lease.lease_id).await
                            };
                            ended.expect("the lease's own end succeeds");
                            Some(commit)
                        }
                    };
                    (Some(lease), ended)
                })
            })
            .collect();
        let mut open: BTreeMap<LeaseId, Lease> = BTreeMap::new();
        let mut ended = BTreeMap::new();
        for task in tasks {
            match task.await.expect("no task panics") {
                (Some(lease), None) => {
                    open.insert(lease.lease_id, lease);
                }
                (Some(lease), Some(commit)) => {
                    ended.insert(lease.lease_id, (lease.cell_id, commit));
                }
                (None, _) => {}
            }
        }

        let stats = combiner.stats();
        let operations = stats.operations.load(std::sync::atomic::Ordering::Relaxed) - before;
        assert!(
            operations >= 32,
            "every begin went through the combiner: {operations}"
        );
        let grouped: u64 = stats
            .size_distribution()
            .iter()
            .filter(|(bound, _)| *bound > 1)
            .map(|(_, n)| n)
            .sum();
        assert!(
            grouped > 0,
            "groups of more than one formed: {:?}",
            stats.size_distribution()
        );

        // The outstanding leases are exactly the ones begun and not ended, as answered.
        let mut listed = BTreeMap::new();
        for cell in &cells {
            for lease in outstanding(&combiner, cell).await {
                listed.insert(lease.lease_id, lease);
            }
        }
        assert_eq!(
            listed, open,
            "outstanding leases, with their answered timestamps"
        );
        // Every open lease holds each claim of its request; no claim carries any other lease.
        let mut holders = BTreeMap::new();
        for lease in open.values() {
            for (op, record) in lease.request.operations() {
                holders.insert(record.key.clone(), (lease.lease_id, op));
            }
        }
        for record in &keys {
            match combiner.lookup_claim(&record.key).await {
                Ok(claim) => assert_eq!(
                    claim.lease.map(|l| (l.lease_id, l.op)),
                    holders.get(&record.key).copied(),
                    "{claim:?}"
                ),
                Err(ClaimsError::ClaimNotFound { .. }) => {
                    assert!(
                        !holders.contains_key(&record.key),
                        "{:?} lost its claim",
                        record.key
                    )
                }
                Err(other) => panic!("{other}"),
            }
        }
        // Outcomes are remembered: ending again answers the same.
        for (id, (cell_id, commit)) in &ended {
            let again = if *commit {
                combiner.commit_update(cell_id, *id).await
            } else {
                combiner.rollback_update(cell_id, *id).await
            };
            assert_eq!(again, Ok(()), "ending {id} again");
        }
    });
}

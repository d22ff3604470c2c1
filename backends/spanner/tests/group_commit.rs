//! What is particular to the Spanner store's group commit (`run_group`) beyond the shared suite:
//! a group decided operation by operation in one transaction, stamped with its commit
//! timestamp; a group too large for one commit split in order; a large commit given time by its
//! rows beyond the RPC timeout (decision 074); and many concurrent operations through the
//! combiner over a few keys, after which the tables are consistent.

mod common;

use std::time::{Duration, Instant};

use topology_claims::domain::{GroupAnswer, GroupOp};
use topology_claims::{
    BeginUpdate, ClaimStore, ClaimsError, Lease, LeaseId, LeaseOp, MigrationPolicy, TableName,
};
use topology_claims_spanner::{SpannerClaimStore, SpannerOptions};
use topology_claims_testkit::fixtures::{
    cell, creates, destroys, lease_id, moved, updates, username,
};
use topology_claims_testkit::run_async;

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

#[test]
fn a_group_is_decided_op_by_op_and_stamped_with_its_commit_timestamp() {
    run_async(async {
        let store = common::fresh_store(common::Mode::Plain).await;
        let (a, b) = (cell("cell-a"), cell("cell-b"));
        let (k, j) = (username("grouped-k"), username("grouped-j"));
        let ops = [
            begin(creates(&a, std::slice::from_ref(&k)), lease_id(1)),
            begin(creates(&b, std::slice::from_ref(&k)), lease_id(2)),
            GroupOp::Commit {
                cell_id: a.clone(),
                lease_id: lease_id(1),
            },
            begin(creates(&b, std::slice::from_ref(&j)), lease_id(3)),
            GroupOp::Rollback {
                cell_id: b.clone(),
                lease_id: lease_id(4),
                unrenewed_for: None,
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
        assert_eq!(
            common::concurrent::outstanding(&store, &b).await,
            vec![third.clone()]
        );
        assert!(common::concurrent::outstanding(&store, &a).await.is_empty());
        let leased = store.lookup_claim(&j.key).await.unwrap();
        assert_eq!(leased.created_at, third.created_at);

        // Replays and the remembered outcomes, in a second group.
        let again = store
            .run_group(&[
                begin(creates(&b, std::slice::from_ref(&j)), lease_id(3)),
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
    run_async(async {
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
        let new_k = moved(&k, "project-7", TableName::ROUTES, 7);
        let results = store
            .run_group(&[
                begin(updates(&a, std::slice::from_ref(&new_k)), lease_id(2)),
                begin(destroys(&a, std::slice::from_ref(&j)), lease_id(3)),
                GroupOp::Commit {
                    cell_id: a.clone(),
                    lease_id: lease_id(2),
                },
                GroupOp::Commit {
                    cell_id: a.clone(),
                    lease_id: lease_id(3),
                },
                // Created again by another cell, in the same group: the row is rewritten whole.
                begin(
                    creates(&cell("cell-b"), std::slice::from_ref(&j)),
                    lease_id(4),
                ),
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
    run_async(async {
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
        assert_eq!(common::concurrent::outstanding(&store, &a).await.len(), 3);
        store.close().await;
    });
}

#[test]
fn a_large_commit_gets_time_for_its_rows_beyond_the_rpc_timeout() {
    run_async(async {
        // An emulator of its own: no other test's transaction competes with the 1 s bound.
        let emulator = common::start(common::Mode::Plain);
        let url = common::fresh_url();
        topology_claims_spanner::migrate(&url, common::options(&emulator), true)
            .await
            .unwrap();
        // Every call but the commit is held to 1 s. The commit of 2,000 rows (the most one
        // group writes, GROUP_MAX_ROWS; with their 1,998 change feed events) takes seconds on
        // the emulator (about 3 s on a 2-core machine), more than the RPC timeout, and gets
        // 1 s + 3,998 × 10 ms.
        let options = SpannerOptions {
            rpc_timeout: Duration::from_secs(1),
            commit_time_per_row: Duration::from_millis(10),
            ..common::options(&emulator)
        };
        let store = SpannerClaimStore::connect(&url, options, MigrationPolicy::Refuse)
            .await
            .unwrap();
        let a = cell("cell-a");
        let ops: Vec<GroupOp> = (0..2u128)
            .map(|n| {
                let names: Vec<_> = (0..999)
                    .map(|i| username(&format!("large-{n}-{i:04}")))
                    .collect();
                begin(creates(&a, &names), lease_id(n + 1))
            })
            .collect();
        let started = Instant::now();
        let results = store.run_group(&ops).await.expect("the group commits");
        println!("one commit of 2,000 rows took {:?}", started.elapsed());
        let leases: Vec<Lease> = results.iter().map(begun).collect();
        assert_eq!(
            leases[0].created_at, leases[1].created_at,
            "one commit, not split"
        );
        assert_eq!(common::concurrent::outstanding(&store, &a).await.len(), 2);
        store.close().await;
    });
}

#[test]
fn concurrent_operations_through_the_combiner_form_groups_and_keep_the_tables_consistent() {
    run_async(async {
        let store = common::fresh_store(common::Mode::Plain).await;
        // Every call through `run_group`, lone ones too (`grouped`).
        let (combiner, ()) = topology_claims_testkit::grouped((store, ()));
        common::concurrent::random_operations(&combiner, 17).await;
    });
}

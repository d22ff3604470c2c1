//! The concurrent smoke test of the Spanner store's group commit, shared by the plain and the
//! fault-injection test binaries.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

use topology_claims::group::GroupCommit;
use topology_claims::testing::fixtures::{cell, creates, destroys, moved, updates, username};
use topology_claims::{
    BeginUpdate, CellId, ClaimStore, ClaimsError, Lease, LeaseId, LeasesQuery, TableName,
};

/// Every outstanding lease of `cell_id`.
pub async fn outstanding(store: &impl ClaimStore, cell_id: &CellId) -> Vec<Lease> {
    let page = store
        .list_outstanding_leases(&LeasesQuery::new(cell_id.clone(), None, 1000))
        .await
        .expect("list_outstanding_leases");
    assert!(page.next_cursor.is_none(), "one page holds them all");
    page.leases
}

/// One task's script: a begin of a few of the keys, then (mostly) its commit or rollback.
#[derive(Clone, Debug)]
struct Script {
    cell: CellId,
    request: BeginUpdate,
    end: Option<bool>,
}

/// Fires 32 tasks at once, each a random BeginUpdate of one or two of 6 keys by one of 3
/// cells and (mostly) its commit or rollback, through `combiner`; then checks that groups of
/// more than one formed and the tables are consistent: the outstanding leases are exactly those
/// begun and not ended (with the timestamps their BeginUpdate answered), each holds every claim
/// of its request, no claim carries another lease, and every ended lease's outcome is remembered.
pub async fn random_operations(combiner: &GroupCommit, seed: u64) {
    {
        let keys: Vec<_> = (0..6).map(|i| username(&format!("hot-{i}"))).collect();
        let cells = [cell("cell-a"), cell("cell-b"), cell("cell-c")];
        let mut rng = fastrand::Rng::with_seed(seed);
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
        let before = combiner.stats().operations.load(Ordering::Relaxed);
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
        let operations = stats.operations.load(Ordering::Relaxed) - before;
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
            for lease in outstanding(combiner, cell).await {
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
    }
}

//! The concurrent smoke test of the Spanner store's group commit, shared by the plain and the
//! fault-injection test binaries.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use topology_claims::{
    BeginUpdate, CellId, ClaimRecord, ClaimStore, ClaimsError, Lease, LeaseId, LeasesQuery,
    TableName,
};
use topology_claims_server::group::GroupCommit;
use topology_claims_testkit::fixtures::{cell, creates, destroys, moved, updates, username};

/// Every outstanding lease of `cell_id`.
pub async fn outstanding(store: &impl ClaimStore, cell_id: &CellId) -> Vec<Lease> {
    let page = store
        .list_outstanding_leases(&LeasesQuery::new(cell_id.clone(), None, 1000))
        .await
        .expect("list_outstanding_leases");
    assert!(page.next_cursor.is_none(), "one page holds them all");
    page.leases
}

/// A random BeginUpdate by `cell` of one or two of `keys`: creates, destroys or updates.
fn random_request(rng: &mut fastrand::Rng, cell: &CellId, keys: &[ClaimRecord]) -> BeginUpdate {
    let mut chosen = BTreeSet::new();
    for _ in 0..rng.usize(1..=2) {
        chosen.insert(rng.usize(..keys.len()));
    }
    let records: Vec<_> = chosen.iter().map(|&i| keys[i].clone()).collect();
    match rng.usize(..3) {
        0 => creates(cell, &records),
        1 => destroys(cell, &records),
        _ => {
            let moved: Vec<_> = records
                .iter()
                .map(|r| moved(r, "p", TableName::ROUTES, rng.i64(1..9)))
                .collect();
            updates(cell, &moved)
        }
    }
}

/// How one begun lease ended in the history: `None` still open, else committed or not.
type Ended = Option<bool>;

/// Fires 16 tasks at once, each up to 4 rounds of a random BeginUpdate of one or two of 6 keys
/// by one of 3 cells, then (mostly) its commit or rollback, all through `combiner`; then checks
/// that groups of more than one formed and the tables are consistent: the outstanding leases
/// are exactly those begun and not ended (with the timestamps their BeginUpdate answered), each
/// holds every claim of its request, no claim carries another lease, and every ended lease's
/// outcome is remembered.
pub async fn random_operations(combiner: &GroupCommit, seed: u64) {
    {
        let keys: Vec<_> = (0..6).map(|i| username(&format!("hot-{i}"))).collect();
        let cells = [cell("cell-a"), cell("cell-b"), cell("cell-c")];
        // A first round makes claims to destroy and update.
        for cell in &cells {
            let lease = combiner.begin_update(creates(cell, &keys[..2])).await;
            if let Ok(lease) = lease {
                combiner.commit_update(cell, lease.lease_id).await.unwrap();
            }
        }
        let before = combiner.stats().operations.load(Ordering::Relaxed);
        let tasks: Vec<_> = (0..16u64)
            .map(|task| {
                let combiner = combiner.clone();
                let (keys, cells) = (keys.clone(), cells.clone());
                let mut rng = fastrand::Rng::with_seed(seed * 1000 + task);
                tokio::spawn(async move {
                    let mut history: Vec<(Lease, Ended)> = Vec::new();
                    let mut issued = 0;
                    for _round in 0..4 {
                        // Spread out a little, so groups mix begins and ends.
                        let pause = Duration::from_micros(rng.u64(..4000));
                        tokio::time::sleep(pause).await;
                        let cell = cells[rng.usize(..cells.len())].clone();
                        let request = random_request(&mut rng, &cell, &keys);
                        issued += 1;
                        let lease = match combiner.begin_update(request).await {
                            Ok(lease) => lease,
                            Err(refusal) => {
                                assert!(
                                    matches!(
                                        refusal.refusal(),
                                        ClaimsError::ClaimTaken { .. }
                                            | ClaimsError::ClaimLeased { .. }
                                            | ClaimsError::ClaimNotFound { .. }
                                            | ClaimsError::NotClaimOwner { .. }
                                    ),
                                    "a refusal of the protocol, not of the store: {refusal:?}"
                                );
                                continue;
                            }
                        };
                        if rng.usize(..6) == 0 {
                            // Left open: it keeps its claims to the end.
                            history.push((lease, None));
                            break;
                        }
                        let commit = rng.usize(..3) < 2;
                        issued += 1;
                        let ended = if commit {
                            combiner.commit_update(&cell, lease.lease_id).await
                        } else {
                            combiner.rollback_update(&cell, lease.lease_id, None).await
                        };
                        ended.expect("the lease's own end succeeds");
                        history.push((lease, Some(commit)));
                    }
                    (history, issued)
                })
            })
            .collect();
        let mut open: BTreeMap<LeaseId, Lease> = BTreeMap::new();
        let mut ended = BTreeMap::new();
        let mut issued = 0;
        for task in tasks {
            let (history, count) = task.await.expect("no task panics");
            issued += count;
            for (lease, end) in history {
                match end {
                    None => {
                        open.insert(lease.lease_id, lease);
                    }
                    Some(commit) => {
                        ended.insert(lease.lease_id, (lease.cell_id, commit));
                    }
                }
            }
        }

        let stats = combiner.stats();
        let operations = stats.operations.load(Ordering::Relaxed) - before;
        println!(
            "seed {seed}: {operations} operations, {} open and {} ended leases; group sizes (up to, count) {:?}",
            open.len(),
            ended.len(),
            stats.size_distribution(),
        );
        assert_eq!(
            operations, issued,
            "every begin and end went through the combiner once"
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
            "outstanding leases, with their answered timestamps (seed {seed})"
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
                combiner.rollback_update(cell_id, *id, None).await
            };
            assert_eq!(again, Ok(()), "ending {id} again");
        }
    }
}

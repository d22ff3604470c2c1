//! The LocalLeaseStore contract. A backend provides a [`LocalLeaseFixture`] (its store plus a way
//! to run `record` inside a real local transaction) and runs every case through
//! [`local_lease_store_conformance!`](crate::local_lease_store_conformance).

use std::future::Future;
use std::time::Duration;

use crate::fixtures::lease_id;
use topology_claims::domain::LeaseId;
use topology_claims::error::ClaimsError;
use topology_claims::ports::{Clock, LocalLeaseStore, SystemClock};

/// A local lease store under test, with the means to open real local transactions.
pub trait LocalLeaseFixture {
    type Store: LocalLeaseStore;

    fn store(&self) -> &Self::Store;

    /// Records `lease_id` with [`LocalLeaseStore::record`] inside a fresh local transaction,
    /// then commits it (`commit = true`) or rolls it back.
    fn record_in_transaction(
        &self,
        lease_id: LeaseId,
        commit: bool,
    ) -> impl Future<Output = Result<(), ClaimsError>>;
}

pub async fn recorded_lease_appears_when_the_local_transaction_commits(f: &impl LocalLeaseFixture) {
    f.record_in_transaction(lease_id(1), true).await.unwrap();
    let found = f.store().find(&[lease_id(1)]).await.unwrap();
    assert_eq!(
        found.iter().map(|l| l.lease_id).collect::<Vec<_>>(),
        vec![lease_id(1)]
    );
}

pub async fn recorded_lease_vanishes_when_the_local_transaction_rolls_back(
    f: &impl LocalLeaseFixture,
) {
    f.record_in_transaction(lease_id(2), false).await.unwrap();
    assert!(f.store().find(&[lease_id(2)]).await.unwrap().is_empty());
}

pub async fn recording_a_lease_twice_keeps_the_first_record(f: &impl LocalLeaseFixture) {
    f.record_in_transaction(lease_id(4), true).await.unwrap();
    let first = f.store().find(&[lease_id(4)]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    f.record_in_transaction(lease_id(4), true)
        .await
        .expect("a second record is a no-op");
    assert_eq!(f.store().find(&[lease_id(4)]).await.unwrap(), first);
}

pub async fn delete_removes_a_lease_once(f: &impl LocalLeaseFixture) {
    f.record_in_transaction(lease_id(3), true).await.unwrap();
    assert!(f.store().delete(lease_id(3)).await.unwrap());
    assert!(
        !f.store().delete(lease_id(3)).await.unwrap(),
        "a second delete finds nothing"
    );
    assert!(f.store().find(&[lease_id(3)]).await.unwrap().is_empty());
}

pub async fn find_returns_only_existing_leases(f: &impl LocalLeaseFixture) {
    for n in [10, 11, 12] {
        f.record_in_transaction(lease_id(n), true).await.unwrap();
    }
    let mut found: Vec<LeaseId> = f
        .store()
        .find(&[lease_id(10), lease_id(12), lease_id(13)])
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.lease_id)
        .collect();
    found.sort();
    assert_eq!(found, vec![lease_id(10), lease_id(12)]);
    assert!(f.store().find(&[]).await.unwrap().is_empty());
}

pub async fn list_older_than_returns_old_leases_oldest_first(f: &impl LocalLeaseFixture) {
    f.record_in_transaction(lease_id(20), true).await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    f.record_in_transaction(lease_id(21), true).await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let cut = SystemClock.now();
    tokio::time::sleep(Duration::from_millis(5)).await;
    f.record_in_transaction(lease_id(22), true).await.unwrap();
    let old: Vec<LeaseId> = f
        .store()
        .list_older_than(cut, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.lease_id)
        .collect();
    assert_eq!(old, vec![lease_id(20), lease_id(21)]);
    let first = f.store().list_older_than(cut, 1).await.unwrap();
    assert_eq!(first.len(), 1, "the limit is honoured");
    assert_eq!(first[0].lease_id, lease_id(20));
}

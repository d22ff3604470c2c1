//! The PostgreSQL LocalLeaseStore inside a real application transaction: the lease row commits
//! or rolls back together with the application's own rows.

mod common;

use std::time::Duration;

use topology_claims::{LeaseId, LocalLeaseStore, LocalLock};
use topology_claims_postgres::tokio_postgres::Client;
use topology_claims_postgres::{ensure_local_schema, PostgresLocalLeaseStore};

async fn count(client: &Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.expect(sql).get(0)
}

/// Saves an application row and records `lease_id` in one local transaction, then commits or
/// rolls it back.
async fn save_user(store: &PostgresLocalLeaseStore, name: &str, lease_id: LeaseId, commit: bool) {
    let mut client = store.pool().get().await.expect("a connection");
    let client: &mut Client = &mut client;
    let mut tx = client.transaction().await.expect("begin");
    tx.execute("INSERT INTO users (name) VALUES ($1)", &[&name])
        .await
        .expect("save the user");
    store
        .record(&mut tx, lease_id)
        .await
        .expect("record the lease");
    if commit {
        tx.commit().await.expect("commit");
    } else {
        tx.rollback().await.expect("rollback");
    }
}

#[tokio::test]
async fn lease_recorded_in_an_application_transaction_shares_its_fate() {
    let Some((admin, schema, store)) = common::fresh_local_store().await else {
        return;
    };
    let client = store.pool().get().await.expect("a connection");
    ensure_local_schema(&**client)
        .await
        .expect("the DDL is idempotent");
    client
        .batch_execute("CREATE TABLE users (name text PRIMARY KEY)")
        .await
        .expect("app table");

    let rolled_back = LeaseId::generate();
    save_user(&store, "alice", rolled_back, false).await;
    assert_eq!(
        count(&client, "SELECT count(*) FROM leases_outstanding").await,
        0,
        "rollback leaves no lease row"
    );
    assert_eq!(count(&client, "SELECT count(*) FROM users").await, 0);

    let committed = LeaseId::generate();
    save_user(&store, "bob", committed, true).await;
    assert_eq!(
        count(&client, "SELECT count(*) FROM leases_outstanding").await,
        1,
        "commit leaves exactly one"
    );
    assert_eq!(count(&client, "SELECT count(*) FROM users").await, 1);
    let found = store.find(&[committed, rolled_back]).await.expect("find");
    assert_eq!(
        found.iter().map(|l| l.lease_id).collect::<Vec<_>>(),
        vec![committed]
    );
    drop(client);
    common::drop_schema(&admin, &schema).await;
}

#[tokio::test]
async fn local_lock_admits_one_holder_until_released_or_expired() {
    let Some((admin, schema, store)) = common::fresh_local_store().await else {
        return;
    };
    let long = Duration::from_secs(60);
    assert!(
        store.try_lock("reconcile", "a", long).await.unwrap(),
        "a free lock is taken"
    );
    assert!(
        !store.try_lock("reconcile", "b", long).await.unwrap(),
        "another holder is refused"
    );
    assert!(
        store.try_lock("reconcile", "a", long).await.unwrap(),
        "the holder extends it"
    );
    assert!(
        store.try_lock("verify", "b", long).await.unwrap(),
        "locks are per name"
    );
    store.unlock("reconcile", "b").await.unwrap();
    assert!(
        !store.try_lock("reconcile", "b", long).await.unwrap(),
        "only the holder unlocks"
    );
    store.unlock("reconcile", "a").await.unwrap();
    assert!(store
        .try_lock("reconcile", "b", Duration::from_millis(1))
        .await
        .unwrap());
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        store.try_lock("reconcile", "c", long).await.unwrap(),
        "an expired lock is free"
    );
    common::drop_schema(&admin, &schema).await;
}

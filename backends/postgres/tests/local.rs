//! The PostgreSQL LocalLeaseStore inside a real application transaction: the lease row commits
//! or rolls back together with the application's own rows, and what the cluster says of a
//! lease's `local_transaction` (`pg_xact_status`, and every fallback it can test here).

mod common;

use std::time::Duration;

use topology_claims::{
    LeaseId, LocalLeaseStore, LocalLock, LocalTransaction, LocalTxStatus, PgLocalTransaction,
};
use topology_claims_postgres::tokio_postgres::{Client, GenericClient};
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

/// `pg:<system_identifier>:<xid8>` of the transaction open on `client`.
async fn current_transaction(client: &impl GenericClient) -> LocalTransaction {
    let row = client
        .query_one(
            "SELECT (SELECT system_identifier FROM pg_control_system())::text, pg_current_xact_id()::text",
            &[],
        )
        .await
        .expect("the transaction's identity");
    let text = format!("pg:{}:{}", row.get::<_, String>(0), row.get::<_, String>(1));
    LocalTransaction::parse_field(&text, "local_transaction").unwrap()
}

/// `local` with its xid replaced.
fn with_xid(local: &LocalTransaction, xid: u64) -> LocalTransaction {
    let named = PgLocalTransaction::parse(local).unwrap();
    PgLocalTransaction { xid8: xid, ..named }.to_local_transaction()
}

fn is_unknown_because(status: &LocalTxStatus, needle: &str) -> bool {
    matches!(status, LocalTxStatus::Unknown(why) if why.contains(needle))
}

#[tokio::test]
async fn transaction_status_reports_this_clusters_transactions_and_falls_back_on_the_rest() {
    let Some((admin, schema, store)) = common::fresh_local_store().await else {
        return;
    };
    let mut client = store.pool().get().await.expect("a connection");
    let client: &mut Client = &mut client;

    let tx = client.transaction().await.expect("begin");
    let running = current_transaction(&tx).await;
    assert_eq!(
        store.transaction_status(&running).await,
        LocalTxStatus::InProgress
    );
    tx.rollback().await.expect("rollback");
    assert_eq!(
        store.transaction_status(&running).await,
        LocalTxStatus::Aborted
    );

    let tx = client.transaction().await.expect("begin");
    let committed = current_transaction(&tx).await;
    tx.commit().await.expect("commit");
    assert_eq!(
        store.transaction_status(&committed).await,
        LocalTxStatus::Committed
    );

    // An xid this cluster has not reached (a lease from before a restore or failover): the
    // error is caught and the reconciler falls back.
    let named = PgLocalTransaction::parse(&committed).unwrap();
    let future = with_xid(&committed, named.xid8 + (1 << 40));
    let status = store.transaction_status(&future).await;
    assert!(is_unknown_because(&status, "SQLSTATE 22023"), "{status:?}");

    let other_cluster = PgLocalTransaction {
        system_identifier: named.system_identifier ^ 1,
        ..named
    }
    .to_local_transaction();
    let status = store.transaction_status(&other_cluster).await;
    assert!(is_unknown_because(&status, "another cluster"), "{status:?}");

    for text in ["mysql:1:2", "pg:1"] {
        let local = LocalTransaction::parse_field(text, "local_transaction").unwrap();
        let status = store.transaction_status(&local).await;
        assert!(
            is_unknown_because(&status, "not a PostgreSQL transaction"),
            "{status:?}"
        );
    }
    let special = with_xid(&committed, 2);
    let status = store.transaction_status(&special).await;
    assert!(
        is_unknown_because(&status, "not a normal transaction id"),
        "{status:?}"
    );
    common::drop_schema(&admin, &schema).await;
}

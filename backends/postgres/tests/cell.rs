//! The shared cell-side scenarios (crashes at every phase boundary healed by the reconciler,
//! concurrent reconcilers) with the cell's local database on PostgreSQL.

mod common;

use std::collections::BTreeSet;

use topology_claims::testing::cell::LocalDb;
use topology_claims::{ClaimsError, LeaseId, LocalLeaseStore};
use topology_claims_postgres::{tokio_postgres, PostgresLocalLeaseStore};

/// A cell database: the lease store's schema plus an application table of users.
struct CellDb {
    store: PostgresLocalLeaseStore,
}

impl LocalDb for CellDb {
    type Store = PostgresLocalLeaseStore;

    fn lease_store(&self) -> Self::Store {
        self.store.clone()
    }

    async fn app_transaction(
        &self,
        name: &str,
        lease_id: LeaseId,
        commit: bool,
    ) -> Result<(), ClaimsError> {
        let mut client = self.store.pool().get().await.map_err(common::test_error)?;
        let client: &mut tokio_postgres::Client = &mut client;
        let mut tx = client.transaction().await.map_err(common::test_error)?;
        tx.execute("INSERT INTO users (name) VALUES ($1)", &[&name])
            .await
            .map_err(common::test_error)?;
        self.store.record(&mut tx, lease_id).await?;
        if commit {
            tx.commit().await
        } else {
            tx.rollback().await
        }
        .map_err(common::test_error)
    }

    async fn committed_users(&self) -> Result<BTreeSet<String>, ClaimsError> {
        let client = self.store.pool().get().await.map_err(common::test_error)?;
        let rows = client
            .query("SELECT name FROM users", &[])
            .await
            .map_err(common::test_error)?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }
}

async fn cell_db() -> CellDb {
    let Some((_admin, _schema, store)) = common::fresh_local_store().await else {
        common::skip_process()
    };
    let client = store.pool().get().await.expect("a pooled connection");
    client
        .batch_execute("CREATE TABLE users (name text PRIMARY KEY)")
        .await
        .expect("the application's table");
    drop(client);
    CellDb { store }
}

topology_claims::cell_scenarios!(cell_db);

mod transact {
    use std::sync::Arc;
    use std::time::Duration;

    use topology_claims::cell::{
        ClaimsClient, ClientConfig, CommitOutcome, TransactionError, UpdateConfig,
    };
    use topology_claims::memory::MemoryClaimStore;
    use topology_claims::testing::cell::LocalDb;
    use topology_claims::testing::fixtures::{cell, creates, username};
    use topology_claims::testing::TestServer;
    use topology_claims::{ClaimState, ClaimsError, LocalLeaseStore, Timestamp};
    use topology_claims_postgres::cell::transact;
    use topology_claims_postgres::tokio_postgres;

    async fn setup() -> (TestServer, ClaimsClient, super::CellDb) {
        let server = TestServer::start(Arc::new(MemoryClaimStore::new())).await;
        let client =
            ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
        (server, client, super::cell_db().await)
    }

    async fn local_rows(db: &super::CellDb) -> usize {
        let far = Timestamp::from_unix_micros(i64::MAX);
        db.store.list_older_than(far, 100).await.unwrap().len()
    }

    #[tokio::test]
    async fn transact_commits_the_local_rows_and_the_claims_together() {
        let (server, client, db) = setup().await;
        let mut conn = db.store.pool().get().await.unwrap();
        let conn: &mut tokio_postgres::Client = &mut conn;
        let a = cell("cell-a");
        let (inserted, outcome) = transact(
            &client,
            conn,
            &db.store,
            creates(&a, &[username("alice")]),
            UpdateConfig::default(),
            |tx| {
                Box::pin(async move {
                    tx.execute("INSERT INTO users (name) VALUES ('alice')", &[])
                        .await
                })
            },
        )
        .await
        .unwrap();
        assert_eq!((inserted, outcome), (1, CommitOutcome::Committed));
        assert_eq!(
            client
                .lookup_claim(&username("alice").key)
                .await
                .unwrap()
                .state,
            ClaimState::Active
        );
        assert!(db.committed_users().await.unwrap().contains("alice"));
        assert_eq!(
            local_rows(&db).await,
            0,
            "the local lease row is deleted after CommitUpdate"
        );
        server.shutdown().await;
    }

    #[tokio::test]
    async fn transact_rolls_back_the_lease_when_the_local_transaction_fails() {
        let (server, client, db) = setup().await;
        let mut conn = db.store.pool().get().await.unwrap();
        let conn: &mut tokio_postgres::Client = &mut conn;
        conn.execute("INSERT INTO users (name) VALUES ('bob')", &[])
            .await
            .unwrap();
        let a = cell("cell-a");
        let result = transact(
            &client,
            conn,
            &db.store,
            creates(&a, &[username("bob")]),
            UpdateConfig::default(),
            |tx| {
                Box::pin(async move {
                    tx.execute("INSERT INTO users (name) VALUES ('bob')", &[])
                        .await
                })
            },
        )
        .await;
        assert!(
            matches!(result, Err(TransactionError::Local(_))),
            "{result:?}"
        );
        let claim = client.lookup_claim(&username("bob").key).await;
        assert!(
            matches!(claim, Err(ClaimsError::ClaimNotFound { .. })),
            "{claim:?}"
        );
        assert_eq!(
            local_rows(&db).await,
            0,
            "no lease row from a rolled-back transaction"
        );
        server.shutdown().await;
    }

    #[tokio::test]
    async fn transact_refuses_a_stale_local_commit() {
        let (server, client, db) = setup().await;
        let mut conn = db.store.pool().get().await.unwrap();
        let conn: &mut tokio_postgres::Client = &mut conn;
        let config = UpdateConfig {
            staleness: Duration::from_millis(300),
            safety_margin: Duration::from_millis(100),
            renew_every: None,
        };
        let result = transact(
            &client,
            conn,
            &db.store,
            creates(&cell("cell-a"), &[username("carol")]),
            config,
            |tx| {
                Box::pin(async move {
                    tx.execute("INSERT INTO users (name) VALUES ('carol')", &[])
                        .await?;
                    tokio::time::sleep(Duration::from_millis(350)).await;
                    Ok::<_, tokio_postgres::Error>(())
                })
            },
        )
        .await;
        assert!(
            matches!(result, Err(TransactionError::Stale { .. })),
            "{result:?}"
        );
        assert!(
            !db.committed_users().await.unwrap().contains("carol"),
            "rolled back locally"
        );
        let claim = client.lookup_claim(&username("carol").key).await;
        assert!(
            matches!(claim, Err(ClaimsError::ClaimNotFound { .. })),
            "{claim:?}"
        );
        server.shutdown().await;
    }
}

//! The shared cell-side scenarios (crashes at every phase boundary healed by the reconciler,
//! concurrent reconcilers) with the cell's local database on PostgreSQL.

mod common;

use std::collections::BTreeSet;

use topology_claims::{ClaimsError, LeaseId, LocalLeaseStore};
use topology_claims_postgres::{tokio_postgres, PostgresLocalLeaseStore};
use topology_claims_testkit::cell::LocalDb;

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

topology_claims_testkit::cell_scenarios!(cell_db);

mod transact {
    use std::sync::Arc;
    use std::time::Duration;

    use topology_claims::memory::MemoryClaimStore;
    use topology_claims::{ClaimState, ClaimsError, LocalLeaseStore, Timestamp};
    use topology_claims_client::{
        ClaimsClient, ClientConfig, CommitOutcome, TransactionError, UpdateConfig,
    };
    use topology_claims_postgres::cell::transact;
    use topology_claims_postgres::tokio_postgres;
    use topology_claims_testkit::cell::LocalDb;
    use topology_claims_testkit::fixtures::{cell, creates, username};
    use topology_claims_testkit::TestServer;

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
            ..UpdateConfig::default()
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

mod in_transaction {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// The default 200 ms suits a service next door; a loaded CI machine's first call (which
    /// also opens the connection) can take longer, and these tests are not about the deadline.
    fn roomy_deadline() -> UpdateConfig {
        UpdateConfig {
            in_transaction_deadline: Duration::from_secs(5),
            ..UpdateConfig::default()
        }
    }

    use topology_claims::memory::MemoryClaimStore;
    use topology_claims::{
        ClaimState, ClaimsError, LeasesQuery, LocalLeaseStore, LocalTransaction, LocalTxStatus,
        PgLocalTransaction, Timestamp,
    };
    use topology_claims_client::{
        ClaimsClient, ClientConfig, CommitOutcome, Reconciler, ReconcilerConfig, TransactionError,
        UpdateConfig,
    };
    use topology_claims_postgres::cell::{local_transaction_of, transact_in_transaction};
    use topology_claims_postgres::tokio_postgres;
    use topology_claims_testkit::cell::LocalDb;
    use topology_claims_testkit::fixtures::{cell, creates, username};
    use topology_claims_testkit::TestServer;

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

    async fn system_identifier(db: &super::CellDb) -> u64 {
        let client = db.store.pool().get().await.unwrap();
        let row = client
            .query_one(
                "SELECT system_identifier::text FROM pg_control_system()",
                &[],
            )
            .await
            .unwrap();
        row.get::<_, String>(0).parse().unwrap()
    }

    /// Polls the local database until it reports `local` as `want` (a dropped connection's
    /// backend aborts its transaction a moment after the socket closes).
    async fn wait_for_status(db: &super::CellDb, local: &LocalTransaction, want: LocalTxStatus) {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let status = db.store.transaction_status(local).await;
            if status == want {
                return;
            }
            assert!(
                Instant::now() < until,
                "still {status:?}, expected {want:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn in_transaction_order_commits_both_sides_and_the_lease_names_the_open_local_transaction(
    ) {
        let (server, client, db) = setup().await;
        let a = cell("cell-a");
        // Holds the lease row's insert back, so the lease can be looked at while the local
        // transaction is open between BeginUpdate and COMMIT.
        let mut blocker = db.store.pool().get().await.unwrap();
        let blocker: &mut tokio_postgres::Client = &mut blocker;
        let blocking = blocker.transaction().await.unwrap();
        blocking
            .batch_execute("LOCK TABLE leases_outstanding IN ACCESS EXCLUSIVE MODE")
            .await
            .unwrap();
        let mut conn = db.store.pool().get().await.unwrap();
        let conn: &mut tokio_postgres::Client = &mut conn;
        let helper = transact_in_transaction(
            &client,
            conn,
            &db.store,
            roomy_deadline(),
            |tx| {
                Box::pin(async move {
                    let row = tx
                        .query_one(
                            "INSERT INTO users (name) VALUES ('alice') RETURNING 7::bigint",
                            &[],
                        )
                        .await?;
                    Ok::<i64, tokio_postgres::Error>(row.get(0))
                })
            },
            |id| {
                let mut claim = username("alice");
                claim.table_record_id = *id;
                creates(&a, &[claim])
            },
        );
        let observer = async {
            let until = Instant::now() + Duration::from_secs(10);
            let lease = loop {
                let page = client
                    .list_outstanding_leases(&LeasesQuery::new(a.clone(), None, 10))
                    .await
                    .unwrap();
                if let Some(lease) = page.leases.into_iter().next() {
                    break lease;
                }
                assert!(Instant::now() < until, "no lease appeared");
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            let local = lease
                .request
                .local_transaction
                .clone()
                .expect("the lease carries local_transaction");
            assert_eq!(
                db.store.transaction_status(&local).await,
                LocalTxStatus::InProgress,
                "BeginUpdate was sent from inside the open local transaction"
            );
            blocking.rollback().await.unwrap();
            local
        };
        let (result, local) = tokio::join!(helper, observer);
        let (id, outcome) = result.unwrap();
        assert_eq!((id, outcome), (7, CommitOutcome::Committed));
        let named = PgLocalTransaction::parse(&local).expect("pg:<system_identifier>:<xid8>");
        assert_eq!(named.system_identifier, system_identifier(&db).await);
        assert_eq!(
            db.store.transaction_status(&local).await,
            LocalTxStatus::Committed,
            "the named transaction is the one that committed"
        );
        let view = client.lookup_claim(&username("alice").key).await.unwrap();
        assert_eq!(view.state, ClaimState::Active);
        assert!(db.committed_users().await.unwrap().contains("alice"));
        assert_eq!(local_rows(&db).await, 0, "deleted after CommitUpdate");
        server.shutdown().await;
    }

    #[tokio::test]
    async fn in_transaction_order_rolls_the_local_transaction_back_when_begin_update_is_refused() {
        let (server, client, db) = setup().await;
        let lease = client
            .begin_update(creates(&cell("cell-b"), &[username("dave")]))
            .await
            .unwrap();
        client
            .commit_update(&cell("cell-b"), lease.lease_id)
            .await
            .unwrap();
        let mut conn = db.store.pool().get().await.unwrap();
        let conn: &mut tokio_postgres::Client = &mut conn;
        let result = transact_in_transaction(
            &client,
            conn,
            &db.store,
            roomy_deadline(),
            |tx| {
                Box::pin(async move {
                    tx.execute("INSERT INTO users (name) VALUES ('dave')", &[])
                        .await
                })
            },
            |_| creates(&cell("cell-a"), &[username("dave")]),
        )
        .await;
        match result {
            Err(TransactionError::Claims(ClaimsError::ClaimTaken { claim })) => {
                assert_eq!(claim, username("dave").key)
            }
            other => panic!("expected ClaimTaken, got {other:?}"),
        }
        assert!(
            !db.committed_users().await.unwrap().contains("dave"),
            "the application's row was rolled back"
        );
        assert_eq!(local_rows(&db).await, 0);
        let page = client
            .list_outstanding_leases(&LeasesQuery::new(cell("cell-a"), None, 10))
            .await
            .unwrap();
        assert!(page.leases.is_empty(), "{:?}", page.leases);
        server.shutdown().await;
    }

    #[tokio::test]
    async fn a_young_lease_of_a_client_dropped_before_its_local_commit_is_rolled_back_in_one_pass()
    {
        let (server, client, db) = setup().await;
        let a = cell("cell-a");
        let schema: String = db
            .store
            .pool()
            .get()
            .await
            .unwrap()
            .query_one("SELECT current_schema()", &[])
            .await
            .unwrap()
            .get(0);
        // A connection of its own, so that it can be cut like a crashed process's.
        let (mut raw, connection) =
            tokio_postgres::connect(&super::common::url(), tokio_postgres::NoTls)
                .await
                .unwrap();
        let connection = tokio::spawn(connection);
        raw.batch_execute(&format!("SET search_path TO \"{schema}\""))
            .await
            .unwrap();
        let tx = raw.transaction().await.unwrap();
        tx.execute("INSERT INTO users (name) VALUES ('frank')", &[])
            .await
            .unwrap();
        let local = local_transaction_of(&tx).await.unwrap();
        let mut request = creates(&a, &[username("frank")]);
        request.local_transaction = Some(local.clone());
        client.begin_update(request).await.unwrap();
        // The crash: no ROLLBACK is sent (forgetting the transaction skips its drop), the
        // socket just closes.
        std::mem::forget(tx);
        connection.abort();
        drop(raw);
        wait_for_status(&db, &local, LocalTxStatus::Aborted).await;

        let reconciler =
            Reconciler::new(client.clone(), db.store.clone(), ReconcilerConfig::new(a));
        let report = reconciler.run_once().await.unwrap();
        assert_eq!(
            (
                report.rolled_back,
                report.rolled_back_aborted,
                report.left_young
            ),
            (1, 1, 0),
            "rolled back at the default 10-minute staleness although young: {report}"
        );
        let claim = client.lookup_claim(&username("frank").key).await;
        assert!(
            matches!(claim, Err(ClaimsError::ClaimNotFound { .. })),
            "the claim is free: {claim:?}"
        );
        assert!(!db.committed_users().await.unwrap().contains("frank"));
        server.shutdown().await;
    }
}

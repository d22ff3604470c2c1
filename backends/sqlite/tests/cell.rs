//! The cell side with a real SQLite local database: the shared cell scenarios (crashes at every
//! phase boundary, concurrent reconcilers) and the closure-style three-phase transaction.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rusqlite::Connection;
use topology_claims::memory::MemoryClaimStore;
use topology_claims::{ClaimState, ClaimsError, LeaseId, LocalLeaseStore, Timestamp};
use topology_claims_client::{
    ClaimsClient, ClientConfig, CommitOutcome, TransactionError, UpdateConfig,
};
use topology_claims_sqlite::cell::transact;
use topology_claims_sqlite::{ensure_local_schema, SqliteLocalLeaseStore};
use topology_claims_testkit::cell::LocalDb;
use topology_claims_testkit::fixtures::{cell, creates, email, username};
use topology_claims_testkit::TestServer;

struct SqliteDb {
    _dir: tempfile::TempDir,
    path: PathBuf,
    store: SqliteLocalLeaseStore,
}

fn open_app_db(path: &PathBuf) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn.execute_batch("CREATE TABLE IF NOT EXISTS users (name TEXT PRIMARY KEY)")
        .unwrap();
    ensure_local_schema(&conn).unwrap();
    conn
}

impl LocalDb for SqliteDb {
    type Store = SqliteLocalLeaseStore;

    fn lease_store(&self) -> SqliteLocalLeaseStore {
        self.store.clone()
    }

    async fn app_transaction(
        &self,
        name: &str,
        lease_id: LeaseId,
        commit: bool,
    ) -> Result<(), ClaimsError> {
        let mut conn = open_app_db(&self.path);
        let mut tx = conn.transaction().unwrap();
        tx.execute("INSERT INTO users (name) VALUES (?1)", [name])
            .unwrap();
        self.store.record(&mut tx, lease_id).await?;
        if commit {
            tx.commit().unwrap();
        }
        Ok(())
    }

    async fn committed_users(&self) -> Result<BTreeSet<String>, ClaimsError> {
        let conn = open_app_db(&self.path);
        let mut select = conn.prepare("SELECT name FROM users").unwrap();
        let names = select.query_map([], |row| row.get(0)).unwrap();
        Ok(names.map(Result::unwrap).collect())
    }
}

async fn sqlite_db() -> SqliteDb {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cell.db");
    drop(open_app_db(&path));
    let store = SqliteLocalLeaseStore::open(&path).await.unwrap();
    SqliteDb {
        _dir: dir,
        path,
        store,
    }
}

topology_claims_testkit::cell_scenarios!(sqlite_db);

#[tokio::test]
async fn transact_commits_the_local_rows_and_the_claims_together() {
    let server = TestServer::start(Arc::new(MemoryClaimStore::new())).await;
    let client = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    let db = sqlite_db().await;
    let mut conn = open_app_db(&db.path);
    let a = cell("cell-a");
    let request = creates(&a, &[username("alice"), email("alice@example.com")]);
    let (rowid, outcome) = transact(
        &client,
        &mut conn,
        &db.store,
        request,
        UpdateConfig::default(),
        |tx| {
            tx.execute("INSERT INTO users (name) VALUES ('alice')", [])?;
            Ok::<_, rusqlite::Error>(tx.last_insert_rowid())
        },
    )
    .await
    .unwrap();
    assert!(rowid > 0);
    assert_eq!(outcome, CommitOutcome::Committed);
    assert_eq!(
        client
            .lookup_claim(&username("alice").key)
            .await
            .unwrap()
            .state,
        ClaimState::Active
    );
    assert_eq!(
        db.committed_users().await.unwrap(),
        BTreeSet::from(["alice".to_owned()])
    );
    let rows = db
        .store
        .list_older_than(Timestamp::from_unix_micros(i64::MAX), 10)
        .await
        .unwrap();
    assert!(
        rows.is_empty(),
        "the local lease row is deleted after CommitUpdate"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn transact_rolls_back_the_lease_when_the_local_transaction_fails() {
    let server = TestServer::start(Arc::new(MemoryClaimStore::new())).await;
    let client = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    let db = sqlite_db().await;
    let mut conn = open_app_db(&db.path);
    conn.execute("INSERT INTO users (name) VALUES ('bob')", [])
        .unwrap();
    let a = cell("cell-a");
    // Failure point 3A: the local unique constraint refuses the row.
    let result = transact(
        &client,
        &mut conn,
        &db.store,
        creates(&a, &[username("bob")]),
        UpdateConfig::default(),
        |tx| {
            tx.execute("INSERT INTO users (name) VALUES ('bob')", [])?;
            Ok::<_, rusqlite::Error>(())
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
        "the create was rolled back: {claim:?}"
    );
    let rows = db
        .store
        .list_older_than(Timestamp::from_unix_micros(i64::MAX), 10)
        .await
        .unwrap();
    assert!(
        rows.is_empty(),
        "no local lease row from a rolled-back transaction"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn transact_refuses_a_stale_local_commit() {
    let server = TestServer::start(Arc::new(MemoryClaimStore::new())).await;
    let client = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    let db = sqlite_db().await;
    let mut conn = open_app_db(&db.path);
    let a = cell("cell-a");
    let config = UpdateConfig {
        staleness: Duration::from_millis(300),
        safety_margin: Duration::from_millis(100),
        renew_every: None,
        ..UpdateConfig::default()
    };
    let result = transact(
        &client,
        &mut conn,
        &db.store,
        creates(&a, &[username("carol")]),
        config,
        |tx| {
            tx.execute("INSERT INTO users (name) VALUES ('carol')", [])?;
            std::thread::sleep(Duration::from_millis(350));
            Ok::<_, rusqlite::Error>(())
        },
    )
    .await;
    assert!(
        matches!(result, Err(TransactionError::Stale { .. })),
        "{result:?}"
    );
    assert!(
        db.committed_users().await.unwrap().is_empty(),
        "the local rows were rolled back"
    );
    let claim = client.lookup_claim(&username("carol").key).await;
    assert!(
        matches!(claim, Err(ClaimsError::ClaimNotFound { .. })),
        "{claim:?}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn transact_reports_a_taken_claim_before_touching_the_local_database() {
    let server = TestServer::start(Arc::new(MemoryClaimStore::new())).await;
    let client = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    let db = sqlite_db().await;
    let mut conn = open_app_db(&db.path);
    let lease = client
        .begin_update(creates(&cell("cell-b"), &[username("dave")]))
        .await
        .unwrap();
    client
        .commit_update(&cell("cell-b"), lease.lease_id)
        .await
        .unwrap();
    let mut ran = false;
    let result = transact(
        &client,
        &mut conn,
        &db.store,
        creates(&cell("cell-a"), &[username("dave")]),
        UpdateConfig::default(),
        |_| {
            ran = true;
            Ok::<_, rusqlite::Error>(())
        },
    )
    .await;
    match result {
        Err(TransactionError::Claims(ClaimsError::ClaimTaken { claim })) => {
            assert_eq!(claim, username("dave").key)
        }
        other => panic!("expected ClaimTaken, got {other:?}"),
    }
    assert!(!ran, "the local transaction never started");
    server.shutdown().await;
}

mod in_transaction {
    use super::*;
    use topology_claims_sqlite::cell::transact_in_transaction;

    /// The default 200 ms suits a service next door; a loaded CI machine's first call (which
    /// also opens the connection) can take longer, and these tests are not about the deadline.
    fn roomy_deadline() -> UpdateConfig {
        UpdateConfig {
            in_transaction_deadline: Duration::from_secs(5),
            ..UpdateConfig::default()
        }
    }

    async fn local_lease_rows(db: &SqliteDb) -> usize {
        let far = Timestamp::from_unix_micros(i64::MAX);
        db.store.list_older_than(far, 10).await.unwrap().len()
    }

    #[tokio::test]
    async fn in_transaction_order_commits_the_local_rows_and_the_claims_named_after_them() {
        let server = TestServer::start(Arc::new(MemoryClaimStore::new())).await;
        let client =
            ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
        let db = sqlite_db().await;
        let mut conn = open_app_db(&db.path);
        let a = cell("cell-a");
        let (rowid, outcome) = transact_in_transaction(
            &client,
            &mut conn,
            &db.store,
            roomy_deadline(),
            |tx| {
                tx.execute("INSERT INTO users (name) VALUES ('alice')", [])?;
                Ok::<_, rusqlite::Error>(tx.last_insert_rowid())
            },
            |rowid| {
                let mut claim = username("alice");
                claim.table_record_id = *rowid;
                creates(&a, &[claim])
            },
        )
        .await
        .unwrap();
        assert_eq!(outcome, CommitOutcome::Committed);
        let view = client.lookup_claim(&username("alice").key).await.unwrap();
        assert_eq!(view.state, ClaimState::Active);
        assert_eq!(
            view.record.table_record_id, rowid,
            "the claim names the row inserted before BeginUpdate"
        );
        assert_eq!(
            db.committed_users().await.unwrap(),
            BTreeSet::from(["alice".to_owned()])
        );
        assert_eq!(local_lease_rows(&db).await, 0, "deleted after CommitUpdate");
        server.shutdown().await;
    }

    #[tokio::test]
    async fn in_transaction_order_rolls_the_local_transaction_back_when_begin_update_is_refused() {
        let server = TestServer::start(Arc::new(MemoryClaimStore::new())).await;
        let client =
            ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
        let db = sqlite_db().await;
        let mut conn = open_app_db(&db.path);
        let lease = client
            .begin_update(creates(&cell("cell-b"), &[username("dave")]))
            .await
            .unwrap();
        client
            .commit_update(&cell("cell-b"), lease.lease_id)
            .await
            .unwrap();
        let result = transact_in_transaction(
            &client,
            &mut conn,
            &db.store,
            roomy_deadline(),
            |tx| {
                tx.execute("INSERT INTO users (name) VALUES ('dave')", [])?;
                Ok::<_, rusqlite::Error>(())
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
            db.committed_users().await.unwrap().is_empty(),
            "the application's row was rolled back"
        );
        assert_eq!(local_lease_rows(&db).await, 0);
        assert!(
            conn.is_autocommit(),
            "no transaction left open on the connection"
        );
        conn.execute("INSERT INTO users (name) VALUES ('erin')", [])
            .unwrap();
        server.shutdown().await;
    }

    #[tokio::test]
    async fn in_transaction_order_gives_up_at_its_deadline_and_rolls_the_local_transaction_back() {
        // Accepts connections (the kernel's backlog) but never answers a byte.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", silent.local_addr().unwrap());
        let config = ClientConfig {
            call_timeout: Duration::from_secs(1),
            ..ClientConfig::default()
        };
        let client = ClaimsClient::connect_lazy(&endpoint, config).unwrap();
        let db = sqlite_db().await;
        let mut conn = open_app_db(&db.path);
        let update = UpdateConfig {
            in_transaction_deadline: Duration::from_millis(200),
            ..UpdateConfig::default()
        };
        let result = transact_in_transaction(
            &client,
            &mut conn,
            &db.store,
            update,
            |tx| {
                tx.execute("INSERT INTO users (name) VALUES ('gina')", [])?;
                Ok::<_, rusqlite::Error>(())
            },
            |_| creates(&cell("cell-a"), &[username("gina")]),
        )
        .await;
        match result {
            Err(TransactionError::Claims(error @ ClaimsError::ServerUnavailable { .. })) => {
                assert!(
                    error.to_string().contains("in-transaction deadline"),
                    "{error}"
                )
            }
            other => panic!("expected Unavailable at the deadline, got {other:?}"),
        }
        assert!(db.committed_users().await.unwrap().is_empty());
        assert!(
            conn.is_autocommit(),
            "no transaction left open on the connection"
        );
    }

    #[tokio::test]
    async fn in_transaction_order_answers_claim_leased_at_once_even_to_a_client_that_waits_it_out()
    {
        let server = TestServer::start(Arc::new(MemoryClaimStore::new())).await;
        let config = ClientConfig {
            retry_claim_leased: Some(topology_claims_client::LeasedRetry::default()),
            ..ClientConfig::default()
        };
        let client = ClaimsClient::connect_lazy(&server.endpoint(), config).unwrap();
        client
            .begin_update(creates(&cell("cell-b"), &[username("hank")]))
            .await
            .unwrap();
        let db = sqlite_db().await;
        let mut conn = open_app_db(&db.path);
        // Waiting it out (about 1 s per retry) would outlast the deadline: `Unavailable`.
        let result = transact_in_transaction(
            &client,
            &mut conn,
            &db.store,
            roomy_deadline(),
            |tx| {
                tx.execute("INSERT INTO users (name) VALUES ('hank')", [])?;
                Ok::<_, rusqlite::Error>(())
            },
            |_| creates(&cell("cell-a"), &[username("hank")]),
        )
        .await;
        assert!(
            matches!(
                result,
                Err(TransactionError::Claims(ClaimsError::ClaimLeased { .. }))
            ),
            "{result:?}"
        );
        assert!(db.committed_users().await.unwrap().is_empty());
        server.shutdown().await;
    }
}

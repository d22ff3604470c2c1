//! What the shared suite cannot see: the stored encodings (which operators query by hand), the
//! injected clock, corrupt rows, and concurrent callers sharing the one connection.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use rusqlite::Connection;
use tempfile::TempDir;
use topology_claims::codec::decode_request;
use topology_claims::{ClaimStore, ClaimsError, Clock, LeasesQuery, MigrationPolicy, Timestamp};
use topology_claims_sqlite::SqliteClaimStore;
use topology_claims_testkit::fixtures::{cell, creates, email, lease_id, username};

/// A clock that only moves when told to.
struct ManualClock(AtomicI64);

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_unix_micros(self.0.load(Ordering::SeqCst))
    }
}

impl ManualClock {
    fn set(&self, micros: i64) {
        self.0.store(micros, Ordering::SeqCst);
    }
}

async fn store_with_clock(dir: &TempDir, start: i64) -> (SqliteClaimStore, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock(AtomicI64::new(start)));
    let store = SqliteClaimStore::open_with_clock(
        dir.path().join("claims.db"),
        MigrationPolicy::Apply,
        Arc::clone(&clock) as Arc<dyn Clock>,
    )
    .await
    .expect("a fresh SQLite store");
    (store, clock)
}

#[tokio::test]
async fn timestamps_come_from_the_injected_clock() {
    let dir = TempDir::new().unwrap();
    let (store, clock) = store_with_clock(&dir, 1_700_000_000_000_001).await;
    let a = cell("cell-a");

    let lease = store
        .begin_update(creates(&a, &[username("clocked")]))
        .await
        .unwrap();
    assert_eq!(
        lease.created_at,
        Timestamp::from_unix_micros(1_700_000_000_000_001)
    );

    clock.set(1_700_000_000_500_000);
    let renewed = store.renew_lease(&a, lease.lease_id).await.unwrap();
    assert_eq!(renewed.created_at, lease.created_at);
    assert_eq!(
        renewed.last_renewed_at,
        Timestamp::from_unix_micros(1_700_000_000_500_000)
    );

    clock.set(1_700_000_001_000_000);
    let page = store
        .list_outstanding_leases(&LeasesQuery::new(a.clone(), None, 10))
        .await
        .unwrap();
    assert_eq!(
        page.server_time,
        Timestamp::from_unix_micros(1_700_000_001_000_000)
    );
    assert_eq!(page.leases, vec![renewed]);

    store.commit_update(&a, lease.lease_id).await.unwrap();
    let claim = store.lookup_claim(&username("clocked").key).await.unwrap();
    assert_eq!(claim.created_at, lease.created_at);
    assert_eq!(
        claim.updated_at,
        Timestamp::from_unix_micros(1_700_000_001_000_000)
    );
}

#[tokio::test]
async fn rows_are_stored_in_the_documented_encodings() {
    let dir = TempDir::new().unwrap();
    let (store, _clock) = store_with_clock(&dir, 42).await;
    let a = cell("cell-a");
    let mut request = creates(&a, &[email("enc@example.com")]);
    request.lease_id = Some(lease_id(0xABC));
    store.begin_update(request.clone()).await.unwrap();

    let conn = Connection::open(dir.path().join("claims.db")).unwrap();
    let (claim_type, lease_text, lease_op, created_at): (i64, String, i64, i64) = conn
        .query_row(
            "SELECT claim_type, lease_id, lease_op, created_at FROM claims WHERE claim_value = ?1",
            ["enc@example.com"],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
        )
        .unwrap();
    assert_eq!(claim_type, 3, "the ClaimType wire number");
    assert_eq!(lease_text, lease_id(0xABC).to_string());
    assert_eq!(lease_text, lease_text.to_lowercase());
    assert_eq!(lease_op, 1, "create");
    assert_eq!(created_at, 42, "unix microseconds");
    let bytes: Vec<u8> = conn
        .query_row(
            "SELECT request FROM leases_outstanding WHERE lease_id = ?1",
            [&lease_text],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(decode_request(&bytes).unwrap(), request);

    store.commit_update(&a, lease_id(0xABC)).await.unwrap();
    let outcome: i64 = conn
        .query_row(
            "SELECT outcome FROM lease_outcomes WHERE lease_id = ?1",
            [&lease_text],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(outcome, 1, "committed");
}

#[tokio::test]
async fn a_corrupt_row_is_an_internal_error_not_a_panic() {
    let dir = TempDir::new().unwrap();
    let (store, _clock) = store_with_clock(&dir, 1).await;
    Connection::open(dir.path().join("claims.db"))
        .unwrap()
        .execute(
            "INSERT INTO claims (claim_type, claim_value, cell_id, owner_type, owner_value, \
             table_name, table_record_id, created_at, updated_at) \
             VALUES (2, 'broken', 'cell-a', 99, 'o', 1, 1, 1, 1)",
            [],
        )
        .unwrap();
    match store
        .lookup_claim(&username("broken").key)
        .await
        .unwrap_err()
    {
        ClaimsError::Internal { message } => {
            assert!(message.contains("owner_type = 99"), "{message}")
        }
        other => panic!("expected an internal error, got {other:?}"),
    }
    let taken = store
        .begin_update(creates(&cell("cell-b"), &[username("broken")]))
        .await;
    assert!(
        matches!(taken, Err(ClaimsError::Internal { .. })),
        "{taken:?}"
    );
    // The connection is still usable afterwards.
    store
        .begin_update(creates(&cell("cell-b"), &[username("fine")]))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_callers_get_exactly_one_winner_per_claim() {
    let dir = TempDir::new().unwrap();
    let store = SqliteClaimStore::open(dir.path().join("claims.db"), MigrationPolicy::Apply)
        .await
        .unwrap();
    let contenders: Vec<_> = (0..16)
        .map(|n| {
            let store = store.clone();
            tokio::spawn(async move {
                let me = cell(&format!("cell-{n}"));
                let mut won = Vec::new();
                for claim in 0..20 {
                    let record = username(&format!("race-{claim}"));
                    match store.begin_update(creates(&me, &[record])).await {
                        Ok(lease) => {
                            store.commit_update(&me, lease.lease_id).await.unwrap();
                            won.push(claim);
                        }
                        Err(ClaimsError::ClaimTaken { .. } | ClaimsError::ClaimLeased { .. }) => {}
                        Err(other) => panic!("unexpected error: {other:?}"),
                    }
                }
                won
            })
        })
        .collect();
    let mut winners = Vec::new();
    for contender in contenders {
        winners.extend(contender.await.unwrap());
    }
    winners.sort_unstable();
    assert_eq!(
        winners,
        (0..20).collect::<Vec<_>>(),
        "every claim has exactly one winner"
    );
}

/// Decision 117: a restored file's change feed is not the history the watchers followed, so a
/// restore refuses every watch from before it (WATCH_COMPACTED above the replaced store's head)
/// and later writes number above it.
#[tokio::test]
async fn a_restore_refuses_every_watch_from_before_it() {
    use topology_claims::domain::{EventPosition, EventsQuery};
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("claims.db");
    let write = |store: SqliteClaimStore, value: &'static str| async move {
        let a = cell("cell-a");
        let lease = store
            .begin_update(creates(&a, &[email(value)]))
            .await
            .unwrap();
        store.commit_update(&a, lease.lease_id).await.unwrap();
        store
            .lookup_claim(&email(value).key)
            .await
            .unwrap()
            .revision
    };
    let store = SqliteClaimStore::open(&path, MigrationPolicy::Apply)
        .await
        .unwrap();
    write(store.clone(), "kept@example.com").await;
    let backup = dir.path().join("backup.db");
    topology_claims_sqlite::backup::backup(&path, &backup)
        .await
        .unwrap();
    let head = write(store.clone(), "lost@example.com").await;
    drop(store);
    topology_claims_sqlite::backup::restore(&backup, &path, true)
        .await
        .unwrap();
    let store = SqliteClaimStore::open(&path, MigrationPolicy::Apply)
        .await
        .unwrap();
    for from in [1, head, head + 1] {
        let refused = store
            .read_events(&EventsQuery {
                from: EventPosition::start_of(from),
                limit: 10,
            })
            .await
            .unwrap_err();
        assert!(
            matches!(refused, ClaimsError::WatchCompacted { compact_revision, .. } if compact_revision > head + 1),
            "from {from}: {refused:?}"
        );
    }
    let later = write(store.clone(), "new@example.com").await;
    assert!(later > head + 1, "{later} after a head of {head}");
}

/// A backlog larger than one compaction pass goes in several bounded passes, and the log's
/// length the store keeps (`watch_head.events`) stays the count of the events it holds.
#[tokio::test]
async fn compaction_removes_a_backlog_in_bounded_passes_and_keeps_its_count() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("claims.db");
    let store = SqliteClaimStore::open(&path, MigrationPolicy::Apply)
        .await
        .unwrap();
    let a = cell("cell-a");
    // 7 revisions of 1,000 creates, each then committed: 14,000 events.
    for batch in 0..7 {
        let names: Vec<_> = (0..1000)
            .map(|i| username(&format!("backlog-{batch}-{i}")))
            .collect();
        let lease = store.begin_update(creates(&a, &names)).await.unwrap();
        store.commit_update(&a, lease.lease_id).await.unwrap();
    }
    let count = |path: &std::path::Path| {
        let conn = Connection::open(path).unwrap();
        let kept: i64 = conn
            .query_row("SELECT events FROM watch_head", [], |r| r.get(0))
            .unwrap();
        let actual: i64 = conn
            .query_row("SELECT COUNT(*) FROM claim_events", [], |r| r.get(0))
            .unwrap();
        (kept, actual)
    };
    assert_eq!(count(&path), (14_000, 14_000));
    let retention = std::time::Duration::from_secs(3600);
    let mut passes = Vec::new();
    loop {
        let removed = store.compact_events(retention, 1_500).await.unwrap();
        if removed == 0 {
            break;
        }
        passes.push(removed);
        let (kept, actual) = count(&path);
        assert_eq!(kept, actual, "after passes {passes:?}");
    }
    // Whole revisions of 1,000, at most 5,000 events a pass: 5,000, 5,000, 3,000.
    assert_eq!(passes, [5_000, 5_000, 3_000]);
    assert_eq!(count(&path), (1_000, 1_000));
}

//! Opening a SQLite file: migrations applied or refused (and the shared migration-rule cases), bad paths refused with a clear error,
//! and data that outlives the store that wrote it.

use rusqlite::Connection;
use tempfile::TempDir;
use topology_claims::codec::encode_request;
use topology_claims::{ClaimState, ClaimStore, ClaimsError, LeasesQuery, MigrationPolicy};
use topology_claims_sqlite::{migrate, SqliteClaimStore, SqliteLocalLeaseStore};
use topology_claims_testkit::fixtures::{cell, creates, destroys, email, username};
use topology_claims_testkit::migrations::{before_namespaces, MigrationFixture};

const ALL_MIGRATIONS: &[&str] = &[
    "0001_initial",
    "0002_decommissioned_cells",
    "0003_verification_slots",
    "0004_claim_updates",
    "0005_restore_epochs",
    "0006_namespaces",
    "0007_open_names",
    "0008_claim_events",
    "0009_lease_waits",
    "0010_watch_event_count",
];

fn temp_dir() -> TempDir {
    TempDir::new().expect("a temporary directory")
}

#[tokio::test]
async fn refuse_on_a_fresh_file_reports_pending_migrations_until_migrate_runs() {
    let dir = temp_dir();
    let path = dir.path().join("claims.db");

    let refused = SqliteClaimStore::open(&path, MigrationPolicy::Refuse)
        .await
        .unwrap_err();
    assert_eq!(
        refused,
        ClaimsError::MigrationsPending {
            pending: ALL_MIGRATIONS.iter().map(|name| name.to_string()).collect()
        }
    );

    assert_eq!(migrate(&path).await.unwrap(), ALL_MIGRATIONS);
    assert_eq!(
        migrate(&path).await.unwrap(),
        Vec::<String>::new(),
        "nothing left to apply"
    );
    SqliteClaimStore::open(&path, MigrationPolicy::Refuse)
        .await
        .expect("an up-to-date file opens");
}

#[tokio::test]
async fn open_with_apply_migrates_and_records_every_migration() {
    let dir = temp_dir();
    let path = dir.path().join("claims.db");
    drop(
        SqliteClaimStore::open(&path, MigrationPolicy::Apply)
            .await
            .unwrap(),
    );

    let conn = Connection::open(&path).unwrap();
    let mut statement = conn
        .prepare("SELECT name FROM schema_migrations ORDER BY version")
        .unwrap();
    let names: Vec<String> = statement
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(names, ALL_MIGRATIONS);
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |row| row.get(0))
        .unwrap();
    assert_eq!(mode, "wal", "WAL is persistent in the file");
}

#[tokio::test]
async fn concurrent_migrations_apply_each_migration_once() {
    let dir = temp_dir();
    let path = dir.path().join("claims.db");
    let runs: Vec<_> = (0..4)
        .map(|_| tokio::spawn(migrate(path.clone())))
        .collect();
    let mut applied = Vec::new();
    for run in runs {
        applied.extend(
            run.await
                .unwrap()
                .expect("every concurrent migrate succeeds"),
        );
    }
    assert_eq!(applied, ALL_MIGRATIONS);
}

/// A migrated file for the shared migration-rule cases.
struct MigratedFile {
    path: std::path::PathBuf,
    _dir: TempDir,
}

impl MigrationFixture for MigratedFile {
    type Store = SqliteClaimStore;

    async fn record_applied(&self, version: i64, name: &str) {
        Connection::open(&self.path)
            .unwrap()
            .execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?1, ?2, 0)",
                (version, name),
            )
            .unwrap();
    }

    async fn reopen(&self, policy: MigrationPolicy) -> Result<SqliteClaimStore, ClaimsError> {
        SqliteClaimStore::open(&self.path, policy).await
    }

    async fn populate_before_namespaces(&self) {
        std::fs::remove_file(&self.path).unwrap();
        let conn = Connection::open(&self.path).unwrap();
        conn.execute_batch(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, \
             applied_at INTEGER NOT NULL)",
        )
        .unwrap();
        for (version, sql) in BEFORE_NAMESPACES.iter().enumerate() {
            conn.execute_batch(sql).unwrap();
            conn.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?1, ?2, 0)",
                (version as i64 + 1, ALL_MIGRATIONS[version]),
            )
            .unwrap();
        }
        let (claims, lease) = before_namespaces();
        conn.execute(
            "INSERT INTO leases_outstanding (lease_id, cell_id, request, created_at, \
             last_renewed_at) VALUES (?1, ?2, ?3, ?4, ?4)",
            (
                lease.lease_id.to_string(),
                lease.cell_id.as_str(),
                encode_request(&lease.request),
                lease.created_at.as_unix_micros(),
            ),
        )
        .unwrap();
        for claim in claims {
            let record = &claim.record;
            conn.execute(
                "INSERT INTO claims (claim_type, claim_value, cell_id, owner_type, owner_value, \
                 table_name, table_record_id, lease_id, lease_op, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10)",
                (
                    record.key.namespace_number(),
                    &record.key.value,
                    claim.cell_id.as_str(),
                    record.owner_type.number(),
                    &record.owner_value,
                    record.table_name.number(),
                    record.table_record_id,
                    claim.lease.map(|l| l.lease_id.to_string()),
                    claim.lease.map_or(0, |l| l.op.number()),
                    claim.created_at.as_unix_micros(),
                ),
            )
            .unwrap();
        }
    }
}

/// The migrations of the release before namespaces, as it applied them.
const BEFORE_NAMESPACES: &[&str] = &[
    include_str!("../migrations/0001_initial.sql"),
    include_str!("../migrations/0002_decommissioned_cells.sql"),
    include_str!("../migrations/0003_verification_slots.sql"),
    include_str!("../migrations/0004_claim_updates.sql"),
    include_str!("../migrations/0005_restore_epochs.sql"),
];

async fn migrated_file() -> MigratedFile {
    let dir = temp_dir();
    let path = dir.path().join("claims.db");
    migrate(&path).await.unwrap();
    MigratedFile { path, _dir: dir }
}

topology_claims_testkit::migration_conformance!(migrated_file);

#[tokio::test]
async fn data_survives_closing_and_reopening_the_file() {
    let dir = temp_dir();
    let path = dir.path().join("claims.db");
    let (a, b) = (cell("cell-a"), cell("cell-b"));

    let store = SqliteClaimStore::open(&path, MigrationPolicy::Apply)
        .await
        .unwrap();
    let kept = store
        .begin_update(creates(&a, &[username("kept"), email("kept@example.com")]))
        .await
        .unwrap();
    store.commit_update(&a, kept.lease_id).await.unwrap();
    let outstanding = store
        .begin_update(destroys(&a, &[username("kept")]))
        .await
        .unwrap();
    let undone = store
        .begin_update(creates(&b, &[username("undone")]))
        .await
        .unwrap();
    store
        .rollback_update(&b, undone.lease_id, None)
        .await
        .unwrap();
    drop(store);

    let store = SqliteClaimStore::open(&path, MigrationPolicy::Refuse)
        .await
        .unwrap();
    let claim = store.lookup_claim(&username("kept").key).await.unwrap();
    assert_eq!(
        (claim.cell_id.clone(), claim.state()),
        (a.clone(), ClaimState::Destroying)
    );
    assert_eq!(
        store
            .lookup_claim(&email("kept@example.com").key)
            .await
            .unwrap()
            .state(),
        ClaimState::Active
    );
    let page = store
        .list_outstanding_leases(&LeasesQuery::new(a.clone(), None, 10))
        .await
        .unwrap();
    assert_eq!(
        page.leases,
        vec![outstanding.clone()],
        "the lease and its original request are kept"
    );
    store
        .commit_update(&a, kept.lease_id)
        .await
        .expect("the commit outcome is remembered");
    assert_eq!(
        store.commit_update(&b, undone.lease_id).await.unwrap_err(),
        ClaimsError::LeaseRolledBack {
            lease_id: undone.lease_id
        }
    );
    assert_eq!(
        store
            .lookup_claim(&username("undone").key)
            .await
            .unwrap_err(),
        ClaimsError::ClaimNotFound {
            claim: username("undone").key
        }
    );
    store.commit_update(&a, outstanding.lease_id).await.unwrap();
    assert!(
        store.lookup_claim(&username("kept").key).await.is_err(),
        "destroyed after reopening"
    );
}

fn assert_configuration(error: ClaimsError, expected: &str) {
    match error {
        ClaimsError::Configuration { message } => {
            assert!(
                message.contains(expected),
                "{message:?} should mention {expected:?}"
            )
        }
        other => panic!("expected a configuration error mentioning {expected:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn a_missing_directory_is_a_configuration_error() {
    let dir = temp_dir();
    let path = dir.path().join("no-such-dir").join("claims.db");
    let error = SqliteClaimStore::open(&path, MigrationPolicy::Apply)
        .await
        .unwrap_err();
    assert_configuration(error, "does not exist");
    assert_configuration(migrate(&path).await.unwrap_err(), "does not exist");
    assert_configuration(
        SqliteLocalLeaseStore::open(&path).await.unwrap_err(),
        "does not exist",
    );
    assert!(!path.parent().unwrap().exists(), "nothing is created");
}

#[tokio::test]
async fn a_file_that_is_not_a_database_is_a_configuration_error() {
    let dir = temp_dir();
    let path = dir.path().join("notes.txt");
    std::fs::write(
        &path,
        "these are not the pages you are looking for\n".repeat(100),
    )
    .unwrap();
    let error = SqliteClaimStore::open(&path, MigrationPolicy::Apply)
        .await
        .unwrap_err();
    assert_configuration(error, "is not a SQLite database");
    assert_configuration(
        SqliteLocalLeaseStore::open(&path).await.unwrap_err(),
        "is not a SQLite database",
    );
}

#[tokio::test]
async fn a_directory_or_an_empty_path_is_a_configuration_error() {
    let dir = temp_dir();
    let error = SqliteClaimStore::open(dir.path(), MigrationPolicy::Apply)
        .await
        .unwrap_err();
    assert_configuration(error, "is a directory");
    let error = SqliteClaimStore::open("", MigrationPolicy::Apply)
        .await
        .unwrap_err();
    assert_configuration(error, "path is empty");
}

//! What is particular to the Spanner store beyond the shared suite: schema migrations through
//! UpdateDatabaseDdl (idempotent, refused on request, and the shared migration-rule cases), the database's commit timestamps as the
//! only clock, and failing `Unavailable` (not hanging) when Spanner is gone.

mod common;

use std::time::Duration;

use gcloud_gax::conn::Environment;
use gcloud_googleapis::spanner::admin::database::v1::{CreateDatabaseRequest, DatabaseDialect};
use gcloud_spanner::admin::client::Client as AdminClient;
use gcloud_spanner::admin::AdminClientConfig;
use topology_claims::codec::encode_request;
use topology_claims::{
    ClaimStore, ClaimsCursor, ClaimsError, ClaimsQuery, LeasesQuery, MigrationPolicy, TableName,
};
use topology_claims_spanner::{SpannerClaimStore, SpannerOptions};
use topology_claims_testkit::fixtures::{cell, creates, username};
use topology_claims_testkit::migrations::{before_namespaces, MigrationFixture};

/// A migrated database on the shared emulator, for the shared migration-rule cases (a
/// populated one replaces it with a database of its own).
struct MigratedDatabase {
    url: std::sync::Mutex<String>,
    emulator: &'static common::Emulator,
}

impl MigratedDatabase {
    fn url(&self) -> String {
        self.url.lock().unwrap().clone()
    }

    async fn client(&self) -> gcloud_spanner::client::Client {
        let config = gcloud_spanner::client::ClientConfig {
            environment: Environment::Emulator(self.emulator.host.clone()),
            ..Default::default()
        };
        let database = self.url().trim_start_matches("spanner://").to_owned();
        gcloud_spanner::client::Client::new(database, config)
            .await
            .unwrap()
    }
}

impl MigrationFixture for MigratedDatabase {
    type Store = SpannerClaimStore;

    async fn record_applied(&self, version: i64, name: &str) {
        use gcloud_spanner::client::Error;
        use gcloud_spanner::mutation::insert_or_update;
        use gcloud_spanner::value::CommitTimestamp;

        let client = self.client().await;
        client
            .read_write_transaction(|tx| {
                let name = name.to_owned();
                Box::pin(async move {
                    tx.buffer_write(vec![insert_or_update(
                        "schema_migrations",
                        &["version", "name", "applied_at"],
                        &[&version, &name, &CommitTimestamp::new()],
                    )]);
                    Ok::<(), Error>(())
                })
            })
            .await
            .expect("record a migration");
        client.close().await;
    }

    async fn reopen(&self, policy: MigrationPolicy) -> Result<SpannerClaimStore, ClaimsError> {
        SpannerClaimStore::connect(&self.url(), common::options(self.emulator), policy).await
    }

    async fn populate_before_namespaces(&self) {
        use gcloud_spanner::client::Error;
        use gcloud_spanner::mutation::insert;
        use gcloud_spanner::value::CommitTimestamp;

        let url = common::fresh_url();
        create_empty_database(self.emulator, &url).await;
        topology_claims_spanner::migrate_through(&url, common::options(self.emulator), 5)
            .await
            .unwrap();
        *self.url.lock().unwrap() = url;
        let (claims, lease) = before_namespaces();
        let client = self.client().await;
        client
            .read_write_transaction(|tx| {
                let (claims, lease) = (claims.clone(), lease.clone());
                Box::pin(async move {
                    let mut mutations = vec![insert(
                        "leases_outstanding",
                        &[
                            "lease_id",
                            "cell_id",
                            "request",
                            "created_at",
                            "last_renewed_at",
                        ],
                        &[
                            &lease.lease_id.to_string(),
                            &lease.cell_id.as_str(),
                            &encode_request(&lease.request),
                            &CommitTimestamp::new(),
                            &CommitTimestamp::new(),
                        ],
                    )];
                    for claim in &claims {
                        let record = &claim.record;
                        mutations.push(insert(
                            "claims",
                            &[
                                "claim_type",
                                "claim_value",
                                "owner_type",
                                "owner_value",
                                "cell_id",
                                "table_name",
                                "table_record_id",
                                "lease_id",
                                "lease_op",
                                "created_at",
                                "updated_at",
                            ],
                            &[
                                &i64::from(record.key.namespace_number()),
                                &record.key.value,
                                &i64::from(record.owner_type.number()),
                                &record.owner_value,
                                &claim.cell_id.as_str(),
                                &i64::from(record.table_name.number()),
                                &record.table_record_id,
                                &claim.lease.map(|l| l.lease_id.to_string()),
                                &claim.lease.map_or(0, |l| i64::from(l.op.number())),
                                &CommitTimestamp::new(),
                                &CommitTimestamp::new(),
                            ],
                        ));
                    }
                    tx.buffer_write(mutations);
                    Ok::<(), Error>(())
                })
            })
            .await
            .expect("populate the previous release's schema");
        client.close().await;
    }
}

async fn migrated_database() -> MigratedDatabase {
    let emulator = common::shared(common::Mode::Plain);
    let url = common::fresh_url();
    topology_claims_spanner::migrate(&url, common::options(emulator), true)
        .await
        .unwrap();
    MigratedDatabase {
        url: std::sync::Mutex::new(url),
        emulator,
    }
}

topology_claims_testkit::migration_conformance!(migrated_database);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Creates the database of `url` with no schema at all, as an operator might by hand.
async fn create_empty_database(emulator: &common::Emulator, url: &str) {
    // The instance exists once any store was created in it through `migrate`.
    let scratch = format!("{url}-scratch");
    topology_claims_spanner::migrate(&scratch, common::options(emulator), true)
        .await
        .unwrap();
    let config = AdminClientConfig {
        environment: Environment::Emulator(emulator.host.clone()),
        ..AdminClientConfig::default()
    };
    let admin = AdminClient::new(config).await.unwrap();
    let name = topology_claims_spanner::DatabaseName::parse(url).unwrap();
    let request = CreateDatabaseRequest {
        parent: name.instance_path(),
        create_statement: format!("CREATE DATABASE `{}`", name.database),
        database_dialect: DatabaseDialect::GoogleStandardSql as i32,
        ..Default::default()
    };
    admin
        .database()
        .create_database(request, None)
        .await
        .unwrap()
        .wait(None)
        .await
        .unwrap();
}

#[test]
fn migrate_creates_the_database_once_and_is_idempotent() {
    runtime().block_on(async {
        let emulator = common::shared(common::Mode::Plain);
        let url = common::fresh_url();
        let options = common::options(emulator);
        let first = topology_claims_spanner::migrate(&url, options.clone(), true)
            .await
            .unwrap();
        assert_eq!(
            first,
            [
                "0001_initial",
                "0002_decommissioned_cells",
                "0003_verification_slots",
                "0004_claim_updates",
                "0005_restore_epochs",
                "0006_namespaces",
                "0007_open_names",
                "0008_change_feed",
                "0009_lease_waits"
            ]
        );
        let again = topology_claims_spanner::migrate(&url, options.clone(), true)
            .await
            .unwrap();
        assert!(again.is_empty(), "nothing pending: {again:?}");
        let without_create = topology_claims_spanner::migrate(&url, options.clone(), false)
            .await
            .unwrap();
        assert!(
            without_create.is_empty(),
            "nothing pending: {without_create:?}"
        );
        let store = SpannerClaimStore::connect(&url, options, MigrationPolicy::Refuse)
            .await
            .unwrap();
        store.close().await;
    });
}

#[test]
fn pending_migrations_are_refused_or_applied_through_update_database_ddl() {
    runtime().block_on(async {
        let emulator = common::shared(common::Mode::Plain);
        let url = common::fresh_url();
        create_empty_database(emulator, &url).await;
        let options = common::options(emulator);

        let refused =
            SpannerClaimStore::connect(&url, options.clone(), MigrationPolicy::Refuse).await;
        assert_eq!(
            refused.unwrap_err(),
            ClaimsError::MigrationsPending {
                pending: vec![
                    "0001_initial".into(),
                    "0002_decommissioned_cells".into(),
                    "0003_verification_slots".into(),
                    "0004_claim_updates".into(),
                    "0005_restore_epochs".into(),
                    "0006_namespaces".into(),
                    "0007_open_names".into(),
                    "0008_change_feed".into(),
                    "0009_lease_waits".into()
                ]
            }
        );

        let store = SpannerClaimStore::connect(&url, options.clone(), MigrationPolicy::Apply)
            .await
            .unwrap();
        let a = cell("cell-a");
        let lease = store
            .begin_update(creates(&a, &[username("migrated")]))
            .await
            .unwrap();
        store.commit_update(&a, lease.lease_id).await.unwrap();
        store.close().await;

        let store = SpannerClaimStore::connect(&url, options.clone(), MigrationPolicy::Refuse)
            .await
            .unwrap();
        assert_eq!(
            store
                .lookup_claim(&username("migrated").key)
                .await
                .unwrap()
                .cell_id,
            a
        );
        store.close().await;
        let applied = topology_claims_spanner::migrate(&url, options, false)
            .await
            .unwrap();
        assert!(applied.is_empty(), "recorded as applied: {applied:?}");
    });
}

#[test]
fn a_missing_database_is_unavailable_and_names_the_fix() {
    runtime().block_on(async {
        let emulator = common::shared(common::Mode::Plain);
        // Make sure the instance exists, so only the database is missing.
        topology_claims_spanner::migrate(&common::fresh_url(), common::options(emulator), true)
            .await
            .unwrap();
        let url = common::fresh_url();
        let err =
            SpannerClaimStore::connect(&url, common::options(emulator), MigrationPolicy::Apply)
                .await
                .unwrap_err();
        match err {
            ClaimsError::Unavailable { message } => {
                assert!(message.contains("--create-database"), "{message}")
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
    });
}

#[test]
fn malformed_urls_and_options_are_configuration_errors() {
    runtime().block_on(async {
        let emulator = common::shared(common::Mode::Plain);
        let bad_url = SpannerClaimStore::connect(
            "spanner://projects/p/databases/d",
            common::options(emulator),
            MigrationPolicy::Apply,
        )
        .await;
        assert!(
            matches!(bad_url, Err(ClaimsError::Configuration { .. })),
            "{bad_url:?}"
        );
        let no_sessions = SpannerOptions {
            session_pool_size: 0,
            ..common::options(emulator)
        };
        let bad_options =
            topology_claims_spanner::migrate(&common::fresh_url(), no_sessions, true).await;
        assert!(
            matches!(bad_options, Err(ClaimsError::Configuration { .. })),
            "{bad_options:?}"
        );
    });
}

#[test]
fn every_timestamp_is_a_spanner_commit_timestamp() {
    runtime().block_on(async {
        let store = common::fresh_store(common::Mode::Plain).await;
        let a = cell("cell-a");
        let lease = store
            .begin_update(creates(&a, &[username("t1"), username("t2")]))
            .await
            .unwrap();
        for name in ["t1", "t2"] {
            let claim = store.lookup_claim(&username(name).key).await.unwrap();
            // One transaction, one commit timestamp: the lease's and its claims' times agree.
            assert_eq!(
                (claim.created_at, claim.updated_at),
                (lease.created_at, lease.created_at)
            );
        }
        store.commit_update(&a, lease.lease_id).await.unwrap();
        let committed = store.lookup_claim(&username("t1").key).await.unwrap();
        assert_eq!(
            committed.created_at, lease.created_at,
            "creation time is kept"
        );
        assert!(
            committed.updated_at > lease.created_at,
            "a later transaction, a later commit timestamp"
        );
        let page = store
            .list_outstanding_leases(&LeasesQuery::new(a, None, 10))
            .await
            .unwrap();
        assert!(
            page.server_time >= committed.updated_at,
            "a strong read sees the commit"
        );
        store.close().await;
    });
}

#[test]
fn a_store_whose_spanner_is_gone_answers_unavailable_instead_of_hanging() {
    runtime().block_on(async {
        // An emulator of its own, to kill.
        let emulator = common::start(common::Mode::Plain);
        let url = common::fresh_url();
        let options = SpannerOptions {
            rpc_timeout: Duration::from_secs(2),
            ..common::options(&emulator)
        };
        topology_claims_spanner::migrate(&url, options.clone(), true)
            .await
            .unwrap();
        let store = SpannerClaimStore::connect(&url, options.clone(), MigrationPolicy::Refuse)
            .await
            .unwrap();
        let a = cell("cell-a");
        let lease = store
            .begin_update(creates(&a, &[username("before")]))
            .await
            .unwrap();

        emulator.kill();
        // A generous bound: it catches a hang (the crate's default retries run for minutes),
        // not a slow answer.
        let bound = Duration::from_secs(60);
        let answers = async {
            let begin = store
                .begin_update(creates(&a, &[username("after")]))
                .await
                .map(|_| ());
            let commit = store.commit_update(&a, lease.lease_id).await;
            let lookup = store
                .lookup_claim(&username("before").key)
                .await
                .map(|_| ());
            let leases = store
                .list_outstanding_leases(&LeasesQuery::new(a.clone(), None, 10))
                .await
                .map(|_| ());
            let claims = store
                .list_claims(&ClaimsQuery::new(
                    a.clone(),
                    TableName::USERS,
                    ClaimsCursor::at(0),
                    10,
                ))
                .await
                .map(|_| ());
            let collect = store
                .collect_outcomes(Duration::from_secs(1))
                .await
                .map(|_| ());
            [begin, commit, lookup, leases, claims, collect]
        };
        let answers = tokio::time::timeout(bound, answers)
            .await
            .expect("requests to a dead Spanner must not hang");
        for answer in answers {
            assert!(
                matches!(answer, Err(ClaimsError::Unavailable { .. })),
                "{answer:?}"
            );
        }
        let reconnect = SpannerClaimStore::connect(&url, options, MigrationPolicy::Refuse).await;
        assert!(
            matches!(reconnect, Err(ClaimsError::Unavailable { .. })),
            "{reconnect:?}"
        );
    });
}

/// `admin mark-restored` fences the change feed: a watch from any revision before it is refused
/// WATCH_COMPACTED, naming a revision above the restore's commit; a change after it is read.
#[test]
fn mark_restored_refuses_watches_from_before_it() {
    use topology_claims::domain::{EventPosition, EventsQuery, MarkRestored, Timestamp};
    runtime().block_on(async {
        let store = common::fresh_store(common::Mode::Plain).await;
        let a = cell("cell-a");
        let lease = store
            .begin_update(creates(&a, &[username("before")]))
            .await
            .unwrap();
        store.commit_update(&a, lease.lease_id).await.unwrap();
        let before = store
            .lookup_claim(&username("before").key)
            .await
            .unwrap()
            .revision;
        assert!(before > 0);
        let mark = MarkRestored {
            backup_time: Timestamp::from_unix_micros(1_700_000_000_000_000),
            reason: "drill".to_owned(),
            expect_cells: Default::default(),
        };
        store.mark_restored(&mark).await.unwrap();
        let query = |revision: u64| EventsQuery {
            from: EventPosition::start_of(revision),
            limit: 10,
        };
        let refused = store.read_events(&query(before + 1)).await.unwrap_err();
        let ClaimsError::WatchCompacted {
            compact_revision, ..
        } = refused
        else {
            panic!("{refused:?}");
        };
        assert!(compact_revision > before + 1, "{compact_revision}");
        store
            .begin_update(creates(&a, &[username("after")]))
            .await
            .unwrap();
        let page = store.read_events(&query(compact_revision)).await.unwrap();
        assert_eq!(page.events.len(), 1, "{page:?}");
        assert_eq!(page.events[0].claim.record.key, username("after").key);
        store.close().await;
    });
}

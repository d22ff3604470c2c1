//! Embedded migrations: refused when pending under `Refuse`, applied once by `migrate`, safe
//! when several servers migrate the same fresh schema at the same time, and the shared
//! migration-rule cases.

mod common;

use topology_claims::codec::encode_request;
use topology_claims::{ClaimStore, ClaimsError, MigrationPolicy};
use topology_claims_postgres::{migrate_with, PostgresClaimStore};
use topology_claims_testkit::migrations::{before_namespaces, MigrationFixture};

const ALL_MIGRATIONS: &[&str] = &[
    "0001_initial",
    "0002_decommissioned_cells",
    "0003_verification_slots",
    "0004_restore_epochs",
    "0005_namespaces",
    "0006_open_names",
    "0007_claim_events",
    "0008_lease_waits",
];

/// The migrations of the release before namespaces, as it applied them.
const BEFORE_NAMESPACES: &[&str] = &[
    include_str!("../migrations/0001_initial.sql"),
    include_str!("../migrations/0002_decommissioned_cells.sql"),
    include_str!("../migrations/0003_verification_slots.sql"),
    include_str!("../migrations/0004_restore_epochs.sql"),
];

/// A migrated schema of its own, for the shared migration-rule cases (dropped at the end).
struct MigratedSchema {
    admin: tokio_postgres::Client,
    schema: String,
}

impl MigrationFixture for MigratedSchema {
    type Store = PostgresClaimStore;

    async fn record_applied(&self, version: i64, name: &str) {
        let version = i32::try_from(version).expect("a migration version fits int4");
        self.admin
            .execute(
                &format!(
                    "INSERT INTO \"{}\".topology_claims_migrations (version, name) VALUES ($1, $2)",
                    self.schema
                ),
                &[&version, &name],
            )
            .await
            .expect("record a migration");
    }

    async fn reopen(&self, policy: MigrationPolicy) -> Result<PostgresClaimStore, ClaimsError> {
        PostgresClaimStore::connect(&common::url(), common::options(&self.schema), policy).await
    }

    async fn populate_before_namespaces(&self) {
        let schema = &self.schema;
        let admin = &self.admin;
        let run = |sql: String| async move {
            admin
                .batch_execute(&sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
        };
        run(format!(
            "DROP SCHEMA \"{schema}\" CASCADE; CREATE SCHEMA \"{schema}\"; \
             SET search_path TO \"{schema}\"; \
             CREATE TABLE topology_claims_migrations (version integer PRIMARY KEY, \
             name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        ))
        .await;
        for (i, migration) in BEFORE_NAMESPACES.iter().enumerate() {
            run(migration.to_string()).await;
            run(format!(
                "INSERT INTO topology_claims_migrations (version, name) VALUES ({}, '{}')",
                i + 1,
                ALL_MIGRATIONS[i]
            ))
            .await;
        }
        let (claims, lease) = before_namespaces();
        admin
            .execute(
                "INSERT INTO leases (lease_id, cell_id, request, created_at, last_renewed_at) \
                 VALUES ($1, $2, $3, now(), now())",
                &[
                    lease.lease_id.as_uuid(),
                    &lease.cell_id.as_str(),
                    &encode_request(&lease.request),
                ],
            )
            .await
            .unwrap();
        for claim in claims {
            let record = &claim.record;
            let small = |n: i32| i16::try_from(n).unwrap();
            admin
                .execute(
                    "INSERT INTO claims (claim_type, claim_value, owner_type, owner_value, \
                     table_name, table_record_id, cell_id, lease_id, lease_op, created_at, \
                     updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, now(), now())",
                    &[
                        &small(record.key.namespace_number()),
                        &record.key.value,
                        &small(record.owner_type.number()),
                        &record.owner_value,
                        &small(record.table_name.number()),
                        &record.table_record_id,
                        &claim.cell_id.as_str(),
                        &claim.lease.map(|l| *l.lease_id.as_uuid()),
                        &claim.lease.map(|l| small(l.op.number())),
                    ],
                )
                .await
                .unwrap();
        }
        run("RESET search_path".to_owned()).await;
    }
}

impl Drop for MigratedSchema {
    fn drop(&mut self) {
        // Best effort on a runtime of its own: the test's runtime is ending.
        let url = common::url();
        let schema = self.schema.clone();
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(runtime) = runtime {
                runtime.block_on(async {
                    if let Ok(admin) = topology_claims_harness::postgres::connect(&url).await {
                        common::drop_schema(&admin, &schema).await;
                    }
                });
            }
        })
        .join();
    }
}

async fn migrated_schema() -> MigratedSchema {
    let Some(admin) = common::admin().await else {
        common::skip_process();
    };
    let schema = common::fresh_schema_name();
    migrate_with(&common::url(), &common::options(&schema))
        .await
        .expect("migrate");
    MigratedSchema { admin, schema }
}

topology_claims_testkit::migration_conformance!(migrated_schema);

#[tokio::test]
async fn refuse_reports_pending_migrations_until_migrate_applies_them() {
    let Some(admin) = common::admin().await else {
        return;
    };
    let schema = common::fresh_schema_name();
    let refused = PostgresClaimStore::connect(
        &common::url(),
        common::options(&schema),
        MigrationPolicy::Refuse,
    )
    .await;
    match refused {
        Err(ClaimsError::MigrationsPending { pending }) => {
            assert_eq!(pending, ALL_MIGRATIONS)
        }
        other => panic!("expected MigrationsPending, got {other:?}"),
    }
    let applied = migrate_with(&common::url(), &common::options(&schema))
        .await
        .expect("migrate");
    assert_eq!(applied, ALL_MIGRATIONS);
    let again = migrate_with(&common::url(), &common::options(&schema))
        .await
        .expect("migrate again");
    assert!(again.is_empty(), "nothing left to apply: {again:?}");
    let store = PostgresClaimStore::connect(
        &common::url(),
        common::options(&schema),
        MigrationPolicy::Refuse,
    )
    .await
    .expect("an up-to-date schema opens under Refuse");
    let absent = topology_claims_testkit::fixtures::username("nobody").key;
    assert!(matches!(
        store.lookup_claim(&absent).await,
        Err(ClaimsError::ClaimNotFound { .. })
    ));
    common::drop_schema(&admin, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_migrating_the_same_fresh_schema_at_once_all_succeed() {
    let Some(admin) = common::admin().await else {
        return;
    };
    let schema = common::fresh_schema_name();
    let url = common::url();
    let runs = (0..4).map(|_| {
        let (url, options) = (url.clone(), common::options(&schema));
        tokio::spawn(async move { migrate_with(&url, &options).await })
    });
    let mut applied = Vec::new();
    for run in runs.collect::<Vec<_>>() {
        applied.extend(
            run.await
                .expect("task")
                .expect("every concurrent migration succeeds"),
        );
    }
    assert_eq!(applied, ALL_MIGRATIONS, "applied exactly once");
    // And stores opening concurrently on a migrated schema.
    let opens = (0..2).map(|_| {
        let (url, options) = (url.clone(), common::options(&schema));
        tokio::spawn(async move {
            PostgresClaimStore::connect(&url, options, MigrationPolicy::Apply).await
        })
    });
    for open in opens.collect::<Vec<_>>() {
        open.await.expect("task").expect("open");
    }
    common::drop_schema(&admin, &schema).await;
}

#[tokio::test]
async fn an_unreachable_database_is_unavailable_and_a_bad_url_a_configuration_error() {
    let unreachable = PostgresClaimStore::connect(
        "postgres://postgres@127.0.0.1:1/test",
        Default::default(),
        MigrationPolicy::Apply,
    )
    .await;
    match unreachable {
        Err(ClaimsError::Unavailable { message }) => {
            assert!(
                message.contains("127.0.0.1:1"),
                "names the database: {message}"
            );
            assert!(message.contains("refused"), "says why: {message}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let bad = PostgresClaimStore::connect(
        "postgres://u@h/d?nonsense=1",
        Default::default(),
        MigrationPolicy::Apply,
    )
    .await;
    assert!(
        matches!(bad, Err(ClaimsError::Configuration { .. })),
        "{bad:?}"
    );
}

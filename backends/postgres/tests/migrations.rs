//! Embedded migrations: refused when pending under `Refuse`, applied once by `migrate`, and
//! safe when several servers migrate the same fresh schema at the same time.

mod common;

use topology_claims::{ClaimStore, ClaimsError, MigrationPolicy};
use topology_claims_postgres::{migrate_with, PostgresClaimStore};

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
            assert_eq!(pending, vec!["0001_initial"])
        }
        other => panic!("expected MigrationsPending, got {other:?}"),
    }
    let applied = migrate_with(&common::url(), &common::options(&schema))
        .await
        .expect("migrate");
    assert_eq!(applied, vec!["0001_initial"]);
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
    let absent = topology_claims::testing::fixtures::username("nobody").key;
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
    assert_eq!(applied, vec!["0001_initial"], "applied exactly once");
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

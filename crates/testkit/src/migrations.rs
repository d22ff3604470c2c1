//! The migration rule (`topology_claims::migrations`), proven on a real database for every backend that
//! has a schema: an older binary serves a schema a newer one migrated, a diverging history is
//! refused, and an up-to-date schema opens without migrating. Run by
//! [`migration_conformance!`](crate::migration_conformance).

use std::future::Future;

use crate::fixtures::{cell, creates, username};
use topology_claims::error::ClaimsError;
use topology_claims::ports::{ClaimStore, MigrationPolicy};

/// A migrated database of one backend, and the two things the cases do to it.
pub trait MigrationFixture: Send + Sync {
    type Store: ClaimStore;

    /// Records migration `version` / `name` as applied, as another binary would have (the
    /// backend's own `schema_migrations` row, written directly).
    fn record_applied(&self, version: i64, name: &str) -> impl Future<Output = ()> + Send;

    /// Opens the store again, as a freshly started server would, under `policy`.
    fn reopen(
        &self,
        policy: MigrationPolicy,
    ) -> impl Future<Output = Result<Self::Store, ClaimsError>> + Send;
}

/// What a newer release would have recorded: a version above any this binary knows.
pub const NEWER_MIGRATION: (i64, &str) = (9_999, "9999_from_a_newer_binary");
/// What no release records: an unknown version below the ones this binary knows.
pub const FORKED_MIGRATION: (i64, &str) = (0, "0000_fork");

pub async fn a_newer_schema_is_served_by_an_older_binary(fixture: &impl MigrationFixture) {
    fixture
        .record_applied(NEWER_MIGRATION.0, NEWER_MIGRATION.1)
        .await;
    for policy in [MigrationPolicy::Apply, MigrationPolicy::Refuse] {
        let store = fixture.reopen(policy).await.unwrap_or_else(|e| {
            panic!("{policy:?}: an older binary must serve a newer schema: {e}")
        });
        let a = cell("cell-a");
        let record = username(&format!("newer-schema-{policy:?}"));
        let lease = store
            .begin_update(creates(&a, std::slice::from_ref(&record)))
            .await
            .expect("begin on a newer schema");
        store
            .commit_update(&a, lease.lease_id)
            .await
            .expect("commit on a newer schema");
        assert_eq!(store.lookup_claim(&record.key).await.unwrap().cell_id, a);
    }
}

pub async fn a_diverging_schema_history_is_refused(fixture: &impl MigrationFixture) {
    fixture
        .record_applied(FORKED_MIGRATION.0, FORKED_MIGRATION.1)
        .await;
    for policy in [MigrationPolicy::Apply, MigrationPolicy::Refuse] {
        match fixture.reopen(policy).await {
            Err(ClaimsError::Configuration { message }) => {
                assert!(message.contains("diverges"), "{policy:?}: {message}");
                assert!(
                    message.contains(FORKED_MIGRATION.1),
                    "{policy:?}: {message}"
                );
            }
            Err(other) => panic!("{policy:?}: expected a configuration error, got {other}"),
            Ok(_) => panic!("{policy:?}: a diverging schema history must be refused"),
        }
    }
}

pub async fn an_up_to_date_schema_opens_without_migrating(fixture: &impl MigrationFixture) {
    for policy in [MigrationPolicy::Refuse, MigrationPolicy::Apply] {
        fixture
            .reopen(policy)
            .await
            .unwrap_or_else(|e| panic!("{policy:?}: an up-to-date schema must open: {e}"));
    }
}

/// Expands to one `#[test]` per case of [`crate::migrations`], each calling
/// `$fixture().await` for a freshly migrated database of its own.
#[macro_export]
macro_rules! migration_conformance {
    ($fixture:path) => {
        mod migration_conformance {
            #[allow(unused_imports)]
            use super::*;
            $crate::__migration_cases!(
                $fixture;
                a_newer_schema_is_served_by_an_older_binary,
                a_diverging_schema_history_is_refused,
                an_up_to_date_schema_opens_without_migrating,
            );
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __migration_cases {
    ($fixture:path; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::run_async(async {
                    let fixture = $fixture().await;
                    $crate::migrations::$case(&fixture).await;
                });
            }
        )*
    };
}

//! The migration rule (`topology_claims::migrations`), proven on a real database for every backend that
//! has a schema: an older binary serves a schema a newer one migrated, a diverging history is
//! refused, and an up-to-date schema opens without migrating. Run by
//! [`migration_conformance!`](crate::migration_conformance).

use std::future::Future;

use crate::fixtures::{cell, creates, key, lease_id, record_in, route, username};
use topology_claims::domain::{
    BeginUpdate, Claim, ClaimLease, ClaimState, ClaimType, Lease, LeaseOp, TableName, Timestamp,
};
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

    /// Replaces the database with one the previous release left: its schema as it was before
    /// namespaces (every migration up to the one before them, recorded), holding exactly
    /// [`before_namespaces`]'s rows, written with the backend's own column encodings.
    fn populate_before_namespaces(&self) -> impl Future<Output = ()> + Send;
}

/// The rows of a store populated before namespaces: committed claims (`usernames`: `John` of
/// cell-a, `amy` of cell-b; `emails`: `Ann@Example.com` of cell-a and `ann@example.com` of
/// cell-b, which `precis-username` would make one), and cell-a's outstanding lease creating the
/// route `Docs` (its key would change).
pub fn before_namespaces() -> (Vec<Claim>, Lease) {
    let at = Timestamp::from_unix_micros(1_700_000_000_000_000);
    let claim = |cell_id: &str, record, lease| Claim {
        record,
        cell_id: cell(cell_id),
        lease,
        created_at: at,
        updated_at: at,
        revision: 0,
    };
    let docs = route("Docs");
    let lease = Lease {
        lease_id: lease_id(0xD0C5),
        cell_id: cell("cell-a"),
        created_at: at,
        last_renewed_at: at,
        request: BeginUpdate {
            lease_id: Some(lease_id(0xD0C5)),
            ..creates(&cell("cell-a"), std::slice::from_ref(&docs))
        },
    };
    let email = |value: &str| record_in(TableName::EMAILS, 2, ClaimType::Email, value);
    let claims = vec![
        claim("cell-a", username("John"), None),
        claim("cell-b", username("amy"), None),
        claim("cell-a", email("Ann@Example.com"), None),
        claim("cell-b", email("ann@example.com"), None),
        claim(
            "cell-a",
            docs,
            Some(ClaimLease {
                lease_id: lease.lease_id,
                op: LeaseOp::Create,
            }),
        ),
    ];
    (claims, lease)
}

/// Who holds `value` of `claim_type` and in which state (`None`: not found).
async fn holder(
    store: &impl ClaimStore,
    claim_type: ClaimType,
    value: &str,
) -> Option<(String, String, ClaimState)> {
    match store.lookup_claim(&key(claim_type, value)).await {
        Ok(claim) => Some((
            claim.cell_id.to_string(),
            claim.record.display_value().to_owned(),
            claim.state(),
        )),
        Err(ClaimsError::ClaimNotFound { .. }) => None,
        Err(other) => panic!("lookup of {value:?}: {other}"),
    }
}

pub async fn a_store_from_before_namespaces_keeps_its_claims_and_adopts_precis_where_it_can(
    fixture: &impl MigrationFixture,
) {
    fixture.populate_before_namespaces().await;
    let store = fixture
        .reopen(MigrationPolicy::Apply)
        .await
        .expect("a store from before namespaces opens and migrates");
    let (a, b) = (cell("cell-a").to_string(), cell("cell-b").to_string());
    let active = ClaimState::Active;
    // usernames adopted precis-username: John is found by any form and keeps its display form.
    for form in ["John", "john", "ＪＯＨＮ"] {
        assert_eq!(
            holder(&store, ClaimType::Username, form).await,
            Some((a.clone(), "John".into(), active)),
            "usernames: {form:?}"
        );
    }
    assert!(matches!(
        store
            .begin_update(creates(&cell("cell-b"), &[username("JOHN")]))
            .await,
        Err(ClaimsError::ClaimTaken { .. })
    ));
    // emails kept exact: the two claims precis-username would merge both stay, byte for byte.
    assert_eq!(
        holder(&store, ClaimType::Email, "Ann@Example.com").await,
        Some((a.clone(), "Ann@Example.com".into(), active))
    );
    assert_eq!(
        holder(&store, ClaimType::Email, "ann@example.com").await,
        Some((b.clone(), "ann@example.com".into(), active))
    );
    assert_eq!(
        holder(&store, ClaimType::Email, "ANN@example.com").await,
        None
    );
    // routes waits for its lease (a key it would rewrite): exact until the next open.
    assert_eq!(
        holder(&store, ClaimType::Routes, "Docs").await,
        Some((a.clone(), "Docs".into(), ClaimState::Creating))
    );
    assert_eq!(holder(&store, ClaimType::Routes, "docs").await, None);
    let (_, lease) = before_namespaces();
    store
        .commit_update(&lease.cell_id, lease.lease_id)
        .await
        .expect("the lease from before namespaces commits");
    drop(store);
    let store = fixture
        .reopen(MigrationPolicy::Apply)
        .await
        .expect("reopened");
    assert_eq!(
        holder(&store, ClaimType::Routes, "docs").await,
        Some((a, "Docs".into(), active)),
        "routes adopted precis-username once its lease ended"
    );
    assert_eq!(
        holder(&store, ClaimType::Username, "AMY")
            .await
            .map(|h| h.0),
        Some(b)
    );
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
                a_store_from_before_namespaces_keeps_its_claims_and_adopts_precis_where_it_can,
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

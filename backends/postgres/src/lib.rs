//! # topology-claims-postgres
//!
//! PostgreSQL adapters of the topology-claims ports, on tokio-postgres with a deadpool pool:
//!
//! - [`PostgresClaimStore`]: the service's [`ClaimStore`](topology_claims::ClaimStore)
//!   (`serve --store postgres://USER@HOST:PORT/DB`);
//! - [`PostgresLocalLeaseStore`]: a cell's `leases_outstanding` table, recorded inside the
//!   application's own `tokio_postgres::Transaction`, and the cell's `LocalLock`;
//! - [`migrate`] / [`migrate_with`]: the embedded, versioned schema migrations
//!   (`topology-claims migrate --store postgres://…`).
//!
//! Every transaction reads and locks the rows a request touches, asks `topology_claims::domain`
//! for the decision and writes it: no protocol rule lives here. A BeginUpdate, CommitUpdate or
//! RollbackUpdate costs **2 round trips** (statements pipelined; see `store.rs` for the table).
//! All SQL is in one private module; [`baseline`] hands the statements of a BeginUpdate +
//! CommitUpdate pair to the raw-SQL benchmark baseline, so it runs the very statements the
//! adapter runs.
//!
//! Schema, indexes, migrations, pool sizing and timeouts: `docs/backends/postgres.md`.

mod admin;
pub mod cell;
mod error;
mod local;
mod locks;
mod migrations;
mod namespaces;
mod options;
mod reads;
mod restore;
mod rows;
mod session;
mod sql;
mod store;
pub mod tls;
pub mod transfer;
mod wait_line;
mod watch;

/// The statements of a BeginUpdate + CommitUpdate pair, exactly as the adapter runs them, for
/// the raw-SQL baseline of the benchmark (`tools/bench`): the ratio service / raw SQL is then the
/// cost of gRPC + domain + pool on the same SQL. Not a store: it decides nothing.
pub mod baseline {
    /// A lease's advisory locks (`AdvisoryLocks::lease`), the parameters of `LOCK_ADVISORY`.
    pub use crate::locks::AdvisoryLocks;
    /// A batch's claims as the parallel arrays of `INSERT_CLAIMS` / `MARK_CLAIMS`, in the
    /// adapter's lock (key) order.
    pub use crate::rows::RecordArrays;
    pub use crate::sql::{
        BEGIN, COMMIT, DELETE_CLAIMS_OF_LEASE, DELETE_LEASE, INSERT_CLAIMS, INSERT_LEASE,
        INSERT_OUTCOME, LOCK_ADVISORY, LOCK_CLAIMS_OF_LEASE, MARK_CLAIMS, RELEASE_CLAIMS_OF_LEASE,
        ROLLBACK, SELECT_CLAIMS_FOR_UPDATE, SELECT_LEASE_FOR_UPDATE, SELECT_OUTCOME_FOR_UPDATE,
    };
}

pub use local::{ensure_local_schema, record_in, PostgresLocalLeaseStore, LOCAL_LEASES_DDL};
pub use locks::ADVISORY_LOCKS_PER_TRANSACTION;
pub use options::{redacted_url, PostgresOptions, DEFAULT_APPLICATION_NAME};
pub use session::StoreStats;
pub use sql::{ESTIMATE_EVENTS, OLDEST_EVENTS, REPLAN_EVERY};
pub use store::PostgresClaimStore;
pub use watch::COMPACT_BATCH;
/// The driver and pool versions this crate is built on (for `Tx` and `pool()` users).
pub use {deadpool_postgres, tokio_postgres};

use topology_claims::{ClaimsError, MigrationPolicy};

/// Applies the pending migrations to the database at `url` (its default search_path schema);
/// returns the names of those applied, empty when the schema was up to date.
pub async fn migrate(url: &str) -> Result<Vec<String>, ClaimsError> {
    migrate_with(url, &PostgresOptions::default()).await
}

/// [`migrate`] with options (e.g. a `schema`).
pub async fn migrate_with(
    url: &str,
    options: &PostgresOptions,
) -> Result<Vec<String>, ClaimsError> {
    let options = PostgresOptions {
        pool_size: 1,
        ..options.clone()
    };
    let settings = options::Settings::new(url, &options)?;
    let pool = settings.pool(&options)?;
    migrations::prepare(
        &pool,
        &settings.target,
        options.schema.as_deref(),
        MigrationPolicy::Apply,
    )
    .await
}

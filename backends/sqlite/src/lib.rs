//! # topology-claims-sqlite
//!
//! SQLite adapters of both ports of `topology-claims`:
//!
//! - [`SqliteClaimStore`], the service's [`ClaimStore`](topology_claims::ClaimStore) on one
//!   database file (the `sqlite://PATH` store of `topology-claims serve`);
//! - [`SqliteLocalLeaseStore`], a cell's own `leases_outstanding` table when the cell's local
//!   database is SQLite.
//!
//! The crate does I/O only. Every protocol rule lives in `topology_claims::domain`: each write
//! reads the rows a request touches, asks the domain, and writes exactly what it decided (the
//! twin of `topology_claims::domain::Tables`, statement for statement).
//!
//! ## Schema (`migrations/0001_initial.sql`, `0002_decommissioned_cells.sql`,
//! `0003_verification_slots.sql`, `0004_claim_updates.sql`, `0005_restore_epochs.sql`)
//!
//! | table | key | columns |
//! |---|---|---|
//! | `claims` | `(claim_type, claim_value)` | `cell_id`, `owner_type`, `owner_value`, `table_name`, `table_record_id`, `lease_id` (NULL when committed), `lease_op` (0 none, 1 create, 2 destroy, 3 update), `created_at`, `updated_at` |
//! | `leases_outstanding` | `lease_id` | `cell_id`, `request` (protobuf `BeginUpdateRequest` bytes), `created_at`, `last_renewed_at` |
//! | `lease_outcomes` | `lease_id` | `cell_id`, `outcome` (1 committed, 2 rolled back), `decided_at` |
//! | `decommissioned_cells` | `cell_id` | `decommissioned_at` (BeginUpdate of a listed cell is refused) |
//! | `verification_slots` | `(cell_id, holder)` | `expires_at` (a row past it is a free slot) |
//! | `restore_epochs` | `epoch` | `backup_time`, `marked_at`, `reason`, `expected_cells` (cell ids joined with `'\n'`, empty for none), `lifted_at` + `lift_reason` (NULL while quarantined); every epoch stays, the highest is the store's state |
//! | `restore_reports` | `(epoch, cell_id)` | `reported_at` (a cell's whole verification pass in that epoch) |
//!
//! Timestamps are INTEGER unix microseconds from the store's [`Clock`](topology_claims::Clock),
//! lease ids lowercase hyphenated TEXT (TEXT order is then UUID order, the order of
//! ListOutstandingLeases), enums their INTEGER wire numbers. Tables are `STRICT`; a foreign key
//! (`claims.lease_id` → `leases_outstanding`) and a `CHECK` tying `lease_op` to `lease_id` are
//! the database's own check of the invariants. Indexes: `claims(lease_id)` (partial, leased rows
//! only), `claims(cell_id, table_name, table_record_id, claim_type, claim_value)` (a ListClaims
//! page is one range scan of it, and so is a decommission step's count or bounded delete),
//! `leases_outstanding(cell_id, lease_id)`,
//! `lease_outcomes(decided_at)`.
//!
//! ## Transaction shape
//!
//! Each write is one `BEGIN IMMEDIATE … COMMIT`: the write lock is taken before the first read,
//! so the rows a decision is based on cannot change before its writes land. A BeginUpdate of
//! `C` creates and `D` destroys (`N = C + D`) runs
//!
//! 1. 1–2 point reads: the lease id in `leases_outstanding`, else in `lease_outcomes`;
//! 2. `N` point reads of the batch's claims by primary key;
//! 3. if the domain says apply: 1 `INSERT` of the lease, `C` `INSERT`s of claims, `D`
//!    conditional `UPDATE … WHERE lease_id IS NULL AND cell_id = ?`;
//!
//! so at most `2N + 3` statements, all prepared once and cached, none of them a network round
//! trip. CommitUpdate/RollbackUpdate: 1–2 reads, then one conditional `DELETE` or `UPDATE … WHERE
//! lease_id = ?` per claim of the lease, the lease row's `DELETE` and the outcome's `INSERT`.
//! RenewLease: 1–2 reads and one `UPDATE`. A restore mark reads the latest epoch (2 statements)
//! and the cells holding claims (a skip scan of the record index, one probe per cell) or
//! outstanding leases, then inserts one row; a report or lift reads the latest epoch and writes
//! at most one insert and one conditional `UPDATE`. ListClaims reads 1 range (plus, when a page ends
//! inside a record id, that record's claims and one `EXISTS`) in one read snapshot.
//!
//! A conditional write that matches nothing, or a constraint violation, means some other writer
//! got in (another process on the same file): the whole transaction is re-run (at most 4
//! attempts), so the domain decides again on fresh rows. SQLite BUSY/LOCKED is retried the same
//! way after the 5 s `busy_timeout`; I/O failures become `Unavailable`, anything else `Internal`.
//!
//! The store has a single connection behind a mutex, used on tokio's blocking threads. SQLite
//! admits one writer at a time anyway, and one connection keeps the ordering of timestamps and
//! commits the same.
//!
//! ## Durability
//!
//! `journal_mode=WAL` with `synchronous=FULL` by default ([`Synchronous::Full`]): COMMIT returns
//! only after the WAL is fsynced, so an answered request survives a crash of the process, of the
//! OS, and a power loss, at one disk flush per write transaction (group commit shares it among
//! the calls of a group). [`Synchronous::Normal`] (`serve --sqlite-synchronous normal`) fsyncs
//! only at checkpoints: still safe against a crash or kill of the process, and the file is never
//! corrupted, but a power loss or OS crash can lose the last answered writes (the database rolls
//! back to a consistent earlier state). Decision 073.
//!
//! ## Migrations
//!
//! Embedded in the binary and recorded in `schema_migrations(version, name, applied_at)`. At
//! [`SqliteClaimStore::open`] pending ones are applied in one transaction
//! ([`MigrationPolicy::Apply`](topology_claims::MigrationPolicy)) or refused with
//! `ClaimsError::MigrationsPending` (`Refuse`); [`migrate`] applies them alone.

pub mod backup;
pub mod cell;
mod connection;
mod error;
mod local;
pub mod lock;
mod migrations;
mod namespaces;
mod restore;
mod rows;
mod store;
pub mod transfer;
mod wait_line;
mod watch;

use std::path::Path;
use std::sync::Arc;

use topology_claims::{ClaimsError, MigrationPolicy, SystemClock};

pub use connection::{SqliteOptions, Synchronous};
pub use local::{ensure_local_schema, SqliteLocalLeaseStore, LOCAL_LEASES_DDL};
pub use store::SqliteClaimStore;

/// Applies the pending schema migrations to the service's database at `path` (creating the
/// file if needed), committing with [`SqliteOptions::default`]; returns the names of those
/// applied, empty if the schema was up to date.
pub async fn migrate(path: impl AsRef<Path>) -> Result<Vec<String>, ClaimsError> {
    let (_conn, applied) = store::open_migrated(
        path.as_ref().to_path_buf(),
        SqliteOptions::default(),
        MigrationPolicy::Apply,
        Arc::new(SystemClock),
    )
    .await?;
    Ok(applied)
}

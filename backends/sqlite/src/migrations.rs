//! The service schema's migrations: embedded in the binary, numbered, recorded in
//! `schema_migrations(version, name, applied_at)`, and applied all together in one transaction.
//!
//! Owns the schema's history. Must not run at any other moment than opening a store or
//! `migrate`: requests never wait for DDL.

use std::collections::BTreeMap;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};
use topology_claims::migrations::{plan_migrations, MigrationId, MigrationPlan};
use topology_claims::{Clock, MigrationPolicy};

use crate::error::StoreError;

/// One step of the schema. `version`s are strictly increasing; an applied step never changes.
struct Migration {
    version: i64,
    name: &'static str,
    sql: &'static str,
}

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "0001_initial",
        sql: include_str!("../migrations/0001_initial.sql"),
    },
    Migration {
        version: 2,
        name: "0002_decommissioned_cells",
        sql: include_str!("../migrations/0002_decommissioned_cells.sql"),
    },
    Migration {
        version: 3,
        name: "0003_verification_slots",
        sql: include_str!("../migrations/0003_verification_slots.sql"),
    },
    Migration {
        version: 4,
        name: "0004_claim_updates",
        sql: include_str!("../migrations/0004_claim_updates.sql"),
    },
    Migration {
        version: 5,
        name: "0005_restore_epochs",
        sql: include_str!("../migrations/0005_restore_epochs.sql"),
    },
    Migration {
        version: 6,
        name: "0006_namespaces",
        sql: include_str!("../migrations/0006_namespaces.sql"),
    },
    Migration {
        version: 7,
        name: "0007_open_names",
        sql: include_str!("../migrations/0007_open_names.sql"),
    },
    Migration {
        version: 8,
        name: "0008_claim_events",
        sql: include_str!("../migrations/0008_claim_events.sql"),
    },
    Migration {
        version: 9,
        name: "0009_lease_waits",
        sql: include_str!("../migrations/0009_lease_waits.sql"),
    },
    Migration {
        version: 10,
        name: "0010_watch_event_count",
        sql: include_str!("../migrations/0010_watch_event_count.sql"),
    },
];

const CREATE_SCHEMA_MIGRATIONS: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL,
    applied_at INTEGER NOT NULL
)";

/// The versions recorded in the file, with their names (empty for a fresh file).
fn applied(conn: &Connection) -> rusqlite::Result<BTreeMap<i64, String>> {
    let exists = conn
        .query_row(
            "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'schema_migrations'",
            [],
            |_| Ok(()),
        )
        .optional()?
        .is_some();
    if !exists {
        return Ok(BTreeMap::new());
    }
    let mut statement = conn.prepare("SELECT version, name FROM schema_migrations")?;
    let rows = statement.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
    rows.collect()
}

/// What the core's one migration rule says for this file (`topology_claims::migrations`).
fn plan(
    applied: &BTreeMap<i64, String>,
    policy: MigrationPolicy,
) -> Result<MigrationPlan, StoreError> {
    let known: Vec<MigrationId> = MIGRATIONS
        .iter()
        .map(|m| MigrationId::new(m.version, m.name))
        .collect();
    let applied: Vec<MigrationId> = applied
        .iter()
        .map(|(version, name)| MigrationId::new(*version, name.clone()))
        .collect();
    let plan = plan_migrations(&known, &applied, policy)?;
    if let Some(warning) = plan.newer_warning() {
        tracing::warn!("SQLite: {warning}");
    }
    Ok(plan)
}

/// The name of the newest migration (what a store at this binary's schema has last applied).
pub(crate) fn latest_name() -> &'static str {
    MIGRATIONS.last().map_or("", |m| m.name)
}

fn migration(version: i64) -> &'static Migration {
    MIGRATIONS
        .iter()
        .find(|m| m.version == version)
        .expect("the plan names only this binary's migrations")
}

/// Applies or refuses the pending migrations as the core's rule says; returns the names applied.
///
/// Everything happens in one `BEGIN IMMEDIATE` transaction: two processes migrating the same
/// file serialize on the write lock, and the second one finds nothing left to do.
pub(crate) fn run(
    conn: &mut Connection,
    policy: MigrationPolicy,
    clock: &dyn Clock,
) -> Result<Vec<String>, StoreError> {
    run_logged(conn, policy, clock, true)
}

/// [`run`], logging each migration applied when `log` (not for a backup file being built,
/// whose schema is new by definition).
pub(crate) fn run_logged(
    conn: &mut Connection,
    policy: MigrationPolicy,
    clock: &dyn Clock,
    log: bool,
) -> Result<Vec<String>, StoreError> {
    if policy == MigrationPolicy::Refuse {
        // Only reads: refusing leaves the schema exactly as it was, not even schema_migrations.
        plan(&applied(conn)?, policy)?;
        return Ok(Vec::new());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(CREATE_SCHEMA_MIGRATIONS)?;
    let plan = plan(&applied(&tx)?, policy)?;
    let now = clock.now().as_unix_micros();
    let mut names = Vec::with_capacity(plan.pending.len());
    for migration in plan.pending.into_iter().map(migration) {
        tx.execute_batch(migration.sql)?;
        tx.execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?1, ?2, ?3)",
            (migration.version, migration.name, now),
        )?;
        if log {
            tracing::info!(
                migration = migration.name,
                "applied SQLite schema migration"
            );
        }
        names.push(migration.name.to_owned());
    }
    tx.commit()?;
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migration_versions_strictly_increase() {
        assert!(MIGRATIONS.windows(2).all(|w| w[0].version < w[1].version));
        assert!(MIGRATIONS
            .iter()
            .all(|m| m.name.starts_with(&format!("{:04}_", m.version))));
    }
}

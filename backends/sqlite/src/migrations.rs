//! The service schema's migrations: embedded in the binary, numbered, recorded in
//! `schema_migrations(version, name, applied_at)`, and applied all together in one transaction.
//!
//! Owns the schema's history. Must not run at any other moment than opening a store or
//! `migrate`: requests never wait for DDL.

use std::collections::BTreeMap;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};
use topology_claims::{ClaimsError, Clock, MigrationPolicy};

use crate::error::StoreError;

/// One step of the schema. `version`s are strictly increasing; an applied step never changes.
struct Migration {
    version: i64,
    name: &'static str,
    sql: &'static str,
}

const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    name: "0001_initial",
    sql: include_str!("../migrations/0001_initial.sql"),
}];

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

/// The migrations this binary has and the file lacks, in order. A file migrated by a newer
/// binary (a version this one does not know) is refused: this binary cannot know what that
/// schema means.
fn pending(applied: &BTreeMap<i64, String>) -> Result<Vec<&'static Migration>, StoreError> {
    if let Some((version, name)) = applied
        .iter()
        .find(|(v, _)| !MIGRATIONS.iter().any(|m| m.version == **v))
    {
        return Err(ClaimsError::Configuration {
            message: format!(
                "the database has schema migration {version} ({name}), which this binary does \
                 not know: it was migrated by a newer topology-claims"
            ),
        }
        .into());
    }
    Ok(MIGRATIONS
        .iter()
        .filter(|m| !applied.contains_key(&m.version))
        .collect())
}

/// Applies or refuses the pending migrations as `policy` says; returns the names applied.
///
/// Everything happens in one `BEGIN IMMEDIATE` transaction: two processes migrating the same
/// file serialize on the write lock, and the second one finds nothing left to do.
pub(crate) fn run(
    conn: &mut Connection,
    policy: MigrationPolicy,
    clock: &dyn Clock,
) -> Result<Vec<String>, StoreError> {
    if policy == MigrationPolicy::Refuse {
        // Only reads: refusing leaves the schema exactly as it was, not even schema_migrations.
        let pending = pending(&applied(conn)?)?;
        if !pending.is_empty() {
            return Err(ClaimsError::MigrationsPending {
                pending: pending.iter().map(|m| m.name.to_owned()).collect(),
            }
            .into());
        }
        return Ok(Vec::new());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(CREATE_SCHEMA_MIGRATIONS)?;
    let pending = pending(&applied(&tx)?)?;
    let now = clock.now().as_unix_micros();
    let mut names = Vec::with_capacity(pending.len());
    for migration in pending {
        tx.execute_batch(migration.sql)?;
        tx.execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?1, ?2, ?3)",
            (migration.version, migration.name, now),
        )?;
        tracing::info!(
            migration = migration.name,
            "applied SQLite schema migration"
        );
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

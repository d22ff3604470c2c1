//! Applies the embedded migrations of `sql::MIGRATIONS`, or refuses to run behind them.
//!
//! All pending migrations are applied in ONE transaction that first takes
//! `pg_advisory_xact_lock(MIGRATION_LOCK_CLASS, hashtext(schema))`: servers starting at once on
//! the same schema queue behind each other, and the later ones find nothing left to do. A failed
//! migration leaves the schema exactly as it was (PostgreSQL DDL is transactional).
//!
//! Owns schema versioning only; the statements themselves live in `sql.rs`.

use std::collections::BTreeSet;

use deadpool_postgres::Pool;
use topology_claims::{ClaimsError, MigrationPolicy};

use crate::error::{final_error, pool_error};
use crate::sql;

/// At open: applies pending migrations (`Apply`), or fails with `MigrationsPending` (`Refuse`).
/// Returns the names of the migrations applied.
pub(crate) async fn prepare(
    pool: &Pool,
    target: &str,
    schema: Option<&str>,
    policy: MigrationPolicy,
) -> Result<Vec<String>, ClaimsError> {
    let mut client = pool.get().await.map_err(|e| pool_error(e, target))?;
    match policy {
        MigrationPolicy::Apply => apply(&mut client, target, schema).await,
        MigrationPolicy::Refuse => {
            let pending = pending(&client, target).await?;
            if pending.is_empty() {
                Ok(Vec::new())
            } else {
                Err(ClaimsError::MigrationsPending { pending })
            }
        }
    }
}

/// Names of the migrations not yet applied to the connection's schema (search_path).
async fn pending(
    client: &tokio_postgres::Client,
    target: &str,
) -> Result<Vec<String>, ClaimsError> {
    let fail = |e: tokio_postgres::Error| final_error(&e, target, "reading the schema version");
    let exists: bool = client
        .query_one(sql::MIGRATIONS_TABLE_EXISTS, &[])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(fail)?;
    let applied = if exists {
        applied_versions(
            client
                .query(sql::SELECT_APPLIED_MIGRATIONS, &[])
                .await
                .map_err(fail)?,
        )
        .map_err(fail)?
    } else {
        BTreeSet::new()
    };
    Ok(sql::MIGRATIONS
        .iter()
        .filter(|m| !applied.contains(&m.version))
        .map(|m| m.name.to_owned())
        .collect())
}

fn applied_versions(
    rows: Vec<tokio_postgres::Row>,
) -> Result<BTreeSet<i32>, tokio_postgres::Error> {
    rows.iter().map(|row| row.try_get(0)).collect()
}

async fn apply(
    client: &mut tokio_postgres::Client,
    target: &str,
    schema: Option<&str>,
) -> Result<Vec<String>, ClaimsError> {
    let fail = |doing: &'static str| failed(target, doing);
    // Dropped without commit (any error below): the driver rolls back.
    let tx = client
        .transaction()
        .await
        .map_err(fail("starting the migration transaction"))?;
    tx.batch_execute(sql::MIGRATION_NO_STATEMENT_TIMEOUT)
        .await
        .map_err(fail("starting the migration transaction"))?;
    tx.execute(sql::LOCK_MIGRATIONS, &[&sql::MIGRATION_LOCK_CLASS, &schema])
        .await
        .map_err(fail("taking the migration lock"))?;
    if let Some(schema) = schema {
        tx.batch_execute(&sql::create_schema(schema)?)
            .await
            .map_err(fail("creating the schema"))?;
    }
    tx.batch_execute(sql::CREATE_MIGRATIONS_TABLE)
        .await
        .map_err(fail("creating the migrations table"))?;
    let applied = applied_versions(
        tx.query(sql::SELECT_APPLIED_MIGRATIONS, &[])
            .await
            .map_err(fail("reading the schema version"))?,
    )
    .map_err(fail("reading the schema version"))?;
    if let Some(newest) = applied.last().filter(|v| **v > latest_version()) {
        // Migrations only add: an older binary keeps working beside a newer schema.
        tracing::warn!(
            schema_version = newest,
            binary_version = latest_version(),
            "the PostgreSQL schema is newer than this binary"
        );
    }
    let mut names = Vec::new();
    for migration in sql::MIGRATIONS
        .iter()
        .filter(|m| !applied.contains(&m.version))
    {
        let doing = format!("applying migration {}", migration.name);
        tx.batch_execute(migration.sql)
            .await
            .map_err(failed(target, &doing))?;
        tx.execute(
            sql::INSERT_APPLIED_MIGRATION,
            &[&migration.version, &migration.name],
        )
        .await
        .map_err(failed(target, &doing))?;
        names.push(migration.name.to_owned());
    }
    tx.commit()
        .await
        .map_err(fail("committing the migrations"))?;
    if !names.is_empty() {
        tracing::info!(target_db = target, applied = ?names, "PostgreSQL migrations applied");
    }
    Ok(names)
}

fn failed<'a>(
    target: &'a str,
    doing: &'a str,
) -> impl Fn(tokio_postgres::Error) -> ClaimsError + 'a {
    move |e| final_error(&e, target, doing)
}

fn latest_version() -> i32 {
    sql::MIGRATIONS.last().map_or(0, |m| m.version)
}

//! Applies the embedded migrations of `sql::MIGRATIONS`, or refuses to run behind them.
//!
//! All pending migrations are applied in ONE transaction that first takes
//! `pg_advisory_xact_lock(MIGRATION_LOCK_CLASS, hashtext(schema))`: servers starting at once on
//! the same schema queue behind each other, and the later ones find nothing left to do. A failed
//! migration leaves the schema exactly as it was (PostgreSQL DDL is transactional).
//!
//! Owns schema versioning only; the statements themselves live in `sql.rs`.

use deadpool_postgres::Pool;
use topology_claims::migrations::{plan_migrations, MigrationId, MigrationPlan};
use topology_claims::{ClaimsError, MigrationPolicy};

use crate::error::{final_error, pool_error};
use crate::sql;

/// At open: applies pending migrations (`Apply`), or fails with `MigrationsPending` (`Refuse`),
/// as the core's one migration rule says (`topology_claims::migrations`). Returns the names of
/// the migrations applied.
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
            // Only reads: refusing leaves the schema exactly as it was.
            let fail =
                |e: tokio_postgres::Error| final_error(&e, target, "reading the schema version");
            let exists: bool = client
                .query_one(sql::MIGRATIONS_TABLE_EXISTS, &[])
                .await
                .and_then(|row| row.try_get(0))
                .map_err(fail)?;
            let applied = if exists {
                applied_migrations(
                    client
                        .query(sql::SELECT_APPLIED_MIGRATIONS, &[])
                        .await
                        .map_err(fail)?,
                )
                .map_err(fail)?
            } else {
                Vec::new()
            };
            plan(&applied, policy, target)?;
            Ok(Vec::new())
        }
    }
}

fn applied_migrations(
    rows: Vec<tokio_postgres::Row>,
) -> Result<Vec<MigrationId>, tokio_postgres::Error> {
    rows.iter()
        .map(|row| {
            let version: i32 = row.try_get(0)?;
            Ok(MigrationId::new(
                i64::from(version),
                row.try_get::<_, String>(1)?,
            ))
        })
        .collect()
}

/// What the core's rule says for these applied migrations (warning once for a newer schema).
fn plan(
    applied: &[MigrationId],
    policy: MigrationPolicy,
    target: &str,
) -> Result<MigrationPlan, ClaimsError> {
    let known: Vec<MigrationId> = sql::MIGRATIONS
        .iter()
        .map(|m| MigrationId::new(i64::from(m.version), m.name))
        .collect();
    let plan = plan_migrations(&known, applied, policy)?;
    if let Some(warning) = plan.newer_warning() {
        tracing::warn!(target_db = target, "PostgreSQL: {warning}");
    }
    Ok(plan)
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
    let applied = applied_migrations(
        tx.query(sql::SELECT_APPLIED_MIGRATIONS, &[])
            .await
            .map_err(fail("reading the schema version"))?,
    )
    .map_err(fail("reading the schema version"))?;
    let plan = plan(&applied, MigrationPolicy::Apply, target)?;
    let mut names = Vec::new();
    for version in plan.pending {
        let migration = sql::MIGRATIONS
            .iter()
            .find(|m| i64::from(m.version) == version)
            .expect("the plan names only this binary's migrations");
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
    // Under the migration lock, so servers starting at once adopt once.
    crate::namespaces::adopt_builtins(&tx, target)
        .await
        .map_err(fail("adopting precis-username for the built-in namespaces"))?;
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

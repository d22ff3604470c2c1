//! A PostgreSQL store as rows and back (`topology-claims backup` / `restore`; decision 112): the
//! rows a SQLite backup file holds (`topology_claims::transfer`).
//!
//! Export reads every table in one `REPEATABLE READ READ ONLY` transaction (one snapshot while
//! `serve` keeps writing) through cursors, a chunk at a time. Import writes into a store at this
//! binary's schema, in one transaction, after taking the serving lock exclusively: every `serve`
//! holds it shared for its life (`PostgresClaimStore::connect`), so a restore is refused while a
//! server uses the store, and a server that starts meanwhile waits for the restore to end.

use tokio_postgres::types::ToSql;
use topology_claims::transfer::{Kind, Value, TABLES};
use topology_claims::ClaimsError;

use crate::options::{PostgresOptions, Settings};
use crate::sql;

/// Rows per chunk handed over or inserted (an insert binds at most 65,535 parameters).
pub const CHUNK_ROWS: usize = 1000;

fn failed(what: &str, target: &str, e: impl std::fmt::Display) -> ClaimsError {
    ClaimsError::Internal {
        message: format!("{what} ({target}): {e}"),
    }
}

/// One client of the store at `url`.
async fn client(
    url: &str,
    options: &PostgresOptions,
) -> Result<(deadpool_postgres::Object, String), ClaimsError> {
    let options = PostgresOptions {
        pool_size: 1,
        ..options.clone()
    };
    let settings = Settings::new(url, &options)?;
    let pool = settings.pool(&options)?;
    let client = pool
        .get()
        .await
        .map_err(|e| crate::error::pool_error(e, &settings.target))?;
    Ok((client, settings.target))
}

/// A connection of its own holding the serving lock shared, for a store's life. Waits (up to the
/// statement timeout) while a restore of the store runs.
pub(crate) async fn hold_serving_lock(
    settings: &Settings,
    options: &PostgresOptions,
) -> Result<deadpool_postgres::Object, ClaimsError> {
    let one = PostgresOptions {
        pool_size: 1,
        ..options.clone()
    };
    let client = settings
        .pool(&one)?
        .get()
        .await
        .map_err(|e| crate::error::pool_error(e, &settings.target))?;
    client
        .execute(sql::LOCK_SERVING_SHARED, &[&sql::SERVING_LOCK_CLASS])
        .await
        .map_err(|e| {
            failed(
                "taking the serving lock (is a restore of this store running?)",
                &settings.target,
                e,
            )
        })?;
    Ok(client)
}

/// Refuses a store whose newest migration is not this binary's: the rows of one schema fit only
/// the same schema.
async fn check_schema(client: &tokio_postgres::Client, target: &str) -> Result<(), ClaimsError> {
    let latest = sql::MIGRATIONS.last().map_or("", |m| m.name);
    let row = client
        .query_opt(
            "SELECT name FROM topology_claims_migrations ORDER BY version DESC LIMIT 1",
            &[],
        )
        .await
        .map_err(|e| failed("reading schema_migrations", target, e))?;
    let found: Option<String> = row.map(|r| r.get(0));
    match found {
        Some(name) if name == latest => Ok(()),
        Some(name) => Err(ClaimsError::Configuration {
            message: format!(
                "{target} is at schema {name}, this binary's is {latest}: run `topology-claims \
                 migrate` with the release that matches, then again"
            ),
        }),
        None => Err(ClaimsError::Configuration {
            message: format!(
                "{target} holds no topology-claims schema: run `topology-claims migrate --store …` \
                 first"
            ),
        }),
    }
}

/// The SELECT expression of a column, in the rows' representation.
fn export_expr(column: &str, kind: Kind) -> String {
    match kind {
        Kind::Int => format!("{column}::int8"),
        Kind::Text | Kind::Uuid => format!("{column}::text"),
        Kind::Bytes => column.to_owned(),
        Kind::Micros => format!("(extract(epoch from {column}) * 1000000)::int8"),
        Kind::Bool => format!("{column}::int::int8"),
        Kind::LeaseOp => format!("coalesce({column}, 0)::int8"),
    }
}

/// The VALUES expression of parameter `$n` for a column.
fn import_expr(n: usize, kind: Kind) -> String {
    match kind {
        Kind::Int => format!("${n}::int8"),
        Kind::Text => format!("${n}::text"),
        Kind::Bytes => format!("${n}::bytea"),
        Kind::Micros => format!("(timestamptz 'epoch' + ${n}::int8 * interval '1 microsecond')"),
        Kind::Uuid => format!("${n}::text::uuid"),
        Kind::Bool => format!("(${n}::int8 <> 0)"),
        Kind::LeaseOp => format!("nullif(${n}::int8, 0)"),
    }
}

/// Reads every row of the store at `url` in one snapshot and hands them to `send`, `(table,
/// rows)` in [`TABLES`] order, [`CHUNK_ROWS`] at a time.
pub async fn export(
    url: &str,
    options: &PostgresOptions,
    mut send: impl FnMut(usize, Vec<Vec<Value>>) -> Result<(), String>,
) -> Result<(), ClaimsError> {
    let (mut client, target) = client(url, options).await?;
    check_schema(&client, &target).await?;
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(|e| failed("starting the snapshot", &target, e))?;
    for (index, spec) in TABLES.iter().enumerate() {
        let exprs: Vec<String> = spec
            .columns
            .iter()
            .map(|(column, kind, _)| export_expr(column, *kind))
            .collect();
        let reading = |e| failed(&format!("reading {}", spec.postgres), &target, e);
        tx.batch_execute(&format!(
            "DECLARE transfer_{index} NO SCROLL CURSOR FOR SELECT {} FROM {}",
            exprs.join(", "),
            spec.postgres
        ))
        .await
        .map_err(reading)?;
        loop {
            let rows = tx
                .query(&format!("FETCH {CHUNK_ROWS} FROM transfer_{index}"), &[])
                .await
                .map_err(reading)?;
            if rows.is_empty() {
                break;
            }
            let mut chunk = Vec::with_capacity(rows.len());
            for row in &rows {
                let mut values = Vec::with_capacity(spec.columns.len());
                for (i, (_, kind, _)) in spec.columns.iter().enumerate() {
                    let value = match kind {
                        Kind::Text | Kind::Uuid => row
                            .try_get::<_, Option<String>>(i)
                            .map(|v| v.map_or(Value::Null, Value::Text)),
                        Kind::Bytes => row
                            .try_get::<_, Option<Vec<u8>>>(i)
                            .map(|v| v.map_or(Value::Null, Value::Bytes)),
                        _ => row
                            .try_get::<_, Option<i64>>(i)
                            .map(|v| v.map_or(Value::Null, Value::Int)),
                    };
                    values.push(value.map_err(reading)?);
                }
                chunk.push(values);
            }
            send(index, chunk).map_err(|message| ClaimsError::Internal { message })?;
        }
    }
    tx.commit()
        .await
        .map_err(|e| failed("ending the snapshot", &target, e))?;
    Ok(())
}

/// What [`import`] found and wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Imported {
    /// Rows of each of [`TABLES`].
    pub rows: Vec<u64>,
    /// Rows the store held before (deleted with `replace`).
    pub replaced: u64,
}

/// Fills the store at `url` with the rows `next` yields (`None` at the end), in one transaction.
/// The store must be at this binary's schema and hold no claim, lease, outcome, restore epoch or
/// decommissioned cell, unless `replace` (then they are deleted first); no `serve` may use it.
pub async fn import(
    url: &str,
    options: &PostgresOptions,
    replace: bool,
    mut next: impl AsyncNext,
) -> Result<Imported, ClaimsError> {
    let (mut client, target) = client(url, options).await?;
    check_schema(&client, &target).await?;
    let free: bool = client
        .query_one(sql::TRY_LOCK_SERVING, &[&sql::SERVING_LOCK_CLASS])
        .await
        .map_err(|e| failed("taking the serving lock", &target, e))?
        .get(0);
    if !free {
        return Err(ClaimsError::Configuration {
            message: format!(
                "a topology-claims server is using {target} (it holds the serving lock): stop \
                 every `serve` on this store, then restore"
            ),
        });
    }
    let result = async {
        let tx = client
            .transaction()
            .await
            .map_err(|e| failed("starting the restore", &target, e))?;
        let held: i64 = tx
            .query_one(sql::COUNT_RESTORABLE_ROWS, &[])
            .await
            .map_err(|e| failed("counting the store's rows", &target, e))?
            .get(0);
        if held > 0 && !replace {
            return Err(ClaimsError::Configuration {
                message: format!(
                    "{target} holds {held} rows (claims, leases, outcomes, restore epochs, \
                     decommissioned cells); restoring replaces them: pass --replace"
                ),
            });
        }
        tx.batch_execute(sql::CLEAR_FOR_RESTORE)
            .await
            .map_err(|e| failed("clearing the store", &target, e))?;
        let mut imported = Imported {
            rows: vec![0; TABLES.len()],
            replaced: u64::try_from(held).unwrap_or(0),
        };
        while let Some(chunk) = next.next().await {
            let (index, rows) = chunk.map_err(|message| ClaimsError::Internal { message })?;
            insert(&tx, index, &rows)
                .await
                .map_err(|e| failed(&format!("writing {}", TABLES[index].postgres), &target, e))?;
            imported.rows[index] += rows.len() as u64;
        }
        tx.batch_execute(sql::FENCE_WATCHERS)
            .await
            .map_err(|e| failed("fencing the change feed's watchers", &target, e))?;
        tx.commit()
            .await
            .map_err(|e| failed("committing the restore", &target, e))?;
        Ok(imported)
    }
    .await;
    let _ = client
        .execute(sql::UNLOCK_SERVING, &[&sql::SERVING_LOCK_CLASS])
        .await;
    result
}

/// Rows of one table (its index in [`TABLES`]), or why the source stopped.
pub type Chunk = Result<(usize, Vec<Vec<Value>>), String>;

/// Where [`import`] takes its chunks from: an async source (a channel fed by the file reader).
pub trait AsyncNext {
    fn next(&mut self) -> impl std::future::Future<Output = Option<Chunk>> + Send;
}

impl AsyncNext for tokio::sync::mpsc::Receiver<Chunk> {
    async fn next(&mut self) -> Option<Chunk> {
        self.recv().await
    }
}

async fn insert(
    tx: &tokio_postgres::Transaction<'_>,
    index: usize,
    rows: &[Vec<Value>],
) -> Result<(), tokio_postgres::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let spec = &TABLES[index];
    let width = spec.columns.len();
    let tuples: Vec<String> = (0..rows.len())
        .map(|r| {
            let exprs: Vec<String> = spec
                .columns
                .iter()
                .enumerate()
                .map(|(c, (_, kind, _))| import_expr(r * width + c + 1, *kind))
                .collect();
            format!("({})", exprs.join(", "))
        })
        .collect();
    let columns: Vec<&str> = spec.columns.iter().map(|c| c.0).collect();
    let statement = format!(
        "INSERT INTO {} ({}) VALUES {}",
        spec.postgres,
        columns.join(", "),
        tuples.join(", ")
    );
    let mut params: Vec<Box<dyn ToSql + Sync + Send>> = Vec::with_capacity(rows.len() * width);
    for row in rows {
        for ((_, kind, _), value) in spec.columns.iter().zip(row) {
            params.push(match (kind, value) {
                (_, Value::Int(n)) => Box::new(*n),
                (_, Value::Text(t)) => Box::new(t.clone()),
                (_, Value::Bytes(b)) => Box::new(b.clone()),
                (Kind::Text | Kind::Uuid, Value::Null) => Box::new(None::<String>),
                (Kind::Bytes, Value::Null) => Box::new(None::<Vec<u8>>),
                (_, Value::Null) => Box::new(None::<i64>),
            });
        }
    }
    let refs: Vec<&(dyn ToSql + Sync)> = params
        .iter()
        .map(|p| p.as_ref() as &(dyn ToSql + Sync))
        .collect();
    tx.execute(&statement, &refs).await.map(|_| ())
}

//! The raw-SQL baselines: the very statements (`topology_claims_postgres::baseline`) the adapter
//! runs for BeginUpdate and CommitUpdate, executed directly with tokio-postgres on one dedicated
//! connection per client — no gRPC, no domain code, no pool.
//!
//! - `raw-sql` (naive): one statement per round trip, as straightforward code would do it
//!   (`BEGIN`, lock, three reads, writes, `COMMIT`: 8 round trips per begin, 9 per commit).
//! - `raw-sql-pipelined`: the adapter's two flights per operation (decision 012), so the ratio
//!   service / raw-sql-pipelined is the cost of gRPC + domain + pool on the same SQL.
//!
//! Statements are prepared once per connection in both modes. The only logic is what a client
//! needs to stay correct: refuse a create whose claims exist, roll back on a failed write. Must
//! not be used as a store: it skips every protocol rule the domain enforces.

use std::str::FromStr;

use futures::future::try_join_all;
use topology_claims::codec::encode_request;
use topology_claims::{ClaimKey, LeaseId, LeaseOp};
use topology_claims_postgres::baseline as sql;
use topology_claims_postgres::tokio_postgres::error::SqlState;
use topology_claims_postgres::tokio_postgres::{Client, Config, NoTls, Statement};

use super::workload::{Batch, Reason};

/// A PostgreSQL database URL and the schema (of the bench's own) that holds a store's tables.
#[derive(Clone)]
pub struct PgSchema {
    pub url: String,
    pub schema: String,
}

/// How the baseline sends its statements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SqlMode {
    Naive,
    Pipelined,
}

impl SqlMode {
    pub const fn label(self) -> &'static str {
        match self {
            Self::Naive => "raw-sql",
            Self::Pipelined => "raw-sql-pipelined",
        }
    }
}

/// Where the baseline runs: a schema of its own with the adapter's migrations applied.
pub struct SqlTarget {
    pub mode: SqlMode,
    pub config: Config,
    pub schema: PgSchema,
}

impl SqlTarget {
    /// `url` with `search_path` set to `schema` (which must exist, with the adapter's tables);
    /// its sessions carry `application_name` so their backends' CPU can be attributed.
    pub fn new(mode: SqlMode, schema: PgSchema, application_name: &str) -> Result<Self, String> {
        let mut config = schema_config(&schema.url, &schema.schema)?;
        config.application_name(application_name);
        Ok(Self {
            mode,
            config,
            schema,
        })
    }
}

/// A tokio-postgres config for `url` whose sessions use `schema`.
pub fn schema_config(url: &str, schema: &str) -> Result<Config, String> {
    let mut config = Config::from_str(url).map_err(|e| format!("invalid PostgreSQL URL: {e}"))?;
    if !schema
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    {
        return Err(format!("schema {schema:?} is not a plain identifier"));
    }
    let options = format!(
        "{} -c search_path={schema}",
        config.get_options().unwrap_or_default()
    );
    config.options(options.trim_start());
    Ok(config)
}

/// Opens one connection (its I/O driven on a spawned task).
pub async fn connect(config: &Config) -> Result<Client, String> {
    let (client, connection) = config
        .connect(NoTls)
        .await
        .map_err(|e| format!("cannot connect to PostgreSQL: {e}"))?;
    tokio::spawn(async move {
        // Ends when the client is dropped or the server closes the connection.
        let _ = connection.await;
    });
    Ok(client)
}

/// Finds the PostgreSQL processes that work for this run: the backends of its sessions (by
/// `application_name`) and the server's background processes (WAL writer, checkpointer,
/// autovacuum…, shared by every client of the server). Other clients of the same PostgreSQL —
/// another test suite on the machine — are left out of the bench's CPU figures.
pub struct PgProcesses {
    client: Client,
    application_name: String,
}

impl PgProcesses {
    pub async fn connect(url: &str, application_name: &str) -> Result<Self, String> {
        let config = Config::from_str(url).map_err(|e| format!("invalid PostgreSQL URL: {e}"))?;
        Ok(Self {
            client: connect(&config).await?,
            application_name: application_name.to_owned(),
        })
    }

    pub async fn pids(&self) -> Vec<u32> {
        let rows = self
            .client
            .query(
                "SELECT pid FROM pg_stat_activity \
                 WHERE application_name = $1 OR backend_type <> 'client backend'",
                &[&self.application_name],
            )
            .await
            .unwrap_or_default();
        rows.iter()
            .filter_map(|row| row.try_get::<_, i32>(0).ok())
            .filter_map(|pid| u32::try_from(pid).ok())
            .collect()
    }
}

/// The statements of begin and commit, prepared on one connection.
struct Statements {
    lock: Statement,
    select_lease: Statement,
    select_outcome: Statement,
    select_claims: Statement,
    insert_claims: Statement,
    mark_destroys: Statement,
    insert_lease: Statement,
    lock_claims: Statement,
    delete_claims: Statement,
    release_claims: Statement,
    delete_lease: Statement,
    insert_outcome: Statement,
}

/// One client's connection.
pub struct SqlConn {
    client: Client,
    st: Statements,
    mode: SqlMode,
}

fn small(number: i32) -> i16 {
    i16::try_from(number).unwrap_or(i16::MAX)
}

/// The reason a failed statement stands for, in the service's vocabulary.
fn reason(error: &topology_claims_postgres::tokio_postgres::Error) -> Reason {
    match error.code() {
        // A concurrent insert of the same absent claim (the adapter retries and then answers
        // CLAIM_LEASED), or a conditional mark that missed a row.
        Some(code) if *code == SqlState::UNIQUE_VIOLATION => "CLAIM_LEASED".into(),
        Some(code) if code.code() == "TC001" => "CLAIM_LEASED".into(),
        Some(code) if *code == SqlState::T_R_DEADLOCK_DETECTED => "DEADLOCK".into(),
        Some(code) if *code == SqlState::T_R_SERIALIZATION_FAILURE => "SERIALIZATION".into(),
        Some(code) => format!("SQLSTATE_{}", code.code()),
        None => {
            // Not the database's refusal: a lost connection, or a statement the bench sent
            // wrong. Said once with its text (a broken baseline names its cause); later ones
            // are only counted.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                eprintln!(
                    "bench: raw-SQL baseline: {error} (counted as CONNECTION; later ones only \
                     counted)"
                );
            });
            "CONNECTION".into()
        }
    }
}

impl SqlConn {
    pub async fn connect(target: &SqlTarget) -> Result<Self, String> {
        let client = connect(&target.config).await?;
        let texts = [
            sql::LOCK_ADVISORY,
            sql::SELECT_LEASE_FOR_UPDATE,
            sql::SELECT_OUTCOME_FOR_UPDATE,
            sql::SELECT_CLAIMS_FOR_UPDATE,
            sql::INSERT_CLAIMS,
            sql::MARK_CLAIMS,
            sql::INSERT_LEASE,
            sql::LOCK_CLAIMS_OF_LEASE,
            sql::DELETE_CLAIMS_OF_LEASE,
            sql::RELEASE_CLAIMS_OF_LEASE,
            sql::DELETE_LEASE,
            sql::INSERT_OUTCOME,
        ];
        let prepared = try_join_all(texts.iter().map(|text| client.prepare(text)))
            .await
            .map_err(|e| format!("preparing the adapter's statements: {e}"))?;
        let mut it = prepared.into_iter();
        let mut next = || it.next().ok_or("prepared statement count mismatch");
        let st = Statements {
            lock: next()?,
            select_lease: next()?,
            select_outcome: next()?,
            select_claims: next()?,
            insert_claims: next()?,
            mark_destroys: next()?,
            insert_lease: next()?,
            lock_claims: next()?,
            delete_claims: next()?,
            release_claims: next()?,
            delete_lease: next()?,
            insert_outcome: next()?,
        };
        Ok(Self {
            client,
            st,
            mode: target.mode,
        })
    }

    pub async fn begin(&mut self, batch: &Batch, lease: LeaseId) -> Result<(), Reason> {
        let result = match self.mode {
            SqlMode::Naive => self.begin_naive(batch, lease).await,
            SqlMode::Pipelined => self.begin_pipelined(batch, lease).await,
        };
        self.finish(result).await
    }

    pub async fn commit(&mut self, batch: &Batch, lease: LeaseId) -> Result<(), Reason> {
        let result = match self.mode {
            SqlMode::Naive => self.commit_naive(batch, lease).await,
            SqlMode::Pipelined => self.commit_pipelined(batch, lease).await,
        };
        self.finish(result).await
    }

    /// After a refusal or a failed statement of the naive mode the transaction may still be
    /// open: end it. (The pipelined mode ends its own: its second flight carries `COMMIT`.)
    async fn finish(&self, result: Result<(), Reason>) -> Result<(), Reason> {
        if result.is_err() && self.mode == SqlMode::Naive {
            let _ = self.client.batch_execute(sql::ROLLBACK).await;
        }
        result
    }

    /// Ends the transaction the first flight opened, passing its failure on.
    async fn roll_back<T>(&self, failure: Reason) -> Result<T, Reason> {
        let _ = self.client.batch_execute(sql::ROLLBACK).await;
        Err(failure)
    }

    /// A create whose claims exist is refused, like the domain would (taken or leased).
    fn refuse_existing(
        rows: &[topology_claims_postgres::tokio_postgres::Row],
        op: LeaseOp,
    ) -> Result<(), Reason> {
        if op != LeaseOp::Create {
            return Ok(());
        }
        match rows.first() {
            None => Ok(()),
            Some(row) => match row.try_get::<_, Option<uuid::Uuid>>(7) {
                Ok(Some(_)) => Err("CLAIM_LEASED".into()),
                _ => Err("CLAIM_TAKEN".into()),
            },
        }
    }

    async fn begin_naive(&self, batch: &Batch, lease: LeaseId) -> Result<(), Reason> {
        let (c, st) = (&self.client, &self.st);
        let id = lease.as_uuid();
        let locks = sql::AdvisoryLocks::lease(lease);
        let a = sql::RecordArrays::sorted(&batch.records);
        let payload = encode_request(&batch.to_begin_update(lease));
        let cell = batch.cell.as_str();
        let e = |error| reason(&error);
        c.batch_execute(sql::BEGIN).await.map_err(e)?;
        c.execute(&st.lock, &locks.params()).await.map_err(e)?;
        c.query_opt(&st.select_lease, &[id]).await.map_err(e)?;
        c.query_opt(&st.select_outcome, &[id]).await.map_err(e)?;
        let rows = c
            .query(&st.select_claims, &[&a.types, &a.values])
            .await
            .map_err(e)?;
        Self::refuse_existing(&rows, batch.op)?;
        self.write_claims(batch, lease, &a).await.map_err(e)?;
        c.query_one(&st.insert_lease, &[id, &cell, &payload])
            .await
            .map_err(e)?;
        c.batch_execute(sql::COMMIT).await.map_err(e)
    }

    async fn write_claims(
        &self,
        batch: &Batch,
        lease: LeaseId,
        a: &sql::RecordArrays<'_>,
    ) -> Result<u64, topology_claims_postgres::tokio_postgres::Error> {
        let (c, st) = (&self.client, &self.st);
        let id = lease.as_uuid();
        let cell = batch.cell.as_str();
        match batch.op {
            LeaseOp::Create => {
                let op = small(LeaseOp::Create.number());
                c.execute(
                    &st.insert_claims,
                    &[
                        &a.types,
                        &a.values,
                        &a.owner_types,
                        &a.owner_values,
                        &a.table_names,
                        &a.record_ids,
                        &cell,
                        id,
                        &op,
                        &a.displays,
                        &a.namespaces,
                        &a.owner_type_names,
                        &a.source_tables,
                    ],
                )
                .await
            }
            LeaseOp::Destroy | LeaseOp::Update => {
                let op = small(batch.op.number());
                c.execute(&st.mark_destroys, &[id, &op, &a.types, &a.values, &cell])
                    .await
            }
        }
    }

    async fn begin_pipelined(&self, batch: &Batch, lease: LeaseId) -> Result<(), Reason> {
        let (c, st) = (&self.client, &self.st);
        let id = lease.as_uuid();
        let locks = sql::AdvisoryLocks::lease(lease);
        let a = sql::RecordArrays::sorted(&batch.records);
        let payload = encode_request(&batch.to_begin_update(lease));
        let cell = batch.cell.as_str();
        let flight = tokio::try_join!(
            biased;
            c.batch_execute(sql::BEGIN),
            async { c.execute(&st.lock, &locks.params()).await },
            async { c.query_opt(&st.select_lease, &[id]).await },
            async { c.query_opt(&st.select_outcome, &[id]).await },
            async { c.query(&st.select_claims, &[&a.types, &a.values]).await },
        );
        let rows = match flight {
            Ok((_, _, _, _, rows)) => rows,
            Err(error) => return self.roll_back(reason(&error)).await,
        };
        if let Err(refused) = Self::refuse_existing(&rows, batch.op) {
            return self.roll_back(refused).await;
        }
        tokio::try_join!(
            biased;
            async { self.write_claims(batch, lease, &a).await },
            async { c.query_one(&st.insert_lease, &[id, &cell, &payload]).await },
            c.batch_execute(sql::COMMIT),
        )
        .map(drop)
        .map_err(|error| reason(&error))
    }

    /// Commit's claim writes: creates are released, destroys deleted (by the lease's keys).
    async fn end_claims(
        &self,
        batch: &Batch,
        lease: LeaseId,
        keys: &(Vec<i16>, Vec<String>),
    ) -> Result<u64, topology_claims_postgres::tokio_postgres::Error> {
        let statement = match batch.op {
            LeaseOp::Create => &self.st.release_claims,
            LeaseOp::Destroy => &self.st.delete_claims,
            LeaseOp::Update => unreachable!("the benchmark's workloads create and destroy only"),
        };
        self.client
            .execute(statement, &[&keys.0, &keys.1, lease.as_uuid()])
            .await
    }

    async fn commit_naive(&self, batch: &Batch, lease: LeaseId) -> Result<(), Reason> {
        let (c, st) = (&self.client, &self.st);
        let id = lease.as_uuid();
        let locks = sql::AdvisoryLocks::lease(lease);
        let keys = sorted_keys(batch);
        let cell = batch.cell.as_str();
        let committed: i16 = 1;
        let e = |error| reason(&error);
        c.batch_execute(sql::BEGIN).await.map_err(e)?;
        c.execute(&st.lock, &locks.params()).await.map_err(e)?;
        let lease_row = c.query_opt(&st.select_lease, &[id]).await.map_err(e)?;
        c.query_opt(&st.select_outcome, &[id]).await.map_err(e)?;
        if lease_row.is_none() {
            return Err("LEASE_NOT_FOUND".into());
        }
        c.execute(&st.lock_claims, &[id]).await.map_err(e)?;
        self.end_claims(batch, lease, &keys).await.map_err(e)?;
        c.execute(&st.delete_lease, &[id]).await.map_err(e)?;
        c.execute(&st.insert_outcome, &[id, &cell, &committed])
            .await
            .map_err(e)?;
        c.batch_execute(sql::COMMIT).await.map_err(e)
    }

    async fn commit_pipelined(&self, batch: &Batch, lease: LeaseId) -> Result<(), Reason> {
        let (c, st) = (&self.client, &self.st);
        let id = lease.as_uuid();
        let locks = sql::AdvisoryLocks::lease(lease);
        let keys = sorted_keys(batch);
        let cell = batch.cell.as_str();
        let committed: i16 = 1;
        let flight = tokio::try_join!(
            biased;
            c.batch_execute(sql::BEGIN),
            async { c.execute(&st.lock, &locks.params()).await },
            async { c.query_opt(&st.select_lease, &[id]).await },
            async { c.query_opt(&st.select_outcome, &[id]).await },
            async { c.execute(&st.lock_claims, &[id]).await },
        );
        match flight {
            Ok((_, _, Some(_), _, _)) => {}
            Ok(_) => return self.roll_back("LEASE_NOT_FOUND".into()).await,
            Err(error) => return self.roll_back(reason(&error)).await,
        }
        tokio::try_join!(
            biased;
            async { self.end_claims(batch, lease, &keys).await },
            async { c.execute(&st.delete_lease, &[id]).await },
            async { c.execute(&st.insert_outcome, &[id, &cell, &committed]).await },
            c.batch_execute(sql::COMMIT),
        )
        .map(drop)
        .map_err(|error| reason(&error))
    }
}

fn sorted_keys(batch: &Batch) -> (Vec<i16>, Vec<String>) {
    let keys: Vec<&ClaimKey> = batch.sorted_keys();
    (
        keys.iter().map(|k| small(k.namespace_number())).collect(),
        keys.iter().map(|k| k.value.clone()).collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_travels_in_the_session_options() {
        let config =
            schema_config("postgres://u@h/d?options=-c%20work_mem%3D8MB", "tc_bench_x").unwrap();
        let options = config.get_options().unwrap();
        assert!(options.contains("work_mem=8MB"), "{options}");
        assert!(options.ends_with("-c search_path=tc_bench_x"), "{options}");
        assert!(schema_config("postgres://u@h/d", "Bad Name").is_err());
    }
}

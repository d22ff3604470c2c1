//! Verify at scale (`--verify N[,N…]`): the real `topology-claims verify` as a child process,
//! over N claims in a `serve` child's store and N records in a PostgreSQL table of the cell's own
//! (a schema of the run's), with a set fraction (`--drift`) of each kind of drift injected before
//! every run: *missing* (a record whose claim was destroyed through a lease), *extra* (a claim
//! whose local row was deleted) and *different* (a local row whose owner changed). Each round
//! runs verify once streaming (StreamClaims) and once with `--no-stream` (ListClaims paging),
//! then a second, clean run of the same mode, which must find nothing.
//!
//! Owns the local table, drift injection, the verify children and their summary lines. Loading
//! claims is `scale::load_grpc`; the server and schemas are the caller's.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use topology_claims::{
    BeginUpdate, CellId, ClaimKey, ClaimRecord, ClaimType, LeaseId, OwnerType, TableName,
};
use topology_claims_harness::serve::{clean_command, product_binary};
use topology_claims_proto::convert::begin_update_to_pb;
use topology_claims_proto::pb;

use super::raw_sql;
use super::scale::{self, SCALE_CELL, SCALE_OWNER};
use super::systems::{PgSchema, System};

/// Claims per drift-injecting BeginUpdate: scattered keys, so smaller than the loader's batches
/// (1000 random destroys can outlast the server's statement timeout on a busy machine).
const DESTROY_BATCH: usize = 200;
/// Attempts of a drift-injecting call refused as UNAVAILABLE (retried with the same lease id,
/// which the server recognises).
const ATTEMPTS: u32 = 5;
/// Between two progress lines of a running verify child.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// The local records' creation time: long before any `--recent` window.
const LOCAL_CREATED_AT: i64 = 1_600_000_000;

/// The cell's table: one `users` record per claim, its username claim and owner columns.
const CREATE_LOCAL_TABLE: &str = "\
CREATE TABLE users (
    id bigint PRIMARY KEY,
    username text NOT NULL,
    owner_value text NOT NULL,
    created_at bigint NOT NULL
)";

/// verify.toml of the local table (the query `docs/cell-integration.md` describes).
const VERIFY_TOML: &str = r#"[tables.users]
query = """
SELECT id, 'username', username, 'user', owner_value, created_at
FROM users WHERE id >= $1 AND id < $2
"""
"#;

/// Streaming (the default) or `--no-stream`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Stream,
    Paging,
}

impl Mode {
    pub fn label(self) -> &'static str {
        match self {
            Mode::Stream => "stream",
            Mode::Paging => "paging (--no-stream)",
        }
    }

    fn flags(self) -> &'static [&'static str] {
        match self {
            Mode::Stream => &[],
            Mode::Paging => &["--no-stream"],
        }
    }
}

/// What to run.
pub struct Spec {
    pub drift: f64,
    pub rounds: u32,
    pub seed: u64,
    /// Extra `verify` arguments.
    pub verify_args: Vec<String>,
}

/// The summary line of one verify run, with its wall time.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub records: u64,
    pub missing: u64,
    pub different: u64,
    pub extra: u64,
    pub corrected: u64,
    pub failed: u64,
    /// verify's own records/s (its elapsed time, without process start and connection).
    pub rate: f64,
    pub wall: Duration,
}

impl Summary {
    fn found(&self) -> u64 {
        self.missing + self.different + self.extra
    }

    fn to_json(&self) -> Value {
        json!({
            "records": self.records,
            "missing": self.missing,
            "different": self.different,
            "extra": self.extra,
            "corrected": self.corrected,
            "failed": self.failed,
            "records_per_s": self.rate,
            "wall_s": self.wall.as_secs_f64(),
        })
    }
}

/// Parses `verify CELL: records=… missing=… different=… extra=… corrected=… failed=… rate=R …`.
fn parse_summary(stdout: &str, wall: Duration) -> Result<Summary, String> {
    let line = stdout
        .lines()
        .rev()
        .find(|line| line.starts_with("verify ") && line.contains("records="))
        .ok_or_else(|| format!("no summary line in verify's output:\n{stdout}"))?;
    let fields: HashMap<&str, &str> = line
        .split_whitespace()
        .filter_map(|token| token.split_once('='))
        .collect();
    let number = |key: &str| {
        fields
            .get(key)
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| format!("no {key}= in verify's summary: {line}"))
    };
    Ok(Summary {
        records: number("records")?,
        missing: number("missing")?,
        different: number("different")?,
        extra: number("extra")?,
        corrected: number("corrected")?,
        failed: number("failed")?,
        rate: fields
            .get("rate")
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| format!("no rate= in verify's summary: {line}"))?,
        wall,
    })
}

/// One measured run (drift injected, then verify) and the clean run after it.
pub struct Measured {
    pub records: u64,
    pub mode: Mode,
    pub round: u32,
    pub injected: u64,
    pub drift_run: Summary,
    pub clean_run: Summary,
}

impl Measured {
    /// Why this run does not show exactly the injected drift repaired, if it does not.
    pub fn problem(&self) -> Option<String> {
        let d = &self.drift_run;
        let k = self.injected;
        let kinds_ok = d.missing == k && d.different == k && d.extra == k;
        // A "different" claim takes one correction (an update) or two (destroy, then create).
        let corrected_ok = (3 * k..=4 * k).contains(&d.corrected);
        if !kinds_ok || !corrected_ok || d.failed > 0 {
            return Some(format!(
                "{} records {}: injected {k} of each kind, verify found missing={} different={} \
                 extra={} corrected={} failed={}",
                self.records,
                self.mode.label(),
                d.missing,
                d.different,
                d.extra,
                d.corrected,
                d.failed
            ));
        }
        if self.clean_run.found() > 0 || self.clean_run.failed > 0 {
            return Some(format!(
                "{} records {}: the run after the corrections still found missing={} \
                 different={} extra={}",
                self.records,
                self.mode.label(),
                self.clean_run.missing,
                self.clean_run.different,
                self.clean_run.extra
            ));
        }
        None
    }

    pub fn to_json(&self) -> Value {
        json!({
            "records": self.records,
            "mode": self.mode.label(),
            "round": self.round,
            "injected_per_kind": self.injected,
            "drift_run": self.drift_run.to_json(),
            "clean_run": self.clean_run.to_json(),
        })
    }
}

/// The cell's database: a table in a schema of the run's, and what the bench knows of it.
pub struct LocalDb {
    client: topology_claims_postgres::tokio_postgres::Client,
    /// URL of the verify child (its sessions work in the schema).
    url: String,
    /// Ids of records that have their claim, in no order.
    consistent: Vec<u64>,
    /// Owners that differ from [`SCALE_OWNER`] after an earlier "different" drift (corrected).
    owners: HashMap<u64, String>,
}

impl LocalDb {
    /// Creates the `users` table in `pg` with records `1..=records`.
    pub async fn create(
        pg: &PgSchema,
        application_name: &str,
        records: u64,
    ) -> Result<LocalDb, String> {
        let config = raw_sql::schema_config(&pg.url, &pg.schema)?;
        let client = raw_sql::connect(&config).await?;
        client
            .batch_execute(CREATE_LOCAL_TABLE)
            .await
            .map_err(|e| format!("creating the local table: {e}"))?;
        client
            .execute(
                "INSERT INTO users (id, username, owner_value, created_at)
                 SELECT i, 'scale-' || lpad(i::text, 10, '0'), $2, $3
                 FROM generate_series(1, $1::bigint) AS i",
                &[&(records as i64), &SCALE_OWNER, &LOCAL_CREATED_AT],
            )
            .await
            .map_err(|e| format!("loading the local records: {e}"))?;
        client
            .batch_execute("ANALYZE users")
            .await
            .map_err(|e| format!("ANALYZE users: {e}"))?;
        // Agrees with scale::value: the loaded claims are the records' usernames.
        debug_assert_eq!(scale::value(7), "scale-0000000007");
        Ok(LocalDb {
            client,
            url: topology_claims_harness::postgres::url_with_search_path(
                &pg.url,
                &pg.schema,
                application_name,
            )?,
            consistent: (1..=records).collect(),
            owners: HashMap::new(),
        })
    }

    fn owner(&self, id: u64) -> String {
        self.owners
            .get(&id)
            .cloned()
            .unwrap_or_else(|| SCALE_OWNER.to_owned())
    }
}

fn claim(id: u64, owner: String) -> ClaimRecord {
    ClaimRecord {
        display: None,
        key: ClaimKey::new(ClaimType::Username, scale::value(id)),
        owner_type: OwnerType::USER,
        owner_value: owner,
        table_name: TableName::USERS,
        table_record_id: id as i64,
    }
}

/// Loads claims `1..=records` through gRPC, a progress line every few seconds.
pub async fn load_claims(system: &System, records: u64) -> Result<(), String> {
    let loaded = AtomicU64::new(0);
    let started = Instant::now();
    let load = scale::load_grpc(system, 1, records + 1, &loaded);
    tokio::pin!(load);
    loop {
        tokio::select! {
            result = &mut load => {
                eprintln!(
                    "bench: verify: {records} claims loaded in {:.1}s",
                    started.elapsed().as_secs_f64()
                );
                return result;
            }
            _ = tokio::time::sleep(PROGRESS_EVERY) => {
                let done = loaded.load(Ordering::Relaxed);
                eprintln!(
                    "bench: verify: loading claims: {done}/{records} ({:.0}/s)",
                    done as f64 / started.elapsed().as_secs_f64()
                );
            }
        }
    }
}

/// What autovacuum would do (it is off on the bench's PostgreSQL): fresh statistics after the
/// load, so the store's statements are not planned for the empty table of a fresh schema, and
/// no dead rows of one run left to the next.
async fn vacuum(system: &System) {
    if let System::Service {
        postgres: Some(pg), ..
    } = system
    {
        super::pg::vacuum_schemas([pg]).await;
    }
}

/// Injects `k` of each drift kind on distinct records that are consistent now.
async fn inject(
    system: &System,
    local: &mut LocalDb,
    k: usize,
    rng: &mut fastrand::Rng,
    round: u32,
    mode: Mode,
) -> Result<(), String> {
    if local.consistent.len() < 3 * k {
        return Err(format!(
            "{} consistent records left, {} needed for the drift",
            local.consistent.len(),
            3 * k
        ));
    }
    rng.shuffle(&mut local.consistent);
    let missing: Vec<u64> = local.consistent[..k].to_vec();
    let different: Vec<i64> = local.consistent[k..2 * k]
        .iter()
        .map(|&id| id as i64)
        .collect();
    // Extra: the local rows go; once verify has destroyed their claims the records are gone.
    let extra: Vec<i64> = local
        .consistent
        .drain(2 * k..3 * k)
        .map(|id| id as i64)
        .collect();

    // Missing: the claim is destroyed through an ordinary lease of the cell.
    let cell = CellId::parse(SCALE_CELL).map_err(|e| e.to_string())?;
    let client = system.grpc_conn(SCALE_CELL).await?.client();
    for ids in missing.chunks(DESTROY_BATCH) {
        let lease_id = LeaseId::generate();
        let request = BeginUpdate {
            local_transaction: None,
            cell_id: cell.clone(),
            lease_id: Some(lease_id),
            creates: Vec::new(),
            destroys: ids.iter().map(|&id| claim(id, local.owner(id))).collect(),
            updates: Vec::new(),
        };
        let begin = begin_update_to_pb(&request);
        retried("BeginUpdate", || {
            let (mut client, begin) = (client.clone(), begin.clone());
            async move { client.begin_update(begin).await }
        })
        .await?;
        let commit = pb::CommitUpdateRequest {
            cell_id: SCALE_CELL.into(),
            lease_id: lease_id.to_string(),
        };
        retried("CommitUpdate", || {
            let (mut client, commit) = (client.clone(), commit.clone());
            async move { client.commit_update(commit).await }
        })
        .await?;
    }

    let owner = format!("moved-r{round}-{}", mode.flags().len());
    local
        .client
        .execute(
            "UPDATE users SET owner_value = $2 WHERE id = ANY($1)",
            &[&different, &owner],
        )
        .await
        .map_err(|e| format!("injecting different records: {e}"))?;
    for &id in &different {
        local.owners.insert(id as u64, owner.clone());
    }
    local
        .client
        .execute("DELETE FROM users WHERE id = ANY($1)", &[&extra])
        .await
        .map_err(|e| format!("injecting extra claims: {e}"))?;
    for id in &extra {
        local.owners.remove(&(*id as u64));
    }
    Ok(())
}

/// `call`, again after a pause while it fails with UNAVAILABLE, at most [`ATTEMPTS`] times.
async fn retried<T, F, Fut>(what: &str, mut call: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let mut attempt = 1;
    loop {
        match call().await {
            Ok(_) => return Ok(()),
            Err(status) if status.code() == tonic::Code::Unavailable && attempt < ATTEMPTS => {
                eprintln!("bench: verify: injecting missing claims: {what}: {status}; retrying");
                tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
                attempt += 1;
            }
            Err(status) => {
                return Err(format!("injecting missing claims: {what} failed: {status}"))
            }
        }
    }
}

/// Runs `topology-claims verify` against `endpoint` and the local table; returns its summary.
/// Its progress lines are shown every few seconds; its other stderr lines as they come.
async fn run_verify(
    endpoint: &str,
    local: &LocalDb,
    dir: &Path,
    mode: Mode,
    extra: &[String],
) -> Result<Summary, String> {
    let binary = product_binary()?;
    let source = dir.join("verify.toml");
    let cursor = dir.join("verify.cursor");
    let source_arg = source.to_string_lossy().into_owned();
    let cursor_arg = cursor.to_string_lossy().into_owned();
    let mut args = vec![
        "verify",
        "--server",
        endpoint,
        "--cell-id",
        SCALE_CELL,
        "--local-db",
        &local.url,
        "--source",
        &source_arg,
        "--cursor-file",
        &cursor_arg,
        "--recent",
        "0s",
    ];
    args.extend(mode.flags());
    args.extend(extra.iter().map(String::as_str));
    let mut command = clean_command(&binary, &args);
    command
        .env(
            "RUST_LOG",
            std::env::var("TOPOLOGY_CLAIMS_BENCH_SERVER_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut command = tokio::process::Command::from(command);
    command.kill_on_drop(true);
    let started = Instant::now();
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
    let stderr = child.stderr.take().ok_or("verify's stderr is not piped")?;
    let show = async move {
        let mut lines = BufReader::new(stderr).lines();
        let mut last_shown = Instant::now();
        let mut tail = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(progress) = line.strip_prefix("progress: ") {
                if last_shown.elapsed() >= PROGRESS_EVERY {
                    eprintln!("bench: verify {}: {progress}", mode.label());
                    last_shown = Instant::now();
                }
            } else {
                eprintln!("verify: {line}");
                tail.push(line);
            }
        }
        tail
    };
    let (output, tail) = tokio::join!(child.wait_with_output(), show);
    let output = output.map_err(|e| format!("waiting for verify: {e}"))?;
    let wall = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    // Exit status 1 is "some corrections failed": the summary says how many.
    if !output.status.success() && output.status.code() != Some(1) {
        return Err(format!(
            "verify {} failed ({}): {}",
            mode.label(),
            output.status,
            tail.join("\n")
        ));
    }
    parse_summary(&stdout, wall)
}

/// Verify at `records`: claims loaded into `system`'s store, the local table in `local_pg`,
/// then per round the streaming and the paging run (drift, verify, clean verify each).
pub async fn run(
    system: &System,
    local_pg: &PgSchema,
    application_name: &str,
    records: u64,
    spec: &Spec,
) -> Result<Vec<Measured>, String> {
    let System::Service { endpoint, .. } = system else {
        return Err("verify needs the claims service".into());
    };
    let k = ((records as f64) * spec.drift).round() as usize;
    eprintln!(
        "bench: verify: {records} records, {k} of each drift kind ({} of each)",
        spec.drift
    );
    let started = Instant::now();
    let mut local = LocalDb::create(local_pg, application_name, records).await?;
    eprintln!(
        "bench: verify: {records} local records loaded in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    load_claims(system, records).await?;
    vacuum(system).await;

    let dir = temp_dir(&local_pg.schema)?;
    std::fs::write(dir.path.join("verify.toml"), VERIFY_TOML)
        .map_err(|e| format!("cannot write verify.toml: {e}"))?;
    let mut rng = fastrand::Rng::with_seed(spec.seed);
    let mut measured = Vec::new();
    for round in 1..=spec.rounds {
        // A B, then B A: neither mode always runs first.
        let modes = if round % 2 == 1 {
            [Mode::Stream, Mode::Paging]
        } else {
            [Mode::Paging, Mode::Stream]
        };
        for mode in modes {
            inject(system, &mut local, k, &mut rng, round, mode).await?;
            vacuum(system).await;
            eprintln!(
                "bench: verify {records} round {round}/{}: {} after {k} of each drift kind",
                spec.rounds,
                mode.label()
            );
            let drift_run =
                run_verify(endpoint, &local, &dir.path, mode, &spec.verify_args).await?;
            eprintln!(
                "bench: verify {}: {:.0} records/s, found {}, corrected {}, failed {}",
                mode.label(),
                drift_run.rate,
                drift_run.found(),
                drift_run.corrected,
                drift_run.failed
            );
            let clean_run =
                run_verify(endpoint, &local, &dir.path, mode, &spec.verify_args).await?;
            eprintln!(
                "bench: verify {} (clean): {:.0} records/s, found {}",
                mode.label(),
                clean_run.rate,
                clean_run.found()
            );
            measured.push(Measured {
                records,
                mode,
                round,
                injected: k as u64,
                drift_run,
                clean_run,
            });
        }
    }
    Ok(measured)
}

/// A directory of the run's (verify.toml, the cursor file), removed when dropped.
struct TempDir {
    path: PathBuf,
}

fn temp_dir(name: &str) -> Result<TempDir, String> {
    let path = std::env::temp_dir().join(name);
    std::fs::create_dir_all(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    Ok(TempDir { path })
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The Markdown table of the verify runs.
pub fn markdown(measured: &[Measured]) -> String {
    let mut out = String::from(
        "| records | mode | round | drift per kind | records/s | wall | missing / different / extra | corrected | failed | clean run records/s | clean run wall | clean run found |\n\
         |---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|\n",
    );
    for m in measured {
        let (d, c) = (&m.drift_run, &m.clean_run);
        out.push_str(&format!(
            "| {} | {} | {} | {} | {:.0} | {:.1} s | {} / {} / {} | {} | {} | {:.0} | {:.1} s | {} |\n",
            m.records,
            m.mode.label(),
            m.round,
            m.injected,
            d.rate,
            d.wall.as_secs_f64(),
            d.missing,
            d.different,
            d.extra,
            d.corrected,
            d.failed,
            c.rate,
            c.wall.as_secs_f64(),
            c.found()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_line_of_verify_is_read_by_its_fields() {
        let stdout = "verify scale-cell: records=2000 claims=1980 missing=20 different=20 \
                      extra=20 skipped_recent=0 corrected=80 failed=0 rate=5123 records/s\n";
        let summary = parse_summary(stdout, Duration::from_secs(1)).unwrap();
        assert_eq!(
            (
                summary.records,
                summary.missing,
                summary.different,
                summary.extra,
                summary.corrected,
                summary.failed
            ),
            (2000, 20, 20, 20, 80, 0)
        );
        assert_eq!(summary.rate, 5123.0);
        assert!(parse_summary("progress: records=1", Duration::ZERO).is_err());
    }
}

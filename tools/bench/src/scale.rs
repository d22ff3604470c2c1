//! Scale checks: ListClaims page latency and LookupClaim latency through gRPC with 10 thousand,
//! 1 million (and, when asked, 10 million) claims loaded, and the server's resident memory.
//!
//! Claims are loaded fast: on PostgreSQL one `INSERT … SELECT generate_series` per half million
//! rows straight into the adapter's `claims` table (the bench's own schema), then `ANALYZE`; on
//! other stores, BeginUpdate + CommitUpdate batches of 1000 claims from four concurrent clients.
//! The same loader preloads every system before the rounds (`--preload`). Owns loading and the
//! sequential latency probes; no reporting.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::future::try_join_all;
use serde_json::{json, Value};
use topology_claims::{
    BeginUpdate, CellId, ClaimKey, ClaimRecord, ClaimType, LeaseId, OwnerType, TableName,
};
use topology_claims_proto::convert::begin_update_to_pb;
use topology_claims_proto::pb;

use super::procs;
use super::raw_sql;
use super::stats::Latency;
use super::systems::{PgSchema, System};

/// The cell every loaded claim belongs to: one cell with all of them is ListClaims' worst case.
pub const SCALE_CELL: &str = "scale-cell";
/// The owner value of every loaded claim.
pub const SCALE_OWNER: &str = "scale-owner";
/// Rows per bulk INSERT statement.
const SQL_CHUNK: u64 = 500_000;
/// Claims per BeginUpdate when loading through gRPC (the server's default --max-batch).
const GRPC_BATCH: u64 = 1000;
const GRPC_LOADERS: u64 = 4;

/// Bench-only bulk load of the adapter's `claims` table (ids `$1..=$2`): committed, unleased
/// username claims of [`SCALE_CELL`], as BeginUpdate + CommitUpdate would have left them.
const BULK_INSERT_CLAIMS: &str = "\
INSERT INTO claims (claim_type, claim_value, owner_type, owner_value, table_name, table_record_id,
                    cell_id, lease_id, lease_op, created_at, updated_at)
SELECT 2, 'scale-' || lpad(i::text, 10, '0'), 3, 'scale-owner', 1, i, 'scale-cell', NULL, NULL, now(), now()
FROM generate_series($1::bigint, $2::bigint) AS i";

/// The username claim value of loaded record `i`.
pub fn value(i: u64) -> String {
    format!("scale-{i:010}")
}

/// Loads claims `from..to` of [`SCALE_CELL`] into a system's store: SQL bulk insert (then
/// `ANALYZE`) for PostgreSQL, gRPC batches otherwise; etcd and noop hold nothing. Returns the path used.
pub async fn load(system: &System, from: u64, to: u64) -> Result<&'static str, String> {
    match system {
        System::Service {
            postgres: Some(pg), ..
        } => load_sql(pg, from, to).await.map(|()| "sql"),
        System::Service { .. } => load_grpc(system, from, to, &AtomicU64::new(0))
            .await
            .map(|()| "grpc"),
        System::RawSql(target) => load_sql(&target.schema, from, to).await.map(|()| "sql"),
        System::Etcd(_) | System::Noop(_) => Ok("none"),
    }
}

/// Loads each size in turn (cumulatively, on top of `preloaded`) and probes latencies at each.
pub async fn run(
    system: &System,
    sizes: &[u64],
    samples: usize,
    page_size: u32,
    preloaded: u64,
) -> Result<Vec<Value>, String> {
    let System::Service { .. } = system else {
        return Ok(Vec::new());
    };
    let label = system.label();
    let mut loaded = preloaded;
    let mut results = Vec::new();
    let mut sizes = sizes.to_vec();
    sizes.sort_unstable();
    for size in sizes {
        if size > loaded {
            eprintln!("bench: {label} scale: loading claims {loaded}..{size}");
        }
        let started = Instant::now();
        let path = load(system, loaded, size).await?;
        let load_s = started.elapsed().as_secs_f64();
        loaded = loaded.max(size);
        let probe = probe(system, loaded, samples, page_size).await?;
        let rss = system.server_pid().and_then(procs::rss_kib);
        eprintln!(
            "bench: {label} scale {loaded}: ListClaims p50 {:.2} ms p99 {:.2} ms, LookupClaim p50 {:.2} ms p99 {:.2} ms",
            probe.list.ms(0.5),
            probe.list.ms(0.99),
            probe.lookup.ms(0.5),
            probe.lookup.ms(0.99)
        );
        results.push(json!({
            "system": label,
            "claims": loaded,
            "load_path": path,
            "load_s": load_s,
            "page_size": page_size,
            "list_claims": probe.list.to_json(),
            "lookup_claim": probe.lookup.to_json(),
            "errors": probe.errors,
            "server_rss_kib": rss,
        }));
    }
    Ok(results)
}

async fn load_sql(pg: &PgSchema, from: u64, to: u64) -> Result<(), String> {
    if to <= from {
        return Ok(());
    }
    let config = raw_sql::schema_config(&pg.url, &pg.schema)?;
    let client = raw_sql::connect(&config).await?;
    let insert = client
        .prepare(BULK_INSERT_CLAIMS)
        .await
        .map_err(|e| format!("preparing the bulk load: {e}"))?;
    let mut start = from;
    while start < to {
        let end = (start + SQL_CHUNK).min(to);
        let (first, last) = (start as i64, end as i64 - 1);
        client
            .execute(&insert, &[&first, &last])
            .await
            .map_err(|e| format!("bulk loading claims: {e}"))?;
        start = end;
    }
    client
        .batch_execute("ANALYZE claims")
        .await
        .map_err(|e| format!("ANALYZE claims: {e}"))
}

/// Loads claims `from..to` (record ids `from..to`, owner [`SCALE_OWNER`]) of [`SCALE_CELL`]
/// through gRPC: batches of 1000 from four concurrent clients, each committed batch added to
/// `loaded`.
pub async fn load_grpc(
    system: &System,
    from: u64,
    to: u64,
    loaded: &AtomicU64,
) -> Result<(), String> {
    let cell = CellId::parse(SCALE_CELL).map_err(|e| e.to_string())?;
    let loaders = (0..GRPC_LOADERS).map(|loader| {
        let cell = cell.clone();
        async move {
            let conn = system.grpc_conn(SCALE_CELL).await?;
            let mut client = conn.client();
            let mut start = from + loader * GRPC_BATCH;
            while start < to {
                let end = (start + GRPC_BATCH).min(to);
                let lease_id = LeaseId::generate();
                let request = BeginUpdate {
                    local_transaction: None,
                    cell_id: cell.clone(),
                    lease_id: Some(lease_id),
                    creates: (start..end)
                        .map(|i| ClaimRecord {
                            display: None,
                            key: ClaimKey::new(ClaimType::Username, value(i)),
                            owner_type: OwnerType::USER,
                            owner_value: SCALE_OWNER.into(),
                            table_name: TableName::USERS,
                            table_record_id: i as i64,
                        })
                        .collect(),
                    destroys: Vec::new(),
                    updates: Vec::new(),
                };
                client
                    .begin_update(begin_update_to_pb(&request))
                    .await
                    .map_err(|s| format!("loading claims: BeginUpdate failed: {s}"))?;
                client
                    .commit_update(pb::CommitUpdateRequest {
                        cell_id: SCALE_CELL.into(),
                        lease_id: lease_id.to_string(),
                    })
                    .await
                    .map_err(|s| format!("loading claims: CommitUpdate failed: {s}"))?;
                loaded.fetch_add(end - start, Ordering::Relaxed);
                start += GRPC_BATCH * GRPC_LOADERS;
            }
            Ok::<(), String>(())
        }
    });
    try_join_all(loaders).await.map(drop)
}

struct Probe {
    list: Latency,
    lookup: Latency,
    errors: u64,
}

/// Sequential ListClaims pages at random cursors and LookupClaims of random loaded claims.
async fn probe(
    system: &System,
    loaded: u64,
    samples: usize,
    page_size: u32,
) -> Result<Probe, String> {
    let mut client = system.grpc_conn(SCALE_CELL).await?.client();
    let mut rng = fastrand::Rng::with_seed(loaded);
    let mut result = Probe {
        list: Latency::default(),
        lookup: Latency::default(),
        errors: 0,
    };
    let span = loaded.saturating_sub(u64::from(page_size)).max(1);
    let warmup = (samples / 10).max(5);
    for i in 0..warmup + samples {
        let cursor = rng.u64(0..span) as i64;
        let started = Instant::now();
        let listed = client
            .list_claims(pb::ListClaimsRequest {
                cell_id: SCALE_CELL.into(),
                table_name: TableName::USERS.number(),
                cursor,
                limit: page_size as i32,
                cursor_key: None,
                // A probe reads one page at a random record and follows none.
                page_token: String::new(),
                page_tokens: true,
                source_table: String::new(),
            })
            .await;
        let list_time = started.elapsed();
        let started = Instant::now();
        let looked_up = client
            .lookup_claim(pb::LookupClaimRequest {
                claim_type: ClaimType::Username.number(),
                claim_value: value(rng.u64(0..loaded.max(1))),
                ..Default::default()
            })
            .await;
        let lookup_time = started.elapsed();
        if i < warmup {
            continue;
        }
        record(
            &mut result.list,
            &mut result.errors,
            listed.is_ok(),
            list_time,
        );
        record(
            &mut result.lookup,
            &mut result.errors,
            looked_up.is_ok(),
            lookup_time,
        );
    }
    Ok(result)
}

fn record(latency: &mut Latency, errors: &mut u64, ok: bool, elapsed: Duration) {
    if ok {
        latency.record(elapsed);
    } else {
        *errors += 1;
    }
}

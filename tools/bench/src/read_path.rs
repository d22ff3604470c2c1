//! `--read-path`: the router's read path, measured on every `--store` server the bench started
//! (docs/benchmarks.md, "The router's read path"):
//! - **lookups**: LookupClaim over gRPC against `GET /v1/claims/{namespace}/{value}` over
//!   HTTP/1.1, closed loop, at each `--clients` count, the two kinds in turn in every round
//!   (`--rounds` × `--duration`, after `--warmup`); each client keeps one connection;
//! - **watch lag**: one WatchClaims stream while BeginUpdate + CommitUpdate pairs of one new
//!   claim are started at `--watch-rate` per second (open loop) for `--duration`: the time from
//!   each CommitUpdate's answer to the watcher's ACTIVE event of that claim.
//!
//! Owns these two measurements; the servers are `main`'s, the statistics `stats`'.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use topology_claims::{BeginUpdate, CellId, ClaimKey, ClaimState, ClaimType};
use topology_claims_client::{ClaimsClient, ClientConfig, WatchRequest};

use crate::stats::Latency;
use crate::systems::System;
use crate::workload::signup_claims;
use crate::BenchArgs;

/// The flags of `--read-path`.
#[derive(clap::Args, Debug, Clone)]
pub struct ReadPathArgs {
    /// Measure the router's read path instead of the rounds: LookupClaim over gRPC against the
    /// REST GET at each --clients count, then the watch lag at --watch-rate pairs/s
    /// (plaintext --store servers only).
    #[arg(long = "read-path", env = "TOPOLOGY_CLAIMS_BENCH_READ_PATH")]
    pub enabled: bool,
    /// Pairs per second started while the watch lag is measured.
    #[arg(
        long = "watch-rate",
        env = "TOPOLOGY_CLAIMS_BENCH_WATCH_RATE",
        default_value_t = 1000
    )]
    pub watch_rate: u32,
    /// Claims created before the lookups, which pick among them at random.
    #[arg(
        long = "read-keys",
        env = "TOPOLOGY_CLAIMS_BENCH_READ_KEYS",
        default_value_t = 1000
    )]
    pub keys: u32,
}

/// Pairs in flight at most while the watch lag is measured (beyond it a tick is skipped and
/// counted).
const MAX_IN_FLIGHT: usize = 512;
/// Connections the pairs of the watch lag measurement are spread over.
const DRIVERS: usize = 16;

fn cell() -> CellId {
    CellId::parse("bench-read-path").unwrap_or_else(|e| unreachable!("{e}"))
}

/// A BeginUpdate creating the usernames `names`.
fn creates(names: &[String]) -> BeginUpdate {
    BeginUpdate {
        local_transaction: None,
        cell_id: cell(),
        lease_id: None,
        creates: names
            .iter()
            .zip(0..)
            .flat_map(|(name, i)| signup_claims(name, i, 1))
            .collect(),
        destroys: Vec::new(),
        updates: Vec::new(),
    }
}

fn username(name: &str) -> ClaimKey {
    ClaimKey::new(ClaimType::Username, name.to_owned())
}

/// Runs both measurements on every service the bench started.
pub async fn run(args: &BenchArgs, systems: &[System]) -> Result<(), String> {
    let mut measured = 0;
    for system in systems {
        let System::Service {
            label,
            endpoint,
            tls: None,
            ..
        } = system
        else {
            continue;
        };
        measured += 1;
        let client = ClaimsClient::connect_lazy(endpoint, ClientConfig::default())
            .map_err(|e| e.to_string())?;
        eprintln!(
            "bench: {label}: creating {} claims to look up",
            args.read.keys
        );
        let names = load(&client, args.read.keys).await?;
        println!("\n== {label}: lookups, gRPC LookupClaim against REST GET ==");
        println!("clients  kind   lookups/s    p50 ms    p99 ms   REST p99 / gRPC p99");
        for &clients in &args.clients {
            let (mut grpc, mut rest) = ((0, Latency::default()), (0, Latency::default()));
            for _ in 0..args.rounds {
                for (rest_kind, into) in [(false, &mut grpc), (true, &mut rest)] {
                    let _ = segment(endpoint, &names, clients, args.warmup, rest_kind).await?;
                    let (n, h) =
                        segment(endpoint, &names, clients, args.duration, rest_kind).await?;
                    into.0 += n;
                    into.1.merge(&h);
                }
            }
            let seconds = args.duration.as_secs_f64() * f64::from(args.rounds);
            for (kind, (n, h)) in [("gRPC", &grpc), ("REST", &rest)] {
                let ratio = if kind == "REST" {
                    format!("{:.2}", h.ms(0.99) / grpc.1.ms(0.99).max(0.001))
                } else {
                    String::new()
                };
                println!(
                    "{clients:>7}  {kind:<5} {:>10.0} {:>9.2} {:>9.2}   {ratio}",
                    *n as f64 / seconds,
                    h.ms(0.5),
                    h.ms(0.99)
                );
            }
        }
        watch_lag(label, endpoint, args).await?;
    }
    if measured == 0 {
        return Err(
            "--read-path needs a plaintext --store server (not --tls, not --server)".into(),
        );
    }
    Ok(())
}

/// Creates `keys` claims in pairs of 100; returns their names.
async fn load(client: &ClaimsClient, keys: u32) -> Result<Vec<String>, String> {
    let names: Vec<String> = (0..keys)
        .map(|i| format!("rp-{:08x}-{i}", fastrand::u32(..)))
        .collect();
    for chunk in names.chunks(100) {
        let lease = client
            .begin_update(creates(chunk))
            .await
            .map_err(|e| e.to_string())?;
        client
            .commit_update(&cell(), lease.lease_id)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(names)
}

/// `clients` closed-loop clients looking up random names for `length`; lookups and latencies.
async fn segment(
    endpoint: &str,
    names: &[String],
    clients: usize,
    length: Duration,
    rest: bool,
) -> Result<(u64, Latency), String> {
    let names = Arc::new(names.to_vec());
    let deadline = Instant::now() + length;
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let names = Arc::clone(&names);
        let endpoint = endpoint.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut h = Latency::default();
            let mut n = 0u64;
            let grpc = ClaimsClient::connect_lazy(&endpoint, ClientConfig::default())
                .map_err(|e| e.to_string())?;
            let http: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
            while Instant::now() < deadline {
                let name = &names[fastrand::usize(..names.len())];
                let started = Instant::now();
                if rest {
                    let uri: http::Uri = format!("{endpoint}/v1/claims/usernames/{name}")
                        .parse()
                        .map_err(|e| format!("{e}"))?;
                    let answer = http.get(uri).await.map_err(|e| format!("GET: {e}"))?;
                    let status = answer.status();
                    answer
                        .into_body()
                        .collect()
                        .await
                        .map_err(|e| format!("GET: {e}"))?;
                    if status != 200 {
                        return Err(format!("GET {name}: {status}"));
                    }
                } else {
                    grpc.lookup_claim(&username(name))
                        .await
                        .map_err(|e| format!("LookupClaim {name}: {e}"))?;
                }
                h.record(started.elapsed());
                n += 1;
            }
            Ok::<_, String>((n, h))
        }));
    }
    let mut total = (0, Latency::default());
    for task in tasks {
        let (n, h) = task.await.map_err(|e| e.to_string())??;
        total.0 += n;
        total.1.merge(&h);
    }
    Ok(total)
}

/// One watcher while pairs start at `--watch-rate` for `--duration`: the lag from each
/// CommitUpdate's answer to the watcher's ACTIVE event of its claim.
async fn watch_lag(label: &str, endpoint: &str, args: &BenchArgs) -> Result<(), String> {
    let rate = args.read.watch_rate.max(1);
    let watcher =
        ClaimsClient::connect_lazy(endpoint, ClientConfig::default()).map_err(|e| e.to_string())?;
    let mut watch = watcher
        .watch_claims(&WatchRequest::default())
        .await
        .map_err(|e| format!("WatchClaims: {e}"))?;
    // The first response: the current revision; events follow from there.
    watch.next().await.map_err(|e| e.to_string())?;
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let follower = tokio::spawn({
        let seen = Arc::clone(&seen);
        async move {
            while let Ok(Some(batch)) = watch.next().await {
                let now = Instant::now();
                let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                for event in batch.events {
                    if !event.deleted && event.claim.state() == ClaimState::Active {
                        seen.entry(event.claim.record.key.value).or_insert(now);
                    }
                }
            }
        }
    });
    let drivers: Vec<ClaimsClient> = (0..DRIVERS)
        .map(|_| ClaimsClient::connect_lazy(endpoint, ClientConfig::default()))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let committed: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let in_flight = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let prefix = format!("wl-{:08x}", fastrand::u32(..));
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let (mut sent, mut skipped) = (0u64, 0u64);
    let mut tasks = Vec::new();
    while started.elapsed() < args.duration {
        ticks.tick().await;
        let Ok(permit) = Arc::clone(&in_flight).try_acquire_owned() else {
            skipped += 1;
            continue;
        };
        let client = drivers[sent as usize % DRIVERS].clone();
        let name = format!("{prefix}-{sent}");
        let committed = Arc::clone(&committed);
        sent += 1;
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            let lease = client
                .begin_update(creates(std::slice::from_ref(&name)))
                .await
                .ok()?;
            client.commit_update(&cell(), lease.lease_id).await.ok()?;
            committed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(name, Instant::now());
            Some(())
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let elapsed = started.elapsed();
    // Give the last events a moment to arrive.
    tokio::time::sleep(Duration::from_secs(2)).await;
    follower.abort();
    let committed = committed.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut lag = Latency::default();
    let mut missing = 0;
    for (name, answered) in &committed {
        match seen.get(name) {
            // An event may arrive before the answer does: no lag.
            Some(at) => lag.record(at.saturating_duration_since(*answered)),
            None => missing += 1,
        }
    }
    println!("\n== {label}: watch lag, CommitUpdate's answer to the watcher's event ==");
    println!(
        "target {rate} pairs/s: {:.0} pairs/s committed ({} of {sent} started, {skipped} ticks \
         skipped at {MAX_IN_FLIGHT} in flight), lag p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, \
         {missing} events missing",
        committed.len() as f64 / elapsed.as_secs_f64(),
        committed.len(),
        lag.ms(0.5),
        lag.ms(0.99),
        lag.ms(1.0)
    );
    if missing > 0 {
        return Err(format!(
            "{label}: {missing} committed claims never reached the watcher"
        ));
    }
    Ok(())
}

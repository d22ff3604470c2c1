//! Runs one measured segment: N concurrent clients against one system for a warm-up plus a
//! measured duration, each doing BeginUpdate + CommitUpdate pairs of the scenario's batches,
//! while a progress line goes to stderr and the server's CPU and memory are sampled; the
//! combiner's batch-size histogram is scraped around the measured part where the server exports it.
//!
//! Owns the load loop and the sampling around it. Must not choose systems or print reports.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::try_join_all;
use serde_json::json;
use tokio::sync::Notify;
use topology_claims::LeaseId;

use super::group_sizes::{self, GroupSizes};
use super::procs;
use super::raw_sql::PgProcesses;
use super::stats::{Cpu, PairTiming, Segment, Tally};
use super::systems::{Conn, PairConn, System};
use super::workload::{Batch, Generator, Scenario, Zipf};

/// What to run in one segment.
pub struct Spec {
    pub scenario: Scenario,
    pub clients: usize,
    pub batch: usize,
    pub warmup: Duration,
    pub duration: Duration,
    pub round: usize,
    pub rounds: usize,
    /// Unique per run and segment: keeps unique keys unique across segments and runs.
    pub prefix: String,
    pub zipf: Arc<Zipf>,
    pub seed: u64,
}

/// Runs the segment and returns its measurements. `postgres`, when given, narrows PostgreSQL's
/// CPU to the processes working for this run.
pub async fn run(
    system: &mut System,
    spec: &Spec,
    postgres: Option<&PgProcesses>,
) -> Result<Segment, String> {
    system.check_alive()?;
    let label = system.label();
    let conns = try_join_all((0..spec.clients).map(|client| system.connect(client))).await?;

    let started = Instant::now();
    let record_from = started + spec.warmup;
    let deadline = record_from + spec.duration;
    let recorded = Arc::new(AtomicU64::new(0));
    let done = Arc::new(Notify::new());

    let workers: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(client, conn)| {
            let generator = Generator::new(
                spec.scenario,
                spec.batch,
                spec.prefix.clone(),
                client,
                &spec.zipf,
                spec.seed,
            );
            let recorded = Arc::clone(&recorded);
            tokio::spawn(client_loop(
                conn,
                generator,
                spec.scenario,
                record_from,
                deadline,
                recorded,
            ))
        })
        .collect();

    let server_pid = system.server_pid();
    let sampler = tokio::spawn(sample_rss(server_pid, Arc::clone(&done)));
    let progress = tokio::spawn(show_progress(
        format!(
            "{label} {} {}c round {}/{}",
            spec.scenario,
            spec.clients,
            spec.round + 1,
            spec.rounds
        ),
        record_from,
        Arc::clone(&recorded),
    ));

    tokio::time::sleep_until(record_from.into()).await;
    let groups_before = scrape_groups(system).await;
    let before = cpu_snapshot(system, postgres).await;
    let mut tally = Tally::default();
    // Connections stay open until the CPU is read: a closed backend's CPU would be lost.
    let mut open = Vec::with_capacity(spec.clients);
    for worker in workers {
        let (client, conn) = worker
            .await
            .map_err(|e| format!("a benchmark client failed: {e}"))?;
        tally.merge(&client);
        open.push(conn);
    }
    let elapsed = record_from.elapsed();
    let after = cpu_snapshot(system, postgres).await;
    let groups_after = scrape_groups(system).await;
    drop(open);
    done.notify_one();
    let server_rss_kib = sampler.await.unwrap_or(None);
    progress.abort();
    system.check_alive()?;

    Ok(Segment {
        system: label,
        scenario: spec.scenario.name().to_owned(),
        clients: spec.clients,
        elapsed,
        tally,
        cpu: difference(&before, &after),
        server_rss_kib,
        groups: match (groups_before, groups_after) {
            (Some(before), Some(after)) => Some(after.since(&before)),
            _ => None,
        },
    })
}

/// The closed loop of a run: for every scenario and client count, `--rounds` rounds in which
/// every system runs a segment in turn. A segment that fails is reported (stderr, and in the
/// second list) and the run goes on.
pub async fn rounds(
    args: &super::BenchArgs,
    systems: &mut [System],
    schemas: &[super::systems::PgSchema],
    tag: &str,
    zipf: &Arc<Zipf>,
    pg_processes: Option<&PgProcesses>,
) -> (Vec<Segment>, Vec<serde_json::Value>) {
    let rounds = args.rounds as usize;
    let mut segments = Vec::new();
    let mut failed = Vec::new();
    let mut segment_id = 0usize;
    for scenario in &args.scenario {
        for &clients in &args.clients {
            // What autovacuum would do between the groups (dead row versions of the previous
            // group, fresh statistics), so no group pays for the one before it.
            super::pg::vacuum_schemas(schemas).await;
            for round in 0..rounds {
                for system in systems.iter_mut() {
                    segment_id += 1;
                    let spec = Spec {
                        scenario: *scenario,
                        clients,
                        batch: args.batch as usize,
                        warmup: args.warmup,
                        duration: args.duration,
                        round,
                        rounds,
                        prefix: format!("b{tag}s{segment_id}"),
                        zipf: Arc::clone(zipf),
                        seed: args
                            .seed
                            .wrapping_mul(1_000_003)
                            .wrapping_add(segment_id as u64),
                    };
                    // One failed segment (say, PostgreSQL out of connections because another
                    // suite shares it) must not throw away a long run: report it, go on, and
                    // fail at the end.
                    match run(system, &spec, pg_processes).await {
                        Ok(segment) => segments.push(segment),
                        Err(error) => {
                            let label = system.label();
                            eprintln!(
                                "bench: {label} {scenario} {clients}c round {}: {error}",
                                round + 1
                            );
                            failed.push(json!({
                                "system": label,
                                "scenario": scenario.name(),
                                "clients": clients,
                                "round": round + 1,
                                "error": error,
                            }));
                        }
                    }
                }
            }
        }
    }
    (segments, failed)
}

/// The combiner's histogram now, if the system exports it; a failed scrape is a warning (the
/// segment's throughput is still good), and the row then shows no batch sizes.
async fn scrape_groups(system: &System) -> Option<GroupSizes> {
    let addr = system.metrics_addr()?;
    match group_sizes::scrape(addr).await {
        Ok(sizes) => sizes,
        Err(e) => {
            eprintln!("warning: {}: {e}", system.label());
            None
        }
    }
}

/// One client: pairs until the deadline; pairs started before `record_from` are warm-up.
async fn client_loop(
    mut conn: Conn,
    mut generator: Generator,
    scenario: Scenario,
    record_from: Instant,
    deadline: Instant,
    recorded: Arc<AtomicU64>,
) -> (Tally, Conn) {
    let mut tally = Tally::default();
    while Instant::now() < deadline {
        let batch = generator.next();
        let created = pair(&mut conn, &batch, &mut tally, record_from, &recorded).await;
        // Destroying what was created keeps hot keys cycling and churn honest; it runs even
        // past the deadline so no segment leaves claims behind for the next one.
        if created && scenario.destroys() {
            pair(
                &mut conn,
                &batch.destroying(),
                &mut tally,
                record_from,
                &recorded,
            )
            .await;
        }
    }
    (tally, conn)
}

/// BeginUpdate + CommitUpdate of one batch, sent now and recorded when it started after
/// `record_from`. Returns whether both succeeded.
async fn pair(
    conn: &mut Conn,
    batch: &Batch,
    tally: &mut Tally,
    record_from: Instant,
    recorded: &AtomicU64,
) -> bool {
    let start = Instant::now();
    let timing = timed_pair(conn, batch, start).await;
    if start >= record_from {
        tally.add(&timing);
        if timing.succeeded() {
            recorded.fetch_add(1, Ordering::Relaxed);
        }
    }
    timing.succeeded()
}

/// BeginUpdate + CommitUpdate of one batch under a fresh lease, the begin timed from `start`
/// (which may lie before now: the open loop's schedule) and the commit, sent as soon as the
/// begin succeeded, from the begin's answer.
pub async fn timed_pair<C: PairConn>(conn: &mut C, batch: &Batch, start: Instant) -> PairTiming {
    let lease = LeaseId::generate();
    let begun = conn.begin(batch, lease).await;
    let begun_at = Instant::now();
    let commit = match &begun {
        Ok(()) => {
            let committed = conn.commit(batch, lease).await;
            Some((begun_at.elapsed(), committed))
        }
        Err(_) => None,
    };
    PairTiming {
        begin: begun_at.saturating_duration_since(start),
        begun,
        commit,
        claims: batch.records.len() as u64,
    }
}

/// CPU seconds so far of the bench, the system's server process, PostgreSQL (the run's
/// processes when known, else every `postgres` process) and the machine.
async fn cpu_snapshot(system: &System, postgres: Option<&PgProcesses>) -> Snapshot {
    let postgres = match postgres {
        Some(processes) => processes
            .pids()
            .await
            .into_iter()
            .filter_map(|pid| Some((pid, procs::cpu_seconds(pid)?)))
            .collect(),
        None => HashMap::from([(0, procs::postgres_cpu_seconds())]),
    };
    Snapshot {
        cpu: own_cpu(system),
        postgres,
    }
}

struct Snapshot {
    cpu: Cpu,
    /// CPU seconds by pid (pid 0: all `postgres` processes together).
    postgres: HashMap<u32, f64>,
}

fn own_cpu(system: &System) -> Cpu {
    let server = system.server_pid().and_then(procs::cpu_seconds);
    let (server, etcd) = match system {
        System::Etcd(_) => (None, server),
        _ => (server, None),
    };
    Cpu {
        bench: procs::self_cpu_seconds(),
        server,
        postgres: 0.0,
        etcd,
        machine: procs::machine_busy_seconds(),
    }
}

fn difference(before: &Snapshot, after: &Snapshot) -> Cpu {
    let diff = |a: Option<f64>, b: Option<f64>| Some(b? - a?);
    // A process that appeared during the segment (a new pooled connection) counts whole.
    let postgres = after
        .postgres
        .iter()
        .map(|(pid, seconds)| seconds - before.postgres.get(pid).copied().unwrap_or(0.0))
        .sum::<f64>()
        .max(0.0);
    let (before, after) = (&before.cpu, &after.cpu);
    Cpu {
        bench: after.bench - before.bench,
        server: diff(before.server, after.server),
        postgres,
        etcd: diff(before.etcd, after.etcd),
        machine: after.machine - before.machine,
    }
}

/// The largest resident set of `pid` seen until `done`.
async fn sample_rss(pid: Option<u32>, done: Arc<Notify>) -> Option<u64> {
    let pid = pid?;
    let mut max = procs::rss_kib(pid);
    loop {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
            () = done.notified() => return max.max(procs::rss_kib(pid)),
        }
        max = max.max(procs::rss_kib(pid));
    }
}

/// A line per second on stderr: pairs/s over the last second and so far (aborted at the end).
async fn show_progress(label: String, record_from: Instant, recorded: Arc<AtomicU64>) {
    let mut last = 0;
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let now = recorded.load(Ordering::Relaxed);
        if Instant::now() < record_from {
            eprintln!("bench: {label}: warming up");
            continue;
        }
        let seconds = record_from.elapsed().as_secs_f64();
        eprintln!(
            "bench: {label}: {:>6.1}s {:>8} pairs/s now, {:>8.0} pairs/s so far",
            seconds,
            now - last,
            now as f64 / seconds.max(1e-9)
        );
        last = now;
    }
}

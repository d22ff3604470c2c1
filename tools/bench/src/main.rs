//! `topology-claims-bench`: the load generator. N concurrent clients over real gRPC do
//! BeginUpdate + CommitUpdate pairs of K-claim batches against the service (a `serve` child per
//! `--store` and `--serve-variant`, or `--server URL`), interleaved round by round with baselines
//! on the same machine (the adapter's SQL run directly, etcd, an empty gRPC server), so the ratios
//! hold even when the machine drifts. Reports pairs/s, claims/s, latency percentiles per RPC and
//! per pair, outcomes by reason, CPU and memory per process, the batch sizes the server's
//! combiner formed, the scale checks (ListClaims / LookupClaim with many claims), JSON and a PNG
//! plot; `--verify N` measures `topology-claims verify` instead (streaming and paging,
//! over N records with injected drift). How to run it and the measured numbers: `docs/benchmarks.md`.
//!
//! Drives the real `topology-claims` binary as a child process (found beside this one, on PATH,
//! or at `--bin` / `TOPOLOGY_CLAIMS_BIN`). Owns the benchmark only: it must not be a dependency
//! of the product binary or hold protocol rules.

mod cli_values;
mod etcd;
mod group_sizes;
mod noop;
mod open_loop;
mod pg;
mod plot;
mod procs;
mod rates;
mod raw_sql;
mod read_path;
mod report;
mod runner;
mod scale;
mod slo;
mod stats;
mod systems;
mod verify;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use serde_json::json;

use cli_values::{parse_count, parse_count_or_zero, parse_drift, parse_variant, ServeVariant};
use pg::{
    drop_schema, fresh_schema, is_postgres, postgres_reachable, postgres_settings,
    warn_about_postgres_connections,
};
use systems::{Baseline, PgSchema, System};
use topology_claims::config::parse_duration;
use topology_claims_harness::postgres::url_with_search_path;
use workload::{Scenario, Zipf};

/// Load generator: N concurrent gRPC clients doing BeginUpdate + CommitUpdate pairs against the
/// service, interleaved with raw-SQL and etcd baselines; prints tables, writes JSON and a PNG plot
/// (docs/benchmarks.md).
#[derive(Parser, Debug)]
#[command(name = "topology-claims-bench", version)]
pub struct BenchArgs {
    /// The topology-claims binary whose `serve` is measured (default: the one built beside this
    /// tool, else the PATH's).
    #[arg(long = "bin", env = "TOPOLOGY_CLAIMS_BIN")]
    bin: Option<PathBuf>,

    /// A running server to measure (http://HOST:PORT). Its CPU and memory are not measured; use
    /// --store to let the bench start (and measure) the server itself.
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_SERVER", conflicts_with = "store")]
    server: Option<String>,

    /// Store URLs to measure, comma-separated (memory:, sqlite:, sqlite://PATH, postgres://…).
    /// For each, the bench starts `topology-claims serve --listen 127.0.0.1:0 --store URL` as a
    /// child; a PostgreSQL store gets a fresh schema of its own, dropped at the end; `sqlite:` is
    /// the embedded default store in a fresh file per server, deleted at the end.
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_STORE", value_delimiter = ',')]
    store: Vec<String>,

    /// Concurrent clients, comma-separated: every scenario runs once per count.
    #[arg(
        long,
        env = "TOPOLOGY_CLAIMS_BENCH_CLIENTS",
        value_delimiter = ',',
        default_value = "1,4,16,64"
    )]
    clients: Vec<usize>,

    /// Measured time of one segment (one system, scenario, client count and round).
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_DURATION", default_value = "5s",
          value_parser = parse_duration)]
    duration: Duration,

    /// Unmeasured warm-up before each segment (connections, prepared statements, caches).
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_WARMUP", default_value = "1s",
          value_parser = parse_duration)]
    warmup: Duration,

    /// Rounds: every system runs once per round, in turn (A B A B …), so drift cancels.
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_ROUNDS", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,

    /// Claims per BeginUpdate (K): username, email, then routes.
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_BATCH", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    batch: u32,

    /// Scenarios, comma-separated: unique (no conflicts), hot (Zipf over a small key space:
    /// CLAIM_TAKEN / CLAIM_LEASED happen), churn (create, then destroy the same claims).
    #[arg(
        long,
        env = "TOPOLOGY_CLAIMS_BENCH_SCENARIO",
        value_delimiter = ',',
        default_value = "unique"
    )]
    scenario: Vec<Scenario>,

    /// Entities the hot scenario picks from.
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_HOT_KEYS", default_value_t = 1000)]
    hot_keys: usize,

    /// Exponent of the hot scenario's Zipf distribution.
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_ZIPF", default_value_t = 1.0)]
    zipf: f64,

    /// Baselines run in the same rounds, comma-separated: raw-sql (the adapter's statements one
    /// round trip each), raw-sql-pipelined (the same in the adapter's two flights), etcd, noop
    /// (the claims gRPC service with handlers that only answer: the RPC stack's ceiling).
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_BASELINES", value_delimiter = ',')]
    baselines: Vec<Baseline>,

    /// PostgreSQL for the raw-SQL baselines (a fresh schema is used); default: the first
    /// postgres:// --store.
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_BASELINE_POSTGRES")]
    baseline_postgres: Option<String>,

    /// The etcd binary of the etcd baseline (Debian package etcd-server).
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_ETCD_BIN", default_value = "etcd")]
    etcd_bin: String,

    /// Scale checks after the rounds: claims to load, comma-separated (10k, 1m, 10m or plain
    /// numbers); ListClaims and LookupClaim latency are probed at each size. Empty: none.
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_SCALE", value_delimiter = ',',
          value_parser = parse_count)]
    scale: Vec<u64>,

    /// Claims loaded into every system's store before the rounds (the first of the scale
    /// check's claims; 0 for none), so PostgreSQL plans its statements against a populated,
    /// analysed table as in production, not against the empty table of a fresh schema.
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_PRELOAD", default_value = "10k",
          value_parser = parse_count_or_zero)]
    preload: u64,

    /// Sequential ListClaims and LookupClaim requests per scale size.
    #[arg(
        long,
        env = "TOPOLOGY_CLAIMS_BENCH_SCALE_SAMPLES",
        default_value_t = 300
    )]
    scale_samples: usize,

    /// ListClaims page size of the scale checks.
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_PAGE_SIZE", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    page_size: u32,

    /// Extra arguments for every `serve` child (e.g. --serve-arg=--pg-pool-size=32);
    /// space-separated in the env var.
    #[arg(
        long = "serve-arg",
        env = "TOPOLOGY_CLAIMS_BENCH_SERVE_ARGS",
        value_delimiter = ' ',
        allow_hyphen_values = true
    )]
    serve_args: Vec<String>,

    /// A/B of `serve` arguments in one run: NAME=ARGS (ARGS space-separated, may be empty), e.g.
    /// `--serve-variant on=--group-commit=on --serve-variant off=--group-commit=off`. Each
    /// --store is then started once per variant (label `STORE/NAME`, own schema or file), and
    /// the variants run in turn in every round like the other systems. ARGS come after
    /// --serve-arg. `;`-separated in the env var. Default: none (one server per store).
    #[arg(
        long = "serve-variant",
        env = "TOPOLOGY_CLAIMS_BENCH_SERVE_VARIANTS",
        value_delimiter = ';',
        allow_hyphen_values = true,
        value_parser = parse_variant
    )]
    serve_variants: Vec<ServeVariant>,

    /// `NAME=NORMALIZATION`: right after the server of variant NAME starts (its store empty),
    /// set the built-in namespaces (routes, usernames, emails) to NORMALIZATION (`exact`,
    /// `ascii-case-insensitive`, `precis-username`) through the admin UpdateNamespace, e.g.
    /// `--serve-variant exact= --variant-normalization exact=exact`: what computing keys costs,
    /// A/B in one run (docs/benchmarks.md, "Normalization"). Plaintext servers only.
    #[arg(
        long = "variant-normalization",
        env = "TOPOLOGY_CLAIMS_BENCH_VARIANT_NORMALIZATION",
        value_delimiter = ';'
    )]
    variant_normalization: Vec<String>,

    /// Mutual TLS for the servers the bench starts (--store): `on` (also plain `--tls`): every
    /// one serves TLS with a development PKI the bench makes (`topology-claims certs`, in a
    /// temporary directory) and each client connects over https:// with the certificate of its
    /// cell `bench-N`; `both`: each --store is started twice, plaintext and TLS (label
    /// `LABEL-tls`), measured side by side in the same rounds; `off`.
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_TLS", value_enum, num_args = 0..=1,
          default_value = "off", default_missing_value = "on")]
    tls: TlsMode,

    /// Verify at scale instead of the load rounds: for each size (10k, 1m or plain numbers,
    /// comma-separated) and each --store, that many claims and local records (a PostgreSQL
    /// table of the cell's, in the first postgres:// --store's database), --drift of each drift
    /// kind injected, then `topology-claims verify` streaming and with --no-stream, --rounds
    /// times, each followed by a clean run that must find nothing.
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_VERIFY", value_delimiter = ',',
          value_parser = parse_count)]
    verify: Vec<u64>,

    /// Fraction of the records given each drift kind (missing, extra, different) before every
    /// verify run of --verify.
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_DRIFT", default_value_t = 0.01,
          value_parser = parse_drift)]
    drift: f64,

    /// Extra arguments for every `verify` child of --verify (e.g. --verify-arg=--page-size=500);
    /// space-separated in the env var.
    #[arg(
        long = "verify-arg",
        env = "TOPOLOGY_CLAIMS_BENCH_VERIFY_ARGS",
        value_delimiter = ' ',
        allow_hyphen_values = true
    )]
    verify_args: Vec<String>,

    /// Write the results as JSON to this file.
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_JSON")]
    json: Option<PathBuf>,

    /// Draw throughput and p99 against client count (first scenario) into this PNG.
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_PLOT")]
    plot: Option<PathBuf>,

    /// A few seconds end to end: tiny segments, one round, 1000 claims for the scale check;
    /// without --store: memory: plus PostgreSQL at TOPOLOGY_CLAIMS_TEST_POSTGRES_URL if
    /// reachable, and every baseline whose system is there (noop always). With CI=true a missing
    /// PostgreSQL or etcd is an error, never a silent skip.
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_SMOKE")]
    smoke: bool,

    /// Seed of the workload's random choices.
    #[arg(long, env = "TOPOLOGY_CLAIMS_BENCH_SEED", default_value_t = 1)]
    seed: u64,

    #[command(flatten)]
    read: read_path::ReadPathArgs,
    #[command(flatten)]
    variant_sql: pg::VariantSql,

    #[command(flatten)]
    open: open_loop::RateArgs,

    #[command(flatten)]
    slo: slo::SloArgs,
}

fn main() -> ExitCode {
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == noop::SUBCOMMAND)
    {
        return noop::main();
    }
    let args = BenchArgs::parse();
    let bin = args.bin.clone();
    topology_claims_harness::run_tool(bin.as_deref(), run(args))
}

async fn run(args: BenchArgs) -> ExitCode {
    let mut cleanup = Cleanup::default();
    procs::flush_dirty_pages();
    let result = run_inner(args, &mut cleanup).await;
    cleanup.run().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// `--tls`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum TlsMode {
    Off,
    On,
    Both,
}

/// What a run created outside itself: children (killed when dropped), PostgreSQL schemas and
/// the directories of `sqlite:` stores.
#[derive(Default)]
struct Cleanup {
    systems: Vec<System>,
    schemas: Vec<PgSchema>,
    dirs: Vec<PathBuf>,
}

impl Cleanup {
    async fn run(mut self) {
        // Children first: a schema or file is dropped only once no server uses it.
        self.systems.clear();
        for dir in self.dirs.drain(..) {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                eprintln!("warning: could not remove {}: {e}", dir.display());
            }
        }
        for pg in self.schemas.drain(..) {
            if let Err(e) = drop_schema(&pg).await {
                eprintln!(
                    "warning: could not drop PostgreSQL schema {}: {e}",
                    pg.schema
                );
            }
        }
    }
}

/// `sqlite:` (also `sqlite://` or `sqlite`): the embedded default store, a fresh file per server.
fn is_fresh_sqlite(url: &str) -> bool {
    matches!(url, "sqlite:" | "sqlite://" | "sqlite")
}

/// What one `serve` child of `--store url` gets: a fresh SQLite file in a directory of its own
/// (removed by `cleanup`) for `sqlite:`, else the URL itself.
fn server_store_url(url: &str, name: &str, cleanup: &mut Cleanup) -> Result<String, String> {
    if !is_fresh_sqlite(url) {
        return Ok(url.to_owned());
    }
    let dir = std::env::temp_dir().join(format!(
        "topology-claims-bench-{}-{name}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    cleanup.dirs.push(dir.clone());
    let file = std::path::absolute(dir.join("store.db"))
        .map_err(|e| format!("cannot make {} absolute: {e}", dir.display()))?;
    Ok(format!("sqlite://{}", file.display()))
}

/// `serve` with the extra arguments of the run and its variant, and a metrics endpoint on a
/// free port (unless the arguments ask for one themselves) whose address it returns.
fn start_server(
    store_url: &str,
    args: &[String],
) -> Result<
    (
        topology_claims_harness::serve::ServeChild,
        Option<std::net::SocketAddr>,
    ),
    String,
> {
    let ours = !args.iter().any(|a| a.starts_with("--metrics-listen"));
    let mut args = args.to_vec();
    if ours {
        args.extend(["--metrics-listen".to_owned(), "127.0.0.1:0".to_owned()]);
    }
    let child = procs::start_server(store_url, &args)?;
    let metrics = if ours {
        Some(child.metrics_addr(Duration::from_secs(30))?)
    } else {
        None
    };
    Ok((child, metrics))
}

fn store_label(url: &str) -> &str {
    if is_postgres(url) {
        "postgres"
    } else {
        url.split(':').next().unwrap_or("store")
    }
}

async fn run_inner(mut args: BenchArgs, cleanup: &mut Cleanup) -> Result<(), String> {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let mut skipped: Vec<(String, String)> = Vec::new();
    if args.smoke {
        args.duration = args.duration.min(Duration::from_millis(300));
        args.warmup = args.warmup.min(Duration::from_millis(100));
        args.rounds = 1;
        args.clients = vec![1, 4];
        args.scenario = vec![Scenario::Unique, Scenario::Hot];
        args.scale = if args.open.any(args.slo.slo) {
            Vec::new()
        } else {
            vec![1000]
        };
        args.preload = args.preload.min(500);
        args.scale_samples = args.scale_samples.min(20);
        args.slo.slo_segment = args.slo.slo_segment.min(Duration::from_millis(300));
        if args.store.is_empty() && args.server.is_none() {
            args.store.push("memory:".into());
            let url = topology_claims_harness::postgres::test_url();
            match postgres_reachable(&url).await {
                Ok(()) => args.store.push(url),
                Err(why) if ci => {
                    return Err(format!(
                        "CI=true and PostgreSQL is not reachable at {}: {why}",
                        topology_claims_postgres::redacted_url(&url)
                    ))
                }
                Err(why) => skipped.push(("postgres".into(), why)),
            }
        }
        if args.baselines.is_empty() {
            if args.store.iter().any(|url| is_postgres(url)) || args.baseline_postgres.is_some() {
                args.baselines.push(Baseline::RawSql);
                args.baselines.push(Baseline::RawSqlPipelined);
            } else {
                skipped.push(("raw-sql".into(), "no PostgreSQL".into()));
            }
            if topology_claims_harness::process::find_program(&args.etcd_bin).is_some() {
                args.baselines.push(Baseline::Etcd);
            } else if ci {
                return Err(format!(
                    "CI=true and etcd ({}) is not installed; scripts/ensure-services.sh installs it",
                    args.etcd_bin
                ));
            } else {
                skipped.push(("etcd".into(), format!("{} not found", args.etcd_bin)));
            }
            // Always there: it is this binary.
            args.baselines.push(Baseline::Noop);
        }
        for (system, why) in &skipped {
            eprintln!("bench: smoke run without {system}: {why}");
        }
    }
    if args.store.is_empty() && args.server.is_none() {
        return Err("nothing to measure: give --store URL[,URL…] or --server URL".into());
    }
    if args.clients.is_empty() || args.clients.contains(&0) {
        return Err("--clients needs one or more counts above zero".into());
    }
    args.baselines.sort();
    args.baselines.dedup();
    for (i, variant) in args.serve_variants.iter().enumerate() {
        if args.serve_variants[..i]
            .iter()
            .any(|v| v.name == variant.name)
        {
            return Err(format!(
                "--serve-variant {} is given twice; each needs a name of its own",
                variant.name
            ));
        }
    }
    if !args.serve_variants.is_empty() && args.store.is_empty() {
        return Err("--serve-variant needs --store: the bench starts each variant's server".into());
    }
    let servers_per_store =
        args.serve_variants.len().max(1) * if args.tls == TlsMode::Both { 2 } else { 1 };
    if let Some(url) = args
        .store
        .iter()
        .find(|u| u.starts_with("sqlite://") && !is_fresh_sqlite(u))
        .filter(|_| servers_per_store > 1)
    {
        return Err(format!(
            "--store {url}: {servers_per_store} servers (variants, --tls both) cannot share one \
             SQLite file; give sqlite: for a fresh file per server"
        ));
    }

    // One tag per run: schema names and unique keys never collide with another run's; the
    // PostgreSQL sessions of the run carry it as application_name.
    let tag = format!("{:08x}", fastrand::u32(..));
    let application_name = format!("tc-bench-{tag}");
    if !args.verify.is_empty() {
        return run_verify(&args, cleanup, &tag, &application_name).await;
    }

    if let Some(url) = args
        .store
        .iter()
        .find(|u| is_postgres(u))
        .or(args.baseline_postgres.as_ref())
    {
        warn_about_postgres_connections(&args, url).await;
    }

    // The systems, services first (their order is the report's).
    if let Some(server) = &args.server {
        cleanup.systems.push(System::Service {
            label: "server".into(),
            endpoint: server.clone(),
            child: None,
            postgres: None,
            tls: None,
            metrics: None,
        });
    }
    let bench_tls = match args.tls {
        TlsMode::Off => None,
        TlsMode::On | TlsMode::Both => {
            eprintln!("bench: making a development PKI (topology-claims certs)");
            Some(Arc::new(tokio::task::block_in_place(
                systems::BenchTls::create,
            )?))
        }
    };
    let tls_variants: &[bool] = match args.tls {
        TlsMode::Off => &[false],
        TlsMode::On => &[true],
        TlsMode::Both => &[false, true],
    };
    for (i, url) in args.store.iter().enumerate() {
        let mut base_label = store_label(url).to_owned();
        if args
            .store
            .iter()
            .filter(|u| store_label(u) == base_label)
            .count()
            > 1
        {
            base_label = format!("{base_label}-{i}");
        }
        let variants: Vec<Option<&ServeVariant>> = if args.serve_variants.is_empty() {
            vec![None]
        } else {
            args.serve_variants.iter().map(Some).collect()
        };
        for &tls_on in tls_variants {
            let tls = bench_tls.clone().filter(|_| tls_on);
            let (tls_label, tls_schema) = match &tls {
                Some(_) => (
                    format!("{base_label}-tls"),
                    format!("tc_bench_{tag}_s{i}_tls"),
                ),
                None => (base_label.clone(), format!("tc_bench_{tag}_s{i}")),
            };
            for (v, variant) in variants.iter().enumerate() {
                let (label, schema) = match variant {
                    Some(variant) => (
                        format!("{tls_label}/{}", variant.name),
                        format!("{tls_schema}_v{v}"),
                    ),
                    None => (tls_label.clone(), tls_schema.clone()),
                };
                eprintln!("bench: starting the server on {label}");
                let (store_url, postgres) = if is_postgres(url) {
                    let pg = fresh_schema(url, schema).await?;
                    cleanup.schemas.push(pg.clone());
                    args.variant_sql.run(variant.map(|v| &v.name), &pg).await?;
                    (
                        url_with_search_path(url, &pg.schema, &application_name)?,
                        Some(pg),
                    )
                } else {
                    (server_store_url(url, &schema, cleanup)?, None)
                };
                let mut serve_args = args.serve_args.clone();
                if let Some(tls) = &tls {
                    serve_args.extend(tls.serve_args());
                }
                if let Some(variant) = variant {
                    serve_args.extend(variant.args.iter().cloned());
                }
                let (child, metrics) = start_server(&store_url, &serve_args)?;
                // The server's certificate names 127.0.0.1, the address it announced.
                let endpoint = match &tls {
                    Some(_) => child.endpoint().replacen("http://", "https://", 1),
                    None => child.endpoint(),
                };
                if let Some(variant) = variant {
                    let named = args
                        .variant_normalization
                        .iter()
                        .find_map(|v| v.split_once('=').filter(|(name, _)| *name == variant.name));
                    if let Some((_, normalization)) = named {
                        systems::set_builtins(&endpoint, normalization).await?;
                        eprintln!("bench: {label}: the built-ins are {normalization}");
                    }
                }
                cleanup.systems.push(System::Service {
                    label,
                    endpoint,
                    child: Some(child),
                    postgres,
                    tls: tls.clone(),
                    metrics,
                });
            }
        }
    }
    for baseline in &args.baselines {
        match baseline.sql_mode() {
            None if *baseline == Baseline::Noop => {
                eprintln!("bench: starting the noop gRPC server");
                cleanup.systems.push(System::Noop(noop::start()?));
            }
            Some(mode) => {
                let url = args
                    .baseline_postgres
                    .clone()
                    .or_else(|| args.store.iter().find(|u| is_postgres(u)).cloned())
                    .ok_or("the raw-SQL baselines need PostgreSQL: give --baseline-postgres URL or a postgres:// --store")?;
                let pg = fresh_schema(
                    &url,
                    format!("tc_bench_{tag}_{}", mode.label().replace('-', "_")),
                )
                .await?;
                cleanup.schemas.push(pg.clone());
                let target = raw_sql::SqlTarget::new(mode, pg, &application_name)?;
                cleanup.systems.push(System::RawSql(Arc::new(target)));
            }
            None => {
                eprintln!("bench: starting etcd ({})", args.etcd_bin);
                cleanup
                    .systems
                    .push(System::Etcd(etcd::EtcdServer::start(&args.etcd_bin).await?));
            }
        }
    }

    if args.read.enabled {
        return read_path::run(&args, &cleanup.systems).await;
    }
    let postgres_url = args
        .store
        .iter()
        .find(|u| is_postgres(u))
        .cloned()
        .or_else(|| args.baseline_postgres.clone());
    let pg_processes = match &postgres_url {
        Some(url) => Some(raw_sql::PgProcesses::connect(url, &application_name).await?),
        None => None,
    };
    if args.preload > 0 {
        for system in &cleanup.systems {
            eprintln!(
                "bench: preloading {} claims into {}",
                args.preload,
                system.label()
            );
            scale::load(system, 0, args.preload).await?;
        }
    }
    let postgres_settings = match &postgres_url {
        Some(url) => postgres_settings(url).await,
        None => serde_json::Value::Null,
    };
    if postgres_settings["autovacuum"] == "off" {
        eprintln!(
            "bench: PostgreSQL runs with autovacuum off; the bench vacuums and analyses its own \
             schemas before each scenario and client count (closed loop), each rate and each \
             round of SLO search steps (open loop)"
        );
    }
    let zipf = Arc::new(Zipf::new(args.hot_keys, args.zipf));
    let open = if args.open.any(args.slo.slo) {
        if !args.scale.is_empty() {
            return Err(
                "--scale runs after the closed-loop rounds: give it without --rate/--slo".into(),
            );
        }
        let mut plan = open_loop::Plan {
            batch: args.batch as usize,
            max_in_flight: args.open.max_in_flight as usize,
            warmup: args.warmup,
            zipf: Arc::clone(&zipf),
            seed: args.seed,
            tag: tag.clone(),
            segments: 0,
        };
        Some(
            rates::run(
                &mut cleanup.systems,
                &args.scenario,
                &args.open.rate,
                args.rounds as usize,
                args.duration,
                &args.slo,
                &mut plan,
                &cleanup.schemas,
            )
            .await,
        )
    } else {
        None
    };
    let (segments, failed) = match &open {
        Some(open) => (Vec::new(), open.failed.clone()),
        None => {
            runner::rounds(
                &args,
                &mut cleanup.systems,
                &cleanup.schemas,
                &tag,
                &zipf,
                pg_processes.as_ref(),
            )
            .await
        }
    };

    let mut scale = Vec::new();
    if !args.scale.is_empty() {
        for system in cleanup.systems.iter().filter(|s| !s.is_baseline()) {
            scale.extend(
                scale::run(
                    system,
                    &args.scale,
                    args.scale_samples,
                    args.page_size,
                    args.preload,
                )
                .await?,
            );
        }
    }

    let baselines: Vec<String> = cleanup
        .systems
        .iter()
        .filter(|s| s.is_baseline())
        .map(System::label)
        .collect();
    let on_postgres: Vec<String> = cleanup
        .systems
        .iter()
        .filter(|s| s.on_postgres())
        .map(System::label)
        .collect();
    let rows = report::rows(&segments, &baselines, &on_postgres);
    let ratios = report::ratios(&rows);
    match &open {
        Some(open) => println!("{}", open.markdown()),
        None => println!("{}", report::markdown(&rows, &ratios, &scale)),
    }

    let config = json!({
        "stores": args.store.iter().map(|u| if is_postgres(u) { topology_claims_postgres::redacted_url(u) } else { u.clone() }).collect::<Vec<_>>(),
        "server": args.server,
        "clients": args.clients,
        "duration_s": args.duration.as_secs_f64(),
        "warmup_s": args.warmup.as_secs_f64(),
        "rounds": args.rounds,
        "batch": args.batch,
        "scenarios": args.scenario.iter().map(|s| s.name()).collect::<Vec<_>>(),
        "hot_keys": args.hot_keys,
        "zipf": args.zipf,
        "baselines": baselines,
        "scale": args.scale,
        "preload": args.preload,
        "postgres_settings": postgres_settings,
        "page_size": args.page_size,
        "serve_args": args.serve_args,
        "serve_variants": args.serve_variants.iter().map(|v| json!({"name": v.name, "args": v.args})).collect::<Vec<_>>(),
        "tls": format!("{:?}", args.tls).to_lowercase(),
        "smoke": args.smoke,
        "seed": args.seed,
        "rates": args.open.rate,
        "max_in_flight": args.open.max_in_flight,
        "slo_ms": args.slo.slo.map(|d| d.as_secs_f64() * 1000.0),
        "slo_quantile": args.slo.slo_quantile,
        "slo_segment_s": args.slo.slo_segment.as_secs_f64(),
        "slo_start_rate": args.slo.slo_start_rate,
        "slo_max_rate": args.slo.slo_max_rate,
        "slo_steps": args.slo.slo_steps,
    });
    if let Some(path) = &args.json {
        let mut document = report::document(config, &skipped, &failed, &rows, &ratios, &scale);
        if let Some(open) = &open {
            open.add_to(&mut document);
        }
        let text = serde_json::to_string_pretty(&document).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        eprintln!("bench: wrote {}", path.display());
    }
    if let Some(path) = &args.plot {
        let first = args.scenario.first().map(|s| s.name()).unwrap_or("unique");
        match &open {
            Some(open) => plot::write_rates(path, first, &open.points(), open.threshold_ms())?,
            None => plot::write(path, first, &rows)?,
        }
        eprintln!("bench: wrote {}", path.display());
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} segment(s) failed (see above and \"failed\" in the JSON)",
            failed.len()
        ))
    }
}

/// `--verify`: per size and store, a fresh server and local table, both modes in each round.
async fn run_verify(
    args: &BenchArgs,
    cleanup: &mut Cleanup,
    tag: &str,
    application_name: &str,
) -> Result<(), String> {
    if args.store.is_empty() {
        return Err("--verify needs --store URL[,URL…] (the bench starts the server)".into());
    }
    if args.tls != TlsMode::Off {
        return Err("--verify runs without --tls".into());
    }
    if !args.serve_variants.is_empty() {
        return Err("--verify runs without --serve-variant (give --serve-arg)".into());
    }
    let local_url = args
        .store
        .iter()
        .find(|u| is_postgres(u))
        .cloned()
        .ok_or("--verify keeps the cell's records in PostgreSQL: give a postgres:// --store")?;
    let spec = verify::Spec {
        drift: args.drift,
        rounds: args.rounds,
        seed: args.seed,
        verify_args: args.verify_args.clone(),
    };
    let mut measured = Vec::new();
    for (size_index, &records) in args.verify.iter().enumerate() {
        for (i, url) in args.store.iter().enumerate() {
            let label = store_label(url).to_owned();
            let prefix = format!("tc_bench_{tag}_v{size_index}_s{i}");
            eprintln!("bench: verify {records}: starting the server on {label}");
            let (store_url, postgres) = if is_postgres(url) {
                let pg = fresh_schema(url, prefix.clone()).await?;
                cleanup.schemas.push(pg.clone());
                (
                    url_with_search_path(url, &pg.schema, application_name)?,
                    Some(pg),
                )
            } else {
                (server_store_url(url, &prefix, cleanup)?, None)
            };
            let (child, metrics) = start_server(&store_url, &args.serve_args)?;
            let system = System::Service {
                label,
                endpoint: child.endpoint(),
                child: Some(child),
                postgres,
                tls: None,
                metrics,
            };
            let local = PgSchema {
                url: local_url.clone(),
                schema: format!("{prefix}_local"),
            };
            {
                let client = topology_claims_harness::postgres::connect(&local.url).await?;
                topology_claims_harness::postgres::create_schema(&client, &local.schema).await?;
            }
            cleanup.schemas.push(local.clone());
            let result = verify::run(&system, &local, application_name, records, &spec).await;
            // The server goes now: the next size starts on an empty store.
            drop(system);
            measured.extend(result?);
        }
    }
    println!("{}", verify::markdown(&measured));
    if let Some(path) = &args.json {
        let document = json!({
            "config": {
                "stores": args.store.iter().map(|u| if is_postgres(u) { topology_claims_postgres::redacted_url(u) } else { u.clone() }).collect::<Vec<_>>(),
                "verify": args.verify,
                "drift": args.drift,
                "rounds": args.rounds,
                "verify_args": args.verify_args,
                "serve_args": args.serve_args,
                "seed": args.seed,
                "postgres_settings": postgres_settings(&local_url).await,
            },
            "verify": measured.iter().map(verify::Measured::to_json).collect::<Vec<_>>(),
        });
        let text = serde_json::to_string_pretty(&document).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        eprintln!("bench: wrote {}", path.display());
    }
    let problems: Vec<String> = measured
        .iter()
        .filter_map(verify::Measured::problem)
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

//! The service under test: the store the servers share (a SQLite file, a fresh PostgreSQL
//! schema, or memory), and the real server processes — the `topology-claims` binary run as
//! `serve --listen 127.0.0.1:0 --store URL` through the shared harness — which can be SIGKILLed
//! and restarted on the same store. Also the PostgreSQL administration the faults need (terminating the servers'
//! connections), the backup and restore of the store (`store-restore`: `topology-claims
//! backup` / `restore` for SQLite, `pg_dump -n` / `pg_restore` of the campaign's schema for
//! `private-postgres:`), and the clean-up of the schema.
//!
//! Owns processes and store set-up. Must not talk gRPC (cells and checkers do).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;
use topology_claims::config::StoreUrl;
use topology_claims_harness::postgres::{self as pg, TempSchema};
use topology_claims_harness::private_postgres::PrivatePostgres;
use topology_claims_harness::serve::{clean_command, product_binary, ServeChild};
use topology_claims_harness::spanner::{Emulator, Mode};
use topology_claims_postgres::tokio_postgres;

use crate::proxy::Proxy;

/// Campaign schemas are `tc_chaos_<unix seconds>_<random>`; a failing run keeps its schema for
/// study, and the next runs drop those older than a day.
const SCHEMA_PREFIX: &str = "tc_chaos_";
const SCHEMA_STALE_AFTER: Duration = Duration::from_secs(24 * 3600);

/// The store the servers share.
pub enum Backing {
    /// `memory:`: one server, never killed (a restart would forget everything).
    Memory,
    Sqlite(PathBuf),
    Postgres {
        /// The URL as given (may hold a password: never printed).
        admin_url: String,
        /// `tc_chaos_<unix seconds>_<random>`; also the servers' `application_name`.
        schema: String,
        /// Reconnected when a restart of the private cluster closed it.
        admin: Box<tokio::sync::Mutex<tokio_postgres::Client>>,
        /// `private-postgres:`: the campaign's own cluster, which `pg-restart` crashes.
        cluster: Option<PrivatePostgres>,
    },
    /// `spanner-emulator:`: a database on the campaign's own emulator, which aborts about 5 %
    /// of commits on purpose.
    Spanner {
        emulator: Emulator,
        url: String,
    },
}

/// The database of a `spanner-emulator:` campaign.
const SPANNER_URL: &str = "spanner://projects/chaos/instances/chaos/databases/claims";

impl Backing {
    /// Prepares the store named by `--store` (default: a SQLite file in `work_dir`).
    pub async fn prepare(store: Option<&str>, work_dir: &Path) -> Result<Backing, String> {
        match store {
            None => Ok(Backing::Sqlite(work_dir.join("claims.db"))),
            Some("private-postgres:") => {
                let cluster = tokio::task::block_in_place(PrivatePostgres::start)?;
                let url = cluster.url();
                Backing::postgres(&url, Some(cluster)).await
            }
            Some("spanner-emulator:") => {
                let emulator = tokio::task::block_in_place(|| {
                    Emulator::start(Mode::FaultInjection, work_dir)
                })?;
                create_spanner_database(&emulator).await?;
                Ok(Backing::Spanner {
                    emulator,
                    url: SPANNER_URL.to_owned(),
                })
            }
            Some(url) => match url.parse::<StoreUrl>() {
                Ok(StoreUrl::Memory) => Ok(Backing::Memory),
                Ok(StoreUrl::Sqlite(path)) => Ok(Backing::Sqlite(path)),
                Ok(StoreUrl::Postgres(url)) => Backing::postgres(&url, None).await,
                Ok(StoreUrl::Spanner(_)) => Err(
                    "a campaign crashes its Spanner on purpose: use spanner-emulator: (an emulator of its own)".into(),
                ),
                Err(_) => {
                    let scheme = url.split_once(':').map_or("", |(s, _)| s);
                    Err(format!(
                        "unsupported chaos store (scheme {scheme:?}); use memory:, sqlite://PATH, postgres://USER@HOST:PORT/DB, private-postgres: or spanner-emulator:"
                    ))
                }
            },
        }
    }

    async fn postgres(url: &str, cluster: Option<PrivatePostgres>) -> Result<Backing, String> {
        let schema = TempSchema::create(url, SCHEMA_PREFIX, SCHEMA_STALE_AFTER).await?;
        let admin = pg::connect(url).await?;
        Ok(Backing::Postgres {
            admin_url: url.to_owned(),
            schema: schema.name,
            admin: Box::new(tokio::sync::Mutex::new(admin)),
            cluster,
        })
    }

    /// The `--store` URL the servers get.
    pub fn server_url(&self) -> String {
        match self {
            Backing::Memory => "memory:".to_owned(),
            Backing::Sqlite(path) => format!("sqlite://{}", path.display()),
            Backing::Postgres {
                admin_url, schema, ..
            } => pg::url_with_search_path(admin_url, schema, schema)
                .unwrap_or_else(|e| panic!("campaign schema {schema}: {e}")),
            Backing::Spanner { url, .. } => url.clone(),
        }
    }

    /// Environment the servers need (the emulator's address).
    pub fn server_env(&self) -> Vec<(&'static str, String)> {
        match self {
            Backing::Spanner { emulator, .. } => {
                vec![("SPANNER_EMULATOR_HOST", emulator.host.clone())]
            }
            _ => Vec::new(),
        }
    }

    /// The store for people: never a password.
    pub fn describe(&self) -> String {
        match self {
            Backing::Memory => "memory:".to_owned(),
            Backing::Sqlite(path) => format!("sqlite://{}", path.display()),
            Backing::Postgres {
                admin_url,
                schema,
                cluster,
                ..
            } => match cluster {
                Some(cluster) => format!("{} (schema {schema})", cluster.describe()),
                None => format!(
                    "{} (schema {schema})",
                    topology_claims_postgres::redacted_url(admin_url)
                ),
            },
            Backing::Spanner { emulator, url } => format!(
                "{url} on the Spanner emulator at {} with --enable_fault_injection",
                emulator.host
            ),
        }
    }

    pub fn is_postgres(&self) -> bool {
        matches!(self, Backing::Postgres { .. })
    }

    /// Whether `pg-restart` can crash the store's database (only a cluster the campaign owns).
    pub fn is_private_postgres(&self) -> bool {
        matches!(
            self,
            Backing::Postgres {
                cluster: Some(_),
                ..
            }
        )
    }

    pub fn is_spanner(&self) -> bool {
        matches!(self, Backing::Spanner { .. })
    }

    /// Whether `store-restore` can back the store up and restore it while the campaign owns it:
    /// a SQLite file, or the schema on the campaign's own cluster.
    pub fn can_restore(&self) -> bool {
        matches!(self, Backing::Sqlite(_)) || self.is_private_postgres()
    }

    /// A consistent backup of the store into `to` while the servers run.
    pub async fn backup(&self, to: &Path) -> Result<(), String> {
        let to_str = to.display().to_string();
        match self {
            Backing::Sqlite(_) => {
                let exe = product_binary()?;
                let url = self.server_url();
                run_program(
                    clean_command(&exe, &["backup", "--store", &url, "--to", &to_str]),
                    "topology-claims backup",
                )
                .await
            }
            Backing::Postgres {
                admin_url,
                schema,
                cluster: Some(cluster),
                ..
            } => {
                let mut command = std::process::Command::new(cluster.program("pg_dump"));
                command.args(["-Fc", "-n", schema, "-f", &to_str, admin_url]);
                run_program(command, "pg_dump").await
            }
            _ => Err(format!("store-restore cannot back up {}", self.describe())),
        }
    }

    /// Replaces the store with the backup `from` (every server is stopped).
    pub async fn restore(&self, from: &Path) -> Result<(), String> {
        let from_str = from.display().to_string();
        match self {
            Backing::Sqlite(_) => {
                let exe = product_binary()?;
                let url = self.server_url();
                let args = ["restore", "--from", &from_str, "--store", &url, "--replace"];
                run_program(clean_command(&exe, &args), "topology-claims restore").await
            }
            Backing::Postgres {
                admin_url,
                cluster: Some(cluster),
                ..
            } => {
                // The dump of one schema recreates it: drop what the servers wrote since.
                if let Some((admin, schema)) = self.admin().await? {
                    admin
                        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
                        .await
                        .map_err(|e| format!("dropping schema {schema} before pg_restore: {e}"))?;
                }
                let mut command = std::process::Command::new(cluster.program("pg_restore"));
                command.args(["--no-owner", "--exit-on-error", "-d", admin_url, &from_str]);
                run_program(command, "pg_restore").await
            }
            _ => Err(format!("store-restore cannot restore {}", self.describe())),
        }
    }

    pub fn survives_restarts(&self) -> bool {
        !matches!(self, Backing::Memory)
    }

    /// The admin connection, opened again if a restart closed it.
    async fn admin(
        &self,
    ) -> Result<Option<(tokio::sync::MutexGuard<'_, tokio_postgres::Client>, &str)>, String> {
        let Backing::Postgres {
            admin_url,
            schema,
            admin,
            ..
        } = self
        else {
            return Ok(None);
        };
        let mut guard = admin.lock().await;
        if guard.is_closed() {
            *guard = pg::connect(admin_url).await?;
        }
        Ok(Some((guard, schema.as_str())))
    }

    /// Terminates every PostgreSQL connection of the servers (`pg_terminate_backend`); returns
    /// how many. Nothing for other stores.
    pub async fn terminate_connections(&self) -> Result<u64, String> {
        let Some((admin, schema)) = self.admin().await? else {
            return Ok(0);
        };
        let row = admin
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name = $1 AND pid <> pg_backend_pid()",
                &[&schema],
            )
            .await
            .map_err(|e| format!("pg_terminate_backend: {e}"))?;
        let n: i64 = row
            .try_get(0)
            .map_err(|e| format!("pg_terminate_backend: {e}"))?;
        Ok(n as u64)
    }

    /// A schema of its own for PostgreSQL cell `index` on the campaign's cluster (created now),
    /// beside the store's.
    pub async fn cell_schema(&self, index: u16) -> Result<crate::local::LocalDbSpec, String> {
        let Some((admin, store_schema)) = self.admin().await? else {
            return Err("a PostgreSQL cell needs a PostgreSQL store".into());
        };
        let schema = format!("{store_schema}_c{index:02}");
        pg::create_schema(&admin, &schema).await?;
        let Backing::Postgres { admin_url, .. } = self else {
            unreachable!("admin() answers for PostgreSQL stores only")
        };
        Ok(crate::local::LocalDbSpec::Postgres {
            url: admin_url.clone(),
            schema,
        })
    }

    /// Crashes the private PostgreSQL cluster (`pg_ctl stop -m immediate`). `None` for other
    /// stores, or while another restart is under way; else the guard to hand to
    /// [`Backing::start_postgres_after`].
    pub fn crash_postgres(&self) -> Result<Option<OwnedMutexGuard<()>>, String> {
        match self {
            Backing::Postgres {
                cluster: Some(cluster),
                ..
            } => cluster.crash_now(),
            _ => Ok(None),
        }
    }

    /// Starts the crashed private cluster again after `outage`.
    pub async fn start_postgres_after(
        &self,
        guard: OwnedMutexGuard<()>,
        outage: Duration,
    ) -> Result<(), String> {
        match self {
            Backing::Postgres {
                cluster: Some(cluster),
                ..
            } => cluster.start_after(guard, outage).await,
            _ => Ok(()),
        }
    }

    /// Makes sure the store's database runs (the private cluster after a failed restart).
    pub async fn ensure_up(&self) -> Result<(), String> {
        match self {
            Backing::Postgres {
                cluster: Some(cluster),
                ..
            } => cluster.ensure_up().await,
            _ => Ok(()),
        }
    }

    /// After a failing run: keeps what the store wrote, and says where it is.
    pub fn keep_for_study(&self) -> Option<String> {
        match self {
            Backing::Postgres {
                cluster: Some(cluster),
                schema,
                ..
            } => Some(format!(
                "private PostgreSQL data kept in {} (schema {schema}; start it with pg_ctl -D <dir>/data start)",
                cluster.keep().display()
            )),
            Backing::Postgres { schema, .. } => Some(format!("schema {schema} kept")),
            _ => None,
        }
    }

    /// Drops the PostgreSQL schema (after a passing run; a failing one keeps it for study).
    pub async fn drop_schema(&self) {
        if self.is_private_postgres() {
            // The whole cluster goes away with the campaign.
            return;
        }
        match self.admin().await {
            Ok(Some((admin, schema))) => {
                if let Err(e) = pg::drop_schema(&admin, schema).await {
                    tracing::warn!(%schema, error = %e, "could not drop the campaign schema");
                }
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "could not drop the campaign schema"),
        }
    }
}

/// Creates instance, database and schema on the campaign's emulator with the product binary's
/// `migrate --create-database` (retried: the emulator aborts on purpose).
async fn create_spanner_database(emulator: &Emulator) -> Result<(), String> {
    let exe = product_binary()?;
    let mut last = String::new();
    for _ in 0..5 {
        let mut command = clean_command(
            &exe,
            &["migrate", "--create-database", "--store", SPANNER_URL],
        );
        command
            .env("SPANNER_EMULATOR_HOST", &emulator.host)
            .env("RUST_LOG", "warn");
        let output = tokio::process::Command::from(command)
            .kill_on_drop(true)
            .output();
        let output = tokio::time::timeout(Duration::from_secs(120), output)
            .await
            .map_err(|_| "migrate --create-database took over 120 s".to_owned())?
            .map_err(|e| format!("running migrate: {e}"))?;
        if output.status.success() {
            return Ok(());
        }
        last = format!(
            "migrate --create-database --store {SPANNER_URL} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(last)
}

/// Runs a backup or restore program to its end (at most 120 s); `what` names it in errors.
async fn run_program(command: std::process::Command, what: &str) -> Result<(), String> {
    let output = tokio::process::Command::from(command)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), output)
        .await
        .map_err(|_| format!("{what} took over 120 s"))?
        .map_err(|e| format!("running {what}: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{what} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    ))
}

/// The server processes, each behind one upstream slot of the proxy.
pub struct Fleet {
    exe: PathBuf,
    store_url: String,
    /// Extra `serve` flags (the TLS files; a small pool per server for PostgreSQL).
    store_args: Vec<String>,
    /// Extra environment of `serve` (the Spanner emulator's address).
    store_env: Vec<(&'static str, String)>,
    log_dir: PathBuf,
    children: Vec<Option<ServeChild>>,
    proxy: Arc<Proxy>,
    /// Whether started servers get their proxy slot (off while a restore is marked).
    routed: bool,
    pub restarts: u64,
    /// Starts that failed and were retried.
    pub start_retries: u64,
}

impl Fleet {
    /// Starts `servers` processes on `backing` and points the proxy's slots at them;
    /// `serve_args` are further `serve` flags (the TLS files).
    pub async fn start(
        servers: usize,
        backing: &Backing,
        proxy: Arc<Proxy>,
        log_dir: &Path,
        serve_args: Vec<String>,
    ) -> Result<Fleet, String> {
        let exe = product_binary()?;
        let mut store_args = serve_args;
        if backing.is_postgres() {
            store_args.extend(["--pg-pool-size".to_owned(), "4".to_owned()]);
        }
        let mut fleet = Fleet {
            exe,
            store_url: backing.server_url(),
            store_args,
            store_env: backing.server_env(),
            log_dir: log_dir.to_path_buf(),
            children: (0..servers).map(|_| None).collect(),
            proxy,
            routed: true,
            restarts: 0,
            start_retries: 0,
        };
        for slot in 0..servers {
            fleet.spawn(slot).await?;
        }
        Ok(fleet)
    }

    pub fn len(&self) -> usize {
        self.children.len()
    }

    /// Starts server `slot`, as a supervisor would: a process that exits before listening (say
    /// its start-up migration check lost its PostgreSQL connection to `pg-terminate`, or met
    /// the database down for `pg-restart`) is started again, for up to 30 s.
    async fn spawn(&mut self, slot: usize) -> Result<(), String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut attempt = 0;
        loop {
            match self.spawn_once(slot).await {
                Ok(()) => return Ok(()),
                Err(error) if std::time::Instant::now() < deadline => {
                    attempt += 1;
                    self.start_retries += 1;
                    tracing::warn!(slot, attempt, %error, "server did not start; starting it again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    async fn spawn_once(&mut self, slot: usize) -> Result<(), String> {
        let log_path = self.log_dir.join(format!("server-{slot}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("opening {}: {e}", log_path.display()))?;
        let mut command = clean_command(
            &self.exe,
            &[
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--store",
                &self.store_url,
            ],
        );
        command
            .args(["--drain-timeout", "1s"])
            .args(&self.store_args)
            .envs(self.store_env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("RUST_LOG", "warn")
            .stderr(Stdio::from(log));
        let child = tokio::task::block_in_place(|| ServeChild::start(command))
            .map_err(|e| format!("server {slot}: {e}; see {}", log_path.display()))?;
        let addr = child.addr;
        self.children[slot] = Some(child);
        if self.routed {
            self.proxy.set_upstream(slot, Some(addr));
        }
        Ok(())
    }

    /// The address of server `slot`, if it runs (reachable directly, not through the proxy).
    pub fn addr(&self, slot: usize) -> Option<std::net::SocketAddr> {
        self.children.get(slot)?.as_ref().map(|child| child.addr)
    }

    /// Whether the proxy sends traffic to the servers. Off, servers started are reachable only
    /// at [`Fleet::addr`] (as a restored store's `serve` first listens where only the operator
    /// can reach it); on again, every running server gets its slot back.
    pub fn set_routed(&mut self, routed: bool) {
        self.routed = routed;
        for slot in 0..self.len() {
            let addr = self.addr(slot).filter(|_| routed);
            self.proxy.set_upstream(slot, addr);
        }
    }

    /// SIGKILLs server `slot` (no drain, no goodbye) and waits for it to be gone.
    pub async fn kill(&mut self, slot: usize) {
        self.proxy.set_upstream(slot, None);
        if let Some(mut child) = self.children[slot].take() {
            tokio::task::block_in_place(|| child.kill());
        }
    }

    /// Starts server `slot` again if it is down.
    pub async fn ensure_running(&mut self, slot: usize) -> Result<(), String> {
        if self.children[slot].is_some() {
            return Ok(());
        }
        self.restarts += 1;
        self.spawn(slot).await
    }

    pub async fn ensure_all_running(&mut self) -> Result<(), String> {
        for slot in 0..self.len() {
            self.ensure_running(slot).await?;
        }
        Ok(())
    }

    /// Stops every server (SIGKILL: the campaign is over, nothing is in flight).
    pub async fn stop_all(&mut self) {
        for slot in 0..self.len() {
            self.kill(slot).await;
        }
    }
}

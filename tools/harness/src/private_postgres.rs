//! A throwaway PostgreSQL cluster that a test or a fault campaign owns outright, so that it may
//! crash it: `initdb` into a fresh directory, its own loopback port (and a socket in its data
//! directory), restarted with `pg_ctl stop -m immediate` (a crash, followed by WAL recovery).
//! Stopped and deleted when dropped. Owns processes and directories; talks no SQL.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;

use crate::net::{free_port, wait_listening};
use crate::process::run_to_end;

/// Overrides the directory of PostgreSQL's server programs (`initdb`, `pg_ctl`).
pub const PG_BIN_ENV: &str = "TOPOLOGY_CLAIMS_CHAOS_PG_BIN";

/// A PostgreSQL cluster of its own: `initdb` in a fresh directory under the system
/// temp dir, listening on a free loopback port (and a socket in its data directory), trust
/// authentication. PostgreSQL refuses to run as root, so when the campaign runs as root the
/// cluster belongs to the `postgres` user and every program runs through `runuser`.
pub struct PrivatePostgres {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    as_postgres: bool,
    /// Serialises restarts (a restart is stop, outage, start).
    restart: Arc<tokio::sync::Mutex<()>>,
    keep: std::sync::atomic::AtomicBool,
}

impl PrivatePostgres {
    /// Creates and starts the cluster. Takes a few seconds (`initdb`).
    pub fn start() -> Result<PrivatePostgres, String> {
        Self::start_with_settings("")
    }

    /// [`PrivatePostgres::start`] with more lines for `postgresql.conf` (e.g.
    /// `shared_preload_libraries = 'pg_stat_statements'`).
    pub fn start_with_settings(extra: &str) -> Result<PrivatePostgres, String> {
        let bin = pg_bin_dir()?;
        let as_postgres = running_as_root();
        let dir = std::env::temp_dir().join(format!(
            "topology-claims-pg-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        if as_postgres {
            run_to_end(
                Command::new("chown").args(["postgres:postgres"]).arg(&dir),
                "chown of the cluster directory to postgres",
            )?;
        }
        let port = free_port()?;
        let cluster = PrivatePostgres {
            bin,
            dir,
            port,
            as_postgres,
            restart: Arc::new(tokio::sync::Mutex::new(())),
            keep: std::sync::atomic::AtomicBool::new(false),
        };
        let data = cluster.data_dir();
        cluster.run_tool(
            "initdb",
            &[
                "-D",
                path_str(&data)?,
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            "initdb",
        )?;
        let settings = format!(
            "\n# topology-claims private cluster\nport = {port}\nlisten_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{}'\nmax_connections = 100\nfsync = on\n{extra}\n",
            path_str(&data)?
        );
        // Appended as the cluster's owner would: the file is theirs.
        let conf = data.join("postgresql.conf");
        let mut text =
            std::fs::read_to_string(&conf).map_err(|e| format!("{}: {e}", conf.display()))?;
        text.push_str(&settings);
        std::fs::write(&conf, text).map_err(|e| format!("{}: {e}", conf.display()))?;
        cluster.start_server()?;
        Ok(cluster)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The superuser URL of the cluster's `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// A client program of the cluster's own installation (`pg_dump`, `pg_restore`): the
    /// version that matches the server.
    pub fn program(&self, tool: &str) -> PathBuf {
        self.bin.join(tool)
    }

    pub fn describe(&self) -> String {
        format!("private PostgreSQL cluster on 127.0.0.1:{}", self.port)
    }

    fn run_tool(&self, tool: &str, args: &[&str], what: &str) -> Result<(), String> {
        let program = self.bin.join(tool);
        let mut command = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&program);
            c
        } else {
            Command::new(&program)
        };
        command.args(args).current_dir(&self.dir);
        run_to_end(&mut command, what)
    }

    fn start_server(&self) -> Result<(), String> {
        let data = self.data_dir();
        let log = self.dir.join("postgresql.log");
        self.run_tool(
            "pg_ctl",
            &[
                "-D",
                path_str(&data)?,
                "-l",
                path_str(&log)?,
                "-w",
                "-t",
                "60",
                "start",
            ],
            "pg_ctl start",
        )?;
        wait_listening(self.port, Duration::from_secs(30), || Ok(())).map_err(|e| {
            format!(
                "the private PostgreSQL did not start ({e}); see {}",
                log.display()
            )
        })
    }

    /// Stops the server the way a crash would (`pg_ctl stop -m immediate`: no checkpoint, WAL
    /// recovery at the next start).
    fn crash(&self) -> Result<(), String> {
        let data = self.data_dir();
        self.run_tool(
            "pg_ctl",
            &["-D", path_str(&data)?, "-m", "immediate", "-w", "stop"],
            "pg_ctl stop -m immediate",
        )
    }

    /// Crashes the server now, unless another restart is under way (then `None`). The guard
    /// holds off other restarts until [`PrivatePostgres::start_after`] has brought it back.
    pub fn crash_now(&self) -> Result<Option<OwnedMutexGuard<()>>, String> {
        let Ok(guard) = Arc::clone(&self.restart).try_lock_owned() else {
            return Ok(None);
        };
        tokio::task::block_in_place(|| self.crash())?;
        Ok(Some(guard))
    }

    /// Starts the crashed server again after `outage`.
    pub async fn start_after(
        &self,
        guard: OwnedMutexGuard<()>,
        outage: Duration,
    ) -> Result<(), String> {
        tokio::time::sleep(outage).await;
        let started = tokio::task::block_in_place(|| self.start_server());
        drop(guard);
        started
    }

    /// Makes sure the server runs (after a restart whose start failed, say).
    pub async fn ensure_up(&self) -> Result<(), String> {
        let _guard = self.restart.lock().await;
        if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
            return Ok(());
        }
        tokio::task::block_in_place(|| self.start_server())
    }

    /// The PIDs of the running cluster: the postmaster (first line of `postmaster.pid`) and its
    /// children (backends, checkpointer, …), for tests that freeze it with SIGSTOP.
    pub fn pids(&self) -> Result<Vec<u32>, String> {
        let file = self.data_dir().join("postmaster.pid");
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let postmaster: u32 = text
            .lines()
            .next()
            .and_then(|line| line.trim().parse().ok())
            .ok_or_else(|| format!("{} has no PID on its first line", file.display()))?;
        let mut pids = vec![postmaster];
        let entries = std::fs::read_dir("/proc").map_err(|e| format!("/proc: {e}"))?;
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // The parent PID is the second field after the `(comm)` field.
            let parent = stat
                .rfind(')')
                .and_then(|close| stat[close + 1..].split_whitespace().nth(1))
                .and_then(|ppid| ppid.parse::<u32>().ok());
            if parent == Some(postmaster) {
                pids.push(pid);
            }
        }
        Ok(pids)
    }

    /// Keeps the data directory when the cluster stops (a failing run's database, for
    /// study); returns where it is.
    pub fn keep(&self) -> &Path {
        self.keep.store(true, std::sync::atomic::Ordering::SeqCst);
        &self.dir
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self.crash();
        if !self.keep.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn path_str(path: &Path) -> Result<&str, String> {
    path.to_str()
        .ok_or_else(|| format!("{} is not UTF-8", path.display()))
}

fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to the process's effective user.
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// `TOPOLOGY_CLAIMS_CHAOS_PG_BIN`, else `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/*/bin` (Debian keeps the server programs off the PATH).
fn pg_bin_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os(PG_BIN_ENV) {
        return Ok(PathBuf::from(dir));
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(output) = Command::new("pg_config").arg("--bindir").output() {
        if output.status.success() {
            candidates.push(PathBuf::from(
                String::from_utf8_lossy(&output.stdout).trim(),
            ));
        }
    }
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<(u32, PathBuf)> = entries
            .flatten()
            .filter_map(|e| {
                let v = e.file_name().to_str()?.parse::<u32>().ok()?;
                Some((v, e.path().join("bin")))
            })
            .collect();
        versions.sort();
        candidates.extend(versions.into_iter().rev().map(|(_, p)| p));
    }
    candidates
        .into_iter()
        .find(|dir| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file())
        .ok_or_else(|| {
            format!(
                "no PostgreSQL server programs (initdb, pg_ctl) found; install postgresql or set {PG_BIN_ENV}"
            )
        })
}

//! The databases a campaign can own outright, so that it may crash them: a throwaway PostgreSQL
//! cluster (`initdb` into a fresh directory, its own port, restarted with `pg_ctl stop -m
//! immediate` — a crash, followed by WAL recovery) and a Cloud Spanner emulator started with
//! `--enable_fault_injection` (it aborts about 5 % of commits on purpose).
//!
//! Both are stopped when dropped, so a campaign that ends or is interrupted leaves no process
//! behind. Owns processes and their directories; must not talk SQL or gRPC.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::OwnedMutexGuard;

/// Overrides the emulator binary (same variable as the Spanner tests).
const EMULATOR_ENV: &str = "TOPOLOGY_CLAIMS_SPANNER_EMULATOR";
/// Where the Google Cloud SDK (Debian package `google-cloud-cli-spanner-emulator`) installs it.
const EMULATOR_LOCATIONS: &[&str] = &[
    "/usr/lib/google-cloud-sdk/bin/cloud_spanner_emulator/emulator_main",
    "/usr/share/google-cloud-sdk/bin/cloud_spanner_emulator/emulator_main",
    "/opt/google-cloud-sdk/bin/cloud_spanner_emulator/emulator_main",
];
/// Overrides the directory of PostgreSQL's server programs (`initdb`, `pg_ctl`).
pub const PG_BIN_ENV: &str = "TOPOLOGY_CLAIMS_CHAOS_PG_BIN";

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free loopback port: {e}"))
}

fn wait_listening(port: u16, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Runs a command to its end; its output goes into the error when it fails.
fn run(command: &mut Command, what: &str) -> Result<(), String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{what}: cannot run {:?}: {e}", command.get_program()))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout).trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// A PostgreSQL cluster of the campaign's own: `initdb` in a fresh directory under the system
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
        let bin = pg_bin_dir()?;
        let as_postgres = running_as_root();
        let dir = std::env::temp_dir().join(format!(
            "topology-claims-chaos-pg-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        if as_postgres {
            run(
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
            "\n# topology-claims chaos\nport = {port}\nlisten_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{}'\nmax_connections = 100\nfsync = on\n",
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
        run(&mut command, what)
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
        if wait_listening(self.port, Duration::from_secs(30)) {
            Ok(())
        } else {
            Err(format!(
                "the private PostgreSQL did not listen on port {}; see {}",
                self.port,
                log.display()
            ))
        }
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

/// A Cloud Spanner emulator of the campaign's own, with `--enable_fault_injection`.
pub struct FaultyEmulator {
    child: Child,
    /// `127.0.0.1:PORT`, for `SPANNER_EMULATOR_HOST`.
    pub host: String,
    log: PathBuf,
}

impl FaultyEmulator {
    pub fn start(work_dir: &Path) -> Result<FaultyEmulator, String> {
        let binary = emulator_binary()?;
        let mut last = String::new();
        // A free port can be taken between probing and binding: try a few.
        for _ in 0..3 {
            let port = free_port()?;
            let log = work_dir.join(format!("spanner-emulator-{port}.log"));
            let file =
                std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
            let err = file
                .try_clone()
                .map_err(|e| format!("{}: {e}", log.display()))?;
            let child = Command::new(&binary)
                .arg(format!("--host_port=127.0.0.1:{port}"))
                .arg("--enable_fault_injection")
                .stdin(Stdio::null())
                .stdout(file)
                .stderr(err)
                .spawn()
                .map_err(|e| format!("starting {}: {e}", binary.display()))?;
            let mut emulator = FaultyEmulator {
                child,
                host: format!("127.0.0.1:{port}"),
                log,
            };
            if wait_listening(port, Duration::from_secs(30)) {
                return Ok(emulator);
            }
            let _ = emulator.child.kill();
            last = format!(
                "the emulator did not listen on port {port}; see {}",
                emulator.log.display()
            );
        }
        Err(last)
    }
}

impl Drop for FaultyEmulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn emulator_binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(EMULATOR_ENV) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("{EMULATOR_ENV}={} is not a file", path.display()))
        };
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("emulator_main"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    EMULATOR_LOCATIONS
        .iter()
        .map(PathBuf::from)
        .chain(on_path)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "no Cloud Spanner emulator (install the Debian package google-cloud-cli-spanner-emulator, or set {EMULATOR_ENV})"
            )
        })
}

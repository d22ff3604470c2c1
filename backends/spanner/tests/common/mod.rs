//! The Cloud Spanner emulator for this crate's tests: finds the `emulator_main` binary, starts
//! it on a free loopback port, waits until it accepts connections, and stops it by PID.
//!
//! One emulator per test binary (a static), shared by all its tests; every store gets a fresh
//! database of its own in one instance. The binary is `TOPOLOGY_CLAIMS_SPANNER_EMULATOR` if set,
//! else the Google Cloud SDK's. Without it: with `CI=true` the tests fail; otherwise the binary
//! prints one `spanner tests skipped: <why>` line and exits successfully.
//!
//! Owns test scaffolding only; must not be used by the crate itself.

#![allow(dead_code)] // each test binary uses a different part of this module

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use topology_claims::MigrationPolicy;
use topology_claims_spanner::{SpannerClaimStore, SpannerOptions};

/// Overrides the emulator binary.
pub const EMULATOR_ENV: &str = "TOPOLOGY_CLAIMS_SPANNER_EMULATOR";
/// Where the Google Cloud SDK (Debian package `google-cloud-cli-spanner-emulator`) installs it.
const SDK_LOCATIONS: &[&str] = &[
    "/usr/lib/google-cloud-sdk/bin/cloud_spanner_emulator/emulator_main",
    "/usr/share/google-cloud-sdk/bin/cloud_spanner_emulator/emulator_main",
    "/opt/google-cloud-sdk/bin/cloud_spanner_emulator/emulator_main",
];
pub const PROJECT: &str = "test-project";
pub const INSTANCE: &str = "test-instance";
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// How the emulator runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Plain,
    /// `--enable_fault_injection`: the emulator aborts a share of commits at random.
    FaultInjection,
}

/// A running emulator process; killed (by PID) when dropped, and by a watchdog when the test
/// process exits (statics are never dropped).
pub struct Emulator {
    child: Mutex<Child>,
    pid: u32,
    /// `127.0.0.1:PORT`.
    pub host: String,
}

impl Emulator {
    /// Starts a new emulator (for tests that need one of their own, e.g. to kill it).
    pub fn start(mode: Mode) -> Emulator {
        match find_binary().and_then(|binary| start(&binary, mode)) {
            Ok(emulator) => emulator,
            Err(why) => skip_or_fail(&why),
        }
    }

    /// Stops the emulator now (SIGKILL by PID) and waits for it to exit.
    pub fn kill(&self) {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.kill();
    }
}

static SHARED: OnceLock<Emulator> = OnceLock::new();

/// The test binary's shared emulator, started on first use.
pub fn shared(mode: Mode) -> &'static Emulator {
    SHARED.get_or_init(|| Emulator::start(mode))
}

/// Options for a store on `emulator`.
pub fn options(emulator: &Emulator) -> SpannerOptions {
    SpannerOptions {
        session_pool_size: 8,
        emulator_host: Some(emulator.host.clone()),
        ..SpannerOptions::default()
    }
}

/// A database name no other store of this emulator has used.
pub fn fresh_url() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("spanner://projects/{PROJECT}/instances/{INSTANCE}/databases/db-{n}")
}

/// A fresh, empty, migrated store on the shared emulator.
pub async fn fresh_store(mode: Mode) -> SpannerClaimStore {
    let emulator = shared(mode);
    let url = fresh_url();
    let applied = topology_claims_spanner::migrate(&url, options(emulator), true)
        .await
        .unwrap_or_else(|e| panic!("creating {url}: {e}"));
    assert!(!applied.is_empty(), "a new database gets the whole schema");
    SpannerClaimStore::connect(&url, options(emulator), MigrationPolicy::Refuse)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"))
}

fn find_binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(EMULATOR_ENV) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("{EMULATOR_ENV}={} is not a file", path.display()))
        };
    }
    let on_path: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("emulator_main"))
                .collect()
        })
        .unwrap_or_default();
    SDK_LOCATIONS
        .iter()
        .map(PathBuf::from)
        .chain(on_path)
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            format!(
                "no Cloud Spanner emulator (install the Debian package google-cloud-cli-spanner-emulator, or set {EMULATOR_ENV})"
            )
        })
}

/// Without an emulator: fail under CI, else say so once and end the test binary successfully.
fn skip_or_fail(why: &str) -> ! {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("the Spanner tests need the emulator under CI: {why}");
    }
    // Straight to the file descriptor: libtest captures print!/eprint! of passing tests.
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "spanner tests skipped: {why}");
    let _ = stderr.flush();
    std::process::exit(0);
}

fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

fn start(binary: &Path, mode: Mode) -> Result<Emulator, String> {
    let mut last_error = String::new();
    // A free port can be taken between probing and binding: try a few.
    for _ in 0..3 {
        let port = free_port()?;
        let host = format!("127.0.0.1:{port}");
        let log = std::env::temp_dir().join(format!("topology-claims-spanner-emulator-{port}.log"));
        let log_file =
            std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let log_err = log_file
            .try_clone()
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let mut command = Command::new(binary);
        command
            .arg(format!("--host_port={host}"))
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(log_err);
        if mode == Mode::FaultInjection {
            command.arg("--enable_fault_injection");
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("starting {}: {e}", binary.display()))?;
        let pid = child.id();
        watch(pid);
        match wait_until_listening(&mut child, &host) {
            Ok(()) => {
                return Ok(Emulator {
                    child: Mutex::new(child),
                    pid,
                    host,
                })
            }
            Err(why) => {
                let _ = child.kill();
                let _ = child.wait();
                let output = std::fs::read_to_string(&log).unwrap_or_default();
                last_error = format!("{why}; emulator log {}:\n{output}", log.display());
            }
        }
    }
    panic!("the Spanner emulator did not start: {last_error}")
}

fn wait_until_listening(child: &mut Child, host: &str) -> Result<(), String> {
    let addr: SocketAddr = host.parse().map_err(|e| format!("{host}: {e}"))?;
    let started = Instant::now();
    while started.elapsed() < STARTUP_TIMEOUT {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("the emulator exited with {status}"));
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!(
        "the emulator did not listen on {host} within {STARTUP_TIMEOUT:?}"
    ))
}

/// Kills the emulator (by PID) once this test process is gone, however it ends.
fn watch(emulator_pid: u32) {
    // Only signal $2 while it is still the emulator: after a Drop already killed it, the PID
    // may belong to another process by the time the test process exits.
    let script = r#"
        is_emulator() { [ "$(cat /proc/$1/comm 2>/dev/null)" = emulator_main ]; }
        while kill -0 "$1" 2>/dev/null; do sleep 1; done
        is_emulator "$2" && kill "$2" 2>/dev/null
        sleep 2
        is_emulator "$2" && kill -9 "$2" 2>/dev/null
        exit 0"#;
    let _ = Command::new("sh")
        .args(["-c", script, "spanner-emulator-watchdog"])
        .arg(std::process::id().to_string())
        .arg(emulator_pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}

//! The Cloud Spanner emulator (`emulator_main` of the Debian package
//! `google-cloud-cli-spanner-emulator`) on a free loopback port, waited for until it accepts
//! connections, and stopped by PID: when dropped, and by a watchdog once the owning process is
//! gone however it ends (a static emulator is never dropped).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use crate::net::{free_port, wait_listening};
use crate::process::find_program;

/// Overrides the emulator binary.
pub const EMULATOR_ENV: &str = "TOPOLOGY_CLAIMS_SPANNER_EMULATOR";
/// Where the Google Cloud SDK installs it.
const SDK_LOCATIONS: &[&str] = &[
    "/usr/lib/google-cloud-sdk/bin/cloud_spanner_emulator/emulator_main",
    "/usr/share/google-cloud-sdk/bin/cloud_spanner_emulator/emulator_main",
    "/opt/google-cloud-sdk/bin/cloud_spanner_emulator/emulator_main",
];
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// How the emulator runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Plain,
    /// `--enable_fault_injection`: the emulator aborts a share of commits at random.
    FaultInjection,
}

/// The emulator binary: `$TOPOLOGY_CLAIMS_SPANNER_EMULATOR`, else the SDK's, else the PATH's.
pub fn emulator_binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(EMULATOR_ENV) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("{EMULATOR_ENV}={} is not a file", path.display()))
        };
    }
    SDK_LOCATIONS
        .iter()
        .map(PathBuf::from)
        .find(|candidate| candidate.is_file())
        .or_else(|| find_program("emulator_main"))
        .ok_or_else(|| {
            format!(
                "no Cloud Spanner emulator (install the Debian package \
                 google-cloud-cli-spanner-emulator, or set {EMULATOR_ENV})"
            )
        })
}

/// A running emulator; killed (by PID) when dropped.
pub struct Emulator {
    child: Mutex<Child>,
    pid: u32,
    /// `127.0.0.1:PORT`, for `SPANNER_EMULATOR_HOST`.
    pub host: String,
}

impl Emulator {
    /// Starts an emulator whose log goes to `log_dir`. A free port can be taken between
    /// probing and binding, so a few ports are tried.
    pub fn start(mode: Mode, log_dir: &Path) -> Result<Emulator, String> {
        let binary = emulator_binary()?;
        let mut last_error = String::new();
        for _ in 0..3 {
            let port = free_port()?;
            let host = format!("127.0.0.1:{port}");
            let log = log_dir.join(format!("spanner-emulator-{port}.log"));
            let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
            let err = out
                .try_clone()
                .map_err(|e| format!("{}: {e}", log.display()))?;
            let mut command = Command::new(&binary);
            command
                .arg(format!("--host_port={host}"))
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err);
            if mode == Mode::FaultInjection {
                command.arg("--enable_fault_injection");
            }
            let mut child = command
                .spawn()
                .map_err(|e| format!("starting {}: {e}", binary.display()))?;
            let pid = child.id();
            watch(pid);
            let listening = wait_listening(port, STARTUP_TIMEOUT, || match child.try_wait() {
                Ok(Some(status)) => Err(format!("the emulator exited with {status}")),
                _ => Ok(()),
            });
            match listening {
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
        Err(format!("the Spanner emulator did not start: {last_error}"))
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

/// Kills the emulator (by PID) once this process is gone, however it ends.
fn watch(emulator_pid: u32) {
    // Only signal $2 while it is still the emulator: after a Drop already killed it, the PID
    // may belong to another process by the time this process exits.
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

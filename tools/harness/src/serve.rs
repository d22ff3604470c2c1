//! The real `topology-claims` binary as a child: where it is, a command with a clean
//! environment, and a running `serve` that announced its address with its one stdout line
//! `listening on HOST:PORT`.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::process::{self, Owned};

/// Overrides where the product binary is (`TOPOLOGY_CLAIMS_BIN=/usr/local/bin/topology-claims`).
pub const BIN_ENV: &str = "TOPOLOGY_CLAIMS_BIN";
/// The product binary's file name.
pub const BIN_NAME: &str = "topology-claims";
/// Longest wait for a child to announce itself (a guard against a hung child, not a speed
/// assertion).
pub const STARTUP: Duration = Duration::from_secs(60);

/// The `topology-claims` binary: `$TOPOLOGY_CLAIMS_BIN`, else the one cargo built beside the
/// running executable (a tool in `target/*/`, or a test in `target/*/deps/`), else the PATH's.
pub fn product_binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(BIN_ENV) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("{BIN_ENV}={} is not a file", path.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let beside = exe
        .parent()
        .into_iter()
        .flat_map(|dir| [Some(dir), dir.parent().filter(|_| dir.ends_with("deps"))])
        .flatten()
        .map(|dir| dir.join(BIN_NAME))
        .find(|candidate| candidate.is_file());
    beside
        .or_else(|| process::find_program(BIN_NAME))
        .ok_or_else(|| {
            format!(
                "cannot find the {BIN_NAME} binary beside {} or on PATH: build it \
                 (cargo build -p topology-claims-cli) or set {BIN_ENV}",
                exe.display()
            )
        })
}

/// `binary args…` with no ambient `TOPOLOGY_CLAIMS_*` settings (every knob has an env var, so
/// a developer's shell must not change what a test or tool runs), input from /dev/null.
pub fn clean_command(binary: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(binary);
    command.args(args).stdin(Stdio::null());
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("TOPOLOGY_CLAIMS_") {
            command.env_remove(name);
        }
    }
    command
}

/// A running `serve` child; killed by its PID when dropped.
pub struct ServeChild {
    process: Owned,
    /// The address it announced.
    pub addr: SocketAddr,
    /// The lines it printed after `listening on`.
    lines: mpsc::Receiver<std::io::Result<String>>,
}

impl ServeChild {
    /// Spawns `command` (a `topology-claims serve …` command; its stdout is taken here, stderr
    /// is the caller's choice) and waits for its `listening on HOST:PORT` line.
    pub fn start(mut command: Command) -> Result<ServeChild, String> {
        let mut child = command
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {:?}: {e}", command.get_program()))?;
        let stdout = child.stdout.take();
        let process = Owned::new(child, "the server");
        let stdout = stdout.ok_or("the server's stdout is not piped")?;
        let (line, lines) = first_line(stdout)?;
        let addr = parse_listening_line(&line)?;
        Ok(ServeChild {
            process,
            addr,
            lines,
        })
    }

    /// The next line the server prints to stdout, waiting at most `patience`.
    pub fn next_line(&self, patience: Duration) -> Result<String, String> {
        match self.lines.recv_timeout(patience) {
            Ok(Ok(line)) => Ok(line),
            Ok(Err(e)) => Err(format!("reading the server's output: {e}")),
            Err(_) => Err(format!(
                "the server printed no further line within {patience:?}"
            )),
        }
    }

    /// The address of the `metrics on HOST:PORT` line (`serve --metrics-listen`).
    pub fn metrics_addr(&self, patience: Duration) -> Result<SocketAddr, String> {
        let line = self.next_line(patience)?;
        line.strip_prefix("metrics on ")
            .ok_or_else(|| format!("expected `metrics on HOST:PORT`, the server printed {line:?}"))?
            .parse()
            .map_err(|e| format!("{line:?} is not an address: {e}"))
    }

    /// `http://HOST:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Fails when the server has exited.
    pub fn check_alive(&mut self) -> Result<(), String> {
        self.process.check_alive()
    }

    /// Sends signal `name` (`TERM`, `INT`, `HUP`, …).
    pub fn signal(&self, name: &str) -> Result<(), String> {
        process::signal(self.pid(), name)
    }

    /// Sends `signal` and waits (at most `patience`) for the exit.
    pub fn stop_with(mut self, signal: &str, patience: Duration) -> Result<ExitStatus, String> {
        self.signal(signal)?;
        self.wait(patience)
            .map_err(|e| format!("{e} (sent {signal})"))
    }

    /// Waits (at most `patience`) for the exit, without signalling: for a child that is a
    /// wrapper (e.g. `strace … topology-claims serve`) whose server was signalled directly.
    pub fn wait(&mut self, patience: Duration) -> Result<ExitStatus, String> {
        let deadline = Instant::now() + patience;
        loop {
            match self.process.child_mut().try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) => return Err(format!("the server did not exit within {patience:?}")),
                Err(e) => return Err(format!("cannot wait for the server: {e}")),
            }
        }
    }

    /// SIGKILL now (no drain), and reap.
    pub fn kill(&mut self) {
        self.process.stop();
    }
}

/// The address of a `listening on HOST:PORT` line.
pub fn parse_listening_line(line: &str) -> Result<SocketAddr, String> {
    line.strip_prefix("listening on ")
        .ok_or_else(|| format!("the server printed {line:?} instead of `listening on HOST:PORT`"))?
        .parse()
        .map_err(|e| format!("the server announced {line:?}, not an address: {e}"))
}

/// The first line of a child's output (waiting at most [`STARTUP`]); the rest is drained on a
/// thread so the child never blocks on a full pipe.
/// The first line of `stdout`, and a channel of the lines after it (read until it closes).
#[allow(clippy::type_complexity)]
fn first_line(
    stdout: impl std::io::Read + Send + 'static,
) -> Result<(String, mpsc::Receiver<std::io::Result<String>>), String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            // Nobody listening any more: keep draining so the server never blocks on stdout.
            let _ = tx.send(line);
        }
    });
    match rx.recv_timeout(STARTUP) {
        Ok(Ok(line)) => Ok((line, rx)),
        Ok(Err(e)) => Err(format!("reading the server's output: {e}")),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            Err("the server exited before it was listening (see its log)".into())
        }
        Err(mpsc::RecvTimeoutError::Timeout) => Err(format!(
            "the server did not start listening within {STARTUP:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listening_line_gives_the_address() {
        assert_eq!(
            parse_listening_line("listening on 127.0.0.1:4321").unwrap(),
            "127.0.0.1:4321".parse::<SocketAddr>().unwrap()
        );
        assert!(parse_listening_line("error: no").is_err());
        assert!(parse_listening_line("listening on nowhere").is_err());
    }

    #[test]
    fn a_child_that_prints_the_line_is_started_and_one_that_does_not_is_refused() {
        let mut ok = Command::new("sh");
        ok.args(["-c", "echo 'listening on 127.0.0.1:9'; sleep 30"]);
        let child = ServeChild::start(ok).unwrap();
        assert_eq!(child.endpoint(), "http://127.0.0.1:9");
        let mut silent = Command::new("sh");
        silent.args(["-c", "exit 3"]);
        let error = ServeChild::start(silent).err().unwrap();
        assert!(error.contains("exited before it was listening"), "{error}");
    }
}

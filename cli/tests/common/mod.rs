//! The real binary as a child process, shared by the binary-level tests: a clean command, and
//! a running `serve` that announced its port.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_topology-claims");
/// Guards against a hung child; never a speed assertion.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The binary with a clean environment (no ambient TOPOLOGY_CLAIMS_* settings), run in `dir`.
pub fn command(dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command.args(args).current_dir(dir).env("RUST_LOG", "info");
    for (name, _) in std::env::vars() {
        if name.starts_with("TOPOLOGY_CLAIMS_") {
            command.env_remove(name);
        }
    }
    command
}

pub fn run(dir: &Path, args: &[&str]) -> Output {
    command(dir, args).output().expect("run topology-claims")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A running `serve` child; killed if the test ends without stopping it.
pub struct Server {
    pub child: Child,
    pub addr: String,
}

impl Server {
    /// Starts `serve` and waits for its `listening on HOST:PORT` line.
    pub fn start(dir: &Path, args: &[&str]) -> Server {
        let mut child = command(dir, &[&["serve"], args].concat())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn serve");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let _ = tx.send(lines.next());
            // Keep draining, so later output never blocks the server on a full pipe.
            for _ in lines {}
        });
        let line = match rx.recv_timeout(PATIENCE) {
            Ok(Some(Ok(line))) => line,
            other => {
                let _ = child.kill();
                panic!("serve printed no `listening on` line: {other:?}");
            }
        };
        let addr = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        Server {
            addr: addr.to_owned(),
            child,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} failed");
    }

    /// Sends `signal` and waits for the exit.
    pub fn stop_with(mut self, signal: &str) -> ExitStatus {
        self.signal(signal);
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for serve") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "serve did not exit after {signal}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

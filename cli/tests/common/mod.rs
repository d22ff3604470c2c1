//! The real binary as a child process, shared by the binary-level tests: a clean command, and
//! a running `serve` that announced its port (both through the shared harness).
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::Duration;

use topology_claims_harness::serve::{clean_command, ServeChild};

pub const BIN: &str = env!("CARGO_BIN_EXE_topology-claims");
/// Guards against a hung child; never a speed assertion.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The binary with a clean environment (no ambient TOPOLOGY_CLAIMS_* settings), run in `dir`.
pub fn command(dir: &Path, args: &[&str]) -> Command {
    let mut command = clean_command(Path::new(BIN), args);
    command.current_dir(dir).env("RUST_LOG", "info");
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
    pub child: ServeChild,
    pub addr: String,
}

impl Server {
    /// Starts `serve` and waits for its `listening on HOST:PORT` line.
    pub fn start(dir: &Path, args: &[&str]) -> Server {
        let mut command = command(dir, &[&["serve"], args].concat());
        command.stderr(Stdio::inherit());
        let child = ServeChild::start(command).unwrap_or_else(|e| panic!("serve: {e}"));
        Server {
            addr: child.addr.to_string(),
            child,
        }
    }

    pub fn endpoint(&self) -> String {
        self.child.endpoint()
    }

    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    pub fn signal(&self, name: &str) {
        self.child.signal(name).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Sends `signal` and waits for the exit.
    pub fn stop_with(self, signal: &str) -> ExitStatus {
        self.child
            .stop_with(signal, PATIENCE)
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

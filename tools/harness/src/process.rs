//! Child processes that never outlive their owner, and running a program to its end.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A child process killed (SIGKILL, by its PID through `Child::kill`) and reaped when dropped.
pub struct Owned {
    child: Child,
    name: String,
}

impl Owned {
    pub fn new(child: Child, name: impl Into<String>) -> Self {
        Self {
            child,
            name: name.into(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Fails (naming the child and its exit status) when the child has already exited.
    pub fn check_alive(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!("{} exited: {status}", self.name)),
            Err(e) => Err(format!("cannot check on {}: {e}", self.name)),
        }
    }

    /// Kills the child and reaps it; harmless when it has already stopped.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs `command` to its end with no input; on failure its output is in the error.
pub fn run_to_end(command: &mut Command, what: &str) -> Result<(), String> {
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

/// Where `program` is: itself when it names a path that exists, else the first match on PATH.
pub fn find_program(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Path::new(program).is_file().then(|| PathBuf::from(program));
    }
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// Sends signal `name` (e.g. `TERM`, `HUP`, `STOP`) to process `pid` with kill(1).
pub fn signal(pid: u32, name: &str) -> Result<(), String> {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .map_err(|e| format!("cannot run kill: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -{name} {pid} failed: {status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_found_on_the_path_or_by_their_path() {
        assert!(find_program("sh").is_some());
        assert!(find_program("/bin/sh").is_some());
        assert!(find_program("no-such-program-topology-claims").is_none());
    }

    #[test]
    fn a_dropped_child_is_killed() {
        let child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        drop(Owned::new(child, "sleep"));
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
    }
}

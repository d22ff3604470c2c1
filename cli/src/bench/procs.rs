//! The processes a benchmark run starts and watches: the `serve` child (this same binary), and
//! CPU time / resident memory read from `/proc` (Linux) for the bench itself, the server child,
//! every `postgres` process and etcd.
//!
//! Owns process lifetime (start, wait for readiness, kill by pid on drop) and `/proc` parsing.
//! Must not hold workload or reporting logic. On systems without `/proc`, readings are `None`/0.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Longest wait for a child to announce itself.
const STARTUP: Duration = Duration::from_secs(60);

/// Clock ticks per second of `/proc/PID/stat` times (`getconf CLK_TCK`, 100 on Linux).
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .and_then(|text| text.trim().parse::<f64>().ok())
            .filter(|ticks| *ticks > 0.0)
            .unwrap_or(100.0)
    })
}

/// The fields of `/proc/PID/stat` after the `(comm)` field, and the comm itself.
fn stat_fields(stat: &str) -> Option<(&str, Vec<&str>)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?;
    Some((comm, stat.get(close + 1..)?.split_whitespace().collect()))
}

/// utime + stime (and, with `children`, cutime + cstime) of a `stat` line, in seconds.
fn stat_cpu(fields: &[&str], children: bool) -> f64 {
    // After the comm: state is index 0, utime 11, stime 12, cutime 13, cstime 14.
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let own = tick(11) + tick(12);
    let reaped = if children { tick(13) + tick(14) } else { 0.0 };
    (own + reaped) / clock_ticks()
}

/// CPU seconds a process has used so far (its own threads only).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, fields) = stat_fields(&stat)?;
    Some(stat_cpu(&fields, false))
}

/// CPU seconds of this benchmark process.
pub fn self_cpu_seconds() -> f64 {
    cpu_seconds(std::process::id()).unwrap_or(0.0)
}

/// CPU seconds of every process named `postgres`, including backends already reaped (counted in
/// the postmaster's cutime/cstime), so connections closed during a segment are not lost.
pub fn postgres_cpu_seconds() -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    entries
        .flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("stat")).ok())
        .map(|stat| match stat_fields(&stat) {
            Some(("postgres", fields)) => stat_cpu(&fields, true),
            _ => 0.0,
        })
        .sum()
}

/// CPU seconds the whole machine spent busy (all cores: user, nice, system, irq, softirq,
/// steal), from the first line of `/proc/stat`.
pub fn machine_busy_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return 0.0;
    };
    let Some(line) = stat.lines().next() else {
        return 0.0;
    };
    let ticks: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    // user nice system idle iowait irq softirq steal …: everything but idle and iowait.
    let busy: f64 = [0usize, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|&i| ticks.get(i))
        .sum();
    busy / clock_ticks()
}

/// Resident memory of a process (`VmRSS`), in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

/// A child process killed (by its pid, through `Child::kill`) when dropped.
pub struct Owned {
    child: Child,
    name: &'static str,
}

impl Owned {
    pub fn new(child: Child, name: &'static str) -> Self {
        Self { child, name }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails when the child has already exited (crashed during the run).
    pub fn check_alive(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!(
                "{} exited during the benchmark: {status}",
                self.name
            )),
            Err(e) => Err(format!("cannot check on {}: {e}", self.name)),
        }
    }
}

impl Owned {
    /// Kills the child (SIGKILL, by its pid) and reaps it; harmless when already stopped.
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

/// A `topology-claims serve` child on an ephemeral loopback port.
pub struct ServerChild {
    pub process: Owned,
    pub endpoint: String,
}

impl ServerChild {
    /// Starts `current_exe serve --listen 127.0.0.1:0 --store URL [extra…]` and waits for its
    /// `listening on HOST:PORT` line. Logs (warnings and up) go to the bench's stderr.
    pub fn start(store_url: &str, extra: &[String]) -> Result<ServerChild, String> {
        let exe = std::env::current_exe()
            .map_err(|e| format!("cannot find this binary to start the server: {e}"))?;
        let mut command = Command::new(exe);
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--store", store_url])
            // The collector's first round runs at start; later ones would only add noise.
            .args(["--gc-interval", "1h"])
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("TOPOLOGY_CLAIMS_BENCH_SERVER_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start the server: {e}"))?;
        let stdout = child.stdout.take();
        let process = Owned::new(child, "the server");
        let stdout = stdout.ok_or("the server's stdout is not piped")?;
        let line = first_line(stdout)?;
        let addr = line
            .strip_prefix("listening on ")
            .ok_or_else(|| format!("the server printed {line:?} instead of `listening on …`"))?;
        Ok(ServerChild {
            endpoint: format!("http://{addr}"),
            process,
        })
    }
}

/// The first line of a child's output (waiting at most [`STARTUP`]); the rest is drained on a
/// thread so the child never blocks on a full pipe.
fn first_line(stdout: impl std::io::Read + Send + 'static) -> Result<String, String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let _ = tx.send(lines.next());
        for _ in lines {}
    });
    match rx.recv_timeout(STARTUP) {
        Ok(Some(Ok(line))) => Ok(line),
        Ok(Some(Err(e))) => Err(format!("reading the server's output: {e}")),
        Ok(None) => Err("the server exited before it was listening (see its log above)".into()),
        Err(_) => Err(format!(
            "the server did not start listening within {STARTUP:?}"
        )),
    }
}

/// A free loopback TCP port (bound, then released: fine for a child started right after).
pub fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|e| format!("cannot find a free port: {e}"))
}

/// Whether `program` can be run (found on PATH, or a path that exists).
pub fn program_exists(program: &str) -> bool {
    if program.contains('/') {
        return Path::new(program).is_file();
    }
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_spaces_in_the_name_parse() {
        let line = "42 (post gres) S 1 2 3 4 5 6 7 8 9 10 200 100 50 25 20 0";
        let (comm, fields) = stat_fields(line).unwrap();
        assert_eq!(comm, "post gres");
        let ticks = clock_ticks();
        assert!((stat_cpu(&fields, false) - 300.0 / ticks).abs() < 1e-9);
        assert!((stat_cpu(&fields, true) - 375.0 / ticks).abs() < 1e-9);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_has_a_resident_set() {
        assert!(rss_kib(std::process::id()).unwrap_or(0) > 0);
    }
}

//! Durability of the embedded SQLite store, through the real binary run under
//! `strace -f -e trace=fsync,fdatasync`: by default every acknowledged BeginUpdate and
//! CommitUpdate was fsynced before its answer (each call's window, from send to answer, holds
//! at least one fsync/fdatasync of the server); with `--sqlite-synchronous normal` the calls
//! are answered without one, and the server warns at start what that can lose (decision 073).
//!
//! Sequential pairs: each call is a store transaction of its own (group commit runs a lone
//! call at once). Needs strace (scripts/ensure-services.sh installs it); without it the tests
//! fail, they never skip.
#![cfg(target_os = "linux")]

mod common;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{SystemTime, UNIX_EPOCH};

use common::{run, text, BIN, PATIENCE};
use topology_claims_client::{ClaimsClient, ClientConfig};
use topology_claims_harness::process::{find_program, signal};
use topology_claims_harness::serve::{clean_command, ServeChild};
use topology_claims_testkit::fixtures::{cell, creates, username};

/// BeginUpdate + CommitUpdate pairs run one after the other: `2 * PAIRS` write transactions.
const PAIRS: usize = 20;

/// A `serve` on a SQLite file, run under strace; the trace and the server's log are files.
struct Traced {
    strace: ServeChild,
    trace: PathBuf,
    log: PathBuf,
}

impl Traced {
    fn start(dir: &Path, label: &str, extra: &[&str]) -> Traced {
        let strace = find_program("strace").unwrap_or_else(|| {
            panic!("strace is not installed (scripts/ensure-services.sh installs it)")
        });
        let trace = dir.join(format!("{label}.strace"));
        let log = dir.join(format!("{label}.log"));
        let store = format!("sqlite://{}", dir.join(format!("{label}.db")).display());
        let trace_arg = trace.display().to_string();
        let serve = [BIN, "serve", "--listen", "127.0.0.1:0", "--store", &store];
        let args = [
            // Every thread (requests run on tokio's blocking threads), wall-clock timestamps in
            // microseconds (compared with the test's own clock), no signal noise.
            &["-f", "-qq", "-ttt", "-e", "trace=fsync,fdatasync"][..],
            &["-e", "signal=none", "-o", &trace_arg],
            &serve,
            extra,
        ]
        .concat();
        let mut command = clean_command(&strace, &args);
        command
            .current_dir(dir)
            .env("RUST_LOG", "info")
            .stderr(Stdio::from(File::create(&log).unwrap()));
        let strace = ServeChild::start(command).unwrap_or_else(|e| {
            panic!(
                "serve under strace: {e}\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        });
        Traced { strace, trace, log }
    }

    /// Stops the server (SIGTERM to it, not to strace) and waits for strace to finish the trace.
    fn stop(mut self) -> (Vec<f64>, String) {
        let server = child_of(self.strace.pid()).expect("strace has the server as its child");
        signal(server, "TERM").unwrap();
        let status = self.strace.wait(PATIENCE).unwrap();
        let log = std::fs::read_to_string(&self.log).unwrap();
        assert!(status.success(), "the server exited with {status}:\n{log}");
        let trace = std::fs::read_to_string(&self.trace).unwrap();
        (sync_times(&trace), log)
    }
}

/// The one child process of `parent`, from /proc.
fn child_of(parent: u32) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
            let ppid: u32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == parent).then_some(pid)
        })
}

/// When each fsync / fdatasync began (unix seconds), from `strace -f -ttt` lines
/// `PID SECONDS.MICROS fsync(5) = 0` (or `… fsync(5 <unfinished ...>` when threads interleave).
fn sync_times(trace: &str) -> Vec<f64> {
    trace
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_pid, at, call) = (fields.next()?, fields.next()?, fields.next()?);
            (call.starts_with("fsync(") || call.starts_with("fdatasync("))
                .then(|| at.parse().ok())
                .flatten()
        })
        .collect()
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Runs PAIRS sequential BeginUpdate + CommitUpdate pairs; returns each call's window
/// (sent, answered) in unix seconds.
async fn pairs(endpoint: &str, label: &str) -> Vec<(f64, f64)> {
    let client = ClaimsClient::connect_lazy(endpoint, ClientConfig::default()).unwrap();
    let me = cell("cell-durable");
    // One call first, outside any window: the connection and the file's first pages.
    let warm = username(&format!("{label}-warm-up"));
    client
        .begin_update(creates(&me, std::slice::from_ref(&warm)))
        .await
        .unwrap();
    let mut windows = Vec::with_capacity(2 * PAIRS);
    for p in 0..PAIRS {
        let name = username(&format!("{label}-{p}"));
        let sent = now();
        let lease = client
            .begin_update(creates(&me, std::slice::from_ref(&name)))
            .await
            .unwrap();
        windows.push((sent, now()));
        let sent = now();
        client.commit_update(&me, lease.lease_id).await.unwrap();
        windows.push((sent, now()));
    }
    windows
}

/// How many of `syncs` fall in each window.
fn syncs_per_call(windows: &[(f64, f64)], syncs: &[f64]) -> Vec<usize> {
    // strace prints microseconds; the windows are read in nanoseconds.
    let slack = 1e-6;
    windows
        .iter()
        .map(|(sent, answered)| {
            syncs
                .iter()
                .filter(|at| **at >= sent - slack && **at <= answered + slack)
                .count()
        })
        .collect()
}

/// Starts a traced server (`extra` flags), runs the pairs, stops it: (syncs per call, log).
async fn measure(label: &'static str, extra: &'static [&'static str]) -> (Vec<usize>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    let server = tokio::task::spawn_blocking(move || Traced::start(&path, label, extra))
        .await
        .unwrap();
    let endpoint = server.strace.endpoint();
    let windows = pairs(&endpoint, label).await;
    let (syncs, log) = tokio::task::spawn_blocking(move || server.stop())
        .await
        .unwrap();
    let per_call = syncs_per_call(&windows, &syncs);
    println!(
        "{label}: {} fsync/fdatasync in the windows of {} acknowledged writes ({} in the whole \
         run); per call: {per_call:?}",
        per_call.iter().sum::<usize>(),
        windows.len(),
        syncs.len()
    );
    (per_call, log)
}

const WARNING: &str = "--sqlite-synchronous normal";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_every_acknowledged_write_is_fsynced_before_its_answer() {
    let (per_call, log) = measure("full", &[]).await;
    assert_eq!(per_call.len(), 2 * PAIRS);
    let unsynced: Vec<usize> = (0..per_call.len()).filter(|i| per_call[*i] == 0).collect();
    assert!(
        unsynced.is_empty(),
        "calls answered without an fsync (0-based, begin = even, commit = odd): {unsynced:?}"
    );
    assert!(
        per_call.iter().sum::<usize>() >= 2 * PAIRS,
        "at least one fsync per acknowledged write transaction"
    );
    assert!(!log.contains(WARNING), "no warning by default:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_sqlite_synchronous_normal_writes_are_answered_unsynced_and_the_server_warns() {
    let (per_call, log) = measure("normal", &["--sqlite-synchronous", "normal"]).await;
    let synced: usize = per_call.iter().sum();
    assert!(
        synced < 2 * PAIRS,
        "normal fsyncs only at checkpoints, yet {synced} syncs fell in {} calls",
        2 * PAIRS
    );
    let warning = log
        .lines()
        .find(|line| line.contains(WARNING))
        .unwrap_or_else(|| panic!("no warning at start:\n{log}"));
    assert!(
        warning.contains("WARN") && warning.contains("power loss"),
        "{warning}"
    );
}

#[test]
fn a_bad_sqlite_synchronous_value_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        dir.path(),
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            "memory:",
            "--sqlite-synchronous",
            "off",
        ],
    );
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "accepted: {stderr}");
    assert!(stderr.contains("--sqlite-synchronous"), "{stderr}");
}

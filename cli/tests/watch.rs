//! WatchClaims through the real binary: the `watch` command prints every change and resumes
//! from a revision; a watch from below `--watch-retention` is refused with WATCH_COMPACTED; a
//! draining server ends the streams; a watcher that never reads costs the server a bounded
//! amount of memory and slows no writer.
#![cfg(unix)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{command, text, Server};
use topology_claims_client::{ClaimsClient, ClientConfig, WatchRequest};
use topology_claims_testkit::fixtures::{cell, creates, destroys, username};

/// `watch --json` with `args`, its stdout lines read on a thread.
struct Watcher {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Watcher {
    fn start(dir: &std::path::Path, server: &Server, args: &[&str]) -> Watcher {
        let endpoint = server.endpoint();
        let mut full = vec!["watch", "--server", &endpoint, "--json"];
        full.extend_from_slice(args);
        let mut child = command(dir, &full)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        Watcher { child, lines }
    }

    /// The next `n` lines as JSON.
    fn next(&self, n: usize) -> Vec<serde_json::Value> {
        (0..n)
            .map(|_| {
                let line = self
                    .lines
                    .recv_timeout(common::PATIENCE)
                    .expect("a line from watch");
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"))
            })
            .collect()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn fields(events: &[serde_json::Value]) -> Vec<(String, String, bool)> {
    events
        .iter()
        .map(|e| {
            (
                e["value"].as_str().unwrap().to_owned(),
                e["state"].as_str().unwrap().to_owned(),
                e["deleted"].as_bool().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn the_watch_command_prints_every_change_and_resumes_from_a_revision() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.log");
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--store",
        "memory:",
        "--audit-log",
        audit.to_str().unwrap(),
    ]
    .map(String::from);
    let server = Server::start_async(dir.path(), args.to_vec()).await;
    let claims = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    let a = cell("cell-a");
    // From now: the first line is the current revision.
    let live = Watcher::start(dir.path(), &server, &[]);
    let now = live.next(1);
    assert!(now[0]["progress"].is_u64(), "{now:?}");
    // The audit log has the watch's start (and will have no line per event).
    let started = Instant::now();
    while !std::fs::read_to_string(&audit)
        .unwrap_or_default()
        .lines()
        .any(|l| l.contains("\"method\":\"WatchClaims\"") && l.contains("\"code\":\"OK\""))
    {
        assert!(started.elapsed() < Duration::from_secs(10), "no audit line");
        std::thread::sleep(Duration::from_millis(20));
    }
    let lease = claims
        .begin_update(creates(&a, &[username("Alice")]))
        .await
        .unwrap();
    claims.commit_update(&a, lease.lease_id).await.unwrap();
    let lease = claims
        .begin_update(destroys(&a, &[username("alice")]))
        .await
        .unwrap();
    claims.commit_update(&a, lease.lease_id).await.unwrap();
    let events = live.next(4);
    assert_eq!(
        fields(&events),
        vec![
            ("Alice".into(), "creating".into(), false),
            ("Alice".into(), "active".into(), false),
            ("Alice".into(), "destroying".into(), false),
            ("Alice".into(), "destroying".into(), true),
        ]
    );
    assert_eq!(events[0]["key"], "alice");
    assert_eq!(events[0]["cell_id"], "cell-a");
    assert_eq!(events[0]["lease_id"].as_str().unwrap().len(), 36);
    // Resumed from the second event's revision: exactly the events from there on.
    let second = events[1]["revision"].as_u64().unwrap().to_string();
    let resumed = Watcher::start(dir.path(), &server, &["--from", &second]);
    assert_eq!(fields(&resumed.next(3)), fields(&events[1..]));
    drop((live, resumed));
    // A draining server ends the stream: `watch` exits 0 and says to resume.
    let mut last = Watcher::start(dir.path(), &server, &["--from", "1"]);
    last.next(4);
    server.signal("TERM");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = last.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "watch still running"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
}

#[tokio::test]
async fn a_watch_from_below_the_retention_is_refused_with_watch_compacted() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_memory(dir.path(), &["--watch-retention", "2s"]).await;
    let claims = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    let a = cell("cell-a");
    let lease = claims
        .begin_update(creates(&a, &[username("old")]))
        .await
        .unwrap();
    claims.commit_update(&a, lease.lease_id).await.unwrap();
    // Compacted within half the retention after it passes.
    let endpoint = server.endpoint();
    let started = Instant::now();
    let refused = loop {
        // Accepted (not compacted yet), a watch runs until killed: give it a second.
        let mut child = command(dir.path(), &["watch", "--server", &endpoint, "--from", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let tried = Instant::now();
        while child.try_wait().unwrap().is_none() && tried.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let output = child.wait_with_output().unwrap();
        if output.status.code() == Some(1) {
            break output;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never compacted: {}",
            text(&output.stderr)
        );
    };
    let said = text(&refused.stderr);
    assert!(said.contains("WATCH_COMPACTED"), "{said}");
    // The cache's way back: look up, watch from the answer's revision + 1.
    let view = claims.lookup_claim(&username("old").key).await.unwrap();
    let from = (view.revision + 1).to_string();
    let mut resumed = Watcher::start(dir.path(), &server, &["--from", &from]);
    let lease = claims
        .begin_update(creates(&a, &[username("new")]))
        .await
        .unwrap();
    assert_eq!(
        fields(&resumed.next(1)),
        vec![("new".into(), "creating".into(), false)]
    );
    let _ = resumed.child.kill();
    claims.rollback_update(&a, lease.lease_id).await.unwrap();
    let _ = tokio::task::spawn_blocking(move || server.stop_with("TERM")).await;
}

/// The resident set of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    topology_claims_harness::proc_stats::rss_kib(pid).expect("the server's RSS") * 1024
}

/// Begin + commit of 1,000 new usernames `{prefix}-0` … for cell-a; how long the pair took.
async fn thousand(claims: &ClaimsClient, prefix: &str) -> Duration {
    let a = cell("cell-a");
    let names: Vec<_> = (0..1000)
        .map(|i| username(&format!("{prefix}-{i}")))
        .collect();
    let started = Instant::now();
    let lease = claims.begin_update(creates(&a, &names)).await.unwrap();
    claims.commit_update(&a, lease.lease_id).await.unwrap();
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_never_reads_costs_bounded_memory_and_slows_no_writer() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("claims.db").display());
    let args = ["--listen", "127.0.0.1:0", "--store", &store].map(String::from);
    let server = Server::start_async(dir.path(), args.to_vec()).await;
    let claims = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    // Warm up (store pages, allocator arenas) before the baseline.
    thousand(&claims, "warm").await;
    let before = rss(server.pid());
    // From the first revision: every event of the run is owed to this watcher, none is read.
    let request = WatchRequest {
        start_revision: 1,
        ..WatchRequest::default()
    };
    let mut unread = claims.watch_claims(&request).await.unwrap();
    let mut slowest = Duration::ZERO;
    for pair in 0..100 {
        let took = thousand(&claims, &format!("load{pair}")).await;
        assert!(took < Duration::from_secs(5), "pair {pair} took {took:?}");
        slowest = slowest.max(took);
    }
    let after = rss(server.pid());
    let grown = after.saturating_sub(before);
    println!(
        "100 pairs of 1,000 claims with a watcher that never reads: slowest pair {slowest:?}, \
         server RSS {} MiB -> {} MiB (+{} MiB)",
        before >> 20,
        after >> 20,
        grown >> 20
    );
    assert!(grown < 50 << 20, "the server grew by {} MiB", grown >> 20);
    // The watcher was held, not dropped: it reads its backlog from the start.
    let first = unread.next().await.unwrap().expect("a response");
    assert_eq!(first.events[0].claim.record.key.value, "warm-0");
    let _ = tokio::task::spawn_blocking(move || server.stop_with("TERM")).await;
}

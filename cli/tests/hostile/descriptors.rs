//! Descriptor exhaustion: under a low `ulimit -n`, connections use up every descriptor. The
//! accept loop backs off instead of spinning (it burned 1.2 cores before), logs a few lines
//! rather than one per attempt, and serves again as soon as descriptors free.

use std::path::Path;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use topology_claims_harness::proc_stats::cpu_seconds;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_accept_loop_backs_off_when_descriptors_run_out_and_recovers() {
    // `ulimit -n` in the shell sets the soft and the hard limit, so `serve` cannot raise it.
    let target = Target::start_with(
        &["--store", "memory:"],
        &["--handshake-timeout", "1m", "--idle-timeout", "5m"],
        |command| {
            let program = command.get_program().to_owned();
            let args: Vec<_> = command.get_args().map(|a| a.to_owned()).collect();
            let mut shell = std::process::Command::new("sh");
            shell
                .arg("-c")
                .arg("ulimit -n 40 && exec \"$0\" \"$@\"")
                .arg(Path::new(&program))
                .args(args);
            // Keep the environment, directory and stdio the harness set.
            for (key, value) in command.get_envs() {
                match value {
                    Some(v) => shell.env(key, v),
                    None => shell.env_remove(key),
                };
            }
            if let Some(dir) = command.get_current_dir() {
                shell.current_dir(dir);
            }
            std::mem::swap(command, &mut shell);
        },
    );
    let addr = target.addr();
    // More connections than descriptors: each sends the preface and stays.
    let mut hogs = Vec::new();
    for _ in 0..60 {
        let mut tcp = TcpStream::connect(&addr)
            .await
            .expect("connect (the backlog takes it)");
        let _ = tcp.write_all(PREFACE).await;
        hogs.push(tcp);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cpu_before = cpu_seconds(target.pid()).expect("cpu");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cpu = cpu_seconds(target.pid()).expect("cpu") - cpu_before;
    let failures_logged = target.log_lines("accepting a connection failed");
    println!(
        "descriptors exhausted: server CPU {cpu:.2} s over 3 s, {failures_logged} accept-failure \
         log lines"
    );
    assert!(
        failures_logged >= 1,
        "accept failures are logged:\n{}",
        target.log_text()
    );
    assert!(
        failures_logged <= 3,
        "accept failures are rate-limited: {failures_logged} lines"
    );
    assert!(
        cpu < 0.5,
        "the accept loop spins: {cpu:.2} CPU seconds in 3 s"
    );

    drop(hogs);
    let started = Instant::now();
    target
        .assert_lookup_answers("once descriptors are free")
        .await;
    println!(
        "served again {:?} after the descriptors were freed",
        started.elapsed()
    );
    assert!(target.log_lines("accepting connections again") >= 1);
}

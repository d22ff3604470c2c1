//! The processes a benchmark run starts and watches: the `serve` child (the `topology-claims`
//! binary, started through the shared harness); their CPU time and resident memory come from
//! the harness's `/proc` readings. Must not hold workload or reporting logic.

use std::process::Stdio;

pub use topology_claims_harness::proc_stats::{
    cpu_seconds, machine_busy_seconds, postgres_cpu_seconds, rss_kib, self_cpu_seconds,
};

use topology_claims_harness::serve::{clean_command, product_binary, ServeChild};

/// Starts `topology-claims serve --listen 127.0.0.1:0 --store URL [extra…]` and waits for its
/// `listening on` line. Logs (warnings and up, `TOPOLOGY_CLAIMS_BENCH_SERVER_LOG` to change)
/// go to the bench's stderr.
pub fn start_server(store_url: &str, extra: &[String]) -> Result<ServeChild, String> {
    let binary = product_binary()?;
    let mut command = clean_command(
        &binary,
        &["serve", "--listen", "127.0.0.1:0", "--store", store_url],
    );
    command
        // The collector's first round runs at start; later ones would only add noise.
        .args(["--gc-interval", "1h"])
        .args(extra)
        .env(
            "RUST_LOG",
            std::env::var("TOPOLOGY_CLAIMS_BENCH_SERVER_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stderr(Stdio::inherit());
    ServeChild::start(command)
}

/// Writes back what other processes left dirty in the page cache (`sync`) before measuring.
/// Otherwise the kernel writes it back about 30 s later (`vm.dirty_expire_centisecs`), in the
/// middle of a step, and the store's fsyncs queue behind it: right after a release build, a
/// 60–80 ms stall that failed an SLO step at 400 pairs/s (docs/benchmarks.md, "Found
/// (2026-11-28): the kernel writing back another process's dirty pages").
pub fn flush_dirty_pages() {
    let dirty = dirty_kib();
    let started = std::time::Instant::now();
    match std::process::Command::new("sync").status() {
        Ok(status) if status.success() => {
            if let Some(kib) = dirty.filter(|kib| *kib >= 1024) {
                eprintln!(
                    "bench: wrote back {} MiB of dirty pages before measuring ({:.1} s)",
                    kib / 1024,
                    started.elapsed().as_secs_f64()
                );
            }
        }
        Ok(status) => eprintln!(
            "bench: warning: `sync` failed ({status}); a later write-back may stall a step"
        ),
        Err(error) => eprintln!(
            "bench: warning: could not run `sync` ({error}); a later write-back may stall a step"
        ),
    }
}

/// `Dirty:` of /proc/meminfo, in KiB (Linux only).
fn dirty_kib() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("Dirty:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

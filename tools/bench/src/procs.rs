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

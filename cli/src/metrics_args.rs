//! `--metrics-listen`, shared by `serve` and the two sidecars: binds the endpoint, prints the
//! `metrics on HOST:PORT` line and serves `/metrics` until the process exits.

use std::io::Write;
use std::sync::Arc;

use clap::Args;

#[derive(Args, Debug, Clone)]
pub struct MetricsArgs {
    /// Serve Prometheus metrics at http://ADDR/metrics (HOST:PORT; port 0 picks a free port).
    /// Prints one line `metrics on HOST:PORT` to stdout once it accepts connections. Default:
    /// no metrics endpoint.
    #[arg(long, env = "TOPOLOGY_CLAIMS_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<String>,
}

impl MetricsArgs {
    /// Binds the endpoint if asked for, prints its line and serves `render()` on a task of its
    /// own for the life of the process.
    pub async fn start(&self, render: Arc<dyn Fn() -> String + Send + Sync>) -> Result<(), String> {
        let Some(addr) = &self.metrics_listen else {
            return Ok(());
        };
        let listener = topology_claims::metrics::bind(addr)
            .await
            .map_err(|e| e.to_string())?;
        let bound = listener
            .local_addr()
            .map_err(|e| format!("--metrics-listen {addr}: cannot read the bound address: {e}"))?;
        tokio::spawn(topology_claims::metrics::serve_metrics(
            listener,
            render,
            std::future::pending(),
        ));
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "metrics on {bound}")
            .and_then(|()| stdout.flush())
            .map_err(|e| format!("cannot write to stdout: {e}"))?;
        tracing::info!(%bound, "serving metrics at /metrics");
        Ok(())
    }
}

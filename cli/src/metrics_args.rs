//! `--metrics-listen`, shared by `serve` and the two sidecars: binds the endpoint, prints the
//! `metrics on HOST:PORT` line and serves `/metrics` until the process exits.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use clap::Args;

#[derive(Args, Debug, Clone)]
pub struct MetricsArgs {
    /// Serve Prometheus metrics at http://ADDR/metrics (HOST:PORT; port 0 picks a free port).
    /// Prints one line `metrics on HOST:PORT` to stdout once it accepts connections. Default:
    /// no metrics endpoint.
    #[arg(long, env = "TOPOLOGY_CLAIMS_METRICS_LISTEN", value_name = "ADDR",
          value_parser = crate::env::address)]
    pub metrics_listen: Option<String>,
}

type Render = Arc<dyn Fn() -> String + Send + Sync>;

impl MetricsArgs {
    /// Binds the endpoint if asked for, serves `render()` on a task of its own for the life of
    /// the process, and prints its line.
    pub async fn start(&self, render: Render) -> Result<(), String> {
        match self.bind(render).await? {
            Some(bound) => announce(bound),
            None => Ok(()),
        }
    }

    /// [`start`](Self::start) without the line: `serve` prints it after `listening on`.
    pub async fn bind(&self, render: Render) -> Result<Option<SocketAddr>, String> {
        match self.listen().await? {
            Some(listener) => serve(listener, render).map(Some),
            None => Ok(None),
        }
    }

    /// Binds the endpoint if asked for, serving nothing yet: `serve` binds every listener
    /// before it opens the store, so a taken port fails before any migration.
    pub async fn listen(&self) -> Result<Option<tokio::net::TcpListener>, String> {
        let Some(addr) = &self.metrics_listen else {
            return Ok(None);
        };
        let listener = topology_claims_server::metrics::bind(addr)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Some(listener))
    }
}

/// Serves `render()` on `listener` on a task of its own for the life of the process.
pub fn serve(listener: tokio::net::TcpListener, render: Render) -> Result<SocketAddr, String> {
    let bound = listener
        .local_addr()
        .map_err(|e| format!("--metrics-listen: cannot read the bound address: {e}"))?;
    tokio::spawn(topology_claims_server::metrics::serve_metrics(
        listener,
        render,
        std::future::pending(),
    ));
    tracing::info!(%bound, "serving metrics at /metrics");
    Ok(bound)
}

/// Prints `metrics on HOST:PORT` (the endpoint accepts connections from here on).
pub fn announce(bound: SocketAddr) -> Result<(), String> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "metrics on {bound}")
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("cannot write to stdout: {e}"))
}

//! # topology-claims-harness
//!
//! What the binary-level tests (`cli/tests`), the backends' tests and the tools (`tools/bench`,
//! `tools/chaos`) need to run the real thing, written once:
//!
//! - [`serve`]: find the `topology-claims` binary, start `serve` and read its `listening on`
//!   line, signal and stop it;
//! - [`net`]: a free loopback port, waiting until a port listens;
//! - [`process`]: a child killed by its PID when dropped, whether a program exists;
//! - [`proc_stats`]: CPU seconds and resident memory of a process, from `/proc`;
//! - [`pki`]: a development PKI (CA, server and client certificates) made by the binary's
//!   own `topology-claims certs`;
//! - [`postgres`]: the test database's URL, temporary schemas (quoted, swept when stale);
//! - [`private_postgres`]: a throwaway PostgreSQL cluster a test may crash and restart;
//! - [`spanner`]: the Cloud Spanner emulator on a free port, stopped by PID.
//!
//! `publish = false`: never a dependency of the product binary or of a backend's library.
//! Errors are `String`s that name what failed; callers that are tests turn them into panics.

pub mod net;
pub mod pki;
pub mod postgres;
pub mod private_postgres;
pub mod proc_stats;
pub mod process;
pub mod serve;
pub mod spanner;

/// Whether this is a CI run (`CI=true`): a missing service fails there instead of skipping.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// An error with its source chain, each part once (the product's own formatting).
pub use topology_claims::error::error_chain as with_causes;

/// Logs of a tool to stderr (stdout is for results), filtered by `RUST_LOG` (default `info`).
pub fn init_tool_logging() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// The `main` of a tool: logging to stderr, `bin` (the tool's `--bin`) exported for
/// [`serve::product_binary`], then `run` on a multi-threaded runtime.
pub fn run_tool<F>(bin: Option<&std::path::Path>, run: F) -> std::process::ExitCode
where
    F: std::future::Future<Output = std::process::ExitCode>,
{
    init_tool_logging();
    if let Some(bin) = bin {
        // Before any thread starts: the harness finds the binary through this variable.
        std::env::set_var(serve::BIN_ENV, bin);
    }
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(run),
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

//! The TLS flags of every command that talks to a claims server (`lookup`, `leases`, `reconcile`,
//! `verify`): one struct flattened into each, so the names, env vars and help are the same
//! everywhere.
//!
//! Owns the flags only; reading and checking the files is `topology_claims_client::TlsFiles`.

use std::path::PathBuf;

use clap::Args;
use topology_claims::ClaimsError;
use topology_claims_client::{ClientTls, TlsFiles};

/// `--server` and the TLS flags: what every client command that talks to one claims server takes
/// (`lookup`, `leases`, `health`, `claim`, `release`, the sidecars).
#[derive(Args, Debug, Clone)]
pub struct ServerArgs {
    /// The claims server's URL: http://HOST:PORT, or https://HOST:PORT with --tls-ca.
    #[arg(
        long,
        env = "TOPOLOGY_CLAIMS_SERVER",
        default_value = "http://127.0.0.1:50051"
    )]
    pub server: String,

    #[command(flatten)]
    pub tls: TlsArgs,
}

#[derive(Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// CA bundle (PEM, one or more certificates) that the server's certificate must chain to.
    /// Required for an https:// --server, refused with http://. Default: none (plain text).
    #[arg(long, value_name = "PEM", env = "TOPOLOGY_CLAIMS_CLIENT_TLS_CA")]
    tls_ca: Option<PathBuf>,

    /// Client certificate (PEM: this client's certificate first, then any intermediates) for
    /// mutual TLS; needs --tls-key and --tls-ca. Default: none (no client certificate).
    #[arg(long, value_name = "PEM", env = "TOPOLOGY_CLAIMS_CLIENT_TLS_CERT")]
    tls_cert: Option<PathBuf>,

    /// Private key (PEM: PKCS#8, SEC1 or PKCS#1) of --tls-cert. Default: none.
    #[arg(long, value_name = "PEM", env = "TOPOLOGY_CLAIMS_CLIENT_TLS_KEY")]
    tls_key: Option<PathBuf>,

    /// Verify the server's certificate for this DNS name (also sent as SNI) instead of the
    /// --server URL's host, e.g. when the server is reached by IP address or through a tunnel.
    /// Default: the URL's host.
    #[arg(
        long,
        value_name = "NAME",
        env = "TOPOLOGY_CLAIMS_CLIENT_TLS_SERVER_NAME"
    )]
    tls_server_name: Option<String>,
}

impl TlsArgs {
    /// The TLS settings, read from their files; `None` if no TLS flag is set.
    pub fn load(&self) -> Result<Option<ClientTls>, ClaimsError> {
        TlsFiles {
            ca: self.tls_ca.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            server_name: self.tls_server_name.clone(),
        }
        .load()
    }
}

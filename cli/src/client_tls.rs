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
    /// The server certificate `url` presents (leaf first), read with one TLS handshake under
    /// these settings (`status`); `Ok(None)` for a plaintext `http://` URL.
    pub async fn peer_certificates(
        &self,
        url: &str,
    ) -> Result<Option<Vec<rustls::pki_types::CertificateDer<'static>>>, String> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
        let Some(rest) = url.strip_prefix("https://") else {
            return Ok(None);
        };
        let authority = rest.split('/').next().unwrap_or(rest);
        let host = match authority.rsplit_once(':') {
            Some((host, _)) => host.trim_start_matches('[').trim_end_matches(']'),
            None => authority,
        };
        let ca = self
            .tls_ca
            .as_ref()
            .ok_or("an https:// --server needs --tls-ca")?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in
            CertificateDer::pem_file_iter(ca).map_err(|e| format!("{}: {e}", ca.display()))?
        {
            let cert = cert.map_err(|e| format!("{}: {e}", ca.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("{}: {e}", ca.display()))?;
        }
        let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots);
        let mut config = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                let chain = CertificateDer::pem_file_iter(cert)
                    .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| format!("{}: {e}", cert.display()))?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| format!("{}: {e}", key.display()))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| e.to_string())?
            }
            _ => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        let name = self.tls_server_name.as_deref().unwrap_or(host).to_owned();
        let name = ServerName::try_from(name).map_err(|e| format!("server name: {e}"))?;
        let tcp = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            tokio::net::TcpStream::connect(authority),
        )
        .await
        .map_err(|_| format!("connecting to {authority}: timed out"))?
        .map_err(|e| format!("connecting to {authority}: {e}"))?;
        let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
        let tls = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            connector.connect(name, tcp),
        )
        .await
        .map_err(|_| format!("TLS handshake with {authority}: timed out"))?
        .map_err(|e| format!("TLS handshake with {authority}: {e}"))?;
        let (_, session) = tls.get_ref();
        Ok(Some(
            session
                .peer_certificates()
                .unwrap_or_default()
                .iter()
                .map(|c| c.clone().into_owned())
                .collect(),
        ))
    }

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

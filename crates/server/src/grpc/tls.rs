//! TLS for the server: the certificate, its key and the client CA bundle read from PEM files,
//! re-read on demand (`serve` calls [`ServerTls::reload`] on SIGHUP), and the caller's identity
//! read from the client certificate rustls has verified.
//!
//! A reload builds a complete new configuration first and swaps it in only when every file
//! parsed and the key matches the certificate: new handshakes use it, open connections keep
//! theirs, and a broken file leaves the old configuration serving. Client certificates are
//! verified against every root of the bundle (several regions, or old and new CA during a
//! rotation); a connection may also come without one, because health probes carry none (the
//! authorization table then allows it only `grpc.health.v1`).
//!
//! Owns certificates and handshakes' configuration; the rules of who may do what are
//! `crate::auth`'s.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

use crate::auth::{identify, Caller, IdentityFrom};
use topology_claims::error::ClaimsError;

/// Where the server's TLS material is (`--tls-cert`, `--tls-key`, `--tls-client-ca`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The CA bundle client certificates are verified against; `None`: no client certificates
    /// are asked for (every caller is then unauthenticated but health).
    pub client_ca: Option<PathBuf>,
}

/// When the loaded certificates expire (`notAfter`, unix seconds): the server's leaf, and the
/// earliest of the client CA bundle. For `topology_claims_tls_certificate_expiry_seconds`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Expiries {
    pub server: Option<i64>,
    pub client_ca: Option<i64>,
}

/// A certificate's `notAfter` as unix seconds; `None` if it does not parse.
fn not_after(cert: &CertificateDer<'_>) -> Option<i64> {
    x509_parser::parse_x509_certificate(cert.as_ref())
        .ok()
        .map(|(_, cert)| cert.validity().not_after.timestamp())
}

/// The live TLS configuration of a server, swappable while it runs.
pub struct ServerTls {
    files: TlsFiles,
    current: RwLock<Arc<ServerConfig>>,
    expiries: RwLock<Expiries>,
    pub identity_from: IdentityFrom,
    pub trust_domain: String,
    /// ALPN offers `http/1.1` beside `h2` (REST served).
    http1: bool,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .field("identity_from", &self.identity_from)
            .field("trust_domain", &self.trust_domain)
            .finish()
    }
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read the {what} {}: {e}", path.display()))
}

/// A complete server configuration from `files`, with its certificates' expiries, or what is
/// wrong with them.
fn load(files: &TlsFiles) -> Result<(ServerConfig, Expiries), String> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let cert_pem = read(&files.cert, "TLS certificate (--tls-cert)")?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: not a PEM certificate: {e}", files.cert.display()))?;
    if chain.is_empty() {
        return Err(format!("{}: no certificate in it", files.cert.display()));
    }
    let mut expiries = Expiries {
        server: not_after(&chain[0]),
        client_ca: None,
    };
    let key_pem = read(&files.key, "TLS key (--tls-key)")?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| format!("{}: not a PEM private key: {e}", files.key.display()))?;
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let pem = read(ca, "client CA bundle (--tls-client-ca)")?;
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert =
                    cert.map_err(|e| format!("{}: not a PEM certificate: {e}", ca.display()))?;
                if let Some(at) = not_after(&cert) {
                    expiries.client_ca = Some(expiries.client_ca.map_or(at, |seen| seen.min(at)));
                }
                roots
                    .add(cert)
                    .map_err(|e| format!("{}: not a CA certificate: {e}", ca.display()))?;
            }
            if roots.is_empty() {
                return Err(format!("{}: no certificate in it", ca.display()));
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| format!("{}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| {
        format!(
            "{} and {} do not make a usable certificate and key: {e}",
            files.cert.display(),
            files.key.display()
        )
    })?;
    config.alpn_protocols = alpn(false);
    Ok((config, expiries))
}

/// The ALPN protocols offered: `h2`, and `http/1.1` when REST is served.
fn alpn(http1: bool) -> Vec<Vec<u8>> {
    let mut protocols = vec![b"h2".to_vec()];
    if http1 {
        protocols.push(b"http/1.1".to_vec());
    }
    protocols
}

impl ServerTls {
    /// Reads `files`; fails naming the file that is wrong.
    pub fn new(
        files: TlsFiles,
        identity_from: IdentityFrom,
        trust_domain: String,
    ) -> Result<Self, ClaimsError> {
        let (config, expiries) =
            load(&files).map_err(|message| ClaimsError::Configuration { message })?;
        Ok(Self {
            files,
            current: RwLock::new(Arc::new(config)),
            expiries: RwLock::new(expiries),
            identity_from,
            trust_domain,
            http1: false,
        })
    }

    /// Offers `http/1.1` in ALPN beside `h2`, for REST clients that speak only HTTP/1.1.
    pub fn with_http1(mut self) -> Self {
        self.http1 = true;
        let mut config = (*self.current()).clone();
        config.alpn_protocols = alpn(true);
        self.current = RwLock::new(Arc::new(config));
        self
    }

    /// The configuration new handshakes use.
    pub fn current(&self) -> Arc<ServerConfig> {
        Arc::clone(&self.current.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Re-reads the files; on any error keeps the configuration it had and says why.
    pub fn reload(&self) -> Result<(), String> {
        let (mut config, expiries) = load(&self.files)?;
        config.alpn_protocols = alpn(self.http1);
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
        *self.expiries.write().unwrap_or_else(|p| p.into_inner()) = expiries;
        Ok(())
    }

    /// When the certificates in use expire.
    pub fn expiries(&self) -> Expiries {
        *self.expiries.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Who is on the other end of a finished handshake.
    pub fn caller(&self, peer_certificates: Option<&[CertificateDer<'_>]>) -> Caller {
        let Some(leaf) = peer_certificates.and_then(|chain| chain.first()) else {
            return Caller::NoCertificate;
        };
        match x509_parser::parse_x509_certificate(leaf.as_ref()) {
            Ok((_, cert)) => {
                let uris: Vec<String> = cert
                    .subject_alternative_name()
                    .ok()
                    .flatten()
                    .map(|san| {
                        san.value
                            .general_names
                            .iter()
                            .filter_map(|name| match name {
                                x509_parser::extensions::GeneralName::URI(uri) => {
                                    Some((*uri).to_owned())
                                }
                                _ => None,
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let cn = cert
                    .subject()
                    .iter_common_name()
                    .next()
                    .and_then(|cn| cn.as_str().ok())
                    .map(str::to_owned);
                identify(self.identity_from, &self.trust_domain, &uris, cn.as_deref())
            }
            Err(e) => Caller::Unidentified {
                why: format!("the client certificate cannot be read: {e}"),
            },
        }
    }
}

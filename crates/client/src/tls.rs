//! The client side of TLS to the claims service: which CAs to trust for the server's certificate,
//! the client certificate and key that say who this caller is (mutual TLS), and the name the
//! server's certificate is verified under. Also the one place a server URL becomes a tonic
//! `Endpoint` ([`server_endpoint`]), so the sidecars' `ClaimsClient` and the operator commands
//! apply the same rules: `http://` is plain text, `https://` needs a CA bundle, and TLS settings
//! with an `http://` URL are a configuration error rather than silently unused.
//!
//! Owns reading and sanity-checking the PEM files. Must not hold the server side of TLS or any
//! authorization (that is `grpc/` and `auth`).

use std::fmt;
use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use topology_claims::error::{error_chain, ClaimsError};

/// TLS settings for an `https://` claims server. Cheap to clone; `Debug` shows where the PEM came
/// from, never the private key.
#[derive(Clone)]
pub struct ClientTls {
    /// One or more CA certificates (PEM); the server's certificate must chain to one of them.
    ca: Certificate,
    /// Where `ca` came from, for error messages: a path or "PEM in memory".
    ca_source: String,
    /// The client certificate (PEM, leaf first, then any intermediates) and its private key.
    identity: Option<Identity>,
    /// Where the identity came from, for error messages.
    identity_source: Option<String>,
    /// Verify the server's certificate for this name (and send it as SNI) instead of the URL's
    /// host: for a server reached by IP or through a tunnel.
    server_name: Option<String>,
}

const IN_MEMORY: &str = "PEM in memory";

fn configuration(message: String) -> ClaimsError {
    ClaimsError::Configuration { message }
}

/// Whether `pem` holds at least one PEM block whose label ends with `label` (`CERTIFICATE`,
/// `PRIVATE KEY`: PKCS#8, `RSA PRIVATE KEY` and `EC PRIVATE KEY` all end so). rustls skips what it
/// cannot parse, so a CA file without a certificate would otherwise fail every handshake later
/// with "unknown issuer" instead of naming the file now.
fn has_pem_block(pem: &[u8], label: &str) -> bool {
    let text = String::from_utf8_lossy(pem);
    text.lines().any(|line| {
        line.trim_end()
            .strip_prefix("-----BEGIN ")
            .and_then(|rest| rest.strip_suffix("-----"))
            .is_some_and(|found| found.ends_with(label))
    })
}

fn check_pem(pem: &[u8], label: &str, what: &str, source: &str) -> Result<(), ClaimsError> {
    if has_pem_block(pem, label) {
        Ok(())
    } else {
        Err(configuration(format!(
            "{what} {source} holds no PEM {label} block (-----BEGIN {label}-----)"
        )))
    }
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, ClaimsError> {
    std::fs::read(path)
        .map_err(|e| configuration(format!("cannot read {what} {}: {e}", path.display())))
}

impl ClientTls {
    /// Trusts the CA certificates in `ca_pem` (PEM, one or more) for the server's certificate;
    /// no client certificate.
    pub fn new(ca_pem: impl AsRef<[u8]>) -> Result<Self, ClaimsError> {
        Self::with_ca_source(ca_pem.as_ref(), IN_MEMORY.to_owned())
    }

    fn with_ca_source(ca_pem: &[u8], ca_source: String) -> Result<Self, ClaimsError> {
        check_pem(ca_pem, "CERTIFICATE", "the TLS CA bundle", &ca_source)?;
        Ok(Self {
            ca: Certificate::from_pem(ca_pem),
            ca_source,
            identity: None,
            identity_source: None,
            server_name: None,
        })
    }

    /// Presents `cert_pem` (leaf first, then any intermediates) with its private key `key_pem`
    /// to the server: mutual TLS.
    pub fn with_identity(
        self,
        cert_pem: impl AsRef<[u8]>,
        key_pem: impl AsRef<[u8]>,
    ) -> Result<Self, ClaimsError> {
        self.with_identity_from(cert_pem.as_ref(), IN_MEMORY, key_pem.as_ref(), IN_MEMORY)
    }

    fn with_identity_from(
        self,
        cert_pem: &[u8],
        cert_source: &str,
        key_pem: &[u8],
        key_source: &str,
    ) -> Result<Self, ClaimsError> {
        check_pem(
            cert_pem,
            "CERTIFICATE",
            "the TLS client certificate",
            cert_source,
        )?;
        check_pem(key_pem, "PRIVATE KEY", "the TLS client key", key_source)?;
        let identity_source = if cert_source == key_source {
            format!("client certificate and key ({cert_source})")
        } else {
            format!("client certificate {cert_source} with key {key_source}")
        };
        Ok(Self {
            identity: Some(Identity::from_pem(cert_pem, key_pem)),
            identity_source: Some(identity_source),
            ..self
        })
    }

    /// Verifies the server's certificate for `name` (and sends it as SNI) instead of the URL's
    /// host.
    pub fn with_server_name(self, name: impl Into<String>) -> Self {
        Self {
            server_name: Some(name.into()),
            ..self
        }
    }

    /// Reads the CA bundle at `ca` and, for mutual TLS, the client certificate and key at
    /// `cert_and_key`. An error names the one file that could not be read or holds no PEM block
    /// of the expected kind.
    pub fn from_files(
        ca: &Path,
        cert_and_key: Option<(&Path, &Path)>,
    ) -> Result<Self, ClaimsError> {
        let what = "the TLS CA bundle";
        let tls = Self::with_ca_source(&read(ca, what)?, ca.display().to_string())?;
        match cert_and_key {
            None => Ok(tls),
            Some((cert, key)) => {
                let cert_pem = read(cert, "the TLS client certificate")?;
                let key_pem = read(key, "the TLS client key")?;
                tls.with_identity_from(
                    &cert_pem,
                    &cert.display().to_string(),
                    &key_pem,
                    &key.display().to_string(),
                )
            }
        }
    }

    /// Whether a client certificate is presented (mutual TLS).
    pub fn has_identity(&self) -> bool {
        self.identity.is_some()
    }

    pub fn server_name(&self) -> Option<&str> {
        self.server_name.as_deref()
    }

    fn tonic_config(&self) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new().ca_certificate(self.ca.clone());
        if let Some(identity) = &self.identity {
            config = config.identity(identity.clone());
        }
        if let Some(name) = &self.server_name {
            config = config.domain_name(name.clone());
        }
        config
    }

    /// What the settings were read from, for error messages.
    fn sources(&self) -> String {
        let mut text = format!("CA bundle {}", self.ca_source);
        if let Some(identity) = &self.identity_source {
            text.push_str(", ");
            text.push_str(identity);
        }
        text
    }
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca", &self.ca_source)
            .field("identity", &self.identity_source)
            .field("server_name", &self.server_name)
            .finish()
    }
}

/// Paths of the TLS files, as flags and config files name them; [`TlsFiles::load`] reads them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub server_name: Option<String>,
}

impl TlsFiles {
    /// `None` when nothing is set (plain `http://`). A certificate without its key (or the other
    /// way round), or either or a server name without a CA bundle, is a configuration error.
    pub fn load(&self) -> Result<Option<ClientTls>, ClaimsError> {
        let ca =
            match (&self.ca, &self.cert, &self.key, &self.server_name) {
                (None, None, None, None) => return Ok(None),
                (Some(ca), ..) => ca,
                (None, ..) => return Err(configuration(
                    "a TLS client certificate, key or server name is set without a CA bundle to \
                     verify the server with; set the CA bundle too (--tls-ca)"
                        .to_owned(),
                )),
            };
        let cert_and_key = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
            (None, None) => None,
            (Some(_), None) => {
                return Err(configuration(
                    "a TLS client certificate is set without its key (--tls-key)".to_owned(),
                ))
            }
            (None, Some(_)) => {
                return Err(configuration(
                    "a TLS client key is set without its certificate (--tls-cert)".to_owned(),
                ))
            }
        };
        let tls = ClientTls::from_files(ca, cert_and_key)?;
        Ok(Some(match &self.server_name {
            Some(name) => tls.with_server_name(name.clone()),
            None => tls,
        }))
    }
}

/// The endpoint of the claims server at `url`: `http://HOST:PORT` in plain text, or
/// `https://HOST:PORT` over TLS with `tls`. Timeouts and keep-alives are the caller's.
pub fn server_endpoint(url: &str, tls: Option<&ClientTls>) -> Result<Endpoint, ClaimsError> {
    let Some((scheme, _)) = url.split_once("://") else {
        // `HOST:PORT` would parse, and then fail every call with "scheme is missing".
        return Err(configuration(format!(
            "bad claims server URL {url:?}: the scheme is missing; use http://HOST:PORT (or \
             https://HOST:PORT)"
        )));
    };
    let tls = match (scheme.to_ascii_lowercase().as_str(), tls) {
        ("http", None) => None,
        ("https", Some(tls)) => Some(tls),
        ("https", None) => {
            return Err(configuration(format!(
                "the claims server URL {url:?} is https:// but no TLS CA bundle is configured to \
                 verify the server with (--tls-ca, TOPOLOGY_CLAIMS_CLIENT_TLS_CA)"
            )))
        }
        ("http", Some(_)) => {
            return Err(configuration(format!(
                "TLS is configured but the claims server URL {url:?} is plain-text http://; use \
                 https://HOST:PORT, or drop the TLS settings"
            )))
        }
        _ => {
            return Err(configuration(format!(
                "bad claims server URL {url:?}: unsupported scheme {scheme:?}; use \
                 http://HOST:PORT or https://HOST:PORT"
            )))
        }
    };
    let endpoint = Endpoint::from_shared(url.to_owned()).map_err(|e| {
        configuration(format!(
            "bad claims server URL {url:?}: {}",
            error_chain(&e)
        ))
    })?;
    match tls {
        None => Ok(endpoint),
        Some(tls) => endpoint.tls_config(tls.tonic_config()).map_err(|e| {
            configuration(format!(
                "bad TLS settings ({}) for {url}: {}",
                tls.sources(),
                error_chain(&e)
            ))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    const KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n";

    fn message(error: ClaimsError) -> String {
        match error {
            ClaimsError::Configuration { message } => message,
            other => panic!("expected a configuration error, got {other:?}"),
        }
    }

    #[test]
    fn https_without_a_ca_bundle_is_a_configuration_error() {
        let error = message(server_endpoint("https://127.0.0.1:1", None).unwrap_err());
        assert!(error.contains("no TLS CA bundle"), "{error}");
    }

    #[test]
    fn tls_settings_with_a_plain_text_url_are_a_configuration_error() {
        let tls = ClientTls::new(CERT).unwrap();
        let error = message(server_endpoint("http://127.0.0.1:1", Some(&tls)).unwrap_err());
        assert!(error.contains("use https://HOST:PORT"), "{error}");
    }

    #[test]
    fn a_url_without_a_scheme_or_with_another_scheme_is_refused() {
        let error = message(server_endpoint("127.0.0.1:1", None).unwrap_err());
        assert_eq!(error.matches("scheme is missing").count(), 1, "{error}");
        let error = message(server_endpoint("ftp://127.0.0.1:1", None).unwrap_err());
        assert!(error.contains("unsupported scheme \"ftp\""), "{error}");
    }

    #[test]
    fn plain_http_needs_no_tls() {
        server_endpoint("http://127.0.0.1:1", None).unwrap();
    }

    #[test]
    fn a_ca_bundle_without_a_certificate_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, KEY).unwrap();
        let error = message(ClientTls::from_files(&ca, None).unwrap_err());
        assert_eq!(
            error.matches(&*ca.display().to_string()).count(),
            1,
            "{error}"
        );
        assert!(error.contains("no PEM CERTIFICATE block"), "{error}");
    }

    #[test]
    fn a_missing_file_is_named_once_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, CERT).unwrap();
        let cert = dir.path().join("cell.pem");
        std::fs::write(&cert, CERT).unwrap();
        let key = dir.path().join("missing-key.pem");
        let error = message(ClientTls::from_files(&ca, Some((&cert, &key))).unwrap_err());
        assert!(
            error.starts_with("cannot read the TLS client key"),
            "{error}"
        );
        assert_eq!(error.matches("missing-key.pem").count(), 1, "{error}");
        assert!(
            !error.contains("cell.pem"),
            "only the failing file: {error}"
        );
    }

    #[test]
    fn a_certificate_without_its_key_or_a_ca_is_refused() {
        let files = TlsFiles {
            ca: Some("ca.pem".into()),
            cert: Some("cell.pem".into()),
            ..TlsFiles::default()
        };
        assert!(message(files.load().unwrap_err()).contains("without its key"));
        let files = TlsFiles {
            cert: Some("cell.pem".into()),
            key: Some("cell-key.pem".into()),
            ..TlsFiles::default()
        };
        assert!(message(files.load().unwrap_err()).contains("without a CA bundle"));
        assert!(TlsFiles::default().load().unwrap().is_none());
    }

    #[test]
    fn debug_never_shows_the_key() {
        let tls = ClientTls::new(CERT)
            .unwrap()
            .with_identity(CERT, KEY)
            .unwrap();
        let text = format!("{tls:?}");
        assert!(!text.contains("PRIVATE KEY"), "{text}");
        assert!(tls.has_identity());
    }
}

//! TLS to PostgreSQL, as libpq's URL parameters say it: `sslmode` (`disable`, `prefer`,
//! `require`, `verify-ca`, `verify-full`), `sslrootcert` (the CA bundle, PEM), `sslcert` and
//! `sslkey` (a client certificate), through rustls on aws-lc-rs (the TLS stack the rest of the
//! binary uses) and `tokio-postgres-rustls` (which adds channel binding, SCRAM-SHA-256-PLUS).
//!
//! The semantics are libpq's (docs/backends/postgres.md, "TLS"): `prefer` (the default) and
//! `require` encrypt without checking the server's certificate, unless `sslrootcert` is given
//! (then `require` checks it as `verify-ca` does); `verify-ca` checks the chain to
//! `sslrootcert`; `verify-full` also checks that the certificate names the host.
//!
//! Owns the parameters and the rustls configuration; the connections are the pool's.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use topology_claims::ClaimsError;

/// libpq's `sslmode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    /// Encrypt if the server offers TLS, else plaintext; no certificate check (libpq's default).
    #[default]
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(text: &str) -> Result<Self, ClaimsError> {
        Ok(match text {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => {
                return Err(config(format!(
                    "sslmode={other:?}: use disable, prefer, require, verify-ca or verify-full"
                )))
            }
        })
    }

    /// What tokio-postgres negotiates: TLS attempted (`Prefer`) or insisted on (`Require`).
    pub(crate) fn driver_mode(self) -> tokio_postgres::config::SslMode {
        match self {
            Self::Disable => tokio_postgres::config::SslMode::Disable,
            Self::Prefer => tokio_postgres::config::SslMode::Prefer,
            Self::Require | Self::VerifyCa | Self::VerifyFull => {
                tokio_postgres::config::SslMode::Require
            }
        }
    }
}

/// The TLS parameters of a store URL.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsParams {
    pub mode: SslMode,
    pub root_cert: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

fn config(message: String) -> ClaimsError {
    ClaimsError::Configuration {
        message: format!("PostgreSQL TLS: {message}"),
    }
}

/// Takes the TLS parameters out of a `postgres://` URL's query (the driver knows only some of
/// them, and not `verify-ca` / `verify-full`): the URL without them, and the parameters.
pub fn split_url(url: &str) -> Result<(String, TlsParams), ClaimsError> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), TlsParams::default()));
    };
    let mut params = TlsParams::default();
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let path = || Some(PathBuf::from(percent_decode(value)));
        match key {
            "sslmode" => params.mode = SslMode::parse(&percent_decode(value))?,
            "sslrootcert" => params.root_cert = path(),
            "sslcert" => params.client_cert = path(),
            "sslkey" => params.client_key = path(),
            _ => kept.push(pair),
        }
    }
    if params.client_cert.is_some() != params.client_key.is_some() {
        return Err(config("sslcert and sslkey go together".into()));
    }
    if params.mode == SslMode::Disable
        && (params.root_cert.is_some() || params.client_cert.is_some())
    {
        return Err(config(
            "sslrootcert / sslcert are given with sslmode=disable".into(),
        ));
    }
    if matches!(params.mode, SslMode::VerifyCa | SslMode::VerifyFull) && params.root_cert.is_none()
    {
        return Err(config(
            "sslmode=verify-ca and verify-full need sslrootcert=PATH (the CA bundle, PEM)".into(),
        ));
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, params))
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied(),
            bytes.get(i + 2).copied(),
        ) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap() * 16 + hex(l).unwrap()) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The connector of `params` (`None` for `sslmode=disable`), its files read and checked now.
pub fn connector(
    params: &TlsParams,
) -> Result<Option<tokio_postgres_rustls::MakeRustlsConnect>, ClaimsError> {
    if params.mode == SslMode::Disable {
        return Ok(None);
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| config(e.to_string()))?;
    let verifier: Arc<dyn ServerCertVerifier> = match &params.root_cert {
        None => Arc::new(EncryptOnly(provider)),
        Some(path) => {
            let pem = std::fs::read(path)
                .map_err(|e| config(format!("sslrootcert {}: {e}", path.display())))?;
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| {
                    config(format!(
                        "sslrootcert {}: not PEM certificates: {e}",
                        path.display()
                    ))
                })?;
                roots
                    .add(cert)
                    .map_err(|e| config(format!("sslrootcert {}: {e}", path.display())))?;
            }
            if roots.is_empty() {
                return Err(config(format!(
                    "sslrootcert {} holds no certificate",
                    path.display()
                )));
            }
            let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| config(format!("sslrootcert {}: {e}", path.display())))?;
            if params.mode == SslMode::VerifyFull {
                webpki
            } else {
                Arc::new(ChainOnly(webpki))
            }
        }
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match (&params.client_cert, &params.client_key) {
        (Some(cert), Some(key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                .and_then(|certs| certs.collect())
                .map_err(|e| config(format!("sslcert {}: {e}", cert.display())))?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| config(format!("sslkey {}: {e}", key.display())))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| config(format!("sslcert / sslkey: {e}")))?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(Some(tokio_postgres_rustls::MakeRustlsConnect::new(config)))
}

/// `prefer` / `require` without `sslrootcert`: the connection is encrypted and the handshake's
/// signatures are checked, the certificate is not (libpq's semantics: protects against
/// eavesdropping, not against an active attacker; use verify-full for that).
#[derive(Debug)]
struct EncryptOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca` (and `require` with `sslrootcert`): the chain to the roots is checked, the host
/// name is not.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tls_parameters_leave_the_url_and_the_others_stay() {
        let (url, params) = split_url(
            "postgres://u@h:5432/d?sslmode=verify-full&application_name=x&sslrootcert=%2Fca.pem",
        )
        .unwrap();
        assert_eq!(url, "postgres://u@h:5432/d?application_name=x");
        assert_eq!(params.mode, SslMode::VerifyFull);
        assert_eq!(params.root_cert, Some(PathBuf::from("/ca.pem")));
        let (url, params) = split_url("postgres://u@h/d").unwrap();
        assert_eq!(
            (url.as_str(), params.mode),
            ("postgres://u@h/d", SslMode::Prefer)
        );
    }

    #[test]
    fn impossible_combinations_are_refused_naming_the_parameter() {
        for (url, says) in [
            ("postgres://h/d?sslmode=verify-ca", "sslrootcert"),
            ("postgres://h/d?sslmode=allow", "sslmode"),
            ("postgres://h/d?sslmode=require&sslcert=/c.pem", "sslkey"),
            (
                "postgres://h/d?sslmode=disable&sslrootcert=/ca.pem",
                "disable",
            ),
        ] {
            let error = split_url(url).unwrap_err().to_string();
            assert!(error.contains(says), "{url}: {error}");
        }
    }
}

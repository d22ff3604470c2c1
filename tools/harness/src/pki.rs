//! A development PKI for tests and tools, made by the product binary's own
//! `topology-claims certs ca|server|client` (so there is one PKI code path): a CA, a server
//! certificate for `localhost` and `127.0.0.1`, and client certificates whose URI SAN is
//! `spiffe://topology-claims/ROLE/NAME` (docs/security.md).
//!
//! Owns the files in its directory and the `serve` flags and client configuration that use
//! them; must not build certificates itself.

use std::path::{Path, PathBuf};

use topology_claims_client::ClientTls;

use crate::serve::{clean_command, product_binary};

/// A CA and a server certificate in `dir`; client certificates are issued on demand.
pub struct DevPki {
    exe: PathBuf,
    dir: PathBuf,
}

/// A client certificate and its key.
#[derive(Clone, Debug)]
pub struct ClientCert {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl DevPki {
    /// Makes the CA and the server certificate (DNS `localhost`, IP `127.0.0.1`) in `dir`
    /// (created; files already there are replaced).
    pub fn create(dir: &Path) -> Result<DevPki, String> {
        let pki = DevPki {
            exe: product_binary()?,
            dir: dir.to_path_buf(),
        };
        pki.certs(&["ca"])?;
        pki.certs(&["server", "--dns", "localhost", "--ip", "127.0.0.1"])?;
        Ok(pki)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA certificate (the clients' trust anchor and the server's client CA).
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// `--tls-cert`, `--tls-key`, `--tls-client-ca` of `serve`: TLS with client certificates.
    pub fn serve_args(&self) -> Vec<String> {
        let path = |name: &str| self.dir.join(name).display().to_string();
        vec![
            "--tls-cert".to_owned(),
            path("server.pem"),
            "--tls-key".to_owned(),
            path("server-key.pem"),
            "--tls-client-ca".to_owned(),
            path("ca.pem"),
        ]
    }

    /// Issues the client certificate `spiffe://topology-claims/ROLE/NAME` (`role`: `cell`,
    /// `router`, `admin`).
    pub fn issue_client(&self, role: &str, name: &str) -> Result<ClientCert, String> {
        self.certs(&["client", "--role", role, "--name", name])?;
        Ok(ClientCert {
            cert: self.dir.join(format!("{role}-{name}.pem")),
            key: self.dir.join(format!("{role}-{name}-key.pem")),
        })
    }

    /// A client's TLS configuration with the certificate of `role`/`name` (issued now),
    /// trusting this PKI's CA.
    pub fn client_tls(&self, role: &str, name: &str) -> Result<ClientTls, String> {
        let pair = self.issue_client(role, name)?;
        ClientTls::from_files(&self.ca(), Some((&pair.cert, &pair.key)))
            .map_err(|e| format!("loading the certificate of {role}/{name}: {e}"))
    }

    /// `topology-claims certs SUBCOMMAND --dir DIR --force ARGS…`.
    fn certs(&self, args: &[&str]) -> Result<(), String> {
        let dir = self.dir.display().to_string();
        let mut full = vec!["certs", args[0], "--dir", &dir, "--force"];
        full.extend_from_slice(&args[1..]);
        let output = clean_command(&self.exe, &full)
            .output()
            .map_err(|e| format!("cannot run {} certs: {e}", self.exe.display()))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "`topology-claims {}` failed ({}): {}",
                full.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pki_has_a_ca_a_server_certificate_and_client_certificates_on_demand() {
        if product_binary().is_err() && !crate::in_ci() {
            eprintln!("skipped: the topology-claims binary is not built");
            return;
        }
        let dir = std::env::temp_dir().join(format!(
            "topology-claims-pki-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        let pki = DevPki::create(&dir).unwrap();
        for arg in pki.serve_args().iter().filter(|a| !a.starts_with("--")) {
            assert!(Path::new(arg).is_file(), "{arg}");
        }
        let tls = pki.client_tls("cell", "cell-1").unwrap();
        assert!(tls.has_identity());
        assert!(dir.join("cell-cell-1-key.pem").is_file());
        assert!(pki.issue_client("cell", "../escape").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

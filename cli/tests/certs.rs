//! `topology-claims certs` through the real binary: the CA, server and client certificates it
//! writes are what `openssl` and a TLS stack expect (issuer, EKU, the one SPIFFE URI SAN, chain
//! verification), keys are private, nothing is overwritten without --force; and the clients'
//! `https://` side (`ClaimsClient`, the health client, the `lookup` command's --tls-* flags)
//! reaches a mutual-TLS server made of these certificates, and is refused without them.
//!
//! The server here is tonic's own `ServerTlsConfig`, in the test only: what is under test is the
//! client side and the certificates, not `serve`.

mod common;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use topology_claims::memory::MemoryClaimStore;
use topology_claims::{ClaimKey, ClaimType, ClaimsError};
use topology_claims_client::{server_endpoint, ClaimsClient, ClientConfig, ClientTls};
use topology_claims_proto::pb::claims_service_server::ClaimsServiceServer;
use topology_claims_server::grpc::service::{ClaimsServiceImpl, ServiceConfig};

fn certs(dir: &Path, args: &[&str]) -> std::process::Output {
    let dir_text = dir.to_str().expect("a UTF-8 temp dir");
    let output = common::run(dir, &[&["certs"], args, &["--dir", dir_text]].concat());
    eprintln!(
        "certs {args:?}: {}\n{}{}",
        output.status,
        common::text(&output.stdout),
        common::text(&output.stderr)
    );
    output
}

fn certs_ok(dir: &Path, args: &[&str]) -> String {
    let output = certs(dir, args);
    assert!(output.status.success(), "certs {args:?} failed");
    common::text(&output.stdout)
}

/// A CA, a `localhost` server certificate and the certificate of cell `cell-a`, in `dir`.
fn development_pki(dir: &Path) {
    certs_ok(dir, &["ca"]);
    certs_ok(dir, &["server", "--name", "server"]);
    certs_ok(dir, &["client", "--role", "cell", "--name", "cell-a"]);
}

/// `openssl`, which this test's checks are written against. A machine without it skips those
/// checks, except in CI, where skipping would pass without testing.
fn openssl() -> Option<Command> {
    let present = Command::new("openssl")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if present {
        return Some(Command::new("openssl"));
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "openssl is not installed; CI must run the certificate checks"
    );
    eprintln!("openssl is not installed: skipping the openssl checks");
    None
}

fn openssl_text(cert: &Path) -> Option<String> {
    let output = openssl()?
        .args(["x509", "-noout", "-text", "-in"])
        .arg(cert)
        .output()
        .expect("run openssl x509");
    assert!(output.status.success(), "{}", common::text(&output.stderr));
    Some(common::text(&output.stdout))
}

/// `openssl verify` of `cert` against `DIR/ca.pem` for `purpose` (sslclient, sslserver).
fn openssl_verify(dir: &Path, cert: &str, purpose: &str) {
    let Some(mut command) = openssl() else { return };
    let output = command
        .args(["verify", "-purpose", purpose, "-CAfile", "ca.pem", cert])
        .current_dir(dir)
        .output()
        .expect("run openssl verify");
    let stdout = common::text(&output.stdout);
    assert!(
        output.status.success() && stdout.contains(&format!("{cert}: OK")),
        "openssl verify {cert}: {stdout}{}",
        common::text(&output.stderr)
    );
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn ca_server_and_cell_certificates_are_written_with_private_keys() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = certs_ok(d, &["ca"]);
    assert!(
        out.contains(&format!("wrote {}", d.join("ca.pem").display())),
        "{out}"
    );
    assert!(out.contains("ca-key.pem"), "{out}");
    let out = certs_ok(
        d,
        &[
            "server",
            "--name",
            "server",
            "--dns",
            "localhost",
            "--dns",
            "claims.internal",
        ],
    );
    assert!(out.contains("DNS:claims.internal"), "{out}");
    let out = certs_ok(d, &["client", "--role", "cell", "--name", "cell-a"]);
    assert!(
        out.contains("spiffe://topology-claims/cell/cell-a"),
        "{out}"
    );
    for (cert, key) in [
        ("ca.pem", "ca-key.pem"),
        ("server.pem", "server-key.pem"),
        ("cell-cell-a.pem", "cell-cell-a-key.pem"),
    ] {
        let cert_text = std::fs::read_to_string(d.join(cert)).unwrap();
        assert!(
            cert_text.starts_with("-----BEGIN CERTIFICATE-----"),
            "{cert}"
        );
        let key_text = std::fs::read_to_string(d.join(key)).unwrap();
        assert!(key_text.starts_with("-----BEGIN PRIVATE KEY-----"), "{key}");
        assert_eq!(
            mode(&d.join(key)),
            0o600,
            "{key} is readable by its owner only"
        );
    }
}

#[test]
fn openssl_sees_the_spiffe_identity_the_usages_and_the_issuer() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    development_pki(d);
    certs_ok(
        d,
        &[
            "client",
            "--role",
            "router",
            "--name",
            "edge-1",
            "--trust-domain",
            "claims.example.com",
        ],
    );

    let Some(cell) = openssl_text(&d.join("cell-cell-a.pem")) else {
        return;
    };
    assert!(
        cell.contains("URI:spiffe://topology-claims/cell/cell-a"),
        "{cell}"
    );
    assert_eq!(
        cell.matches("URI:").count(),
        1,
        "exactly one URI SAN: {cell}"
    );
    assert!(!cell.contains("DNS:"), "no other SAN: {cell}");
    assert!(cell.contains("TLS Web Client Authentication"), "{cell}");
    assert!(!cell.contains("TLS Web Server Authentication"), "{cell}");
    assert!(cell.contains("CA:FALSE"), "{cell}");
    let issuer = cell
        .lines()
        .find(|line| line.trim_start().starts_with("Issuer:"))
        .expect("an Issuer line");
    assert!(
        issuer.contains("topology-claims development CA"),
        "{issuer}"
    );

    let server = openssl_text(&d.join("server.pem")).unwrap();
    assert!(server.contains("DNS:localhost"), "{server}");
    assert!(server.contains("IP Address:127.0.0.1"), "{server}");
    assert!(server.contains("TLS Web Server Authentication"), "{server}");
    assert!(
        !server.contains("TLS Web Client Authentication"),
        "{server}"
    );

    let ca = openssl_text(&d.join("ca.pem")).unwrap();
    assert!(ca.contains("CA:TRUE"), "{ca}");
    assert!(ca.contains("Certificate Sign"), "{ca}");
    assert!(ca.contains("URI:spiffe://topology-claims"), "{ca}");

    let router = openssl_text(&d.join("router-edge-1.pem")).unwrap();
    assert!(
        router.contains("URI:spiffe://claims.example.com/router/edge-1"),
        "{router}"
    );

    openssl_verify(d, "cell-cell-a.pem", "sslclient");
    openssl_verify(d, "router-edge-1.pem", "sslclient");
    openssl_verify(d, "server.pem", "sslserver");
}

#[test]
fn existing_files_are_not_overwritten_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    development_pki(d);
    let ca_before = std::fs::read(d.join("ca.pem")).unwrap();
    let cell_before = std::fs::read(d.join("cell-cell-a.pem")).unwrap();

    let output = certs(d, &["ca"]);
    assert_eq!(output.status.code(), Some(1));
    let err = common::text(&output.stderr);
    assert!(
        err.contains("ca.pem exists") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(std::fs::read(d.join("ca.pem")).unwrap(), ca_before);

    let output = certs(d, &["client", "--role", "cell", "--name", "cell-a"]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        std::fs::read(d.join("cell-cell-a.pem")).unwrap(),
        cell_before
    );

    certs_ok(d, &["ca", "--force"]);
    assert_ne!(
        std::fs::read(d.join("ca.pem")).unwrap(),
        ca_before,
        "--force replaces"
    );
    assert_eq!(mode(&d.join("ca-key.pem")), 0o600);
}

#[test]
fn a_certificate_without_a_ca_in_the_directory_names_the_missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let output = certs(dir.path(), &["client", "--role", "admin", "--name", "ops"]);
    assert_eq!(output.status.code(), Some(1));
    let err = common::text(&output.stderr);
    assert!(err.contains("ca.pem") && err.contains("certs ca"), "{err}");
    assert!(
        !dir.path().join("admin-ops-key.pem").exists(),
        "nothing half-written"
    );
}

#[test]
fn bad_names_and_roles_are_refused_by_the_flags() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["client", "--role", "cell", "--name", "../etc"][..],
        &["client", "--role", "operator", "--name", "a"],
        &["ca", "--trust-domain", "Not/A/Domain"],
        &["server", "--name", "ca"],
    ] {
        let output = certs(dir.path(), args);
        assert_eq!(output.status.code(), Some(2), "clap refuses {args:?}");
    }
}

/// A mutual-TLS server in this test's runtime: tonic's `ServerTlsConfig` with the `server`
/// certificate and client certificates required from `DIR/ca.pem`, serving grpc.health.v1 and
/// the claims service over an empty in-memory store.
async fn mtls_server(dir: &Path) -> SocketAddr {
    let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(
            read("server.pem"),
            read("server-key.pem"),
        ))
        .client_ca_root(Certificate::from_pem(read("ca.pem")));
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let claims = ClaimsServiceServer::new(ClaimsServiceImpl::new(
        Arc::new(MemoryClaimStore::new()),
        ServiceConfig::default(),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = Server::builder()
        .tls_config(tls)
        .expect("the server's TLS settings")
        .add_service(health)
        .add_service(claims)
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
    tokio::spawn(async move { server.await.expect("the test's TLS server") });
    addr
}

fn cell_tls(dir: &Path) -> ClientTls {
    ClientTls::from_files(
        &dir.join("ca.pem"),
        Some((
            &dir.join("cell-cell-a.pem"),
            &dir.join("cell-cell-a-key.pem"),
        )),
    )
    .expect("the cell's TLS files")
}

fn quick(tls: Option<ClientTls>) -> ClientConfig {
    ClientConfig {
        max_attempts: 1,
        tls,
        ..ClientConfig::default()
    }
}

fn missing_claim() -> ClaimKey {
    ClaimKey::new(ClaimType::Email, "nobody@example.com")
}

#[tokio::test]
async fn clients_with_the_ca_and_a_cell_certificate_reach_a_mutual_tls_server() {
    let dir = tempfile::tempdir().unwrap();
    development_pki(dir.path());
    let addr = mtls_server(dir.path()).await;
    let url = format!("https://localhost:{}", addr.port());

    // grpc.health.v1 on a channel from the same endpoint rules the operator commands use.
    let channel = server_endpoint(&url, Some(&cell_tls(dir.path())))
        .unwrap()
        .connect()
        .await
        .expect("a TLS connection with the CA and the cell's certificate");
    let health = HealthClient::new(channel)
        .check(HealthCheckRequest::default())
        .await
        .expect("a health answer over TLS");
    assert_eq!(health.get_ref().status, ServingStatus::Serving as i32);

    // The cell's client: the server answered (not found), so TLS and the identity were accepted.
    let client = ClaimsClient::connect_lazy(&url, quick(Some(cell_tls(dir.path())))).unwrap();
    match client.lookup_claim(&missing_claim()).await {
        Err(ClaimsError::ClaimNotFound { .. }) => {}
        other => panic!("expected ClaimNotFound over TLS, got {other:?}"),
    }

    // By IP address, verifying the certificate for its DNS name instead.
    let by_ip = format!("https://{addr}");
    let tls = cell_tls(dir.path()).with_server_name("localhost");
    let client = ClaimsClient::connect_lazy(&by_ip, quick(Some(tls))).unwrap();
    assert!(matches!(
        client.lookup_claim(&missing_claim()).await,
        Err(ClaimsError::ClaimNotFound { .. })
    ));
}

#[tokio::test]
async fn clients_without_the_ca_or_without_a_certificate_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    development_pki(dir.path());
    let addr = mtls_server(dir.path()).await;
    let url = format!("https://localhost:{}", addr.port());

    // No CA: a configuration error before any connection.
    match ClaimsClient::connect_lazy(&url, quick(None)) {
        Err(ClaimsError::Configuration { message }) => {
            assert!(message.contains("no TLS CA bundle"), "{message}")
        }
        other => panic!("expected a configuration error, got {other:?}"),
    }

    // Another CA: the server's certificate is not trusted.
    let other = tempfile::tempdir().unwrap();
    certs_ok(other.path(), &["ca"]);
    let stranger = ClientTls::from_files(&other.path().join("ca.pem"), None).unwrap();
    let client = ClaimsClient::connect_lazy(&url, quick(Some(stranger))).unwrap();
    match client.lookup_claim(&missing_claim()).await {
        Err(ClaimsError::ServerUnavailable { message }) => {
            assert!(message.contains("UnknownIssuer"), "{message}")
        }
        other => panic!("expected the server's certificate refused, got {other:?}"),
    }

    // The right CA but no client certificate: the server refuses the handshake.
    let anonymous = ClientTls::from_files(&dir.path().join("ca.pem"), None).unwrap();
    let client = ClaimsClient::connect_lazy(&url, quick(Some(anonymous))).unwrap();
    match client.lookup_claim(&missing_claim()).await {
        Err(ClaimsError::ServerUnavailable { .. }) => {}
        other => panic!("expected the connection refused without a certificate, got {other:?}"),
    }
}

fn lookup(dir: &Path, server: &str, tls: &[&str]) -> std::process::Output {
    let args = [
        &[
            "lookup",
            "--server",
            server,
            "--type",
            "email",
            "--value",
            "nobody@example.com",
        ][..],
        tls,
    ]
    .concat();
    common::run(dir, &args)
}

#[tokio::test]
async fn the_commands_speak_tls_with_the_tls_flags_and_env_vars() {
    let dir = tempfile::tempdir().unwrap();
    let d: PathBuf = dir.path().to_owned();
    development_pki(&d);
    let addr = mtls_server(&d).await;
    let url = format!("https://localhost:{}", addr.port());

    let (flags, env, reconcile, without, plain) = tokio::task::spawn_blocking(move || {
        let path = |name: &str| d.join(name).display().to_string();
        let (ca, cert, key) = (
            path("ca.pem"),
            path("cell-cell-a.pem"),
            path("cell-cell-a-key.pem"),
        );
        let flags = lookup(
            &d,
            &url,
            &["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key],
        );
        let env = common::command(
            &d,
            &[
                "lookup",
                "--server",
                &url,
                "--type",
                "email",
                "--value",
                "nobody@example.com",
            ],
        )
        .env("TOPOLOGY_CLAIMS_CLIENT_TLS_CA", &ca)
        .env("TOPOLOGY_CLAIMS_CLIENT_TLS_CERT", &cert)
        .env("TOPOLOGY_CLAIMS_CLIENT_TLS_KEY", &key)
        // A shell with the server's environment: its certificate is not the client's.
        .env("TOPOLOGY_CLAIMS_TLS_CERT", path("server.pem"))
        .env("TOPOLOGY_CLAIMS_TLS_KEY", path("server-key.pem"))
        .env("TOPOLOGY_CLAIMS_TLS_CLIENT_CA", &ca)
        .output()
        .unwrap();
        // The sidecars take the same flags: one reconcile pass over TLS.
        let db = d.join("cell.db");
        let conn = rusqlite::Connection::open(&db).unwrap();
        topology_claims_sqlite::ensure_local_schema(&conn).unwrap();
        drop(conn);
        let local = format!("sqlite://{}", db.display());
        let reconcile = common::run(
            &d,
            &[
                "reconcile",
                "--once",
                "--server",
                &url,
                "--cell-id",
                "cell-a",
                "--local-db",
                &local,
                "--tls-ca",
                &ca,
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
            ],
        );
        let without = lookup(&d, &url, &[]);
        let plain = lookup(&d, "http://127.0.0.1:1", &["--tls-ca", &ca]);
        let plaintext_at_tls = lookup(&d, &url.replace("https://", "http://"), &[]);
        let nobody = lookup(&d, "http://127.0.0.1:1", &[]);
        for (output, says) in [
            (&plaintext_at_tls, "use https://HOST:PORT with --tls-ca"),
            (&nobody, "nothing listens at http://127.0.0.1:1"),
        ] {
            let err = common::text(&output.stderr);
            assert_eq!(output.status.code(), Some(2), "{err}");
            assert!(
                err.contains(says) && !err.contains("store"),
                "{says}: {err}"
            );
        }
        (flags, env, reconcile, without, plain)
    })
    .await
    .unwrap();

    for output in [&flags, &env] {
        let err = common::text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "not found, over TLS: {err}");
        assert!(err.contains("not found"), "{err}");
    }
    let out = common::text(&reconcile.stdout);
    let err = common::text(&reconcile.stderr);
    assert!(reconcile.status.success(), "reconcile over TLS: {out}{err}");
    assert!(out.contains("committed=0"), "a pass ran: {out}");
    let err = common::text(&without.stderr);
    assert_eq!(without.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--tls-ca"),
        "says which flag is missing: {err}"
    );
    let err = common::text(&plain.stderr);
    assert_eq!(plain.status.code(), Some(2), "{err}");
    assert!(err.contains("use https://"), "{err}");
}

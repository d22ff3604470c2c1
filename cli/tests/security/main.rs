//! Mutual TLS through the real server process, with certificates made in the test: the role ×
//! RPC table from real clients with real certificates, a cell that cannot act for another even
//! when it names it, refused certificates (another CA, expired, no identity) and plaintext
//! clients, health without a client certificate, SIGHUP swapping the server certificate (and a
//! broken file keeping the old one), and plaintext refused off loopback.
#![cfg(unix)]

#[path = "../common/mod.rs"]
mod common;

mod anonymous;
mod audit;
mod sidecars;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::{command, text, Server};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::OffsetDateTime;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::Code;
use tonic_types::StatusExt;
use topology_claims_proto::pb;
use topology_claims_proto::pb::claims_service_client::ClaimsServiceClient;

const SOME_LEASE: &str = "0b6a4cf6-3f5e-4a47-9c1e-2b8c2d9a7e10";

/// A CA and the certificates the tests need, as PEM files in a directory.
struct Pki {
    dir: tempfile::TempDir,
    ca: Issuer<'static, KeyPair>,
    other_ca: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), Issuer::new(params, key))
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let (pem, ca) = self::ca("test CA");
        std::fs::write(dir.path().join("ca.pem"), pem).unwrap();
        let (_, other_ca) = self::ca("another CA");
        let pki = Pki { dir, ca, other_ca };
        pki.server("server", "server 1");
        pki
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn leaf(
        &self,
        file: &str,
        cn: &str,
        sans: Vec<SanType>,
        eku: ExtendedKeyUsagePurpose,
        expired: bool,
        issuer: &Issuer<'static, KeyPair>,
    ) {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        params.distinguished_name = dn;
        params.subject_alt_names = sans;
        params.extended_key_usages = vec![eku];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        let now = OffsetDateTime::now_utc();
        if expired {
            params.not_before = now - time::Duration::days(10);
            params.not_after = now - time::Duration::days(1);
        } else {
            params.not_before = now - time::Duration::minutes(5);
            params.not_after = now + time::Duration::days(1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, issuer).unwrap();
        std::fs::write(self.path(&format!("{file}.pem")), cert.pem()).unwrap();
        std::fs::write(self.path(&format!("{file}-key.pem")), key.serialize_pem()).unwrap();
    }

    fn server(&self, file: &str, cn: &str) {
        let sans = vec![
            SanType::DnsName("localhost".try_into().unwrap()),
            SanType::IpAddress("127.0.0.1".parse().unwrap()),
        ];
        self.leaf(
            file,
            cn,
            sans,
            ExtendedKeyUsagePurpose::ServerAuth,
            false,
            &self.ca,
        );
    }

    fn client(&self, file: &str, uri: Option<&str>, expired: bool, foreign: bool) {
        let sans = uri
            .map(|u| vec![SanType::URI(u.try_into().unwrap())])
            .unwrap_or_default();
        let issuer = if foreign { &self.other_ca } else { &self.ca };
        self.leaf(
            file,
            file,
            sans,
            ExtendedKeyUsagePurpose::ClientAuth,
            expired,
            issuer,
        );
    }

    fn start(&self) -> Server {
        self.start_with(&[])
    }

    fn start_with(&self, extra: &[&str]) -> Server {
        self.start_on("memory:", extra)
    }

    fn start_on(&self, store: &str, extra: &[&str]) -> Server {
        let (cert, key, ca) = (
            self.path("server.pem"),
            self.path("server-key.pem"),
            self.path("ca.pem"),
        );
        Server::start(
            self.dir.path(),
            &[
                "--listen",
                "127.0.0.1:0",
                "--store",
                store,
                "--tls-cert",
                cert.to_str().unwrap(),
                "--tls-key",
                key.to_str().unwrap(),
                "--tls-client-ca",
                ca.to_str().unwrap(),
            ]
            .iter()
            .chain(extra)
            .copied()
            .collect::<Vec<_>>(),
        )
    }

    /// A channel to `server` as client `file` (`None`: no client certificate).
    async fn channel(&self, server: &Server, file: Option<&str>) -> Result<Channel, String> {
        let ca = std::fs::read(self.path("ca.pem")).unwrap();
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .domain_name("localhost");
        if let Some(file) = file {
            let cert = std::fs::read(self.path(&format!("{file}.pem"))).unwrap();
            let key = std::fs::read(self.path(&format!("{file}-key.pem"))).unwrap();
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        Endpoint::from_shared(format!("https://{}", server.addr))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(|e| format!("{e:?}"))
    }
}

fn claim(value: &str) -> pb::ClaimRecord {
    pb::ClaimRecord {
        claim_type: 2,
        claim_value: value.to_owned(),
        owner: 3,
        owner_value: "1".into(),
        table_name: 1,
        table_record_id: 1,
        ..Default::default()
    }
}

fn begin(
    cell: &str,
    creates: Vec<pb::ClaimRecord>,
    destroys: Vec<pb::ClaimRecord>,
) -> pb::BeginUpdateRequest {
    pb::BeginUpdateRequest {
        local_transaction: String::new(),
        restore_correction: false,
        wait_for_leased: None,
        cell_id: cell.to_owned(),
        creates_claims: creates,
        destroys_claims: destroys,
        updates_claims: Vec::new(),
        lease_id: String::new(),
    }
}

/// The ErrorInfo reason of a refusal by the authorization layer, or `None` when the call got
/// through it (whatever the handler then answered).
fn refusal<T>(result: Result<tonic::Response<T>, tonic::Status>) -> Option<(Code, String)> {
    let status = result.err()?;
    let reason = status
        .get_error_details()
        .error_info()
        .map(|info| info.reason.clone())
        .unwrap_or_default();
    match status.code() {
        Code::Unauthenticated => Some((Code::Unauthenticated, reason)),
        Code::PermissionDenied if reason == "CELL_ID_MISMATCH" || reason == "ROLE_NOT_ALLOWED" => {
            Some((Code::PermissionDenied, reason))
        }
        _ => None,
    }
}

/// Calls each RPC naming `cell` and returns what the authorization layer said of each.
async fn every_rpc(channel: Channel, cell: &str) -> Vec<(&'static str, Option<(Code, String)>)> {
    let mut c = ClaimsServiceClient::new(channel);
    let cell = cell.to_owned();
    vec![
        (
            "BeginUpdate",
            refusal(
                c.begin_update(begin(&cell, vec![claim("matrix")], vec![]))
                    .await,
            ),
        ),
        (
            "CommitUpdate",
            refusal(
                c.commit_update(pb::CommitUpdateRequest {
                    cell_id: cell.clone(),
                    lease_id: SOME_LEASE.into(),
                })
                .await,
            ),
        ),
        (
            "RollbackUpdate",
            refusal(
                c.rollback_update(pb::RollbackUpdateRequest {
                    cell_id: cell.clone(),
                    lease_id: SOME_LEASE.into(),
                    unrenewed_for: None,
                })
                .await,
            ),
        ),
        (
            "RenewLease",
            refusal(
                c.renew_lease(pb::RenewLeaseRequest {
                    cell_id: cell.clone(),
                    lease_id: SOME_LEASE.into(),
                })
                .await,
            ),
        ),
        (
            "ListOutstandingLeases",
            refusal(
                c.list_outstanding_leases(pb::ListOutstandingLeasesRequest {
                    cell_id: cell.clone(),
                    cursor: String::new(),
                    limit: 0,
                })
                .await,
            ),
        ),
        (
            "ListClaims",
            refusal(
                c.list_claims(pb::ListClaimsRequest {
                    cell_id: cell.clone(),
                    table_name: 1,
                    ..Default::default()
                })
                .await,
            ),
        ),
        (
            "LookupClaim",
            refusal(
                c.lookup_claim(pb::LookupClaimRequest {
                    claim_type: 2,
                    claim_value: "matrix".into(),
                    ..Default::default()
                })
                .await,
            ),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_role_table_holds_for_every_rpc_with_real_certificates() {
    let pki = Pki::new();
    pki.client(
        "cell-a",
        Some("spiffe://topology-claims/cell/cell-a"),
        false,
        false,
    );
    pki.client(
        "router",
        Some("spiffe://topology-claims/router/edge-1"),
        false,
        false,
    );
    pki.client(
        "admin",
        Some("spiffe://topology-claims/admin/ops"),
        false,
        false,
    );
    let server = pki.start();
    let denied = |reason: &str| Some((Code::PermissionDenied, reason.to_owned()));

    let cell = every_rpc(
        pki.channel(&server, Some("cell-a")).await.unwrap(),
        "cell-a",
    )
    .await;
    for (rpc, answer) in &cell {
        assert_eq!(*answer, None, "cell-a as itself: {rpc}");
    }
    let other = every_rpc(
        pki.channel(&server, Some("cell-a")).await.unwrap(),
        "cell-b",
    )
    .await;
    for (rpc, answer) in &other {
        let expected = if *rpc == "LookupClaim" {
            None
        } else {
            denied("CELL_ID_MISMATCH")
        };
        assert_eq!(*answer, expected, "cell-a naming cell-b: {rpc}");
    }
    let router = every_rpc(
        pki.channel(&server, Some("router")).await.unwrap(),
        "cell-a",
    )
    .await;
    for (rpc, answer) in &router {
        let expected = if *rpc == "LookupClaim" {
            None
        } else {
            denied("ROLE_NOT_ALLOWED")
        };
        assert_eq!(*answer, expected, "router: {rpc}");
    }
    let admin = every_rpc(pki.channel(&server, Some("admin")).await.unwrap(), "cell-a").await;
    for (rpc, answer) in &admin {
        let reads = matches!(*rpc, "ListOutstandingLeases" | "ListClaims" | "LookupClaim");
        let expected = if reads {
            None
        } else {
            denied("ROLE_NOT_ALLOWED")
        };
        assert_eq!(*answer, expected, "admin: {rpc}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_cannot_end_renew_or_destroy_what_belongs_to_another_even_naming_it() {
    let pki = Pki::new();
    pki.client(
        "cell-a",
        Some("spiffe://topology-claims/cell/cell-a"),
        false,
        false,
    );
    pki.client(
        "cell-b",
        Some("spiffe://topology-claims/cell/cell-b"),
        false,
        false,
    );
    let server = pki.start();
    let mut a = ClaimsServiceClient::new(pki.channel(&server, Some("cell-a")).await.unwrap());
    let mut b = ClaimsServiceClient::new(pki.channel(&server, Some("cell-b")).await.unwrap());

    // B holds a committed claim and an outstanding lease. An empty cell_id means its own.
    let owned = b
        .begin_update(begin("", vec![claim("b-owned")], vec![]))
        .await
        .unwrap()
        .into_inner();
    let owned = owned.lease_payload.unwrap();
    assert_eq!(
        owned.cell_id, "cell-b",
        "the empty cell_id became the caller's own"
    );
    b.commit_update(pb::CommitUpdateRequest {
        cell_id: "cell-b".into(),
        lease_id: owned.lease_id,
    })
    .await
    .unwrap();
    let open = b
        .begin_update(begin("cell-b", vec![claim("b-pending")], vec![]))
        .await
        .unwrap();
    let open = open.into_inner().lease_payload.unwrap().lease_id;

    for name in ["cell-b", "cell-a"] {
        let commit = a
            .commit_update(pb::CommitUpdateRequest {
                cell_id: name.into(),
                lease_id: open.clone(),
            })
            .await;
        let rollback = a
            .rollback_update(pb::RollbackUpdateRequest {
                cell_id: name.into(),
                lease_id: open.clone(),
                unrenewed_for: None,
            })
            .await;
        let renew = a
            .renew_lease(pb::RenewLeaseRequest {
                cell_id: name.into(),
                lease_id: open.clone(),
            })
            .await;
        let destroy = a
            .begin_update(begin(name, vec![], vec![claim("b-owned")]))
            .await;
        let (code, reason) = if name == "cell-b" {
            (Code::PermissionDenied, "CELL_ID_MISMATCH")
        } else {
            (Code::PermissionDenied, "")
        };
        for (what, result) in [
            ("commit", commit.map(drop)),
            ("rollback", rollback.map(drop)),
            ("renew", renew.map(drop)),
            ("destroy", destroy.map(drop)),
        ] {
            let status = result.expect_err(what);
            assert_eq!(status.code(), code, "{what} naming {name}: {status:?}");
            let got = status
                .get_error_details()
                .error_info()
                .map(|i| i.reason.clone())
                .unwrap_or_default();
            if reason.is_empty() {
                // Naming itself, A meets the protocol's own ownership rules.
                assert!(
                    got == "NOT_LEASE_OWNER" || got == "NOT_CLAIM_OWNER",
                    "{what}: {got}"
                );
            } else {
                assert_eq!(got, reason, "{what} naming {name}");
            }
        }
    }
    // B's lease and claim are untouched: B commits.
    b.commit_update(pb::CommitUpdateRequest {
        cell_id: "cell-b".into(),
        lease_id: open,
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_unidentified_and_plaintext_clients_are_refused_and_health_is_open() {
    let pki = Pki::new();
    pki.client(
        "foreign",
        Some("spiffe://topology-claims/cell/cell-a"),
        false,
        true,
    );
    pki.client(
        "expired",
        Some("spiffe://topology-claims/cell/cell-a"),
        true,
        false,
    );
    pki.client("nosan", None, false, false);
    let server = pki.start();
    let lookup = |channel: Channel| async move {
        ClaimsServiceClient::new(channel)
            .lookup_claim(pb::LookupClaimRequest {
                claim_type: 2,
                claim_value: "x".into(),
                ..Default::default()
            })
            .await
    };

    for refused in ["foreign", "expired"] {
        match pki.channel(&server, Some(refused)).await {
            Err(_) => {}
            // TLS 1.3 checks the client certificate after the client's handshake ends, so the
            // refusal (a fatal alert) reaches the first call as a transport error.
            Ok(channel) => {
                let status = lookup(channel).await.expect_err(refused);
                // The alert (UnknownCA, CertificateExpired) or the close it causes, depending
                // on which the client reads first: never an answer from the service.
                assert!(
                    matches!(
                        status.code(),
                        Code::Unavailable | Code::Unknown | Code::Cancelled
                    ),
                    "{refused}: {status:?}"
                );
                assert!(status.get_error_details().error_info().is_none());
            }
        }
    }
    let status = lookup(pki.channel(&server, Some("nosan")).await.unwrap())
        .await
        .expect_err("no SAN");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("URI SAN"), "{}", status.message());

    let anonymous = pki.channel(&server, None).await.unwrap();
    let status = lookup(anonymous.clone()).await.expect_err("no certificate");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let health = tonic_health::pb::health_client::HealthClient::new(anonymous)
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health needs no client certificate");
    assert_eq!(health.into_inner().status, 1, "SERVING");

    let plaintext = Endpoint::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await;
    if let Ok(channel) = plaintext {
        assert!(
            lookup(channel).await.is_err(),
            "plaintext gets nothing from a TLS server"
        );
    }
}

/// The subject CN of the certificate the server presents to a new connection.
fn served_cn(addr: &str) -> String {
    let shell = format!(
        "openssl s_client -connect {addr} -servername localhost </dev/null 2>/dev/null \
         | openssl x509 -noout -subject"
    );
    let out = Command::new("sh")
        .args(["-c", &shell])
        .output()
        .expect("openssl");
    text(&out.stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_swaps_the_certificate_for_new_connections_and_a_broken_file_keeps_the_old() {
    let pki = Pki::new();
    pki.client(
        "cell-a",
        Some("spiffe://topology-claims/cell/cell-a"),
        false,
        false,
    );
    let server = pki.start();
    assert!(served_cn(&server.addr).contains("server 1"));
    let mut old = ClaimsServiceClient::new(pki.channel(&server, Some("cell-a")).await.unwrap());
    let ask = pb::ListOutstandingLeasesRequest {
        cell_id: "cell-a".into(),
        cursor: String::new(),
        limit: 0,
    };
    old.list_outstanding_leases(ask.clone()).await.unwrap();

    pki.server("server", "server 2");
    server.signal("HUP");
    let mut seen = String::new();
    for _ in 0..50 {
        seen = served_cn(&server.addr);
        if seen.contains("server 2") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        seen.contains("server 2"),
        "a new connection sees the new certificate: {seen}"
    );
    old.list_outstanding_leases(ask.clone())
        .await
        .expect("the old connection still works");

    std::fs::write(pki.path("server.pem"), "not a certificate").unwrap();
    server.signal("HUP");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        served_cn(&server.addr).contains("server 2"),
        "a broken file keeps the old config"
    );
    let mut fresh = ClaimsServiceClient::new(pki.channel(&server, Some("cell-a")).await.unwrap());
    fresh
        .list_outstanding_leases(ask)
        .await
        .expect("new connections still served");
}

#[test]
fn plaintext_is_refused_off_loopback_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let out = command(
        dir.path(),
        &["serve", "--listen", "0.0.0.0:0", "--store", "memory:"],
    )
    .output()
    .unwrap();
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("refusing to serve plaintext") && stderr.contains("docs/security.md"),
        "{stderr}"
    );
    let server = Server::start(
        dir.path(),
        &[
            "--listen",
            "0.0.0.0:0",
            "--store",
            "memory:",
            "--allow-plaintext",
        ],
    );
    assert!(server.addr.starts_with("0.0.0.0:"));
}

/// `--identity-from cn`: a PKI that can only set the subject CN names the cell there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_identity_from_cn_the_subject_cn_is_the_cell() {
    let pki = Pki::new();
    // No URI SAN at all: only the CN (the file name) says who it is.
    pki.client("cell-a", None, false, false);
    let server = pki.start_with(&["--identity-from", "cn"]);
    let mut a = ClaimsServiceClient::new(pki.channel(&server, Some("cell-a")).await.unwrap());
    let lease = a
        .begin_update(begin("", vec![claim("cn-owned")], vec![]))
        .await
        .expect("the CN's cell acts as itself")
        .into_inner()
        .lease_payload
        .unwrap();
    assert_eq!(lease.cell_id, "cell-a");
    let status = a
        .commit_update(pb::CommitUpdateRequest {
            cell_id: "cell-b".into(),
            lease_id: lease.lease_id,
        })
        .await
        .expect_err("another cell");
    assert_eq!(
        refusal(Err::<tonic::Response<()>, _>(status)),
        Some((Code::PermissionDenied, "CELL_ID_MISMATCH".to_owned()))
    );
}

/// `--health-listen`: a plaintext listener that serves the health service alone (for probes
/// that cannot speak TLS, such as Kubernetes' gRPC probes), beside an mTLS-only main listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plaintext_health_listener_serves_health_and_nothing_else() {
    let pki = Pki::new();
    let server = pki.start_on("memory:", &["--health-listen", "127.0.0.1:0"]);
    let line = server.child.next_line(common::PATIENCE).unwrap();
    let addr = line
        .strip_prefix("health on ")
        .unwrap_or_else(|| panic!("expected `health on HOST:PORT`, got {line:?}"));
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("plaintext connects to the health listener");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    for service in ["", "topology.claims.v1.ClaimsService"] {
        let answer = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .unwrap_or_else(|e| panic!("health of {service:?}: {e}"));
        assert_eq!(answer.into_inner().status, 1, "{service:?} SERVING");
    }
    let refused = ClaimsServiceClient::new(channel)
        .lookup_claim(pb::LookupClaimRequest {
            claim_type: pb::claim_record::ClaimType::Username as i32,
            claim_value: "alice".to_owned(),
            ..Default::default()
        })
        .await
        .expect_err("the claims service is not on the health listener");
    assert_eq!(refused.code(), Code::Unimplemented, "{refused:?}");

    // The `health` command: on the health listener, and on the main listener under mutual TLS.
    pki.client(
        "cell-h",
        Some("spiffe://topology-claims/cell/cell-h"),
        false,
        false,
    );
    let main = format!(
        "https://localhost:{}",
        server.addr.rsplit(':').next().unwrap()
    );
    let (ca, cert, key) = (
        pki.path("ca.pem"),
        pki.path("cell-h.pem"),
        pki.path("cell-h-key.pem"),
    );
    let mtls = [
        "--tls-ca",
        ca.to_str().unwrap(),
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ];
    let health = |server: &str, extra: &[&str]| {
        let out = common::run(
            pki.dir.path(),
            &[&["health", "--server", server], extra].concat(),
        );
        (out.status.code(), text(&out.stdout) + &text(&out.stderr))
    };
    let plain = format!("http://{addr}");
    for (server, extra, code, says) in [
        (
            plain.as_str(),
            &[][..],
            0,
            "topology.claims.v1.ClaimsService at http",
        ),
        (plain.as_str(), &["--service", ""][..], 0, "SERVING"),
        (main.as_str(), &mtls[..], 0, "SERVING"),
        (
            plain.as_str(),
            &["--service", "nope"][..],
            1,
            "SERVICE_UNKNOWN",
        ),
        ("http://127.0.0.1:1", &[][..], 2, "nothing listens"),
    ] {
        let (got, output) = health(server, extra);
        assert_eq!(got, Some(code), "{server} {extra:?}: {output}");
        assert!(output.contains(says), "{server} {extra:?}: {output}");
    }
}

/// The certificates' expiry is a metric, for the expiry alert: the server's own and the client
/// CA bundle's earliest, as unix times in the future.
#[test]
fn the_certificates_expiry_is_in_the_metrics() {
    let pki = Pki::new();
    let server = pki.start_on("memory:", &["--metrics-listen", "127.0.0.1:0"]);
    let metrics = server.child.metrics_addr(common::PATIENCE).unwrap();
    let text = common::scrape(metrics);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    for certificate in ["server", "client_ca"] {
        let at = common::value(
            &text,
            "topology_claims_tls_certificate_expiry_seconds",
            &[("certificate", certificate)],
        )
        .unwrap_or_else(|| panic!("{certificate} expiry missing:\n{text}"));
        assert!(
            at > now,
            "{certificate} expires in the future: {at} vs {now}"
        );
    }
}

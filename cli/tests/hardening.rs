//! Hardening, second round, through the real server process over real mutual TLS: what a caller
//! without a valid identity, or a refused one, can make the server buffer, decode or write.
//!
//! - an anonymous 300 MB upload, and 8 parallel 100 MB ones, are answered UNAUTHENTICATED
//!   before their bodies are read: resident memory stays flat and health keeps answering;
//! - the same 300 MB upload with a valid cell certificate is refused at its 5-byte prefix;
//! - two million empty claims (over the message limit), and half a million (under it) sent for
//!   another cell, each write one audit line of a few KiB, and memory stays within the budget;
//! - a body that authorization cannot parse is refused (INVALID_ARGUMENT), and audited;
//! - a BeginUpdate held past `--request-timeout` behind a PostgreSQL table lock, then committed,
//!   has its audit line, with its code and the lease id the server chose.
//!
//! The measured figures are printed (run with `--nocapture`) and recorded in
//! docs/reliability.md ("Limits").
#![cfg(target_os = "linux")]

mod common;
#[path = "malformed/raw.rs"]
mod raw;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Server;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::Code;
use topology_claims_harness::pki::DevPki;
use topology_claims_harness::proc_stats::rss_kib;
use topology_claims_proto::pb;
use topology_claims_proto::pb::claims_service_client::ClaimsServiceClient;

/// The service path prefix `raw::raw_call` sends to.
pub const SERVICE: &str = "/topology.claims.v1.ClaimsService/";

/// What a refused caller may add to the server's resident memory, in MiB: the request-byte
/// budget (`--max-request-bytes`, 64 MiB) the guard charges, which these attacks never reach,
/// and no more. docs/reliability.md gives the formula.
const BUDGET_MIB: f64 = 64.0;

/// A TLS server with client certificates on the memory store, its PKI and its audit log.
struct Target {
    server: Server,
    pki: DevPki,
    audit: PathBuf,
    _dir: tempfile::TempDir,
}

impl Target {
    fn start(extra: &[&str]) -> Target {
        let dir = tempfile::tempdir().unwrap();
        let pki = DevPki::create(&dir.path().join("pki")).unwrap();
        pki.issue_client("cell", "cell-a").unwrap();
        let audit = dir.path().join("audit.log");
        let tls = pki.serve_args();
        let mut args: Vec<&str> = vec!["--listen", "127.0.0.1:0", "--store", "memory:"];
        args.extend(tls.iter().map(String::as_str));
        args.extend(["--audit-log", audit.to_str().unwrap()]);
        args.extend(extra);
        let server = Server::start(dir.path(), &args);
        Target {
            server,
            pki,
            audit,
            _dir: dir,
        }
    }

    fn rss_mib(&self) -> f64 {
        rss_kib(self.server.pid()).unwrap_or(0) as f64 / 1024.0
    }

    fn url(&self, method: &str) -> String {
        format!(
            "https://localhost:{}{SERVICE}{method}",
            self.server.addr.rsplit(':').next().unwrap()
        )
    }

    /// A channel as `cell-a` (`Some`) or without a client certificate (`None`).
    async fn channel(&self, cell: Option<&str>) -> Channel {
        let ca = std::fs::read(self.pki.ca()).unwrap();
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .domain_name("localhost");
        if let Some(cell) = cell {
            let pair = self.pki.issue_client("cell", cell).unwrap();
            tls = tls.identity(Identity::from_pem(
                std::fs::read(pair.cert).unwrap(),
                std::fs::read(pair.key).unwrap(),
            ));
        }
        Endpoint::from_shared(format!("https://{}", self.server.addr))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .expect("connect")
    }

    /// Health (open without a certificate) answers SERVING within 5 s.
    async fn assert_healthy(&self, during: &str) {
        let channel = self.channel(None).await;
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            tonic_health::pb::health_client::HealthClient::new(channel).check(
                tonic_health::pb::HealthCheckRequest {
                    service: "topology.claims.v1.ClaimsService".into(),
                },
            ),
        )
        .await
        .unwrap_or_else(|_| panic!("{during}: health did not answer within 5 s"))
        .unwrap_or_else(|e| panic!("{during}: health: {e:?}"));
        assert_eq!(answer.into_inner().status, 1, "{during}: SERVING");
    }

    /// The audit log's lines once it holds at least `n` (the writer is a thread of its own).
    fn audit_lines(&self, n: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = std::fs::read_to_string(&self.audit).unwrap_or_default();
            let lines: Vec<String> = text.lines().map(str::to_owned).collect();
            if lines.len() >= n || Instant::now() > deadline {
                return lines;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `count` curl processes at once, each uploading a gRPC prefix that declares 4 GiB followed by
/// `mib` MiB of zeros to `url`, with the client certificate `cert` if any. Returns the bytes
/// each upload got to send before the server ended its stream (its answer, then RST_STREAM,
/// which curl reports as error 92 without the answer: the audit log has the codes), the
/// server's peak resident memory meanwhile, and the time it took.
fn upload(
    target: &Target,
    method: &str,
    count: usize,
    mib: usize,
    cert: Option<(&Path, &Path)>,
) -> (Vec<u64>, f64, Duration) {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let mut children = Vec::new();
    for i in 0..count {
        let sent = dir.path().join(format!("sent-{i}"));
        let identity = cert.map_or_else(String::new, |(c, k)| {
            format!("--cert {} --key {}", c.display(), k.display())
        });
        let script = format!(
            "(printf '\\000\\377\\377\\377\\377'; head -c {mib}M /dev/zero) | \
             curl -s --http2 --max-time 60 --cacert {ca} {identity} -X POST -T - \
             -H 'content-type: application/grpc' -H 'te: trailers' -o /dev/null \
             -w '%{{size_upload}}' {url} > {sent}",
            ca = target.pki.ca().display(),
            sent = sent.display(),
            url = target.url(method),
        );
        let child = Command::new("sh")
            .args(["-c", &script])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sh + curl");
        children.push((child, sent));
    }
    let mut peak = target.rss_mib();
    let mut uploaded = Vec::new();
    for (mut child, sent) in children {
        loop {
            peak = peak.max(target.rss_mib());
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let text = std::fs::read_to_string(&sent).unwrap_or_default();
        uploaded.push(
            text.trim()
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("curl's size_upload: {text:?}")),
        );
    }
    (uploaded, peak.max(target.rss_mib()), started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_uploads_of_any_size_are_refused_before_their_bodies_are_read() {
    let target = Target::start(&[]);
    target.assert_healthy("before").await;
    let baseline = target.rss_mib();
    let (one, peak_one, took_one) = upload(&target, "BeginUpdate", 1, 300, None);
    target.assert_healthy("after one 300 MB upload").await;
    let (eight, peak_eight, took_eight) = upload(&target, "CommitUpdate", 8, 100, None);
    target
        .assert_healthy("after 8 parallel 100 MB uploads")
        .await;
    println!(
        "anonymous uploads: baseline {baseline:.1} MiB; one 300 MB: {one:?} bytes sent, peak \
         {peak_one:.1} MiB in {took_one:?}; 8 × 100 MB: {eight:?} bytes sent, peak \
         {peak_eight:.1} MiB in {took_eight:?}"
    );
    // What HTTP/2 flow control lets a client send before the server's answer ends the stream.
    for sent in one.iter().chain(&eight) {
        assert!(
            *sent < 4 << 20,
            "an upload sent {sent} bytes: {one:?} {eight:?}"
        );
    }
    for (what, peak) in [("300 MB", peak_one), ("8 × 100 MB", peak_eight)] {
        assert!(
            peak - baseline < BUDGET_MIB / 2.0,
            "{what}: resident memory grew {:.1} MiB",
            peak - baseline
        );
    }
    // The refusals are audited without any request content.
    let lines = target.audit_lines(9);
    assert_eq!(lines.len(), 9, "{lines:#?}");
    for line in &lines {
        assert!(line.contains("\"identity\":\"no-certificate\""), "{line}");
        assert!(line.contains("\"code\":\"UNAUTHENTICATED\""), "{line}");
        assert!(line.contains("\"claim_count\":0,\"claims\":[]"), "{line}");
        assert!(line.len() < 1024, "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cells_300_mb_upload_is_refused_at_its_prefix() {
    let target = Target::start(&[]);
    let pair = target.pki.issue_client("cell", "cell-a").unwrap();
    let baseline = target.rss_mib();
    let (sent, peak, took) = upload(
        &target,
        "BeginUpdate",
        1,
        300,
        Some((&pair.cert, &pair.key)),
    );
    println!(
        "cell-a's 300 MB upload: {sent:?} bytes sent; baseline {baseline:.1} MiB, peak \
         {peak:.1} MiB, in {took:?}"
    );
    assert!(sent[0] < 4 << 20, "the upload sent {sent:?} bytes");
    assert!(
        peak - baseline < BUDGET_MIB / 2.0,
        "resident memory grew {:.1} MiB",
        peak - baseline
    );
    target.assert_healthy("after the upload").await;
    let lines = target.audit_lines(1);
    assert!(
        lines[0].contains("\"code\":\"OUT_OF_RANGE\"") && lines[0].len() < 1024,
        "{lines:?}"
    );
}

/// A BeginUpdateRequest for `cell` made of `claims` empty ClaimRecords (`0x12 0x00` each).
fn empty_claims(cell: &str, claims: usize) -> Vec<u8> {
    let mut message = vec![0x0a, cell.len() as u8];
    message.extend_from_slice(cell.as_bytes());
    message.reserve(claims * 2);
    for _ in 0..claims {
        message.extend_from_slice(&[0x12, 0x00]);
    }
    message
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn millions_of_empty_claims_write_one_small_audit_line_each() {
    let target = Target::start(&[]);
    let channel = target.channel(Some("cell-a")).await;
    let baseline = target.rss_mib();
    // 3.9 MB: over the message limit (1,088 KiB with --max-batch 1000), refused at its prefix.
    let over = raw::raw_call(&channel, "BeginUpdate", empty_claims("cell-b", 1_950_000))
        .await
        .expect_err("over the message limit");
    assert_eq!(over.code(), Code::OutOfRange, "{over:?}");
    // 1 MB: under the limit; half a million claims for another cell, then for its own.
    let other = raw::raw_call(&channel, "BeginUpdate", empty_claims("cell-b", 520_000))
        .await
        .expect_err("another cell");
    assert_eq!(other.code(), Code::PermissionDenied, "{other:?}");
    let own = raw::raw_call(&channel, "BeginUpdate", empty_claims("cell-a", 520_000))
        .await
        .expect_err("over --max-batch");
    assert_eq!(own.code(), Code::InvalidArgument, "{own:?}");
    assert!(own.message().contains("at most 1000 claims"), "{own:?}");
    let peak = target.rss_mib();
    let lines = target.audit_lines(3);
    let sizes: Vec<usize> = lines.iter().map(String::len).collect();
    println!(
        "empty claims: audit lines of {sizes:?} bytes; resident memory {baseline:.1} → \
         {peak:.1} MiB"
    );
    assert_eq!(lines.len(), 3, "{lines:#?}");
    assert!(
        lines[0].contains("\"code\":\"OUT_OF_RANGE\""),
        "{}",
        lines[0]
    );
    for (line, code) in lines[1..]
        .iter()
        .zip(["PERMISSION_DENIED", "INVALID_ARGUMENT"])
    {
        assert!(line.contains(&format!("\"code\":\"{code}\"")), "{line}");
        assert!(line.contains("\"claim_count\":520000"), "{line}");
        assert_eq!(line.matches("\"op\":\"create\"").count(), 16, "{line}");
    }
    assert!(sizes.iter().all(|s| *s < 4096), "{sizes:?}");
    assert!(
        peak - baseline < BUDGET_MIB,
        "resident memory grew {:.1} MiB",
        peak - baseline
    );
    target.assert_healthy("after").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_authorization_cannot_parse_is_refused_and_audited() {
    let target = Target::start(&[]);
    let channel = target.channel(Some("cell-a")).await;
    for (method, body) in [
        ("CommitUpdate", vec![0xFF; 16]),
        ("RenewLease", vec![0x08, 0x01]),
        ("BeginUpdate", vec![0x0a, 0x7F, b'a']),
        ("ListClaims", vec![0x0a, 0x02, 0xC3, 0x28]),
    ] {
        let status = raw::raw_call(&channel, method, body)
            .await
            .expect_err(method);
        assert_eq!(status.code(), Code::InvalidArgument, "{method}: {status:?}");
        assert!(
            status.message().contains("is not a"),
            "{method}: {status:?}"
        );
    }
    // The mutating ones are audited as refused (reads are not audited when allowed or malformed).
    let lines = target.audit_lines(3);
    assert!(
        lines
            .iter()
            .filter(|l| l.contains("\"code\":\"INVALID_ARGUMENT\""))
            .count()
            >= 3,
        "{lines:#?}"
    );
    // A well-formed call still works on the same channel.
    ClaimsServiceClient::new(channel)
        .begin_update(pb::BeginUpdateRequest {
            cell_id: String::new(),
            creates_claims: vec![pb::ClaimRecord {
                claim_type: 2,
                claim_value: "after-the-garbage".into(),
                owner: 3,
                owner_value: "1".into(),
                table_name: 1,
                table_record_id: 1,
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .expect("a valid BeginUpdate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_begin_update_that_outlives_its_request_timeout_is_audited_when_it_commits() {
    use topology_claims_harness::postgres::{connect, test_url, TempSchema};
    let schema = TempSchema::create(&test_url(), "tc_audit_", Duration::from_secs(3600))
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL (scripts/ensure-services.sh): {e}"));
    let url = schema.url("audit-timeout").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.log");
    let server = Server::start(
        dir.path(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--store",
            &url,
            "--request-timeout",
            "1s",
            "--audit-log",
            audit.to_str().unwrap(),
        ],
    );
    // Hold the claims table, so the BeginUpdate's transaction waits past the request timeout.
    let locker = connect(&url).await.unwrap();
    locker
        .batch_execute("BEGIN; LOCK TABLE claims IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let mut client = ClaimsServiceClient::new(
        Endpoint::from_shared(server.endpoint())
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let claim = pb::ClaimRecord {
        claim_type: 2,
        claim_value: "late-but-committed".into(),
        owner: 3,
        owner_value: "1".into(),
        table_name: 1,
        table_record_id: 1,
        ..Default::default()
    };
    let answer = client
        .begin_update(pb::BeginUpdateRequest {
            cell_id: "cell-a".into(),
            creates_claims: vec![claim],
            ..Default::default()
        })
        .await
        .expect_err("answered at --request-timeout");
    assert_eq!(answer.code(), Code::DeadlineExceeded, "{answer:?}");
    locker.batch_execute("COMMIT").await.unwrap();
    // The transaction goes on and commits: the claim is leased, and the audit line says so.
    let deadline = Instant::now() + Duration::from_secs(10);
    let line = loop {
        let text = std::fs::read_to_string(&audit).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.contains("\"BeginUpdate\"")) {
            break line.to_owned();
        }
        assert!(Instant::now() < deadline, "no BeginUpdate line in {text:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let found = client
        .lookup_claim(pb::LookupClaimRequest {
            claim_type: 2,
            claim_value: "late-but-committed".into(),
            ..Default::default()
        })
        .await
        .expect("the late BeginUpdate committed its lease")
        .into_inner();
    assert_eq!(found.state, pb::ClaimState::Creating as i32, "{found:?}");
    let leases = client
        .list_outstanding_leases(pb::ListOutstandingLeasesRequest {
            cell_id: "cell-a".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let lease_id = &leases.leases[0].lease_payload.as_ref().unwrap().lease_id;
    println!("audit line of the late BeginUpdate: {line}");
    let record: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(record["code"], "OK", "{line}");
    assert_eq!(record["claim_count"], 1, "{line}");
    assert_eq!(
        record["lease_id"].as_str().unwrap(),
        lease_id,
        "the server-chosen lease id: {line}"
    );
    drop(client);
    server.stop_with("TERM");
    schema.drop().await.unwrap();
}

//! Callers without an identity, and cells that misbehave, against the real server over real TLS
//! (issue 34): what they can make the server hold is a constant of their own, never the cells'
//! share. Each attack is bounded in count and time, and its figures are printed (run with
//! `--nocapture`; docs/security.md, "Before identity").

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use common::attack::closed_by_peer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use topology_claims_harness::proc_stats::rss_kib;

use super::*;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

impl Pki {
    /// A raw TLS connection to `server` (ALPN h2) as client `file`, or without a certificate.
    async fn tls(&self, addr: &str, file: Option<&str>) -> std::io::Result<TlsStream<TcpStream>> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(self.path("ca.pem")).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let mut config = match file {
            None => builder.with_no_client_auth(),
            Some(file) => {
                let chain = CertificateDer::pem_file_iter(self.path(&format!("{file}.pem")))
                    .unwrap()
                    .map(Result::unwrap)
                    .collect();
                let key =
                    PrivateKeyDer::from_pem_file(self.path(&format!("{file}-key.pem"))).unwrap();
                builder.with_client_auth_cert(chain, key).unwrap()
            }
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        let tcp = TcpStream::connect(addr).await?;
        let name = ServerName::try_from("localhost").unwrap();
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
    }

    /// An `h2` client over TLS (the connection driven on a task).
    async fn h2(&self, addr: &str, file: Option<&str>) -> h2::client::SendRequest<Bytes> {
        let tls = self.tls(addr, file).await.expect("TLS handshake");
        let (send, connection) = h2::client::handshake(tls).await.expect("HTTP/2 handshake");
        tokio::spawn(async move {
            let _ = connection.await;
        });
        send
    }

    fn cell(&self, name: &str) {
        self.client(
            name,
            Some(&format!("spiffe://topology-claims/cell/{name}")),
            false,
            false,
        );
    }
}

/// Opens `streams` requests to `path` on `client`, each declaring a message of `declared` bytes
/// and sending all but its last byte; returns how many the server refused at once (with their
/// grpc-status) and how many it holds, after `patience`.
async fn hold_partial_bodies(
    client: h2::client::SendRequest<Bytes>,
    addr: &str,
    path: &str,
    streams: usize,
    declared: usize,
    patience: Duration,
) -> (Vec<String>, usize) {
    let mut client = client;
    let mut tasks = Vec::new();
    for _ in 0..streams {
        let Ok(ready) = client.clone().ready().await else {
            break;
        };
        client = ready;
        let request = http::Request::post(format!("https://{addr}{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let Ok((response, stream)) = client.send_request(request, false) else {
            break;
        };
        tasks.push(tokio::spawn(common::attack::push_partial(
            stream, response, declared, patience,
        )));
    }
    let mut refused = Vec::new();
    let mut held = 0;
    for task in tasks {
        match task.await.expect("stream task") {
            Some(status) => refused.push(status),
            None => held += 1,
        }
    }
    (refused, held)
}

/// A cell's BeginUpdate + RollbackUpdate pairs at `per_second`, for `duration`: (ok, tried).
async fn pairs(channel: Channel, cell: &str, per_second: u32, duration: Duration) -> (u32, u32) {
    let mut client = ClaimsServiceClient::new(channel);
    let started = Instant::now();
    let (mut ok, mut tried) = (0, 0);
    let mut ticker = tokio::time::interval(Duration::from_secs(1) / per_second);
    while started.elapsed() < duration {
        ticker.tick().await;
        tried += 1;
        let value = format!("{cell}-pair-{tried}");
        let begun = client
            .begin_update(begin(cell, vec![claim(&value)], vec![]))
            .await;
        let Ok(begun) = begun else { continue };
        let lease_id = begun.into_inner().lease_payload.unwrap().lease_id;
        let rolled = client
            .rollback_update(pb::RollbackUpdateRequest {
                cell_id: cell.to_owned(),
                lease_id,
                unrenewed_for: None,
            })
            .await;
        if rolled.is_ok() {
            ok += 1;
        }
    }
    (ok, tried)
}

fn rss_mib(server: &Server) -> f64 {
    rss_kib(server.pid()).unwrap_or(0) as f64 / 1024.0
}

/// The plaintext `--health-listen` port: 3 connections x 100 health streams declaring 4 MiB
/// each grew the server by 1.2 GB before health bodies were capped; a body declaring more than
/// 256 bytes is now refused at its prefix, and what is held comes out of the anonymous budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_port_holds_no_more_than_the_anonymous_budget() {
    let pki = Pki::new();
    let server = pki.start_on("memory:", &["--health-listen", "127.0.0.1:0"]);
    let line = server.child.next_line(common::PATIENCE).unwrap();
    let addr = line
        .strip_prefix("health on ")
        .expect("health on HOST:PORT");
    let baseline = rss_mib(&server);
    let mut attacks = Vec::new();
    for _ in 0..3 {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (client, connection) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let addr = addr.to_owned();
        attacks.push(tokio::spawn(async move {
            hold_partial_bodies(
                client,
                &addr,
                "/grpc.health.v1.Health/Check",
                100,
                4 << 20,
                Duration::from_secs(4),
            )
            .await
        }));
    }
    let mut peak = baseline;
    while attacks.iter().any(|a| !a.is_finished()) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        peak = peak.max(rss_mib(&server));
    }
    let mut refused = Vec::new();
    for attack in attacks {
        refused.extend(attack.await.unwrap().0);
    }
    // A probe still answers.
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let status = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .expect("a probe answers after the attack");
    assert_eq!(status.into_inner().status, 1);
    let out_of_range = refused.iter().filter(|s| *s == "11").count();
    println!(
        "health port: 3 x 100 streams declaring 4 MiB: {out_of_range} refused OUT_OF_RANGE; RSS \
         {baseline:.1} MiB before, peak {peak:.1} MiB (+{:.1} MiB)",
        peak - baseline
    );
    assert_eq!(
        out_of_range, 300,
        "every oversized health body is refused: {refused:?}"
    );
    assert!(peak - baseline < 100.0, "+{:.1} MiB", peak - baseline);
}

/// A caller without a certificate holds partial health bodies on 12 connections, and a second
/// cell holds partial BeginUpdate bodies on 12 more (under --cell-max-in-flight 2 --cell-rate
/// 20): cell-1's BeginUpdate + RollbackUpdate pairs keep succeeding, since neither can spend
/// more than its own budget (`--max-anonymous-request-bytes`, `--cell-max-request-bytes`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn neither_an_anonymous_caller_nor_another_cell_can_spend_a_cells_byte_budget() {
    let pki = Pki::new();
    pki.cell("cell-1");
    pki.cell("cell-2");
    let server = pki.start_with(&["--cell-max-in-flight", "2", "--cell-rate", "20"]);
    let addr = server.addr.clone();
    let patience = Duration::from_secs(6);

    let mut attacks = Vec::new();
    for _ in 0..12 {
        let client = pki.h2(&addr, None).await;
        let addr = addr.clone();
        attacks.push(tokio::spawn(async move {
            let path = "/grpc.health.v1.Health/Check";
            hold_partial_bodies(client, &addr, path, 100, 256, patience).await
        }));
    }
    for _ in 0..12 {
        let client = pki.h2(&addr, Some("cell-2")).await;
        let addr = addr.clone();
        attacks.push(tokio::spawn(async move {
            let path = "/topology.claims.v1.ClaimsService/BeginUpdate";
            hold_partial_bodies(client, &addr, path, 100, 1 << 20, patience).await
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let channel = pki.channel(&server, Some("cell-1")).await.unwrap();
    let (ok, tried) = pairs(channel, "cell-1", 5, Duration::from_secs(4)).await;
    let (mut anonymous, mut cell_2) = ((0, 0), (0, 0));
    for (i, attack) in attacks.into_iter().enumerate() {
        let (refused, held) = attack.await.unwrap();
        let side = if i < 12 { &mut anonymous } else { &mut cell_2 };
        side.0 += held;
        side.1 += refused.len();
    }
    println!(
        "while an anonymous caller held {} partial health bodies ({} refused) and cell-2 held {} \
         partial BeginUpdates ({} refused): cell-1's pairs {ok}/{tried} OK",
        anonymous.0, anonymous.1, cell_2.0, cell_2.1
    );
    assert!(anonymous.0 > 0 && cell_2.0 > 0, "the attack held nothing");
    assert!(cell_2.1 > 0, "cell-2's share refused nothing");
    assert!(ok * 10 >= tried * 9, "{ok}/{tried} pairs succeeded");
}

/// `--handshake-timeout 2s` is a total deadline from the accept: a TLS connection that says
/// nothing after its handshake, and one that drips a byte of the HTTP/2 preface every second,
/// are both closed within 6 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_or_dripping_tls_connection_is_closed_by_the_handshake_deadline() {
    let pki = Pki::new();
    let server = pki.start_with(&["--handshake-timeout", "2s"]);
    let started = Instant::now();
    let mut silent = pki.tls(&server.addr, None).await.unwrap();
    let mut dripping = pki.tls(&server.addr, None).await.unwrap();
    let drip = tokio::spawn(async move {
        for byte in PREFACE.iter().take(PREFACE.len() - 1) {
            if dripping.write_all(&[*byte]).await.is_err() || dripping.flush().await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        closed_by_peer(&mut dripping, Duration::from_secs(10)).await
    });
    let silent_closed = closed_by_peer(&mut silent, Duration::from_secs(10)).await;
    let silent_after = started.elapsed();
    let dripping_closed = drip.await.unwrap();
    let dripping_after = started.elapsed();
    println!(
        "--handshake-timeout 2s: silent closed after {silent_after:?}, dripping after \
         {dripping_after:?}"
    );
    assert!(silent_closed && silent_after < Duration::from_secs(6));
    assert!(dripping_closed && dripping_after < Duration::from_secs(6));
}

/// The GOAWAY's debug text, read from a TLS connection the server refuses.
async fn goaway_reason(stream: &mut TlsStream<TcpStream>) -> Option<String> {
    let _ = stream.write_all(PREFACE).await;
    let _ = stream.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await;
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    while let Ok(Ok(n)) =
        tokio::time::timeout(Duration::from_secs(3), stream.read(&mut chunk)).await
    {
        if n == 0 {
            break;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
    let mut rest = &buffer[..];
    while rest.len() >= 9 {
        let length = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        if rest.len() < 9 + length {
            break;
        }
        if rest[3] == 0x7 && length >= 8 {
            return Some(String::from_utf8_lossy(&rest[9 + 8..9 + length]).into_owned());
        }
        rest = &rest[9 + length..];
    }
    None
}

/// How many of `tried` new connections of cell-1 are served (a LookupClaim answered).
async fn new_cell_connections(pki: &Pki, server: &Server, tried: u32) -> u32 {
    let mut ok = 0;
    for _ in 0..tried {
        if let Ok(channel) = pki.channel(server, Some("cell-1")).await {
            ok += u32::from(answers_a_lookup(channel).await);
        }
    }
    ok
}

/// Whether a LookupClaim on `channel` gets the service's answer (NOT_FOUND for nobody).
async fn answers_a_lookup(channel: Channel) -> bool {
    let answer = ClaimsServiceClient::new(channel)
        .lookup_claim(pb::LookupClaimRequest {
            claim_type: 2,
            claim_value: "nobody".into(),
            ..Default::default()
        })
        .await;
    answer.is_err_and(|s| s.code() == Code::NotFound)
}

/// With `--max-connections 64` a certificate-less caller holding 72 TLS connections keeps at
/// most 8 (`--max-anonymous-connections`, 1/8 by default); the others are told why inside TLS,
/// and a cell's new connections keep succeeding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_without_a_certificate_cannot_take_the_cells_connections() {
    let pki = Pki::new();
    pki.cell("cell-1");
    let server = pki.start_with(&["--max-connections", "64"]);
    let refused = Arc::new(AtomicUsize::new(0));
    let mut held = Vec::new();
    let mut reasons = Vec::new();
    for _ in 0..72 {
        let Ok(mut stream) = pki.tls(&server.addr, None).await else {
            refused.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let _ = stream.write_all(PREFACE).await;
        let _ = stream.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await;
        held.push(stream);
    }
    // The server refuses the connections past the anonymous places right after their handshake.
    let mut open = Vec::new();
    for mut stream in held {
        if closed_by_peer(&mut stream, Duration::from_millis(300)).await {
            reasons.push(());
        } else {
            open.push(stream);
        }
    }
    let (ok, tried) = (new_cell_connections(&pki, &server, 20).await, 20);
    // One more certificate-less connection is told which limit it met.
    let mut extra = pki.tls(&server.addr, None).await.unwrap();
    let reason = goaway_reason(&mut extra).await.unwrap_or_default();
    println!(
        "72 certificate-less connections: {} kept, {} closed after the handshake; cell-1's new \
         connections {ok}/{tried} OK; the next one was told: {reason}",
        open.len(),
        reasons.len()
    );
    assert!(open.len() <= 8, "{} anonymous connections kept", open.len());
    assert!(ok * 10 >= tried * 8, "{ok}/{tried} of cell-1's connections");
    assert!(reason.contains("--max-anonymous-connections 8"), "{reason}");
    drop(open);
}

/// Before its TLS handshake a caller has no identity: a peer that opens connections and never
/// finishes a handshake holds at most `--max-handshakes-per-address` of the places (1/8 of
/// `--max-connections` by default); its others are closed at once, and a cell connecting from
/// another address keeps getting in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_finish_their_handshake_cannot_take_the_cells_places() {
    let pki = Pki::new();
    pki.cell("cell-1");
    let server = pki.start_with(&["--max-connections", "64"]);
    let addr: std::net::SocketAddr = server.addr.parse().unwrap();
    let mut held = Vec::new();
    for _ in 0..72 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        held.push(socket.connect(addr).await.unwrap());
    }
    let mut open = 0;
    for stream in &mut held {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_millis(300), stream.read(&mut byte)).await;
        if read.is_err() {
            open += 1;
        }
    }
    let started = Instant::now();
    let (ok, tried) = (new_cell_connections(&pki, &server, 20).await, 20);
    let took = started.elapsed();
    println!(
        "72 connections from 127.0.0.2 that never start TLS: {open} held open; cell-1's new \
         connections from 127.0.0.1 {ok}/{tried} OK in {took:?}"
    );
    assert!(open <= 8, "{open} handshakes held from one address");
    assert!(ok * 10 >= tried * 8, "{ok}/{tried} of cell-1's connections");
    // Waiting for the attacker's places to free would take the whole --handshake-timeout (10 s).
    assert!(took < Duration::from_secs(5), "cell-1 waited {took:?}");
    drop(held);
}

/// Peers from many addresses that open connections and never finish a handshake can fill every
/// place (`--max-handshakes-per-address` counts one address). Once every place is taken, a new
/// connection takes the place of the oldest handshake in flight that began a tenth of
/// `--handshake-timeout` ago or more: a cell gets in without waiting out the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_closes_its_oldest_unfinished_handshake_for_a_new_connection() {
    let pki = Pki::new();
    pki.cell("cell-1");
    let server = pki.start_with(&["--max-connections", "64", "--handshake-timeout", "20s"]);
    let addr: std::net::SocketAddr = server.addr.parse().unwrap();
    // 72 peers, one connection each, from 127.0.0.2 ..= 127.0.0.73: 64 places taken, 8 refused.
    let mut held = Vec::new();
    for n in 2..74u8 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(std::net::SocketAddr::from(([127, 0, 0, n], 0)))
            .unwrap();
        held.push(socket.connect(addr).await.unwrap());
    }
    // Older than a tenth of the handshake timeout (2 s): they may now give way.
    tokio::time::sleep(Duration::from_millis(2_300)).await;
    // cell-1 opens 20 connections and keeps them: each needs a place of its own.
    let started = Instant::now();
    let (mut ok, tried, mut kept) = (0u32, 20, Vec::new());
    for _ in 0..tried {
        if let Ok(channel) = pki.channel(&server, Some("cell-1")).await {
            ok += u32::from(answers_a_lookup(channel.clone()).await);
            kept.push(channel);
        }
    }
    let took = started.elapsed();
    let mut closed = 0;
    for stream in &mut held {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_millis(50), stream.read(&mut byte)).await;
        if matches!(read, Ok(Ok(0) | Err(_))) {
            closed += 1;
        }
    }
    println!(
        "72 peers from 72 addresses that never start TLS, --max-connections 64: cell-1's new \
         connections {ok}/{tried} OK in {took:?}; {closed} of the peers' connections closed"
    );
    assert_eq!(ok, tried, "{ok}/{tried} of cell-1's connections");
    // Waiting for the peers' places to free would take the whole --handshake-timeout (20 s).
    assert!(took < Duration::from_secs(10), "cell-1 waited {took:?}");
    // The 8 refused at once, and one closed per place a cell connection took.
    assert!(
        closed >= 8 + 20,
        "{closed} of the peers' connections closed"
    );
    drop(held);
}

/// A TLS connection over `--max-connections` is refused after its handshake with a GOAWAY that
/// names the limit, which the client can read (it was written in plaintext before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_connection_over_the_limit_is_told_the_limit_inside_tls() {
    let pki = Pki::new();
    pki.cell("cell-1");
    let server = pki.start_with(&["--max-connections", "2"]);
    let mut held = Vec::new();
    for _ in 0..2 {
        let channel = pki.channel(&server, Some("cell-1")).await.unwrap();
        let answer = ClaimsServiceClient::new(channel.clone())
            .lookup_claim(pb::LookupClaimRequest {
                claim_type: 2,
                claim_value: "nobody".into(),
                ..Default::default()
            })
            .await;
        assert_eq!(answer.unwrap_err().code(), Code::NotFound);
        held.push(channel);
    }
    let mut over = pki.tls(&server.addr, Some("cell-1")).await.unwrap();
    let reason = goaway_reason(&mut over).await.unwrap_or_default();
    println!("over --max-connections 2 on TLS: {reason}");
    assert!(reason.contains("--max-connections 2"), "{reason}");
}

/// A gRPC message frame of `message`.
fn grpc_frame(message: &impl prost::Message) -> Bytes {
    let body = message.encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(body.len() as u32).to_be_bytes());
    framed.extend_from_slice(&body);
    Bytes::from(framed)
}

/// One cell opens 4 connections × 100 ListClaims streams of ~1 MiB pages and never reads them
/// (a flow-control window of 0, PINGs answered): 376 MiB were pinned before. Now at most
/// `--cell-max-streams` (64) are open, the rest refused RESOURCE_EXHAUSTED, and after
/// `--stall-timeout` the unread pages are dropped and the cell's places given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_list_pages_are_bounded_per_cell_and_dropped_when_stalled() {
    let pki = Pki::new();
    pki.cell("cell-1");
    let server = pki.start_with(&["--stall-timeout", "10s"]);
    let addr = server.addr.clone();
    let channel = pki.channel(&server, Some("cell-1")).await.unwrap();
    let mut client = ClaimsServiceClient::new(channel.clone());
    let long = "x".repeat(248);
    for batch in 0..2 {
        let records = (0..1000)
            .map(|i| pb::ClaimRecord {
                claim_value: format!("{batch}-{i:04}-{long}"),
                owner_value: long.clone(),
                table_record_id: batch * 1000 + i + 1,
                ..claim("")
            })
            .collect();
        let lease = client
            .begin_update(begin("cell-1", records, vec![]))
            .await
            .unwrap()
            .into_inner()
            .lease_payload
            .unwrap()
            .lease_id;
        client
            .commit_update(pb::CommitUpdateRequest {
                cell_id: "cell-1".into(),
                lease_id: lease,
            })
            .await
            .unwrap();
    }
    let list = pb::ListClaimsRequest {
        cell_id: "cell-1".into(),
        table_name: 1,
        limit: 10_000,
        ..Default::default()
    };
    let page = client.list_claims(list.clone()).await.unwrap().into_inner();
    let page_bytes = prost::Message::encoded_len(&page);
    let baseline = rss_mib(&server);

    let opened = Instant::now();
    let mut responses = Vec::new();
    let mut connections = Vec::new();
    for _ in 0..4 {
        let tls = pki.tls(&addr, Some("cell-1")).await.unwrap();
        let (mut send, connection) = h2::client::Builder::new()
            .initial_window_size(0)
            .handshake::<_, Bytes>(tls)
            .await
            .unwrap();
        tokio::spawn(async move {
            let _ = connection.await;
        });
        for _ in 0..100 {
            send = send.ready().await.unwrap();
            let request = http::Request::post(format!(
                "https://{addr}/topology.claims.v1.ClaimsService/ListClaims"
            ))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
            let (response, mut stream) = send.send_request(request, false).unwrap();
            stream.send_data(grpc_frame(&list), true).unwrap();
            responses.push(response);
        }
        connections.push(send);
    }
    // The answers are kept: dropping one would reset its stream and free the server of it.
    let (mut held, mut refused, mut other, mut kept) = (0, 0, Vec::new(), Vec::new());
    for response in responses {
        match tokio::time::timeout(Duration::from_secs(10), response).await {
            Ok(Ok(response)) => {
                match response.headers().get("grpc-status") {
                    None => held += 1,
                    Some(status) if status == "8" => refused += 1,
                    Some(status) => other.push(format!("{status:?}")),
                }
                kept.push(response);
            }
            answer => other.push(format!("{answer:?}")),
        }
    }
    let answered = opened.elapsed();
    let mut peak = rss_mib(&server);
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        peak = peak.max(rss_mib(&server));
    }
    // While the pages are held, the cell's next listing is refused; once --stall-timeout has
    // dropped them, it is served again (the connections are still open, unread).
    let started = Instant::now();
    let served = loop {
        match client.list_claims(list.clone()).await {
            Ok(_) => break started.elapsed(),
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert!(status.message().contains("cell-max-streams"), "{status:?}");
                assert!(started.elapsed() < Duration::from_secs(60), "never freed");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let after = rss_mib(&server);
    println!(
        "4 x 100 unread ListClaims of {page_bytes} B pages, all answered in {answered:?}: {held} \
         held, {refused} refused RESOURCE_EXHAUSTED; RSS {baseline:.1} MiB before, peak {peak:.1} MiB (+{:.1} MiB), \
         {after:.1} MiB once --stall-timeout 10s dropped them; the cell listed again after \
         {served:?}",
        peak - baseline
    );
    assert!(other.is_empty(), "{other:?}");
    assert!(page_bytes > 900_000, "pages of {page_bytes} B");
    assert_eq!(held, 64, "--cell-max-streams 64");
    assert_eq!(refused, 336);
    assert!(peak - baseline < 150.0, "+{:.1} MiB", peak - baseline);
    drop((kept, connections));
}

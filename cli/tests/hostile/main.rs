//! Hostile and broken clients against the real server process, on loopback, each bounded in
//! count and time: partial messages that would pin memory, a stream flood, a StreamClaims
//! reader that stops reading, half-open connections, more connections than allowed, descriptor
//! exhaustion, and a store that goes away.
//! Each test shows its bound holds (resident memory under the budget, connections closed by the
//! timeout, SETTINGS carrying the limit, GOAWAY with a reason, an accept loop that does not spin,
//! health following the store) while a normal client's LookupClaim keeps answering.
//!
//! One test binary; each module is one attack. The measured figures are printed (run with
//! `--nocapture`) and recorded in docs/reliability.md ("Limits").
#![cfg(target_os = "linux")]

#[path = "../common/mod.rs"]
mod common;

mod connections;
mod descriptors;
mod half_open;
mod health;
mod partial_messages;
mod stopped_reader;
mod stream_flood;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};
use topology_claims_harness::proc_stats::rss_kib;
use topology_claims_harness::serve::ServeChild;
use topology_claims_proto::pb;
use topology_claims_proto::pb::claims_service_client::ClaimsServiceClient;

/// The HTTP/2 client connection preface.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A `serve` child whose stderr goes to a file, so a test can count its log lines.
pub struct Target {
    pub child: ServeChild,
    pub log: PathBuf,
    _dir: TempDir,
}

impl Target {
    /// `serve --listen 127.0.0.1:0 --store memory: [args…]`.
    pub fn start(args: &[&str]) -> Target {
        Target::start_with(&["--store", "memory:"], args, |_| {})
    }

    /// `serve --listen 127.0.0.1:0 store… args…`, the command adjusted by `adjust` (to wrap it
    /// in a shell with a lower ulimit, say).
    pub fn start_with(
        store: &[&str],
        args: &[&str],
        adjust: impl FnOnce(&mut std::process::Command),
    ) -> Target {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("serve.log");
        let file = std::fs::File::create(&log).expect("log file");
        let mut command = common::command(
            dir.path(),
            &[&["serve", "--listen", "127.0.0.1:0"], store, args].concat(),
        );
        adjust(&mut command);
        command.stdin(Stdio::null()).stderr(Stdio::from(file));
        let child = ServeChild::start(command).unwrap_or_else(|e| {
            panic!(
                "serve: {e}\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        });
        Target {
            child,
            log,
            _dir: dir,
        }
    }

    pub fn addr(&self) -> String {
        self.child.addr.to_string()
    }

    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    pub fn rss_mib(&self) -> f64 {
        rss_kib(self.pid()).unwrap_or(0) as f64 / 1024.0
    }

    /// The server's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Lines of the log that contain `needle`.
    pub fn log_lines(&self, needle: &str) -> usize {
        self.log_text()
            .lines()
            .filter(|l| l.contains(needle))
            .count()
    }

    pub async fn channel(&self) -> Channel {
        Endpoint::from_shared(self.child.endpoint())
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .expect("connect")
    }

    /// A normal client's LookupClaim on a fresh connection answers (CLAIM_NOT_FOUND) within 5 s.
    pub async fn assert_lookup_answers(&self, during: &str) {
        let started = Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(5), async {
            let mut client = ClaimsServiceClient::new(self.channel().await);
            client
                .lookup_claim(pb::LookupClaimRequest {
                    claim_type: 2,
                    claim_value: "bystander".into(),
                    ..Default::default()
                })
                .await
        })
        .await
        .unwrap_or_else(|_| panic!("{during}: a normal LookupClaim got no answer within 5 s"));
        let status = answer.expect_err("nobody holds the bystander's claim");
        assert_eq!(status.code(), tonic::Code::NotFound, "{during}: {status:?}");
        println!(
            "{during}: a normal LookupClaim answered in {:?}",
            started.elapsed()
        );
    }
}

/// One HTTP/2 frame.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut bytes = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    bytes.push(kind);
    bytes.push(flags);
    bytes.extend_from_slice(&stream.to_be_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

/// A frame as read back: type, flags, stream, payload.
#[derive(Debug)]
pub struct Frame {
    pub kind: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

pub const SETTINGS: u8 = 0x4;
pub const RST_STREAM: u8 = 0x3;
pub const GOAWAY: u8 = 0x7;

/// Reads frames until the peer closes or `quiet` passes without a byte.
pub async fn read_frames(tcp: &mut TcpStream, quiet: Duration) -> Vec<Frame> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match tokio::time::timeout(quiet, tcp.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buffer.extend_from_slice(&chunk[..n]),
            _ => break,
        }
    }
    let mut frames = Vec::new();
    let mut rest = &buffer[..];
    while rest.len() >= 9 {
        let length = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        if rest.len() < 9 + length {
            break;
        }
        frames.push(Frame {
            kind: rest[3],
            stream: u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) & 0x7fff_ffff,
            payload: rest[9..9 + length].to_vec(),
        });
        rest = &rest[9 + length..];
    }
    frames
}

/// The value of setting `id` in a SETTINGS frame's payload.
pub fn setting(payload: &[u8], id: u16) -> Option<u32> {
    payload.chunks_exact(6).find_map(|entry| {
        (u16::from_be_bytes([entry[0], entry[1]]) == id)
            .then(|| u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]))
    })
}

/// A raw TCP connection that has sent the preface and an empty SETTINGS frame.
pub async fn raw_http2(addr: &str) -> TcpStream {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(PREFACE).await.unwrap();
    tcp.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
    tcp
}

/// An `h2` client connection (the connection driven on a task).
pub async fn h2_client(addr: &str) -> h2::client::SendRequest<Bytes> {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (send, connection) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    send
}

pub use common::attack::closed_by_peer;

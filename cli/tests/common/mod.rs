//! The real binary as a child process, shared by the binary-level tests: a clean command, and
//! a running `serve` that announced its port (both through the shared harness).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::Duration;

use topology_claims_harness::serve::{clean_command, ServeChild};

pub mod attack;
pub mod pg;
pub mod traffic;

pub const BIN: &str = env!("CARGO_BIN_EXE_topology-claims");
/// Guards against a hung child; never a speed assertion.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The binary with a clean environment (no ambient TOPOLOGY_CLAIMS_* settings), run in `dir`.
pub fn command(dir: &Path, args: &[&str]) -> Command {
    let mut command = clean_command(Path::new(BIN), args);
    command.current_dir(dir).env("RUST_LOG", "info");
    command
}

pub fn run(dir: &Path, args: &[&str]) -> Output {
    command(dir, args).output().expect("run topology-claims")
}

/// `--tls-ca CA --tls-cert CERT --tls-key KEY` of a client certificate that `pki` issues for
/// `role`/`name`.
pub fn client_tls_flags(
    pki: &topology_claims_harness::pki::DevPki,
    (role, name): (&str, &str),
) -> Vec<String> {
    let pair = pki.issue_client(role, name).unwrap();
    let path = |p: &Path| p.to_str().unwrap().to_owned();
    vec![
        "--tls-ca".into(),
        path(&pki.ca()),
        "--tls-cert".into(),
        path(&pair.cert),
        "--tls-key".into(),
        path(&pair.key),
    ]
}

/// Runs `topology-claims admin --server ENDPOINT` with the TLS flags of a client certificate
/// that `pki` issues for `role`/`name`, then `args`.
pub fn admin_as(
    dir: &Path,
    pki: &topology_claims_harness::pki::DevPki,
    endpoint: &str,
    identity: (&str, &str),
    args: &[&str],
) -> Output {
    let flags = client_tls_flags(pki, identity);
    let mut full = vec!["admin", "--server", endpoint];
    full.extend(flags.iter().map(String::as_str));
    full.extend_from_slice(args);
    command(dir, &full).output().unwrap()
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A running `serve` child; killed if the test ends without stopping it.
pub struct Server {
    pub child: ServeChild,
    pub addr: String,
}

impl Server {
    /// Starts `serve` and waits for its `listening on HOST:PORT` line.
    pub fn start(dir: &Path, args: &[&str]) -> Server {
        let mut command = command(dir, &[&["serve"], args].concat());
        command.stderr(Stdio::inherit());
        let child = ServeChild::start(command).unwrap_or_else(|e| panic!("serve: {e}"));
        Server {
            addr: child.addr.to_string(),
            child,
        }
    }

    /// [`Server::start`] from async code, on a blocking thread.
    pub async fn start_async(dir: &Path, args: Vec<String>) -> Server {
        let dir = dir.to_owned();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            Server::start(&dir, &args)
        })
        .await
        .expect("the serve start task")
    }

    /// A server on `memory:` listening on a free loopback port, with `extra` flags.
    pub async fn start_memory(dir: &Path, extra: &[&str]) -> Server {
        let mut args: Vec<String> = ["--listen", "127.0.0.1:0", "--store", "memory:"]
            .map(String::from)
            .to_vec();
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        Server::start_async(dir, args).await
    }

    pub fn endpoint(&self) -> String {
        self.child.endpoint()
    }

    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    pub fn signal(&self, name: &str) {
        self.child.signal(name).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Sends `signal` and waits for the exit.
    pub fn stop_with(self, signal: &str) -> ExitStatus {
        self.child
            .stop_with(signal, PATIENCE)
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

/// `GET path` over HTTP/1.1: (status code, body).
pub fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, body.to_owned())
}

pub fn scrape(addr: SocketAddr) -> String {
    let (status, body) = get(addr, "/metrics");
    assert_eq!(status, 200, "{body}");
    body
}

/// The value of the sample `name` whose labels include every one of `labels`.
pub fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

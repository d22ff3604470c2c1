//! Half-open connections: silent after connecting, after half the HTTP/2 preface, or after the
//! preface and a partial frame header. The handshake timeout, the idle timeout and the
//! keepalive close every one of them (none was closed after 60 s before).

use std::time::{Duration, Instant};

use futures::future::join_all;
use tokio::io::AsyncWriteExt;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_connections_are_closed_by_the_timeouts() {
    let target = Target::start(&[
        "--handshake-timeout",
        "1s",
        "--idle-timeout",
        "4s",
        "--keepalive-interval",
        "1s",
        "--keepalive-timeout",
        "1s",
    ]);
    let addr = target.addr();
    const EACH: usize = 100;
    let mut connections = Vec::new();
    for kind in ["silent", "half preface", "partial frame header"] {
        for _ in 0..EACH {
            let mut tcp = TcpStream::connect(&addr).await.expect("connect");
            match kind {
                "silent" => {}
                "half preface" => tcp.write_all(&PREFACE[..12]).await.unwrap(),
                _ => {
                    tcp.write_all(PREFACE).await.unwrap();
                    tcp.write_all(&frame(SETTINGS, 0, 0, &[])[..5])
                        .await
                        .unwrap();
                }
            }
            connections.push((kind, tcp));
        }
    }
    target
        .assert_lookup_answers("with 300 half-open connections")
        .await;
    let started = Instant::now();
    let closed = join_all(connections.into_iter().map(|(kind, mut tcp)| async move {
        (
            kind,
            closed_by_peer(&mut tcp, Duration::from_secs(20)).await,
            Instant::now(),
        )
    }))
    .await;
    for kind in ["silent", "half preface", "partial frame header"] {
        let of_kind: Vec<_> = closed.iter().filter(|(k, _, _)| *k == kind).collect();
        let n = of_kind.iter().filter(|(_, c, _)| *c).count();
        let last = of_kind
            .iter()
            .map(|(_, _, at)| at.duration_since(started))
            .max()
            .unwrap_or_default();
        println!("half-open ({kind}): {n} of {EACH} closed by the server, the last after {last:?}");
        assert_eq!(n, EACH, "{kind}: every connection is closed by the server");
    }
    target
        .assert_lookup_answers("after the half-open connections")
        .await;
}

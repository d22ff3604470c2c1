//! The partial-message attack: many streams each declare a 1 MiB BeginUpdate (under the server's
//! message limit, 1,088 KiB with the default `--max-batch`) and send all but its last byte,
//! then hold. Without a bound, every buffered byte stays (about 1 GB from one
//! client before); with it, the server holds at most the request-byte budgets and answers the
//! rest RESOURCE_EXHAUSTED.

use std::time::Duration;

use bytes::Bytes;
use futures::future::join_all;
use h2::SendStream;

use super::*;

const DECLARED: usize = 1024 * 1024;

/// How a stream ended: refused by the server with this grpc-status, or still held open.
#[derive(Debug, PartialEq)]
enum Fate {
    Refused(String),
    Held,
}

/// [`common::attack::push_partial`] of a `DECLARED`-byte message, as a [`Fate`].
async fn push_partial(
    stream: SendStream<Bytes>,
    response: h2::client::ResponseFuture,
    patience: Duration,
) -> Fate {
    match common::attack::push_partial(stream, response, DECLARED, patience).await {
        Some(status) => Fate::Refused(status),
        None => Fate::Held,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_messages_pin_no_more_than_the_request_byte_budgets() {
    // The defaults: 64 MiB for the server, 8 MiB per connection.
    let target = Target::start(&[]);
    let addr = target.addr();
    target.assert_lookup_answers("before the attack").await;
    let baseline = target.rss_mib();

    const CONNECTIONS: usize = 12;
    const STREAMS: usize = 100;
    let mut attacks = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut client = h2_client(&addr).await;
        for _ in 0..STREAMS {
            client = client.ready().await.expect("a stream slot");
            let request = http::Request::post(format!(
                "http://{addr}/topology.claims.v1.ClaimsService/BeginUpdate"
            ))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
            let (response, stream) = client.send_request(request, false).expect("send_request");
            attacks.push(tokio::spawn(push_partial(
                stream,
                response,
                Duration::from_secs(8),
            )));
        }
        clients.push(client);
    }
    // Sample the server's memory while the attack runs, and check on a bystander.
    let mut peak = target.rss_mib();
    let sampler = async {
        for _ in 0..40 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            peak = peak.max(target.rss_mib());
        }
    };
    let bystander = target.assert_lookup_answers("during the partial-message attack");
    tokio::join!(sampler, bystander);
    let fates: Vec<Fate> = join_all(attacks)
        .await
        .into_iter()
        .map(|joined| joined.expect("attack task"))
        .collect();
    peak = peak.max(target.rss_mib());
    let refused = fates
        .iter()
        .filter(|f| **f == Fate::Refused("8".into()))
        .count();
    let held = fates.iter().filter(|f| matches!(f, Fate::Held)).count();
    println!(
        "partial messages: {CONNECTIONS} connections x {STREAMS} streams declaring 1 MiB; \
         {refused} refused RESOURCE_EXHAUSTED, {held} held open within the budgets; server RSS \
         {baseline:.1} MiB before, peak {peak:.1} MiB (+{:.1} MiB)",
        peak - baseline
    );
    assert!(
        refused > 0,
        "the byte budgets refused nothing: {:?}",
        &fates[..5]
    );
    // The budget (64 MiB) plus HTTP/2 windows and per-stream state; before the bound this
    // attack pinned every byte it sent (1.2 GB attempted here).
    assert!(
        peak - baseline < 128.0,
        "the server grew by {:.1} MiB under the attack",
        peak - baseline
    );
    target
        .assert_lookup_answers("after the partial-message attack")
        .await;
    drop(clients);
}

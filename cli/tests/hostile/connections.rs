//! More connections than `--max-connections`: the one over the limit is told why (HTTP/2 GOAWAY
//! ENHANCE_YOUR_CALM naming the flag) and closed at once, instead of hanging in the backlog; a
//! gRPC client sees RESOURCE_EXHAUSTED (or UNAVAILABLE) at once; when a connection goes, new ones are served again.

use std::time::{Duration, Instant};

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_get_a_goaway_with_the_reason() {
    let target = Target::start(&["--max-connections", "4"]);
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(target.channel().await);
    }
    // Make sure all four are established server-side (a request on each).
    for channel in &held {
        let status = ClaimsServiceClient::new(channel.clone())
            .lookup_claim(pb::LookupClaimRequest {
                claim_type: 2,
                claim_value: "x".into(),
                ..Default::default()
            })
            .await
            .expect_err("not found");
        assert_eq!(status.code(), tonic::Code::NotFound);
    }

    let mut tcp = raw_http2(&target.addr()).await;
    let frames = read_frames(&mut tcp, Duration::from_secs(2)).await;
    let goaway = frames
        .iter()
        .find(|f| f.kind == GOAWAY)
        .expect("a GOAWAY for the connection over the limit");
    let code = u32::from_be_bytes([
        goaway.payload[4],
        goaway.payload[5],
        goaway.payload[6],
        goaway.payload[7],
    ]);
    let reason = String::from_utf8_lossy(&goaway.payload[8..]).into_owned();
    println!("over the limit: GOAWAY error {code:#x}: {reason}");
    assert_eq!(code, 0xb, "ENHANCE_YOUR_CALM");
    assert_eq!(goaway.stream, 0);
    assert!(reason.contains("--max-connections 4"), "{reason}");

    // A gRPC client over the limit fails fast, not at its deadline.
    let started = Instant::now();
    let refused = tokio::time::timeout(Duration::from_secs(10), async {
        let channel = Endpoint::from_shared(target.child.endpoint())
            .unwrap()
            .connect()
            .await;
        match channel {
            Err(e) => Err(tonic::Status::unavailable(e.to_string())),
            Ok(channel) => ClaimsServiceClient::new(channel)
                .lookup_claim(pb::LookupClaimRequest {
                    claim_type: 2,
                    claim_value: "x".into(),
                    ..Default::default()
                })
                .await
                .map(drop),
        }
    })
    .await
    .expect("an answer well before any deadline");
    let status = refused.expect_err("over the limit");
    println!(
        "over the limit: a gRPC client got {:?} after {:?}: {}",
        status.code(),
        started.elapsed(),
        status.message()
    );
    // The raw exchange above proves the GOAWAY; how a client library names it depends on
    // when it reads it: tonic says RESOURCE_EXHAUSTED (ENHANCE_YOUR_CALM), or CANCELLED when
    // the close overtakes its request. Either way it knows at once, not at a deadline.
    assert!(
        matches!(
            status.code(),
            tonic::Code::ResourceExhausted | tonic::Code::Unavailable | tonic::Code::Cancelled
        ),
        "{status:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));

    drop(held.pop());
    // The freed place is taken by the next client (the server notices the close promptly).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = tokio::time::timeout(Duration::from_secs(2), async {
            let channel = Endpoint::from_shared(target.child.endpoint())
                .unwrap()
                .connect()
                .await
                .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            ClaimsServiceClient::new(channel)
                .lookup_claim(pb::LookupClaimRequest {
                    claim_type: 2,
                    claim_value: "x".into(),
                    ..Default::default()
                })
                .await
        })
        .await;
        match answer {
            Ok(Err(status)) if status.code() == tonic::Code::NotFound => break,
            other => {
                assert!(Instant::now() < deadline, "no place freed: {other:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert!(target.log_lines("--max-connections reached") >= 1);
}

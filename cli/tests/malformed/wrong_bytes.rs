//! Bytes that are not the request message each method expects.

use prost::Message;
use tonic::Code;

use super::raw::raw_call;
use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_that_are_not_the_request_message_are_refused_on_every_method() {
    let mut server = Server::start();
    let channel = server.channel().await;
    let valid_begin = begin("cell-a", vec![claim(2, "raw")]).encode_to_vec();

    // (description, payload, codes accepted): protobuf that cannot be decoded is INVALID_ARGUMENT
    // from the authorization layer on the methods it reads (the ones with a cell_id), INTERNAL
    // from tonic's decoder on the others; decodable nonsense is INVALID_ARGUMENT from validation.
    let undecodable = [Code::Internal, Code::InvalidArgument];
    let cases: Vec<(&str, Vec<u8>, &[Code])> = vec![
        (
            "0xFF bytes (a tag with no end)",
            vec![0xFF; 16],
            &undecodable,
        ),
        (
            "a truncated BeginUpdateRequest",
            valid_begin[..valid_begin.len() - 1].to_vec(),
            &undecodable,
        ),
        (
            "a string field with invalid UTF-8",
            vec![0x0A, 0x02, 0xC3, 0x28],
            &undecodable,
        ),
        (
            "a string field sent as a varint",
            vec![0x08, 0x01],
            &undecodable,
        ),
        (
            "a length running past the end",
            vec![0x0A, 0x7F, b'a'],
            &undecodable,
        ),
        ("field number 0", vec![0x00, 0x01], &undecodable),
        // Decodes (all fields default): validation refuses it.
        ("an empty message", vec![], &[Code::InvalidArgument]),
        (
            "only an unknown field",
            vec![0xF8, 0x07, 0x01],
            &[Code::InvalidArgument],
        ),
    ];
    for method in METHODS {
        for (what, payload, codes) in &cases {
            let mut payload = payload.clone();
            if method == "LookupClaim" && what.starts_with("a string field") {
                // Its field 1 is the claim type (a varint); its string is field 2.
                payload[0] += 8;
            }
            let status = raw_call(&channel, method, payload).await.expect_err(what);
            assert!(
                codes.contains(&status.code()),
                "{method} with {what}: {status:?}"
            );
        }
    }
    // Unknown fields beside valid ones are ignored (forward compatibility).
    let mut with_unknown = valid_begin.clone();
    with_unknown.extend([0xF8, 0x07, 0x01]);
    let answer = raw_call(&channel, "BeginUpdate", with_unknown).await;
    let lease = pb::BeginUpdateResponse::decode(answer.expect("accepted").as_slice())
        .expect("a BeginUpdateResponse");
    assert!(lease.lease_payload.is_some());
    // A message of one method sent to another decodes as nonsense and is refused by validation.
    let lookup = pb::LookupClaimRequest {
        claim_type: 2,
        claim_value: "x".into(),
        ..Default::default()
    }
    .encode_to_vec();
    let status = raw_call(&channel, "CommitUpdate", lookup)
        .await
        .expect_err("refused");
    assert!(
        matches!(status.code(), Code::InvalidArgument | Code::Internal),
        "{status:?}"
    );
    // Seeded random garbage: any refusal, no harm.
    let mut rng = fastrand::Rng::with_seed(7);
    for round in 0..200 {
        let len = rng.usize(1..512);
        let payload: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
        let method = METHODS[round % METHODS.len()];
        if let Err(status) = raw_call(&channel, method, payload).await {
            assert_ne!(status.code(), Code::Unavailable, "{method}: {status:?}");
        }
    }
    // An unknown method.
    let status = raw_call(&channel, "DropAllClaims", vec![])
        .await
        .expect_err("unknown");
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");

    server.assert_still_serving().await;
}

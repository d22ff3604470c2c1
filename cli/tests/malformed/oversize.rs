//! Messages above the limit (1,088 KiB with the default `--max-batch` 1000) are refused at their
//! prefix; the largest valid batch is not.

use prost::Message;
use tonic::Code;

use super::raw::raw_call;
use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_messages_are_refused_by_the_transport_and_full_batches_are_not() {
    let mut server = Server::start();
    let channel = server.channel().await;
    for method in ["BeginUpdate", "LookupClaim"] {
        let status = raw_call(&channel, method, vec![0x0A; LIMIT + 1])
            .await
            .expect_err("above the limit");
        assert_eq!(status.code(), Code::OutOfRange, "{method}: {status:?}");
    }
    // A real request above the limit: 20,000 claims with 255-byte values (about 5.5 MB).
    let huge: Vec<pb::ClaimRecord> = (0..20_000)
        .map(|i| claim(3, &format!("{i:0>255}")))
        .collect();
    let request = begin("cell-a", huge);
    assert!(request.encoded_len() > LIMIT);
    let status = ClaimsServiceClient::new(channel.clone())
        .begin_update(request)
        .await
        .expect_err("above the limit");
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    // The largest valid request (1000 claims, every value 255 bytes) is well under it.
    let full: Vec<pb::ClaimRecord> = (0..1000)
        .map(|i| {
            let mut r = claim(3, &format!("{i:0>255}"));
            r.owner_value = "o".repeat(255);
            r
        })
        .collect();
    let request = begin(&"c".repeat(100), full);
    assert!(request.encoded_len() < LIMIT);
    ClaimsServiceClient::new(channel)
        .begin_update(request)
        .await
        .expect("the largest valid BeginUpdate is accepted");

    server.assert_still_serving().await;
}

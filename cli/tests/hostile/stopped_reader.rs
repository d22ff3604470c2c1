//! The stopped reader: a client opens StreamClaims over a cell of 100,000 large claims (about
//! 56 MB of ranges), reads one range and then stops reading. The server reads a range from its
//! store only when the previous one is taken, so its memory stays near the baseline however
//! large the table, instead of growing with the stream; and `--request-timeout` (2 s here) does
//! not cut the stream while it waits: after the pause the client reads it to the end.

use std::time::Duration;

use prost::Message;

use super::*;

const CLAIMS: usize = 100_000;
const BATCH: usize = 1000;
/// Most the server's resident memory may grow while the reader is stopped.
const GROWTH_BOUND_MIB: f64 = 32.0;

/// A 255-byte value (the longest allowed) starting with `prefix`.
fn long(prefix: &str) -> String {
    format!("{prefix}-{:x<255}", "")[..255].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_client_stops_reading_does_not_grow_server_memory() {
    let target = Target::start(&["--request-timeout", "2s"]);
    let mut client = ClaimsServiceClient::new(target.channel().await)
        .max_decoding_message_size(8 << 20)
        .max_encoding_message_size(8 << 20);
    for batch in 0..CLAIMS / BATCH {
        let creates_claims = (0..BATCH)
            .map(|i| {
                let n = batch * BATCH + i;
                pb::ClaimRecord {
                    claim_type: 2,
                    claim_value: long(&format!("user-{n}")),
                    owner: 3,
                    owner_value: long(&format!("owner-{n}")),
                    table_name: 1,
                    table_record_id: n as i64,
                    ..Default::default()
                }
            })
            .collect();
        let lease = client
            .begin_update(pb::BeginUpdateRequest {
                cell_id: "cell-a".into(),
                creates_claims,
                ..Default::default()
            })
            .await
            .expect("BeginUpdate")
            .into_inner()
            .lease_payload
            .expect("a lease");
        client
            .commit_update(pb::CommitUpdateRequest {
                cell_id: "cell-a".into(),
                lease_id: lease.lease_id,
            })
            .await
            .expect("CommitUpdate");
    }
    let request = pb::StreamClaimsRequest {
        cell_id: "cell-a".into(),
        table_name: 1,
        ..Default::default()
    };
    let baseline = target.rss_mib();

    let mut stream = client
        .stream_claims(request)
        .await
        .expect("StreamClaims")
        .into_inner();
    let first = stream.message().await.expect("a range").expect("not empty");
    let mut streamed = first.encoded_len();
    let mut ranges = 1;
    // Stop reading for 4 s (twice the request timeout) and watch the server's memory.
    let mut peak = target.rss_mib();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        peak = peak.max(target.rss_mib());
    }
    // Then read on: the stream was neither cut nor lost anything.
    let mut claims = first.claims.len();
    let mut last_end = first.end_range;
    while let Some(range) = stream.message().await.expect("the stream goes on") {
        assert_eq!(range.start_range, last_end, "ranges tile the id space");
        last_end = range.end_range;
        claims += range.claims.len();
        streamed += range.encoded_len();
        ranges += 1;
    }
    let streamed_mib = streamed as f64 / (1024.0 * 1024.0);
    println!(
        "stopped reader: {CLAIMS} claims, {ranges} ranges, {streamed_mib:.1} MiB streamed; \
         server RSS {baseline:.1} MiB before, peak {peak:.1} MiB (+{:.1} MiB) while the \
         reader was stopped for 4 s",
        peak - baseline
    );
    assert_eq!(claims, CLAIMS, "every claim once");
    assert_eq!(last_end, i64::MAX, "the last range reaches the end");
    assert!(
        streamed_mib > 1.5 * GROWTH_BOUND_MIB,
        "the whole stream ({streamed_mib:.1} MiB) must dwarf the bound for the test to mean \
         anything"
    );
    assert!(
        peak - baseline < GROWTH_BOUND_MIB,
        "server RSS grew by {:.1} MiB (from {baseline:.1} MiB) while the reader was stopped",
        peak - baseline
    );
    target
        .assert_lookup_answers("after the stopped reader")
        .await;
}

//! The stream flood: one connection opens thousands of header-only streams. The server's
//! SETTINGS carry MAX_CONCURRENT_STREAMS; streams past it are refused (RST_STREAM
//! REFUSED_STREAM, then GOAWAY once the client keeps at it) instead of each costing memory.

use std::time::Duration;

use tokio::io::AsyncWriteExt;

use super::*;

/// A HEADERS block (HPACK, no Huffman, nothing indexed): POST /…/LookupClaim, gRPC headers.
fn lookup_headers() -> Vec<u8> {
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http (static table)
    let literal = |block: &mut Vec<u8>, name_index: u8, value: &str| {
        block.push(name_index); // literal without indexing, indexed name (< 15)
        block.push(value.len() as u8);
        block.extend_from_slice(value.as_bytes());
    };
    literal(
        &mut block,
        0x04,
        "/topology.claims.v1.ClaimsService/LookupClaim",
    );
    literal(&mut block, 0x01, "localhost");
    // content-type is static index 31: a 4-bit prefix of 15, then 16.
    block.extend_from_slice(&[0x0f, 0x10, 16]);
    block.extend_from_slice(b"application/grpc");
    // te: trailers (a new name).
    block.extend_from_slice(&[0x00, 2]);
    block.extend_from_slice(b"te");
    block.push(8);
    block.extend_from_slice(b"trailers");
    block
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_flood_meets_the_stream_limit_in_the_settings() {
    let target = Target::start(&[]);
    let baseline = target.rss_mib();
    let mut tcp = raw_http2(&target.addr()).await;
    let headers = lookup_headers();
    const STREAMS: u32 = 20_000;
    let mut flood = Vec::with_capacity(STREAMS as usize * (9 + headers.len()));
    for i in 0..STREAMS {
        // END_HEADERS, not END_STREAM: each stream waits for a body that never comes.
        flood.extend_from_slice(&frame(0x1, 0x4, 2 * i + 1, &headers));
    }
    // The server may close the connection part-way: that is one of the answers we accept.
    let _ = tcp.write_all(&flood).await;
    let frames = read_frames(&mut tcp, Duration::from_secs(2)).await;
    let peak = target.rss_mib();
    let max_streams = frames
        .iter()
        .find(|f| f.kind == SETTINGS && !f.payload.is_empty())
        .and_then(|f| setting(&f.payload, 0x3));
    let refused = frames
        .iter()
        .filter(|f| f.kind == RST_STREAM && f.payload == [0, 0, 0, 0x7])
        .count();
    let goaway = frames.iter().find(|f| f.kind == GOAWAY);
    println!(
        "stream flood: {STREAMS} header-only streams on one connection; SETTINGS \
         MAX_CONCURRENT_STREAMS={max_streams:?}, {refused} RST_STREAM(REFUSED_STREAM), GOAWAY: \
         {}; server RSS {baseline:.1} -> {peak:.1} MiB",
        goaway.map_or("none".to_owned(), |g| format!(
            "error {:#x}",
            u32::from_be_bytes([g.payload[4], g.payload[5], g.payload[6], g.payload[7]])
        )),
    );
    assert_eq!(
        max_streams,
        Some(100),
        "the SETTINGS carry the stream limit"
    );
    assert!(
        refused > 0 || goaway.is_some(),
        "streams past the limit were neither refused nor answered with GOAWAY"
    );
    assert!(
        peak - baseline < 64.0,
        "the server grew by {:.1} MiB under the flood (177 MB before the limit)",
        peak - baseline
    );
    target.assert_lookup_answers("after the stream flood").await;
}

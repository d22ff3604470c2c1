//! Broken gRPC framing over raw HTTP/2 (the `h2` crate): refused without harm.

use std::time::Duration;

use bytes::{BufMut, Bytes};
use prost::Message;
use tonic::Code;

use super::*;

/// What came back for a raw HTTP/2 request: the HTTP status and the grpc-status, if any.
#[derive(Debug)]
struct RawAnswer {
    http: u16,
    grpc_status: Option<i32>,
}

/// Sends one HTTP/2 request with `headers` and the raw `body` frames, then optionally resets
/// the stream instead of ending it.
async fn raw_http2(
    addr: &str,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[&[u8]],
    reset: bool,
) -> Result<RawAnswer, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (client, connection) = h2::client::handshake(tcp)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut client = client.ready().await.map_err(|e| e.to_string())?;
    let request = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("content-type", content_type)
        .header("te", "trailers")
        .body(())
        .map_err(|e| e.to_string())?;
    let (response, mut stream) = client
        .send_request(request, body.is_empty() && !reset)
        .map_err(|e| e.to_string())?;
    for (i, chunk) in body.iter().enumerate() {
        let last = i + 1 == body.len() && !reset;
        stream
            .send_data(Bytes::copy_from_slice(chunk), last)
            .map_err(|e| e.to_string())?;
    }
    if reset {
        stream.send_reset(h2::Reason::CANCEL);
        return Ok(RawAnswer {
            http: 0,
            grpc_status: None,
        });
    }
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .map_err(|_| "no response within 10s".to_owned())?
        .map_err(|e| e.to_string())?;
    let http = response.status().as_u16();
    let grpc = |headers: &http::HeaderMap| {
        headers
            .get("grpc-status")
            .and_then(|v| v.to_str().ok()?.parse().ok())
    };
    let mut grpc_status = grpc(response.headers());
    let mut body = response.into_body();
    while let Some(data) = body.data().await {
        let data = data.map_err(|e| e.to_string())?;
        let _ = body.flow_control().release_capacity(data.len());
    }
    if let Ok(Some(trailers)) = body.trailers().await {
        grpc_status = grpc_status.or(grpc(&trailers));
    }
    Ok(RawAnswer { http, grpc_status })
}

/// A gRPC message frame: compressed flag, big-endian length, bytes.
fn frame(compressed: u8, length: u32, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![compressed];
    out.put_u32(length);
    out.extend_from_slice(bytes);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_grpc_framing_over_raw_http2_is_refused_without_harm() {
    let mut server = Server::start();
    let addr = server.addr();
    let path = format!("{SERVICE}BeginUpdate");
    let valid = begin("cell-a", vec![claim(2, "framed")]).encode_to_vec();
    let length = valid.len() as u32;
    let grpc = "application/grpc";

    // The control case: a well-formed frame through the same raw client succeeds.
    let answer = raw_http2(
        &addr,
        "POST",
        &path,
        grpc,
        &[&frame(0, length, &valid)],
        false,
    )
    .await
    .unwrap();
    assert_eq!(
        (answer.http, answer.grpc_status),
        (200, Some(0)),
        "{answer:?}"
    );

    // Refused before any handler runs: by the request guard (OUT_OF_RANGE for a length above
    // the limit, at its prefix) or by the authorization layer, which reads BeginUpdate's one
    // message and fails closed on what it cannot parse (INVALID_ARGUMENT; INTERNAL for a
    // compressed flag without an encoding, as the gRPC spec says).
    let half = valid.len() / 2;
    let internal = Code::Internal as i32;
    let invalid = Code::InvalidArgument as i32;
    let refused: Vec<(&str, &str, Vec<Vec<u8>>, i32)> = vec![
        (
            "compressed flag without grpc-encoding",
            grpc,
            vec![frame(1, length, &valid)],
            internal,
        ),
        (
            "an unknown flag value",
            grpc,
            vec![frame(7, length, &valid)],
            invalid,
        ),
        (
            "a length longer than the body",
            grpc,
            vec![frame(0, length + 100, &valid)],
            invalid,
        ),
        (
            "a frame header cut short",
            grpc,
            vec![vec![0, 0, 0]],
            invalid,
        ),
        (
            "a length of 4 GiB",
            grpc,
            vec![frame(0, u32::MAX, &valid)],
            Code::OutOfRange as i32,
        ),
        ("no message at all", grpc, vec![], invalid),
        (
            "a message cut in half",
            grpc,
            vec![frame(0, length, &valid[..half])],
            invalid,
        ),
        // `{"ce` reads as a prefix declaring about 580 MB: refused at the prefix.
        (
            "JSON instead of a gRPC frame",
            "application/json",
            vec![b"{\"cell_id\":\"a\"}".to_vec()],
            Code::OutOfRange as i32,
        ),
    ];
    for (what, content_type, body, expected) in &refused {
        let chunks: Vec<&[u8]> = body.iter().map(Vec::as_slice).collect();
        let answer = raw_http2(&addr, "POST", &path, content_type, &chunks, false)
            .await
            .unwrap_or_else(|e| panic!("{what}: the server did not answer: {e}"));
        assert_eq!(
            (answer.http, answer.grpc_status),
            (200, Some(*expected)),
            "{what}: {answer:?}"
        );
    }

    // Streams that the server must simply survive: two messages on a unary call, a GET, a
    // stream reset mid-message, and a connection that is not HTTP/2 at all.
    let two = [frame(0, length, &valid), frame(0, length, &valid)];
    let _ = raw_http2(&addr, "POST", &path, grpc, &[&two[0], &two[1]], false).await;
    let _ = raw_http2(&addr, "GET", &path, grpc, &[], false).await;
    let _ = raw_http2(
        &addr,
        "POST",
        &path,
        grpc,
        &[&frame(0, length, &valid[..half])],
        true,
    )
    .await;
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
        tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\x00\x01garbage")
            .await
            .unwrap();
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut sink)).await;
    }

    server.assert_still_serving().await;
}

//! Moves of hostile clients shared by the attack tests (hostile/, security/): a partial gRPC
//! message held open, and waiting for the server to close a connection.

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt};

static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

/// Sends the 5-byte gRPC prefix declaring `declared` bytes, then zeros as flow control allows
/// until all but the last byte are out, and holds. `Some(grpc-status)` (or `stream error: …`)
/// when the server answered within `patience`, `None` when the stream was still held.
pub async fn push_partial(
    mut stream: h2::SendStream<Bytes>,
    response: h2::client::ResponseFuture,
    declared: usize,
    patience: Duration,
) -> Option<String> {
    let mut prefix = vec![0u8];
    prefix.extend_from_slice(&(declared as u32).to_be_bytes());
    let _ = stream.send_data(Bytes::from(prefix), false);
    let sending = async {
        let mut sent = 0;
        while sent < declared - 1 {
            stream.reserve_capacity((declared - 1 - sent).min(ZEROS.len()));
            match futures::future::poll_fn(|cx| stream.poll_capacity(cx)).await {
                Some(Ok(n)) if n > 0 => {
                    let n = n.min(declared - 1 - sent);
                    if stream
                        .send_data(Bytes::from_static(&ZEROS[..n]), false)
                        .is_err()
                    {
                        break;
                    }
                    sent += n;
                }
                Some(Ok(_)) => continue,
                _ => break,
            }
        }
        // Hold: never send the last byte.
        std::future::pending::<()>().await;
    };
    tokio::select! {
        answer = response => Some(match answer {
            Ok(response) => response
                .headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("(none)")
                .to_owned(),
            Err(e) => format!("stream error: {e}"),
        }),
        _ = tokio::time::timeout(patience, sending) => None,
    }
}

/// Whether the peer has closed `stream` (a read returns 0 or an error) within `patience`.
pub async fn closed_by_peer<S: AsyncRead + Unpin>(stream: &mut S, patience: Duration) -> bool {
    let mut sink = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut sink)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

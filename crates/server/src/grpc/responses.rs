//! Responses in flight: the list and stream calls one cell may have open at once
//! (`--cell-max-streams`), and the response a reader stops taking (`--stall-timeout`).
//!
//! A list page is up to `--max-response-bytes` (1 MiB) and is held by the server until the
//! client's HTTP/2 window takes it. A cell that opens many list streams with a window of 0 (and
//! answers PINGs, so keepalive never cuts it) would pin a page per stream: 400 streams held
//! 355 MiB. So each cell's ListClaims, StreamClaims and ListOutstandingLeases calls are counted
//! from authorization until their response body is done or dropped, and one over the cap is
//! refused RESOURCE_EXHAUSTED (`RATE_LIMITED`, `limit=cell-max-streams`, with a RetryInfo); and a
//! response body that HTTP/2 has not asked for its next frame for `--stall-timeout` (while the
//! body itself was not waiting on the store) is dropped by a watchdog, freeing its page and its
//! slot, and answers the stream with CANCELLED when HTTP/2 next polls it.
//!
//! Owns these two bounds; which cell a request acts for is `authz`'s to say.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::Notify;
use tonic::body::Body;
use tonic::Status;

use topology_claims::error::ClaimsError;

/// `--cell-max-streams`' default.
pub const DEFAULT_CELL_MAX_STREAMS: usize = 64;
/// `--stall-timeout`'s default.
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The RetryInfo of a refusal at `--cell-max-streams`: a page is read in well under a second.
const STREAMS_RETRY_HINT: Duration = Duration::from_millis(200);

/// The bounds of responses in flight, shared by every request of a server.
#[derive(Debug)]
pub struct ResponseLimits {
    max_streams: usize,
    stall_timeout: Duration,
    /// Open list and stream calls by cell; only cells with one open have an entry.
    open: Mutex<HashMap<String, usize>>,
    /// Responses dropped for a stalled reader, since start.
    pub stalled: AtomicU64,
    /// `topology_claims_responses_stalled_total`, when the server has metrics.
    metric: Option<prometheus::IntCounter>,
}

impl ResponseLimits {
    /// The bounds; `metric` counts the responses dropped for a stalled reader.
    pub fn new(
        max_streams: usize,
        stall_timeout: Duration,
        metric: Option<prometheus::IntCounter>,
    ) -> Result<Arc<Self>, ClaimsError> {
        if max_streams == 0 {
            return Err(ClaimsError::Configuration {
                message: "--cell-max-streams must be at least 1".into(),
            });
        }
        if stall_timeout.is_zero() {
            return Err(ClaimsError::Configuration {
                message: "--stall-timeout must not be zero".into(),
            });
        }
        Ok(Arc::new(Self {
            max_streams,
            stall_timeout,
            open: Mutex::default(),
            stalled: AtomicU64::new(0),
            metric,
        }))
    }

    /// A slot for one more list or stream call of `cell`, or the refusal.
    pub fn admit(self: &Arc<Self>, cell: &str) -> Result<StreamSlot, ClaimsError> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(cell.to_owned()).or_default();
        if *count >= self.max_streams {
            return Err(ClaimsError::RateLimited {
                limit: "cell-max-streams",
                cell_id: cell.to_owned(),
                retry_after: STREAMS_RETRY_HINT,
            });
        }
        *count += 1;
        Ok(StreamSlot {
            limits: Arc::clone(self),
            cell: cell.to_owned(),
        })
    }

    /// Open list and stream calls of `cell`.
    pub fn open(&self, cell: &str) -> usize {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.get(cell).copied().unwrap_or(0)
    }

    /// `body` under the stall watchdog: dropped when HTTP/2 has not asked it for a frame for
    /// `--stall-timeout` (while it was not itself waiting on the store). Its data is handed to
    /// HTTP/2 in copied chunks of [`CHUNK_BYTES`], so what HTTP/2 buffers for a stalled reader
    /// is one chunk, and the page itself goes with the body. One task per watched response,
    /// which ends with the response.
    pub fn watch(self: &Arc<Self>, body: Body) -> Body {
        let shared = Arc::new(Watched {
            state: Mutex::new(Some((body, Bytes::new()))),
            started: tokio::time::Instant::now(),
            last_poll_ms: AtomicU64::new(0),
            waiting_on_itself: AtomicBool::new(false),
            done: Notify::new(),
        });
        let watchdog = Arc::clone(&shared);
        let (limits, timeout) = (Arc::clone(self), self.stall_timeout);
        tokio::spawn(async move {
            loop {
                let last = Duration::from_millis(watchdog.last_poll_ms.load(Ordering::Relaxed));
                let due = watchdog.started + last + timeout;
                tokio::select! {
                    () = watchdog.done.notified() => return,
                    () = tokio::time::sleep_until(due) => {}
                }
                let last_now = watchdog.last_poll_ms.load(Ordering::Relaxed);
                if Duration::from_millis(last_now) != last
                    || watchdog.waiting_on_itself.load(Ordering::Relaxed)
                {
                    continue;
                }
                let dropped = watchdog
                    .state
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take();
                if dropped.is_some() {
                    limits.stalled.fetch_add(1, Ordering::Relaxed);
                    if let Some(metric) = &limits.metric {
                        metric.inc();
                    }
                    tracing::info!(
                        ?timeout,
                        "a response's reader took nothing for --stall-timeout: response dropped"
                    );
                }
                return;
            }
        });
        Body::new(Watching { shared })
    }
}

/// The most bytes of a watched response handed to HTTP/2 at a time (copied, so that a chunk
/// HTTP/2 holds for a stalled reader does not keep the whole page alive).
pub const CHUNK_BYTES: usize = 64 * 1024;

/// One open list or stream call of a cell, until dropped.
#[derive(Debug)]
pub struct StreamSlot {
    limits: Arc<ResponseLimits>,
    cell: String,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self
            .limits
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.cell) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.cell);
            }
        }
    }
}

struct Watched {
    /// The body and the rest of its last data frame; `None` once the watchdog dropped them.
    state: Mutex<Option<(Body, Bytes)>>,
    started: tokio::time::Instant,
    /// When HTTP/2 last asked for a frame, in milliseconds since `started`: progress, as the
    /// watchdog sees it.
    last_poll_ms: AtomicU64,
    /// The body's last poll was pending on the body itself (the store), not on the reader.
    waiting_on_itself: AtomicBool,
    done: Notify,
}

struct Watching {
    shared: Arc<Watched>,
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.shared.done.notify_one();
    }
}

/// The next chunk of `rest`, copied out of it.
fn next_chunk(rest: &mut Bytes) -> Frame<Bytes> {
    let n = rest.len().min(CHUNK_BYTES);
    let chunk = Bytes::copy_from_slice(&rest[..n]);
    bytes::Buf::advance(rest, n);
    Frame::data(chunk)
}

impl HttpBody for Watching {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let shared = &self.shared;
        let now = shared.started.elapsed().as_millis();
        shared
            .last_poll_ms
            .store(u64::try_from(now).unwrap_or(u64::MAX), Ordering::Relaxed);
        let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
        let Some((inner, rest)) = state.as_mut() else {
            return Poll::Ready(Some(Err(Status::cancelled(
                "the response was dropped: its reader took nothing for the server's \
                 --stall-timeout",
            ))));
        };
        if !rest.is_empty() {
            return Poll::Ready(Some(Ok(next_chunk(rest))));
        }
        let polled = Pin::new(inner).poll_frame(cx);
        shared
            .waiting_on_itself
            .store(polled.is_pending(), Ordering::Relaxed);
        match polled {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) if data.len() > CHUNK_BYTES => {
                    *rest = data;
                    Poll::Ready(Some(Ok(next_chunk(rest))))
                }
                Ok(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
                Err(frame) => Poll::Ready(Some(Ok(frame))),
            },
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        let state = self
            .shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state
            .as_ref()
            .is_some_and(|(body, rest)| rest.is_empty() && body.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_holds_at_most_its_streams_and_gets_them_back() {
        let limits = ResponseLimits::new(2, DEFAULT_STALL_TIMEOUT, None).unwrap();
        let a = limits.admit("cell-a").unwrap();
        let b = limits.admit("cell-a").unwrap();
        let refused = limits.admit("cell-a").unwrap_err();
        assert!(
            matches!(
                refused,
                ClaimsError::RateLimited {
                    limit: "cell-max-streams",
                    ..
                }
            ),
            "{refused:?}"
        );
        let other = limits.admit("cell-b").unwrap();
        drop(a);
        let c = limits.admit("cell-a").unwrap();
        drop((b, c, other));
        assert_eq!(limits.open("cell-a"), 0);
        assert!(limits.open.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_response_nobody_polls_is_dropped_after_the_stall_timeout() {
        let metric = prometheus::IntCounter::new("stalled_total", "stalled").unwrap();
        let limits =
            ResponseLimits::new(1, Duration::from_millis(100), Some(metric.clone())).unwrap();
        let slot = limits.admit("cell-a").unwrap();
        let inner = Body::new(crate::grpc::cell_limits::Holding::new(
            http_body_util::Full::new(Bytes::from_static(b"page")),
            slot,
        ));
        let mut watched = limits.watch(inner);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while limits.stalled.load(Ordering::Relaxed) == 0 && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(limits.stalled.load(Ordering::Relaxed), 1);
        assert_eq!(
            limits.open("cell-a"),
            0,
            "the dropped body gave its slot back"
        );
        let polled = std::future::poll_fn(|cx| Pin::new(&mut watched).poll_frame(cx)).await;
        let status = polled.unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Cancelled);
    }

    #[tokio::test]
    async fn a_response_that_is_read_is_left_alone() {
        let limits = ResponseLimits::new(1, Duration::from_millis(300), None).unwrap();
        // A page larger than a chunk comes out whole, a chunk at a time.
        let page: Vec<u8> = (0..CHUNK_BYTES * 2 + 7).map(|i| i as u8).collect();
        let mut watched = limits.watch(Body::new(http_body_util::Full::new(Bytes::from(
            page.clone(),
        ))));
        let mut got = Vec::new();
        while let Some(frame) =
            std::future::poll_fn(|cx| Pin::new(&mut watched).poll_frame(cx)).await
        {
            let data = frame.unwrap().into_data().unwrap();
            assert!(data.len() <= CHUNK_BYTES);
            got.extend_from_slice(&data);
        }
        assert_eq!(got, page);
        drop(watched);
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(limits.stalled.load(Ordering::Relaxed), 0);
    }
}

//! The accept loop and the connections it hands to the HTTP/2 server, with their bounds:
//!
//! - at most `max_connections` open; one over it is accepted, sent an HTTP/2 GOAWAY
//!   (ENHANCE_YOUR_CALM, with a reason) and closed, so the client sees why instead of hanging in
//!   the listen backlog (at most 64 refusals are written at once; past that, closed at once). On
//!   a TLS listener the GOAWAY is sent after the handshake, inside TLS, so the client reads it;
//! - at most `max_handshakes_per_address` TLS handshakes in flight from one peer address; one
//!   more connection from it is closed at once, so a peer that never finishes its handshakes
//!   (it has no identity yet) holds only that many of the `max_connections` places;
//! - at most `max_anonymous_connections` TLS connections without a verified identity; one more
//!   is told GOAWAY naming `--max-anonymous-connections` right after its handshake, so callers
//!   without a certificate can never take the cells' places;
//! - a failing `accept` (EMFILE, ENFILE, ENOBUFS, …) backs off (10 ms doubling to 1 s) instead of
//!   spinning, is counted, and is logged at most every 5 s with the number of failures in between;
//!   service resumes as soon as descriptors free;
//! - the peer must finish its TLS handshake (if any) and send the 24-byte HTTP/2 client preface,
//!   checked byte for byte on the decrypted stream (or, when the server serves REST, a whole
//!   HTTP/1.x request line of at most 8 KiB), within `handshake_timeout` of the accept: a
//!   total deadline that a trickle of bytes does not extend; a peer that sends nothing at all for
//!   `idle_timeout` is cut off (live clients answer the server's keepalive pings, so they never
//!   get there);
//! - each connection carries its own budget of request bytes in flight ([`ConnInfo`]), which
//!   `guard` charges.
//!
//! Owns sockets and timers only; knows nothing of gRPC methods or the store.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tonic::transport::server::Connected;

use crate::auth::Caller;
use crate::grpc::handshakes::{HandshakeSlot, HandshakeSlots};
use crate::grpc::limits::ServerLimits;
use crate::grpc::tls::ServerTls;
use topology_claims_proto::log::RateLimitedLog;

/// The HTTP/2 client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The longest HTTP/1.x request line a connection may open with (hyper's own limit on a whole
/// head is larger; this one bounds what the deadline waits for).
const MAX_REQUEST_LINE: usize = 8 * 1024;
/// Longest a refusal may hold its descriptor (its TLS handshake included).
const REFUSAL_TIME: Duration = Duration::from_secs(2);
const BACKOFF_MIN: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Refusals being written at once; past it a connection over the limit is closed without its
/// GOAWAY (each refusal holds a descriptor for up to a second).
const REFUSALS_IN_FLIGHT: usize = 64;
/// Longest the acceptor waits for the place of a handshake it closed ([`Acceptor::evict_for`]).
const EVICTION_WAIT: Duration = Duration::from_millis(200);

/// What the transport refused or cut off, since start. Read by operators through the logs (and
/// by the metrics endpoint once there is one).
#[derive(Debug, Default)]
pub struct ServerStats {
    pub accept_errors: AtomicU64,
    pub connections_refused: AtomicU64,
    pub handshake_timeouts: AtomicU64,
    /// Connections closed in their TLS handshake to give their place to a new one.
    pub handshakes_evicted: AtomicU64,
    pub idle_timeouts: AtomicU64,
    pub requests_over_byte_budget: AtomicU64,
    pub requests_timed_out: AtomicU64,
}

impl ServerStats {
    pub fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// What every request of a connection can see about it (a request extension).
#[derive(Clone, Debug)]
pub struct ConnInfo {
    pub remote_addr: Option<SocketAddr>,
    pub local_addr: Option<SocketAddr>,
    /// Bytes of request bodies this connection may have buffered at once.
    pub(crate) request_bytes: Arc<Semaphore>,
    /// Who is calling: anonymous on a plaintext server, else from the client certificate.
    pub caller: Caller,
}

/// The listener as a stream of bounded connections, for `serve_with_incoming_shutdown`; with
/// `tls`, each is handshaken on a task of its own (bounded by the handshake timeout), so a slow
/// handshake never holds up the others.
pub fn incoming(
    listener: TcpListener,
    limits: &ServerLimits,
    stats: Arc<ServerStats>,
    tls: Option<Arc<ServerTls>>,
) -> impl Stream<Item = Result<ServerConn, io::Error>> + Send + 'static {
    let mut acceptor = Acceptor {
        listener,
        connections: Arc::new(Semaphore::new(limits.max_connections)),
        refusals: Arc::new(Semaphore::new(REFUSALS_IN_FLIGHT)),
        limits: limits.clone(),
        stats,
        tls: tls.clone(),
        backoff: Duration::ZERO,
        failures_since_success: 0,
        accept_log: RateLimitedLog::default(),
        refuse_log: Arc::new(RateLimitedLog::default()),
        evict_log: RateLimitedLog::default(),
        handshakes: tls
            .as_ref()
            .map(|_| Arc::new(HandshakeSlots::new(limits.max_handshakes_per_address))),
    };
    let anonymous = Anonymous {
        permits: Arc::new(Semaphore::new(limits.max_anonymous_connections)),
        max: limits.max_anonymous_connections,
        stats: Arc::clone(&acceptor.stats),
        log: Arc::new(RateLimitedLog::default()),
    };
    let (ready, connections) = tokio::sync::mpsc::channel::<ServerConn>(64);
    tokio::spawn(async move {
        loop {
            let conn = tokio::select! {
                // The server stopped accepting: let the listening socket go.
                () = ready.closed() => return,
                conn = acceptor.next() => conn,
            };
            match &tls {
                None => {
                    let info = conn.info.clone();
                    let conn = ServerConn::new(Io::Plain(conn), info, None);
                    if ready.send(conn).await.is_err() {
                        return;
                    }
                }
                Some(tls) => {
                    let (tls, ready, anonymous) =
                        (Arc::clone(tls), ready.clone(), anonymous.clone());
                    tokio::spawn(async move {
                        if let Some(conn) = handshake(conn, &tls, &anonymous).await {
                            let _ = ready.send(conn).await;
                        }
                    });
                }
            }
        }
    });
    futures::stream::unfold(connections, |mut connections| async move {
        let conn = connections.recv().await?;
        Some((Ok(conn), connections))
    })
}

/// The places of TLS connections without a verified identity (`--max-anonymous-connections`).
#[derive(Clone)]
struct Anonymous {
    permits: Arc<Semaphore>,
    max: usize,
    stats: Arc<ServerStats>,
    log: Arc<RateLimitedLog>,
}

/// The TLS handshake of one connection, by the connection's handshake deadline; `None` (logged
/// at debug) when it fails (a client with a certificate of another CA, an expired one, or plain
/// HTTP/2), or when a caller without a verified identity finds no place left (told GOAWAY).
async fn handshake(
    mut conn: LimitedConn,
    tls: &ServerTls,
    anonymous: &Anonymous,
) -> Option<ServerConn> {
    let mut info = conn.info.clone();
    let deadline = conn.handshake_deadline;
    let slot = conn.handshake_slot.take();
    let evicted = slot.as_ref().map(|slot| Arc::clone(&slot.evicted));
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
    let accepting = tokio::time::timeout_at(deadline, acceptor.accept(conn));
    let accepted = match evicted {
        Some(evicted) => tokio::select! {
            accepted = accepting => accepted,
            () = evicted.notified() => {
                tracing::debug!(peer = ?info.remote_addr, "TLS handshake closed: its place went to a new connection");
                return None;
            }
        },
        None => accepting.await,
    };
    drop(slot);
    match accepted {
        Ok(Ok(mut stream)) => {
            info.caller = tls.caller(stream.get_ref().1.peer_certificates());
            let place = if matches!(info.caller, Caller::Verified(_)) {
                None
            } else {
                match Arc::clone(&anonymous.permits).try_acquire_owned() {
                    Ok(place) => Some(place),
                    Err(_) => {
                        ServerStats::count(&anonymous.stats.connections_refused);
                        if let Some(held_back) = anonymous.log.ready() {
                            tracing::warn!(
                                peer = ?info.remote_addr,
                                max_anonymous_connections = anonymous.max,
                                refused_since_last_line = held_back,
                                "connection without a verified identity refused: \
                                 --max-anonymous-connections reached"
                            );
                        }
                        let reason = format!(
                            "connection limit for callers without a verified identity reached \
                             (--max-anonymous-connections {}); present a client certificate, or \
                             retry with backoff",
                            anonymous.max
                        );
                        let _ =
                            tokio::time::timeout(REFUSAL_TIME, say_goaway(&mut stream, &reason))
                                .await;
                        return None;
                    }
                }
            };
            Some(ServerConn::new(Io::Tls(Box::new(stream)), info, place))
        }
        Ok(Err(e)) => {
            tracing::debug!(peer = ?info.remote_addr, error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(peer = ?info.remote_addr, "TLS handshake timed out");
            None
        }
    }
}

/// A connection as the HTTP/2 server sees it: plain, or TLS on top of the bounded connection,
/// with the preface check on what it decrypts.
pub struct ServerConn {
    io: Io,
    info: ConnInfo,
    preface: Preface,
    /// Its place among the connections without a verified identity, if it is one.
    _anonymous: Option<OwnedSemaphorePermit>,
}

// One per connection, never moved after it is made: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
enum Io {
    Plain(LimitedConn),
    Tls(Box<tokio_rustls::server::TlsStream<LimitedConn>>),
}

impl ServerConn {
    fn new(io: Io, info: ConnInfo, anonymous: Option<OwnedSemaphorePermit>) -> Self {
        let limited = match &io {
            Io::Plain(conn) => conn,
            Io::Tls(stream) => stream.get_ref().0,
        };
        let preface = Preface {
            matched: Some(0),
            http1: limited.accept_http1.then(RequestLine::default),
            deadline: Some(Box::pin(tokio::time::sleep_until(
                limited.handshake_deadline,
            ))),
            timeout: limited.handshake_timeout,
            stats: Arc::clone(&limited.stats),
        };
        Self {
            io,
            info,
            preface,
            _anonymous: anonymous,
        }
    }
}

/// The HTTP/2 client preface the peer owes (or, with REST, an HTTP/1.x request line): how much
/// of it came, and by when the rest must.
struct Preface {
    /// Bytes of the HTTP/2 preface matched so far; `None` once the bytes left it.
    matched: Option<usize>,
    /// With REST served: the request line the same bytes may be instead.
    http1: Option<RequestLine>,
    /// `None` once the whole preface (or request line) came.
    deadline: Option<Pin<Box<Sleep>>>,
    timeout: Duration,
    stats: Arc<ServerStats>,
}

impl Preface {
    /// Before a read: the error that closes a connection past its deadline.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Result<(), io::Error> {
        let passed = self
            .deadline
            .as_mut()
            .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
        if passed {
            ServerStats::count(&self.stats.handshake_timeouts);
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no TLS handshake and HTTP/2 client preface within --handshake-timeout \
                         {:?}",
                    self.timeout
                ),
            ))
        } else {
            Ok(())
        }
    }

    /// After a read of `received` bytes: the error that closes a connection whose first bytes
    /// are not the preface.
    fn check(&mut self, received: &[u8]) -> Result<(), io::Error> {
        for &byte in received {
            if self.deadline.is_none() {
                return Ok(());
            }
            if let Some(matched) = self.matched {
                if byte == PREFACE[matched] {
                    self.matched = Some(matched + 1).filter(|m| *m < PREFACE.len());
                    if self.matched.is_none() {
                        self.deadline = None;
                    }
                } else {
                    self.matched = None;
                }
            }
            let preface_left = self.matched.is_some();
            match self
                .http1
                .as_mut()
                .map(|line| line.push(byte, preface_left))
            {
                Some(Ok(true)) => self.deadline = None,
                Some(Ok(false)) => {}
                Some(Err(())) | None if !preface_left && self.deadline.is_some() => {
                    let what = if self.http1.is_some() {
                        "the connection opened with neither the HTTP/2 client preface nor an \
                         HTTP/1.x request line"
                    } else {
                        "the connection did not open with the HTTP/2 client preface"
                    };
                    return Err(io::Error::new(io::ErrorKind::InvalidData, what));
                }
                Some(Err(())) | None => {}
            }
        }
        Ok(())
    }
}

/// An HTTP/1.x request line as it arrives: `METHOD SP TARGET SP HTTP/1.x CRLF`, the method in
/// upper case, no control bytes, at most [`MAX_REQUEST_LINE`] bytes.
#[derive(Default)]
struct RequestLine {
    len: usize,
    /// The last 10 bytes, for the `HTTP/1.x\r\n` ending.
    tail: [u8; 10],
    /// Past the method's first space.
    past_method: bool,
    /// A line end came while the bytes were still the HTTP/2 preface's: no request line.
    ended: bool,
    failed: bool,
}

impl RequestLine {
    /// One more byte: `Ok(true)` when it ends a valid line, `Err` once the bytes cannot be one
    /// (and from then on). While they may still be the HTTP/2 preface (`preface_left`), a line
    /// end is not taken.
    fn push(&mut self, byte: u8, preface_left: bool) -> Result<bool, ()> {
        let pushed = self.next(byte, preface_left);
        self.failed |= pushed.is_err();
        pushed
    }

    fn next(&mut self, byte: u8, preface_left: bool) -> Result<bool, ()> {
        if self.failed || self.ended {
            return Err(());
        }
        self.len += 1;
        self.tail.rotate_left(1);
        self.tail[9] = byte;
        if !self.past_method {
            if byte == b' ' && self.len > 1 {
                self.past_method = true;
            } else if !byte.is_ascii_uppercase() {
                return Err(());
            }
        }
        if byte == b'\n' {
            if preface_left {
                self.ended = true;
                return Ok(false);
            }
            return if &self.tail == b"HTTP/1.1\r\n" || &self.tail == b"HTTP/1.0\r\n" {
                Ok(true)
            } else {
                Err(())
            };
        }
        if self.len > MAX_REQUEST_LINE || (byte.is_ascii_control() && byte != b'\r') {
            return Err(());
        }
        Ok(false)
    }
}

impl Connected for ServerConn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for ServerConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Err(error) = this.preface.poll_deadline(cx) {
            tracing::debug!(peer = ?this.info.remote_addr, "{error}: closing the connection");
            return Poll::Ready(Err(error));
        }
        let before = buf.filled().len();
        let polled = match &mut this.io {
            Io::Plain(conn) => Pin::new(conn).poll_read(cx, buf),
            Io::Tls(conn) => Pin::new(conn.as_mut()).poll_read(cx, buf),
        };
        if let Err(error) = this.preface.check(&buf.filled()[before..]) {
            tracing::debug!(peer = ?this.info.remote_addr, "{error}: closing the connection");
            return Poll::Ready(Err(error));
        }
        polled
    }
}

impl AsyncWrite for ServerConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(conn) => Pin::new(conn).poll_write(cx, buf),
            Io::Tls(conn) => Pin::new(conn.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(conn) => Pin::new(conn).poll_flush(cx),
            Io::Tls(conn) => Pin::new(conn.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(conn) => Pin::new(conn).poll_shutdown(cx),
            Io::Tls(conn) => Pin::new(conn.as_mut()).poll_shutdown(cx),
        }
    }
}

struct Acceptor {
    listener: TcpListener,
    connections: Arc<Semaphore>,
    refusals: Arc<Semaphore>,
    limits: ServerLimits,
    stats: Arc<ServerStats>,
    tls: Option<Arc<ServerTls>>,
    backoff: Duration,
    failures_since_success: u64,
    accept_log: RateLimitedLog,
    refuse_log: Arc<RateLimitedLog>,
    evict_log: RateLimitedLog,
    /// On a TLS listener: the handshakes in flight per peer address.
    handshakes: Option<Arc<HandshakeSlots>>,
}

impl Acceptor {
    /// Every place taken: the place of the oldest TLS handshake in flight, if it began a tenth
    /// of `--handshake-timeout` ago or more. Peers from many addresses that never finish their
    /// handshakes would otherwise keep the cells out until their timeout; now each of their
    /// places is open to a new connection a tenth of the timeout after they took it.
    async fn evict_for(&self, peer: SocketAddr) -> Option<OwnedSemaphorePermit> {
        let slots = self.handshakes.as_ref()?;
        let age = slots.evict_oldest(self.limits.handshake_timeout / 10)?;
        ServerStats::count(&self.stats.handshakes_evicted);
        if let Some(held_back) = self.evict_log.ready() {
            tracing::warn!(
                %peer,
                handshake_age = ?age,
                max_connections = self.limits.max_connections,
                evicted_since_last_line = held_back,
                "every connection place taken (--max-connections): the oldest connection still \
                 in its TLS handshake was closed to make room"
            );
        }
        // Its task sees the notice at once and drops the connection, giving back its place.
        tokio::time::timeout(EVICTION_WAIT, Arc::clone(&self.connections).acquire_owned())
            .await
            .ok()?
            .ok()
    }

    async fn next(&mut self) -> LimitedConn {
        loop {
            match self.listener.accept().await {
                Ok((tcp, peer)) => {
                    if self.failures_since_success > 0 {
                        tracing::info!(
                            failures = self.failures_since_success,
                            "accepting connections again"
                        );
                    }
                    self.backoff = Duration::ZERO;
                    self.failures_since_success = 0;
                    // Small request/response messages: Nagle's algorithm would only add latency.
                    let _ = tcp.set_nodelay(true);
                    let slot = match &self.handshakes {
                        Some(slots) => match slots.take(peer.ip()) {
                            Some(slot) => Some(slot),
                            None => {
                                ServerStats::count(&self.stats.connections_refused);
                                if let Some(held_back) = self.refuse_log.ready() {
                                    tracing::warn!(
                                        %peer,
                                        max_handshakes_per_address = slots.per_address,
                                        refused_since_last_line = held_back,
                                        "connection closed: --max-handshakes-per-address \
                                         reached (handshakes in flight from this address)"
                                    );
                                }
                                continue;
                            }
                        },
                        None => None,
                    };
                    let permit = match Arc::clone(&self.connections).try_acquire_owned() {
                        Ok(permit) => Ok(permit),
                        Err(_) => self.evict_for(peer).await.ok_or(()),
                    };
                    match permit {
                        Ok(permit) => {
                            let mut conn = LimitedConn::new(tcp, permit, &self.limits, &self.stats);
                            conn.handshake_slot = slot;
                            return conn;
                        }
                        Err(()) => {
                            ServerStats::count(&self.stats.connections_refused);
                            if let Some(held_back) = self.refuse_log.ready() {
                                tracing::warn!(
                                    %peer,
                                    max_connections = self.limits.max_connections,
                                    refused_since_last_line = held_back,
                                    "connection refused: --max-connections reached"
                                );
                            }
                            if let Ok(permit) = Arc::clone(&self.refusals).try_acquire_owned() {
                                let max = self.limits.max_connections;
                                let tls = self.tls.as_ref().map(|tls| tls.current());
                                tokio::spawn(async move {
                                    refuse(tcp, max, tls).await;
                                    drop(permit);
                                });
                            }
                        }
                    }
                }
                // The peer gave up between SYN and accept: nothing to do with this process.
                Err(e) if is_peer_error(&e) => continue,
                Err(e) => {
                    ServerStats::count(&self.stats.accept_errors);
                    self.failures_since_success += 1;
                    self.backoff = (self.backoff * 2).clamp(BACKOFF_MIN, BACKOFF_MAX);
                    if let Some(held_back) = self.accept_log.ready() {
                        tracing::error!(
                            error = %e,
                            failed_since_last_line = held_back,
                            backoff = ?self.backoff,
                            "accepting a connection failed (out of file descriptors? see \
                             docs/reliability.md, Limits); backing off"
                        );
                    }
                    tokio::time::sleep(self.backoff).await;
                }
            }
        }
    }
}

fn is_peer_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

/// An HTTP/2 server preface (an empty SETTINGS frame) and a GOAWAY (last stream 0,
/// ENHANCE_YOUR_CALM) whose debug data says why, then close.
fn goaway_frames(reason: &str) -> Vec<u8> {
    let debug = reason.as_bytes();
    let length = (8 + debug.len()) as u32;
    let mut frames = vec![0, 0, 0, 0x4, 0, 0, 0, 0, 0];
    frames.extend_from_slice(&length.to_be_bytes()[1..]);
    frames.extend_from_slice(&[0x7, 0, 0, 0, 0, 0]);
    frames.extend_from_slice(&0u32.to_be_bytes());
    frames.extend_from_slice(&0xbu32.to_be_bytes());
    frames.extend_from_slice(debug);
    frames
}

/// Refuses a connection over `--max-connections`: a GOAWAY naming the limit, inside TLS on a
/// TLS listener (after a handshake, so the client can read it), all within [`REFUSAL_TIME`].
async fn refuse(tcp: TcpStream, max_connections: usize, tls: Option<Arc<rustls::ServerConfig>>) {
    let reason = format!(
        "connection limit reached (--max-connections {max_connections}); retry with backoff"
    );
    let _ = tokio::time::timeout(REFUSAL_TIME, async {
        match tls {
            None => say_goaway(&mut { tcp }, &reason).await,
            Some(config) => {
                let mut stream = tokio_rustls::TlsAcceptor::from(config).accept(tcp).await?;
                say_goaway(&mut stream, &reason).await
            }
        }
    })
    .await;
}

/// Writes the server preface and a GOAWAY with `reason`, then reads until the peer closes, so
/// closing does not reset the connection before the client has read the GOAWAY.
async fn say_goaway<S: AsyncRead + AsyncWrite + Unpin>(io: &mut S, reason: &str) -> io::Result<()> {
    io.write_all(&goaway_frames(reason)).await?;
    io.flush().await?;
    io.shutdown().await?;
    let mut sink = [0u8; 1024];
    while io.read(&mut sink).await? > 0 {}
    Ok(())
}

/// An accepted connection under its bounds; holds its place under `max_connections` until
/// dropped.
pub struct LimitedConn {
    io: TcpStream,
    _permit: OwnedSemaphorePermit,
    /// Its place among its address's handshakes in flight, until the TLS handshake ends.
    handshake_slot: Option<HandshakeSlot>,
    info: ConnInfo,
    /// The accept + `--handshake-timeout`: by then TLS and the HTTP/2 preface must be done.
    handshake_deadline: tokio::time::Instant,
    handshake_timeout: Duration,
    /// The connection may open with an HTTP/1.x request line (REST served).
    accept_http1: bool,
    idle: Pin<Box<Sleep>>,
    idle_timeout: Duration,
    stats: Arc<ServerStats>,
}

impl LimitedConn {
    fn new(
        io: TcpStream,
        permit: OwnedSemaphorePermit,
        limits: &ServerLimits,
        stats: &Arc<ServerStats>,
    ) -> Self {
        let remote_addr = io.peer_addr().ok();
        let info = ConnInfo {
            remote_addr,
            local_addr: io.local_addr().ok(),
            request_bytes: Arc::new(Semaphore::new(limits.request_bytes_per_connection)),
            caller: Caller::Anonymous {
                loopback: remote_addr.is_some_and(|a| a.ip().is_loopback()),
            },
        };
        Self {
            io,
            _permit: permit,
            handshake_slot: None,
            info,
            handshake_deadline: tokio::time::Instant::now() + limits.handshake_timeout,
            handshake_timeout: limits.handshake_timeout,
            accept_http1: limits.accept_http1,
            idle: Box::pin(tokio::time::sleep(limits.idle_timeout)),
            idle_timeout: limits.idle_timeout,
            stats: Arc::clone(stats),
        }
    }

    fn timed_out(&self, what: String) -> Poll<io::Result<()>> {
        tracing::debug!(peer = ?self.info.remote_addr, "{what}: closing the connection");
        Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, what)))
    }
}

impl AsyncRead for LimitedConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.idle.as_mut().poll(cx).is_ready() {
            ServerStats::count(&self.stats.idle_timeouts);
            let what = format!(
                "nothing received for --idle-timeout {:?}",
                self.idle_timeout
            );
            return self.timed_out(what);
        }
        let before = buf.filled().len();
        let this = &mut *self;
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        let received = buf.filled().len() - before;
        if received > 0 {
            let deadline = tokio::time::Instant::now() + this.idle_timeout;
            this.idle.as_mut().reset(deadline);
        }
        polled
    }
}

impl AsyncWrite for LimitedConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_goaway_is_a_well_formed_frame_pair() {
        let frames = goaway_frames("why");
        // SETTINGS: empty, stream 0.
        assert_eq!(&frames[..9], &[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        // GOAWAY: length 8 + 3, type 7, stream 0, last stream 0, ENHANCE_YOUR_CALM, "why".
        assert_eq!(&frames[9..12], &[0, 0, 11]);
        assert_eq!(frames[12], 7);
        assert_eq!(&frames[18..22], &[0, 0, 0, 0]);
        assert_eq!(&frames[22..26], &[0, 0, 0, 0xb]);
        assert_eq!(&frames[26..], b"why");
    }

    fn preface(http1: bool) -> Preface {
        Preface {
            matched: Some(0),
            http1: http1.then(RequestLine::default),
            deadline: Some(Box::pin(tokio::time::sleep(Duration::from_secs(60)))),
            timeout: Duration::from_secs(60),
            stats: Arc::new(ServerStats::default()),
        }
    }

    /// Feeds `bytes` one at a time (as a trickle would): `Ok(true)` once the deadline is off.
    fn feed(preface: &mut Preface, bytes: &[u8]) -> Result<bool, io::Error> {
        for byte in bytes {
            preface.check(std::slice::from_ref(byte))?;
        }
        Ok(preface.deadline.is_none())
    }

    #[tokio::test]
    async fn the_http2_preface_opens_a_connection_with_or_without_rest() {
        for http1 in [false, true] {
            assert!(feed(&mut preface(http1), PREFACE).unwrap(), "{http1}");
            let mut whole = preface(http1);
            whole.check(PREFACE).unwrap();
            assert!(whole.deadline.is_none());
        }
    }

    #[tokio::test]
    async fn with_rest_an_http1_request_line_opens_a_connection_and_nothing_else_does() {
        let line = b"GET /v1/claims/route/john HTTP/1.1\r\n";
        assert!(feed(&mut preface(true), line).unwrap());
        assert!(feed(&mut preface(false), line).is_err());
        // A request line that is not done yet keeps the deadline.
        assert!(!feed(&mut preface(true), &line[..20]).unwrap());
        for bad in [
            &b"get / HTTP/1.1\r\n"[..],
            b" GET / HTTP/1.1\r\n",
            b"GET / HTTP/2.0\r\n",
            b"GET /\x01 HTTP/1.1\r\n",
            // The preface's first line, then something else: never a request line.
            b"PRI * HTTP/2.0\r\n\r\nXX / HTTP/1.1\r\n",
        ] {
            assert!(
                feed(&mut preface(true), bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = [b"GET /".as_slice(), &[b'a'; MAX_REQUEST_LINE]].concat();
        assert!(feed(&mut preface(true), &long).is_err());
    }
}

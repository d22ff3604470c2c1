//! A small TCP proxy between the cells and the server processes, able to misbehave on command:
//! - **drop**: a partition — bytes stop flowing both ways (held, not forwarded), then every
//!   connection open during it is closed and what was held is lost;
//! - **delay**: every chunk in both directions waits before it is forwarded;
//! - **reset**: every open connection is closed at once with a TCP RST.
//!
//! Each new connection goes to the next live upstream (round robin), so a killed server's
//! clients reconnect to the others, and a restarted one is used again once its new address is
//! set. Owns bytes and sockets only; it never parses them.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How bytes flow right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Pass,
    /// Hold everything (a partition).
    Hold,
    /// Forward each chunk after this delay.
    Delay(Duration),
}

/// How open connections are ended on command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// Close (FIN); bytes still held are lost.
    Drop,
    /// Abort with RST.
    Reset,
}

struct Shared {
    upstreams: Mutex<Vec<Option<SocketAddr>>>,
    next: AtomicUsize,
    mode: watch::Sender<Mode>,
    /// A generation counter with the kind of the last cut; connections end when it changes.
    cut: watch::Sender<(u64, Cut)>,
    connections: AtomicU64,
}

/// The proxy; dropping it stops accepting (open connections end with their peers).
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl Proxy {
    /// Listens on an ephemeral loopback port, forwarding to `upstreams` (slots may be empty).
    pub async fn start(upstreams: usize) -> Result<Proxy, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("proxy cannot listen: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("proxy address: {e}"))?;
        let shared = Arc::new(Shared {
            upstreams: Mutex::new(vec![None; upstreams]),
            next: AtomicUsize::new(0),
            mode: watch::Sender::new(Mode::Pass),
            cut: watch::Sender::new((0, Cut::Drop)),
            connections: AtomicU64::new(0),
        });
        let acceptor = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        Ok(Proxy {
            addr,
            shared,
            acceptor,
        })
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Sets (or clears, while a server is down) the address of upstream `slot`.
    pub fn set_upstream(&self, slot: usize, addr: Option<SocketAddr>) {
        let mut upstreams = self
            .shared
            .upstreams
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = upstreams.get_mut(slot) {
            *entry = addr;
        }
    }

    pub fn set_mode(&self, mode: Mode) {
        self.shared.mode.send_replace(mode);
    }

    /// Closes every open connection (held bytes are lost).
    pub fn drop_connections(&self) {
        self.cut(Cut::Drop);
    }

    /// Aborts every open connection with RST.
    pub fn reset_connections(&self) {
        self.cut(Cut::Reset);
    }

    fn cut(&self, how: Cut) {
        self.shared.cut.send_modify(|(generation, cut)| {
            *generation += 1;
            *cut = how;
        });
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            // Out of file descriptors or similar: back off rather than spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        shared.connections.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let Some(upstream) = pick(&shared) else {
                // No server up: the client sees the connection close and retries.
                return;
            };
            let Ok(outbound) = TcpStream::connect(upstream).await else {
                return;
            };
            relay(inbound, outbound, &shared).await;
        });
    }
}

fn pick(shared: &Shared) -> Option<SocketAddr> {
    let upstreams = shared.upstreams.lock().unwrap_or_else(|p| p.into_inner());
    let live: Vec<SocketAddr> = upstreams.iter().flatten().copied().collect();
    if live.is_empty() {
        return None;
    }
    Some(live[shared.next.fetch_add(1, Ordering::Relaxed) % live.len()])
}

async fn relay(mut inbound: TcpStream, mut outbound: TcpStream, shared: &Shared) {
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let mut cut = shared.cut.subscribe();
    cut.mark_unchanged();
    let how = {
        let (mut in_read, mut in_write) = inbound.split();
        let (mut out_read, mut out_write) = outbound.split();
        let up = pump(&mut in_read, &mut out_write, shared.mode.subscribe());
        let down = pump(&mut out_read, &mut in_write, shared.mode.subscribe());
        // HTTP/2 never half-closes: once either direction ends, the connection is over.
        tokio::select! {
            _ = up => None,
            _ = down => None,
            changed = cut.changed() => match changed {
                Ok(()) => Some(cut.borrow().1),
                Err(_) => None,
            },
        }
    };
    if how == Some(Cut::Reset) {
        // Linger zero turns the close into an RST. (tokio deprecates `set_linger` because a
        // non-zero linger blocks the thread on drop; zero never blocks.)
        #[allow(deprecated)]
        {
            let _ = inbound.set_linger(Some(Duration::ZERO));
            let _ = outbound.set_linger(Some(Duration::ZERO));
        }
    }
}

async fn pump<R, W>(reader: &mut R, writer: &mut W, mut mode: watch::Receiver<Mode>)
where
    R: AsyncReadExt + Unpin,
    W: AsyncWriteExt + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        loop {
            let current = *mode.borrow_and_update();
            match current {
                Mode::Pass => break,
                Mode::Delay(delay) => {
                    tokio::time::sleep(delay).await;
                    break;
                }
                Mode::Hold => {
                    if mode.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
        if writer.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = stream.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(stream: &mut TcpStream) -> std::io::Result<[u8; 4]> {
        stream.write_all(b"ping").await?;
        let mut got = [0u8; 4];
        stream.read_exact(&mut got).await?;
        Ok(got)
    }

    #[tokio::test]
    async fn bytes_pass_then_held_bytes_are_lost_when_the_partition_drops_connections() {
        let proxy = Proxy::start(1).await.unwrap();
        proxy.set_upstream(0, Some(echo_server().await));
        let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(&round_trip(&mut stream).await.unwrap(), b"ping");

        proxy.set_mode(Mode::Hold);
        stream.write_all(b"lost").await.unwrap();
        let mut got = [0u8; 4];
        let held =
            tokio::time::timeout(Duration::from_millis(200), stream.read_exact(&mut got)).await;
        assert!(held.is_err(), "nothing comes back during a partition");
        proxy.drop_connections();
        proxy.set_mode(Mode::Pass);
        let after = stream.read_exact(&mut got).await;
        assert!(after.is_err(), "the connection was closed: {after:?}");

        let mut fresh = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(&round_trip(&mut fresh).await.unwrap(), b"ping");
    }

    #[tokio::test]
    async fn a_reset_aborts_open_connections() {
        let proxy = Proxy::start(1).await.unwrap();
        proxy.set_upstream(0, Some(echo_server().await));
        let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(&round_trip(&mut stream).await.unwrap(), b"ping");
        proxy.reset_connections();
        let mut got = [0u8; 1];
        let result = stream.read(&mut got).await;
        assert!(
            matches!(result, Err(_) | Ok(0)),
            "the connection is gone: {result:?}"
        );
    }

    #[tokio::test]
    async fn no_live_upstream_closes_new_connections() {
        let proxy = Proxy::start(1).await.unwrap();
        let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
        let result = round_trip(&mut stream).await;
        assert!(result.is_err(), "{result:?}");
    }
}

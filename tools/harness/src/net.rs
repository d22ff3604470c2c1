//! Loopback ports: a free one for a child to bind, and waiting until one accepts connections.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// A free loopback TCP port (bound, then released: fine for a child started right after; a
/// caller that starts a child on it retries on the rare collision).
pub fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|e| format!("cannot find a free loopback port: {e}"))
}

/// Waits until `127.0.0.1:port` accepts a connection; `false` after `timeout`. `alive` is asked
/// between attempts, so a child that died stops the wait early with its reason.
pub fn wait_listening(
    port: u16,
    timeout: Duration,
    mut alive: impl FnMut() -> Result<(), String>,
) -> Result<(), String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        alive()?;
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("nothing listened on {addr} within {timeout:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_port_can_be_bound_and_waited_for() {
        let port = free_port().unwrap();
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
        wait_listening(port, Duration::from_secs(5), || Ok(())).unwrap();
        drop(listener);
    }

    #[test]
    fn waiting_stops_when_the_child_is_gone() {
        let port = free_port().unwrap();
        let error = wait_listening(port, Duration::from_secs(5), || Err("it exited".into()));
        assert_eq!(error, Err("it exited".to_owned()));
    }
}

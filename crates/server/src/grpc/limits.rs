//! The bounds of the server's resources: connections, streams, request bytes in flight, time.
//! Every one has a flag and an env var in `serve` and a default that is safe on the public
//! internet; docs/reliability.md ("Limits") has the table and the worst-case memory they imply.
//!
//! Owns the numbers and their validation only; `listener` and `guard` enforce them.

use std::time::Duration;

use topology_claims::error::ClaimsError;

/// Resource bounds of one server process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// Most open connections (`--max-connections`). One over it is accepted, told GOAWAY
    /// (ENHANCE_YOUR_CALM, "connection limit reached") and closed.
    pub max_connections: usize,
    /// HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS of every connection (`--max-streams`).
    pub max_concurrent_streams: u32,
    /// Bytes of request bodies buffered for requests not yet complete, per connection
    /// (`--max-request-bytes-per-connection`).
    pub request_bytes_per_connection: usize,
    /// The same for the whole server (`--max-request-bytes`), shared by the cells and by every
    /// caller of a plaintext server.
    pub request_bytes_total: usize,
    /// The share of it one verified caller (a cell, a router, an operator) may hold at once,
    /// charged as its frames arrive (`--cell-max-request-bytes`, default 1/4 of
    /// `--max-request-bytes`): one cell can never spend the server-wide budget.
    pub request_bytes_per_cell: usize,
    /// Bytes in flight of all callers without a verified identity on a TLS listener and of
    /// every caller of the plaintext `--health-listen` port (`--max-anonymous-request-bytes`).
    /// A budget of its own: such callers never take the cells' share.
    pub request_bytes_anonymous: usize,
    /// Most TLS connections without a verified identity at once (`--max-anonymous-connections`,
    /// default 1/8 of `--max-connections`); one more is told GOAWAY naming the flag.
    pub max_anonymous_connections: usize,
    /// Most TLS handshakes in flight from one peer address (`--max-handshakes-per-address`,
    /// default 1/8 of `--max-connections`): before its handshake a caller has no identity, so a
    /// peer that opens connections and never finishes their handshakes holds at most this many
    /// of the `--max-connections` places; one more is closed at once.
    pub max_handshakes_per_address: usize,
    /// Largest header block a client may send (HTTP/2 SETTINGS_MAX_HEADER_LIST_SIZE).
    pub max_header_list_bytes: u32,
    /// A new connection must complete its TLS handshake (if any) and send a valid HTTP/2
    /// client preface within this, counted from the accept: a total deadline that no trickle
    /// of bytes extends (`--handshake-timeout`).
    pub handshake_timeout: Duration,
    /// A connection whose peer sends nothing at all for this long is closed (`--idle-timeout`).
    /// Live clients answer the keepalive pings, so only dead or stuck peers reach it.
    pub idle_timeout: Duration,
    /// The server pings every connection this often (`--keepalive-interval`) …
    pub keepalive_interval: Duration,
    /// … and closes it when a ping is not answered within this (`--keepalive-timeout`).
    pub keepalive_timeout: Duration,
    /// Longest time one request may take, reading its body included (`--request-timeout`);
    /// a client's shorter `grpc-timeout` wins.
    pub request_timeout: Duration,
    /// List and stream calls (ListClaims, StreamClaims, ListOutstandingLeases) one cell may have
    /// open at once, until their responses are read (`--cell-max-streams`).
    pub cell_max_streams: usize,
    /// A listing's response that HTTP/2 does not take for this long is dropped
    /// (`--stall-timeout`).
    pub stall_timeout: Duration,
    /// Whether a connection may open with an HTTP/1.1 request line instead of the HTTP/2
    /// preface, under the same deadline: set by the server when it serves REST (`--rest on`).
    pub accept_http1: bool,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_connections: 512,
            max_concurrent_streams: 100,
            request_bytes_per_connection: 8 * 1024 * 1024,
            request_bytes_total: 64 * 1024 * 1024,
            request_bytes_per_cell: 16 * 1024 * 1024,
            request_bytes_anonymous: DEFAULT_ANONYMOUS_REQUEST_BYTES,
            max_anonymous_connections: 512 / 8,
            max_handshakes_per_address: 512 / 8,
            max_header_list_bytes: 16 * 1024,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(20),
            request_timeout: Duration::from_secs(30),
            cell_max_streams: crate::grpc::responses::DEFAULT_CELL_MAX_STREAMS,
            stall_timeout: crate::grpc::responses::DEFAULT_STALL_TIMEOUT,
            accept_http1: false,
        }
    }
}

/// Bytes in flight of the callers without a verified identity (`--max-anonymous-request-bytes`):
/// enough for 4,096 health checks at once, whose bodies are capped at [`MAX_HEALTH_REQUEST_BYTES`].
pub const DEFAULT_ANONYMOUS_REQUEST_BYTES: usize = 1024 * 1024;

/// The largest `grpc.health.v1` request message read on any listener: a health request carries
/// only a service name.
pub const MAX_HEALTH_REQUEST_BYTES: usize = 256;

impl ServerLimits {
    /// `--cell-max-request-bytes`' default: a quarter of the server-wide budget, and room for
    /// one largest message (`max_message_bytes` and its prefix) whenever the server has it.
    pub fn default_per_cell(request_bytes_total: usize, max_message_bytes: usize) -> usize {
        (request_bytes_total / 4).max((max_message_bytes + 5).min(request_bytes_total))
    }

    /// `--max-anonymous-connections`' default: an eighth of `--max-connections`, at least 1.
    pub fn default_anonymous_connections(max_connections: usize) -> usize {
        (max_connections / 8).max(1)
    }

    /// Refuses combinations that cannot work, naming the flag.
    pub fn validate(&self) -> Result<(), ClaimsError> {
        let bad = |message: String| Err(ClaimsError::Configuration { message });
        if self.max_connections == 0 {
            return bad("--max-connections must be at least 1".into());
        }
        if self.cell_max_streams == 0 {
            return bad("--cell-max-streams must be at least 1".into());
        }
        if self.max_concurrent_streams == 0 {
            return bad("--max-streams must be at least 1".into());
        }
        if self.request_bytes_per_connection > self.request_bytes_total {
            return bad(format!(
                "--max-request-bytes-per-connection ({}) must not exceed --max-request-bytes ({})",
                self.request_bytes_per_connection, self.request_bytes_total
            ));
        }
        if self.request_bytes_per_cell == 0
            || self.request_bytes_per_cell > self.request_bytes_total
        {
            return bad(format!(
                "--cell-max-request-bytes ({}) must lie in 1..=--max-request-bytes ({})",
                self.request_bytes_per_cell, self.request_bytes_total
            ));
        }
        if self.request_bytes_anonymous < MAX_HEALTH_REQUEST_BYTES + 5 {
            return bad(format!(
                "--max-anonymous-request-bytes ({}) must hold at least one health check ({} bytes)",
                self.request_bytes_anonymous,
                MAX_HEALTH_REQUEST_BYTES + 5
            ));
        }
        if self.max_anonymous_connections == 0
            || self.max_anonymous_connections > self.max_connections
        {
            return bad(format!(
                "--max-anonymous-connections ({}) must lie in 1..=--max-connections ({})",
                self.max_anonymous_connections, self.max_connections
            ));
        }
        if self.max_handshakes_per_address == 0
            || self.max_handshakes_per_address > self.max_connections
        {
            return bad(format!(
                "--max-handshakes-per-address ({}) must lie in 1..=--max-connections ({})",
                self.max_handshakes_per_address, self.max_connections
            ));
        }
        for (flag, value) in [
            ("--handshake-timeout", self.handshake_timeout),
            ("--idle-timeout", self.idle_timeout),
            ("--keepalive-interval", self.keepalive_interval),
            ("--keepalive-timeout", self.keepalive_timeout),
            ("--request-timeout", self.request_timeout),
            ("--stall-timeout", self.stall_timeout),
        ] {
            if value.is_zero() {
                return bad(format!("{flag} must not be zero"));
            }
        }
        if self.idle_timeout <= self.keepalive_interval + self.keepalive_timeout {
            return bad(format!(
                "--idle-timeout ({:?}) must exceed --keepalive-interval + --keepalive-timeout \
                 ({:?}), or live idle clients would be cut off between pings",
                self.idle_timeout,
                self.keepalive_interval + self.keepalive_timeout
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid() {
        ServerLimits::default().validate().unwrap();
    }

    #[test]
    fn derived_defaults_keep_room_for_one_largest_message() {
        assert_eq!(ServerLimits::default_per_cell(64 << 20, 1 << 20), 16 << 20);
        assert_eq!(
            ServerLimits::default_per_cell(2 << 20, 1 << 20),
            (1 << 20) + 5
        );
        assert_eq!(ServerLimits::default_per_cell(1 << 20, 4 << 20), 1 << 20);
        assert_eq!(ServerLimits::default_anonymous_connections(512), 64);
        assert_eq!(ServerLimits::default_anonymous_connections(4), 1);
    }

    #[test]
    fn impossible_combinations_name_their_flag() {
        let cases = [
            (
                ServerLimits {
                    max_connections: 0,
                    ..ServerLimits::default()
                },
                "--max-connections",
            ),
            (
                ServerLimits {
                    request_bytes_per_connection: 2,
                    request_bytes_total: 1,
                    ..ServerLimits::default()
                },
                "--max-request-bytes-per-connection",
            ),
            (
                ServerLimits {
                    request_bytes_per_cell: 65 * 1024 * 1024,
                    ..ServerLimits::default()
                },
                "--cell-max-request-bytes",
            ),
            (
                ServerLimits {
                    request_bytes_anonymous: 100,
                    ..ServerLimits::default()
                },
                "--max-anonymous-request-bytes",
            ),
            (
                ServerLimits {
                    max_anonymous_connections: 513,
                    ..ServerLimits::default()
                },
                "--max-anonymous-connections",
            ),
            (
                ServerLimits {
                    idle_timeout: Duration::from_secs(40),
                    ..ServerLimits::default()
                },
                "--idle-timeout",
            ),
            (
                ServerLimits {
                    request_timeout: Duration::ZERO,
                    ..ServerLimits::default()
                },
                "--request-timeout",
            ),
        ];
        for (limits, flag) in cases {
            let error = limits.validate().unwrap_err().to_string();
            assert!(error.contains(flag), "{flag}: {error}");
        }
    }
}

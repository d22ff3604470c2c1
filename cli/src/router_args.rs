//! `serve`'s flags of the router's read path: REST lookups beside gRPC on the serve port
//! (`--rest`, `--rest-max-age`, `--rest-negative-max-age`; docs/api.md, "REST lookups") and the
//! WatchClaims change feed (`--max-watchers`, `--watch-retention`, `--watch-max-events`,
//! `--watch-poll-interval`; docs/api.md, "WatchClaims").

use std::time::Duration;

use clap::Args;
use topology_claims::config::{parse_duration, parse_nonzero_duration};
use topology_claims_server::grpc::watch::WatchConfig;
use topology_claims_server::rest::RestConfig;

#[derive(Args, Debug, Clone)]
pub struct RestArgs {
    /// Serve REST lookups (`GET /v1/claims/{namespace}/{value}`) on the serve port beside gRPC,
    /// over HTTP/1.1 and HTTP/2 (with TLS, ALPN offers both), under the same limits, TLS and
    /// authorization. off: gRPC only, and every connection must open with the HTTP/2 preface.
    /// on | off (or true/false, yes/no, 1/0).
    #[arg(long, env = "TOPOLOGY_CLAIMS_REST", default_value = "on",
          action = clap::ArgAction::Set, value_parser = crate::env::switch)]
    pub rest: bool,

    /// `Cache-Control: max-age` of a found claim's REST answer: how long a router may route by
    /// it without asking again. Whole seconds. Units: ms, s, m, h, d.
    #[arg(long, env = "TOPOLOGY_CLAIMS_REST_MAX_AGE", default_value = "5s",
          value_parser = parse_duration)]
    pub rest_max_age: Duration,

    /// `Cache-Control: max-age` of a 404 (no such claim). Keep it short: a claim leased a moment
    /// later is routable at once. Whole seconds. Units: ms, s, m, h, d.
    #[arg(long, env = "TOPOLOGY_CLAIMS_REST_NEGATIVE_MAX_AGE", default_value = "1s",
          value_parser = parse_duration)]
    pub rest_negative_max_age: Duration,
}

impl RestArgs {
    /// The server's REST configuration; `None` with `--rest off`.
    pub fn config(&self) -> Option<RestConfig> {
        self.rest.then_some(RestConfig {
            max_age: self.rest_max_age,
            negative_max_age: self.rest_negative_max_age,
        })
    }
}

#[derive(Args, Debug, Clone)]
pub struct WatchArgs {
    /// Most WatchClaims streams open at once; one more is refused with RESOURCE_EXHAUSTED
    /// (RATE_LIMITED, limit --max-watchers). Each also counts against --max-streams.
    #[arg(long, env = "TOPOLOGY_CLAIMS_MAX_WATCHERS", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_watchers: u32,

    /// How long change-feed events are kept for watchers to resume from; older history is
    /// compacted (within 10 s), and a watch from below it is refused with WATCH_COMPACTED.
    /// Units: ms, s, m, h, d; not zero.
    #[arg(long, env = "TOPOLOGY_CLAIMS_WATCH_RETENTION", default_value = "1h",
          value_parser = parse_nonzero_duration)]
    pub watch_retention: Duration,

    /// Most change-feed events kept, whatever their age (the oldest revisions go first).
    /// PostgreSQL estimates the log's length from its event sequence, where aborted writes
    /// count too, so it may keep a few fewer (decision 124).
    #[arg(long, env = "TOPOLOGY_CLAIMS_WATCH_MAX_EVENTS", default_value_t = 1_000_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub watch_max_events: u64,

    /// How often the server reads the change feed's head when it wrote nothing itself: how soon
    /// changes made through other servers on the same store reach its watchers. Units: ms, s,
    /// m, h, d; not zero.
    #[arg(long, env = "TOPOLOGY_CLAIMS_WATCH_POLL_INTERVAL", default_value = "50ms",
          value_parser = parse_nonzero_duration)]
    pub watch_poll_interval: Duration,
}

impl WatchArgs {
    pub fn config(&self) -> WatchConfig {
        WatchConfig {
            max_watchers: self.max_watchers as usize,
            poll_interval: self.watch_poll_interval,
            retention: self.watch_retention,
            max_events: self.watch_max_events,
            ..WatchConfig::default()
        }
    }
}

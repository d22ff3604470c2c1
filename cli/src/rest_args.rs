//! `serve`'s REST flags (`--rest`, `--rest-max-age`, `--rest-negative-max-age`): the router's
//! lookups beside gRPC on the serve port (docs/api.md, "REST").

use std::time::Duration;

use clap::Args;
use topology_claims::config::parse_duration;
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

//! `serve`'s flags of waiting for a leased claim (`BeginUpdateRequest.wait_for_leased`;
//! docs/api.md, "Waiting for a leased claim"): `--max-lease-wait` and `--max-lease-waiters`.

use std::time::Duration;

use clap::Args;
use topology_claims::config::parse_duration;
use topology_claims_server::grpc::lease_wait::WaitConfig;

#[derive(Args, Debug, Clone)]
pub struct WaitArgs {
    /// The longest a BeginUpdate waits for a leased claim (wait_for_leased); a longer wait asked
    /// for is clamped to it. 0: no BeginUpdate ever waits. Units: ms, s, m, h, d.
    #[arg(long, env = "TOPOLOGY_CLAIMS_MAX_LEASE_WAIT", default_value = "5s",
          value_parser = parse_duration)]
    pub max_lease_wait: Duration,

    /// Most BeginUpdates waiting for a leased claim at once on this server; beyond it a waiting
    /// BeginUpdate is answered CLAIM_LEASED at once.
    #[arg(long, env = "TOPOLOGY_CLAIMS_MAX_LEASE_WAITERS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_lease_waiters: u32,
}

impl WaitArgs {
    pub fn config(&self) -> WaitConfig {
        WaitConfig {
            max_wait: self.max_lease_wait,
            max_waiters: self.max_lease_waiters as usize,
        }
    }
}

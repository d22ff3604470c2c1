//! Health that reflects the store: a background probe (one LookupClaim of a key nobody needs,
//! bounded by a timeout) every `interval` turns the ClaimsService's `grpc.health.v1` status
//! NOT_SERVING while the store cannot answer (down, or frozen past the timeout) and SERVING
//! again when it does. The overall `""` status is left alone: it says the process is alive
//! (liveness), the service's status says it can do its job (readiness).
//!
//! One log line when the store goes, one when it comes back; never one per probe.
//!
//! Owns the probe and the status transitions; knows nothing of a particular store.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use topology_claims::domain::{ClaimKey, ClaimType};
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;

/// How the store is probed (`--health-interval`, `--health-timeout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthConfig {
    pub interval: Duration,
    pub timeout: Duration,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
        }
    }
}

/// The key the probe looks up. Whether it exists does not matter: any answer of the store
/// (found or CLAIM_NOT_FOUND) proves it can serve.
fn probe_key() -> ClaimKey {
    ClaimKey::new(ClaimType::Username, "topology-claims-health-probe")
}

/// One probe: `Ok` when the store answered within `timeout`, else why not.
pub async fn probe(store: &dyn ClaimStore, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, store.lookup_claim(&probe_key())).await {
        Ok(Ok(_)) | Ok(Err(ClaimsError::ClaimNotFound { .. })) => Ok(()),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("no answer within --health-timeout {timeout:?}")),
    }
}

/// Probes until `stop` closes, keeping `service`'s status in `reporter` in step with the store.
pub async fn watch_store(
    store: Arc<dyn ClaimStore>,
    reporter: HealthReporter,
    service: &'static str,
    config: HealthConfig,
    mut stop: watch::Receiver<()>,
) {
    let mut ticker = tokio::time::interval(config.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut down_since: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.changed() => return,
        }
        let answer = probe(store.as_ref(), config.timeout).await;
        // The drain started while probing: its NOT_SERVING must stand.
        if stop.has_changed().unwrap_or(true) {
            return;
        }
        match (answer, down_since) {
            (Ok(()), None) => {}
            (Ok(()), Some(since)) => {
                tracing::info!(
                    outage = ?since.elapsed(),
                    "store reachable again; {service} health SERVING"
                );
                down_since = None;
                reporter
                    .set_service_status(service, ServingStatus::Serving)
                    .await;
            }
            (Err(why), None) => {
                tracing::error!(
                    error = %why,
                    "store unreachable; {service} health NOT_SERVING until it answers again"
                );
                down_since = Some(Instant::now());
                reporter
                    .set_service_status(service, ServingStatus::NotServing)
                    .await;
            }
            (Err(_), Some(_)) => {}
        }
    }
}

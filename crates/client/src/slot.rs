//! The verifier's side of the fleet-wide verification limit: take a slot before a run (waiting
//! with jitter while all are held), keep it renewed in the background while the run goes on, and
//! give it back at the end. A server without the slot RPCs (UNIMPLEMENTED) is verified without
//! one.
//!
//! Owns the waiting and renewal schedule. Must not decide who gets a slot (the service does).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::backoff::random_u64;
use crate::client::ClaimsClient;
use topology_claims::domain::{SlotCap, SlotGrant, SlotHolder};
use topology_claims::error::ClaimsError;

/// Shortest wait between two acquires while all slots are held.
const MIN_WAIT: Duration = Duration::from_millis(200);

/// How a verifier takes its slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotSettings {
    /// Who holds it within the cell (default: `host:pid`).
    pub holder: String,
    /// A shorter time-to-live than the server's (`None`: the server's).
    pub ttl: Option<Duration>,
}

impl Default for SlotSettings {
    fn default() -> Self {
        Self {
            holder: default_holder(),
            ttl: None,
        }
    }
}

/// `HOSTNAME:pid` (printable ASCII only, at most 128 characters).
pub fn default_holder() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "host".to_owned());
    let host: String = host
        .chars()
        .filter(|c| c.is_ascii_graphic())
        .take(100)
        .collect();
    format!(
        "{}:{}",
        if host.is_empty() { "host" } else { &host },
        std::process::id()
    )
}

/// What happened to the slot, for the caller to show (the sidecar prints each on stderr).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotEvent {
    /// All slots are held (`limit` `Fleet`: `in_use` of the fleet's), or the cell holds all one
    /// cell may (`PerCell`: `in_use` of the cell's); the next attempt is in `retry_in`.
    Waiting {
        in_use: u32,
        max: u32,
        limit: SlotCap,
        retry_in: Duration,
    },
    /// The slot is held (until renewed or released).
    Taken { in_use: u32 },
    /// The run is done with the slot, which is being given back (reported before the release
    /// call, so the interval from `Taken` to `Released` lies inside the time the slot was held).
    Released,
    /// The slot expired (not renewed within its time-to-live: the process was paused, or the
    /// service unreachable) and another verifier took it; the run stops (with
    /// `ClaimsError::VerificationSlotLost`) and gives nothing back.
    Lost,
    /// The server has no verification slots: verifying without one.
    Unsupported,
}

/// A wait between `retry_after` and twice that (at least [`MIN_WAIT`]): the waiting verifiers
/// of the fleet do not all ask again at the same moment.
pub fn jittered_wait(retry_after: Duration) -> Duration {
    let base = retry_after.max(MIN_WAIT);
    let spread = u64::try_from(base.as_micros()).unwrap_or(u64::MAX);
    base + Duration::from_micros(random_u64() % spread.saturating_add(1))
}

/// A slot held while a run goes on; renewed every third of its time-to-live by a background
/// task. [`lost`](Self::lost) turns true when a renewal found it taken by another verifier.
pub struct HeldSlot {
    holder: SlotHolder,
    lost: Arc<AtomicBool>,
    renewal: tokio::task::JoinHandle<()>,
}

impl HeldSlot {
    /// Whether the slot was lost (the run must stop).
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    pub fn holder(&self) -> &SlotHolder {
        &self.holder
    }

    /// Stops renewing and gives the slot back; `true` if the service still had it.
    pub async fn release(self, client: &ClaimsClient) -> Result<bool, ClaimsError> {
        self.renewal.abort();
        client.release_verification_slot(&self.holder).await
    }
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        self.renewal.abort();
    }
}

/// Takes a slot for `holder`, waiting (with jitter, reported through `on_event`) while all are
/// held. `Ok(None)`: the server has no slots, verify without one.
pub async fn take_slot(
    client: &ClaimsClient,
    holder: &SlotHolder,
    ttl: Option<Duration>,
    on_event: &(dyn Fn(&SlotEvent) + Send + Sync),
) -> Result<Option<HeldSlot>, ClaimsError> {
    loop {
        match client.acquire_verification_slot(holder, ttl).await {
            Ok(Some((grant, granted_ttl))) => {
                on_event(&SlotEvent::Taken {
                    in_use: grant.in_use,
                });
                return Ok(Some(renewing(client.clone(), grant, granted_ttl)));
            }
            // Said once, by the caller's `on_event` (the sidecar prints it), not logged too.
            Ok(None) => {
                tracing::debug!("the claims server has no verification slots");
                on_event(&SlotEvent::Unsupported);
                return Ok(None);
            }
            Err(ClaimsError::VerificationSlotsBusy {
                in_use,
                max,
                limit,
                retry_after,
            }) => {
                let retry_in = jittered_wait(retry_after);
                tracing::debug!(
                    in_use,
                    limit = limit.name(),
                    ?retry_in,
                    "waiting for a verification slot"
                );
                on_event(&SlotEvent::Waiting {
                    in_use,
                    max,
                    limit,
                    retry_in,
                });
                tokio::time::sleep(retry_in).await;
            }
            Err(other) => return Err(other),
        }
    }
}

fn renewing(client: ClaimsClient, grant: SlotGrant, ttl: Duration) -> HeldSlot {
    let lost = Arc::new(AtomicBool::new(false));
    let holder = grant.holder.clone();
    let every = (ttl / 3).max(Duration::from_millis(50));
    let renewal = tokio::spawn({
        let (lost, holder) = (Arc::clone(&lost), holder.clone());
        async move {
            loop {
                tokio::time::sleep(every).await;
                match client.acquire_verification_slot(&holder, Some(ttl)).await {
                    Ok(Some(_)) => {}
                    Ok(None) => return,
                    Err(ClaimsError::VerificationSlotsBusy { .. }) => {
                        tracing::debug!(%holder, "verification slot taken by another verifier");
                        lost.store(true, Ordering::Relaxed);
                        return;
                    }
                    // Transient: the next renewal may still be in time (the slot lasts three
                    // intervals); if not, it finds the slot taken and the run stops.
                    Err(error) => tracing::warn!(%error, "verification slot renewal failed"),
                }
            }
        }
    });
    HeldSlot {
        holder,
        lost,
        renewal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_between_the_hint_and_twice_it() {
        for _ in 0..100 {
            let wait = jittered_wait(Duration::from_secs(3));
            assert!(wait >= Duration::from_secs(3) && wait <= Duration::from_secs(6));
        }
        assert!(jittered_wait(Duration::ZERO) >= MIN_WAIT);
    }

    #[test]
    fn the_default_holder_is_a_valid_holder_id() {
        let cell = topology_claims::domain::CellId::parse("cell-a").unwrap();
        SlotHolder::new(cell, &default_holder()).unwrap();
    }
}

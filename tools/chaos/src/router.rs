//! The router beside the cells: the reference router cache (`examples/router-cache`) routes
//! every key over REST, round after round, and follows WatchClaims, through the same misbehaving proxy as the
//! cells, while the servers are killed and the store faulted. Its invariant
//! (docs/reliability.md, "The router cache"):
//! - during the run, at every revision the feed has confirmed, no entry the cache holds is
//!   older than a change of its key that the store answers at or below that revision;
//! - at the end, once the feed has confirmed the store's head, every entry the cache holds
//!   agrees with the store (same cell, same state).
//!
//! Owns the router's workload and its checks. Must not hold protocol rules.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use router_cache::{state_name, Owner, RouterCache};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use topology_claims::ClaimsError;
use topology_claims_client::{ClaimsClient, WatchRequest};

use crate::invariants::Violation;
use crate::model;

/// Each round routes every key, then checks every key held; then it pauses this long.
const ROUND_PAUSE: Duration = Duration::from_millis(20);
/// Routes (and checks) in flight at once.
const PARALLEL: usize = 8;
/// A call of the router's that takes longer is given up (the proxy may hold it forever).
const PATIENCE: Duration = Duration::from_secs(2);
/// How long the end waits for the feed to confirm the store's head.
const CATCH_UP: Duration = Duration::from_secs(60);

const RULE: &str = "the router cache agrees with the store";

/// The router running beside the cells.
pub struct Router {
    cache: RouterCache,
    client: ClaimsClient,
    keys: u32,
    follower: JoinHandle<Result<(), ClaimsError>>,
    workload: JoinHandle<()>,
    stop: watch::Sender<bool>,
    violations: Arc<Mutex<Vec<Violation>>>,
    checks: Arc<AtomicU64>,
}

fn agrees(owner: &Owner, view: &topology_claims::domain::ClaimView) -> bool {
    owner.cell_id == view.cell_id.as_str() && owner.state == state_name(view.state)
}

impl Router {
    /// Starts following the feed at `endpoint` (`http://…`, the serve port or the proxy), and
    /// routing the keys `0..keys` (in an order drawn from `seed`); `client` looks claims up
    /// for the checks.
    pub async fn start(endpoint: &str, client: ClaimsClient, keys: u32, seed: u64) -> Router {
        let cache = RouterCache::new(endpoint);
        let (ready, opened) = tokio::sync::oneshot::channel();
        let follower = tokio::spawn({
            let (cache, client) = (cache.clone(), client.clone());
            async move { cache.follow(client, ready).await }
        });
        // The servers are up: the first stream opens at once (else the routes wait uncached).
        let _ = tokio::time::timeout(Duration::from_secs(10), opened).await;
        let (stop, stopped) = watch::channel(false);
        let violations = Arc::new(Mutex::new(Vec::new()));
        let checks = Arc::new(AtomicU64::new(0));
        let workload = tokio::spawn(workload(
            cache.clone(),
            client.clone(),
            keys,
            fastrand::Rng::with_seed(seed),
            stopped,
            Arc::clone(&violations),
            Arc::clone(&checks),
        ));
        Router {
            cache,
            client,
            keys,
            follower,
            workload,
            stop,
            violations,
            checks,
        }
    }

    /// Stops the routes, waits for the feed to confirm the store's head, and checks every entry
    /// held against the store. Returns the violations and a line for the summary.
    pub async fn finish(self) -> (Vec<Violation>, String) {
        let _ = self.stop.send(true);
        let _ = self.workload.await;
        let mut violations =
            std::mem::take(&mut *self.violations.lock().unwrap_or_else(|p| p.into_inner()));
        let head = match head(&self.client).await {
            Ok(head) => head,
            Err(error) => {
                violations.push(violation(
                    None,
                    format!("reading the store's head: {error}"),
                ));
                self.follower.abort();
                return (violations, "not checked at the end".to_owned());
            }
        };
        let started = Instant::now();
        while self.cache.confirmed() < head && started.elapsed() < CATCH_UP {
            if self.follower.is_finished() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if self.cache.confirmed() < head {
            violations.push(violation(
                None,
                format!(
                    "the feed confirmed {} but the store's head is {head}",
                    self.cache.confirmed()
                ),
            ));
        }
        let held = self.cache.snapshot();
        for ((_, value), owner) in &held {
            let key = topology_claims::ClaimKey::new(topology_claims::ClaimType::Username, value);
            let index = model::key_index(&key);
            match self.client.lookup_claim(&key).await {
                Ok(view) if agrees(owner, &view) => {}
                Ok(view) => violations.push(violation(
                    index,
                    format!(
                        "cached {owner:?}, the store has {} {} at revision {}",
                        view.cell_id,
                        state_name(view.state),
                        view.revision
                    ),
                )),
                Err(ClaimsError::ClaimNotFound { .. }) => violations.push(violation(
                    index,
                    format!("cached {owner:?}, the store has no such claim"),
                )),
                Err(error) => violations.push(violation(index, format!("lookup: {error}"))),
            }
        }
        self.follower.abort();
        let (misses, flushes, reconnects) = self.cache.stats();
        let line = format!(
            "{} entries checked at the end, {} mid-run checks, {misses} REST lookups, \
             {flushes} flushes, {reconnects} stream re-opens (keys 0..{})",
            held.len(),
            self.checks.load(Ordering::Relaxed),
            self.keys
        );
        (violations, line)
    }
}

fn violation(key: Option<u32>, detail: String) -> Violation {
    Violation {
        rule: RULE,
        key,
        detail,
    }
}

/// The store's current revision: a watch from now answers it first.
async fn head(client: &ClaimsClient) -> Result<u64, ClaimsError> {
    let mut watch = client.watch_claims(&WatchRequest::default()).await?;
    match tokio::time::timeout(PATIENCE * 5, watch.next()).await {
        Ok(Ok(Some(batch))) => Ok(batch.revision),
        Ok(Ok(None)) => Err(ClaimsError::unavailable("the watch ended at once")),
        Ok(Err(error)) => Err(error),
        Err(_) => Err(ClaimsError::unavailable("no first response within 10 s")),
    }
}

async fn workload(
    cache: RouterCache,
    client: ClaimsClient,
    keys: u32,
    mut rng: fastrand::Rng,
    mut stopped: watch::Receiver<bool>,
    violations: Arc<Mutex<Vec<Violation>>>,
    checks: Arc<AtomicU64>,
) {
    let namespace = model::claim_key(0).namespace.to_string();
    while !*stopped.borrow() {
        // Route every key (in a random order), a few at a time: errors (a killed server, a
        // dropped connection) are the faults', and the next round routes again.
        let mut order: Vec<u32> = (0..keys).collect();
        rng.shuffle(&mut order);
        futures::stream::iter(order.into_iter().map(|key| {
            let (cache, namespace) = (cache.clone(), namespace.clone());
            let value = model::claim_key(key).value;
            async move {
                let _ = tokio::time::timeout(PATIENCE, cache.route(&namespace, &value)).await;
            }
        }))
        .buffer_unordered(PARALLEL)
        .collect::<Vec<()>>()
        .await;
        // Then check every key the cache holds.
        let held: Vec<u32> = cache
            .snapshot()
            .iter()
            .filter_map(|((_, value), _)| {
                model::key_index(&topology_claims::ClaimKey::new(
                    topology_claims::ClaimType::Username,
                    value.clone(),
                ))
            })
            .collect();
        let found: Vec<Option<Violation>> =
            futures::stream::iter(held.clone().into_iter().map(|key| {
                let (cache, client) = (cache.clone(), client.clone());
                let namespace = namespace.clone();
                async move { check_now(&cache, &client, &namespace, key).await }
            }))
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        checks.fetch_add(held.len() as u64, Ordering::Relaxed);
        violations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(found.into_iter().flatten());
        tokio::select! {
            () = tokio::time::sleep(ROUND_PAUSE) => {}
            _ = stopped.changed() => {}
        }
    }
}

/// The mid-run rule for one key: look it up, then read the cache's entry and the revision the
/// feed confirmed. A change the store answered at revision r ≤ confirmed must be in the cache:
/// an entry older than r is stale; an entry of revision r must say the same. (An entry newer
/// than r saw a later change; a claim not found has no revision to judge by.)
async fn check_now(
    cache: &RouterCache,
    client: &ClaimsClient,
    namespace: &str,
    key: u32,
) -> Option<Violation> {
    let claim = model::claim_key(key);
    let Ok(Ok(view)) = tokio::time::timeout(PATIENCE, client.lookup_claim(&claim)).await else {
        return None;
    };
    let (entry, confirmed) = cache.entry(namespace, &claim.value);
    let owner = entry?;
    let stale = view.revision <= confirmed && owner.revision < view.revision;
    let differs = owner.revision == view.revision && !agrees(&owner, &view);
    (stale || differs).then(|| {
        violation(
            Some(key),
            format!(
                "cached {owner:?} with the feed confirmed through {confirmed}, the store has {} \
                 {} at revision {}",
                view.cell_id,
                state_name(view.state),
                view.revision
            ),
        )
    })
}

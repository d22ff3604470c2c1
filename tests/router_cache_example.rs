//! The router cache example (`examples/router-cache`) against the real gRPC server on the
//! memory and SQLite stores: three cells create, destroy and update claims, committing or
//! rolling back at random, while the cache routes lookups of the same names; once the feed has
//! confirmed the store's last revision, every entry the cache holds agrees with the store
//! (docs/reliability.md, "The router cache's invariant"). A restore-like compaction flushes it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use router_cache::RouterCache;
use topology_claims::domain::{ClaimType, EventPosition, EventsQuery};
use topology_claims::ports::ClaimStore;
use topology_claims::{ClaimKey, ClaimsError};
use topology_claims_client::{ClaimsClient, ClientConfig};
use topology_claims_testkit::fixtures::{cell, creates, destroys, username};
use topology_claims_testkit::TestServer;

/// A small deterministic generator (no dependency for one test).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

async fn cache_agrees_with_the_store_after_random_traffic(store: Arc<dyn ClaimStore>) {
    let server = TestServer::start(Arc::clone(&store)).await;
    let client = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    let cache = RouterCache::new(&server.endpoint());
    let (ready, opened) = tokio::sync::oneshot::channel();
    let follower = {
        let (cache, client) = (cache.clone(), client.clone());
        tokio::spawn(async move { cache.follow(client, ready).await })
    };
    opened.await.unwrap();
    let cells = [cell("cell-a"), cell("cell-b"), cell("cell-c")];
    let mut rng = Lcg(7);
    // Names in two forms: the cache must map both to one key.
    let name = |n: u64| format!("user{n}");
    for _ in 0..300 {
        let n = rng.below(20);
        let who = &cells[rng.below(3) as usize];
        let request = if rng.below(3) == 0 {
            destroys(who, &[username(&name(n))])
        } else {
            creates(who, &[username(&name(n).to_uppercase())])
        };
        if let Ok(lease) = client.begin_update(request).await {
            // A lookup while leased, then the outcome.
            cache.route("usernames", &name(n)).await.unwrap();
            if rng.below(4) == 0 {
                client.rollback_update(who, lease.lease_id).await.unwrap();
            } else {
                client.commit_update(who, lease.lease_id).await.unwrap();
            }
        }
        cache
            .route("usernames", &name(rng.below(20)).to_uppercase())
            .await
            .unwrap();
    }
    // Wait until the feed confirmed everything written.
    let probe = EventsQuery {
        from: EventPosition::start_of(u64::MAX),
        limit: 1,
    };
    let head = store.read_events(&probe).await.unwrap().through;
    let started = Instant::now();
    while cache.confirmed() < head {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "feed stuck below {head}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let held = cache.snapshot();
    assert!(!held.is_empty());
    let mut violations = Vec::new();
    for ((_, key), owner) in &held {
        let truth = client
            .lookup_claim(&ClaimKey::new(ClaimType::Username, key.clone()))
            .await;
        let agrees = match &truth {
            Ok(view) => {
                view.cell_id.as_str() == owner.cell_id
                    && router_cache::state_name(view.state) == owner.state
            }
            Err(ClaimsError::ClaimNotFound { .. }) => false,
            Err(other) => panic!("{other}"),
        };
        if !agrees {
            violations.push(format!("{key}: cached {owner:?}, store {truth:?}"));
        }
    }
    assert!(violations.is_empty(), "{violations:#?}");
    let (misses, flushes, _) = cache.stats();
    println!(
        "{} entries held, {misses} lookups, {flushes} flushes, 0 violations",
        held.len()
    );
    follower.abort();
}

#[tokio::test]
async fn the_router_cache_agrees_with_the_memory_store_after_random_traffic() {
    let store = Arc::new(topology_claims::memory::MemoryClaimStore::new());
    cache_agrees_with_the_store_after_random_traffic(store).await;
}

#[tokio::test]
async fn the_router_cache_agrees_with_the_sqlite_store_after_random_traffic() {
    let dir = tempfile::tempdir().unwrap();
    let store = topology_claims_sqlite::SqliteClaimStore::open(
        dir.path().join("claims.db"),
        topology_claims::MigrationPolicy::Apply,
    )
    .await
    .unwrap();
    cache_agrees_with_the_store_after_random_traffic(Arc::new(store)).await;
}

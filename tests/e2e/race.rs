//! Concurrency: sixteen clients race for fifty claims in shuffled orders and batch sizes; every
//! claim ends with exactly one winner and no lease is left open (the shared scenario
//! `testing::race`, run here for every store).

use std::sync::Arc;

use topology_claims::ClaimStore;
use topology_claims_testkit::race::racing_clients_get_one_winner_each;

use crate::support::*;

against_every_store!(sixteen_concurrent_clients_racing_for_fifty_claims_get_one_winner_each,);

async fn sixteen_concurrent_clients_racing_for_fifty_claims_get_one_winner_each(
    store: Arc<dyn ClaimStore>,
) {
    racing_clients_get_one_winner_each(store, 16, 50).await;
}

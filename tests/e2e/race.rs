//! Concurrency: sixteen clients race for fifty claims in shuffled orders and batch sizes; every
//! claim ends with exactly one winner and no lease is left open.

use std::collections::BTreeMap;
use std::sync::Arc;

use tonic::Code;
use tonic_types::StatusExt;
use topology_claims::grpc::pb;
use topology_claims::testing::TestServer;
use topology_claims::ClaimStore;

use crate::support::*;

against_every_store!(sixteen_concurrent_clients_racing_for_fifty_claims_get_one_winner_each,);

async fn sixteen_concurrent_clients_racing_for_fifty_claims_get_one_winner_each(
    store: Arc<dyn ClaimStore>,
) {
    const CLIENTS: usize = 16;
    const CLAIMS: usize = 50;
    let server = TestServer::start(store).await;
    let claims: Vec<pb::ClaimRecord> = (0..CLAIMS)
        .map(|i| username(&format!("race-{i:02}")))
        .collect();

    let mut tasks = Vec::new();
    for n in 0..CLIENTS {
        let mut client = server.client().await;
        let mut order = claims.clone();
        XorShift(0x9E37_79B9_7F4A_7C15 ^ ((n as u64 + 1) * 0x1000_0001)).shuffle(&mut order);
        // Clients 0, 3, 6, … send single claims; the others batches of 2 or 3.
        let batch = 1 + n % 3;
        tasks.push(tokio::spawn(async move {
            let cell = format!("cell-{n:02}");
            let mut won = Vec::new();
            for chunk in order.chunks(batch) {
                if try_claim(&mut client, &cell, chunk).await {
                    won.extend(chunk.iter().map(|r| r.claim_value.clone()));
                } else if chunk.len() > 1 {
                    // The batch lost on some claim: the others may still be free.
                    for single in chunk {
                        if try_claim(&mut client, &cell, std::slice::from_ref(single)).await {
                            won.push(single.claim_value.clone());
                        }
                    }
                }
            }
            (cell, won)
        }));
    }
    let mut winners: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for task in tasks {
        let (cell, won) = task.await.expect("a racing client");
        for value in won {
            winners.entry(value).or_default().push(cell.clone());
        }
    }

    let mut c = server.client().await;
    for record in &claims {
        let cells = winners
            .get(&record.claim_value)
            .cloned()
            .unwrap_or_default();
        assert_eq!(cells.len(), 1, "{} won by {cells:?}", record.claim_value);
        assert_eq!(
            lookup(&mut c, record).await,
            held(pb::ClaimState::Active, &cells[0])
        );
    }
    for n in 0..CLIENTS {
        let page = ok(
            c.list_outstanding_leases(leases_req(&format!("cell-{n:02}"), "", 0))
                .await,
            "list",
        );
        assert!(page.leases.is_empty(), "every lease of the race ended");
    }
    server.shutdown().await;
}

/// A small deterministic generator, so each client's order differs but runs are reproducible.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, (self.next() % (i as u64 + 1)) as usize);
        }
    }
}

/// Begin + commit; `false` when the batch lost (taken or leased by a rival).
async fn try_claim(client: &mut Client, cell: &str, records: &[pb::ClaimRecord]) -> bool {
    match client.begin_update(request(cell, records, &[])).await {
        Ok(response) => {
            let lease = response
                .into_inner()
                .lease_payload
                .expect("a lease payload");
            commit(client, cell, &lease.lease_id).await;
            true
        }
        Err(status) => {
            let reason = status
                .get_error_details()
                .error_info()
                .map(|i| i.reason.clone());
            match (status.code(), reason.as_deref()) {
                (Code::AlreadyExists, Some("CLAIM_TAKEN"))
                | (Code::FailedPrecondition, Some("CLAIM_LEASED")) => false,
                _ => panic!("a racing BeginUpdate failed unexpectedly: {status:?}"),
            }
        }
    }
}

//! A race through the real gRPC server, run for every store: `clients` clients race for
//! `claims` claims, each in its own shuffled order, a third of them one claim at a time and the
//! others in batches of 2 or 3 (a lost batch tries its claims one by one). Every claim must end
//! with exactly one winner, held Active by it, and no lease may be left outstanding.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::fixtures::{cell, creates, record_in};
use crate::TestServer;
use topology_claims::domain::{ClaimRecord, ClaimType, TableName};
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;
use topology_claims_proto::convert::begin_update_to_pb;
use topology_claims_proto::pb;
use topology_claims_proto::status::from_status;

type Client = pb::claims_service_client::ClaimsServiceClient<tonic::transport::Channel>;

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
async fn try_claim(client: &mut Client, cell_name: &str, records: &[ClaimRecord]) -> bool {
    let request = begin_update_to_pb(&creates(&cell(cell_name), records));
    match client.begin_update(request).await {
        Ok(response) => {
            let lease = response
                .into_inner()
                .lease_payload
                .expect("a lease payload");
            client
                .commit_update(pb::CommitUpdateRequest {
                    cell_id: cell_name.to_owned(),
                    lease_id: lease.lease_id,
                })
                .await
                .expect("commit of a won lease");
            true
        }
        Err(status) => match from_status(&status).refusal() {
            ClaimsError::ClaimTaken { .. } | ClaimsError::ClaimLeased { .. } => false,
            other => panic!("a racing BeginUpdate failed unexpectedly: {other} ({status:?})"),
        },
    }
}

/// Runs the race over `store` (see the module doc).
pub async fn racing_clients_get_one_winner_each(
    store: Arc<dyn ClaimStore>,
    clients: usize,
    claims: usize,
) {
    let server = TestServer::start(store).await;
    let records: Vec<ClaimRecord> = (0..claims)
        .map(|i| {
            record_in(
                TableName::USERS,
                i as i64,
                ClaimType::Username,
                &format!("race-{i:02}"),
            )
        })
        .collect();

    let mut tasks = Vec::new();
    for n in 0..clients {
        let mut client = server.client().await;
        let mut order = records.clone();
        XorShift(0x9E37_79B9_7F4A_7C15 ^ ((n as u64 + 1) * 0x1000_0001)).shuffle(&mut order);
        let batch = 1 + n % 3;
        tasks.push(tokio::spawn(async move {
            let cell_name = format!("cell-{n:02}");
            let mut won = Vec::new();
            for chunk in order.chunks(batch) {
                if try_claim(&mut client, &cell_name, chunk).await {
                    won.extend(chunk.iter().map(|r| r.key.value.clone()));
                } else if chunk.len() > 1 {
                    // The batch lost on some claim: the others may still be free.
                    for single in chunk {
                        if try_claim(&mut client, &cell_name, std::slice::from_ref(single)).await {
                            won.push(single.key.value.clone());
                        }
                    }
                }
            }
            (cell_name, won)
        }));
    }
    let mut winners: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for task in tasks {
        let (cell_name, won) = task.await.expect("a racing client");
        for value in won {
            winners.entry(value).or_default().push(cell_name.clone());
        }
    }

    let mut client = server.client().await;
    for record in &records {
        let cells = winners.get(&record.key.value).cloned().unwrap_or_default();
        assert_eq!(cells.len(), 1, "{} won by {cells:?}", record.key.value);
        let answer = client
            .lookup_claim(pb::LookupClaimRequest {
                namespace: record.key.namespace.to_string(),
                claim_value: record.key.value.clone(),
                ..Default::default()
            })
            .await
            .expect("a won claim is found")
            .into_inner();
        assert_eq!(
            (answer.state(), answer.cell_id.as_str()),
            (pb::ClaimState::Active, cells[0].as_str()),
            "{} is held, committed, by its winner",
            record.key.value
        );
    }
    for n in 0..clients {
        let page = client
            .list_outstanding_leases(pb::ListOutstandingLeasesRequest {
                cell_id: format!("cell-{n:02}"),
                cursor: String::new(),
                limit: 0,
            })
            .await
            .expect("list")
            .into_inner();
        assert!(page.leases.is_empty(), "every lease of the race ended");
    }
    server.shutdown().await;
}

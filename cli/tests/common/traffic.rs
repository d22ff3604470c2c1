//! Claims committed one after another by cell-a, for the tests that take a backup while a
//! server keeps writing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use topology_claims_client::ClaimsClient;
use topology_claims_testkit::fixtures::{cell, creates, username};

/// Begin + commit of username `name` for cell-a.
pub async fn claim(client: &ClaimsClient, name: &str) {
    let lease = client
        .begin_update(creates(&cell("cell-a"), &[username(name)]))
        .await
        .unwrap_or_else(|e| panic!("BeginUpdate {name}: {e}"))
        .lease_id;
    client
        .commit_update(&cell("cell-a"), lease)
        .await
        .unwrap_or_else(|e| panic!("CommitUpdate {name}: {e}"));
}

/// Claims `during-0`, `during-1`, … until [`Traffic::stop`].
pub struct Traffic {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<u32>,
}

impl Traffic {
    pub fn start(client: &ClaimsClient) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let (client, stop) = (client.clone(), Arc::clone(&stop));
            async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    claim(&client, &format!("during-{n}")).await;
                    n += 1;
                }
                n
            }
        });
        Self { stop, task }
    }

    /// Stops the traffic; returns how many claims it committed.
    pub async fn stop(self) -> u32 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

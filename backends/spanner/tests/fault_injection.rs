//! The shared ClaimStore conformance suite and model-based property test against an emulator
//! started with `--enable_fault_injection`, which aborts a share of commits at random: every
//! case must still pass (the adapter retries aborted transactions), and the suite's invariants,
//! checked after every step of the model test, show that no batch is ever half-applied. The
//! same holds behind the group-commit combiner, whose groups are aborted and re-run whole.

mod common;

use topology_claims_spanner::SpannerClaimStore;

async fn store() -> (SpannerClaimStore, ()) {
    (common::fresh_store(common::Mode::FaultInjection).await, ())
}

topology_claims_testkit::claim_store_conformance!(store, model_cases = 8);

/// The same suite through the group-commit combiner: an aborted group is re-run whole and
/// decided afresh.
mod grouped {
    pub(super) async fn store() -> (topology_claims_server::group::GroupCommit, ()) {
        topology_claims_testkit::grouped(super::store().await)
    }

    topology_claims_testkit::claim_store_conformance!(store, model_cases = 8);
}

/// Guards the guard: the emulator of this binary really aborts commits, so the suite above ran
/// under injected faults (a single attempt per transaction here, no retry).
#[test]
fn the_emulator_really_aborts_commits() {
    use gcloud_gax::conn::Environment;
    use gcloud_gax::grpc::Code;
    use gcloud_gax::retry::TryAs;
    use gcloud_spanner::client::{Client, ClientConfig, Error};
    use gcloud_spanner::mutation::insert_or_update;
    use gcloud_spanner::value::CommitTimestamp;

    topology_claims_testkit::run_async(async {
        let emulator = common::shared(common::Mode::FaultInjection);
        let url = common::fresh_url();
        topology_claims_spanner::migrate(&url, common::options(emulator), true)
            .await
            .unwrap();
        let config = ClientConfig {
            environment: Environment::Emulator(emulator.host.clone()),
            ..ClientConfig::default()
        };
        let database = url.trim_start_matches("spanner://").to_owned();
        let client = Client::new(database, config).await.unwrap();
        let (mut committed, mut aborted) = (0, 0);
        for version in 1000..1300i64 {
            let mut tx = client.begin_read_write_transaction().await.unwrap();
            tx.buffer_write(vec![insert_or_update(
                "schema_migrations",
                &["version", "name", "applied_at"],
                &[&version, &"probe", &CommitTimestamp::new()],
            )]);
            match tx.end(Ok::<(), Error>(()), None).await {
                Ok(_) => committed += 1,
                Err(e) if e.try_as().is_some_and(|s| s.code() == Code::Aborted) => aborted += 1,
                Err(e) => panic!("unexpected failure: {e}"),
            }
        }
        println!(
            "fault injection: {aborted} of {} commits aborted",
            committed + aborted
        );
        assert!(
            aborted > 0,
            "no commit aborted in {committed}: fault injection is off"
        );
        client.close().await;
    });
}

/// Every transaction the adapter re-ran after an injected abort is counted by
/// `ClaimStore::retries` (read by the metrics), without a store query.
#[test]
fn aborted_transactions_are_counted_as_retries() {
    use topology_claims::ClaimStore;
    use topology_claims_testkit::fixtures::{cell, creates, username};

    topology_claims_testkit::run_async(async {
        let store = common::fresh_store(common::Mode::FaultInjection).await;
        assert_eq!(store.retries(), 0, "a fresh store has retried nothing");
        let a = cell("cell-a");
        // The emulator aborts about 5 % of commits at random: 40 pairs see none about 1.6 % of
        // the time, 400 pairs practically never (0.95^800). Stop at the first retry.
        let mut pairs = 0;
        while store.retries() == 0 && pairs < 400 {
            let lease = store
                .begin_update(creates(&a, &[username(&format!("retried-{pairs}"))]))
                .await
                .unwrap();
            store.commit_update(&a, lease.lease_id).await.unwrap();
            pairs += 1;
        }
        assert!(
            store.retries() > 0,
            "{} transactions under fault injection, none retried",
            2 * pairs
        );
    });
}

#[test]
fn aborted_groups_are_rerun_whole_and_leave_consistent_tables() {
    topology_claims_testkit::run_async(async {
        // A share of commits aborts at random: run histories until some group was re-run (and
        // at least three of them).
        let mut retries = 0;
        for seed in 1..=30 {
            let (combiner, ()) = grouped::store().await;
            common::concurrent::random_operations(&combiner, seed).await;
            retries += topology_claims::ClaimStore::retries(&combiner);
            if retries > 0 && seed >= 3 {
                break;
            }
        }
        assert!(
            retries > 0,
            "30 histories under fault injection, no group re-run"
        );
    });
}

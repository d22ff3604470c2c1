//! CLAIM_LEASED says when to retry, through the real gRPC server: the status carries a
//! google.rpc.RetryInfo, a default `ClaimsClient` (a user-facing save) hears CLAIM_LEASED at
//! once, and a client with `retry_claim_leased` (a background job) waits as RetryInfo asks, a
//! bounded number of times, and succeeds once the other update has ended.

use std::sync::Arc;
use std::time::{Duration, Instant};

use topology_claims::domain::CLAIM_LEASED_RETRY_AFTER;
use topology_claims::memory::MemoryClaimStore;
use topology_claims::ClaimsError;
use topology_claims_client::{ClaimsClient, ClientConfig, LeasedRetry};
use topology_claims_proto::status;
use topology_claims_testkit::fixtures::{cell, creates, username};
use topology_claims_testkit::TestServer;

async fn server() -> TestServer {
    TestServer::start(Arc::new(MemoryClaimStore::new())).await
}

fn client(server: &TestServer, retry_claim_leased: Option<LeasedRetry>) -> ClaimsClient {
    let config = ClientConfig {
        retry_claim_leased,
        ..ClientConfig::default()
    };
    ClaimsClient::connect_lazy(&server.endpoint(), config).unwrap()
}

#[tokio::test]
async fn claim_leased_carries_a_retry_info_delay() {
    let server = server().await;
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    client(&server, None)
        .begin_update(creates(&a, &[username("taken-soon")]))
        .await
        .unwrap();
    let request = creates(&b, &[username("taken-soon")]);
    let refusal = server
        .client()
        .await
        .begin_update(topology_claims_proto::convert::begin_update_to_pb(&request))
        .await
        .unwrap_err();
    assert_eq!(refusal.code(), tonic::Code::FailedPrecondition);
    assert!(matches!(
        status::from_status(&refusal),
        ClaimsError::ClaimLeased { .. }
    ));
    assert_eq!(
        status::retry_delay(&refusal),
        Some(CLAIM_LEASED_RETRY_AFTER)
    );
    // And when the lease began, by the store's clock: the lease's own created_at.
    let details = tonic_types::StatusExt::get_error_details(&refusal);
    let since = details.error_info().unwrap().metadata[status::META_LEASED_SINCE].clone();
    let lease = server
        .client()
        .await
        .list_outstanding_leases(topology_claims_proto::pb::ListOutstandingLeasesRequest {
            cell_id: "cell-a".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let created = lease.leases[0]
        .lease_payload
        .as_ref()
        .unwrap()
        .created_at
        .unwrap();
    assert_eq!(since, created.to_string(), "leased_since");
    server.shutdown().await;
}

/// How long cell-b's create of a claim leased by cell-a takes to be refused with CLAIM_LEASED,
/// by a client retrying as `policy` says (the lease never ends).
async fn refused_while_leased(policy: Option<LeasedRetry>) -> Duration {
    let server = server().await;
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    client(&server, None)
        .begin_update(creates(&a, &[username("leased")]))
        .await
        .unwrap();
    let started = Instant::now();
    let error = client(&server, policy)
        .begin_update(creates(&b, &[username("leased")]))
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(matches!(error, ClaimsError::ClaimLeased { .. }), "{error}");
    server.shutdown().await;
    took
}

#[tokio::test]
async fn a_user_facing_save_hears_claim_leased_at_once() {
    let took = refused_while_leased(None).await;
    assert!(
        took < CLAIM_LEASED_RETRY_AFTER,
        "no retry by default: {took:?}"
    );
}

#[tokio::test]
async fn a_background_job_retries_claim_leased_after_its_delay_and_succeeds_when_the_lease_ends() {
    let server = server().await;
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    let holder = client(&server, None);
    let lease = holder
        .begin_update(creates(&a, &[username("contended")]))
        .await
        .unwrap();
    // cell-a's transaction ends (rolled back) a little after the job's first refusal.
    let ender = tokio::spawn({
        let (holder, a) = (holder.clone(), a.clone());
        async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            holder.rollback_update(&a, lease.lease_id).await.unwrap();
        }
    });
    let job = client(&server, Some(LeasedRetry::default()));
    let started = Instant::now();
    let created = job
        .begin_update(creates(&b, &[username("contended")]))
        .await
        .expect("the retry after the lease ended succeeds");
    assert!(
        started.elapsed() >= CLAIM_LEASED_RETRY_AFTER,
        "the retry waited the RetryInfo delay: {:?}",
        started.elapsed()
    );
    ender.await.unwrap();
    job.commit_update(&b, created.lease_id).await.unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn a_background_job_gives_up_after_its_retries() {
    let took = refused_while_leased(Some(LeasedRetry {
        retries: 2,
        longest_wait: Duration::from_secs(5),
    }))
    .await;
    assert!(
        took >= 2 * CLAIM_LEASED_RETRY_AFTER,
        "two waits of the RetryInfo delay before giving up: {took:?}"
    );
}

#[tokio::test]
async fn a_retry_info_longer_than_the_jobs_longest_wait_is_not_waited_for() {
    let took = refused_while_leased(Some(LeasedRetry {
        retries: 5,
        longest_wait: Duration::from_millis(100),
    }))
    .await;
    assert!(took < CLAIM_LEASED_RETRY_AFTER, "{took:?}");
}

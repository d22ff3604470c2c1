//! The server around the service: health and reflection (per store), and behaviour that needs its
//! own configuration and so runs over the memory store only: outcome collection after retention,
//! the request size limit, and the drain on shutdown.

use std::sync::Arc;
use std::time::Duration;

use tonic::transport::Channel;
use tonic::{Code, Response};
use topology_claims::ClaimsError;
use topology_claims::{ClaimStore, ClaimType};
use topology_claims_server::grpc::server::ServerConfig;
use topology_claims_testkit::TestServer;

use crate::support::*;

against_every_store!(health_and_reflection_are_served,);

async fn health_and_reflection_are_served(store: Arc<dyn ClaimStore>) {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let server = TestServer::start(store).await;
    let channel = Channel::from_shared(server.endpoint())
        .unwrap()
        .connect()
        .await
        .expect("connect");

    let mut health = HealthClient::new(channel.clone());
    for service in ["", "topology.claims.v1.ClaimsService"] {
        let answer = ok(
            health
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await,
            "health",
        );
        assert_eq!(
            answer.status(),
            ServingStatus::Serving,
            "health of {service:?}"
        );
    }

    let mut reflection = ServerReflectionClient::new(channel);
    let requests = [
        MessageRequest::ListServices(String::new()),
        MessageRequest::FileContainingSymbol("topology.claims.v1.ClaimsService".into()),
        MessageRequest::FileContainingSymbol("google.rpc.ErrorInfo".into()),
    ]
    .map(|message| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(message),
    });
    let mut answers = ok(
        reflection
            .server_reflection_info(tokio_stream::iter(requests))
            .await,
        "reflection",
    );
    let Some(MessageResponse::ListServicesResponse(list)) =
        answers.message().await.unwrap().unwrap().message_response
    else {
        panic!("expected a service list");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"topology.claims.v1.ClaimsService".to_owned()),
        "{names:?}"
    );
    assert!(
        names.contains(&"grpc.health.v1.Health".to_owned()),
        "{names:?}"
    );
    let Some(MessageResponse::FileDescriptorResponse(files)) =
        answers.message().await.unwrap().unwrap().message_response
    else {
        panic!("expected file descriptors");
    };
    assert!(!files.file_descriptor_proto.is_empty());
    // google.rpc error details are described too, so grpcurl can print ErrorInfo.
    let Some(MessageResponse::FileDescriptorResponse(files)) =
        answers.message().await.unwrap().unwrap().message_response
    else {
        panic!("expected the file describing google.rpc.ErrorInfo");
    };
    assert!(!files.file_descriptor_proto.is_empty());
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_are_collected_by_the_server_after_retention() {
    let config = ServerConfig {
        outcome_retention: Duration::ZERO,
        gc_interval: Duration::from_millis(10),
        ..ServerConfig::default()
    };
    let server = TestServer::start_with(memory_store().await.store, config).await;
    let mut c = server.client().await;
    let lease = begin(&mut c, request("cell-a", &[username("gc")], &[])).await;
    commit(&mut c, "cell-a", &lease.lease_id).await;
    // Polls until the collector ran; a hang means it never does (guarded, not timed).
    let forgotten = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match c.commit_update(commit_req("cell-a", &lease.lease_id)).await {
                Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                Err(status) => return status,
            }
        }
    })
    .await
    .expect("the outcome is collected");
    expect_lease_error(
        Err::<Response<()>, _>(forgotten),
        Code::NotFound,
        "LEASE_NOT_FOUND",
        &lease.lease_id,
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_larger_than_four_mebibytes_are_refused_before_decoding() {
    // tonic refuses an oversized message with OUT_OF_RANGE (no ErrorInfo: no handler ran).
    let server = TestServer::start(memory_store().await.store).await;
    let mut c = server.client().await;
    let huge = email(&"x".repeat(5 * 1024 * 1024));
    let status = c
        .begin_update(request("cell-a", &[huge], &[]))
        .await
        .expect_err("too large");
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    // The connection stays usable.
    begin(&mut c, request("cell-a", &[username("after-huge")], &[])).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_with_idle_clients_still_connected() {
    let server = TestServer::start(memory_store().await.store).await;
    let mut idle = server.client().await;
    begin(&mut idle, request("cell-a", &[username("idle")], &[])).await;
    tokio::time::timeout(Duration::from_secs(60), server.shutdown())
        .await
        .expect("shutdown completes although a client keeps its connection open");
    let status = idle
        .lookup_claim(lookup_req(ClaimType::Username, "idle"))
        .await
        .expect_err("server gone");
    // The transport reports a vanished server as UNAVAILABLE or, when the connection closes
    // mid-call, CANCELLED; a client sees either as a retryable Unavailable.
    assert!(
        matches!(
            topology_claims_proto::status::from_status(&status),
            ClaimsError::ServerUnavailable { .. }
        ),
        "{status:?}"
    );
}

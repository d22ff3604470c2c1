//! Health follows the store: with a private PostgreSQL cluster that is crashed and started
//! again, then frozen (SIGSTOP) and thawed, the ClaimsService's `grpc.health.v1` status turns
//! NOT_SERVING and back while the overall status stays SERVING (liveness vs readiness), with
//! one log line when the store goes and one when it comes back, and failed requests logged a
//! few times, not once each.

use std::time::{Duration, Instant};

use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use topology_claims_harness::private_postgres::PrivatePostgres;
use topology_claims_harness::process::signal;

use super::*;

const SERVICE: &str = "topology.claims.v1.ClaimsService";

async fn status_of(channel: &Channel, service: &str) -> ServingStatus {
    let answer = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .expect("health answers whatever the store does");
    answer.into_inner().status()
}

/// Polls until `service` reports `wanted`; returns how long it took.
async fn until(channel: &Channel, service: &str, wanted: ServingStatus) -> Duration {
    let started = Instant::now();
    loop {
        let status = status_of(channel, service).await;
        if status == wanted {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{service} stayed {status:?}, expected {wanted:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_turns_not_serving_while_the_store_is_down_or_frozen_and_back() {
    let cluster = match tokio::task::block_in_place(PrivatePostgres::start) {
        Ok(cluster) => cluster,
        Err(why) if !topology_claims_harness::in_ci() => {
            println!("health test skipped: no private PostgreSQL: {why}");
            return;
        }
        Err(why) => panic!("CI=true needs a private PostgreSQL cluster: {why}"),
    };
    let url = cluster.url();
    let target = Target::start_with(
        &["--store", &url],
        &[
            "--health-interval",
            "200ms",
            "--health-timeout",
            "500ms",
            "--pg-pool-size",
            "2",
            "--pg-statement-timeout",
            "1s",
        ],
        |_| {},
    );
    let channel = target.channel().await;
    assert_eq!(status_of(&channel, SERVICE).await, ServingStatus::Serving);

    // Stopped: the cluster crashes (pg_ctl stop -m immediate).
    let guard = cluster
        .crash_now()
        .expect("crash the cluster")
        .expect("no restart under way");
    let took = until(&channel, SERVICE, ServingStatus::NotServing).await;
    println!("store stopped: NOT_SERVING after {took:?}");
    assert_eq!(status_of(&channel, "").await, ServingStatus::Serving);
    // Requests during the outage fail UNAVAILABLE; the log says so a few times, not per request.
    let mut client = ClaimsServiceClient::new(channel.clone());
    for _ in 0..50 {
        let status = client
            .lookup_claim(pb::LookupClaimRequest {
                claim_type: 2,
                claim_value: "during-outage".into(),
                ..Default::default()
            })
            .await
            .expect_err("the store is down");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    }
    cluster
        .start_after(guard, Duration::ZERO)
        .await
        .expect("start the cluster again");
    let took = until(&channel, SERVICE, ServingStatus::Serving).await;
    println!("store started: SERVING after {took:?}");

    // Frozen: every process of the cluster stopped with SIGSTOP.
    let pids = cluster.pids().expect("cluster pids");
    for pid in &pids {
        let _ = signal(*pid, "STOP");
    }
    let took = until(&channel, SERVICE, ServingStatus::NotServing).await;
    println!("store frozen: NOT_SERVING after {took:?}");
    assert_eq!(status_of(&channel, "").await, ServingStatus::Serving);
    for pid in &pids {
        let _ = signal(*pid, "CONT");
    }
    let took = until(&channel, SERVICE, ServingStatus::Serving).await;
    println!("store thawed: SERVING after {took:?}");

    let log = target.log_text();
    let down = target.log_lines("store unreachable");
    let up = target.log_lines("store reachable again");
    let per_request = target.log_lines("request failed: store unavailable");
    println!("log: {down} 'unreachable', {up} 'reachable again', {per_request} per-request lines");
    // Two outages: one line each way per outage (probes every 200 ms would say it a dozen
    // times). A pooled connection that died with the restart may fail one later probe: that
    // is a third, real, outage of one probe.
    assert!((2..=3).contains(&down), "one line per outage:\n{log}");
    assert_eq!(up, down, "one line per recovery:\n{log}");
    assert!(
        per_request <= 3,
        "failed requests are logged a few times, not each:\n{log}"
    );
}

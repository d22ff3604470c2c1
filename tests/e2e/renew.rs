//! RenewLease and lease age: renewal moves `last_renewed_at`, which ListOutstandingLeases reports
//! with the server's own time, so a cell judges its leases by the server's clock.

use std::sync::Arc;

use topology_claims::ClaimStore;
use topology_claims_testkit::TestServer;

use crate::support::*;

against_every_store!(renew_moves_last_renewed_at_and_leases_are_judged_by_server_time,);

async fn renew_moves_last_renewed_at_and_leases_are_judged_by_server_time(
    store: Arc<dyn ClaimStore>,
) {
    let server = TestServer::start(store).await;
    let mut c = server.client().await;
    let lease = begin(&mut c, request("cell-a", &[username("long-tx")], &[])).await;
    let created = lease.created_at.expect("created_at");

    let renewed = ok(
        c.renew_lease(renew_req("cell-a", &lease.lease_id)).await,
        "renew",
    );
    assert_eq!(
        renewed.lease_payload.as_ref(),
        Some(&lease),
        "renew returns the same payload"
    );
    let renewed_at = renewed.last_renewed_at.expect("last_renewed_at");
    assert!(seconds(&renewed_at) >= seconds(&created));

    let page = ok(
        c.list_outstanding_leases(leases_req("cell-a", "", 0)).await,
        "list",
    );
    let listed = &page.leases[0];
    assert_eq!(listed.lease_payload.as_ref(), Some(&lease));
    assert_eq!(listed.last_renewed_at.as_ref(), Some(&renewed_at));
    let server_time = page.server_time.expect("server_time");
    assert!(
        seconds(&server_time) >= seconds(&renewed_at),
        "server_time is the server's now"
    );
    // Another cell sees none of it.
    let other = ok(
        c.list_outstanding_leases(leases_req("cell-b", "", 0)).await,
        "list",
    );
    assert!(other.leases.is_empty());
    assert!(
        other.server_time.is_some(),
        "server_time is set on every page"
    );
    server.shutdown().await;
}

fn seconds(ts: &prost_types::Timestamp) -> f64 {
    ts.seconds as f64 + f64::from(ts.nanos) / 1e9
}

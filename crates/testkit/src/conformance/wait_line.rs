//! The lease waiters' line (`WaitLine`, decision 119): tickets grow in the order waiters join,
//! a waiter sees only earlier tickets on its own claims, a re-join keeps its place, a leave
//! frees the way, and an expired place holds no one up. Run by
//! [`claim_store_wait_line_conformance!`](crate::claim_store_wait_line_conformance).

use std::collections::BTreeSet;
use std::time::Duration;

use crate::fixtures::{email, username};
use topology_claims::domain::ClaimKey;
use topology_claims::ports::ClaimStore;

fn claims(keys: &[&ClaimKey]) -> BTreeSet<ClaimKey> {
    keys.iter().map(|k| (*k).clone()).collect()
}

const TTL: Duration = Duration::from_secs(30);

pub async fn the_wait_line_orders_waiters_by_ticket_on_their_claims(store: &impl ClaimStore) {
    let (x, y, z) = (
        username("line-x").key,
        email("line-y@example.com").key,
        username("line-z").key,
    );
    let join = |ticket, keys: &[&ClaimKey]| {
        let keys = claims(keys);
        async move { store.join_wait_line(ticket, &keys, TTL).await }
    };
    let ahead = |ticket, keys: &[&ClaimKey]| {
        let keys = claims(keys);
        async move { store.line_ahead(ticket, &keys).await.expect("line_ahead") }
    };
    let a = join(None, &[&x]).await.expect("a joins");
    let b = join(None, &[&x, &y]).await.expect("b joins");
    let c = join(None, &[&y]).await.expect("c joins");
    assert!(
        a < b && b < c,
        "tickets in the order of joining: {a}, {b}, {c}"
    );
    assert!(ahead(a, &[&x]).await.first_in_line());
    let behind_a = ahead(b, &[&x, &y]).await;
    assert!(!behind_a.first_in_line(), "{behind_a:?}");
    let expiry = behind_a.latest_expiry.expect("a's expiry");
    assert!(
        expiry > behind_a.now && expiry <= behind_a.now.saturating_add(TTL),
        "a's place lasts its ttl: {behind_a:?}"
    );
    assert!(!ahead(c, &[&y]).await.first_in_line(), "b waits for y too");
    assert!(ahead(c, &[&z]).await.first_in_line(), "nobody waits for z");

    store.leave_wait_line(a).await.expect("a leaves");
    assert!(ahead(b, &[&x, &y]).await.first_in_line());
    // b now waits for x alone and keeps its ticket: c is first on y, and a later d is behind b.
    assert_eq!(join(Some(b), &[&x]).await.expect("b moves"), b);
    assert!(ahead(c, &[&y]).await.first_in_line());
    let d = join(None, &[&x]).await.expect("d joins");
    assert!(d > c);
    assert!(!ahead(d, &[&x]).await.first_in_line());
    store.leave_wait_line(b).await.expect("b leaves");
    store
        .leave_wait_line(b)
        .await
        .expect("leaving twice is no error");
    assert!(ahead(d, &[&x]).await.first_in_line());
}

pub async fn an_expired_place_in_the_wait_line_holds_no_one_up(store: &impl ClaimStore) {
    let x = claims(&[&username("line-expired").key]);
    let gone = store
        .join_wait_line(None, &x, Duration::from_millis(1))
        .await
        .expect("a waiter whose server will die joins");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let next = store
        .join_wait_line(None, &x, TTL)
        .await
        .expect("the next joins");
    assert!(next > gone);
    let ahead = store.line_ahead(next, &x).await.expect("line_ahead");
    assert!(ahead.first_in_line(), "{ahead:?}");
}

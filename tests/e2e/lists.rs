//! ListClaims and ListOutstandingLeases: pages that tile the record id space without splitting a
//! record's claims, leased claims listed with their state, and the default page sizes.

use std::collections::BTreeSet;
use std::sync::Arc;

use topology_claims::grpc::pb;
use topology_claims::testing::TestServer;
use topology_claims::{ClaimStore, ClaimType, TableName};

use crate::support::*;

against_every_store!(
    list_claims_pages_tile_the_id_space_and_include_leased_claims,
    default_page_sizes_apply_when_limit_is_zero,
);

async fn list_claims_pages_tile_the_id_space_and_include_leased_claims(store: Arc<dyn ClaimStore>) {
    let server = TestServer::start(store).await;
    let mut c = server.client().await;
    // Record 5 has three claims: a page never splits them.
    let records = [
        claim(ClaimType::Routes, "r-1", TableName::Routes, 1),
        claim(ClaimType::Routes, "r-5a", TableName::Routes, 5),
        claim(ClaimType::Routes, "r-5b", TableName::Routes, 5),
        claim(ClaimType::Routes, "r-5c", TableName::Routes, 5),
        claim(ClaimType::Routes, "r-9", TableName::Routes, 9),
    ];
    claimed(&mut c, "cell-a", &records[..4]).await;
    begin(&mut c, request("cell-a", &records[4..], &[])).await; // left leased
    claimed(
        &mut c,
        "cell-b",
        &[claim(ClaimType::Routes, "b-3", TableName::Routes, 3)],
    )
    .await;

    let mut cursor = 0;
    let mut expected_start = 0;
    let mut seen = Vec::new();
    loop {
        let page = ok(
            c.list_claims(claims_req("cell-a", TableName::Routes, cursor, 2))
                .await,
            "page",
        );
        assert_eq!(page.start_range, expected_start, "pages leave no gap");
        for info in &page.claims {
            assert!(
                page.start_range <= info.table_record_id && info.table_record_id < page.end_range
            );
            seen.push((info.claim_value.clone(), info.state()));
        }
        match page.next_cursor {
            Some(next) => {
                assert_eq!(next, page.end_range);
                cursor = next;
                expected_start = next;
            }
            None => {
                assert_eq!(
                    page.end_range,
                    i64::MAX,
                    "the last page reaches the end of the id space"
                );
                break;
            }
        }
    }
    let active = pb::ClaimState::Active;
    assert_eq!(
        seen,
        vec![
            ("r-1".to_owned(), active),
            ("r-5a".to_owned(), active),
            ("r-5b".to_owned(), active),
            ("r-5c".to_owned(), active),
            ("r-9".to_owned(), pb::ClaimState::Creating),
        ]
    );
    server.shutdown().await;
}

async fn default_page_sizes_apply_when_limit_is_zero(store: Arc<dyn ClaimStore>) {
    let server = TestServer::start(store).await;
    let mut c = server.client().await;
    // 101 outstanding leases: limit 0 means 100.
    let mut ids = BTreeSet::new();
    for i in 0..101 {
        ids.insert(
            begin(
                &mut c,
                request("cell-a", &[username(&format!("lease-{i}"))], &[]),
            )
            .await
            .lease_id,
        );
    }
    let first = ok(
        c.list_outstanding_leases(leases_req("cell-a", "", 0)).await,
        "list",
    );
    assert_eq!(first.leases.len(), 100);
    assert!(!first.next_cursor.is_empty());
    let rest = ok(
        c.list_outstanding_leases(leases_req("cell-a", &first.next_cursor, 0))
            .await,
        "list",
    );
    assert_eq!(rest.leases.len(), 1);
    assert_eq!(rest.next_cursor, "");
    let listed: BTreeSet<String> = first
        .leases
        .iter()
        .chain(&rest.leases)
        .map(|l| l.lease_payload.as_ref().unwrap().lease_id.clone())
        .collect();
    assert_eq!(listed, ids);

    // 1001 claims with distinct record ids: limit 0 means 1000.
    let records: Vec<pb::ClaimRecord> = (0..1001)
        .map(|i| {
            claim(
                ClaimType::Email,
                &format!("u{i}@example.com"),
                TableName::Emails,
                i,
            )
        })
        .collect();
    begin(&mut c, request("cell-b", &records[..1000], &[])).await;
    begin(&mut c, request("cell-b", &records[1000..], &[])).await;
    let page = ok(
        c.list_claims(claims_req("cell-b", TableName::Emails, 0, 0))
            .await,
        "list",
    );
    assert_eq!(page.claims.len(), 1000);
    assert_eq!(page.next_cursor, Some(1000));
    assert_eq!((page.start_range, page.end_range), (0, 1000));
    server.shutdown().await;
}

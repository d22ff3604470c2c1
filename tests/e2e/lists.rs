//! ListClaims and ListOutstandingLeases: pages that tile the record id space and split a record's
//! claims only when they alone fill a page (with a key cursor), leased claims listed with their
//! state, the default page sizes, and pages that stop before the server's response budget.

use std::collections::BTreeSet;
use std::sync::Arc;

use prost::Message;
use topology_claims::{ClaimStore, ClaimType, TableName};
use topology_claims_proto::pb;
use topology_claims_server::grpc::server::ServerConfig;
use topology_claims_testkit::TestServer;

use crate::support::*;

against_every_store!(
    list_claims_pages_tile_the_id_space_and_include_leased_claims,
    default_page_sizes_apply_when_limit_is_zero,
    pages_stop_before_the_configured_response_budget,
);

async fn list_claims_pages_tile_the_id_space_and_include_leased_claims(store: Arc<dyn ClaimStore>) {
    let server = TestServer::start(store).await;
    let mut c = server.client().await;
    // Record 5 has three claims: at limit 2 the page before it ends at record 5, and record 5
    // alone fills the next page, so it is split after its second claim.
    let records = [
        claim(ClaimType::Routes, "r-1", TableName::ROUTES, 1),
        claim(ClaimType::Routes, "r-5a", TableName::ROUTES, 5),
        claim(ClaimType::Routes, "r-5b", TableName::ROUTES, 5),
        claim(ClaimType::Routes, "r-5c", TableName::ROUTES, 5),
        claim(ClaimType::Routes, "r-9", TableName::ROUTES, 9),
    ];
    claimed(&mut c, "cell-a", &records[..4]).await;
    begin(&mut c, request("cell-a", &records[4..], &[])).await; // left leased
    claimed(
        &mut c,
        "cell-b",
        &[claim(ClaimType::Routes, "b-3", TableName::ROUTES, 3)],
    )
    .await;

    let mut cursor = 0;
    let mut cursor_key = None;
    let mut expected_start = 0;
    let mut seen = Vec::new();
    let mut pages = Vec::new();
    loop {
        let request = pb::ListClaimsRequest {
            cursor_key: cursor_key.clone(),
            ..claims_req("cell-a", TableName::ROUTES, cursor, 2)
        };
        let page = ok(c.list_claims(request).await, "page");
        assert_eq!(page.start_range, expected_start, "pages leave no gap");
        assert!(page.claims.len() <= 2, "the limit bounds claims strictly");
        let split = page.next_cursor_key.is_some();
        for info in &page.claims {
            let id = info.table_record_id;
            assert!(
                (page.start_range <= id && id < page.end_range) || (split && id == page.end_range)
            );
            seen.push((info.claim_value.clone(), info.state()));
        }
        pages.push((page.start_range, page.end_range, page.claims.len(), split));
        match page.next_cursor {
            Some(next) => {
                assert_eq!(next, page.end_range);
                cursor = next;
                cursor_key = page.next_cursor_key;
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
    assert_eq!(
        pages,
        [(0, 5, 1, false), (5, 5, 2, true), (5, i64::MAX, 2, false)]
    );
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
                TableName::EMAILS,
                i,
            )
        })
        .collect();
    begin(&mut c, request("cell-b", &records[..1000], &[])).await;
    begin(&mut c, request("cell-b", &records[1000..], &[])).await;
    let page = ok(
        c.list_claims(claims_req("cell-b", TableName::EMAILS, 0, 0))
            .await,
        "list",
    );
    assert_eq!(page.claims.len(), 1000);
    assert_eq!((page.next_cursor, page.next_cursor_key), (Some(1000), None));
    assert_eq!((page.start_range, page.end_range), (0, 1000));
    server.shutdown().await;
}

async fn pages_stop_before_the_configured_response_budget(store: Arc<dyn ClaimStore>) {
    // `serve --max-response-bytes 65536`: 300 claims of about 570 bytes (255-byte values and
    // owners) are 170 KB, so neither list fits one page at its default limit.
    let budget = 64 * 1024;
    let config = ServerConfig {
        max_response_bytes: budget,
        ..ServerConfig::default()
    };
    let server = TestServer::start_with(store, config).await;
    let mut c = server.client().await;
    let long = |prefix: &str, i: usize| format!("{prefix}-{i}-{:x<255}", "")[..255].to_owned();
    let mut ids = BTreeSet::new();
    for lease in 0..3 {
        let records: Vec<pb::ClaimRecord> = (0..100)
            .map(|i| pb::ClaimRecord {
                owner_value: long("owner", i),
                ..claim(
                    ClaimType::Email,
                    &long("v", lease * 100 + i),
                    TableName::EMAILS,
                    3,
                )
            })
            .collect();
        ids.insert(
            begin(&mut c, request("cell-a", &records, &[]))
                .await
                .lease_id,
        );
    }

    let mut listed = BTreeSet::new();
    let mut cursor = String::new();
    let mut pages = 0;
    loop {
        let page = ok(
            c.list_outstanding_leases(leases_req("cell-a", &cursor, 0))
                .await,
            "leases page",
        );
        assert!(page.encoded_len() <= budget, "{} bytes", page.encoded_len());
        assert_eq!(page.leases.len(), 1, "a 57 KB lease is alone on its page");
        listed.extend(
            page.leases
                .iter()
                .map(|l| l.lease_payload.clone().unwrap().lease_id),
        );
        pages += 1;
        if page.next_cursor.is_empty() {
            break;
        }
        cursor = page.next_cursor;
    }
    assert_eq!((pages, listed), (3, ids));

    let (mut cursor, mut cursor_key) = (0, None);
    let mut values = Vec::new();
    let mut pages = Vec::new();
    loop {
        let request = pb::ListClaimsRequest {
            cursor_key: cursor_key.clone(),
            ..claims_req("cell-a", TableName::EMAILS, cursor, 0)
        };
        let page = ok(c.list_claims(request).await, "claims page");
        assert!(page.encoded_len() <= budget, "{} bytes", page.encoded_len());
        values.extend(page.claims.iter().map(|i| i.claim_value.clone()));
        pages.push(page.claims.len());
        match page.next_cursor {
            Some(next) => (cursor, cursor_key) = (next, page.next_cursor_key),
            None => break,
        }
    }
    assert!(
        pages.len() >= 3,
        "the budget, not the limit, ends the pages: {pages:?}"
    );
    let unique: BTreeSet<&String> = values.iter().collect();
    assert_eq!((values.len(), unique.len()), (300, 300), "every claim once");
    server.shutdown().await;
}

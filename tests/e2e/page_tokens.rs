//! One opaque page token (docs/decisions/079-one-page-token.md): a record of 8,000 claims of
//! about 250 bytes, with records before and after it, is listed exactly once and in order by a
//! client that sends back next_page_token alone, and ends in FAILED_PRECONDITION naming the
//! record, never a repeated claim, for a client that sends back next_cursor alone; StreamClaims
//! resumes from a range's token; a token altered, forged, or replayed for another table or cell
//! is INVALID_ARGUMENT naming page_token.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::StreamExt;
use tonic::Code;
use topology_claims::{ClaimStore, ClaimType, TableName};
use topology_claims_proto::pb;
use topology_claims_testkit::TestServer;

use crate::support::*;

against_every_store!(
    a_record_larger_than_a_page_is_listed_once_by_token_followers_and_refused_to_cursor_only_clients,
    altered_or_replayed_page_tokens_are_invalid_argument,
);

/// The record whose claims alone overflow a page, and how many claims it holds.
const BIG_RECORD: i64 = 10;
const BIG_CLAIMS: usize = 8_000;

/// A username of about 250 bytes (its owner value, `owner-of-` and the value, stays within 255).
fn long_value(record: i64, i: usize) -> String {
    let mut value = format!("user-{record:03}-{i:05}-");
    while value.len() < 240 {
        value.push('x');
    }
    value
}

/// Users of cell-a: records 1 to 3 (one claim each), record 10 (8,000 claims), records 20 and
/// 21 (two claims each), in page order. Also a claim of cell-a in Emails and one of cell-b in
/// Users, which no page of cell-a's Users listing may show.
async fn loaded(store: Arc<dyn ClaimStore>) -> (TestServer, Vec<String>) {
    let server = TestServer::start(store).await;
    let mut c = server.client().await;
    let mut records = Vec::new();
    for (record, claims) in [
        (1, 1),
        (2, 1),
        (3, 1),
        (BIG_RECORD, BIG_CLAIMS),
        (20, 2),
        (21, 2),
    ] {
        for i in 0..claims {
            let value = long_value(record, i);
            records.push(claim(ClaimType::Username, &value, TableName::USERS, record));
        }
    }
    for batch in records.chunks(1000) {
        claimed(&mut c, "cell-a", batch).await;
    }
    claimed(
        &mut c,
        "cell-a",
        [claim(
            ClaimType::Email,
            "a@example.com",
            TableName::EMAILS,
            10,
        )],
    )
    .await;
    claimed(
        &mut c,
        "cell-b",
        [claim(ClaimType::Username, "b-10", TableName::USERS, 10)],
    )
    .await;
    // Values are zero-padded, so their order is the page order within each record.
    let expected = records.into_iter().map(|r| r.claim_value).collect();
    (server, expected)
}

fn values(page: &pb::ListClaimsResponse) -> impl Iterator<Item = String> + '_ {
    page.claims.iter().map(|c| c.claim_value.clone())
}

async fn a_record_larger_than_a_page_is_listed_once_by_token_followers_and_refused_to_cursor_only_clients(
    store: Arc<dyn ClaimStore>,
) {
    let (server, expected) = loaded(store).await;
    let mut c = server.client().await;

    // A token follower: the first request names where to start, the others send the token
    // alone (no cursor, no cursor_key) until it is empty.
    let first = claims_req("cell-a", TableName::USERS, 0, 0);
    let mut request = first.clone();
    let mut listed = Vec::new();
    let mut pages = 0;
    loop {
        let page = ok(
            c.list_claims(request.clone()).await,
            "ListClaims with a token",
        );
        pages += 1;
        listed.extend(values(&page));
        assert_eq!(
            page.next_page_token.is_empty(),
            page.next_cursor.is_none(),
            "the legacy fields stay filled beside the token"
        );
        if page.next_page_token.is_empty() {
            break;
        }
        request = pb::ListClaimsRequest {
            page_token: page.next_page_token,
            ..claims_req("cell-a", TableName::USERS, 0, 0)
        };
        assert!(pages < 100, "paging advances");
    }
    assert_eq!(listed.len(), expected.len(), "every claim once");
    assert_eq!(listed, expected, "in page order");
    assert!(pages >= 8, "record 10 spans pages: {pages} pages");

    // A client that sends back next_cursor alone: every claim it gets is new, and within its
    // first pages it is told which record it cannot page through, and how to.
    let mut request = pb::ListClaimsRequest {
        page_tokens: false,
        ..first.clone()
    };
    let mut seen = BTreeSet::new();
    let mut refusal = None;
    for _ in 0..3 {
        match c.list_claims(request.clone()).await {
            Ok(page) => {
                let page = page.into_inner();
                for value in values(&page) {
                    assert!(seen.insert(value.clone()), "{value} listed twice");
                }
                request.cursor = page
                    .next_cursor
                    .expect("the listing goes on past record 10");
            }
            Err(status) => {
                refusal = Some(status);
                break;
            }
        }
    }
    let status = refusal.expect("refused within the first pages");
    let status = expect_status(
        Err::<tonic::Response<()>, _>(status),
        Code::FailedPrecondition,
        "RECORD_EXCEEDS_PAGE",
        &[("table_name", "users"), ("table_record_id", "10")],
    );
    assert!(
        status.message().contains("record 10 of table users")
            && status.message().contains("next_page_token"),
        "{status:?}"
    );
    assert_eq!(seen.len(), 3, "records 1 to 3, before record 10");

    // StreamClaims resumed from the token of a range that ended inside record 10: the rest of
    // the stream is exactly what the uninterrupted stream sent after that range.
    let ranges: Vec<pb::ClaimsRange> = ok(
        c.stream_claims(pb::StreamClaimsRequest::from(first.clone()))
            .await,
        "StreamClaims",
    )
    .map(|range| range.expect("a range"))
    .collect()
    .await;
    let streamed: Vec<String> = ranges
        .iter()
        .flat_map(|r| r.claims.iter().map(|c| c.claim_value.clone()))
        .collect();
    assert_eq!(streamed, expected);
    let split = ranges
        .iter()
        .position(|r| r.next_cursor_key.is_some() && r.next_cursor == Some(BIG_RECORD))
        .expect("a range that ends inside record 10");
    let resumed: Vec<pb::ClaimsRange> = ok(
        c.stream_claims(pb::StreamClaimsRequest {
            page_token: ranges[split].next_page_token.clone(),
            ..pb::StreamClaimsRequest::from(claims_req("cell-a", TableName::USERS, 0, 0))
        })
        .await,
        "StreamClaims from a token",
    )
    .map(|range| range.expect("a range"))
    .collect()
    .await;
    assert_eq!(resumed, ranges[split + 1..]);
    server.shutdown().await;
}

async fn altered_or_replayed_page_tokens_are_invalid_argument(store: Arc<dyn ClaimStore>) {
    let server = TestServer::start(store).await;
    let mut c = server.client().await;
    let records: Vec<pb::ClaimRecord> = (0..3)
        .map(|i| claim(ClaimType::Username, &format!("u-{i}"), TableName::USERS, 7))
        .collect();
    claimed(&mut c, "cell-a", &records).await;
    claimed(
        &mut c,
        "cell-b",
        [claim(ClaimType::Username, "b-7", TableName::USERS, 7)],
    )
    .await;
    // At limit 2, record 7 is split: the token carries record 7 and its second claim.
    let page = ok(
        c.list_claims(claims_req("cell-a", TableName::USERS, 0, 2))
            .await,
        "first page",
    );
    assert_eq!(page.next_cursor, Some(7));
    let token = page.next_page_token;
    let with = |cell: &str, table: TableName, token: &str| pb::ListClaimsRequest {
        page_token: token.to_owned(),
        ..claims_req(cell, table, 0, 2)
    };
    let rest = ok(
        c.list_claims(with("cell-a", TableName::USERS, &token))
            .await,
        "the token itself",
    );
    assert_eq!(values(&rest).collect::<Vec<_>>(), ["u-2"]);

    let mut altered = token.clone().into_bytes();
    let middle = altered.len() / 2;
    altered[middle] = if altered[middle] == b'A' { b'B' } else { b'A' };
    let altered = String::from_utf8(altered).unwrap();
    for (_what, request) in [
        ("altered", with("cell-a", TableName::USERS, &altered)),
        (
            "forged",
            with("cell-a", TableName::USERS, "c2VsZWN0ICogZnJvbSBjbGFpbXM"),
        ),
        ("another table's", with("cell-a", TableName::EMAILS, &token)),
        ("another cell's", with("cell-b", TableName::USERS, &token)),
    ] {
        let status = c.list_claims(request.clone()).await;
        expect_invalid(status, "page_token");
        let streamed = c
            .stream_claims(pb::StreamClaimsRequest::from(request))
            .await;
        expect_invalid(streamed, "page_token");
    }
    // A token is the whole position: a cursor naming another one beside it is refused.
    let conflicting = pb::ListClaimsRequest {
        cursor: 3,
        ..with("cell-a", TableName::USERS, &token)
    };
    expect_invalid(c.list_claims(conflicting).await, "page_token");
    server.shutdown().await;
}

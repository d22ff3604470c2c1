//! StreamClaims: the stream from a cursor is exactly the ListClaims tiling from that cursor,
//! range for range (claims, start and end, next cursor and key), whether the pages stop at their
//! limit or before the response budget, and a record whose claims alone fill a page is split
//! the same way; a bad request is refused before the stream starts.

use std::sync::Arc;

use futures::StreamExt;
use tonic::Code;
use topology_claims::{ClaimStore, ClaimType, TableName};
use topology_claims_proto::pb;
use topology_claims_server::grpc::server::ServerConfig;
use topology_claims_testkit::TestServer;

use crate::support::*;

against_every_store!(
    stream_claims_yields_exactly_the_list_claims_tiling,
    stream_claims_resumes_from_a_cursor_inside_the_tiling,
    stream_claims_refuses_a_bad_request_before_streaming,
);

/// Response budget of these servers: the 64 KiB minimum, so default-limit pages (1000 claims of
/// about 100 bytes) stop before it.
const BUDGET: usize = 64 * 1024;

/// 2,500 claims of cell-a in Users over 1,100 records (1 to 3 claims each, ids with gaps),
/// record 700 holding 300 of them (it must split at limit 97), a few left leased; claims of
/// another table and of another cell that no range may show.
async fn loaded(store: Arc<dyn ClaimStore>) -> TestServer {
    let server = TestServer::start_with(
        store,
        ServerConfig {
            max_response_bytes: BUDGET,
            ..ServerConfig::default()
        },
    )
    .await;
    let mut c = server.client().await;
    let mut records = Vec::new();
    for id in 0..1200i64 {
        let n = if id == 700 {
            300
        } else {
            1 + (id % 3) as usize
        };
        for i in 0..n {
            if records.len() < 2500 {
                let value = format!("user-{id}-{i}-padding-to-a-realistic-length");
                records.push(claim(ClaimType::Username, &value, TableName::USERS, id * 3));
            }
        }
    }
    assert_eq!(records.len(), 2500);
    let (leased, committed) = records.split_at(10);
    for batch in committed.chunks(1000) {
        claimed(&mut c, "cell-a", batch).await;
    }
    begin(&mut c, request("cell-a", leased, [])).await;
    claimed(
        &mut c,
        "cell-a",
        [claim(ClaimType::Routes, "r-1", TableName::ROUTES, 30)],
    )
    .await;
    claimed(
        &mut c,
        "cell-b",
        [claim(ClaimType::Username, "b-1", TableName::USERS, 30)],
    )
    .await;
    server
}

fn stream_req(list: &pb::ListClaimsRequest) -> pb::StreamClaimsRequest {
    list.clone().into()
}

/// Every ListClaims page from `first` on, following the cursors.
async fn list_pages(c: &mut Client, first: pb::ListClaimsRequest) -> Vec<pb::ListClaimsResponse> {
    let mut request = first;
    let mut pages = Vec::new();
    loop {
        let page = ok(c.list_claims(request.clone()).await, "ListClaims");
        let next = page.next_cursor;
        request.cursor_key = page.next_cursor_key.clone();
        pages.push(page);
        match next {
            Some(cursor) => request.cursor = cursor,
            None => return pages,
        }
        assert!(pages.len() < 10_000, "paging advances");
    }
}

/// Every range of the StreamClaims stream of `request`, as ListClaims pages.
async fn stream_ranges(
    c: &mut Client,
    request: pb::StreamClaimsRequest,
) -> Vec<pb::ListClaimsResponse> {
    let stream = ok(c.stream_claims(request).await, "StreamClaims");
    stream
        .map(|range| pb::ListClaimsResponse::from(range.expect("a range")))
        .collect()
        .await
}

async fn stream_claims_yields_exactly_the_list_claims_tiling(store: Arc<dyn ClaimStore>) {
    let server = loaded(store).await;
    let mut c = server.client().await;
    for limit in [97, 0] {
        let first = claims_req("cell-a", TableName::USERS, 0, limit);
        let pages = list_pages(&mut c, first.clone()).await;
        let ranges = stream_ranges(&mut c, stream_req(&first)).await;
        assert_eq!(ranges, pages, "limit {limit}");
        let claims: usize = ranges.iter().map(|r| r.claims.len()).sum();
        assert_eq!(
            claims, 2500,
            "limit {limit}: every claim of cell-a in Users once"
        );
        if limit == 97 {
            assert!(
                ranges.iter().any(|r| r.next_cursor_key.is_some()),
                "record 2100 (300 claims) is split"
            );
        } else {
            assert!(
                ranges.iter().all(|r| r.claims.len() < 1000),
                "the budget, not the default limit, cuts every page"
            );
        }
        assert!(
            ranges.iter().any(|r| r
                .claims
                .iter()
                .any(|c| c.state == pb::ClaimState::Creating as i32)),
            "leased claims are listed"
        );
    }
}

async fn stream_claims_resumes_from_a_cursor_inside_the_tiling(store: Arc<dyn ClaimStore>) {
    let server = loaded(store).await;
    let mut c = server.client().await;
    let first = claims_req("cell-a", TableName::USERS, 0, 97);
    let pages = list_pages(&mut c, first.clone()).await;
    let split = pages
        .iter()
        .position(|p| p.next_cursor_key.is_some())
        .expect("a split record");
    // Resume after a page in the middle, and after a page that ended inside a record.
    for after in [pages.len() / 2, split] {
        let page = &pages[after];
        let request = pb::ListClaimsRequest {
            cursor: page.next_cursor.expect("not the last page"),
            cursor_key: page.next_cursor_key.clone(),
            ..first.clone()
        };
        let ranges = stream_ranges(&mut c, stream_req(&request)).await;
        assert_eq!(ranges, pages[after + 1..], "resumed after page {after}");
    }
}

async fn stream_claims_refuses_a_bad_request_before_streaming(store: Arc<dyn ClaimStore>) {
    let server = TestServer::start(store).await;
    let mut c = server.client().await;
    for (request, field) in [
        (claims_req("cell-a", TableName::USERS, -1, 0), "cursor"),
        (claims_req("cell-a", TableName::USERS, 0, 10_001), "limit"),
        (claims_req("", TableName::USERS, 0, 0), "cell_id"),
    ] {
        let status = c
            .stream_claims(stream_req(&request))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        assert!(status.message().contains(field), "{field}: {status:?}");
    }
}

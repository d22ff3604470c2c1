//! List responses bounded by bytes, through the real binary: a cell with 8 outstanding leases of
//! 1,000 claims with 255-byte values (about 4.2 MB of leases, more than the 4 MiB a gRPC client
//! accepts by default) is listed by `topology-claims leases` and healed by `reconcile --once` at
//! its default page size; ListClaims of the 8,000 claims of one record id at limit 1 is small,
//! and paging with the cursors (which point inside the record), or with the one page token,
//! returns every claim once; a client following `next_cursor` alone gets FAILED_PRECONDITION
//! naming the record, and an altered token INVALID_ARGUMENT.
#![cfg(unix)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use prost::Message;
use tonic::transport::Channel;
use topology_claims::domain::MAX_VALUE_LEN;
use topology_claims::{ClaimType, OwnerType, TableName};
use topology_claims_client::decode::claims_client;
use topology_claims_proto::pb;
use topology_claims_proto::pb::claims_service_client::ClaimsServiceClient;

mod common;

use common::{run, text, Server};

const CELL: &str = "cell-big";
const LEASES: usize = 8;
const CLAIMS_PER_LEASE: usize = 1000;
const RECORD_ID: i64 = 77;
/// `serve --max-response-bytes` default.
const BUDGET: usize = 1024 * 1024;

/// A 255-byte value, unique per (lease, claim).
fn long_value(prefix: &str, lease: usize, n: usize) -> String {
    format!("{prefix}-{lease}-{n}-{:x<MAX_VALUE_LEN$}", "")[..MAX_VALUE_LEN].to_owned()
}

fn claim(lease: usize, n: usize) -> pb::ClaimRecord {
    pb::ClaimRecord {
        claim_type: ClaimType::Email.number(),
        claim_value: long_value("v", lease, n),
        owner: OwnerType::USER.number(),
        owner_value: long_value("owner", lease, n),
        table_name: TableName::USERS.number(),
        table_record_id: RECORD_ID,
        ..Default::default()
    }
}

async fn channel(server: &Server) -> Channel {
    tonic::transport::Endpoint::from_shared(server.endpoint())
        .expect("an endpoint")
        .connect()
        .await
        .expect("connect to serve")
}

fn claims_request(
    cursor: i64,
    cursor_key: Option<pb::ClaimKeyCursor>,
    limit: i32,
) -> pb::ListClaimsRequest {
    pb::ListClaimsRequest {
        cell_id: CELL.into(),
        table_name: TableName::USERS.number(),
        cursor,
        limit,
        cursor_key,
        // Follows next_cursor_key, so a page may end inside record 77.
        page_token: String::new(),
        page_tokens: true,
        source_table: String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_with_4_mb_of_outstanding_leases_is_listed_and_healed_and_its_record_paged() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let server = Server::start(
        dir.path(),
        &["--listen", "127.0.0.1:0", "--store", "memory:"],
    );
    let mut ours = claims_client(channel(&server).await);
    // A client at tonic's defaults (4 MiB responses), as any third-party client is.
    let mut default_client = ClaimsServiceClient::new(channel(&server).await);

    let mut lease_ids = BTreeSet::new();
    for lease in 0..LEASES {
        let request = pb::BeginUpdateRequest {
            local_transaction: String::new(),
            restore_correction: false,
            wait_for_leased: None,
            cell_id: CELL.into(),
            creates_claims: (0..CLAIMS_PER_LEASE).map(|n| claim(lease, n)).collect(),
            destroys_claims: Vec::new(),
            updates_claims: Vec::new(),
            lease_id: String::new(),
        };
        let response = ours.begin_update(request).await.expect("BeginUpdate");
        let payload = response.into_inner().lease_payload.expect("a lease");
        lease_ids.insert(payload.lease_id);
    }
    let begun = Instant::now();

    // ListOutstandingLeases: every page fits the budget, so even the default client reads them.
    let mut listed = Vec::new();
    let mut page_sizes = Vec::new();
    let mut cursor = String::new();
    loop {
        let request = pb::ListOutstandingLeasesRequest {
            cell_id: CELL.into(),
            cursor: cursor.clone(),
            limit: 0,
        };
        let page = default_client
            .list_outstanding_leases(request)
            .await
            .expect("a leases page within 4 MiB")
            .into_inner();
        page_sizes.push(page.encoded_len());
        assert!(
            page.encoded_len() <= BUDGET,
            "leases page of {} bytes",
            page.encoded_len()
        );
        listed.extend(page.leases);
        if page.next_cursor.is_empty() {
            break;
        }
        cursor = page.next_cursor;
    }
    let one_page = pb::ListOutstandingLeasesResponse {
        leases: listed.clone(),
        restore: None,
        next_cursor: String::new(),
        server_time: None,
    };
    eprintln!(
        "ListOutstandingLeases of {LEASES}x{CLAIMS_PER_LEASE} claims: one page of {} bytes before, \
         now {} pages of {page_sizes:?} bytes",
        one_page.encoded_len(),
        page_sizes.len()
    );
    assert!(
        one_page.encoded_len() > 4 * 1024 * 1024,
        "the set-up exceeds 4 MiB"
    );
    let ids: BTreeSet<String> = listed
        .iter()
        .map(|l| l.lease_payload.as_ref().unwrap().lease_id.clone())
        .collect();
    assert_eq!(ids, lease_ids);

    // `leases` lists all 8 and exits 0.
    let endpoint = server.endpoint();
    let output = run(
        dir.path(),
        &["leases", "--server", &endpoint, "--cell-id", CELL],
    );
    let stdout = text(&output.stdout);
    assert!(
        output.status.success(),
        "leases: {}\n{stdout}",
        text(&output.stderr)
    );
    assert!(
        stdout.contains("8 outstanding lease(s) of cell cell-big"),
        "{stdout}"
    );
    for id in &lease_ids {
        assert!(stdout.contains(id.as_str()), "{id} missing from\n{stdout}");
    }

    // ListClaims of the 8,000 claims of record 77 at limit 1: one claim, a small response.
    let first = default_client
        .list_claims(claims_request(0, None, 1))
        .await
        .expect("ListClaims limit 1")
        .into_inner();
    eprintln!(
        "ListClaims limit 1 on a record of 8000 claims: {} bytes",
        first.encoded_len()
    );
    assert_eq!(first.claims.len(), 1);
    assert!(first.encoded_len() < 2048, "{} bytes", first.encoded_len());
    assert_eq!(first.next_cursor, Some(RECORD_ID));
    assert!(
        first.next_cursor_key.is_some(),
        "the page ends inside record 77"
    );

    // Paging with the cursors at the largest limit: pages stop at the budget, every claim once.
    let mut all = Vec::new();
    let mut claim_pages = Vec::new();
    let (mut cursor, mut cursor_key) = (0, None);
    loop {
        let page = default_client
            .list_claims(claims_request(cursor, cursor_key, 10_000))
            .await
            .expect("a claims page within 4 MiB")
            .into_inner();
        assert!(
            page.encoded_len() <= BUDGET,
            "claims page of {} bytes",
            page.encoded_len()
        );
        claim_pages.push(page.encoded_len());
        all.extend(page.claims);
        match page.next_cursor {
            Some(next) => (cursor, cursor_key) = (next, page.next_cursor_key),
            None => break,
        }
        assert!(claim_pages.len() < 100, "paging terminates");
    }
    let values: Vec<String> = all.iter().map(|c| c.claim_value.clone()).collect();
    let one_page = pb::ListClaimsResponse {
        claims: all,
        ..Default::default()
    };
    eprintln!(
        "ListClaims of one record with {} claims: one page of {} bytes before (at any limit), \
         now {} pages of {claim_pages:?} bytes at limit 10000",
        values.len(),
        one_page.encoded_len(),
        claim_pages.len()
    );
    assert_eq!(
        values.len(),
        LEASES * CLAIMS_PER_LEASE,
        "every claim is listed"
    );
    let unique: BTreeSet<&String> = values.iter().collect();
    assert_eq!(unique.len(), values.len(), "no claim is listed twice");
    let mut sorted = values.clone();
    sorted.sort();
    assert_eq!(values, sorted, "in key order");

    // The same with the one opaque token: every claim once, in the same order.
    let mut by_token = Vec::new();
    let mut token = String::new();
    for pages in 1.. {
        let page = default_client
            .list_claims(pb::ListClaimsRequest {
                page_token: token.clone(),
                ..claims_request(0, None, 10_000)
            })
            .await
            .expect("a page by token")
            .into_inner();
        by_token.extend(page.claims.into_iter().map(|c| c.claim_value));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
        assert!(pages < 100, "paging by token terminates");
    }
    assert_eq!(
        by_token, values,
        "the token follower lists every claim once"
    );
    // A client that follows next_cursor alone (no token, no cursor_key, page_tokens unset) is
    // told what to do instead of getting record 77's first page again and again.
    let cursor_only = |cursor| pb::ListClaimsRequest {
        page_tokens: false,
        ..claims_request(cursor, None, 10_000)
    };
    let refusal = default_client
        .list_claims(cursor_only(0))
        .await
        .expect_err("record 77 alone fills more than a page");
    assert_eq!(
        refusal.code(),
        tonic::Code::FailedPrecondition,
        "{refusal:?}"
    );
    assert!(refusal.message().contains("77"), "{refusal:?}");
    // An altered token is refused.
    let mut altered = token.into_bytes();
    let last = altered.len() - 1;
    altered[last] = if altered[last] == b'A' { b'B' } else { b'A' };
    let refusal = default_client
        .list_claims(pb::ListClaimsRequest {
            page_token: String::from_utf8(altered).unwrap(),
            ..claims_request(0, None, 10_000)
        })
        .await
        .expect_err("an altered token");
    assert_eq!(refusal.code(), tonic::Code::InvalidArgument, "{refusal:?}");

    // `reconcile --once` at its default page size heals the 8 leases: the cell's database does
    // not know them, so they are rolled back once stale.
    let db = dir.path().join("cell.db");
    let conn = rusqlite::Connection::open(&db).expect("the cell's database");
    topology_claims_sqlite::ensure_local_schema(&conn).expect("leases_outstanding");
    drop(conn);
    if let Some(wait) = Duration::from_millis(1200).checked_sub(begun.elapsed()) {
        tokio::time::sleep(wait).await;
    }
    let local = format!("sqlite://{}", db.display());
    let output = run(
        dir.path(),
        &[
            "reconcile",
            "--once",
            "--server",
            &endpoint,
            "--cell-id",
            CELL,
            "--local-db",
            &local,
            "--staleness",
            "1s",
        ],
    );
    let stdout = text(&output.stdout);
    assert!(
        output.status.success(),
        "reconcile: {}\n{stdout}",
        text(&output.stderr)
    );
    assert!(stdout.contains("rolled_back=8"), "{stdout}");

    let output = run(
        dir.path(),
        &["leases", "--server", &endpoint, "--cell-id", CELL],
    );
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        stdout.contains("cell cell-big has no outstanding leases"),
        "{stdout}"
    );
    let page = ours
        .list_claims(claims_request(0, None, 0))
        .await
        .expect("ListClaims")
        .into_inner();
    assert!(page.claims.is_empty(), "the rolled-back creates are gone");

    assert!(server.stop_with("TERM").success());
}

/// The server's request limit (docs/api.md: request messages are limited to 4 MiB).
const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// Bytes a claim adds to a BeginUpdateRequest (its `creates_claims` element).
fn element_len(claim: &pb::ClaimRecord) -> usize {
    prost::encoding::message::encoded_len(2, claim)
}

/// A BeginUpdateRequest 30 to 70 bytes under the 4 MiB request limit: claims with 255-byte
/// values, the last ones with shorter owner values and values to fill the rest. Its lease, listed, adds
/// about a hundred bytes (lease id, cell id, timestamps): a page over 4 MiB.
fn largest_request(cell_id: &str, lease_id: &str) -> pb::BeginUpdateRequest {
    let target = MAX_REQUEST_BYTES - 30;
    let mut request = pb::BeginUpdateRequest {
        local_transaction: String::new(),
        restore_correction: false,
        wait_for_leased: None,
        cell_id: cell_id.into(),
        creates_claims: Vec::new(),
        destroys_claims: Vec::new(),
        updates_claims: Vec::new(),
        lease_id: lease_id.into(),
    };
    let mut len = request.encoded_len();
    let mut n = 0;
    while target - len > 40 {
        let mut next = claim(0, n);
        while element_len(&next) > target - len && next.owner_value.len() > 1 {
            next.owner_value.pop();
        }
        // Values stay unique: "v-0-N-" and a few more bytes.
        while element_len(&next) > target - len && next.claim_value.len() > 12 {
            next.claim_value.pop();
        }
        assert!(
            element_len(&next) <= target - len,
            "fill the request exactly"
        );
        len += element_len(&next);
        request.creates_claims.push(next);
        n += 1;
    }
    assert_eq!(request.encoded_len(), len);
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leases_page_over_4_mib_is_read_by_our_clients() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let server = Server::start(
        dir.path(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--store",
            "memory:",
            "--max-batch",
            "10000",
        ],
    );
    let mut ours = claims_client(channel(&server).await);
    let mut default_client = ClaimsServiceClient::new(channel(&server).await);
    // One lease as large as a request may be: a page holds at least one lease, so this page is
    // over 4 MiB whatever the budget.
    let lease_id = "0f0e0d0c-0b0a-4908-8706-050403020100";
    let request = largest_request("cell-huge", lease_id);
    ours.begin_update(request.clone())
        .await
        .expect("BeginUpdate of a 4 MiB request");
    let leases = pb::ListOutstandingLeasesRequest {
        cell_id: "cell-huge".into(),
        cursor: String::new(),
        limit: 0,
    };
    let page = ours
        .list_outstanding_leases(leases.clone())
        .await
        .expect("our client reads the page")
        .into_inner();
    eprintln!(
        "a {} byte BeginUpdate request: its leases page is {} bytes",
        request.encoded_len(),
        page.encoded_len()
    );
    assert!(page.encoded_len() > 4 * 1024 * 1024);
    assert_eq!(page.leases.len(), 1);
    let refused = default_client.list_outstanding_leases(leases).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|s| s.message().contains("too large")),
        "a client at tonic's default limit cannot read it: {refused:?}"
    );

    let endpoint = server.endpoint();
    let output = run(
        dir.path(),
        &["leases", "--server", &endpoint, "--cell-id", "cell-huge"],
    );
    let stdout = text(&output.stdout);
    assert!(
        output.status.success(),
        "leases: {}\n{stdout}",
        text(&output.stderr)
    );
    assert!(stdout.contains(lease_id), "{stdout}");
    assert!(
        stdout.contains(&format!("{} create(s)", request.creates_claims.len())),
        "{stdout}"
    );
    assert!(server.stop_with("TERM").success());
}

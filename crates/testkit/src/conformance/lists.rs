//! ListOutstandingLeases (a cell's open leases, paged by lease id, pages bounded by count and
//! bytes) and ListClaims (a cell's claims of one table, pages that tile the record id space and
//! split a record only when it alone fills a page, leased claims included with their state).
//!
//! The byte-budget cases use the default budget (`DEFAULT_MAX_RESPONSE_BYTES`, what the suite's
//! gRPC run serves with) and data large enough to exceed it.

use std::collections::BTreeSet;

use crate::fixtures::{cell, creates, destroys, lease_id, record_in, username};
use topology_claims::domain::{
    claim_encoded_len_bound, lease_encoded_len_bound, BeginUpdate, CellId, Claim, ClaimRecord,
    ClaimState, ClaimType, ClaimsCursor, ClaimsPage, ClaimsQuery, LeasesQuery, TableName,
    MAX_VALUE_LEN,
};
use topology_claims::ports::ClaimStore;

use super::committed;

/// A claim of record `record_id` with the longest value and owner value (255 bytes each).
fn large_record(table: TableName, record_id: i64, n: usize) -> ClaimRecord {
    let pad = |prefix: String| format!("{prefix:-<MAX_VALUE_LEN$}");
    let mut record = record_in(
        table,
        record_id,
        ClaimType::Email,
        &pad(format!("large-{n}-")),
    );
    record.owner_value = pad(format!("owner-{n}-"));
    record
}

/// Pages through `cell_id`'s claims of `table` from cursor 0 with `limit`, checking every page
/// against the paging rule (`domain::claims_page`); returns the claims in the order listed and
/// the number of pages.
async fn all_claim_pages(
    store: &impl ClaimStore,
    cell_id: &CellId,
    table: TableName,
    limit: usize,
) -> (Vec<Claim>, Vec<ClaimsPage>) {
    let mut cursor = ClaimsCursor::at(0);
    let mut listed = Vec::new();
    let mut pages = Vec::new();
    loop {
        let query = ClaimsQuery::new(cell_id.clone(), table.clone(), cursor.clone(), limit);
        let page = store.list_claims(&query).await.unwrap();
        assert_eq!(page.start_range, cursor.record_id, "pages are contiguous");
        assert!(
            page.claims.len() <= limit,
            "limit {limit}: a page holds at most limit claims"
        );
        let bound: usize = page.claims.iter().map(claim_encoded_len_bound).sum();
        assert!(
            page.claims.len() <= 1 || bound <= query.max_bytes,
            "a page of {} claims ({bound} bytes) exceeds the budget {}",
            page.claims.len(),
            query.max_bytes
        );
        let split = page.split_record();
        for claim in &page.claims {
            let id = claim.record.table_record_id;
            assert!(
                (page.start_range..page.end_range).contains(&id) || split == Some(id),
                "claim of record {id} on page [{}, {}) (split: {split:?})",
                page.start_range,
                page.end_range
            );
        }
        if split.is_some() {
            let last = page.claims.last().expect("a split page holds claims");
            assert_eq!(
                (
                    last.record.table_record_id,
                    page.next_cursor.as_ref().unwrap().after_key.as_ref()
                ),
                (page.end_range, Some(last.key())),
                "a page split inside a record continues after its last claim"
            );
            let records: BTreeSet<i64> = page
                .claims
                .iter()
                .map(|c| c.record.table_record_id)
                .collect();
            assert_eq!(
                records.len(),
                1,
                "only a record that alone fills a page is split"
            );
        }
        listed.extend(page.claims.iter().cloned());
        let next = page.next_cursor.clone();
        pages.push(page);
        match next {
            Some(next) => {
                assert_eq!(next.record_id, pages.last().unwrap().end_range);
                cursor = next;
            }
            None => {
                assert_eq!(
                    pages.last().unwrap().end_range,
                    i64::MAX,
                    "the last page reaches the end of the id space"
                );
                break;
            }
        }
        assert!(pages.len() <= 100, "pagination terminates");
    }
    (listed, pages)
}

fn in_page_order(records: &[ClaimRecord]) -> Vec<ClaimRecord> {
    let mut sorted = records.to_vec();
    sorted.sort_by(|x, y| (x.table_record_id, &x.key).cmp(&(y.table_record_id, &y.key)));
    sorted
}

pub async fn list_outstanding_leases_pages_by_lease_id(store: &impl ClaimStore) {
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    let mut expected = BTreeSet::new();
    for i in 0..7 {
        let request = BeginUpdate {
            lease_id: Some(lease_id(100 + (i * 37) % 7)),
            ..creates(&a, &[username(&format!("l{i}"))])
        };
        expected.insert(store.begin_update(request).await.unwrap().lease_id);
    }
    let ended = store
        .begin_update(creates(&a, &[username("ended")]))
        .await
        .unwrap();
    store.commit_update(&a, ended.lease_id).await.unwrap();
    store
        .begin_update(creates(&b, &[username("other-cell")]))
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut after = None;
    let mut pages = 0;
    loop {
        let page = store
            .list_outstanding_leases(&LeasesQuery::new(a.clone(), after, 3))
            .await
            .unwrap();
        pages += 1;
        assert!(page.leases.len() <= 3);
        assert!(page.leases.iter().all(|l| l.cell_id == a));
        assert!(page.leases.iter().all(|l| page.server_time >= l.created_at));
        seen.extend(page.leases.iter().map(|l| l.lease_id));
        match page.next_cursor {
            Some(cursor) => after = Some(cursor),
            None => break,
        }
        assert!(pages < 10, "pagination terminates");
    }
    assert_eq!(pages, 3);
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(seen, sorted, "ordered by lease id");
    assert_eq!(
        seen.into_iter().collect::<BTreeSet<_>>(),
        expected,
        "exactly the outstanding leases"
    );
}

pub async fn list_outstanding_leases_pages_stop_before_the_byte_budget(store: &impl ClaimStore) {
    let a = cell("cell-a");
    // Four leases of 700 claims with 255-byte values: about 390 KB each, so two fit the default
    // 1 MiB budget and a page of limit 100 stops after two.
    let mut expected = Vec::new();
    for n in 0..4 {
        let records: Vec<ClaimRecord> = (0..700)
            .map(|i| large_record(TableName::EMAILS, n, n as usize * 1000 + i))
            .collect();
        let lease = store.begin_update(creates(&a, &records)).await.unwrap();
        expected.push(lease.lease_id);
    }
    expected.sort();
    let mut listed = Vec::new();
    let mut sizes = Vec::new();
    let mut after = None;
    loop {
        let query = LeasesQuery::new(a.clone(), after, 100);
        let page = store.list_outstanding_leases(&query).await.unwrap();
        assert!(!page.leases.is_empty(), "a page holds at least one lease");
        let bound: usize = page.leases.iter().map(lease_encoded_len_bound).sum();
        assert!(bound <= query.max_bytes, "a page of {bound} bytes");
        sizes.push(page.leases.len());
        listed.extend(page.leases.iter().map(|l| l.lease_id));
        match page.next_cursor {
            Some(cursor) => {
                assert_eq!(Some(cursor), page.leases.last().map(|l| l.lease_id));
                after = Some(cursor);
            }
            None => break,
        }
        assert!(sizes.len() < 10, "pagination terminates");
    }
    assert_eq!(
        sizes,
        [2, 2],
        "pages stop before the budget, not at the limit"
    );
    assert_eq!(listed, expected, "every lease once, in lease-id order");
}

pub async fn list_claims_pages_tile_the_id_space(store: &impl ClaimStore) {
    let a = cell("cell-a");
    // Records 0..12 of `users` (ids 0, 10, …), each implying one to three claims, and record 65
    // with seven claims (split by the small limits); other tables and cells as noise.
    let mut all = Vec::new();
    for id in 0..12i64 {
        for n in 0..(1 + id % 3) {
            let claim_type = [ClaimType::Username, ClaimType::Email, ClaimType::Routes][n as usize];
            all.push(record_in(
                TableName::USERS,
                id * 10,
                claim_type,
                &format!("u{id}"),
            ));
        }
    }
    for n in 0..7 {
        let claim_type = [ClaimType::Username, ClaimType::Email][n % 2];
        all.push(record_in(
            TableName::USERS,
            65,
            claim_type,
            &format!("big-{n}"),
        ));
    }
    committed(store, creates(&a, &all)).await;
    committed(
        store,
        creates(
            &a,
            &[record_in(TableName::GROUPS, 5, ClaimType::Routes, "g")],
        ),
    )
    .await;
    committed(
        store,
        creates(
            &cell("cell-b"),
            &[record_in(TableName::USERS, 15, ClaimType::Username, "b")],
        ),
    )
    .await;
    let expected = in_page_order(&all);
    for limit in [1usize, 2, 3, 5, 1000] {
        let (listed, pages) = all_claim_pages(store, &a, TableName::USERS, limit).await;
        let listed: Vec<ClaimRecord> = listed.into_iter().map(|c| c.record).collect();
        assert_eq!(
            listed, expected,
            "limit {limit}: every claim once, in order"
        );
        let splits = pages
            .iter()
            .filter(|p| p.split_record() == Some(65))
            .count();
        match limit {
            1000 => assert_eq!(pages.len(), 1),
            // Record 65's seven claims fill whole pages at these limits.
            _ => assert_eq!(splits, 6 / limit, "limit {limit}: record 65 is split"),
        }
    }
    let page = store
        .list_claims(&ClaimsQuery::new(
            a.clone(),
            TableName::USERS,
            ClaimsCursor::at(115),
            10,
        ))
        .await
        .unwrap();
    assert!(page.claims.is_empty());
    assert_eq!(
        (page.start_range, page.end_range, page.next_cursor),
        (115, i64::MAX, None)
    );
}

pub async fn list_claims_split_a_record_larger_than_the_byte_budget(store: &impl ClaimStore) {
    let a = cell("cell-a");
    // Record 7 of `emails` has 2000 claims with 255-byte values and owners: about 1.1 MB, more
    // than the default 1 MiB budget, so even the largest limit splits it.
    let records: Vec<ClaimRecord> = (0..2000)
        .map(|n| large_record(TableName::EMAILS, 7, n))
        .collect();
    for chunk in records.chunks(1000) {
        committed(store, creates(&a, chunk)).await;
    }
    committed(
        store,
        creates(
            &a,
            &[record_in(
                TableName::EMAILS,
                9,
                ClaimType::Username,
                "after",
            )],
        ),
    )
    .await;
    let (listed, pages) = all_claim_pages(
        store,
        &a,
        TableName::EMAILS,
        topology_claims::domain::CLAIMS_MAX_LIMIT,
    )
    .await;
    let mut expected = records.clone();
    expected.push(record_in(
        TableName::EMAILS,
        9,
        ClaimType::Username,
        "after",
    ));
    let listed: Vec<ClaimRecord> = listed.into_iter().map(|c| c.record).collect();
    assert_eq!(
        listed,
        in_page_order(&expected),
        "every claim once, in order"
    );
    assert_eq!(
        pages.len(),
        2,
        "the budget, not the limit, ends the first page"
    );
    assert_eq!((pages[0].start_range, pages[0].end_range), (0, 7));
    assert_eq!(
        pages[0].split_record(),
        Some(7),
        "the first page ends inside record 7"
    );
    assert_eq!((pages[1].start_range, pages[1].end_range), (7, i64::MAX));
}

pub async fn list_claims_includes_leased_claims_with_state(store: &impl ClaimStore) {
    let a = cell("cell-a");
    committed(
        store,
        creates(
            &a,
            &[record_in(TableName::USERS, 1, ClaimType::Username, "kept")],
        ),
    )
    .await;
    committed(
        store,
        creates(
            &a,
            &[record_in(TableName::USERS, 2, ClaimType::Username, "going")],
        ),
    )
    .await;
    store
        .begin_update(creates(
            &a,
            &[record_in(
                TableName::USERS,
                3,
                ClaimType::Username,
                "coming",
            )],
        ))
        .await
        .unwrap();
    store
        .begin_update(destroys(
            &a,
            &[record_in(TableName::USERS, 2, ClaimType::Username, "going")],
        ))
        .await
        .unwrap();
    let page = store
        .list_claims(&ClaimsQuery::new(
            a,
            TableName::USERS,
            ClaimsCursor::at(0),
            100,
        ))
        .await
        .unwrap();
    let states: Vec<(i64, ClaimState)> = page
        .claims
        .iter()
        .map(|c| (c.record.table_record_id, c.state()))
        .collect();
    assert_eq!(
        states,
        vec![
            (1, ClaimState::Active),
            (2, ClaimState::Destroying),
            (3, ClaimState::Creating)
        ]
    );
}

//! ListOutstandingLeases (a cell's open leases, paged by lease id) and ListClaims (a cell's claims
//! of one table, pages that tile the record id space, leased claims included with their state).

use std::collections::BTreeSet;

use crate::domain::{BeginUpdate, ClaimState, ClaimType, ClaimsQuery, LeasesQuery, TableName};
use crate::ports::ClaimStore;
use crate::testing::fixtures::{cell, creates, destroys, lease_id, record_in, username};

use super::committed;

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
            .list_outstanding_leases(&LeasesQuery {
                cell_id: a.clone(),
                after,
                limit: 3,
            })
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

pub async fn list_claims_pages_tile_the_id_space(store: &impl ClaimStore) {
    let a = cell("cell-a");
    // Records 0..12 of `users`, each implying one to three claims; other tables and cells as noise.
    let mut all = Vec::new();
    for id in 0..12i64 {
        for n in 0..(1 + id % 3) {
            let claim_type = [ClaimType::Username, ClaimType::Email, ClaimType::Routes][n as usize];
            all.push(record_in(
                TableName::Users,
                id * 10,
                claim_type,
                &format!("u{id}"),
            ));
        }
    }
    committed(store, creates(&a, &all)).await;
    committed(
        store,
        creates(
            &a,
            &[record_in(TableName::Groups, 5, ClaimType::Routes, "g")],
        ),
    )
    .await;
    committed(
        store,
        creates(
            &cell("cell-b"),
            &[record_in(TableName::Users, 15, ClaimType::Username, "b")],
        ),
    )
    .await;
    for limit in [1usize, 2, 3, 5, 1000] {
        let mut cursor = 0;
        let mut listed = Vec::new();
        let mut pages = 0;
        loop {
            let query = ClaimsQuery {
                cell_id: a.clone(),
                table_name: TableName::Users,
                cursor,
                limit,
            };
            let page = store.list_claims(&query).await.unwrap();
            pages += 1;
            assert_eq!(page.start_range, cursor, "pages are contiguous");
            assert!(page
                .claims
                .iter()
                .all(|c| (page.start_range..page.end_range).contains(&c.record.table_record_id)));
            let last_id = page.claims.last().map(|c| c.record.table_record_id);
            let before_last = page
                .claims
                .iter()
                .filter(|c| Some(c.record.table_record_id) != last_id)
                .count();
            assert!(
                page.claims.len() <= limit || before_last < limit,
                "a page exceeds its limit only to keep its last record's claims together"
            );
            listed.extend(page.claims.iter().map(|c| c.record.clone()));
            match page.next_cursor {
                Some(next) => {
                    assert_eq!(next, page.end_range);
                    cursor = next;
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
            assert!(pages <= 40, "pagination terminates");
        }
        let mut expected = all.clone();
        expected.sort_by(|x, y| (x.table_record_id, &x.key).cmp(&(y.table_record_id, &y.key)));
        assert_eq!(
            listed, expected,
            "limit {limit}: every claim once, in order"
        );
    }
    let page = store
        .list_claims(&ClaimsQuery {
            cell_id: a.clone(),
            table_name: TableName::Users,
            cursor: 115,
            limit: 10,
        })
        .await
        .unwrap();
    assert!(page.claims.is_empty());
    assert_eq!(
        (page.start_range, page.end_range, page.next_cursor),
        (115, i64::MAX, None)
    );
}

pub async fn list_claims_includes_leased_claims_with_state(store: &impl ClaimStore) {
    let a = cell("cell-a");
    committed(
        store,
        creates(
            &a,
            &[record_in(TableName::Users, 1, ClaimType::Username, "kept")],
        ),
    )
    .await;
    committed(
        store,
        creates(
            &a,
            &[record_in(TableName::Users, 2, ClaimType::Username, "going")],
        ),
    )
    .await;
    store
        .begin_update(creates(
            &a,
            &[record_in(
                TableName::Users,
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
            &[record_in(TableName::Users, 2, ClaimType::Username, "going")],
        ))
        .await
        .unwrap();
    let page = store
        .list_claims(&ClaimsQuery {
            cell_id: a,
            table_name: TableName::Users,
            cursor: 0,
            limit: 100,
        })
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

//! The change feed against concurrent writers (decision 117): transaction ids are handed out in
//! start order and transactions commit in any order, so a reader that trusted id order alone
//! would skip the events of an earlier transaction that commits late. Here two sessions write
//! out of order, and the reader neither returns the later revision before the earlier one has
//! ended nor skips the earlier one afterwards.

mod common;

use std::time::{Duration, Instant};

use topology_claims::domain::{EventPosition, EventsQuery};
use topology_claims::ClaimStore;
use topology_claims_postgres::tokio_postgres::Client;

async fn begin_insert(client: &Client, schema: &str, value: &str) -> u64 {
    client.batch_execute("BEGIN").await.unwrap();
    client
        .execute(
            &format!(
                "INSERT INTO \"{schema}\".claims (claim_type, claim_value, owner_type, \
                 owner_value, table_name, table_record_id, cell_id, created_at, updated_at) \
                 VALUES (1, $1, 1, 'o', 3, 1, 'cell-a', now(), now())"
            ),
            &[&value],
        )
        .await
        .unwrap();
    let id: i64 = client
        .query_one("SELECT pg_current_xact_id()::text::bigint", &[])
        .await
        .unwrap()
        .get(0);
    u64::try_from(id).unwrap()
}

#[tokio::test]
async fn a_late_commit_of_an_earlier_transaction_is_never_skipped() {
    let Some((store, schema)) = common::fresh_store().await else {
        common::skip_process()
    };
    let (early, late) = (
        common::admin().await.unwrap(),
        common::admin().await.unwrap(),
    );
    let first = begin_insert(&early, &schema, "early").await;
    let second = begin_insert(&late, &schema, "late").await;
    assert!(first < second);
    late.batch_execute("COMMIT").await.unwrap();
    // The later transaction has committed, the earlier one is still open: the reader returns
    // neither, and its `through` stays below the earlier id.
    let query = |from| EventsQuery {
        from: EventPosition::start_of(from),
        limit: 100,
    };
    let page = store.read_events(&query(1)).await.unwrap();
    assert!(page.events.is_empty(), "{:#?}", page.events);
    assert!(
        page.through < first,
        "through {} with {first} open",
        page.through
    );
    let resume = page.through + 1;
    early.batch_execute("COMMIT").await.unwrap();
    // Both, from where the reader stopped, in id order.
    let started = Instant::now();
    let events = loop {
        let page = store.read_events(&query(resume)).await.unwrap();
        if page.through >= second {
            break page.events;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "stuck at {}",
            page.through
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let seen: Vec<(u64, &str)> = events
        .iter()
        .map(|e| (e.position.revision, e.claim.record.key.value.as_str()))
        .collect();
    assert_eq!(seen, vec![(first, "early"), (second, "late")]);
    let admin = common::admin().await.unwrap();
    common::drop_schema(&admin, &schema).await;
}

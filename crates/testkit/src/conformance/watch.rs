//! The change feed (`ClaimStore::read_events`, WatchClaims): every change of a claim is an
//! event with the claim's whole state after it, in revision order; a transaction's events share
//! one revision; a read resumes exactly where another stopped; `through` never lies; compaction
//! refuses a watch below it. Run by [`claim_store_watch_conformance!`](crate::claim_store_watch_conformance)
//! on the stores that keep a change feed.
//!
//! A store's reader may see a revision only once every transaction before it has ended
//! (PostgreSQL: its snapshot's xmin), and other tests share the database: every case waits for
//! its own last write to be readable ([`settled`]) before it asserts.

use std::time::{Duration, Instant};

use crate::fixtures::{cell, creates, destroys, email, route, username};
use topology_claims::domain::{
    ClaimEvent, ClaimKey, ClaimRecord, ClaimState, EventPosition, EventsQuery,
};
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;

/// How long a case waits for its writes to become readable (another test's open transaction
/// holds a PostgreSQL reader back until it ends).
const SETTLE: Duration = Duration::from_secs(30);

/// Every event from `from` on, page by page (`limit` per read), until the log is complete
/// through the last one read.
async fn events_from(store: &impl ClaimStore, from: u64, limit: usize) -> Vec<ClaimEvent> {
    let mut position = EventPosition::start_of(from);
    let mut all = Vec::new();
    loop {
        let query = EventsQuery {
            from: position,
            limit,
        };
        let page = store.read_events(&query).await.expect("read_events");
        assert!(page.events.len() <= limit, "a page beyond its limit");
        for event in &page.events {
            assert!(
                event.position >= position,
                "an event before the read's start"
            );
            assert!(
                event.position.revision <= page.through || page.more,
                "{:?} above the page's through {}",
                event.position,
                page.through
            );
        }
        if let Some(last) = page.events.last() {
            position = last.position.next();
        }
        all.extend(page.events);
        if !page.more {
            return all;
        }
    }
}

/// The revision of `key`'s last change, once the log is readable through it.
async fn settled(store: &impl ClaimStore, key: &ClaimKey) -> u64 {
    let revision = store.lookup_claim(key).await.expect("lookup").revision;
    assert!(revision > 0, "{key} has no revision");
    let started = Instant::now();
    loop {
        let probe = EventsQuery {
            from: EventPosition::start_of(u64::MAX),
            limit: 1,
        };
        let through = store
            .read_events(&probe)
            .await
            .expect("read_events")
            .through;
        if through >= revision {
            return revision;
        }
        assert!(
            started.elapsed() < SETTLE,
            "the log is not readable through {revision} after {SETTLE:?} (at {through})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes a claim no case looks at, and waits until the log is readable through it: every
/// earlier write of the case is then readable too.
async fn settle(store: &impl ClaimStore) -> u64 {
    let marker = email("marker@example.com");
    let lease = store
        .begin_update(creates(&cell("cell-marker"), std::slice::from_ref(&marker)))
        .await
        .expect("marker begin");
    store
        .rollback_update(&cell("cell-marker"), lease.lease_id, None)
        .await
        .expect("marker rollback");
    let sentinel = email(&format!("sentinel-{}@example.com", lease.lease_id));
    let lease = store
        .begin_update(creates(
            &cell("cell-marker"),
            std::slice::from_ref(&sentinel),
        ))
        .await
        .expect("sentinel begin");
    store
        .commit_update(&cell("cell-marker"), lease.lease_id)
        .await
        .expect("sentinel commit");
    settled(store, &sentinel.key).await
}

/// The events of the case's own claims (not the markers').
fn own(events: Vec<ClaimEvent>) -> Vec<ClaimEvent> {
    events
        .into_iter()
        .filter(|e| e.claim.cell_id.as_str() != "cell-marker")
        .collect()
}

/// (value, state, deleted) of each event.
fn shapes(events: &[ClaimEvent]) -> Vec<(String, ClaimState, bool)> {
    events
        .iter()
        .map(|e| (e.claim.record.key.value.clone(), e.claim.state(), e.deleted))
        .collect()
}

async fn commit(store: &impl ClaimStore, request: topology_claims::domain::BeginUpdate) -> u128 {
    let cell_id = request.cell_id.clone();
    let lease = store.begin_update(request).await.expect("begin");
    store
        .commit_update(&cell_id, lease.lease_id)
        .await
        .expect("commit");
    lease.lease_id.as_uuid().as_u128()
}

pub async fn every_change_of_a_claim_is_an_event_in_order_with_its_whole_state(
    store: &impl ClaimStore,
) {
    let start = settle(store).await + 1;
    let a = cell("cell-a");
    let john = username("john");
    // Create: leased, then committed.
    let created = store
        .begin_update(creates(&a, std::slice::from_ref(&john)))
        .await
        .unwrap();
    store.commit_update(&a, created.lease_id).await.unwrap();
    // A destroy rolled back: destroying, then active again.
    let destroy = store
        .begin_update(destroys(&a, std::slice::from_ref(&john)))
        .await
        .unwrap();
    store
        .rollback_update(&a, destroy.lease_id, None)
        .await
        .unwrap();
    // A create rolled back: creating, then gone.
    let gone = route("gone");
    let undone = store
        .begin_update(creates(&a, std::slice::from_ref(&gone)))
        .await
        .unwrap();
    store
        .rollback_update(&a, undone.lease_id, None)
        .await
        .unwrap();
    // A destroy committed: destroying, then gone.
    commit(store, destroys(&a, std::slice::from_ref(&john))).await;
    settle(store).await;
    let events = own(events_from(store, start, 1000).await);
    assert_eq!(
        shapes(&events),
        vec![
            ("john".to_owned(), ClaimState::Creating, false),
            ("john".to_owned(), ClaimState::Active, false),
            ("john".to_owned(), ClaimState::Destroying, false),
            ("john".to_owned(), ClaimState::Active, false),
            ("gone".to_owned(), ClaimState::Creating, false),
            ("gone".to_owned(), ClaimState::Creating, true),
            ("john".to_owned(), ClaimState::Destroying, false),
            ("john".to_owned(), ClaimState::Destroying, true),
        ],
        "{events:#?}"
    );
    // Each call was its own transaction: revisions strictly increase.
    for pair in events.windows(2) {
        assert!(
            pair[0].position.revision < pair[1].position.revision,
            "{pair:#?}"
        );
    }
    // The whole state: the cell, the record, the lease that holds it.
    let first = &events[0];
    assert_eq!(first.claim.cell_id, a);
    assert_eq!(first.claim.record.owner_value, john.owner_value);
    assert_eq!(first.claim.record.table_record_id, john.table_record_id);
    assert_eq!(
        first.claim.lease.map(|l| l.lease_id),
        Some(created.lease_id)
    );
    assert_eq!(first.claim.revision, first.position.revision);
}

pub async fn the_events_of_one_transaction_share_one_revision(store: &impl ClaimStore) {
    let start = settle(store).await + 1;
    let a = cell("cell-a");
    let batch: Vec<ClaimRecord> = (0..3).map(|i| route(&format!("r{i}"))).collect();
    commit(store, creates(&a, &batch)).await;
    settle(store).await;
    let events = own(events_from(store, start, 1000).await);
    assert_eq!(events.len(), 6, "{events:#?}");
    let (begun, committed) = events.split_at(3);
    for part in [begun, committed] {
        let revision = part[0].position.revision;
        assert!(
            part.iter().all(|e| e.position.revision == revision),
            "{part:#?}"
        );
        let mut seqs: Vec<u64> = part.iter().map(|e| e.position.seq).collect();
        seqs.dedup();
        assert_eq!(seqs.len(), 3, "distinct places in the revision: {part:#?}");
    }
    assert!(begun[0].position.revision < committed[0].position.revision);
}

pub async fn a_read_resumes_exactly_where_another_stopped(store: &impl ClaimStore) {
    let start = settle(store).await + 1;
    let a = cell("cell-a");
    for i in 0..4 {
        commit(
            store,
            creates(&a, &[route(&format!("p{i}")), route(&format!("q{i}"))]),
        )
        .await;
    }
    settle(store).await;
    let whole = own(events_from(store, start, 1000).await);
    assert_eq!(whole.len(), 16);
    // Small pages, cut inside revisions: the same events, once each, in the same order.
    for limit in [1, 3, 5] {
        let paged = own(events_from(store, start, limit).await);
        assert_eq!(shapes(&paged), shapes(&whole), "limit {limit}");
        let positions: Vec<EventPosition> = paged.iter().map(|e| e.position).collect();
        let expected: Vec<EventPosition> = whole.iter().map(|e| e.position).collect();
        assert_eq!(positions, expected, "limit {limit}");
    }
    // From a revision: exactly its events and the later ones.
    let third = whole[8].position.revision;
    let resumed = own(events_from(store, third, 1000).await);
    let expected: Vec<_> = whole
        .iter()
        .filter(|e| e.position.revision >= third)
        .cloned()
        .collect();
    assert_eq!(shapes(&resumed), shapes(&expected));
}

pub async fn through_covers_what_was_read_and_a_later_write_lands_above_it(
    store: &impl ClaimStore,
) {
    let through = settle(store).await;
    let probe = EventsQuery {
        from: EventPosition::start_of(u64::MAX),
        limit: 1,
    };
    let before = store.read_events(&probe).await.unwrap().through;
    assert!(before >= through);
    // Nothing at or below `before` is missing: a read from just after it finds only later
    // changes.
    let a = cell("cell-a");
    commit(store, creates(&a, &[route("later")])).await;
    let later = settled(store, &route("later").key).await;
    assert!(
        later > before,
        "a later write at {later}, not above {before}"
    );
    let after = own(events_from(store, before + 1, 1000).await);
    assert!(after.iter().all(|e| e.position.revision > before));
    assert_eq!(
        after
            .iter()
            .filter(|e| e.claim.record.key.value == "later")
            .count(),
        2
    );
}

pub async fn lookup_carries_the_revision_of_the_claims_last_change(store: &impl ClaimStore) {
    let start = settle(store).await + 1;
    let a = cell("cell-a");
    commit(store, creates(&a, &[route("kept")])).await;
    let revision = settled(store, &route("kept").key).await;
    let events = own(events_from(store, start, 1000).await);
    let last = events
        .iter()
        .rev()
        .find(|e| e.claim.record.key.value == "kept")
        .unwrap();
    assert_eq!(last.position.revision, revision);
    assert_eq!(last.claim.state(), ClaimState::Active);
}

pub async fn compaction_refuses_a_watch_below_it_and_names_the_oldest_kept_revision(
    store: &impl ClaimStore,
) {
    let a = cell("cell-a");
    for i in 0..3 {
        commit(store, creates(&a, &[route(&format!("c{i}"))])).await;
    }
    let newest = settle(store).await;
    // Keep only the newest revision's events (the count cap, whole revisions).
    let removed = store
        .compact_events(Duration::from_secs(3600), 1)
        .await
        .unwrap();
    assert!(removed > 0);
    let refused = store
        .read_events(&EventsQuery {
            from: EventPosition::start_of(1),
            limit: 10,
        })
        .await
        .unwrap_err();
    let ClaimsError::WatchCompacted {
        requested,
        compact_revision,
    } = refused
    else {
        panic!("{refused:?}");
    };
    assert_eq!(requested, 1);
    assert!(compact_revision <= newest, "{compact_revision} > {newest}");
    let kept = events_from(store, compact_revision, 1000).await;
    assert!(kept.iter().all(|e| e.position.revision >= compact_revision));
    assert!(kept.iter().any(|e| e.position.revision == newest));
    // Retention: everything older than zero is old.
    store
        .compact_events(Duration::ZERO, u64::MAX)
        .await
        .unwrap();
    let after = store
        .read_events(&EventsQuery {
            from: EventPosition::start_of(newest),
            limit: 10,
        })
        .await
        .unwrap_err();
    assert!(
        matches!(after, ClaimsError::WatchCompacted { .. }),
        "{after:?}"
    );
}

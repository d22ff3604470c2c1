//! The change feed on PostgreSQL (decision 117): reading and compacting `claim_events`, which
//! the triggers of migration 0007 fill in the transaction of each change.
//!
//! A revision is the writing transaction's id. A read first takes its snapshot's xmin: every
//! transaction with a smaller id has ended (committed or rolled back), every one still running
//! has an id at or above it. The read returns only events below it, so a revision it returned
//! is final, and the next read starts where it stopped: no event can appear behind a reader,
//! although transactions commit out of id order. The cost: a transaction that stays open holds
//! every watcher back until it ends (docs/operations.md, "Watch lag").

use std::time::Duration;

use topology_claims::domain::{
    check_watch_start, events, ClaimEvent, EventPosition, EventsPage, EventsQuery, LogBounds,
};

use crate::error::Failure;
use crate::rows;
use crate::session::Shared;
use crate::sql;
use crate::store::internal;

fn unsigned(value: i64) -> u64 {
    u64::try_from(value).unwrap_or_default()
}

fn signed(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// `ClaimStore::read_events`: the bounds, then the events below the bounds' xmin.
pub(crate) async fn read_attempt(
    shared: &Shared,
    query: &EventsQuery,
) -> Result<EventsPage, Failure> {
    let session = shared.session().await?;
    let [bounds, select] = session
        .prepare([sql::WATCH_BOUNDS, sql::SELECT_EVENTS])
        .await?;
    let client = session.client()?;
    let row = client.query_one(&bounds, &[]).await?;
    session.round_trip();
    let xmin: i64 = row.try_get(0).map_err(internal)?;
    let bounds = LogBounds {
        current: unsigned(xmin.saturating_sub(1)),
        compacted_through: unsigned(row.try_get(1).map_err(internal)?),
    };
    check_watch_start(query.from.revision, bounds)?;
    if query.from.revision >= unsigned(xmin) {
        // Only events below xmin are read: none can be at or after `from` (the head probe
        // after each write, a watcher that caught up). One round trip instead of two.
        return Ok(EventsPage::cut(Vec::new(), query, bounds.current));
    }
    let fetch = signed(query.limit as u64 + 1);
    let (revision, seq) = (signed(query.from.revision), signed(query.from.seq));
    let event_rows = client
        .query(&select, &[&revision, &seq, &xmin, &fetch])
        .await?;
    session.round_trip();
    let events = event_rows
        .iter()
        .map(|row| {
            let claim = rows::claim(row)?;
            let seq: i64 = row.try_get(16).map_err(|e| internal_claims(&e))?;
            let deleted: bool = row.try_get(17).map_err(|e| internal_claims(&e))?;
            Ok(ClaimEvent {
                position: EventPosition {
                    revision: claim.revision,
                    seq: unsigned(seq),
                },
                claim,
                deleted,
            })
        })
        .collect::<Result<Vec<_>, topology_claims::ClaimsError>>()?;
    Ok(EventsPage::cut(events, query, bounds.current))
}

fn internal_claims(error: &tokio_postgres::Error) -> topology_claims::ClaimsError {
    topology_claims::ClaimsError::internal(format!("unexpected PostgreSQL answer: {error}"))
}

/// Most events one compaction pass removes; a larger backlog goes in passes the server runs
/// back to back (`WatchHub`), with requests between them.
pub const COMPACT_BATCH: u64 = 20_000;

/// The first page of the log's start a pass reads, and the largest.
const FIRST_PAGE: u64 = 64;
const LARGEST_PAGE: u64 = 4_096;

/// `ClaimStore::compact_events`: whole revisions, oldest first, at most about
/// [`COMPACT_BATCH`] events a pass (decision 124). Every read is proportional to what the pass
/// removes, never to the log's length: the length is estimated from the event sequence
/// ([`sql::ESTIMATE_EVENTS`]), and the pass walks the log from its oldest event, in pages of
/// index order ([`sql::OLDEST_EVENTS`]), only as far as the events it removes (and the first
/// one it keeps). The retention counts the old events before the first recent one, so an event
/// younger than the retention never goes for its age, even behind older ones.
pub(crate) async fn compact_attempt(
    shared: &Shared,
    retention: Duration,
    max_events: u64,
) -> Result<u64, Failure> {
    let session = shared.session().await?;
    let [estimate, oldest, compact] = session
        .prepare([
            sql::ESTIMATE_EVENTS,
            sql::OLDEST_EVENTS,
            sql::COMPACT_EVENTS,
        ])
        .await?;
    let client = session.client()?;
    let micros = i64::try_from(retention.as_micros()).unwrap_or(i64::MAX);
    let kept = unsigned(
        client
            .query_one(&estimate, &[])
            .await?
            .try_get(0)
            .map_err(internal)?,
    );
    session.round_trip();
    let mut walk = events::CompactionWalk::new(kept, max_events, COMPACT_BATCH);
    let (mut after, mut page) = ((i64::MIN, i64::MIN), FIRST_PAGE);
    'pages: loop {
        let rows = client
            .query(&oldest, &[&micros, &after.0, &after.1, &signed(page)])
            .await?;
        session.round_trip();
        let last_page = (rows.len() as u64) < page;
        for row in &rows {
            after = (
                row.try_get(0).map_err(internal)?,
                row.try_get(1).map_err(internal)?,
            );
            if walk.see(unsigned(after.0), row.try_get(2).map_err(internal)?) {
                break 'pages;
            }
        }
        if last_page {
            break;
        }
        page = (page * 4).min(LARGEST_PAGE);
    }
    let Some(through) = walk.through() else {
        return Ok(0);
    };
    let through = signed(through);
    let removed = client.query_one(&compact, &[&through]).await?;
    session.round_trip();
    Ok(unsigned(removed.try_get(0).map_err(internal)?))
}

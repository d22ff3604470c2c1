//! The change feed on SQLite (decision 117): the write transaction that closes each revision,
//! and reading and compacting `claim_events`. The events themselves are written by the triggers
//! of migration 0008, in the transaction of the change.
//!
//! One write transaction at a time (the store's single connection, `BEGIN IMMEDIATE`), so one
//! counter orders them: a transaction's events take `watch_head.revision + 1`, and
//! [`finish_revision`] makes that the head before COMMIT when there were any. A reader's
//! snapshot holds whole transactions, so every revision up to the head it reads is complete.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};
use topology_claims::domain::{check_watch_start, events, EventsPage, EventsQuery, LogBounds};
use topology_claims::{ClaimsError, Clock, Timestamp};

use crate::error::{retry_counted, StoreError};

/// `BEGIN IMMEDIATE; op; COMMIT`, re-run while it fails for a retryable reason. IMMEDIATE takes
/// the write lock before the first read, so the rows the decision is based on cannot change
/// before its writes land (a DEFERRED transaction could read, then fail to upgrade with BUSY).
pub(crate) fn write_transaction<T>(
    conn: &mut Connection,
    clock: &dyn Clock,
    retries: &AtomicU64,
    mut op: impl FnMut(&Connection, Timestamp) -> Result<T, StoreError>,
) -> Result<T, ClaimsError> {
    retry_counted(retries, || {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        // Read under the write lock, so timestamps follow the order transactions commit in.
        let now = clock.now();
        let value = op(&tx, now)?;
        finish_revision(&tx, now)?;
        tx.commit()?;
        Ok(value)
    })
}

/// `BEGIN; op; COMMIT` for reads: one WAL snapshot across the statements of a page.
pub(crate) fn read_transaction<T>(
    conn: &mut Connection,
    clock: &dyn Clock,
    retries: &AtomicU64,
    mut op: impl FnMut(&Connection, Timestamp) -> Result<T, StoreError>,
) -> Result<T, ClaimsError> {
    retry_counted(retries, || {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
        let value = op(&tx, clock.now())?;
        tx.commit()?;
        Ok(value)
    })
}

/// Before COMMIT of every write transaction: when it wrote events, their revision becomes the
/// head, recorded with the transaction's time (two primary-key statements).
fn finish_revision(tx: &Connection, now: Timestamp) -> Result<(), StoreError> {
    let recorded = tx
        .prepare_cached(
            "INSERT INTO watch_revisions (revision, recorded_at) \
             SELECT revision + 1, ?1 FROM watch_head \
              WHERE EXISTS (SELECT 1 FROM claim_events WHERE revision = watch_head.revision + 1)",
        )?
        .execute([now.as_unix_micros()])?;
    if recorded > 0 {
        tx.prepare_cached(
            "UPDATE watch_head SET revision = revision + 1, events = events + \
             (SELECT COUNT(*) FROM claim_events WHERE revision = watch_head.revision + 1)",
        )?
        .execute([])?;
    }
    Ok(())
}

fn bounds(tx: &Connection) -> Result<LogBounds, StoreError> {
    let (current, compacted): (i64, i64) = tx
        .prepare_cached("SELECT revision, compacted_through FROM watch_head")?
        .query_row([], |row| Ok((row.get(0)?, row.get(1)?)))?;
    Ok(LogBounds {
        compacted_through: u64::try_from(compacted).unwrap_or_default(),
        current: u64::try_from(current).unwrap_or_default(),
    })
}

/// `ClaimStore::read_events`, in one read transaction.
pub(crate) fn read(tx: &Connection, query: &EventsQuery) -> Result<EventsPage, StoreError> {
    let bounds = bounds(tx)?;
    check_watch_start(query.from.revision, bounds)?;
    let events = crate::rows::select_events(tx, query.from, query.limit.saturating_add(1))?;
    Ok(EventsPage::cut(events, query, bounds.current))
}

/// Most events one compaction pass removes: a pass holds the one writer, so a large backlog
/// goes in passes the server runs back to back (`WatchHub`), with requests between them.
pub(crate) const COMPACT_BATCH: u64 = 5_000;

/// `ClaimStore::compact_events`: whole revisions, oldest first, at most about [`COMPACT_BATCH`]
/// events a pass. Every read is proportional to what the pass removes, never to the log's size:
/// the log's length is `watch_head.events`, and the revisions past the retention are found by
/// walking `watch_revisions` from the oldest.
pub(crate) fn compact(
    tx: &Connection,
    now: Timestamp,
    retention: Duration,
    max_events: u64,
) -> Result<u64, StoreError> {
    let cutoff = now.saturating_sub(retention).as_unix_micros();
    let unsigned = |n: i64| u64::try_from(n).unwrap_or_default();
    let kept: i64 = tx
        .prepare_cached("SELECT events FROM watch_head")?
        .query_row([], |row| row.get(0))?;
    // The newest revision recorded before the cutoff: the one before the first recorded at or
    // after it (or the last, when every one is older).
    let old_through: i64 = tx
        .prepare_cached(
            "SELECT COALESCE((SELECT revision - 1 FROM watch_revisions \
                              WHERE recorded_at >= ?1 ORDER BY revision LIMIT 1), \
                             (SELECT MAX(revision) FROM watch_revisions), 0)",
        )?
        .query_row([cutoff], |row| row.get(0))?;
    let older: i64 = tx
        .prepare_cached(&format!(
            "SELECT COUNT(*) FROM (SELECT 1 FROM claim_events WHERE revision <= ?1 LIMIT {})",
            COMPACT_BATCH + 1
        ))?
        .query_row([old_through], |row| row.get(0))?;
    let remove =
        events::events_to_compact(unsigned(older), unsigned(kept), max_events).min(COMPACT_BATCH);
    if remove == 0 {
        return Ok(0);
    }
    // The revision of the remove-th oldest event: everything through it goes.
    let through: i64 = tx
        .prepare_cached(
            "SELECT revision FROM claim_events ORDER BY revision, seq LIMIT 1 OFFSET ?1",
        )?
        .query_row([i64::try_from(remove - 1).unwrap_or(i64::MAX)], |row| {
            row.get(0)
        })?;
    let removed = tx
        .prepare_cached("DELETE FROM claim_events WHERE revision <= ?1")?
        .execute([through])?;
    tx.prepare_cached("DELETE FROM watch_revisions WHERE revision <= ?1")?
        .execute([through])?;
    tx.prepare_cached(
        "UPDATE watch_head SET compacted_through = MAX(compacted_through, ?1), \
         events = MAX(events - ?2, 0)",
    )?
    .execute((through, i64::try_from(removed).unwrap_or(i64::MAX)))?;
    Ok(removed as u64)
}

/// The change feed's head of the store at `path`, 0 when there is none (no file, a schema
/// before the change feed).
pub(crate) fn head_of(path: &std::path::Path) -> u64 {
    let read = || -> rusqlite::Result<i64> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(30))?;
        conn.query_row("SELECT revision FROM watch_head", [], |row| row.get(0))
    };
    if !path.exists() {
        return 0;
    }
    read().map_or(0, |head| u64::try_from(head).unwrap_or_default())
}

/// A restore makes every watch of the store before it refused (`WATCH_COMPACTED`): the restored
/// claims are not the history the watchers followed. The restored file (brought to this
/// binary's schema) gets a head above both its own and the replaced store's (`old_head`),
/// compacted through it, with no events.
pub(crate) fn fence_watchers(restored: &std::path::Path, old_head: u64) -> Result<(), String> {
    let mut conn = Connection::open(restored).map_err(|e| e.to_string())?;
    crate::migrations::run_logged(
        &mut conn,
        topology_claims::MigrationPolicy::Apply,
        &topology_claims::SystemClock,
        false,
    )
    .map_err(|e| e.into_claims().to_string())?;
    let old = i64::try_from(old_head).unwrap_or(i64::MAX);
    conn.execute_batch("DELETE FROM claim_events; DELETE FROM watch_revisions;")
        .and_then(|()| {
            conn.execute(
                "UPDATE watch_head SET revision = MAX(revision, ?1) + 1, \
                 compacted_through = MAX(revision, ?1) + 1, events = 0",
                [old],
            )
        })
        .map(|_| ())
        .map_err(|e| format!("fencing the watchers of the replaced store: {e}"))
}

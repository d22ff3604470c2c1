//! The change feed (WatchClaims): what an event is, the order events are read in, where a watch
//! may start, and when history is compacted. Stores write one event per change of a claim row,
//! in the same store transaction as the change; each store numbers them with revisions that
//! never decrease in the order a reader can see them (docs/decisions/117).
//!
//! Owns the rules of reading the log. Must not do I/O: stores read and write the rows, the
//! gRPC layer streams them.

use std::time::Duration;

use crate::domain::{Claim, NamespaceId};
use crate::error::ClaimsError;

/// `serve --watch-retention`: how long events are kept for watchers to resume from.
pub const DEFAULT_WATCH_RETENTION: Duration = Duration::from_secs(60 * 60);

/// `serve --watch-max-events`: the most events kept, whatever their age (the oldest go first).
pub const DEFAULT_WATCH_MAX_EVENTS: u64 = 1_000_000;

/// The most events one read of the log returns.
pub const EVENTS_READ_LIMIT: usize = 1_000;

/// One change of one claim: its whole row after the change (for a delete, the row as it was),
/// the store transaction's revision, and its place among that transaction's events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimEvent {
    pub position: EventPosition,
    pub claim: Claim,
    /// The claim no longer exists (destroyed, a create rolled back, decommissioned).
    pub deleted: bool,
}

/// Where an event is in the log: its revision, then its order within the revision. Events are
/// read in this order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventPosition {
    pub revision: u64,
    pub seq: u64,
}

impl EventPosition {
    /// The first position of `revision`.
    pub const fn start_of(revision: u64) -> Self {
        Self { revision, seq: 0 }
    }

    /// The position right after this one.
    pub const fn next(self) -> Self {
        Self {
            revision: self.revision,
            seq: self.seq.saturating_add(1),
        }
    }
}

/// A read of the log: events at or after `from`, at most `limit`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventsQuery {
    pub from: EventPosition,
    pub limit: usize,
}

/// What one read returned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventsPage {
    /// In log order.
    pub events: Vec<ClaimEvent>,
    /// Every event with a revision at most this was in this page or before it (when `more` is
    /// false): the revision a progress response may announce. No later read can return an
    /// event at or below it.
    pub through: u64,
    /// The page was cut at `limit`: read again from after its last event.
    pub more: bool,
}

impl EventsPage {
    /// Cuts `events` (in log order, every one at or after the query's start) to the query's
    /// limit, and says how far the log is complete: `current` when nothing was cut.
    pub fn cut(mut events: Vec<ClaimEvent>, query: &EventsQuery, current: u64) -> Self {
        let more = events.len() > query.limit;
        events.truncate(query.limit);
        let through = if more {
            // Only the revisions before the last one returned are surely complete.
            events
                .last()
                .map_or(0, |e| e.position.revision.saturating_sub(1))
        } else {
            current
        };
        Self {
            events,
            through,
            more,
        }
    }
}

/// The log's bounds as a store keeps them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogBounds {
    /// Every event with a revision at most this was compacted away (0: none ever was).
    pub compacted_through: u64,
    /// The revision through which every transaction's events are readable.
    pub current: u64,
}

/// A watch from `from` may start only above the compacted history: otherwise `WATCH_COMPACTED`
/// naming the oldest revision still available.
pub fn check_watch_start(from: u64, bounds: LogBounds) -> Result<(), ClaimsError> {
    if from <= bounds.compacted_through {
        return Err(ClaimsError::WatchCompacted {
            requested: from,
            compact_revision: bounds.compacted_through.saturating_add(1),
        });
    }
    Ok(())
}

/// How many of the oldest events to remove: the `older` ones recorded before the retention's
/// cutoff, or more if that still leaves more than `max_events` of the `kept` events.
pub fn events_to_compact(older: u64, kept: u64, max_events: u64) -> u64 {
    older.max(kept.saturating_sub(max_events))
}

/// A compaction pass over the log's start, for a store that cannot count its log cheaply
/// (PostgreSQL, decision 124): the store hands it the oldest events in log order, one by one,
/// until [`CompactionWalk::see`] says it has seen enough, and removes every revision through
/// [`CompactionWalk::through`]. The pass removes the old events before the first recent one
/// (an event younger than the retention never goes for its age, even behind an older one),
/// or more while the log is over its cap, at most `batch` events.
#[derive(Clone, Debug)]
pub struct CompactionWalk {
    /// Events to remove whatever their age: the log's length over the cap, at most `batch`.
    over: u64,
    batch: u64,
    /// The revisions of the events seen, oldest first.
    revisions: Vec<u64>,
    /// How many of them were old before the first recent one.
    older: u64,
    recent_seen: bool,
}

impl CompactionWalk {
    /// `length`: the log's length as the store knows it (an estimate may do: the cap is a
    /// bound on storage); `max_events`: the cap; `batch`: the most one pass removes.
    pub fn new(length: u64, max_events: u64, batch: u64) -> Self {
        Self {
            over: events_to_compact(0, length, max_events).min(batch),
            batch,
            revisions: Vec::new(),
            older: 0,
            recent_seen: false,
        }
    }

    /// The next event in log order, and whether it was recorded before the retention's
    /// cutoff. Returns whether the walk has seen enough (further events change nothing).
    pub fn see(&mut self, revision: u64, old: bool) -> bool {
        self.recent_seen |= !old;
        if !self.recent_seen {
            self.older += 1;
        }
        self.revisions.push(revision);
        self.done()
    }

    /// Whether the walk has seen enough: a whole batch, or a recent event and as many events
    /// as the cap removes.
    pub fn done(&self) -> bool {
        let seen = self.revisions.len() as u64;
        seen >= self.batch || (self.recent_seen && seen >= self.over)
    }

    /// The revision to remove every event through (whole revisions), once the walk is done or
    /// the log has no more events; `None`: nothing to remove.
    pub fn through(&self) -> Option<u64> {
        let remove = self.older.max(self.over).min(self.batch);
        let last = usize::try_from(remove).ok()?.checked_sub(1)?;
        self.revisions
            .get(last.min(self.revisions.len().checked_sub(1)?))
            .copied()
    }
}

/// Whether a watcher of `namespaces` (empty: every one) wants this event.
pub fn watched(namespaces: &[NamespaceId], event: &ClaimEvent) -> bool {
    namespaces.is_empty() || namespaces.contains(&event.claim.record.key.namespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_at_or_below_the_compacted_history_is_refused_with_the_oldest_kept_revision() {
        let bounds = LogBounds {
            compacted_through: 10,
            current: 20,
        };
        assert_eq!(
            check_watch_start(10, bounds),
            Err(ClaimsError::WatchCompacted {
                requested: 10,
                compact_revision: 11
            })
        );
        assert_eq!(check_watch_start(11, bounds), Ok(()));
        // A revision not reached yet is accepted: the watch waits for it.
        assert_eq!(check_watch_start(1_000, bounds), Ok(()));
        assert_eq!(check_watch_start(1, LogBounds::default()), Ok(()));
    }

    /// Walks `events` (revision, old) until the walk is done; the revision to compact through
    /// and how many events it read.
    fn walk(length: u64, max: u64, batch: u64, events: &[(u64, bool)]) -> (Option<u64>, usize) {
        let mut walk = CompactionWalk::new(length, max, batch);
        let mut read = 0;
        for &(revision, old) in events {
            read += 1;
            if walk.see(revision, old) {
                break;
            }
        }
        (walk.through(), read)
    }

    #[test]
    fn a_compaction_walk_removes_the_old_events_before_the_first_recent_one() {
        let log = [
            (1, true),
            (1, true),
            (2, true),
            (3, false),
            (4, true),
            (5, false),
        ];
        // Under the cap: the three old events go (through revision 2), and the walk stops at
        // the first recent one; the old event behind it stays.
        assert_eq!(walk(6, 100, 1_000, &log), (Some(2), 4));
        // Nothing old: nothing goes, and one event was read.
        assert_eq!(walk(6, 100, 1_000, &log[3..]), (None, 1));
        // An empty log.
        assert_eq!(walk(0, 100, 1_000, &[]), (None, 0));
    }

    #[test]
    fn a_compaction_walk_goes_past_recent_events_while_the_log_is_over_its_cap() {
        let log = [(1, true), (2, false), (3, false), (4, false), (5, false)];
        // Five events, a cap of one: four go, whatever their age.
        assert_eq!(walk(5, 1, 1_000, &log), (Some(4), 4));
        // An estimate longer than the log: what there is goes.
        assert_eq!(walk(50, 1, 1_000, &log), (Some(5), 5));
    }

    #[test]
    fn a_compaction_walk_removes_at_most_a_batch() {
        let log: Vec<(u64, bool)> = (1..=10).map(|r| (r, true)).collect();
        assert_eq!(walk(10, 100, 4, &log), (Some(4), 4));
        assert_eq!(walk(10, 1, 4, &log), (Some(4), 4));
    }

    #[test]
    fn compaction_removes_the_old_events_and_enough_to_keep_the_count_cap() {
        assert_eq!(events_to_compact(3, 10, 100), 3);
        assert_eq!(events_to_compact(3, 150, 100), 50);
        assert_eq!(events_to_compact(0, 0, 100), 0);
    }
}

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

    #[test]
    fn compaction_removes_the_old_events_and_enough_to_keep_the_count_cap() {
        assert_eq!(events_to_compact(3, 10, 100), 3);
        assert_eq!(events_to_compact(3, 150, 100), 50);
        assert_eq!(events_to_compact(0, 0, 100), 0);
    }
}

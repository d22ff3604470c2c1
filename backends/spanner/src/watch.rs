//! The change feed on Spanner (decision 117): every write transaction's changes to `claims`
//! recorded as `claim_events` rows in the same transaction, and reading and compacting them.
//!
//! A revision is the writing transaction's commit timestamp in nanoseconds since the epoch
//! (`claim_events.revision_at`, `claims.revision_at`). [`ClaimChanges`] sees every mutation a
//! transaction buffers (`WriteTx::buffer_write`): it stamps the commit timestamp on each claim
//! row written and, just before the commit, turns the claims changed into one event row each,
//! with the row's whole post-image (for a delete, the row as it was). Whatever path wrote the
//! claim (a lease, a group, a namespace move, a decommission), the event cannot be forgotten.
//!
//! Reads are strong read-only snapshots at a read timestamp T: every transaction that commits
//! later has a commit timestamp above T (Spanner's external consistency), so every event at or
//! below T is in the snapshot and a read never returns a revision that a later commit could
//! fill in behind it. `watch_log.compacted_through` bounds the kept history; `admin
//! mark-restored` raises it to its own commit timestamp, so no watch from before a restore
//! resumes into the restored timeline.
//!
//! Owns the event rows' shape and the log's reads; must not decide where a watch may start or
//! how much to compact (`topology_claims::domain::events`).

use std::collections::HashMap;
use std::time::Duration;

use gcloud_googleapis::spanner::v1::mutation::{Delete, Operation, Write};
use gcloud_googleapis::spanner::v1::struct_type::Field;
use gcloud_googleapis::spanner::v1::Mutation;
use gcloud_spanner::key::{Key, KeyRange, RangeKind};
use gcloud_spanner::mutation::{delete, insert_or_update};
use gcloud_spanner::row::Row;
use gcloud_spanner::statement::Statement;
use gcloud_spanner::transaction::Transaction;
use gcloud_spanner::value::CommitTimestamp;
use prost_types::value::Kind;
use prost_types::{ListValue, Value};
use topology_claims::domain::{
    check_watch_start, events, ClaimEvent, EventPosition, EventsPage, EventsQuery, LogBounds,
};
use topology_claims::ClaimsError;

use crate::error::TxError;
use crate::rows::{self, column, CLAIMS, CLAIM_COLUMNS};
use crate::store::SpannerClaimStore;

pub(crate) const EVENTS: &str = "claim_events";
pub(crate) const WATCH_LOG: &str = "watch_log";
/// The column of `claims` and `claim_events` holding the writing transaction's commit timestamp.
pub(crate) const REVISION: &str = "revision_at";
/// The one row of `watch_log`.
const LOG_ROW: i64 = 1;
/// The columns an event copies from the claim row: every one but `revision_at`.
const IMAGE_COLUMNS: usize = 15;
/// Events removed per compaction pass (one range delete; the next pass goes on).
const COMPACT_BATCH: u64 = 20_000;
/// The placeholder Spanner replaces with the commit timestamp.
const COMMIT_TIMESTAMP: &str = "spanner.commit_timestamp()";

/// A claim's primary key as text: (claim_type, claim_value).
type KeyText = (String, String);
/// Column name → value, as mutations and reads carry them.
type Image = HashMap<String, Value>;

/// A value as Spanner sent it, undecoded.
struct RawValue(Value);

impl gcloud_spanner::row::TryFromValue for RawValue {
    fn try_from(value: &Value, _: &Field) -> Result<Self, gcloud_spanner::row::Error> {
        Ok(Self(value.clone()))
    }
}

/// A `claims` row read with [`CLAIM_COLUMNS`], as the values Spanner sent.
pub(crate) fn image_of(row: &Row) -> Result<Image, ClaimsError> {
    CLAIM_COLUMNS
        .iter()
        .map(|name| Ok(((*name).to_owned(), column::<RawValue>(row, name)?.0)))
        .collect()
}

fn text(value: Option<&Value>) -> String {
    match value.and_then(|v| v.kind.as_ref()) {
        Some(Kind::StringValue(s)) => s.clone(),
        Some(Kind::NumberValue(n)) => n.to_string(),
        Some(Kind::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    }
}

fn key_text(image: &Image) -> KeyText {
    (
        text(image.get("claim_type")),
        text(image.get("claim_value")),
    )
}

fn string_value(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

fn null() -> Value {
    Value {
        kind: Some(Kind::NullValue(0)),
    }
}

/// What one transaction did to one claim row.
struct Change {
    /// The row as an insert of this transaction wrote it; `None`: the row as stored.
    base: Option<Image>,
    /// Partial column sets written on top of `base`, in order.
    updates: Vec<Image>,
    deleted: bool,
}

/// The claim rows one transaction attempt changed, in the order it first changed them, and the
/// rows it read (their images before the change).
#[derive(Default)]
pub(crate) struct ClaimChanges {
    order: Vec<KeyText>,
    changes: HashMap<KeyText, Change>,
    read: HashMap<KeyText, Image>,
    /// A delete by key range or of every key: its rows are unknown (no path writes one).
    ranged: bool,
}

impl ClaimChanges {
    /// Remembers a `claims` row this transaction read: its image before any change.
    pub(crate) fn remember(&mut self, image: Image) {
        self.read.insert(key_text(&image), image);
    }

    /// Records `mutation` if it writes `claims`, stamping the commit timestamp on the rows it
    /// writes.
    pub(crate) fn record(&mut self, mutation: &mut Mutation) {
        match &mut mutation.operation {
            Some(
                Operation::Insert(write)
                | Operation::InsertOrUpdate(write)
                | Operation::Replace(write),
            ) if write.table == CLAIMS => {
                for image in stamp(write) {
                    let key = key_text(&image);
                    self.change(key).base = Some(image);
                }
            }
            Some(Operation::Update(write)) if write.table == CLAIMS => {
                for image in stamp(write) {
                    let key = key_text(&image);
                    self.change(key).updates.push(image);
                }
            }
            Some(Operation::Delete(Delete { table, key_set })) if table == CLAIMS => {
                let Some(keys) = key_set else { return };
                self.ranged |= keys.all || !keys.ranges.is_empty();
                for key in &keys.keys {
                    let key = (text(key.values.first()), text(key.values.get(1)));
                    self.change(key).deleted = true;
                }
            }
            _ => {}
        }
    }

    fn change(&mut self, key: KeyText) -> &mut Change {
        if !self.changes.contains_key(&key) {
            self.order.push(key.clone());
        }
        self.changes.entry(key).or_insert_with(|| Change {
            base: None,
            updates: Vec::new(),
            deleted: false,
        })
    }

    /// The event rows of this attempt's changes, to buffer just before the commit (after the
    /// stored images of [`unread`](Self::unread) were [remembered](Self::remember)).
    pub(crate) fn events(&self) -> Result<Vec<Mutation>, ClaimsError> {
        if self.ranged {
            return Err(ClaimsError::internal(
                "claims deleted by key range: the change feed cannot name their rows",
            ));
        }
        let tag = i64::from(fastrand::u32(..i32::MAX as u32)) << 32;
        let mut columns: Vec<&str> = CLAIM_COLUMNS[..IMAGE_COLUMNS].to_vec();
        columns.extend([REVISION, "seq", "deleted"]);
        let mut out = Vec::new();
        for key in &self.order {
            let change = &self.changes[key];
            let Some(mut image) = change.base.clone().or_else(|| self.read.get(key).cloned())
            else {
                // A delete of a row that is not there, or an update that will fail the commit.
                continue;
            };
            for update in &change.updates {
                image.extend(update.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            let seq = tag | i64::try_from(out.len()).unwrap_or(i64::MAX);
            let mut values: Vec<Value> = columns[..IMAGE_COLUMNS]
                .iter()
                .map(|c| image.get(*c).cloned().unwrap_or_else(null))
                .collect();
            values.extend([
                string_value(COMMIT_TIMESTAMP),
                string_value(&seq.to_string()),
                Value {
                    kind: Some(Kind::BoolValue(change.deleted)),
                },
            ]);
            out.push(Mutation {
                operation: Some(Operation::Insert(Write {
                    table: EVENTS.to_owned(),
                    columns: columns.iter().map(|c| (*c).to_owned()).collect(),
                    values: vec![ListValue { values }],
                })),
            });
        }
        Ok(out)
    }

    /// The keys of changed rows whose stored image is needed and was not read.
    pub(crate) fn unread(&self) -> Vec<Key> {
        self.order
            .iter()
            .filter(|k| self.changes[*k].base.is_none() && !self.read.contains_key(*k))
            .map(|(claim_type, value)| {
                let number: i64 = claim_type.parse().unwrap_or_default();
                Key::composite(&[&number, value])
            })
            .collect()
    }
}

/// Adds `revision_at` = the commit timestamp to every row of `write`; returns the rows' images.
fn stamp(write: &mut Write) -> Vec<Image> {
    if !write.columns.iter().any(|c| c == REVISION) {
        write.columns.push(REVISION.to_owned());
        for row in &mut write.values {
            row.values.push(string_value(COMMIT_TIMESTAMP));
        }
    }
    write
        .values
        .iter()
        .map(|row| {
            write
                .columns
                .iter()
                .cloned()
                .zip(row.values.iter().cloned())
                .collect()
        })
        .collect()
}

/// A commit or read timestamp as a revision: nanoseconds since the epoch (0 before it).
pub(crate) fn revision_of(timestamp: &prost_types::Timestamp) -> u64 {
    let nanos = i128::from(timestamp.seconds) * 1_000_000_000 + i128::from(timestamp.nanos);
    u64::try_from(nanos).unwrap_or_default()
}

fn timestamp_of(revision: u64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: i64::try_from(revision / 1_000_000_000).unwrap_or(i64::MAX),
        nanos: i32::try_from(revision % 1_000_000_000).unwrap_or_default(),
    }
}

fn unsigned(value: i64) -> u64 {
    u64::try_from(value).unwrap_or_default()
}

/// The compacted history's bound (0: nothing compacted yet).
async fn compacted_through(
    store: &SpannerClaimStore,
    tx: &mut Transaction,
    context: &str,
) -> Result<u64, ClaimsError> {
    let read = tx.read_row_with_option(
        WATCH_LOG,
        &["compacted_through"],
        Key::new(&LOG_ROW),
        store.read_options(),
    );
    let row = store
        .options
        .within_rpc_timeout(read)
        .await
        .map_err(|e| crate::error::status_error(context, &e))?;
    match row {
        Some(row) => Ok(revision_of(&column::<prost_types::Timestamp>(
            &row,
            "compacted_through",
        )?)),
        None => Ok(0),
    }
}

/// `ClaimStore::read_events`: one strong snapshot; its read timestamp is how far the log is
/// complete.
pub(crate) async fn read_events(
    store: &SpannerClaimStore,
    query: &EventsQuery,
) -> Result<EventsPage, ClaimsError> {
    let context = "WatchClaims";
    let (mut tx, read_at) = store.snapshot_revision(context).await?;
    let bounds = LogBounds {
        compacted_through: compacted_through(store, &mut tx, context).await?,
        current: read_at,
    };
    check_watch_start(query.from.revision, bounds)?;
    if query.limit == 0 || query.from.revision > bounds.current {
        return Ok(EventsPage::cut(Vec::new(), query, bounds.current));
    }
    let mut stmt = Statement::new(format!(
        "SELECT {}, seq, deleted FROM {EVENTS}
         WHERE revision_at >= @revision AND (revision_at > @revision OR seq >= @seq)
         ORDER BY revision_at, seq LIMIT @limit",
        rows::select_list(&CLAIM_COLUMNS)
    ));
    stmt.add_param("revision", &timestamp_of(query.from.revision));
    stmt.add_param("seq", &i64::try_from(query.from.seq).unwrap_or(i64::MAX));
    stmt.add_param("limit", &i64::try_from(query.limit + 1).unwrap_or(i64::MAX));
    let events = store
        .query_all(&mut tx, stmt, context, |row| {
            let claim = rows::claim_from_row(row)?;
            Ok(ClaimEvent {
                position: EventPosition {
                    revision: claim.revision,
                    seq: unsigned(column(row, "seq")?),
                },
                claim,
                deleted: column(row, "deleted")?,
            })
        })
        .await?;
    Ok(EventsPage::cut(events, query, bounds.current))
}

/// `ClaimStore::compact_events`: counts in a snapshot, then one range delete of whole
/// revisions (at most [`COMPACT_BATCH`] events a pass) that raises `compacted_through`.
pub(crate) async fn compact_events(
    store: &SpannerClaimStore,
    retention: Duration,
    max_events: u64,
) -> Result<u64, ClaimsError> {
    let context = "compacting the change feed";
    let (mut tx, read_at) = store.snapshot_revision(context).await?;
    let cutoff = read_at.saturating_sub(u64::try_from(retention.as_nanos()).unwrap_or(u64::MAX));
    let mut stmt = Statement::new(format!(
        "SELECT COUNTIF(revision_at < @cutoff) AS older, COUNT(*) AS kept FROM {EVENTS}"
    ));
    stmt.add_param("cutoff", &timestamp_of(cutoff));
    let counts = store
        .query_all(&mut tx, stmt, context, |row| {
            Ok((
                unsigned(column(row, "older")?),
                unsigned(column(row, "kept")?),
            ))
        })
        .await?;
    let (older, kept) = counts.first().copied().unwrap_or_default();
    let remove = events::events_to_compact(older, kept, max_events).min(COMPACT_BATCH);
    if remove == 0 {
        return Ok(0);
    }
    let mut stmt = Statement::new(format!(
        "SELECT revision_at FROM {EVENTS} ORDER BY revision_at, seq LIMIT 1 OFFSET @nth"
    ));
    stmt.add_param("nth", &i64::try_from(remove - 1).unwrap_or(i64::MAX));
    let through = store
        .query_all(&mut tx, stmt, context, |row| {
            column::<prost_types::Timestamp>(row, REVISION)
        })
        .await?;
    let Some(through) = through.first().cloned() else {
        return Ok(0);
    };
    let mut attempts = store.attempts("compacting the change feed");
    loop {
        let Some(mut tx) = attempts.begin(&store.client).await? else {
            continue;
        };
        let result = async {
            let known = compacted_through(store, &mut tx, context).await?;
            let range = KeyRange::new(
                Key::composite(&[]),
                Key::new(&through),
                RangeKind::ClosedClosed,
            );
            let mut writes = vec![delete(EVENTS, range)];
            if revision_of(&through) > known {
                writes.push(log_bound(&through));
            }
            tx.buffer_write(writes);
            Ok::<_, TxError>(())
        }
        .await;
        if attempts.end(&mut tx, result).await?.is_some() {
            return Ok(remove);
        }
    }
}

fn log_bound(through: &dyn gcloud_spanner::statement::ToKind) -> Mutation {
    insert_or_update(
        WATCH_LOG,
        &["id", "compacted_through"],
        &[&LOG_ROW, through],
    )
}

/// `admin mark-restored`'s fence: every revision up to this transaction's commit counts as
/// compacted, so a watch from before the restore is refused `WATCH_COMPACTED`.
pub(crate) fn fence_watchers() -> Mutation {
    log_bound(&CommitTimestamp::new())
}

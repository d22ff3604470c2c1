//! The read-write transaction loop: begin, run one attempt, commit, and on `Aborted` start over
//! with jittered backoff until the overall deadline. Each commit gets a deadline sized by the
//! rows it writes ([`WriteTx`] counts them; decision 074).
//!
//! Why not gcloud-spanner's `read_write_transaction`: its retry stops after 6 attempts (about
//! 3 s, no jitter, not configurable), which a busy database, and the emulator's one transaction
//! at a time, exhaust routinely. Owns attempt counting, backoff, the commit's deadline and the
//! commit timestamp; must not look at what rows hold or decide anything about claims.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gcloud_gax::grpc::Status;
use gcloud_googleapis::spanner::v1::Mutation;
use gcloud_spanner::client::Client;
use gcloud_spanner::transaction::{ReadOptions, Transaction};
use gcloud_spanner::transaction_rw::{CommitOptions, ReadWriteTransaction};
use topology_claims::{ClaimsError, Timestamp};

use crate::config::SpannerOptions;
use crate::error::{classify, client_error, tx_error, Failure, TxError};
use crate::rows::{all_rows, mutation_rows, CLAIMS, CLAIM_COLUMNS};
use crate::watch::{image_of, ClaimChanges};

/// First backoff after an abort; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_millis(400);
/// How often a transaction is re-run because a mutation's own check fired at commit before the
/// failure is reported as `Internal` (it means the rows changed under the transaction's locks).
const MAX_CONSTRAINT_RETRIES: u32 = 3;

/// One attempt's read-write transaction: reads as gcloud-spanner's, writes buffered through
/// [`buffer_write`](Self::buffer_write), which counts the rows so that the commit gets a
/// deadline that fits them.
pub(crate) struct WriteTx {
    tx: ReadWriteTransaction,
    rows: usize,
    /// The claim rows changed, for the change feed's events.
    pub(crate) changes: ClaimChanges,
}

impl WriteTx {
    /// Buffers `mutations` for the commit (claim rows get the commit timestamp as their
    /// revision).
    pub(crate) fn buffer_write(&mut self, mut mutations: Vec<Mutation>) {
        for mutation in &mut mutations {
            self.changes.record(mutation);
        }
        self.rows += mutations.iter().map(mutation_rows).sum::<usize>();
        self.tx.buffer_write(mutations);
    }

    /// Buffers the change feed's events of the claims changed (reading first the rows changed
    /// but not read).
    async fn write_events(&mut self, options: &SpannerOptions) -> Result<(), TxError> {
        let unread = self.changes.unread();
        if !unread.is_empty() {
            let read_options = ReadOptions {
                call_options: options.call_options(),
                ..Default::default()
            };
            let read =
                all_rows(
                    self.tx
                        .read_with_option(CLAIMS, &CLAIM_COLUMNS, unread, read_options),
                );
            for row in options.within_rpc_timeout(read).await? {
                self.changes.remember(image_of(&row)?);
            }
        }
        let events = self.changes.events()?;
        self.rows += events.len();
        self.tx.buffer_write(events);
        Ok(())
    }
}

impl Deref for WriteTx {
    type Target = Transaction;

    fn deref(&self) -> &Transaction {
        &self.tx
    }
}

impl DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut Transaction {
        &mut self.tx
    }
}

/// One write operation's attempts. Use as
///
/// ```text
/// let mut attempts = Attempts::new(&options, "BeginUpdate");
/// let (value, commit_ts) = loop {
///     let Some(mut tx) = attempts.begin(&client).await? else { continue };
///     let result = attempt(&mut tx).await;
///     if let Some(done) = attempts.end(&mut tx, result).await? { break done; }
/// };
/// ```
///
/// Every attempt is finished with [`end`](Self::end) (commit or rollback): a transaction is
/// never dropped half-way, which on the emulator would hold its single lock until it restarts.
pub(crate) struct Attempts<'a> {
    options: &'a SpannerOptions,
    what: &'static str,
    started: Instant,
    attempts: u32,
    constraint_retries: u32,
    backoff: Duration,
    /// Where re-runs are counted (the store's `ClaimStore::retries`), if anywhere.
    retries: Option<&'a AtomicU64>,
}

impl<'a> Attempts<'a> {
    pub(crate) fn new(options: &'a SpannerOptions, what: &'static str) -> Self {
        Self {
            options,
            what,
            started: Instant::now(),
            attempts: 0,
            constraint_retries: 0,
            backoff: FIRST_BACKOFF,
            retries: None,
        }
    }

    /// Counts every re-run of a transaction (aborts, lost sessions, constraint re-runs) in
    /// `retries`.
    pub(crate) fn counted(mut self, retries: &'a AtomicU64) -> Self {
        self.retries = Some(retries);
        self
    }

    fn count_retry(&self) {
        if let Some(retries) = self.retries {
            retries.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Begins the next attempt's transaction. `Ok(None)`: the begin failed in a retryable way
    /// (and the backoff was slept); call again.
    pub(crate) async fn begin(&mut self, client: &Client) -> Result<Option<WriteTx>, ClaimsError> {
        self.attempts += 1;
        // gcloud-spanner offers no per-call retry setting for BeginTransaction (its default
        // retries `Unavailable` for minutes), so bound it from outside. Cancelling here is safe:
        // a transaction takes no lock before its first read.
        let begun = tokio::time::timeout(
            self.options.rpc_timeout,
            client.begin_read_write_transaction(),
        )
        .await;
        match begun {
            Ok(Ok(tx)) => Ok(Some(WriteTx {
                tx,
                rows: 0,
                changes: ClaimChanges::default(),
            })),
            Ok(Err(error)) => match TxError::from(error) {
                TxError::Status(status) => self.retry_or_fail(status).await.map(|()| None),
                TxError::Claims(error) => Err(error),
            },
            Err(_elapsed) => Err(ClaimsError::unavailable(format!(
                "{}: Spanner did not begin a transaction within {:?}",
                self.what, self.options.rpc_timeout
            ))),
        }
    }

    /// Commits (`Ok`) or rolls back (`Err`) the attempt. `Ok(Some((value, commit_ts)))`: done;
    /// `Ok(None)`: the attempt was aborted and the backoff slept, run another one.
    ///
    /// A commit may take `rpc_timeout` plus its rows' allowance
    /// ([`SpannerOptions::commit_deadline`]); a rollback `rpc_timeout`. One that gets no answer
    /// in time is `Unavailable` (a commit's outcome is then unknown: it may have landed).
    pub(crate) async fn end<T>(
        &mut self,
        tx: &mut WriteTx,
        result: Result<T, TxError>,
    ) -> Result<Option<(T, Timestamp)>, ClaimsError> {
        let options = CommitOptions {
            call_options: self.options.call_options(),
            ..Default::default()
        };
        let result = match result {
            Ok(value) => tx.write_events(self.options).await.map(|()| value),
            Err(error) => Err(error),
        };
        let rows = tx.rows;
        let limit = match result {
            Ok(_) => self.options.commit_deadline(rows),
            Err(_) => self.options.rpc_timeout,
        };
        let ended = match tokio::time::timeout(limit, tx.tx.end(result, Some(options))).await {
            Ok(ended) => ended,
            Err(_elapsed) => Err(TxError::Status(Status::deadline_exceeded(format!(
                "Spanner did not answer within {limit:?} (a transaction writing {rows} rows)"
            )))),
        };
        match ended {
            Ok((commit, value)) => {
                let timestamp = commit.timestamp.ok_or_else(|| {
                    ClaimsError::internal(format!(
                        "{}: Spanner returned no commit timestamp",
                        self.what
                    ))
                })?;
                Ok(Some((value, commit_timestamp(timestamp))))
            }
            Err(TxError::Status(status)) => self.retry_or_fail(status).await.map(|()| None),
            Err(error) => Err(tx_error(self.what, error)),
        }
    }

    async fn retry_or_fail(&mut self, status: gcloud_gax::grpc::Status) -> Result<(), ClaimsError> {
        match classify(&status) {
            Failure::Aborted | Failure::SessionLost => {
                let pause = self.next_pause();
                if self.started.elapsed() + pause >= self.options.transaction_deadline {
                    return Err(ClaimsError::unavailable(format!(
                        "{}: Spanner kept aborting the transaction for {:?} ({} attempts; last: {})",
                        self.what,
                        self.started.elapsed(),
                        self.attempts,
                        status.message()
                    )));
                }
                tracing::debug!(
                    what = self.what,
                    attempt = self.attempts,
                    ?pause,
                    "transaction aborted; retrying"
                );
                tokio::time::sleep(pause).await;
                self.count_retry();
                Ok(())
            }
            Failure::Constraint if self.constraint_retries < MAX_CONSTRAINT_RETRIES => {
                self.constraint_retries += 1;
                self.count_retry();
                tracing::warn!(what = self.what, status = %status.message(), "a write's own check fired; re-running the transaction");
                Ok(())
            }
            _ => Err(client_error(
                self.what,
                &gcloud_spanner::client::Error::GRPC(status),
            )),
        }
    }

    /// "Equal jitter": half the current backoff plus a random part of the other half, so
    /// contenders that aborted together do not come back together.
    fn next_pause(&mut self) -> Duration {
        let half = self.backoff / 2;
        let jitter = Duration::from_micros(fastrand::u64(0..=half.as_micros() as u64));
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        half + jitter
    }
}

/// A commit timestamp as a domain timestamp (Spanner keeps nanoseconds; the domain microseconds,
/// truncated the same way as every TIMESTAMP read back, so the two always compare equal).
pub(crate) fn commit_timestamp(timestamp: gcloud_spanner::value::Timestamp) -> Timestamp {
    let timestamp: prost_types::Timestamp = timestamp.into();
    topology_claims::codec::timestamp_from_pb(&timestamp)
}

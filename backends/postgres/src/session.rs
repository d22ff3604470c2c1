//! One pooled connection for one attempt of a store operation, the transaction guard around it,
//! and the retry loop that runs attempts.
//!
//! Why a guard of our own instead of `tokio_postgres::Transaction`: the adapter pipelines `BEGIN`
//! with the first reads and the writes with `COMMIT` (two round trips per BeginUpdate), which
//! the driver's transaction type cannot express. The guard guarantees what that type does: a
//! transaction not committed is rolled back before its connection is used again, even when the
//! request future is dropped mid-flight (client gone, timeout).
//!
//! Owns connections, round-trip counting and retries; it knows nothing of claims or leases.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use deadpool_postgres::{Object, Pool};
use tokio_postgres::{Client, Statement};
use topology_claims::ClaimsError;

use crate::error::{pool_error, Contended, Failure};
use crate::sql;

/// Attempts of one operation that lost a race (unique violation, deadlock, …) before giving up.
const MAX_CONTENTION_ATTEMPTS: u32 = 12;
/// Attempts of one operation whose connection broke, before reporting `Unavailable`.
const MAX_CONNECTION_ATTEMPTS: u32 = 3;
/// How long a rollback of an abandoned transaction may take before its connection is closed.
const ROLLBACK_TIMEOUT: Duration = Duration::from_secs(5);

/// What every attempt shares: the pool, the target for messages, the round-trip counter.
pub(crate) struct Shared {
    pub pool: Pool,
    pub target: String,
    /// Longest one attempt may take, client side: a server that stops answering (no FIN, no
    /// RST) must not hang a request forever.
    pub attempt_timeout: Duration,
    round_trips: AtomicU64,
    contention_retries: AtomicU64,
    deadlocks: AtomicU64,
    reconnects: AtomicU64,
}

/// Counters of a store since it was created (for tests, the benchmark and metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Pipelined flights of statements awaited (see the round-trip table in `store.rs`).
    pub round_trips: u64,
    /// Transactions retried after losing a race (unique violation, serialization failure,
    /// deadlock, conditional-write mismatch) or finding PostgreSQL's lock table full.
    pub contention_retries: u64,
    /// Of those, deadlocks PostgreSQL detected. The lock order makes this 0 in practice.
    pub deadlocks: u64,
    /// Attempts retried on a fresh connection after the previous one broke.
    pub reconnects: u64,
}

impl Shared {
    pub fn new(
        pool: Pool,
        target: String,
        statement_timeout: Duration,
        connect_timeout: Duration,
    ) -> Self {
        let per_statement = if statement_timeout.is_zero() {
            Duration::from_secs(30)
        } else {
            statement_timeout
        };
        Self {
            pool,
            target,
            attempt_timeout: connect_timeout + per_statement * 3,
            round_trips: AtomicU64::new(0),
            contention_retries: AtomicU64::new(0),
            deadlocks: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
        }
    }

    pub fn stats(&self) -> StoreStats {
        StoreStats {
            round_trips: self.round_trips.load(Ordering::Relaxed),
            contention_retries: self.contention_retries.load(Ordering::Relaxed),
            deadlocks: self.deadlocks.load(Ordering::Relaxed),
            reconnects: self.reconnects.load(Ordering::Relaxed),
        }
    }

    /// A connection from the pool for one attempt.
    pub async fn session(&self) -> Result<Session<'_>, Failure> {
        let client = self
            .pool
            .get()
            .await
            .map_err(|e| pool_error(e, &self.target))?;
        Ok(Session {
            client: Some(client),
            in_transaction: false,
            shared: self,
        })
    }

    /// Runs `attempt` until it answers: retries contention with jittered exponential backoff and
    /// broken connections on a fresh connection, each a bounded number of times.
    pub async fn run<T, F, Fut>(&self, operation: &str, mut attempt: F) -> Result<T, ClaimsError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        let (mut contended, mut lost) = (0u32, 0u32);
        loop {
            let outcome = tokio::time::timeout(self.attempt_timeout, attempt()).await;
            let failure = match outcome {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(failure)) => failure,
                Err(_elapsed) => {
                    return Err(ClaimsError::unavailable(format!(
                        "PostgreSQL at {} did not answer {operation} within {:?}",
                        self.target, self.attempt_timeout
                    )))
                }
            };
            match failure {
                Failure::Final(error) => return Err(error),
                Failure::Contention { text, cause } => {
                    contended += 1;
                    self.contention_retries.fetch_add(1, Ordering::Relaxed);
                    match cause {
                        Contended::Race => {}
                        Contended::Deadlock => {
                            self.deadlocks.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(operation, %text, "deadlock detected; retrying");
                        }
                        Contended::LockTableFull => tracing::warn!(
                            operation, %text,
                            "PostgreSQL's lock table is full (see max_locks_per_transaction in \
                             docs/backends/postgres.md, \"Lock budget\"); retrying"
                        ),
                    }
                    if contended >= MAX_CONTENTION_ATTEMPTS {
                        return Err(ClaimsError::unavailable(format!(
                            "{operation} on PostgreSQL at {} kept losing races ({contended} attempts); retry later: {text}",
                            self.target
                        )));
                    }
                    tracing::debug!(operation, attempt = contended, %text, "retrying after contention");
                    tokio::time::sleep(backoff(contended)).await;
                }
                Failure::ConnectionLost(text) => {
                    lost += 1;
                    if lost >= MAX_CONNECTION_ATTEMPTS {
                        return Err(ClaimsError::unavailable(format!(
                            "lost the connection to PostgreSQL at {} during {operation}: {text}",
                            self.target
                        )));
                    }
                    self.reconnects.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(operation, attempt = lost, %text, "connection lost; retrying on a fresh one");
                }
            }
        }
    }

    fn count_round_trip(&self) {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether the lease transaction of a connection's `uses`-th reuse drops its cached plans: not
/// on a fresh connection (it has none), then once every [`sql::REPLAN_EVERY`] uses.
fn replans_at(uses: usize) -> bool {
    uses > 0 && uses.is_multiple_of(sql::REPLAN_EVERY)
}

/// Full-jitter exponential backoff: uniform in [0, min(200 ms, 2 ms · 2^attempt)].
fn backoff(attempt: u32) -> Duration {
    let cap_micros = (2_000u64 << attempt.min(10)).min(200_000);
    Duration::from_micros(fastrand::u64(0..=cap_micros))
}

/// A pooled connection, possibly inside a transaction. Dropping it while the transaction is open
/// rolls the transaction back (on a spawned task) before the connection returns to the pool.
pub(crate) struct Session<'s> {
    client: Option<Object>,
    in_transaction: bool,
    shared: &'s Shared,
}

impl Session<'_> {
    /// The connection (present from creation until drop).
    pub fn client(&self) -> Result<&Client, Failure> {
        self.client
            .as_deref()
            .map(|wrapper| &**wrapper)
            .ok_or_else(|| Failure::Final(ClaimsError::internal("session without a connection")))
    }

    /// Prepares (or takes from the connection's cache) every statement of an operation. On a
    /// fresh connection all are prepared in one pipelined round trip; afterwards, none.
    pub async fn prepare<const N: usize>(
        &self,
        texts: [&'static str; N],
    ) -> Result<[Statement; N], Failure> {
        let Some(wrapper) = self.client.as_deref() else {
            return Err(Failure::Final(ClaimsError::internal(
                "session without a connection",
            )));
        };
        let cached = wrapper.statement_cache.size();
        let statements =
            futures::future::try_join_all(texts.iter().map(|text| wrapper.prepare_cached(text)))
                .await?;
        if wrapper.statement_cache.size() != cached {
            self.round_trip();
        }
        statements
            .try_into()
            .map_err(|_| Failure::Final(ClaimsError::internal("prepared statement count mismatch")))
    }

    /// Marks the transaction open. Call right before the future that sends `BEGIN` is first
    /// polled: from then on a drop must roll back.
    pub fn begin_transaction(&mut self) -> &'static str {
        self.in_transaction = true;
        sql::BEGIN
    }

    /// [`Session::begin_transaction`] for the lease transactions ([`sql::BEGIN_LEASE`]).
    /// Every [`sql::REPLAN_EVERY`] uses of the connection it also drops the connection's cached
    /// plans ([`sql::BEGIN_LEASE_REPLANNED`]).
    pub fn begin_lease_transaction(&mut self) -> &'static str {
        self.in_transaction = true;
        let uses = self
            .client
            .as_ref()
            .map_or(0, |client| Object::metrics(client).recycle_count);
        if replans_at(uses) {
            sql::BEGIN_LEASE_REPLANNED
        } else {
            sql::BEGIN_LEASE
        }
    }

    /// Marks the transaction finished (its `COMMIT` was acknowledged).
    pub fn committed(&mut self) {
        self.in_transaction = false;
    }

    /// Counts one pipelined flight of requests that was awaited.
    pub fn round_trip(&self) {
        self.shared.count_round_trip();
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        if !self.in_transaction {
            return;
        }
        let Some(client) = self.client.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let rolled_back =
                        tokio::time::timeout(ROLLBACK_TIMEOUT, client.batch_execute(sql::ROLLBACK))
                            .await
                            .is_ok_and(|result| result.is_ok());
                    if !rolled_back {
                        // Never hand a connection in an unknown transaction state to the next
                        // request: closing it makes the server abort the transaction.
                        drop(Object::take(client));
                    }
                });
            }
            // No runtime to roll back on: close the connection instead.
            Err(_) => drop(Object::take(client)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_drops_its_plans_once_every_replan_every_uses_and_never_when_fresh() {
        assert!(!replans_at(0));
        let replanned: Vec<usize> = (0..=3 * sql::REPLAN_EVERY)
            .filter(|&uses| replans_at(uses))
            .collect();
        assert_eq!(
            replanned,
            [
                sql::REPLAN_EVERY,
                2 * sql::REPLAN_EVERY,
                3 * sql::REPLAN_EVERY
            ]
        );
    }
}

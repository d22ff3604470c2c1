//! The in-transaction order (GitLab's Cells ADR 021, docs/cell-integration.md §2b) for the cells
//! on PostgreSQL: local BEGIN, the record's change, BeginUpdate naming the transaction
//! (`local_transaction`), the lease row, the staleness guard, COMMIT, then CommitUpdate.
//!
//! Without a crash the real helper runs (`topology_claims_postgres::cell::
//! transact_in_transaction`). With one, the phases run one by one. A crash after BeginUpdate
//! or after the lease row happens inside the open local transaction, as a process's death
//! would: the transaction is never ended by the client, its connection is closed, and
//! PostgreSQL ends it as `aborted`. The cell's reconciler must then free the lease at its next
//! pass (decision 080); `recovery.rs` measures when it does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use topology_claims::LeaseId;
use topology_claims_client::{LocalEnd, PendingUpdate, TransactionError};
use topology_claims_postgres::cell::{local_transaction_of, transact_in_transaction};
use topology_claims_postgres::{record_in, tokio_postgres};

use super::{begin_answer, refusal, Crash, Db, SimCell};
use crate::history::{Answer, Call, TxOp};
use crate::local::CellLeases;
use crate::model;

impl SimCell {
    /// One claim transaction of a PostgreSQL cell, crashing as asked.
    pub(super) async fn in_transaction(
        &mut self,
        op: TxOp,
        key: u32,
        crash: Option<Crash>,
    ) -> Answer {
        match crash {
            None => self.in_transaction_whole(op, key).await,
            Some(crash) => self.in_transaction_phases(op, key, crash).await,
        }
    }

    async fn in_transaction_whole(&mut self, op: TxOp, key: u32) -> Answer {
        let (index, history) = (self.index, Arc::clone(&self.ctx.history));
        let lease = LeaseId::generate();
        let (Db::Postgres(conn), CellLeases::Postgres(leases)) = (&mut self.db, &self.leases)
        else {
            unreachable!("the in-transaction order runs on PostgreSQL cells")
        };
        let db = match conn.get().await {
            Ok(db) => db,
            Err(error) => return local_unreachable(index, &error),
        };
        // When BeginUpdate was about to be sent (0: never, the local write failed first).
        let sent_at = AtomicU64::new(0);
        let result = transact_in_transaction(
            &self.client,
            db,
            leases,
            self.ctx.update.clone(),
            |tx| Box::pin(write_record(tx, op, key, lease)),
            |_| {
                sent_at.store(history.now(), Ordering::Relaxed);
                model::request(index, lease, op, key)
            },
        )
        .await;
        let ended = history.now();
        match sent_at.load(Ordering::Relaxed) {
            0 => {
                // Nothing reached the service: the record's own change failed (a create of a
                // key the cell holds, a connection lost).
                if let Err(error) = result {
                    tracing::debug!(cell = index, %error, "local write failed before BeginUpdate");
                }
                self.ctx
                    .tally
                    .add("ended: local write failed before BeginUpdate");
                Answer::Unknown
            }
            // The helper names the transaction after building the request: a local failure
            // may come before BeginUpdate was sent (naming failed: the connection is gone) or
            // after it was answered (the lease row, the COMMIT). Whether it took effect is
            // unknown, as is the clean-up rollback.
            sent if matches!(result, Err(TransactionError::Local(_))) => {
                if let Err(error) = result {
                    tracing::warn!(cell = index, %error, "local transaction failed");
                }
                let (begin, rollback) = (
                    Call::Begin { lease, op, key },
                    Call::Rollback { lease, key },
                );
                history.push(index, begin, sent, Some(ended), Answer::Unknown);
                history.push(index, rollback, sent, Some(ended), Answer::Unknown);
                self.ctx.tally.add("ended: local transaction failed");
                Answer::Ok
            }
            // BeginUpdate answered, and CommitUpdate or RollbackUpdate was sent, somewhere
            // between `sent` and `ended`.
            sent => self.settle(result, (lease, op, key), (sent, ended, sent, ended)),
        }
    }

    async fn in_transaction_phases(&mut self, op: TxOp, key: u32, crash: Crash) -> Answer {
        let (index, history) = (self.index, Arc::clone(&self.ctx.history));
        let lease = LeaseId::generate();
        let Db::Postgres(conn) = &mut self.db else {
            unreachable!("the in-transaction order runs on PostgreSQL cells")
        };
        let db = match conn.get().await {
            Ok(db) => db,
            Err(error) => return local_unreachable(index, &error),
        };
        let tx = match db.transaction().await {
            Ok(tx) => tx,
            Err(error) => return local_unreachable(index, &error.to_string()),
        };
        let mut request = model::request(index, lease, op, key);
        let named = async {
            write_record(&tx, op, key, lease).await?;
            local_transaction_of(&tx).await
        };
        match named.await {
            Ok(local) => request.local_transaction = Some(local),
            Err(error) => {
                tracing::debug!(cell = index, %error, "local write failed before BeginUpdate");
                self.ctx
                    .tally
                    .add("ended: local write failed before BeginUpdate");
                return Answer::Unknown;
            }
        }
        let id = history.invoke(index, Call::Begin { lease, op, key });
        let update = self.ctx.update.clone();
        let pending = match PendingUpdate::begin_in_transaction(&self.client, request, update).await
        {
            Ok(pending) => {
                history.complete(id, Answer::Ok);
                pending
            }
            Err(failure) => {
                drop(tx);
                let error = failure.settle().await;
                let answer = begin_answer(&error);
                history.complete(id, answer);
                self.ctx.tally.add(refusal(&error));
                return answer;
            }
        };
        let recorded = if crash == Crash::AfterBegin {
            Ok(())
        } else {
            record_in(&tx, lease).await
        };
        if matches!(crash, Crash::AfterBegin | Crash::InLocalTx) && recorded.is_ok() {
            // The process dies with its transaction open: no ROLLBACK is sent, the connection
            // closes, and PostgreSQL aborts the transaction.
            std::mem::forget(tx);
            self.crash_connection();
            drop(pending);
            self.ctx.recovery.crashed(index, lease, true);
            return self.crashed(crash);
        }
        let end = match recorded {
            Err(error) => {
                drop(tx);
                Some(LocalEnd::Failed(error.to_string()))
            }
            Ok(()) => match pending.check_fresh() {
                Err(elapsed) => {
                    drop(tx);
                    Some(LocalEnd::Stale { elapsed })
                }
                Ok(()) => match tx.commit().await {
                    Ok(()) => None,
                    Err(error) if error.as_db_error().is_some() => {
                        Some(LocalEnd::Failed(error.to_string()))
                    }
                    Err(error) => {
                        // The COMMIT may or may not have happened: the reconciler settles it.
                        tracing::warn!(cell = index, %error, "local commit indeterminate");
                        drop(pending);
                        self.ctx.tally.add("ended: local commit indeterminate");
                        return Answer::Ok;
                    }
                },
            },
        };
        if let Some(end) = end {
            let why = match &end {
                LocalEnd::Stale { .. } => "stale",
                _ => "local transaction failed",
            };
            let id = history.invoke(index, Call::Rollback { lease, key });
            let _: Result<_, TransactionError<String>> =
                pending.finish::<(), _, _>(end, &self.leases).await;
            history.complete(id, Answer::Unknown);
            self.ctx.tally.add(format!("ended: {why}, rolled back"));
            return Answer::Ok;
        }
        self.after_local_commit(pending, (lease, key), Some(crash), None)
            .await
    }

    /// Closes the application's connection without a goodbye, as the death of the process
    /// would; the next transaction connects again.
    fn crash_connection(&mut self) {
        if let Db::Postgres(conn) = &mut self.db {
            conn.close();
        }
    }
}

fn local_unreachable(cell: u16, error: &str) -> Answer {
    tracing::warn!(cell, %error, "the cell's PostgreSQL is unreachable; no transaction");
    Answer::Unknown
}

/// The application's change for this transaction (`cell::write_record` on PostgreSQL).
async fn write_record(
    tx: &tokio_postgres::Transaction<'_>,
    op: TxOp,
    key: u32,
    lease: LeaseId,
) -> Result<(), tokio_postgres::Error> {
    let key = key as i32;
    match op {
        TxOp::Create => tx
            .execute(
                "INSERT INTO records (key, lease_id, created_at) \
                 VALUES ($1, $2, extract(epoch FROM now())::bigint)",
                &[&key, &lease.to_string()],
            )
            .await
            .map(drop),
        TxOp::Destroy => tx
            .execute("DELETE FROM records WHERE key = $1", &[&key])
            .await
            .map(drop),
        TxOp::Update => Ok(()),
    }
}

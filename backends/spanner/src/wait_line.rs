//! The lease waiters' line on Spanner (`WaitLine`, decision 119): tables `lease_wait_tickets`
//! (one row, the last ticket given) and `lease_waits` of migration 0009. A join and a leave are
//! read-write transactions (the ticket row serializes the joins, so tickets grow in the order
//! waiters joined); a look ahead is a strong read-only snapshot, whose read timestamp is the
//! store's clock.

use std::collections::BTreeSet;
use std::time::Duration;

use async_trait::async_trait;
use gcloud_googleapis::spanner::v1::Mutation;
use gcloud_spanner::key::Key;
use gcloud_spanner::mutation::{delete, insert_or_update};
use gcloud_spanner::statement::Statement;
use topology_claims::codec::timestamp_to_pb;
use topology_claims::domain::waits::{Arrival, LineAhead};
use topology_claims::domain::{ClaimKey, Timestamp};
use topology_claims::ports::WaitLine;
use topology_claims::ClaimsError;

use crate::error::TxError;
use crate::rows::column;
use crate::store::SpannerClaimStore;
use crate::transaction::WriteTx;

const TICKETS: &str = "lease_wait_tickets";
const WAITS: &str = "lease_waits";

fn ticket_param(ticket: Arrival) -> i64 {
    i64::try_from(ticket).unwrap_or(i64::MAX)
}

/// A claim as one string: namespace ids never hold a newline, so the pair is unambiguous.
fn pair(claim: &ClaimKey) -> String {
    format!("{}\n{}", claim.namespace.as_str(), claim.value)
}

impl SpannerClaimStore {
    /// One attempt of a join: the ticket row (a new ticket only), the rows to go (the ticket's
    /// own, other tickets' expired ones), then the clock and the ticket's new rows.
    async fn join_attempt(
        &self,
        tx: &mut WriteTx,
        ticket: Option<Arrival>,
        claims: &BTreeSet<ClaimKey>,
        ttl: Duration,
    ) -> Result<Result<Arrival, ClaimsError>, TxError> {
        let mut mutations: Vec<Mutation> = Vec::with_capacity(claims.len() + 2);
        let ticket = match ticket {
            Some(ticket) => ticket_param(ticket),
            None => {
                let read = tx.read_row_with_option(
                    TICKETS,
                    &["last"],
                    Key::new(&0i64),
                    self.read_options(),
                );
                let row = self.options.within_rpc_timeout(read).await?;
                let last = row.map(|row| column::<i64>(&row, "last")).transpose()?;
                let next = last.unwrap_or(0) + 1;
                mutations.push(insert_or_update(TICKETS, &["id", "last"], &[&0i64, &next]));
                next
            }
        };
        let mut stmt = Statement::new(
            "SELECT namespace, claim_key, ticket FROM lease_waits
             WHERE ticket = @ticket OR expires_at <= CURRENT_TIMESTAMP()",
        );
        stmt.add_param("ticket", &ticket);
        let gone = self
            .query_in(tx, stmt, |row| {
                Ok((
                    column::<String>(row, "namespace")?,
                    column::<String>(row, "claim_key")?,
                    column::<i64>(row, "ticket")?,
                ))
            })
            .await?;
        let now = self.clock_in(tx).await?;
        if !gone.is_empty() {
            let keys: Vec<Key> = gone
                .iter()
                .map(|(namespace, key, ticket)| Key::composite(&[namespace, key, ticket]))
                .collect();
            mutations.push(delete(WAITS, keys));
        }
        let expires_at = timestamp_to_pb(now.saturating_add(ttl));
        for claim in claims {
            mutations.push(insert_or_update(
                WAITS,
                &["namespace", "claim_key", "ticket", "expires_at"],
                &[
                    &claim.namespace.as_str(),
                    &claim.value,
                    &ticket,
                    &expires_at,
                ],
            ));
        }
        tx.buffer_write(mutations);
        Ok(Ok(u64::try_from(ticket).unwrap_or_default()))
    }

    /// One attempt of a leave: the ticket's rows, deleted.
    async fn leave_attempt(
        &self,
        tx: &mut WriteTx,
        ticket: Arrival,
    ) -> Result<Result<(), ClaimsError>, TxError> {
        let mut stmt = Statement::new(
            "SELECT namespace, claim_key FROM lease_waits@{FORCE_INDEX=lease_waits_by_ticket}
             WHERE ticket = @ticket",
        );
        stmt.add_param("ticket", &ticket_param(ticket));
        let rows = self
            .query_in(tx, stmt, |row| {
                Ok((
                    column::<String>(row, "namespace")?,
                    column::<String>(row, "claim_key")?,
                ))
            })
            .await?;
        if !rows.is_empty() {
            let keys: Vec<Key> = rows
                .iter()
                .map(|(namespace, key)| Key::composite(&[namespace, key, &ticket_param(ticket)]))
                .collect();
            tx.buffer_write(vec![delete(WAITS, keys)]);
        }
        Ok(Ok(()))
    }
}

#[async_trait]
impl WaitLine for SpannerClaimStore {
    async fn join_wait_line(
        &self,
        ticket: Option<Arrival>,
        claims: &BTreeSet<ClaimKey>,
        ttl: Duration,
    ) -> Result<Arrival, ClaimsError> {
        let mut attempts = self.attempts("JoinWaitLine");
        let (answer, _) = loop {
            let Some(mut tx) = attempts.begin(&self.client).await? else {
                continue;
            };
            let result = self.join_attempt(&mut tx, ticket, claims, ttl).await;
            if let Some(done) = attempts.end(&mut tx, result).await? {
                break done;
            }
        };
        answer
    }

    async fn line_ahead(
        &self,
        ticket: Arrival,
        claims: &BTreeSet<ClaimKey>,
    ) -> Result<LineAhead, ClaimsError> {
        let context = "LineAhead";
        let (mut tx, now) = self.snapshot(context).await?;
        let mut stmt = Statement::new(
            "SELECT MAX(expires_at) AS latest FROM lease_waits
             WHERE ticket < @ticket AND CONCAT(namespace, '\\n', claim_key) IN UNNEST(@pairs)",
        );
        stmt.add_param("ticket", &ticket_param(ticket));
        stmt.add_param("pairs", &claims.iter().map(pair).collect::<Vec<_>>());
        let latest = self
            .query_all(&mut tx, stmt, context, |row| {
                let latest: Option<prost_types::Timestamp> = column(row, "latest")?;
                Ok(latest.map(|at| topology_claims::codec::timestamp_from_pb(&at)))
            })
            .await?;
        let latest_expiry: Option<Timestamp> = latest.into_iter().flatten().max();
        Ok(LineAhead { now, latest_expiry })
    }

    async fn leave_wait_line(&self, ticket: Arrival) -> Result<(), ClaimsError> {
        let mut attempts = self.attempts("LeaveWaitLine");
        let (answer, _) = loop {
            let Some(mut tx) = attempts.begin(&self.client).await? else {
                continue;
            };
            let result = self.leave_attempt(&mut tx, ticket).await;
            if let Some(done) = attempts.end(&mut tx, result).await? {
                break done;
            }
        };
        answer
    }
}

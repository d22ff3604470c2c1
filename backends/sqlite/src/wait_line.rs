//! The lease waiters' line on SQLite (`WaitLine`, decision 119): tables `lease_wait_tickets`
//! and `lease_waits` of migration 0009. A join and a leave are write transactions (BEGIN
//! IMMEDIATE, so serialized with every other write); a look ahead is a read transaction.

use std::collections::BTreeSet;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::Connection;
use topology_claims::domain::waits::{Arrival, LineAhead};
use topology_claims::domain::{ClaimKey, Timestamp};
use topology_claims::ports::WaitLine;
use topology_claims::ClaimsError;

use crate::error::StoreError;
use crate::store::SqliteClaimStore;

fn ticket_param(ticket: Arrival) -> i64 {
    i64::try_from(ticket).unwrap_or(i64::MAX)
}

fn join(
    tx: &Connection,
    ticket: Option<Arrival>,
    claims: &BTreeSet<ClaimKey>,
    ttl: Duration,
    now: Timestamp,
) -> Result<Arrival, StoreError> {
    let ticket = match ticket {
        Some(ticket) => {
            tx.prepare_cached("DELETE FROM lease_waits WHERE ticket = ?1")?
                .execute([ticket_param(ticket)])?;
            ticket_param(ticket)
        }
        None => {
            tx.prepare_cached("UPDATE lease_wait_tickets SET last = last + 1")?
                .execute([])?;
            tx.prepare_cached("SELECT last FROM lease_wait_tickets")?
                .query_row([], |row| row.get(0))?
        }
    };
    tx.prepare_cached("DELETE FROM lease_waits WHERE expires_at <= ?1 AND ticket <> ?2")?
        .execute((now.as_unix_micros(), ticket))?;
    let expires_at = now.saturating_add(ttl).as_unix_micros();
    let mut insert = tx.prepare_cached(
        "INSERT INTO lease_waits (namespace, claim_key, ticket, expires_at) \
         VALUES (?1, ?2, ?3, ?4)",
    )?;
    for claim in claims {
        insert.execute((
            claim.namespace.as_str(),
            claim.value.as_str(),
            ticket,
            expires_at,
        ))?;
    }
    Ok(u64::try_from(ticket).unwrap_or_default())
}

fn ahead(
    conn: &Connection,
    ticket: Arrival,
    claims: &BTreeSet<ClaimKey>,
    now: Timestamp,
) -> Result<LineAhead, StoreError> {
    let mut select = conn.prepare_cached(
        "SELECT max(expires_at) FROM lease_waits \
         WHERE namespace = ?1 AND claim_key = ?2 AND ticket < ?3",
    )?;
    let mut latest_expiry: Option<Timestamp> = None;
    for claim in claims {
        let latest: Option<i64> = select.query_row(
            (
                claim.namespace.as_str(),
                claim.value.as_str(),
                ticket_param(ticket),
            ),
            |row| row.get(0),
        )?;
        latest_expiry = latest_expiry.max(latest.map(Timestamp::from_unix_micros));
    }
    Ok(LineAhead { now, latest_expiry })
}

#[async_trait]
impl WaitLine for SqliteClaimStore {
    async fn join_wait_line(
        &self,
        ticket: Option<Arrival>,
        claims: &BTreeSet<ClaimKey>,
        ttl: Duration,
    ) -> Result<Arrival, ClaimsError> {
        let claims = claims.clone();
        self.write(move |tx, now| join(tx, ticket, &claims, ttl, now))
            .await
    }

    async fn line_ahead(
        &self,
        ticket: Arrival,
        claims: &BTreeSet<ClaimKey>,
    ) -> Result<LineAhead, ClaimsError> {
        let claims = claims.clone();
        self.read(move |conn, now| ahead(conn, ticket, &claims, now))
            .await
    }

    async fn leave_wait_line(&self, ticket: Arrival) -> Result<(), ClaimsError> {
        self.write(move |tx, _| {
            tx.prepare_cached("DELETE FROM lease_waits WHERE ticket = ?1")?
                .execute([ticket_param(ticket)])?;
            Ok(())
        })
        .await
    }
}

//! The lease waiters' line on PostgreSQL (`WaitLine`, decision 119): table `lease_waits` and
//! sequence `lease_wait_tickets` of migration 0008. Each call is one autocommit statement, one
//! round trip (a connection's first use adds one that prepares it).

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use topology_claims::domain::waits::{Arrival, LineAhead};
use topology_claims::domain::ClaimKey;
use topology_claims::ports::WaitLine;
use topology_claims::ClaimsError;

use crate::error::Failure;
use crate::rows;
use crate::session::Shared;
use crate::sql;
use crate::store::{internal, PostgresClaimStore};

/// The claims as the two arrays the statements unnest.
fn columns(claims: &BTreeSet<ClaimKey>) -> (Vec<&str>, Vec<&str>) {
    claims
        .iter()
        .map(|claim| (claim.namespace.as_str(), claim.value.as_str()))
        .unzip()
}

fn ticket_param(ticket: Arrival) -> i64 {
    i64::try_from(ticket).unwrap_or(i64::MAX)
}

async fn join(
    shared: &Shared,
    ticket: Option<Arrival>,
    claims: &BTreeSet<ClaimKey>,
    ttl: Duration,
) -> Result<Arrival, Failure> {
    let session = shared.session().await?;
    let [join] = session.prepare([sql::JOIN_WAIT_LINE]).await?;
    let (namespaces, keys) = columns(claims);
    let ttl = i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX);
    let row = session
        .client()?
        .query_one(
            &join,
            &[&ticket.map(ticket_param), &namespaces, &keys, &ttl],
        )
        .await?;
    session.round_trip();
    let ticket: i64 = row.try_get(0).map_err(internal)?;
    Ok(u64::try_from(ticket).unwrap_or_default())
}

async fn ahead(
    shared: &Shared,
    ticket: Arrival,
    claims: &BTreeSet<ClaimKey>,
) -> Result<LineAhead, Failure> {
    let session = shared.session().await?;
    let [ahead] = session.prepare([sql::LINE_AHEAD]).await?;
    let (namespaces, keys) = columns(claims);
    let row = session
        .client()?
        .query_one(&ahead, &[&ticket_param(ticket), &namespaces, &keys])
        .await?;
    session.round_trip();
    let now: SystemTime = row.try_get(0).map_err(internal)?;
    let latest: Option<SystemTime> = row.try_get(1).map_err(internal)?;
    Ok(LineAhead {
        now: rows::timestamp(now),
        latest_expiry: latest.map(rows::timestamp),
    })
}

async fn leave(shared: &Shared, ticket: Arrival) -> Result<(), Failure> {
    let session = shared.session().await?;
    let [leave] = session.prepare([sql::LEAVE_WAIT_LINE]).await?;
    session
        .client()?
        .execute(&leave, &[&ticket_param(ticket)])
        .await?;
    session.round_trip();
    Ok(())
}

#[async_trait]
impl WaitLine for PostgresClaimStore {
    async fn join_wait_line(
        &self,
        ticket: Option<Arrival>,
        claims: &BTreeSet<ClaimKey>,
        ttl: Duration,
    ) -> Result<Arrival, ClaimsError> {
        self.shared
            .run("JoinWaitLine", || join(&self.shared, ticket, claims, ttl))
            .await
    }

    async fn line_ahead(
        &self,
        ticket: Arrival,
        claims: &BTreeSet<ClaimKey>,
    ) -> Result<LineAhead, ClaimsError> {
        self.shared
            .run("LineAhead", || ahead(&self.shared, ticket, claims))
            .await
    }

    async fn leave_wait_line(&self, ticket: Arrival) -> Result<(), ClaimsError> {
        self.shared
            .run("LeaveWaitLine", || leave(&self.shared, ticket))
            .await
    }
}

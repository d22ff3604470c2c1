//! The claim store's reads (ListClaims, LookupClaim, ListOutstandingLeases, the lease
//! summary): one flight each, without a transaction. A lookup computes its key under the cached rules and reads the namespace's row
//! beside the claim, to check them (`namespaces.rs`, "why a checked cache").

use topology_claims::domain::{
    self, Claim, ClaimKey, ClaimsPage, ClaimsQuery, LeaseSummary, LeasesPage, LeasesQuery,
};
use topology_claims::ClaimsError;

use crate::error::Failure;
use crate::namespaces;
use crate::rows::{self, small};
use crate::sql;
use crate::store::internal;
use crate::store::PostgresClaimStore;

impl PostgresClaimStore {
    pub(crate) async fn list_claims_attempt(
        &self,
        query: &ClaimsQuery,
    ) -> Result<ClaimsPage, Failure> {
        let session = self.shared.session().await?;
        let [page] = session.prepare([sql::LIST_CLAIMS_AFTER]).await?;
        let client = session.client()?;
        let (record_id, claim_type, claim_value) = query.cursor.start_after();
        let fetch = i64::try_from(query.fetch_limit()).unwrap_or(i64::MAX);
        let page_rows = client
            .query(
                &page,
                &[
                    &query.cell_id.as_str(),
                    &small(query.table_name.store_number()),
                    &record_id,
                    &small(claim_type),
                    &claim_value,
                    &fetch,
                    &query.table_name.stored_name(),
                ],
            )
            .await?;
        session.round_trip();
        let claims = page_rows
            .iter()
            .map(rows::claim)
            .collect::<Result<Vec<Claim>, _>>()?;
        Ok(domain::claims_page(query, claims))
    }

    pub(crate) async fn lookup_attempt(&self, sent: &ClaimKey) -> Result<Claim, Failure> {
        let session = self.shared.session().await?;
        let [lookup, select_namespaces] = session
            .prepare([sql::LOOKUP_CLAIM, sql::SELECT_NAMESPACES])
            .await?;
        let (rules, key) = namespaces::rules_for(&self.namespaces, &session, |set| {
            domain::resolve_key(sent, set, "claim_value")
        })
        .await?;
        let client = session.client()?;
        let named = namespaces::id_param([key.namespace.clone()]);
        let (number, value) = (small(key.namespace_number()), key.value.as_str());
        let (row, namespace_rows) = tokio::try_join!(
            async { client.query_opt(&lookup, &[&number, &value]).await },
            async { client.query(&select_namespaces, &[&named]).await },
        )?;
        session.round_trip();
        self.namespaces
            .confirm_read(&rules, [key.namespace.clone()], &namespace_rows)?;
        match row {
            Some(row) => Ok(rows::claim(&row)?),
            None => Err(Failure::Final(ClaimsError::ClaimNotFound {
                claim: key.clone(),
            })),
        }
    }

    pub(crate) async fn list_leases_attempt(
        &self,
        query: &LeasesQuery,
    ) -> Result<LeasesPage, Failure> {
        let session = self.shared.session().await?;
        let [first, after, server_time] = session
            .prepare([
                sql::LIST_LEASES_FIRST,
                sql::LIST_LEASES_AFTER,
                sql::SERVER_TIME,
            ])
            .await?;
        let client = session.client()?;
        let cell = query.cell_id.as_str();
        // One row more than the page tells whether another page follows.
        let fetch = i64::try_from(query.fetch_limit()).unwrap_or(i64::MAX);
        let (page_rows, time_row) = tokio::try_join!(
            biased;
            async {
                match query.after {
                    None => client.query(&first, &[&cell, &fetch]).await,
                    Some(cursor) => client.query(&after, &[&cell, &fetch, cursor.as_uuid()]).await,
                }
            },
            async { client.query_one(&server_time, &[]).await },
        )?;
        session.round_trip();
        let leases = page_rows
            .iter()
            .map(rows::lease)
            .collect::<Result<Vec<_>, _>>()?;
        let server_time = rows::timestamp(time_row.try_get(0).map_err(internal)?);
        Ok(domain::leases_page(query, leases, server_time))
    }

    pub(crate) async fn lease_summary_attempt(&self) -> Result<LeaseSummary, Failure> {
        let session = self.shared.session().await?;
        let [summary] = session.prepare([sql::LEASE_SUMMARY]).await?;
        let client = session.client()?;
        let summary_rows = client.query(&summary, &[]).await?;
        session.round_trip();
        Ok(rows::lease_summary(&summary_rows)?)
    }
}

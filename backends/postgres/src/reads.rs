//! The claim store's reads of claims (ListClaims, LookupClaim): one flight each, without a
//! transaction. A lookup computes its key under the cached rules and reads the namespace's row
//! beside the claim, to check them (`namespaces.rs`, "why a checked cache").

use topology_claims::domain::{self, Claim, ClaimKey, ClaimsPage, ClaimsQuery};
use topology_claims::ClaimsError;

use crate::error::Failure;
use crate::namespaces;
use crate::rows::{self, small};
use crate::sql;
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
}

//! Where the verifier learns what a cell's records imply: the [`ClaimSource`] a cell implements
//! over its own database (the backends' query sources do), the claims it yields, and the shape
//! of a verify query.

use std::collections::HashSet;
use std::future::Future;

use topology_claims::domain::{ClaimRecord, LeaseId, TableName, Timestamp};
use topology_claims::error::ClaimsError;

/// A claim implied by a local record, with the record's creation time (local clock).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalClaim {
    pub record: ClaimRecord,
    pub created_at: Timestamp,
}

/// The columns a verify query returns, in this order (one row per claim).
pub const VERIFY_QUERY_COLUMNS: [&str; 6] = [
    "table_record_id",
    "claim_type",
    "claim_value",
    "owner_type",
    "owner_value",
    "created_at",
];

/// Refuses a verify query for `table` that returns `count` columns instead of
/// [`VERIFY_QUERY_COLUMNS`]: said as a count, before any row is read, rather than as the first
/// column that is missing or has the wrong type.
pub fn check_verify_query_columns(table: &TableName, count: usize) -> Result<(), ClaimsError> {
    if count == VERIFY_QUERY_COLUMNS.len() {
        return Ok(());
    }
    Err(ClaimsError::Configuration {
        message: format!(
            "verify query for table {table} returns {count} column{}; expected {}: {}",
            if count == 1 { "" } else { "s" },
            VERIFY_QUERY_COLUMNS.len(),
            VERIFY_QUERY_COLUMNS.join(", ")
        ),
    })
}

/// Where the verifier learns what the cell's records imply.
pub trait ClaimSource: Send + Sync {
    /// Every claim implied by the local records of `table` with `start <= id < end`.
    fn claims_in_range(
        &self,
        table: TableName,
        start: i64,
        end: i64,
    ) -> impl Future<Output = Result<Vec<LocalClaim>, ClaimsError>> + Send;

    /// Which of `lease_ids` the cell's `leases_outstanding` table holds: their local transactions
    /// committed, so the reconciler commits them, and the verifier's restore pass leaves them to
    /// it (decision 100, addendum). A source without the table holds none.
    fn leases_recorded(
        &self,
        lease_ids: &[LeaseId],
    ) -> impl Future<Output = Result<HashSet<LeaseId>, ClaimsError>> + Send {
        let _ = lease_ids;
        async { Ok(HashSet::new()) }
    }
}

impl<T: ClaimSource> ClaimSource for &T {
    fn claims_in_range(
        &self,
        table: TableName,
        start: i64,
        end: i64,
    ) -> impl Future<Output = Result<Vec<LocalClaim>, ClaimsError>> + Send {
        (**self).claims_in_range(table, start, end)
    }

    fn leases_recorded(
        &self,
        lease_ids: &[LeaseId],
    ) -> impl Future<Output = Result<HashSet<LeaseId>, ClaimsError>> + Send {
        (**self).leases_recorded(lease_ids)
    }
}

//! The ClaimStore contract, one behaviour per function, grouped by the call it is about. Every
//! adapter runs all of them through [`claim_store_conformance!`](crate::claim_store_conformance);
//! each gets a fresh, empty store.
//!
//! The cases are re-exported here, so the macro names each one as `conformance::<case>`
//! whichever module it lives in.

use topology_claims::domain::{BeginUpdate, CellId, ClaimKey, ClaimState, LeasesPage, LeasesQuery};
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;

mod admin;
mod begin;
mod end;
mod group;
mod lease_ids;
mod lists;
mod lookup;
mod namespaces;
mod outcomes;
mod renew;
mod restore;
mod slots;
mod updates;
mod wait_line;
mod watch;

pub use admin::*;
pub use begin::*;
pub use end::*;
pub use group::*;
pub use lease_ids::*;
pub use lists::*;
pub use lookup::*;
pub use namespaces::*;
pub use outcomes::*;
pub use renew::*;
pub use restore::*;
pub use slots::*;
pub use updates::*;
pub use wait_line::*;
pub use watch::*;

/// Who holds `key` and in which state, or `None` when the store says CLAIM_NOT_FOUND.
async fn state_of(store: &impl ClaimStore, key: &ClaimKey) -> Option<(String, ClaimState)> {
    match store.lookup_claim(key).await {
        Ok(claim) => Some((claim.cell_id.to_string(), claim.state())),
        Err(ClaimsError::ClaimNotFound { .. }) => None,
        Err(other) => panic!("lookup of {key} failed: {other}"),
    }
}

/// The first page (up to 100) of `cell_id`'s outstanding leases.
async fn leases_of(store: &impl ClaimStore, cell_id: &CellId) -> LeasesPage {
    let query = LeasesQuery::new(cell_id.clone(), None, 100);
    store
        .list_outstanding_leases(&query)
        .await
        .expect("list_outstanding_leases")
}

/// Begins and commits `request`: the claims end up active.
async fn committed(store: &impl ClaimStore, request: BeginUpdate) {
    let cell_id = request.cell_id.clone();
    let lease = store.begin_update(request).await.expect("begin_update");
    store
        .commit_update(&cell_id, lease.lease_id)
        .await
        .expect("commit_update");
}

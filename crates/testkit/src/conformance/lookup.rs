//! LookupClaim: a claim is routable from the moment it is leased for creation, and an absent claim
//! is not found.

use crate::fixtures::{cell, creates, key, route};
use topology_claims::domain::{ClaimState, ClaimType, LeaseOp};
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;

pub async fn created_claims_are_routable_while_creating(store: &impl ClaimStore) {
    let a = cell("cell-a");
    let lease = store
        .begin_update(creates(&a, &[route("group/project")]))
        .await
        .unwrap();
    let claim = store
        .lookup_claim(&route("group/project").key)
        .await
        .unwrap();
    assert_eq!(claim.state(), ClaimState::Creating);
    assert_eq!(claim.cell_id, a);
    assert_eq!(
        claim.lease.map(|l| (l.lease_id, l.op)),
        Some((lease.lease_id, LeaseOp::Create))
    );
}

pub async fn lookup_of_absent_claim_is_not_found(store: &impl ClaimStore) {
    let absent = key(ClaimType::Email, "ghost@example.com");
    assert_eq!(
        store.lookup_claim(&absent).await.unwrap_err(),
        ClaimsError::ClaimNotFound { claim: absent }
    );
}

//! The shared ClaimStore suite and model-based property test once more, through the real gRPC
//! server and client (`testing::GrpcClaimStore`) over the in-memory store: every case must give
//! the same answer over the wire as it gives on the store itself. Fewer model cases than the
//! memory run: each history starts its own server.

use topology_claims::memory::MemoryClaimStore;
use topology_claims_testkit::{GrpcClaimStore, GrpcStoreGuard};

async fn store() -> (GrpcClaimStore, GrpcStoreGuard<()>) {
    GrpcClaimStore::serve((MemoryClaimStore::new(), ())).await
}

topology_claims_testkit::claim_store_conformance!(store, model_cases = 32);
topology_claims_testkit::claim_store_watch_conformance!(store, reads_only);

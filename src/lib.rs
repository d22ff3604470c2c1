//! # topology-claims
//!
//! Globally unique claims (usernames, emails, routes, …) owned by exactly one *cell* of a
//! cell-based platform, coordinated with the lease-first, commit-later protocol:
//!
//! 1. `BeginUpdate` leases a batch of claim creates and destroys in one store transaction;
//! 2. the cell commits its local transaction, recording the lease id in `leases_outstanding`;
//! 3. `CommitUpdate` (or `RollbackUpdate`) finalises the lease. Both are idempotent.
//!
//! The crate is the core: the pure lease state machine ([`domain`]), the storage ports
//! ([`ports`]), the in-memory reference adapters ([`memory`]), the stored lease codec and the
//! protobuf messages ([`pb`]). It carries no transport. The other crates, by role (decision 105):
//!
//! - `topology-claims-proto`: the tonic service stubs, pb ↔ domain, errors ↔ gRPC status;
//! - `topology-claims-client`: what a cell links (client, three-phase transaction, reconciler,
//!   verifier);
//! - `topology-claims-server`: the gRPC front end, authorization, audit, limits, metrics;
//! - `topology-claims-testkit`: the conformance and model-based suites every store passes.

pub mod codec;
pub mod config;
pub mod domain;
pub mod error;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod memory;
pub mod migrations;
pub mod pb;
pub mod ports;
pub mod transfer;

pub use domain::{
    BeginUpdate, CellId, Claim, ClaimKey, ClaimLease, ClaimRecord, ClaimState, ClaimType,
    ClaimsCursor, ClaimsPage, ClaimsQuery, Lease, LeaseId, LeaseOp, LeaseOutcome, LeasesPage,
    LeasesQuery, LocalTransaction, LocalTxStatus, OwnerType, PgLocalTransaction, TableName,
    Timestamp,
};
pub use error::ClaimsError;
pub use ports::{
    ClaimStore, Clock, LocalLease, LocalLeaseStore, LocalLock, MigrationPolicy, PoolStatus,
    SystemClock,
};

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
//! ([`ports`]), the in-memory reference adapters ([`memory`]) and the gRPC front end ([`grpc`]).
//! Storage backends live in their own crates and prove themselves with the shared suite in
//! `testing` (feature `testing`).

pub mod auth;
pub mod cell;
pub mod codec;
pub mod config;
pub mod domain;
pub mod error;
pub mod group;
pub mod grpc;
pub mod memory;
pub mod metrics;
pub mod migrations;
pub mod pb;
pub mod ports;
pub mod restore;
#[cfg(feature = "testing")]
pub mod testing;

pub use domain::{
    BeginUpdate, CellId, Claim, ClaimKey, ClaimLease, ClaimRecord, ClaimState, ClaimType,
    ClaimsCursor, ClaimsPage, ClaimsQuery, Lease, LeaseId, LeaseOp, LeaseOutcome, LeasesPage,
    LeasesQuery, LocalTransaction, LocalTxStatus, OwnerType, PgLocalTransaction, TableName,
    Timestamp,
};
pub use error::ClaimsError;
pub use ports::{
    ClaimStore, Clock, LocalLease, LocalLeaseStore, LocalLock, MigrationPolicy, SystemClock,
};

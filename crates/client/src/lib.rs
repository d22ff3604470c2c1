//! # topology-claims-client
//!
//! What a cell links: the cell side of the protocol. The gRPC client (and its TLS settings), the
//! three-phase transaction handle, the reconciler and the verifier. Generic over the cell's
//! local database through the `LocalLeaseStore` / `LocalLock` ports and the verifier's
//! `ClaimSource`; the store backends (`topology-claims-sqlite`, `topology-claims-postgres`)
//! provide the closure-style wrappers for theirs.
//!
//! ```toml
//! [dependencies]
//! topology-claims-client = "0.1"
//! topology-claims-sqlite = "0.1"   # or topology-claims-postgres: the cell's own database
//! ```
//!
//! Links nothing of the server (decision 105): feature `metrics` (off by default) adds the
//! sidecars' Prometheus series.
//!
//! Must not contain SQL or know any particular local database.

mod backoff;
pub mod client;
pub mod decode;
#[cfg(feature = "metrics")]
pub mod metrics;
pub mod reconciler;
mod restore_pass;
pub mod slot;
mod source;
pub mod tls;
pub mod update;
pub mod verifier;
mod verify_report;
pub mod watch;

pub use backoff::Backoff;
pub use client::{ClaimsClient, ClientConfig, LeasedRetry};
pub use reconciler::{ReconcileReport, Reconciler, ReconcilerConfig};
pub use slot::{HeldSlot, SlotEvent, SlotSettings};
pub use tls::{server_endpoint, ClientTls, TlsFiles};
pub use update::{
    BeginFailure, CommitOutcome, LocalEnd, PendingUpdate, TransactionError, UpdateConfig,
};
pub use verifier::{
    check_verify_query_columns, ClaimSource, Discrepancy, LocalClaim, Verifier, VerifierConfig,
    VerifyReport, VERIFY_QUERY_COLUMNS,
};
pub use watch::{ClaimsWatch, WatchBatch, WatchRequest};

/// The core's types a cell names: what it claims, for whom, and the errors it may get back.
pub use topology_claims::{
    BeginUpdate, CellId, Claim, ClaimKey, ClaimLease, ClaimRecord, ClaimState, ClaimType,
    ClaimsError, Lease, LeaseId, LeaseOp, LocalLease, LocalLeaseStore, LocalLock, LocalTransaction,
    LocalTxStatus, OwnerType, TableName, Timestamp,
};

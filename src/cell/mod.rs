//! The cell side of the protocol: the gRPC client (and its TLS settings), the three-phase
//! transaction handle, the reconciler and the verifier. Generic over the cell's local database
//! through the `LocalLeaseStore` / `LocalLock` ports and the verifier's `ClaimSource`.
//!
//! Must not contain SQL or know any particular local database; backend crates provide the
//! closure-style wrappers for theirs.

mod backoff;
pub mod client;
pub mod reconciler;
mod restore_pass;
pub mod slot;
pub mod tls;
pub mod update;
pub mod verifier;
mod verify_report;

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

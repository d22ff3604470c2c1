//! The pure lease state machine: types, validation and the decisions of begin / commit /
//! rollback / renew, the administrative decisions (force rollback, decommission), the paging rules of the list calls, the reconciler's decision for a lease missing locally, the fleet-wide verification slots, the restore epochs and their quarantine, the claim namespaces and their rules, plus [`Tables`], the reference
//! semantics over in-memory tables.
//!
//! Owns every protocol rule. Must not do I/O, be async, or read a clock: time is an input.

pub mod admin;
pub mod decide;
pub mod events;
pub mod group;
mod names;
pub mod namespaces;
pub mod pages;
pub mod reconcile;
pub mod resolve;
pub mod restore;
pub mod slots;
mod tables;
mod types;
pub mod waits;

pub use admin::{
    check_not_decommissioned, decide_decommission, decommission_batch, force_rollback_selection,
    CellLeases, DecommissionPlan, DecommissionState, DecommissionStep, LeaseSummary,
    DECOMMISSION_DEFAULT_BATCH, DECOMMISSION_MAX_BATCH,
};
pub use decide::{
    check_batch, check_batch_size, check_claim, check_claims, decide_begin, decide_commit,
    decide_renew, decide_rollback, lease_is_stale, lease_unrenewed_for, outcome_expired, BeginPlan,
    BeginWrites, ClaimConflict, ClaimConflicts, EndPlan, EndWrites, CLAIM_LEASED_RETRY_AFTER,
    DEFAULT_MAX_BATCH, MAX_LISTED_CONFLICTS,
};
pub use events::{
    check_watch_start, ClaimEvent, EventPosition, EventsPage, EventsQuery, LogBounds,
    DEFAULT_WATCH_MAX_EVENTS, DEFAULT_WATCH_RETENTION, EVENTS_READ_LIMIT,
};
pub use group::{
    decide_group, namespaces_named, GroupAnswer, GroupDecision, GroupOp, GroupReads, GroupResults,
    GroupSnapshot, GroupWrites, DEFAULT_GROUP_MAX, DEFAULT_GROUP_MAX_CLAIMS,
};
pub use namespaces::{
    decide_namespace_update, prove_rules, KeyRules, NamePattern, Namespace, NamespaceChange,
    NamespaceId, NamespaceSpec, NamespaceUpdate, Normalization, ProofClaim, Rekey, ValueRefusal,
    ValueRule, BUILTIN_NAMESPACES, DEFAULT_MAX_NAMESPACES,
};
pub use pages::{
    check_claims_page_followable, claim_encoded_len_bound, claims_page, claims_page_order,
    lease_encoded_len_bound, leases_page, page_limit, LeasesPageBuilder, CLAIMS_DEFAULT_LIMIT,
    CLAIMS_MAX_LIMIT, DEFAULT_MAX_RESPONSE_BYTES, LEASES_DEFAULT_LIMIT, LEASES_MAX_LIMIT,
    LEASES_READ_CHUNK, PAGE_TOKEN_MAX_LEN,
};
pub use reconcile::{
    decide_absent_lease, local_transaction_to_ask, AbsentLeaseAction, LocalTxStatus,
    EARLY_ROLLBACK_UNRENEWED_FOR,
};
pub use resolve::{
    check_creates, decide_adoption, decide_create_namespace, decide_delete_namespace,
    decide_rules_change, pending_builtin, prepare_begin, resolve_begin, resolve_key,
    resolve_record, Adoption, NamespaceRow, NamespaceSet, RulesChange, StoredNamespace,
    ADOPTION_PENDING_VERSION,
};
pub use restore::{
    check_granted, check_quarantine, decide_lift, decide_mark_restored, decide_report,
    decide_restored_lease, lease_predates_restore, quarantine_active, MarkRestored, ReportPlan,
    RestoreEpoch, RestoreView, RestoredLeaseAction, RESTORE_QUARANTINE_RETRY_AFTER,
};
pub use slots::{
    decide_acquire, decide_release, slot_ttl, AcquirePlan, SlotCap, SlotGrant, SlotHolder,
    SlotLimit, SlotRow, DEFAULT_MAX_CONCURRENT_VERIFICATIONS, DEFAULT_MAX_VERIFICATIONS_PER_CELL,
    DEFAULT_VERIFICATION_SLOT_TTL,
};
pub use tables::Tables;
pub use types::*;

//! The pure lease state machine: types, validation and the decisions of begin / commit /
//! rollback / renew, plus [`Tables`], the reference semantics over in-memory tables.
//!
//! Owns every protocol rule. Must not do I/O, be async, or read a clock: time is an input.

pub mod decide;
mod tables;
mod types;

pub use decide::{
    check_batch, check_claim, decide_begin, decide_commit, decide_renew, decide_rollback,
    finish_claims_page, lease_is_stale, leases_page, outcome_expired, page_limit, plan_claims_page,
    BeginPlan, BeginWrites, ClaimsPagePlan, EndPlan, EndWrites, CLAIMS_DEFAULT_LIMIT,
    CLAIMS_MAX_LIMIT, DEFAULT_MAX_BATCH, LEASES_DEFAULT_LIMIT, LEASES_MAX_LIMIT,
};
pub use tables::Tables;
pub use types::*;

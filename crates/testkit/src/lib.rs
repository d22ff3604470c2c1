//! # topology-claims-testkit
//!
//! The shared test suite every adapter must pass, for this workspace's backends and for anyone
//! writing a store of their own (a dev-dependency):
//!
//! - [`conformance`]: one async function per behaviour of the [`ClaimStore`](topology_claims::ClaimStore)
//!   contract (every row of the status table, atomicity, idempotency, ownership, renewal,
//!   lookup states, ListClaims tiling, the byte budget of list pages), run by [`claim_store_conformance!`](crate::claim_store_conformance);
//! - [`model`]: a model-based property test — random command sequences from several cells over a
//!   small key space, run against [`Tables`](topology_claims::domain::Tables) and the adapter side by side;
//! - [`local`]: the [`LocalLeaseStore`](topology_claims::LocalLeaseStore) contract;
//! - feature `grpc` (links the server and the client crates): `server`, an in-process gRPC
//!   server on an ephemeral port for end-to-end tests; `grpc_store`, a `ClaimStore` that goes
//!   through that server and a real client, to run the suite once more over the wire; `cell`,
//!   the cell-side scenarios every local store runs; and `grouped`, the suite behind the
//!   server's group-commit combiner.
//!
//! Owns test scaffolding only; never used by production code paths.

#[cfg(feature = "grpc")]
use topology_claims::ClaimStore;
#[cfg(feature = "grpc")]
use topology_claims_server::group::{GroupCommit, GroupConfig};

#[cfg(feature = "grpc")]
pub mod cell;
pub mod conformance;
#[cfg(feature = "grpc")]
pub mod grpc_store;
pub mod local;
pub mod migrations;
pub mod model;
#[cfg(feature = "grpc")]
pub mod race;
#[cfg(feature = "grpc")]
pub mod server;

/// Small builders of cells, claims and requests with readable names (the core's, feature
/// `fixtures`).
pub use topology_claims::fixtures;

#[cfg(feature = "grpc")]
pub use grpc_store::{GrpcClaimStore, GrpcStoreGuard};
pub use local::LocalLeaseFixture;
#[cfg(feature = "grpc")]
pub use server::TestServer;

/// A conformance factory's `(store, guard)` with the store behind the group-commit combiner
/// (`serve --group-commit on`), so the whole suite and the model test run through
/// `ClaimStore::run_group`: every BeginUpdate, CommitUpdate and RollbackUpdate is a group.
#[cfg(feature = "grpc")]
pub fn grouped<S: ClaimStore, G>((store, guard): (S, G)) -> (GroupCommit, G) {
    let config = GroupConfig {
        // Even a lone call is a group: the suites prove `run_group`.
        lone_direct: false,
        ..GroupConfig::default()
    };
    let combiner = GroupCommit::new(std::sync::Arc::new(store), config);
    (combiner, guard)
}

/// Runs a future to completion on a fresh multi-threaded runtime (the macros use it so that
/// backend test crates need no runtime set-up of their own).
pub fn run_async<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime for the test")
        .block_on(future)
}

/// Expands to one `#[test]` per [`conformance`] case plus the model-based property test.
///
/// The factory contract: `$factory().await` returns `(store, guard)`, where `store` is a fresh,
/// empty, isolated [`ClaimStore`](topology_claims::ClaimStore) and `guard` is any value that must stay
/// alive while the store is used (a temporary directory, a server, a container; `()` when there
/// is none). Each test (and each model-test history) calls the factory once, uses only `store`,
/// then drops `store` first and `guard` after it. The suite never looks inside the guard.
///
/// ```text
/// async fn store() -> (MyStore, TempDir) {
///     let dir = TempDir::new().unwrap();
///     (MyStore::open_fresh(dir.path()).await, dir)
/// }
/// topology_claims_testkit::claim_store_conformance!(store);
/// topology_claims_testkit::claim_store_conformance!(store, model_cases = 16); // fewer model cases
/// ```
#[macro_export]
macro_rules! claim_store_conformance {
    ($factory:path) => {
        $crate::claim_store_conformance!($factory, model_cases = 48);
    };
    ($factory:path, model_cases = $cases:expr) => {
        mod claim_store_conformance {
            #[allow(unused_imports)]
            use super::*;
            $crate::__claim_store_cases!(
                $factory;
                begin_then_commit_makes_claims_active,
                begin_returns_the_lease_payload_with_the_original_request,
                created_claims_are_routable_while_creating,
                create_of_committed_claim_is_taken,
                every_refused_claim_of_a_batch_is_listed,
                create_of_leased_claim_is_temporarily_refused,
                destroy_of_leased_claim_is_temporarily_refused,
                destroy_of_absent_claim_is_not_found,
                destroy_of_another_cells_claim_is_denied,
                claim_twice_in_one_batch_is_a_batch_conflict,
                empty_batch_is_invalid,
                failed_batch_changes_nothing,
                first_failing_claim_in_request_order_decides,
                commit_is_idempotent,
                commit_deletes_destroyed_claims_and_frees_them,
                commit_of_unknown_lease_is_not_found,
                commit_of_another_cells_lease_is_denied,
                commit_of_rolled_back_lease_fails,
                rollback_restores_destroys_and_frees_creates,
                rollback_is_idempotent,
                rollback_of_committed_lease_fails,
                rollback_of_unknown_lease_is_remembered,
                conditional_rollback_of_a_renewed_lease_is_refused_and_its_commit_succeeds,
                conditional_rollback_of_an_idle_lease_succeeds,
                begin_retried_with_same_lease_id_returns_same_lease,
                begin_with_same_lease_id_and_other_content_conflicts,
                begin_with_another_cells_lease_id_conflicts,
                begin_with_ended_lease_id_fails_with_its_outcome,
                local_transaction_is_kept_with_the_lease_and_is_part_of_its_content,
                renew_moves_last_renewed_at,
                renew_of_ended_unknown_or_foreign_lease_fails,
                list_outstanding_leases_pages_by_lease_id,
                list_outstanding_leases_pages_stop_before_the_byte_budget,
                list_claims_pages_tile_the_id_space,
                list_claims_split_a_record_larger_than_the_byte_budget,
                list_claims_includes_leased_claims_with_state,
                lookup_of_absent_claim_is_not_found,
                outcomes_are_forgotten_after_retention,
                many_claims_in_one_batch_are_all_or_nothing,
                lease_summary_counts_each_cells_outstanding_leases_and_its_oldest,
                decommission_is_refused_while_the_cell_has_outstanding_leases,
                decommission_dry_run_counts_and_changes_nothing,
                decommission_deletes_in_bounded_steps_and_leaves_other_cells_untouched,
                decommission_resumes_after_a_step_that_was_cut_short,
                a_decommissioned_cell_may_begin_nothing,
                verification_slots_are_granted_up_to_the_limit_then_refused_with_a_retry_hint,
                a_verification_slot_renewed_by_its_holder_lasts_longer,
                a_released_verification_slot_is_free_again,
                an_expired_verification_slot_is_free_again,
                a_verification_slot_is_released_only_by_its_holder,
                concurrent_acquires_never_exceed_the_limit,
                a_cell_at_its_verification_slot_cap_is_refused_while_other_cells_get_slots,
                update_commit_replaces_owner_and_record_in_place,
                free_form_owner_types_and_tables_are_kept_listed_and_updated,
                claims_are_counted_by_namespace_leased_ones_included,
                update_rollback_leaves_the_claim_as_it_was,
                update_refusals_come_in_the_order_of_destroys,
                a_key_in_two_of_creates_destroys_updates_is_a_batch_conflict,
                lookup_while_updating_shows_updating_with_the_old_values,
                a_create_racing_an_update_is_leased_then_taken,
                a_group_decides_each_operation_in_arrival_order,
                a_store_never_restored_has_no_epoch_and_refuses_reports_and_lifts,
                mark_restored_expects_every_cell_with_claims_or_leases_and_the_named_ones,
                a_mark_refuses_a_future_backup_time_and_an_empty_store_is_not_quarantined,
                the_last_expected_report_lifts_the_quarantine,
                an_operator_lift_ends_the_quarantine_once,
                concurrent_marks_number_distinct_consecutive_epochs,
                concurrent_reports_of_every_expected_cell_lift_the_quarantine,
                usernames_that_differ_in_case_or_width_are_one_claim,
                two_forms_of_one_name_in_a_batch_are_a_batch_conflict,
                a_value_outside_the_rules_is_refused_naming_field_namespace_and_rule,
                a_destroy_by_another_form_destroys_the_claim,
                a_replay_is_the_same_forms_and_another_form_conflicts,
                listed_claims_carry_their_key_and_display_form,
                namespaces_start_with_the_builtins_and_a_change_bumps_the_version,
                a_deprecated_namespace_refuses_creates_only_and_replays_stand,
                a_reserved_value_is_refused_to_creates_and_a_claimed_one_stays,
                a_tighter_rule_is_applied_only_when_every_claim_passes_it,
                a_normalization_change_rewrites_keys_unless_they_collide_or_are_leased,
                a_created_namespace_takes_claims_under_its_rules_and_is_deleted_only_empty,
            );
            #[test]
            fn model_based_property_test() {
                $crate::model::check_against_model(|| $factory(), $cases);
            }
        }
    };
}

/// The change-feed cases (`conformance::watch`), for every store. `reads_only` leaves out compaction, which only the server itself runs (the gRPC
/// suite).
#[macro_export]
macro_rules! claim_store_watch_conformance {
    ($factory:path) => {
        $crate::claim_store_watch_conformance!(
            $factory,
            reads_only,
            compaction_refuses_a_watch_below_it_and_names_the_oldest_kept_revision
        );
    };
    ($factory:path, reads_only $(, $more:ident)*) => {
        mod claim_store_watch_conformance {
            #[allow(unused_imports)]
            use super::*;
            $crate::__claim_store_cases!(
                $factory;
                every_change_of_a_claim_is_an_event_in_order_with_its_whole_state,
                the_events_of_one_transaction_share_one_revision,
                a_read_resumes_exactly_where_another_stopped,
                through_covers_what_was_read_and_a_later_write_lands_above_it,
                lookup_carries_the_revision_of_the_claims_last_change,
                $($more,)*
            );
        }
    };
}

/// The lease waiters' line cases (`conformance::wait_line`), for every store `serve` runs on
/// (not the gRPC suite: the line is the server's own).
#[macro_export]
macro_rules! claim_store_wait_line_conformance {
    ($factory:path) => {
        mod claim_store_wait_line_conformance {
            #[allow(unused_imports)]
            use super::*;
            $crate::__claim_store_cases!(
                $factory;
                the_wait_line_orders_waiters_by_ticket_on_their_claims,
                an_expired_place_in_the_wait_line_holds_no_one_up,
            );
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __claim_store_cases {
    ($factory:path; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::run_async(async {
                    // (store, guard): a tuple drops its fields in order, so the guard
                    // outlives the store.
                    let fresh = $factory().await;
                    $crate::conformance::$case(&fresh.0).await;
                });
            }
        )*
    };
}

/// Expands to one `#[test]` per [`local`] case, each calling `$fixture().await` for a fresh
/// [`LocalLeaseFixture`].
#[macro_export]
macro_rules! local_lease_store_conformance {
    ($fixture:path) => {
        mod local_lease_store_conformance {
            #[allow(unused_imports)]
            use super::*;
            $crate::__local_lease_cases!(
                $fixture;
                recorded_lease_appears_when_the_local_transaction_commits,
                recorded_lease_vanishes_when_the_local_transaction_rolls_back,
                recording_a_lease_twice_keeps_the_first_record,
                delete_removes_a_lease_once,
                find_returns_only_existing_leases,
                list_older_than_returns_old_leases_oldest_first,
            );
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __local_lease_cases {
    ($fixture:path; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::run_async(async {
                    let fixture = $fixture().await;
                    $crate::local::$case(&fixture).await;
                });
            }
        )*
    };
}

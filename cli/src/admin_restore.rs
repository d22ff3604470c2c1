//! `topology-claims admin mark-restored | lift-quarantine | restore-status`: the operator's side of
//! a restore of the claims store from a backup (docs/operations.md, "Disaster recovery";
//! decision 100). Owns the calls and the printing; every rule is the server's.

use clap::Args;
use tonic::transport::Channel;
use topology_claims_proto::pb::admin as apb;
use topology_claims_proto::pb::admin::admin_service_client::AdminServiceClient;

use crate::ops::describe;

#[derive(Args, Debug)]
pub struct MarkRestoredArgs {
    /// When the restored backup was taken, RFC 3339 (for point-in-time recovery: the recovery
    /// target), e.g. 2026-11-25T03:00:00Z. Not after the store's clock.
    #[arg(long)]
    backup_time: String,

    /// Why (written to the audit log and kept with the restore epoch). Required.
    #[arg(long)]
    reason: String,

    /// A cell to wait for besides those the restored store knows (repeat for several): a cell
    /// whose first claims came after the backup is not in it.
    #[arg(long = "expect-cell")]
    expect_cells: Vec<String>,

    /// Do not ask for confirmation.
    #[arg(long)]
    yes: bool,
}

#[derive(Args, Debug)]
pub struct LiftQuarantineArgs {
    /// The restore epoch to lift (`admin restore-status` shows it).
    #[arg(long)]
    epoch: u64,

    /// Why (written to the audit log and kept with the epoch). Required.
    #[arg(long)]
    reason: String,

    /// Do not ask for confirmation.
    #[arg(long)]
    yes: bool,
}

/// Prints a RestoreStatus for an operator.
fn print_status(status: &apb::RestoreStatus) {
    if !status.restored {
        println!("the store was never marked restored");
        return;
    }
    let time =
        |t: Option<&prost_types::Timestamp>| t.map_or_else(|| "-".to_owned(), |t| t.to_string());
    println!("restore epoch:   {}", status.epoch);
    println!("backup time:     {}", time(status.backup_time.as_ref()));
    println!("marked at:       {}", time(status.marked_at.as_ref()));
    println!("reason:          {}", status.reason);
    match &status.lifted_at {
        Some(at) => println!("quarantine:      lifted at {at}: {}", status.lift_reason),
        None => println!(
            "quarantine:      ON ({}): creates of claims that do not exist are refused with RESTORE_QUARANTINE",
            if status.quarantine_enforced {
                "enforced by this server"
            } else {
                "NOT enforced: this server runs with --restore-quarantine off"
            }
        ),
    }
    println!(
        "cells:           {} expected, {} reported, {} pending",
        status.expected_cells.len(),
        status.reported.len(),
        status.pending_cells.len()
    );
    for report in &status.reported {
        println!(
            "  reported  {:<24} {}",
            report.cell_id,
            time(report.reported_at.as_ref())
        );
    }
    for cell in &status.pending_cells {
        println!("  pending   {cell}  (its verifier has not finished a whole pass since the mark)");
    }
}

pub async fn mark_restored(
    mut client: AdminServiceClient<Channel>,
    args: MarkRestoredArgs,
) -> Result<bool, String> {
    let backup_time: prost_types::Timestamp = args.backup_time.parse().map_err(|e| {
        format!(
            "--backup-time {:?} is not an RFC 3339 time such as 2026-11-25T03:00:00Z: {e}",
            args.backup_time
        )
    })?;
    if !crate::confirm::can_proceed(args.yes, false) {
        return Ok(false);
    }
    let before = client
        .get_restore_status(apb::GetRestoreStatusRequest {})
        .await
        .map_err(|s| describe(&s))?
        .into_inner();
    eprintln!(
        "marking the claims store restored from a backup taken at {backup_time} (restore epoch {})",
        before.epoch + 1
    );
    eprintln!("until every cell's verifier has reported a whole pass, creates of claims that do not exist are refused (RESTORE_QUARANTINE)");
    if !crate::confirm::confirm("mark the store restored?", args.yes)? {
        return Ok(false);
    }
    let status = client
        .mark_restored(apb::MarkRestoredRequest {
            backup_time: Some(backup_time),
            reason: args.reason,
            expect_cells: args.expect_cells,
        })
        .await
        .map_err(|s| describe(&s))?
        .into_inner();
    print_status(&status);
    Ok(true)
}

pub async fn lift_quarantine(
    mut client: AdminServiceClient<Channel>,
    args: LiftQuarantineArgs,
) -> Result<bool, String> {
    if !crate::confirm::can_proceed(args.yes, false) {
        return Ok(false);
    }
    let before = client
        .get_restore_status(apb::GetRestoreStatusRequest {})
        .await
        .map_err(|s| describe(&s))?
        .into_inner();
    if !before.pending_cells.is_empty() && before.lifted_at.is_none() {
        eprintln!(
            "{} cell(s) have not re-verified: {}. A claim the restore lost from one of them may go to another cell once lifted.",
            before.pending_cells.len(),
            before.pending_cells.join(", ")
        );
    }
    if !crate::confirm::confirm(
        &format!("lift the quarantine of restore epoch {}?", args.epoch),
        args.yes,
    )? {
        return Ok(false);
    }
    let status = client
        .lift_quarantine(apb::LiftQuarantineRequest {
            epoch: args.epoch,
            reason: args.reason,
        })
        .await
        .map_err(|s| describe(&s))?
        .into_inner();
    print_status(&status);
    Ok(true)
}

pub async fn restore_status(mut client: AdminServiceClient<Channel>) -> Result<(), String> {
    let status = client
        .get_restore_status(apb::GetRestoreStatusRequest {})
        .await
        .map_err(|s| describe(&s))?
        .into_inner();
    print_status(&status);
    Ok(())
}

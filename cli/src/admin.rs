//! `topology-claims admin`: the operator's side of the AdminService (docs/operations.md,
//! runbooks). `leases` lists outstanding leases; `force-rollback` ends a downed cell's leases;
//! `decommission` deletes every claim of a cell that is gone for good; `mark-restored`,
//! `lift-quarantine` and `restore-status` are a restore's (`admin_restore`); `namespaces` the
//! rules of the kinds of names claimed (`admin_namespaces`).
//!
//! The acting commands first ask the server for a dry run and show what will happen, then ask
//! for confirmation (unless `--yes`) and show progress while they work in bounded calls. Owns
//! the calls and the printing; every rule is the server's.

use crate::confirm::confirm;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use tonic::transport::Channel;
use topology_claims::config::{format_duration, parse_duration};
use topology_claims_proto::convert::duration_to_pb;
use topology_claims_proto::pb::admin as apb;
use topology_claims_proto::pb::admin::admin_service_client::AdminServiceClient;
use topology_claims_proto::status::from_status;

use crate::client_tls::TlsArgs;
use crate::ops::{channel, describe};

#[derive(Args, Debug)]
pub struct AdminArgs {
    /// The server's URL: http://HOST:PORT (plaintext: only from loopback), or https://HOST:PORT
    /// with --tls-ca and an admin certificate (spiffe://TRUST_DOMAIN/admin/NAME).
    #[arg(
        long,
        env = "TOPOLOGY_CLAIMS_SERVER",
        default_value = "http://127.0.0.1:50051",
        global = true
    )]
    server: String,

    #[command(flatten)]
    tls: TlsArgs,

    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(Subcommand, Debug)]
enum AdminCommand {
    /// List outstanding leases (of one cell, or of all), with their age and the time since
    /// their last renewal, by the server's clock.
    Leases(ListArgs),
    /// Roll back a downed cell's outstanding leases: its creates are deleted and its destroys
    /// released, and the cell's late CommitUpdate gets LEASE_ROLLED_BACK. A lease renewed within
    /// --older-than (a live cell) is never rolled back.
    ForceRollback(ForceRollbackArgs),
    /// Delete every claim of a cell that is gone for good, in batches; the cell's later
    /// BeginUpdate is refused (CELL_DECOMMISSIONED). Refused while the cell has outstanding
    /// leases (force-rollback them first). Safe to run again after an interruption.
    Decommission(DecommissionArgs),
    /// Record that the claims store was restored from a backup: a new restore epoch. Until every
    /// cell with claims has reported a whole verification pass, creates of claims that do not
    /// exist are refused (RESTORE_QUARANTINE) and the reconcilers leave the leases outstanding
    /// at the mark to the verifiers. Run it right after the restore, before the cells return.
    MarkRestored(crate::admin_restore::MarkRestoredArgs),
    /// End the quarantine of a restore before every expected cell has reported (a cell that is
    /// gone, or a risk accepted).
    LiftQuarantine(crate::admin_restore::LiftQuarantineArgs),
    /// The latest restore: epoch, backup time, which cells reported, which are pending.
    RestoreStatus,
    /// The namespaces of the claims store (the kinds of names claimed) and their rules: list,
    /// get, create, update, delete.
    Namespaces(crate::admin_namespaces::NamespacesArgs),
}

#[derive(Args, Debug)]
struct ListArgs {
    /// Only this cell's leases. Default: every cell.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CELL_ID")]
    cell_id: Option<String>,

    /// Only leases not renewed for at least this long (since their last renewal, or creation if
    /// never renewed; the server's clock). Units: ms, s, m, h, d. Default: all.
    #[arg(long, value_parser = parse_duration)]
    older_than: Option<Duration>,
}

#[derive(Args, Debug)]
struct ForceRollbackArgs {
    /// The downed cell.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CELL_ID")]
    cell_id: String,

    /// Only leases not renewed for at least this long (since their last renewal, or creation if
    /// never renewed), judged by the store's clock in the transaction that rolls each back: a
    /// lease renewed within it is spared. Units: ms, s, m, h, d. Default: all.
    #[arg(long, value_parser = parse_duration)]
    older_than: Option<Duration>,

    /// Why (written to the audit log). Required.
    #[arg(long)]
    reason: String,

    /// Show what would be rolled back; change nothing.
    #[arg(long)]
    dry_run: bool,

    /// Do not ask for confirmation.
    #[arg(long)]
    yes: bool,
}

#[derive(Args, Debug)]
struct DecommissionArgs {
    /// The cell to decommission.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CELL_ID")]
    cell_id: String,

    /// Why (written to the audit log). Required.
    #[arg(long)]
    reason: String,

    /// Count the cell's claims; change nothing.
    #[arg(long)]
    dry_run: bool,

    /// Do not ask for confirmation.
    #[arg(long)]
    yes: bool,

    /// Claims deleted per call (one store transaction each), 1..=10000.
    #[arg(long, env = "TOPOLOGY_CLAIMS_DECOMMISSION_BATCH", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    batch_size: u32,
}

/// Exit statuses: done, not confirmed, error.
const NOT_CONFIRMED: u8 = 1;
const FAILED: u8 = 2;

pub async fn run(args: AdminArgs) -> ExitCode {
    let client = match channel(&args.server, &args.tls).await {
        Ok(channel) => AdminServiceClient::new(channel),
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(FAILED);
        }
    };
    let result = match args.command {
        AdminCommand::Leases(list) => leases(client, list).await,
        AdminCommand::ForceRollback(rollback) => force_rollback(client, rollback).await,
        AdminCommand::Decommission(decommission) => decommission_cell(client, decommission).await,
        AdminCommand::MarkRestored(mark) => crate::admin_restore::mark_restored(client, mark)
            .await
            .map(done_if),
        AdminCommand::LiftQuarantine(lift) => crate::admin_restore::lift_quarantine(client, lift)
            .await
            .map(done_if),
        AdminCommand::RestoreStatus => crate::admin_restore::restore_status(client)
            .await
            .map(|()| Outcome::Done),
        AdminCommand::Namespaces(namespaces) => crate::admin_namespaces::run(client, namespaces)
            .await
            .map(done_if),
    };
    match result {
        Ok(Outcome::Done) => ExitCode::SUCCESS,
        Ok(Outcome::NotConfirmed) => {
            eprintln!("not confirmed: nothing was changed");
            ExitCode::from(NOT_CONFIRMED)
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(FAILED)
        }
    }
}

enum Outcome {
    Done,
    NotConfirmed,
}

fn done_if(confirmed: bool) -> Outcome {
    if confirmed {
        Outcome::Done
    } else {
        Outcome::NotConfirmed
    }
}

fn failed(status: tonic::Status) -> String {
    describe(&status)
}

async fn leases(
    mut client: AdminServiceClient<Channel>,
    args: ListArgs,
) -> Result<Outcome, String> {
    let mut cursor = String::new();
    let mut count = 0usize;
    println!(
        "{:<36}  {:<20}  {:>10}  {:>10}  {:>7}  last_renewed_at",
        "lease_id", "cell_id", "age", "unrenewed", "claims"
    );
    let whole_seconds = |d: Option<&prost_types::Duration>| {
        let seconds = d.map_or(0, |d| d.seconds.max(0) as u64);
        format_duration(Duration::from_secs(seconds))
    };
    loop {
        let response = client
            .list_leases(apb::ListLeasesRequest {
                cell_id: args.cell_id.clone().unwrap_or_default(),
                older_than: args.older_than.map(duration_to_pb),
                cursor: cursor.clone(),
                limit: 0,
            })
            .await
            .map_err(failed)?
            .into_inner();
        for entry in &response.leases {
            let lease = entry.lease.as_ref();
            let payload = lease.and_then(|l| l.lease_payload.as_ref());
            let claims = payload
                .and_then(|p| p.original_request.as_ref())
                .map_or(0, |r| r.creates_claims.len() + r.destroys_claims.len());
            println!(
                "{:<36}  {:<20}  {:>10}  {:>10}  {:>7}  {}",
                payload.map_or("-", |p| p.lease_id.as_str()),
                payload.map_or("-", |p| p.cell_id.as_str()),
                whole_seconds(entry.age.as_ref()),
                whole_seconds(entry.unrenewed_for.as_ref()),
                claims,
                lease
                    .and_then(|l| l.last_renewed_at.as_ref())
                    .map_or_else(|| "-".to_owned(), ToString::to_string)
            );
            count += 1;
        }
        if response.next_cursor.is_empty() {
            break;
        }
        cursor = response.next_cursor;
    }
    eprintln!("{count} outstanding lease(s)");
    Ok(Outcome::Done)
}

async fn force_rollback(
    mut client: AdminServiceClient<Channel>,
    args: ForceRollbackArgs,
) -> Result<Outcome, String> {
    let request = |dry_run: bool| apb::ForceRollbackRequest {
        cell_id: args.cell_id.clone(),
        older_than: args.older_than.map(duration_to_pb),
        dry_run,
        reason: args.reason.clone(),
        limit: 0,
    };
    if !crate::confirm::can_proceed(args.yes, args.dry_run) {
        return Ok(Outcome::NotConfirmed);
    }
    // With --yes the command acts at once: a preview nobody reads is not made (nor audited).
    if !args.yes || args.dry_run {
        let plan = client
            .force_rollback(request(true))
            .await
            .map_err(failed)?
            .into_inner();
        let older = args
            .older_than
            .map(|d| format!(" not renewed for at least {}", format_duration(d)))
            .unwrap_or_default();
        for lease_id in &plan.lease_ids {
            println!("would roll back lease {lease_id}");
        }
        eprintln!(
            "cell {}: {}{} outstanding lease(s){older}, {} claim(s) in them",
            args.cell_id,
            plan.lease_ids.len(),
            if plan.more { "+" } else { "" },
            plan.claims
        );
        if args.dry_run || plan.lease_ids.is_empty() {
            return Ok(Outcome::Done);
        }
        if !confirm(
            &format!(
                "roll back these leases of cell {} (its creates are deleted, its destroys \
                 released)?",
                args.cell_id
            ),
            args.yes,
        )? {
            return Ok(Outcome::NotConfirmed);
        }
    }
    let (mut leases, mut claims, mut ended, mut renewed) = (0usize, 0u64, 0usize, 0usize);
    loop {
        let done = client
            .force_rollback(request(false))
            .await
            .map_err(failed)?
            .into_inner();
        for lease_id in &done.lease_ids {
            println!("rolled back lease {lease_id}");
        }
        leases += done.lease_ids.len();
        claims += done.claims;
        ended += done.already_ended_lease_ids.len();
        for lease_id in &done.renewed_lease_ids {
            println!("spared lease {lease_id}: renewed within --older-than");
        }
        renewed += done.renewed_lease_ids.len();
        eprintln!("progress: {leases} lease(s) rolled back, {claims} claim(s)");
        if !done.more || done.lease_ids.is_empty() {
            break;
        }
    }
    println!(
        "force-rollback {}: {leases} lease(s) rolled back ({claims} claims); {ended} ended by the \
         cell meanwhile; {renewed} renewed by the cell meanwhile (spared)",
        args.cell_id
    );
    Ok(Outcome::Done)
}

async fn decommission_cell(
    mut client: AdminServiceClient<Channel>,
    args: DecommissionArgs,
) -> Result<Outcome, String> {
    let request = |dry_run: bool| apb::DecommissionCellRequest {
        cell_id: args.cell_id.clone(),
        dry_run,
        reason: args.reason.clone(),
        batch_size: args.batch_size,
    };
    let refused = |status: tonic::Status| {
        let error = from_status(&status);
        if error.reason() == "CELL_HAS_OUTSTANDING_LEASES" {
            format!(
                "{}; see them with `topology-claims admin leases --cell-id {}`",
                describe(&status),
                args.cell_id
            )
        } else {
            describe(&status)
        }
    };
    if !crate::confirm::can_proceed(args.yes, args.dry_run) {
        return Ok(Outcome::NotConfirmed);
    }
    // With --yes the command acts at once: a preview nobody reads is not made (nor audited).
    let mut planned = 0;
    if !args.yes || args.dry_run {
        let plan = client
            .decommission_cell(request(true))
            .await
            .map_err(refused)?
            .into_inner();
        eprintln!(
            "cell {}: {} claim(s) to delete{}",
            args.cell_id,
            plan.claims,
            if plan.already_decommissioned {
                " (already decommissioned: resuming)"
            } else {
                ""
            }
        );
        if args.dry_run {
            println!(
                "decommission {} (dry run): would delete {} claim(s)",
                args.cell_id, plan.claims
            );
            return Ok(Outcome::Done);
        }
        if !confirm(
            &format!(
                "delete all {} claim(s) of cell {} and refuse its updates from now on?",
                plan.claims, args.cell_id
            ),
            args.yes,
        )? {
            return Ok(Outcome::NotConfirmed);
        }
        planned = plan.claims;
    }
    let started = Instant::now();
    let mut last_line: Option<Instant> = None;
    let mut deleted = 0u64;
    loop {
        let step = client
            .decommission_cell(request(false))
            .await
            .map_err(refused)?
            .into_inner();
        deleted += step.claims;
        // After the first step, then once a second, and at the end.
        if step.complete || last_line.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
            let total = planned.max(deleted);
            eprintln!(
                "progress: {deleted}/{total} claim(s) deleted ({:.0}%), {:.1}s",
                if total == 0 {
                    100.0
                } else {
                    deleted as f64 * 100.0 / total as f64
                },
                started.elapsed().as_secs_f64()
            );
            last_line = Some(Instant::now());
        }
        if step.complete {
            break;
        }
    }
    println!(
        "decommission {}: {deleted} claim(s) deleted; the cell is decommissioned",
        args.cell_id
    );
    Ok(Outcome::Done)
}

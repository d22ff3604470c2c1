//! `claim` and `release`: take or give back one claim from a shell, through the same three
//! phases a cell uses (BeginUpdate, then CommitUpdate; a refused lease is rolled back). For
//! trying the service and for fixing one name by hand. Not a cell's way to claim: a claim with
//! no record in its cell's database is drift for that cell's verifier, which destroys it on its
//! next pass (docs/operations.md, "Claims from the shell").
//!
//! Owns the flags and the messages; the protocol is `topology_claims_client::ClaimsClient`'s.

use std::process::ExitCode;

use clap::Args;
use topology_claims::domain::{
    BeginUpdate, CellId, ClaimKey, ClaimRecord, NamespaceId, OwnerType, TableName,
};
use topology_claims::ClaimsError;
use topology_claims_client::{ClaimsClient, ClientConfig};

use crate::client_tls::ServerArgs;

#[derive(Args, Debug)]
pub struct ClaimArgs {
    #[command(flatten)]
    to: ServerArgs,

    /// The cell that takes (or gives back) the claim; under mutual TLS, the certificate's cell.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CELL_ID")]
    cell_id: String,

    /// The claim's namespace, e.g. usernames, emails, routes.
    #[arg(long)]
    namespace: String,

    /// The value, as a user would type it.
    #[arg(long)]
    value: String,

    /// What kind of entity owns the claim: user, group, project or any [a-z0-9_]{1,63}.
    #[arg(long, default_value = "user", value_parser = parse_owner)]
    owner_type: OwnerType,

    /// The owner's identifier. Default: the value.
    #[arg(long)]
    owner_value: Option<String>,

    /// The cell's table whose record implies the claim (what the cell's verifier compares
    /// against): users, emails, routes, projects, groups or any [a-z0-9_]{1,63}.
    #[arg(long, default_value = "users", value_parser = parse_table)]
    source_table: TableName,

    /// That record's id.
    #[arg(long, default_value_t = 0)]
    source_record_id: i64,
}

fn parse_owner(text: &str) -> Result<OwnerType, String> {
    OwnerType::parse_name(text, "--owner-type").map_err(|e| e.to_string())
}

fn parse_table(text: &str) -> Result<TableName, String> {
    TableName::parse_name(text, "--source-table").map_err(|e| e.to_string())
}

/// Exit statuses: done; refused by the service (taken, leased, not the owner, …); error.
const REFUSED: u8 = 1;
const FAILED: u8 = 2;

/// `claim` (`release` = false) or `release`.
pub async fn run(args: ClaimArgs, release: bool) -> ExitCode {
    match claim_or_release(&args, release).await {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(error) if refusal(&error) => {
            eprintln!("refused: {}: {error}", error.reason());
            ExitCode::from(REFUSED)
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(FAILED)
        }
    }
}

/// Whether the service answered no (exit 1) rather than failed (exit 2).
fn refusal(error: &ClaimsError) -> bool {
    !matches!(
        error,
        ClaimsError::Configuration { .. }
            | ClaimsError::Internal { .. }
            | ClaimsError::Unavailable { .. }
            | ClaimsError::ServerUnavailable { .. }
            | ClaimsError::Unauthenticated { .. }
    )
}

async fn claim_or_release(args: &ClaimArgs, release: bool) -> Result<String, ClaimsError> {
    let cell_id = CellId::parse_field(&args.cell_id, "--cell-id")?;
    let record = ClaimRecord {
        key: ClaimKey::new(
            NamespaceId::parse_field(&args.namespace, "--namespace")?,
            args.value.clone(),
        ),
        display: None,
        owner_type: args.owner_type.clone(),
        owner_value: args
            .owner_value
            .clone()
            .unwrap_or_else(|| args.value.clone()),
        table_name: args.source_table.clone(),
        table_record_id: args.source_record_id,
    };
    record.check("claim")?;
    let config = ClientConfig {
        tls: args.to.tls.load()?,
        ..ClientConfig::default()
    };
    let client = ClaimsClient::connect_lazy(&args.to.server, config)?;
    let (creates, destroys) = if release {
        (Vec::new(), vec![record])
    } else {
        (vec![record], Vec::new())
    };
    let lease = client
        .begin_update(BeginUpdate {
            cell_id: cell_id.clone(),
            lease_id: None,
            creates,
            destroys,
            updates: Vec::new(),
            local_transaction: None,
        })
        .await?;
    if let Err(error) = client.commit_update(&cell_id, lease.lease_id).await {
        eprintln!(
            "lease {} was begun but its commit failed; the claim stays leased until it is \
             committed or rolled back (`topology-claims admin force-rollback --cell-id {cell_id}`, \
             or that cell's reconciler)",
            lease.lease_id
        );
        return Err(error);
    }
    Ok(format!(
        "{} {} {:?} for cell {cell_id} (lease {}, committed)",
        if release { "released" } else { "claimed" },
        args.namespace,
        args.value,
        lease.lease_id
    ))
}

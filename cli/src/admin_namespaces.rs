//! `topology-claims admin namespaces list | get | update`: the namespaces of the claims store
//! and their rules (docs/operations.md, "Namespaces"; decisions 107, 108). Owns the calls and
//! the printing (a table, or `--json`); every rule is the server's.

use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;
use tonic::transport::Channel;
use topology_claims_proto::pb::admin as apb;
use topology_claims_proto::pb::admin::admin_service_client::AdminServiceClient;

use crate::ops::describe;

#[derive(Args, Debug)]
pub struct NamespacesArgs {
    #[command(subcommand)]
    command: NamespacesCommand,
}

#[derive(Subcommand, Debug)]
enum NamespacesCommand {
    /// Every namespace of the store, with its rules.
    List(OutputArgs),
    /// One namespace and its rules.
    Get {
        /// The namespace, e.g. usernames.
        id: String,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Change a namespace's rules. Description, --deprecated and --reserved change at any time.
    /// A new --normalization, a lower --max-chars or a new --pattern is applied only if every
    /// claim of the namespace passes it and no two collide (the server rewrites the keys it
    /// changes); otherwise it is refused, listing the first collisions and violations.
    Update(UpdateArgs),
}

#[derive(Args, Debug)]
struct OutputArgs {
    /// Print JSON (one object per namespace) instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum NormalizationArg {
    Exact,
    AsciiCaseInsensitive,
    PrecisUsername,
}

#[derive(Args, Debug)]
struct UpdateArgs {
    /// The namespace, e.g. usernames.
    id: String,
    /// How values become keys.
    #[arg(long, value_enum)]
    normalization: Option<NormalizationArg>,
    /// Most characters of a key, 1..=255.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=255))]
    max_chars: Option<u32>,
    /// A regular expression every key must match, e.g. '^[a-z0-9.-]+$'.
    #[arg(long, conflicts_with = "no_pattern")]
    pattern: Option<String>,
    /// Remove the pattern.
    #[arg(long)]
    no_pattern: bool,
    /// Values refused to every cell's creates, comma-separated (an empty string: none).
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    reserved: Option<Vec<String>>,
    /// What the namespace holds.
    #[arg(long)]
    description: Option<String>,
    /// true: no new creates (destroys, updates and lookups work); false: creates again.
    #[arg(long)]
    deprecated: Option<bool>,
    /// Why (written to the audit log). Required.
    #[arg(long)]
    reason: String,
    #[command(flatten)]
    output: OutputArgs,
}

pub async fn run(client: AdminServiceClient<Channel>, args: NamespacesArgs) -> Result<(), String> {
    match args.command {
        NamespacesCommand::List(output) => list(client, output).await,
        NamespacesCommand::Get { id, output } => get(client, id, output).await,
        NamespacesCommand::Update(update) => update_namespace(client, update).await,
    }
}

fn normalization_name(number: i32) -> &'static str {
    match apb::Normalization::try_from(number) {
        Ok(apb::Normalization::Exact) => "exact",
        Ok(apb::Normalization::AsciiCaseInsensitive) => "ascii-case-insensitive",
        Ok(apb::Normalization::PrecisUsername) => "precis-username",
        _ => "unknown",
    }
}

fn as_json(namespace: &apb::Namespace) -> serde_json::Value {
    json!({
        "id": namespace.id,
        "normalization": normalization_name(namespace.normalization),
        "max_chars": namespace.max_chars,
        "pattern": namespace.pattern,
        "reserved": namespace.reserved,
        "description": namespace.description,
        "deprecated": namespace.deprecated,
        "version": namespace.version,
    })
}

fn print_one(namespace: &apb::Namespace, output: &OutputArgs) {
    if output.json {
        println!("{}", as_json(namespace));
        return;
    }
    println!("namespace:      {}", namespace.id);
    println!(
        "normalization:  {}",
        normalization_name(namespace.normalization)
    );
    println!("max_chars:      {}", namespace.max_chars);
    let or_none = |text: &str| {
        if text.is_empty() {
            "(none)".to_owned()
        } else {
            text.to_owned()
        }
    };
    println!("pattern:        {}", or_none(&namespace.pattern));
    println!(
        "reserved:       {}",
        or_none(&namespace.reserved.join(", "))
    );
    println!("deprecated:     {}", namespace.deprecated);
    println!("version:        {}", namespace.version);
    println!("description:    {}", namespace.description);
}

async fn list(mut client: AdminServiceClient<Channel>, output: OutputArgs) -> Result<(), String> {
    let response = client
        .list_namespaces(apb::ListNamespacesRequest {})
        .await
        .map_err(|s| describe(&s))?
        .into_inner();
    if output.json {
        let all: Vec<serde_json::Value> = response.namespaces.iter().map(as_json).collect();
        println!("{}", serde_json::Value::Array(all));
        return Ok(());
    }
    println!(
        "{:<24}  {:<22}  {:>9}  {:>10}  {:>7}  pattern",
        "namespace", "normalization", "max_chars", "deprecated", "version"
    );
    for namespace in &response.namespaces {
        println!(
            "{:<24}  {:<22}  {:>9}  {:>10}  {:>7}  {}",
            namespace.id,
            normalization_name(namespace.normalization),
            namespace.max_chars,
            namespace.deprecated,
            namespace.version,
            namespace.pattern
        );
    }
    Ok(())
}

async fn get(
    mut client: AdminServiceClient<Channel>,
    id: String,
    output: OutputArgs,
) -> Result<(), String> {
    let namespace = client
        .get_namespace(apb::GetNamespaceRequest { id })
        .await
        .map_err(|s| describe(&s))?
        .into_inner();
    print_one(&namespace, &output);
    Ok(())
}

async fn update_namespace(
    mut client: AdminServiceClient<Channel>,
    args: UpdateArgs,
) -> Result<(), String> {
    let normalization = args.normalization.map_or(0, |n| match n {
        NormalizationArg::Exact => apb::Normalization::Exact as i32,
        NormalizationArg::AsciiCaseInsensitive => apb::Normalization::AsciiCaseInsensitive as i32,
        NormalizationArg::PrecisUsername => apb::Normalization::PrecisUsername as i32,
    });
    let reserved = args.reserved.map(|values| {
        values
            .into_iter()
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .collect::<Vec<_>>()
    });
    let request = apb::UpdateNamespaceRequest {
        id: args.id,
        normalization,
        max_chars: args.max_chars,
        pattern: if args.no_pattern {
            Some(String::new())
        } else {
            args.pattern
        },
        set_reserved: reserved.is_some(),
        reserved: reserved.unwrap_or_default(),
        description: args.description,
        deprecated: args.deprecated,
        reason: args.reason,
    };
    let changed = client
        .update_namespace(request)
        .await
        .map_err(|s| describe(&s))?
        .into_inner();
    if !args.output.json {
        eprintln!(
            "namespace {} updated to version {}",
            changed.id, changed.version
        );
    }
    print_one(&changed, &args.output);
    Ok(())
}

//! `topology-claims admin namespaces list | get | create | update | delete`: the namespaces of the claims store
//! and their rules (docs/operations.md, "Namespaces"; decisions 107, 108). Owns the calls and
//! the printing (a table, or `--json`); every rule is the server's.

use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;
use tonic::transport::Channel;
use topology_claims::domain::Normalization;
use topology_claims_proto::namespaces::normalization_to_pb;
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
    /// Add a kind of unique name. Cells may claim values of it at once (`claim :attr,
    /// namespace: "ID"` in the Ruby gem); every server applies its rules.
    Create(CreateArgs),
    /// Remove a namespace that holds no claim (the built-ins cannot be removed: deprecate them).
    Delete(DeleteArgs),
    /// Change a namespace's rules. Description, --deprecated and --reserved change at any time.
    /// A new --normalization, a lower --max-chars or a new --pattern is applied only if every
    /// claim of the namespace passes it and no two collide (the server rewrites the keys it
    /// changes); otherwise it is refused, listing the first collisions and violations.
    Update(UpdateArgs),
    /// How many claims each namespace holds, leased ones included (one read of every claim:
    /// the topology_claims_claims gauge has the same counts).
    Count(OutputArgs),
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
struct CreateArgs {
    /// The namespace: [a-z0-9][a-z0-9._-]{0,62}, e.g. pages-domains.
    id: String,
    /// How values become keys: exact (byte for byte), ascii-case-insensitive (ASCII letters
    /// lowercased), precis-username (RFC 8265: case, width and Unicode forms).
    #[arg(long, value_enum)]
    normalization: NormalizationArg,
    /// Most characters of a key, 1..=255.
    #[arg(long, default_value_t = 255, value_parser = clap::value_parser!(u32).range(1..=255))]
    max_chars: u32,
    /// A regular expression every key must match, e.g. '^[a-z0-9.-]+$'.
    #[arg(long)]
    pattern: Option<String>,
    /// Values refused to every cell's creates, comma-separated.
    #[arg(long, value_delimiter = ',')]
    reserved: Vec<String>,
    /// What the namespace holds.
    #[arg(long, default_value = "")]
    description: String,
    /// Why (written to the audit log). Required.
    #[arg(long)]
    reason: String,
    #[command(flatten)]
    output: OutputArgs,
}

#[derive(Args, Debug)]
struct DeleteArgs {
    /// The namespace.
    id: String,
    /// Why (written to the audit log). Required.
    #[arg(long)]
    reason: String,
    /// Do not ask for confirmation.
    #[arg(long)]
    yes: bool,
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

/// Runs the command; `Ok(false)`: not confirmed, nothing changed.
pub async fn run(
    client: AdminServiceClient<Channel>,
    args: NamespacesArgs,
) -> Result<bool, String> {
    match args.command {
        NamespacesCommand::List(output) => list(client, output).await.map(|()| true),
        NamespacesCommand::Count(output) => count(client, output).await.map(|()| true),
        NamespacesCommand::Get { id, output } => get(client, id, output).await.map(|()| true),
        NamespacesCommand::Create(create) => create_namespace(client, create).await.map(|()| true),
        NamespacesCommand::Delete(delete) => delete_namespace(client, delete).await,
        NamespacesCommand::Update(update) => update_namespace(client, update).await.map(|()| true),
    }
}

/// The wire number of a `--normalization` (the proto crate's one mapping).
fn normalization_pb(normalization: NormalizationArg) -> i32 {
    normalization_to_pb(match normalization {
        NormalizationArg::Exact => Normalization::Exact,
        NormalizationArg::AsciiCaseInsensitive => Normalization::AsciiCaseInsensitive,
        NormalizationArg::PrecisUsername => Normalization::PrecisUsername,
    }) as i32
}

async fn create_namespace(
    mut client: AdminServiceClient<Channel>,
    args: CreateArgs,
) -> Result<(), String> {
    let namespace = apb::Namespace {
        id: args.id,
        normalization: normalization_pb(args.normalization),
        max_chars: args.max_chars,
        pattern: args.pattern.unwrap_or_default(),
        reserved: args
            .reserved
            .into_iter()
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .collect(),
        description: args.description,
        deprecated: false,
        version: 0,
    };
    let created = client
        .create_namespace(apb::CreateNamespaceRequest {
            namespace: Some(namespace),
            reason: args.reason,
        })
        .await
        .map_err(|s| describe(&s))?
        .into_inner();
    if !args.output.json {
        eprintln!("namespace {} created", created.id);
    }
    print_one(&created, &args.output);
    Ok(())
}

async fn delete_namespace(
    mut client: AdminServiceClient<Channel>,
    args: DeleteArgs,
) -> Result<bool, String> {
    if !args.yes {
        // Show what goes before asking: a missing namespace fails here, with its reason.
        let namespace = client
            .get_namespace(apb::GetNamespaceRequest {
                id: args.id.clone(),
            })
            .await
            .map_err(|s| describe(&s))?
            .into_inner();
        eprintln!(
            "deleting namespace {} ({}, version {}); refused if it holds any claim",
            namespace.id,
            normalization_name(namespace.normalization),
            namespace.version
        );
        if !crate::confirm::confirm("delete it?", false)? {
            return Ok(false);
        }
    }
    client
        .delete_namespace(apb::DeleteNamespaceRequest {
            id: args.id.clone(),
            reason: args.reason,
        })
        .await
        .map_err(|s| describe(&s))?;
    eprintln!("namespace {} deleted", args.id);
    Ok(true)
}

/// The name of a wire normalization, as the domain spells it.
fn normalization_name(number: i32) -> &'static str {
    Normalization::from_number(i64::from(number)).map_or("unknown", Normalization::name)
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

async fn count(mut client: AdminServiceClient<Channel>, output: OutputArgs) -> Result<(), String> {
    let response = client
        .count_claims(apb::CountClaimsRequest {})
        .await
        .map_err(|s| describe(&s))?
        .into_inner();
    if output.json {
        let counts: serde_json::Map<String, serde_json::Value> = response
            .namespaces
            .iter()
            .map(|n| (n.namespace.clone(), json!(n.claims)))
            .collect();
        println!("{}", serde_json::Value::Object(counts));
        return Ok(());
    }
    println!("{:<24}  {:>12}", "namespace", "claims");
    for n in &response.namespaces {
        println!("{:<24}  {:>12}", n.namespace, n.claims);
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
    let normalization = args.normalization.map_or(0, normalization_pb);
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

//! Operator commands against a running server: `lookup` (which cell holds a claim) and `leases`
//! (a cell's outstanding leases and their age by the server's clock).
//!
//! Owns the gRPC client calls and human-readable printing. Server errors are printed with their
//! ErrorInfo reason (read back by `grpc::status::from_status`), never as Debug dumps.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use tonic::transport::Channel;
use topology_claims::domain::NamespaceId;
use topology_claims::{ClaimType, ClaimsError, OwnerType, TableName};
use topology_claims_client::decode::claims_client;
use topology_claims_client::server_endpoint;
use topology_claims_proto::convert::timestamp_from_pb;
use topology_claims_proto::pb;
use topology_claims_proto::pb::claims_service_client::ClaimsServiceClient;
use topology_claims_proto::status::{code_name, from_service, from_status};

use topology_claims::config::format_duration;
use topology_claims::error::error_chain;

use crate::client_tls::{ServerArgs, TlsArgs};

#[derive(Args, Debug)]
pub struct HealthArgs {
    /// `--server` may also be a --health-listen address (plaintext).
    #[command(flatten)]
    to: ServerArgs,

    /// The grpc.health.v1 service to check: topology.claims.v1.ClaimsService (SERVING when the
    /// server's store answers: readiness) or "" (SERVING while the process runs and is not
    /// draining: liveness).
    #[arg(
        long,
        env = "TOPOLOGY_CLAIMS_HEALTH_SERVICE",
        default_value = "topology.claims.v1.ClaimsService"
    )]
    service: String,
}

#[derive(Args, Debug)]
pub struct LookupArgs {
    #[command(flatten)]
    to: ServerArgs,

    /// The claim's namespace, e.g. usernames, emails, routes.
    #[arg(long, required_unless_present = "claim_type")]
    namespace: Option<String>,

    /// Legacy: the built-in namespace by its old claim type (routes, username or email).
    #[arg(long = "type", value_name = "TYPE", value_parser = parse_claim_type, conflicts_with = "namespace")]
    claim_type: Option<ClaimType>,

    /// The claimed value in any form that has the claim's key, e.g. A@Example.com.
    #[arg(long)]
    value: String,
}

#[derive(Args, Debug)]
pub struct LeasesArgs {
    #[command(flatten)]
    to: ServerArgs,

    /// The cell whose outstanding leases to list.
    #[arg(long, env = "TOPOLOGY_CLAIMS_CELL_ID")]
    cell_id: String,

    /// Page size of each ListOutstandingLeases request (1..=1000; 0 means the server's default,
    /// 100). All pages are printed.
    #[arg(long, env = "TOPOLOGY_CLAIMS_PAGE_SIZE", default_value_t = 0,
          value_parser = clap::value_parser!(i32).range(0..=1000))]
    limit: i32,
}

fn parse_claim_type(text: &str) -> Result<ClaimType, String> {
    ClaimType::from_name(text).ok_or_else(|| {
        let names: Vec<&str> = ClaimType::ALL.iter().map(|t| t.name()).collect();
        format!("unknown claim type {text:?}; one of: {}", names.join(", "))
    })
}

/// Operator commands give up on an unreachable or hung server instead of waiting forever.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A channel to `server` for operator commands (bounded connect and request times).
pub async fn channel(server: &str, tls: &TlsArgs) -> Result<Channel, String> {
    let _ = SERVER.set(server.to_owned());
    let endpoint = server_endpoint(server, tls.load().map_err(|e| e.to_string())?.as_ref())
        .map_err(|e| e.to_string())?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT);
    endpoint.connect().await.map_err(|e| {
        let detail = error_chain(&e);
        transport_hint(server, &detail)
            .unwrap_or_else(|| format!("cannot connect to {server}: {detail}"))
    })
}

/// The `--server` this command talks to (one per process), for the messages of failed calls.
static SERVER: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// What a transport failure most likely means, said with the fix: a plaintext client at a TLS
/// port, a TLS client at a plaintext port, nothing listening. `None` when the detail says none
/// of these.
fn transport_hint(server: &str, detail: &str) -> Option<String> {
    let lower = detail.to_ascii_lowercase();
    if lower.contains("connection refused") {
        return Some(format!(
            "nothing listens at {server} (connection refused): is the server running, and is \
             the address right?"
        ));
    }
    let plaintext = server.starts_with("http://");
    let garbled = [
        "h2 protocol error",
        "frame with invalid size",
        "connection closed",
        "broken pipe",
        "connection reset",
        "invalid http",
        "unexpected eof",
        "protocol error",
    ]
    .iter()
    .any(|sign| lower.contains(sign));
    if plaintext && garbled {
        return Some(format!(
            "the server at {server} did not answer plaintext gRPC ({detail}): if it serves TLS \
             (every server started with --tls-cert does), use https://HOST:PORT with --tls-ca"
        ));
    }
    if !plaintext && (lower.contains("invalidcontenttype") || lower.contains("corrupt message")) {
        return Some(format!(
            "the server at {server} does not speak TLS ({detail}): use http://HOST:PORT, or \
             start the server with --tls-cert and --tls-key"
        ));
    }
    None
}

pub async fn connect(server: &str, tls: &TlsArgs) -> Result<ClaimsServiceClient<Channel>, String> {
    let channel = channel(server, tls).await?;
    // Accepts the largest page the server may send (a leases page holds at least one lease,
    // which can be as large as a whole BeginUpdate request): see MAX_RESPONSE_MESSAGE_BYTES.
    Ok(claims_client(channel))
}

/// A server error as `REASON: message`; the server hides its internal errors' details, so
/// those say where to look instead of repeating "internal error".
pub fn describe(status: &tonic::Status) -> String {
    let server = SERVER.get().map_or("the server", String::as_str);
    if !from_service(status) {
        // Not the service's answer: the transport, a proxy, or something else at that port.
        let cause = std::error::Error::source(status)
            .map(|cause| format!(": {}", error_chain(cause)))
            .unwrap_or_default();
        let detail = format!("{}: {}{cause}", code_name(status.code()), status.message());
        return transport_hint(server, &detail)
            .unwrap_or_else(|| format!("no answer from the claims service at {server}: {detail}"));
    }
    match from_status(status) {
        ClaimsError::Internal { .. } if status.code() == tonic::Code::Internal => {
            "INTERNAL: the server failed; its log has the details".to_owned()
        }
        error @ ClaimsError::Unavailable { .. } => format!(
            "{}: the server at {server} is up, its store is not: {error}",
            error.reason()
        ),
        error => format!("{}: {error}", error.reason()),
    }
}

/// `health`: asks the server's grpc.health.v1 for `--service`. Exit 0 SERVING, 1 anything else
/// (said with why), 2 when it could not ask.
pub async fn health(args: HealthArgs) -> ExitCode {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
    let channel = match channel(&args.to.server, &args.to.tls).await {
        Ok(channel) => channel,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(2);
        }
    };
    let shown = if args.service.is_empty() {
        "the server (\"\")".to_owned()
    } else {
        args.service.clone()
    };
    let request = HealthCheckRequest {
        service: args.service.clone(),
    };
    match HealthClient::new(channel).check(request).await {
        Ok(response) => match response.into_inner().status() {
            ServingStatus::Serving => {
                println!("{shown} at {}: SERVING", args.to.server);
                ExitCode::SUCCESS
            }
            ServingStatus::NotServing => {
                println!(
                    "{shown} at {}: NOT_SERVING ({})",
                    args.to.server,
                    if args.service.is_empty() {
                        "the server is draining after SIGTERM"
                    } else {
                        "its store did not answer the last probe, or the server is draining; its \
                         log and topology_claims_store_up say which"
                    }
                );
                ExitCode::from(1)
            }
            other => {
                println!("{shown} at {}: {}", args.to.server, other.as_str_name());
                ExitCode::from(1)
            }
        },
        Err(status) if status.code() == tonic::Code::NotFound => {
            println!(
                "{shown} at {}: SERVICE_UNKNOWN (this server has no such health service)",
                args.to.server
            );
            ExitCode::from(1)
        }
        Err(status) => {
            eprintln!("error: {}", describe(&status));
            ExitCode::from(2)
        }
    }
}

pub async fn lookup(args: LookupArgs) -> ExitCode {
    const NOT_FOUND: u8 = 1;
    const FAILED: u8 = 2;
    let mut client = match connect(&args.to.server, &args.to.tls).await {
        Ok(client) => client,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(FAILED);
        }
    };
    let namespace = match (&args.namespace, args.claim_type) {
        (Some(namespace), _) => namespace.clone(),
        (None, Some(claim_type)) => NamespaceId::of_claim_type(claim_type).to_string(),
        (None, None) => unreachable!("clap requires --namespace or --type"),
    };
    let request = pb::LookupClaimRequest {
        claim_value: args.value.clone(),
        namespace: namespace.clone(),
        ..Default::default()
    };
    match client.lookup_claim(request).await {
        Ok(response) => {
            print!(
                "{}",
                format_lookup(&namespace, &args.value, response.get_ref())
            );
            ExitCode::SUCCESS
        }
        Err(status) => match from_status(&status) {
            ClaimsError::ClaimNotFound { claim } => {
                eprintln!(
                    "not found: no cell holds {} {}",
                    claim.namespace, claim.value
                );
                ExitCode::from(NOT_FOUND)
            }
            _ => {
                eprintln!("error: {}", describe(&status));
                ExitCode::from(FAILED)
            }
        },
    }
}

fn state_name(number: i32) -> String {
    match pb::ClaimState::try_from(number) {
        Ok(pb::ClaimState::Active) => "active".to_owned(),
        Ok(pb::ClaimState::Creating) => "creating (leased, not yet committed)".to_owned(),
        Ok(pb::ClaimState::Destroying) => "destroying (leased for destruction)".to_owned(),
        _ => format!("unknown ({number})"),
    }
}

fn timestamp_text(ts: Option<&prost_types::Timestamp>) -> String {
    ts.map_or_else(|| "-".to_owned(), ToString::to_string)
}

fn format_lookup(namespace: &str, value: &str, response: &pb::LookupClaimResponse) -> String {
    // The name a server sends; a server from before free-form names sends the enum alone.
    let name_of = |text: &str, n: i32, legacy: Option<String>| match (text, legacy) {
        ("", Some(name)) => name,
        ("", None) => format!("unknown ({n})"),
        (text, _) => text.to_owned(),
    };
    let mut text = format!("claim:      {namespace} {value}\n");
    text.push_str(&format!("cell:       {}\n", response.cell_id));
    text.push_str(&format!("state:      {}\n", state_name(response.state)));
    if let Some(claim) = &response.claim {
        let owner = name_of(
            &claim.owner_type_name,
            claim.owner_type,
            OwnerType::from_number(claim.owner_type.into()).map(|o| o.name().to_owned()),
        );
        let table = name_of(
            &claim.source_table,
            claim.table_name,
            TableName::from_number(claim.table_name.into()).map(|t| t.name().to_owned()),
        );
        if claim.claim_value != value || (!claim.claim_key.is_empty() && claim.claim_key != value) {
            text.push_str(&format!(
                "value:      {} (key {})\n",
                claim.claim_value, claim.claim_key
            ));
        }
        text.push_str(&format!("owner:      {owner} {}\n", claim.owner_value));
        text.push_str(&format!(
            "record:     {table} id {}\n",
            claim.table_record_id
        ));
        text.push_str(&format!(
            "created_at: {}\n",
            timestamp_text(claim.created_at.as_ref())
        ));
        text.push_str(&format!(
            "updated_at: {}\n",
            timestamp_text(claim.updated_at.as_ref())
        ));
    }
    if response.revision > 0 {
        text.push_str(&format!("revision:   {}\n", response.revision));
    }
    text
}

pub async fn leases(args: LeasesArgs) -> ExitCode {
    match list_all_leases(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn list_all_leases(args: &LeasesArgs) -> Result<(), String> {
    let mut client = connect(&args.to.server, &args.to.tls).await?;
    let mut cursor = String::new();
    let mut count = 0usize;
    let mut last_server_time;
    loop {
        let request = pb::ListOutstandingLeasesRequest {
            cell_id: args.cell_id.clone(),
            cursor: cursor.clone(),
            limit: args.limit,
        };
        let page = client
            .list_outstanding_leases(request)
            .await
            .map_err(|s| describe(&s))?
            .into_inner();
        if count == 0 && !page.leases.is_empty() {
            println!(
                "{:<36}  {:<27}  {:>9}  {:>9}  CLAIMS",
                "LEASE_ID", "CREATED_AT", "AGE", "IDLE"
            );
        }
        for lease in &page.leases {
            println!("{}", format_lease(lease, page.server_time.as_ref()));
        }
        count += page.leases.len();
        last_server_time = page.server_time;
        if page.next_cursor.is_empty() {
            break;
        }
        if page.next_cursor == cursor {
            return Err(format!("the server repeated cursor {cursor}; stopping"));
        }
        cursor = page.next_cursor;
    }
    let at = timestamp_text(last_server_time.as_ref());
    match count {
        0 => println!(
            "cell {} has no outstanding leases (server time {at})",
            args.cell_id
        ),
        n => println!(
            "{n} outstanding lease(s) of cell {} (server time {at}; IDLE = since last renewal)",
            args.cell_id
        ),
    }
    Ok(())
}

/// One row: id, creation time, age since creation and since last renewal by the server's clock
/// (staleness counts from the last renewal), and what the lease does.
fn format_lease(
    lease: &pb::OutstandingLease,
    server_time: Option<&prost_types::Timestamp>,
) -> String {
    let payload = lease.lease_payload.clone().unwrap_or_default();
    let since = |ts: Option<&prost_types::Timestamp>| match (server_time, ts) {
        (Some(now), Some(then)) => {
            format_duration(timestamp_from_pb(now).saturating_since(timestamp_from_pb(then)))
        }
        _ => "-".to_owned(),
    };
    let request = payload.original_request.unwrap_or_default();
    let local = if request.local_transaction.is_empty() {
        String::new()
    } else {
        format!(", local transaction {}", request.local_transaction)
    };
    format!(
        "{:<36}  {:<27}  {:>9}  {:>9}  {} create(s), {} destroy(s){local}",
        payload.lease_id,
        timestamp_text(payload.created_at.as_ref()),
        since(payload.created_at.as_ref()),
        since(lease.last_renewed_at.as_ref()),
        request.creates_claims.len(),
        request.destroys_claims.len(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(seconds: i64) -> prost_types::Timestamp {
        prost_types::Timestamp { seconds, nanos: 0 }
    }

    #[test]
    fn claim_types_are_parsed_by_name_and_unknown_ones_listed() {
        assert_eq!(parse_claim_type("email"), Ok(ClaimType::Email));
        assert_eq!(parse_claim_type("Username"), Ok(ClaimType::Username));
        let error = parse_claim_type("phone").unwrap_err();
        assert!(error.contains("routes, username, email"), "{error}");
    }

    #[test]
    fn lookup_prints_cell_state_owner_record_and_timestamps() {
        let response = pb::LookupClaimResponse {
            claim: Some(pb::ClaimInfo {
                claim_type: ClaimType::Email.number(),
                claim_value: "a@example.com".into(),
                owner_type: OwnerType::USER.number(),
                owner_value: "u-1".into(),
                table_name: TableName::EMAILS.number(),
                table_record_id: 17,
                created_at: Some(ts(0)),
                updated_at: Some(ts(60)),
                state: pb::ClaimState::Creating.into(),
                namespace: "emails".into(),
                claim_key: "a@example.com".into(),
                owner_type_name: String::new(),
                source_table: String::new(),
                revision: 42,
            }),
            cell_id: "cell-a".into(),
            state: pb::ClaimState::Creating.into(),
            revision: 42,
        };
        let text = format_lookup("emails", "a@example.com", &response);
        assert!(!text.contains("value:"), "typed as held: {text}");
        let other_form = format_lookup("emails", "A@example.com", &response);
        assert!(
            other_form.contains("value:      a@example.com (key a@example.com)"),
            "{other_form}"
        );
        for expected in [
            "claim:      emails a@example.com",
            "cell:       cell-a",
            "state:      creating",
            "owner:      user u-1",
            "record:     emails id 17",
            "created_at: 1970-01-01T00:00:00Z",
            "updated_at: 1970-01-01T00:01:00Z",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
    }

    #[test]
    fn lease_age_and_idle_time_count_by_the_server_clock() {
        let lease = pb::OutstandingLease {
            lease_payload: Some(pb::LeasePayload {
                lease_id: "0b8a1f1e-3c2d-4f5a-9b6c-7d8e9fa0b1c2".into(),
                cell_id: "cell-a".into(),
                created_at: Some(ts(1_000)),
                original_request: Some(pb::BeginUpdateRequest {
                    creates_claims: vec![pb::ClaimRecord::default(); 2],
                    ..Default::default()
                }),
            }),
            last_renewed_at: Some(ts(1_500)),
        };
        let row = format_lease(&lease, Some(&ts(1_000 + 12 * 60 + 5)));
        assert!(
            row.starts_with("0b8a1f1e-3c2d-4f5a-9b6c-7d8e9fa0b1c2"),
            "{row}"
        );
        assert!(row.contains("12m5s"), "age since creation: {row}");
        assert!(row.contains("3m45s"), "idle since renewal: {row}");
        assert!(row.contains("2 create(s), 0 destroy(s)"), "{row}");
        assert!(!row.contains("local transaction"), "none named: {row}");
    }

    #[test]
    fn lease_row_shows_the_local_transaction_as_sent() {
        let lease = pb::OutstandingLease {
            lease_payload: Some(pb::LeasePayload {
                original_request: Some(pb::BeginUpdateRequest {
                    local_transaction: "pg:7311234567890123456:812".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            last_renewed_at: None,
        };
        let row = format_lease(&lease, None);
        assert!(
            row.ends_with(", local transaction pg:7311234567890123456:812"),
            "{row}"
        );
    }
}

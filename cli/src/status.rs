//! `topology-claims status`: what a paged SRE asks a claims server first. Which build answers,
//! whether its store answers, the store's restore epoch, and when the server's certificate
//! expires. Each line is read on its own: a part that cannot be read says why, and the others
//! are still shown.

use std::process::ExitCode;

use clap::Args;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
use topology_claims_proto::pb::admin as apb;
use topology_claims_proto::pb::admin::admin_service_client::AdminServiceClient;

use crate::client_tls::ServerArgs;

#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub to: ServerArgs,
}

/// Exit statuses: the server and its store serve; one of them does not; the server could not
/// be asked at all.
const NOT_SERVING: u8 = 1;
const FAILED: u8 = 2;

/// Days a certificate may have left before the line says so (the alert's threshold too).
const EXPIRY_WARNING_DAYS: i64 = 14;

pub async fn run(args: StatusArgs) -> ExitCode {
    let server = &args.to.server;
    let channel = match crate::ops::channel(server, &args.to.tls).await {
        Ok(channel) => channel,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(FAILED);
        }
    };
    println!("server:       {server}");
    let (serving, version) = health(&channel, "").await;
    println!(
        "version:      {}",
        version.as_deref().unwrap_or("(not announced)")
    );
    println!("serving:      {}", serving.text);
    let (store, _) = health(&channel, topology_claims_server::grpc::server::SERVICE_NAME).await;
    println!("store:        {}", store_line(&store));
    println!("restore:      {}", restore_line(channel.clone()).await);
    let certificate = match args.to.tls.peer_certificates(server).await {
        Ok(None) => "none (plaintext http://)".to_owned(),
        Ok(Some(chain)) => certificate_line(&chain, now_unix()),
        Err(message) => format!("unknown: {message}"),
    };
    println!("certificate:  {certificate}");
    match (serving.status, store.status) {
        (Some(ServingStatus::Serving), Some(ServingStatus::Serving)) => ExitCode::SUCCESS,
        (None, _) => ExitCode::from(FAILED),
        _ => ExitCode::from(NOT_SERVING),
    }
}

/// A health answer: the status (`None`: no answer) and how to say it.
struct Health {
    status: Option<ServingStatus>,
    text: String,
}

/// Checks `service` ("" for the server as a whole); also returns the version the server
/// announces on health answers.
async fn health(channel: &Channel, service: &str) -> (Health, Option<String>) {
    let request = HealthCheckRequest {
        service: service.to_owned(),
    };
    match HealthClient::new(channel.clone()).check(request).await {
        Ok(response) => {
            let version = response
                .metadata()
                .get(topology_claims_server::grpc::authz::VERSION_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let status = response.into_inner().status();
            let text = match status {
                ServingStatus::Serving => "yes (SERVING)".to_owned(),
                ServingStatus::NotServing => "no (NOT_SERVING: draining after SIGTERM)".to_owned(),
                other => format!("no ({})", other.as_str_name()),
            };
            (
                Health {
                    status: Some(status),
                    text,
                },
                version,
            )
        }
        Err(status) => (
            Health {
                status: None,
                text: format!("unknown: {}", crate::ops::describe(&status)),
            },
            None,
        ),
    }
}

fn store_line(store: &Health) -> String {
    match store.status {
        Some(ServingStatus::Serving) => "reachable (its last probe answered)".to_owned(),
        Some(ServingStatus::NotServing) => {
            "NOT reachable: its last probe failed, or the server is \
             draining (the server's log and topology_claims_store_up say which)"
                .to_owned()
        }
        _ => store.text.clone(),
    }
}

async fn restore_line(channel: Channel) -> String {
    let answer = AdminServiceClient::new(channel)
        .get_restore_status(apb::GetRestoreStatusRequest {})
        .await;
    match answer {
        Ok(status) => restore_text(&status.into_inner()),
        Err(status) if status.code() == tonic::Code::PermissionDenied => {
            "unknown: GetRestoreStatus needs the admin role (an admin certificate)".to_owned()
        }
        Err(status) => format!("unknown: {}", crate::ops::describe(&status)),
    }
}

fn restore_text(status: &apb::RestoreStatus) -> String {
    if !status.restored {
        return "never restored (epoch 0)".to_owned();
    }
    let quarantine = match (&status.lifted_at, status.quarantine_enforced) {
        (Some(at), _) => format!("quarantine lifted at {at}"),
        (None, true) => format!(
            "QUARANTINE ON, {} cell(s) pending: {}",
            status.pending_cells.len(),
            status.pending_cells.join(", ")
        ),
        (None, false) => "quarantine on but not enforced (--restore-quarantine off)".to_owned(),
    };
    let marked = status
        .marked_at
        .as_ref()
        .map_or_else(|| "-".to_owned(), ToString::to_string);
    format!("epoch {}, marked {marked}; {quarantine}", status.epoch)
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// The leaf certificate's subject and expiry, at `now` (Unix seconds).
fn certificate_line(chain: &[rustls::pki_types::CertificateDer<'_>], now: i64) -> String {
    let Some(leaf) = chain.first() else {
        return "unknown: the server sent no certificate".to_owned();
    };
    match x509_parser::parse_x509_certificate(leaf.as_ref()) {
        Ok((_, cert)) => {
            let not_after = cert.validity().not_after;
            let left = not_after.timestamp() - now;
            let days = left.div_euclid(86_400);
            let when = not_after
                .to_datetime()
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_else(|_| not_after.to_string());
            let note = if left < 0 {
                format!("EXPIRED {} day(s) ago", -days)
            } else if days < EXPIRY_WARNING_DAYS {
                format!("in {days} day(s): RENEW IT (docs/security.md, rotation)")
            } else {
                format!("in {days} days")
            };
            format!("{} expires {when} ({note})", cert.subject())
        }
        Err(e) => format!("unknown: the server's certificate does not parse: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restore_says_its_epoch_and_what_the_quarantine_waits_for() {
        assert_eq!(
            restore_text(&apb::RestoreStatus::default()),
            "never restored (epoch 0)"
        );
        let waiting = apb::RestoreStatus {
            restored: true,
            epoch: 2,
            pending_cells: vec!["cell-a".into(), "cell-b".into()],
            quarantine_enforced: true,
            ..Default::default()
        };
        let text = restore_text(&waiting);
        assert!(text.starts_with("epoch 2, marked -;"), "{text}");
        assert!(
            text.ends_with("QUARANTINE ON, 2 cell(s) pending: cell-a, cell-b"),
            "{text}"
        );
    }
}

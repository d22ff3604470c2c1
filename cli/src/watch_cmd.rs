//! `watch`: follows the change feed (WatchClaims) from a shell, one line per event (JSON with
//! `--json`), until interrupted. For operators and for scripts that mirror claims; a router links a client
//! library instead (examples/router-cache).
//!
//! Owns the flags and the line format; the stream is the server's.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use topology_claims_proto::pb;

use crate::client_tls::ServerArgs;
use crate::ops::{connect, describe};

#[derive(Args, Debug)]
pub struct WatchArgs {
    #[command(flatten)]
    to: ServerArgs,

    /// Only this namespace's events (repeat for more); default: every namespace.
    #[arg(long = "namespace", value_name = "NAMESPACE")]
    namespaces: Vec<String>,

    /// Every event from this revision on (a revision a lookup answered, plus one); default:
    /// from now.
    #[arg(long = "from", value_name = "REVISION", default_value_t = 0)]
    from: u64,

    /// Also print a `{"progress": REVISION}` line when nothing changed for this long: everything
    /// up to REVISION has been printed. Units: ms, s, m, h, d; 0: never.
    #[arg(long, default_value = "0s", value_parser = topology_claims::config::parse_duration)]
    progress: Duration,

    /// One JSON object per line (the fields of ClaimEvent), for scripts; default: text,
    /// `REVISION NAMESPACE VALUE STATE CELL` (`deleted` for a delete).
    #[arg(long)]
    json: bool,
}

/// Exit statuses: the stream ended (the server drained: resume from the last revision + 1);
/// refused (WATCH_COMPACTED: look up again and watch from there); error.
const REFUSED: u8 = 1;
const FAILED: u8 = 2;

pub async fn run(args: WatchArgs) -> ExitCode {
    let mut client = match connect(&args.to.server, &args.to.tls).await {
        Ok(client) => client,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(FAILED);
        }
    };
    let request = pb::WatchClaimsRequest {
        start_revision: args.from,
        namespaces: args.namespaces.clone(),
        progress_interval: (!args.progress.is_zero())
            .then(|| topology_claims_proto::convert::duration_to_pb(args.progress)),
    };
    let mut stream = match client.watch_claims(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => {
            eprintln!("error: {}", describe(&status));
            let compacted = status.code() == tonic::Code::OutOfRange;
            return ExitCode::from(if compacted { REFUSED } else { FAILED });
        }
    };
    let mut out = std::io::stdout().lock();
    // The first response of a watch from now is the current revision.
    let mut announced = args.from != 0;
    loop {
        match stream.message().await {
            Ok(Some(response)) if response.events.is_empty() => {
                if !announced || !args.progress.is_zero() {
                    let revision = response.revision;
                    let _ = if args.json {
                        writeln!(out, "{}", serde_json::json!({ "progress": revision }))
                    } else {
                        writeln!(
                            out,
                            "{revision} progress: everything up to here was printed"
                        )
                    };
                    announced = true;
                }
            }
            Ok(Some(response)) => {
                for event in &response.events {
                    let _ = if args.json {
                        writeln!(out, "{}", event_json(event))
                    } else {
                        writeln!(out, "{}", event_text(event))
                    };
                }
            }
            Ok(None) => {
                let _ = out.flush();
                eprintln!("the server ended the stream (it is shutting down): resume with --from");
                return ExitCode::SUCCESS;
            }
            Err(status) => {
                eprintln!("error: {}", describe(&status));
                return ExitCode::from(FAILED);
            }
        }
        let _ = out.flush();
    }
}

fn state_name(state: i32) -> &'static str {
    match pb::ClaimState::try_from(state) {
        Ok(pb::ClaimState::Active) => "active",
        Ok(pb::ClaimState::Creating) => "creating",
        Ok(pb::ClaimState::Destroying) => "destroying",
        Ok(pb::ClaimState::Updating) => "updating",
        _ => "unknown",
    }
}

/// One event as a line of text.
fn event_text(event: &pb::ClaimEvent) -> String {
    format!(
        "{} {} {} {} {}{}",
        event.revision,
        event.namespace,
        event.claim_value,
        state_name(event.state),
        event.cell_id,
        if event.deleted { " deleted" } else { "" }
    )
}

/// One event as a JSON object: the fields of `ClaimEvent`, `state` in lower case.
pub fn event_json(event: &pb::ClaimEvent) -> serde_json::Value {
    let state = state_name(event.state);
    serde_json::json!({
        "revision": event.revision,
        "namespace": event.namespace,
        "value": event.claim_value,
        "key": event.claim_key,
        "state": state,
        "cell_id": event.cell_id,
        "lease_id": event.lease_id,
        "deleted": event.deleted,
        "owner_type": event.owner_type,
        "owner_value": event.owner_value,
        "source_table": event.source_table,
        "source_record_id": event.source_record_id,
    })
}

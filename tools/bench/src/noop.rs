//! The `noop` baseline: the claims gRPC service (the generated `topology_claims_proto::pb`
//! server, the same messages) with handlers that only answer — BeginUpdate returns a lease
//! payload echoing the request under its lease id, CommitUpdate says OK. No store, no domain, no
//! layers: the ceiling of the RPC stack (tonic, HTTP/2, protobuf, loopback TCP) on this machine,
//! which the in-memory store is measured against.
//!
//! It runs as a process of its own, like the `serve` children, so its CPU is measured apart from
//! the load generator's: the bench re-executes itself with the hidden first argument
//! [`SUBCOMMAND`], and the child prints `listening on HOST:PORT` (plaintext, 127.0.0.1, a free
//! port). Owns that server only; it must not hold protocol rules.

use std::process::{Command, ExitCode, Stdio};
use std::time::SystemTime;

use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};
use topology_claims::LeaseId;
use topology_claims_harness::serve::ServeChild;
use topology_claims_proto::pb;
use topology_claims_proto::pb::claims_service_server::{ClaimsService, ClaimsServiceServer};

/// `topology-claims-bench noop-server`: not a user-facing command (absent from `--help`).
pub const SUBCOMMAND: &str = "noop-server";

/// Starts the noop server as a child of this executable and waits for its address.
pub fn start() -> Result<ServeChild, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let mut command = Command::new(exe);
    command
        .arg(SUBCOMMAND)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    ServeChild::start(command)
}

/// The child's whole life: serve on 127.0.0.1:0 until killed.
pub fn main() -> ExitCode {
    topology_claims_harness::run_tool(None, async {
        match serve().await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: noop server: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

async fn serve() -> Result<(), String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let incoming = TcpIncoming::bind(addr)
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?
        // As the product's listener does: a small answer must not wait for Nagle.
        .with_nodelay(Some(true));
    let bound = incoming
        .local_addr()
        .map_err(|e| format!("cannot read the bound address: {e}"))?;
    // The one line the bench waits for (stdout is a pipe: println! flushes at the newline).
    println!("listening on {bound}");
    tonic::transport::Server::builder()
        .add_service(ClaimsServiceServer::new(Noop))
        .serve_with_incoming(incoming)
        .await
        .map_err(|e| e.to_string())
}

/// Handlers that answer at once.
struct Noop;

fn unimplemented<T>(rpc: &str) -> Result<Response<T>, Status> {
    Err(Status::unimplemented(format!(
        "the noop baseline answers BeginUpdate and CommitUpdate only, not {rpc}"
    )))
}

#[tonic::async_trait]
impl ClaimsService for Noop {
    type StreamClaimsStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::ClaimsRange, Status>> + Send>>;

    async fn begin_update(
        &self,
        request: Request<pb::BeginUpdateRequest>,
    ) -> Result<Response<pb::BeginUpdateResponse>, Status> {
        let request = request.into_inner();
        let lease_id = if request.lease_id.is_empty() {
            LeaseId::generate().to_string()
        } else {
            request.lease_id.clone()
        };
        // The service's answer carries the original request; so does this one, so both send
        // the same bytes.
        Ok(Response::new(pb::BeginUpdateResponse {
            lease_payload: Some(pb::LeasePayload {
                lease_id,
                cell_id: request.cell_id.clone(),
                created_at: Some(SystemTime::now().into()),
                original_request: Some(request),
            }),
        }))
    }

    async fn commit_update(
        &self,
        _request: Request<pb::CommitUpdateRequest>,
    ) -> Result<Response<pb::CommitUpdateResponse>, Status> {
        Ok(Response::new(pb::CommitUpdateResponse {}))
    }

    async fn rollback_update(
        &self,
        _request: Request<pb::RollbackUpdateRequest>,
    ) -> Result<Response<pb::RollbackUpdateResponse>, Status> {
        Ok(Response::new(pb::RollbackUpdateResponse {}))
    }

    async fn renew_lease(
        &self,
        _request: Request<pb::RenewLeaseRequest>,
    ) -> Result<Response<pb::RenewLeaseResponse>, Status> {
        unimplemented("RenewLease")
    }

    async fn list_outstanding_leases(
        &self,
        _request: Request<pb::ListOutstandingLeasesRequest>,
    ) -> Result<Response<pb::ListOutstandingLeasesResponse>, Status> {
        unimplemented("ListOutstandingLeases")
    }

    async fn list_claims(
        &self,
        _request: Request<pb::ListClaimsRequest>,
    ) -> Result<Response<pb::ListClaimsResponse>, Status> {
        unimplemented("ListClaims")
    }

    async fn stream_claims(
        &self,
        _request: Request<pb::StreamClaimsRequest>,
    ) -> Result<Response<Self::StreamClaimsStream>, Status> {
        unimplemented("StreamClaims")
    }

    type WatchClaimsStream = std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<pb::WatchClaimsResponse, Status>> + Send>,
    >;

    async fn watch_claims(
        &self,
        _request: Request<pb::WatchClaimsRequest>,
    ) -> Result<Response<Self::WatchClaimsStream>, Status> {
        unimplemented("WatchClaims")
    }

    async fn lookup_claim(
        &self,
        _request: Request<pb::LookupClaimRequest>,
    ) -> Result<Response<pb::LookupClaimResponse>, Status> {
        unimplemented("LookupClaim")
    }

    async fn acquire_verification_slot(
        &self,
        _request: Request<pb::AcquireVerificationSlotRequest>,
    ) -> Result<Response<pb::AcquireVerificationSlotResponse>, Status> {
        unimplemented("AcquireVerificationSlot")
    }

    async fn release_verification_slot(
        &self,
        _request: Request<pb::ReleaseVerificationSlotRequest>,
    ) -> Result<Response<pb::ReleaseVerificationSlotResponse>, Status> {
        unimplemented("ReleaseVerificationSlot")
    }

    async fn report_verification_pass(
        &self,
        _request: Request<pb::ReportVerificationPassRequest>,
    ) -> Result<Response<pb::ReportVerificationPassResponse>, Status> {
        unimplemented("ReportVerificationPass")
    }
}

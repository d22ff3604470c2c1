//! Malformed input against the real server process (`topology-claims serve --store memory:`):
//! every field of every request at and past its limits, protobuf that is not what the method
//! expects, broken gRPC framing over raw HTTP/2, and oversize messages. Each is refused with
//! INVALID_ARGUMENT naming the field, or with the transport's own error (tonic's INTERNAL for
//! undecodable protobuf, OUT_OF_RANGE above 4 MiB); never a panic: the process is still there
//! afterwards and answers a normal BeginUpdate + CommitUpdate.
//!
//! One test binary; each module is one kind of malformed input.
#![cfg(unix)]

mod fields;
mod framing;
mod oversize;
mod raw;
mod wrong_bytes;

use std::path::Path;
use std::process::Stdio;

use tonic::transport::Channel;
use topology_claims_harness::serve::{clean_command, ServeChild};
use topology_claims_proto::pb;
use topology_claims_proto::pb::claims_service_client::ClaimsServiceClient;

pub const BIN: &str = env!("CARGO_BIN_EXE_topology-claims");
pub const SERVICE: &str = "/topology.claims.v1.ClaimsService/";
pub const METHODS: [&str; 7] = [
    "BeginUpdate",
    "CommitUpdate",
    "RollbackUpdate",
    "RenewLease",
    "ListOutstandingLeases",
    "ListClaims",
    "LookupClaim",
];
pub const SOME_LEASE: &str = "0b6a4cf6-3f5e-4a47-9c1e-2b8c2d9a7e10";
/// The server's request message limit with the default `--max-batch` 1000.
pub const LIMIT: usize = 64 * 1024 + 1000 * 1024;

/// A `serve` child on an ephemeral port; killed when dropped.
pub struct Server {
    child: ServeChild,
}

impl Server {
    pub fn start() -> Server {
        let mut command = clean_command(
            Path::new(BIN),
            &["serve", "--listen", "127.0.0.1:0", "--store", "memory:"],
        );
        command.env("RUST_LOG", "warn").stderr(Stdio::inherit());
        let child = ServeChild::start(command).unwrap_or_else(|e| panic!("serve: {e}"));
        Server { child }
    }

    pub fn addr(&self) -> String {
        self.child.addr.to_string()
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(self.child.endpoint())
            .unwrap()
            .connect()
            .await
            .expect("connect")
    }

    pub async fn client(&self) -> ClaimsServiceClient<Channel> {
        ClaimsServiceClient::new(self.channel().await)
    }

    /// The process did not die, and it still does its job.
    pub async fn assert_still_serving(&mut self) {
        if let Err(e) = self.child.check_alive() {
            panic!("the server process exited: {e}");
        }
        let mut c = self.client().await;
        let lease = c
            .begin_update(begin("cell-after", vec![claim(2, "still-serving")]))
            .await
            .expect("BeginUpdate after the malformed input")
            .into_inner()
            .lease_payload
            .expect("a lease");
        c.commit_update(pb::CommitUpdateRequest {
            cell_id: "cell-after".into(),
            lease_id: lease.lease_id,
        })
        .await
        .expect("CommitUpdate after the malformed input");
    }
}

pub fn claim(claim_type: i32, value: &str) -> pb::ClaimRecord {
    pb::ClaimRecord {
        claim_type,
        claim_value: value.to_owned(),
        owner: 3,
        owner_value: "42".to_owned(),
        table_name: 1,
        table_record_id: 42,
        ..Default::default()
    }
}

pub fn begin(cell: &str, creates: Vec<pb::ClaimRecord>) -> pb::BeginUpdateRequest {
    pb::BeginUpdateRequest {
        local_transaction: String::new(),
        restore_correction: false,
        wait_for_leased: None,
        cell_id: cell.to_owned(),
        creates_claims: creates,
        destroys_claims: vec![],
        updates_claims: Vec::new(),
        lease_id: String::new(),
    }
}

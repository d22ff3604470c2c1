//! The etcd baseline: an `etcd` server (Debian's `etcd-server`) started on loopback ports with a
//! temporary data directory and killed afterwards, and the equivalent of a claims pair on it:
//!
//! - begin = `LeaseGrant` + one `Txn` that puts the K keys attached to the lease, only if none
//!   exists (`create_revision == 0`; destroys: only if each is ours and not leased);
//! - commit = one `Txn` that detaches them from the lease (destroys: deletes them), only if they
//!   are still attached to it.
//!
//! Speaks etcd's own v3 gRPC API through a client generated from `cli/proto/etcd` with the
//! workspace's tonic (see `build.rs`). Owns only this baseline; no claims rules live here.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tonic::transport::{Channel, Endpoint};
use topology_claims::LeaseOp;

use super::workload::{Batch, Reason};
use topology_claims_harness::net::free_port;
use topology_claims_harness::process::Owned;

#[allow(clippy::all, missing_docs)]
mod pb {
    tonic::include_proto!("etcdserverpb");
}

use pb::compare::{CompareResult, CompareTarget, TargetUnion};
use pb::kv_client::KvClient;
use pb::lease_client::LeaseClient;
use pb::request_op::Request;
use pb::{Compare, DeleteRangeRequest, LeaseGrantRequest, PutRequest, RequestOp, TxnRequest};

/// Lease TTL: longer than any run, so no lease expires (and deletes keys) while measuring.
const LEASE_TTL_SECONDS: i64 = 3600;
/// Longest wait for etcd to answer after start.
const STARTUP: Duration = Duration::from_secs(30);

/// A running etcd, killed and its data directory removed on drop.
pub struct EtcdServer {
    process: Owned,
    data_dir: PathBuf,
    pub endpoint: String,
}

impl EtcdServer {
    /// Starts `binary` as a one-member cluster on two free loopback ports.
    pub async fn start(binary: &str) -> Result<Self, String> {
        let (client_port, peer_port) = (free_port()?, free_port()?);
        let data_dir = std::env::temp_dir().join(format!(
            "topology-claims-bench-etcd-{}-{}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir_all(&data_dir)
            .map_err(|e| format!("cannot create {}: {e}", data_dir.display()))?;
        let log = std::fs::File::create(data_dir.join("etcd.log"))
            .map_err(|e| format!("cannot create etcd's log file: {e}"))?;
        let client_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let child = Command::new(binary)
            .arg("--name=bench")
            .arg(format!("--data-dir={}", data_dir.join("data").display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=bench={peer_url}"))
            .arg("--initial-cluster-state=new")
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start etcd ({binary}): {e}"))?;
        let mut server = Self {
            process: Owned::new(child, "etcd"),
            data_dir,
            endpoint: client_url,
        };
        server.wait_ready().await?;
        Ok(server)
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub fn check_alive(&mut self) -> Result<(), String> {
        self.process.check_alive()
    }

    /// Waits until an (empty, read-only) transaction succeeds: the member has a leader.
    async fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + STARTUP;
        let mut last = String::new();
        while Instant::now() < deadline {
            self.process
                .check_alive()
                .map_err(|e| format!("{e}; see {}", self.data_dir.join("etcd.log").display()))?;
            match EtcdConn::connect(&self.endpoint).await {
                Ok(mut conn) => match conn.kv.txn(TxnRequest::default()).await {
                    Ok(_) => return Ok(()),
                    Err(status) => last = status.to_string(),
                },
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!(
            "etcd did not become ready within {STARTUP:?}: {last}"
        ))
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        // Stopped before its directory is removed (fields drop only after this body).
        self.process.stop();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// One client's connection to etcd, and the lease of its open "update".
pub struct EtcdConn {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    current: i64,
}

fn key(record: &topology_claims::ClaimRecord) -> Vec<u8> {
    format!("/claims/{}/{}", record.key.namespace, record.key.value).into_bytes()
}

fn compare(key: Vec<u8>, target: CompareTarget, value: TargetUnion) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: target as i32,
        key,
        target_union: Some(value),
        range_end: Vec::new(),
    }
}

fn put(key: Vec<u8>, value: &str, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestPut(PutRequest {
            key,
            value: value.as_bytes().to_vec(),
            lease,
            ..Default::default()
        })),
    }
}

fn status_reason(status: tonic::Status) -> Reason {
    format!("ETCD_{:?}", status.code()).to_uppercase()
}

impl EtcdConn {
    pub async fn connect(endpoint: &str) -> Result<Self, String> {
        let channel = Endpoint::from_shared(endpoint.to_owned())
            .map_err(|e| format!("bad etcd URL {endpoint:?}: {e}"))?
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(|e| format!("cannot connect to etcd at {endpoint}: {e}"))?;
        Ok(Self {
            kv: KvClient::new(channel.clone()),
            lease: LeaseClient::new(channel),
            current: 0,
        })
    }

    pub async fn begin(&mut self, batch: &Batch) -> Result<(), Reason> {
        let granted = self
            .lease
            .lease_grant(LeaseGrantRequest {
                ttl: LEASE_TTL_SECONDS,
                id: 0,
            })
            .await
            .map_err(status_reason)?
            .into_inner();
        if !granted.error.is_empty() {
            return Err("ETCD_LEASE_GRANT".into());
        }
        let cell = batch.cell.as_str();
        let compares = batch
            .records
            .iter()
            .flat_map(|record| match batch.op {
                LeaseOp::Create => vec![compare(
                    key(record),
                    CompareTarget::Create,
                    TargetUnion::CreateRevision(0),
                )],
                // An update is leased like a destroy: ours and not leased.
                LeaseOp::Destroy | LeaseOp::Update => vec![
                    compare(key(record), CompareTarget::Lease, TargetUnion::Lease(0)),
                    compare(
                        key(record),
                        CompareTarget::Value,
                        TargetUnion::Value(cell.as_bytes().to_vec()),
                    ),
                ],
            })
            .collect();
        let success = batch
            .records
            .iter()
            .map(|record| put(key(record), cell, granted.id))
            .collect();
        let answer = self
            .kv
            .txn(TxnRequest {
                compare: compares,
                success,
                failure: Vec::new(),
            })
            .await
            .map_err(status_reason)?
            .into_inner();
        if answer.succeeded {
            self.current = granted.id;
            Ok(())
        } else {
            Err("CLAIM_TAKEN_OR_LEASED".into())
        }
    }

    pub async fn commit(&mut self, batch: &Batch) -> Result<(), Reason> {
        let lease = self.current;
        let cell = batch.cell.as_str();
        let compares = batch
            .records
            .iter()
            .map(|record| compare(key(record), CompareTarget::Lease, TargetUnion::Lease(lease)))
            .collect();
        let success = batch
            .records
            .iter()
            .map(|record| match batch.op {
                // The value here is only the cell, which an update keeps.
                LeaseOp::Create | LeaseOp::Update => put(key(record), cell, 0),
                LeaseOp::Destroy => RequestOp {
                    request: Some(Request::RequestDeleteRange(DeleteRangeRequest {
                        key: key(record),
                        ..Default::default()
                    })),
                },
            })
            .collect();
        let answer = self
            .kv
            .txn(TxnRequest {
                compare: compares,
                success,
                failure: Vec::new(),
            })
            .await
            .map_err(status_reason)?
            .into_inner();
        if answer.succeeded {
            Ok(())
        } else {
            Err("LEASE_NOT_FOUND".into())
        }
    }
}

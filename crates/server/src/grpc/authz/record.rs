//! An audit line in the making (`grpc::audit` writes it): who called, what the request names
//! (read from its wire fields, decoding only the claims it lists), and the answer's code, read
//! from a trailers-only status or from the replayed response.
//!
//! Owns filling in a line; bounding and writing lines is `grpc::audit`'s.

use std::sync::Arc;
use std::time::Instant;

use http_body_util::BodyExt;
use prost::Message;
use tonic::body::Body;

use super::wire::{first_message, Fields, Replay, RequestShape, Value};
use super::{identity_of, status_in};
use crate::auth::{Caller, Method};
use crate::grpc::audit::{timestamp_text, AdminAudit, AuditLog, AuditRecord, AuditedClaim};
use crate::grpc::listener::ConnInfo;
use crate::grpc::pb;
use crate::grpc::pb::admin as apb;
use crate::grpc::status::code_name;
use topology_claims::domain::{ClaimType, NamespaceId};

/// An audit line in the making.
pub(super) struct Audit {
    log: Arc<AuditLog>,
    pub(super) record: AuditRecord,
    started: Instant,
}

impl Audit {
    pub(super) fn start(
        log: Option<Arc<AuditLog>>,
        info: Option<&ConnInfo>,
        caller: &Caller,
        method: Method,
        started: Instant,
    ) -> Option<Audit> {
        let log = log?;
        let (identity, role) = identity_of(caller);
        Some(Audit {
            log,
            record: AuditRecord {
                peer: info
                    .and_then(|i| i.remote_addr)
                    .map(|a| a.to_string())
                    .unwrap_or_default(),
                identity: identity.to_owned(),
                role: role.to_owned(),
                method: format!("{method:?}"),
                ..AuditRecord::default()
            },
            started,
        })
    }

    /// What the request names: cell, lease, claims (at most `claims_logged` of them; all are
    /// counted). Read from the wire fields, decoding only the claims it lists.
    pub(super) fn request(&mut self, method: Method, message: &[u8], claims_logged: usize) {
        let r = &mut self.record;
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        match method {
            Method::BeginUpdate => {
                for (number, value) in Fields::new(message).map_while(Result::ok) {
                    if let (7, Value::Varint(flag)) = (number, value) {
                        r.restore_correction = flag != 0;
                        continue;
                    }
                    let Value::Bytes(bytes) = value else { continue };
                    let op = match number {
                        1 => {
                            r.cell_id = text(bytes);
                            continue;
                        }
                        4 => {
                            r.lease_id = text(bytes);
                            continue;
                        }
                        2 => "create",
                        3 => "destroy",
                        5 => "update",
                        _ => continue,
                    };
                    r.claim_count += 1;
                    if r.claims.len() < claims_logged {
                        let c = pb::ClaimRecord::decode(bytes).unwrap_or_default();
                        r.claims.push(AuditedClaim {
                            op,
                            namespace: match ClaimType::from_number(i64::from(c.claim_type)) {
                                _ if !c.namespace.is_empty() => c.namespace,
                                Some(t) => NamespaceId::of_claim_type(t).to_string(),
                                None => c.claim_type.to_string(),
                            },
                            claim_value: c.claim_value,
                        });
                    }
                }
            }
            Method::CommitUpdate | Method::RollbackUpdate | Method::RenewLease => {
                // The three share their shape: cell_id = 1, lease_id = 2.
                if let Ok(request) = pb::CommitUpdateRequest::decode(message) {
                    r.cell_id = request.cell_id;
                    r.lease_id = request.lease_id;
                }
            }
            Method::ListLeases => {
                if let Ok(request) = apb::ListLeasesRequest::decode(message) {
                    r.cell_id = request.cell_id;
                    r.admin = Some(AdminAudit {
                        older_than_seconds: seconds(request.older_than.as_ref()),
                        ..AdminAudit::default()
                    });
                }
            }
            Method::ForceRollback => {
                if let Ok(request) = apb::ForceRollbackRequest::decode(message) {
                    r.cell_id = request.cell_id;
                    r.admin = Some(AdminAudit {
                        reason: request.reason,
                        dry_run: request.dry_run,
                        older_than_seconds: seconds(request.older_than.as_ref()),
                        ..AdminAudit::default()
                    });
                }
            }
            Method::MarkRestored => {
                if let Ok(request) = apb::MarkRestoredRequest::decode(message) {
                    r.admin = Some(AdminAudit {
                        reason: request.reason,
                        backup_time: Some(
                            request
                                .backup_time
                                .as_ref()
                                .map_or_else(|| "(unset)".to_owned(), timestamp_text),
                        ),
                        expect_cells: request.expect_cells,
                        ..AdminAudit::default()
                    });
                }
            }
            Method::UpdateNamespace => {
                if let Ok(request) = apb::UpdateNamespaceRequest::decode(message) {
                    r.admin = Some(AdminAudit {
                        namespace_change: Some(namespace_change(&request)),
                        reason: request.reason,
                        ..AdminAudit::default()
                    });
                }
            }
            Method::CreateNamespace => {
                if let Ok(request) = apb::CreateNamespaceRequest::decode(message) {
                    let id = request.namespace.as_ref().map_or("", |n| n.id.as_str());
                    r.admin = Some(AdminAudit {
                        namespace_change: Some(format!("{id}: created")),
                        reason: request.reason,
                        ..AdminAudit::default()
                    });
                }
            }
            Method::DeleteNamespace => {
                if let Ok(request) = apb::DeleteNamespaceRequest::decode(message) {
                    r.admin = Some(AdminAudit {
                        namespace_change: Some(format!("{}: deleted", request.id)),
                        reason: request.reason,
                        ..AdminAudit::default()
                    });
                }
            }
            Method::LiftQuarantine => {
                if let Ok(request) = apb::LiftQuarantineRequest::decode(message) {
                    r.admin = Some(AdminAudit {
                        reason: request.reason,
                        epoch: Some(request.epoch),
                        ..AdminAudit::default()
                    });
                }
            }
            Method::DecommissionCell => {
                if let Ok(request) = apb::DecommissionCellRequest::decode(message) {
                    r.cell_id = request.cell_id;
                    r.admin = Some(AdminAudit {
                        reason: request.reason,
                        dry_run: request.dry_run,
                        ..AdminAudit::default()
                    });
                }
            }
            _ => {
                if let Ok(shape) = RequestShape::read(method, message) {
                    r.cell_id = shape.cell_id;
                }
            }
        }
        if method.is_admin() && r.admin.is_none() {
            // Undecodable: the handler refuses it; the line still says who tried.
            r.admin = Some(AdminAudit::default());
        }
    }

    /// Writes, and syncs, the line that comes before an admin call acts (`stage` `intent`, no
    /// code yet); the line written when it is answered says `done`.
    pub(super) async fn intent(&mut self) -> Result<(), String> {
        let mut line = self.record.clone();
        if let Some(admin) = line.admin.as_mut() {
            admin.stage = "intent";
        }
        line.duration_ms = 0.0;
        if let Some(admin) = self.record.admin.as_mut() {
            admin.stage = "done";
        }
        self.log.write_durable(line).await
    }

    /// Writes the line of an answered call: its code from the headers (a trailers-only error)
    /// or the trailers, and a BeginUpdate's lease id from its response when the server chose
    /// it. The response is read whole (one small unary message) and replayed unchanged.
    pub(super) async fn finish(
        mut self,
        method: Method,
        response: http::Response<Body>,
    ) -> http::Response<Body> {
        if tonic::Status::from_header_map(response.headers()).is_some() {
            let (code, reason) = status_in(response.headers());
            self.write_outcome(code, reason);
            return response;
        }
        let (parts, body) = response.into_parts();
        match body.collect().await {
            Ok(collected) => {
                let trailers = collected.trailers().cloned().unwrap_or_default();
                let data = collected.to_bytes();
                if let (Some(admin), Some(message)) =
                    (self.record.admin.as_mut(), first_message(&data))
                {
                    admin_outcome(admin, method, message);
                }
                if method == Method::BeginUpdate && self.record.lease_id.is_empty() {
                    if let Some(lease) = first_message(&data)
                        .and_then(|m| pb::BeginUpdateResponse::decode(m).ok())
                        .and_then(|r| r.lease_payload)
                    {
                        self.record.lease_id = lease.lease_id;
                    }
                }
                let (code, reason) = status_in(&trailers);
                self.write_outcome(code, reason);
                let replay = Replay {
                    data: Some(data),
                    trailers: Some(trailers),
                };
                http::Response::from_parts(parts, Body::new(replay))
            }
            Err(status) => {
                self.write_outcome(code_name(status.code()), String::new());
                status.into_http()
            }
        }
    }

    pub(super) fn write_outcome(&mut self, code: &str, reason: String) {
        code.clone_into(&mut self.record.code);
        self.record.reason = reason;
        self.write();
    }

    pub(super) fn write(&mut self) {
        self.record.duration_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        self.log.write(std::mem::take(&mut self.record));
    }
}

/// What an admin call did, from its answer: the leases a ForceRollback rolled back, the claims
/// it or a DecommissionCell released, the epoch after a MarkRestored or LiftQuarantine.
fn admin_outcome(admin: &mut AdminAudit, method: Method, message: &[u8]) {
    match method {
        Method::ForceRollback => {
            if let Ok(done) = apb::ForceRollbackResponse::decode(message) {
                admin.lease_count = Some(done.lease_ids.len() as u64);
                admin.lease_ids = done.lease_ids;
                admin.claims = Some(done.claims);
            }
        }
        Method::DecommissionCell => {
            if let Ok(done) = apb::DecommissionCellResponse::decode(message) {
                admin.claims = Some(done.claims);
            }
        }
        Method::MarkRestored | Method::LiftQuarantine => {
            if let Ok(status) = apb::RestoreStatus::decode(message) {
                admin.epoch = Some(status.epoch);
            }
        }
        _ => {}
    }
}

/// Whole seconds of an optional protobuf duration (0 when absent or negative).
fn seconds(duration: Option<&prost_types::Duration>) -> u64 {
    duration.map_or(0, |d| u64::try_from(d.seconds).unwrap_or(0))
}

/// What an UpdateNamespaceRequest asks to change, as the audit line says it.
fn namespace_change(request: &apb::UpdateNamespaceRequest) -> String {
    let mut changes = Vec::new();
    if request.normalization != 0 {
        changes.push(format!("normalization={}", request.normalization));
    }
    if let Some(max_chars) = request.max_chars {
        changes.push(format!("max_chars={max_chars}"));
    }
    if let Some(pattern) = &request.pattern {
        changes.push(format!("pattern={pattern:?}"));
    }
    if request.set_reserved {
        changes.push(format!("reserved={:?}", request.reserved));
    }
    if request.description.is_some() {
        changes.push("description".to_owned());
    }
    if let Some(deprecated) = request.deprecated {
        changes.push(format!("deprecated={deprecated}"));
    }
    format!("{}: {}", request.id, changes.join(", "))
}

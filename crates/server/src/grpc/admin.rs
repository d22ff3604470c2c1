//! The tonic `AdminService` (`topology.claims.admin.v1`): ListLeases, ForceRollback and
//! DecommissionCell over any [`ClaimStore`]. Each handler decodes, asks `topology_claims::domain::admin`
//! which leases or steps the request means, and calls the store; a force rollback ends each
//! lease through the store's RollbackUpdate, so the same domain decision applies and the outcome
//! is remembered.
//!
//! Must stay thin like `service`: who may call is the authorization layer's (the admin role, or
//! loopback in plaintext), the audit line before acting is the authorization layer's too.

use std::sync::Arc;

use prost::Message;
use tonic::{Request, Response, Status};

use crate::grpc::convert::{self, duration_from_pb, duration_to_pb};
use crate::grpc::pb;
use crate::grpc::pb::admin as apb;
use crate::grpc::pb::admin::admin_service_server::AdminService;
use crate::grpc::status::to_status;
use crate::restore::RestoreGate;
use topology_claims::codec::timestamp_to_pb;
use topology_claims::domain::{
    self, CellId, Lease, LeaseId, LeasesQuery, RestoreEpoch, Timestamp, LEASES_DEFAULT_LIMIT,
    LEASES_MAX_LIMIT, LEASES_READ_CHUNK,
};
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;
use topology_claims_proto::namespaces::{
    namespace_spec_from_pb, namespace_to_pb, namespace_update_from_pb,
};

/// Most leases one ForceRollback call ends (its `limit`).
pub const FORCE_ROLLBACK_MAX_LIMIT: usize = 1000;

/// `topology.claims.admin.v1.AdminService` over any [`ClaimStore`].
#[derive(Clone)]
pub struct AdminServiceImpl {
    store: Arc<dyn ClaimStore>,
    max_response_bytes: usize,
    /// The server's restore gate: a mark or a lift made here applies to this server at once.
    restore: Arc<RestoreGate>,
    /// `serve --max-namespaces`.
    max_namespaces: usize,
}

impl AdminServiceImpl {
    pub fn new(store: Arc<dyn ClaimStore>, max_response_bytes: usize) -> Self {
        let restore = Arc::new(RestoreGate::new(Arc::clone(&store), true));
        Self {
            store,
            max_response_bytes,
            restore,
            max_namespaces: domain::DEFAULT_MAX_NAMESPACES,
        }
    }

    /// At most `max` namespaces in the store (`serve --max-namespaces`).
    pub fn with_max_namespaces(mut self, max: usize) -> Self {
        self.max_namespaces = max;
        self
    }

    /// Shares `gate` with the ClaimsService.
    pub fn with_restore(mut self, gate: Arc<RestoreGate>) -> Self {
        self.restore = gate;
        self
    }

    /// Keeps `state` in the gate and answers it.
    fn restore_status(&self, state: RestoreEpoch) -> apb::RestoreStatus {
        self.restore.set(Some(state.clone()));
        convert::restore_status_to_pb(Some(&state), self.restore.enforce())
    }

    /// Every outstanding lease of `cell_id` after `after`, in lease-id order, read in chunks;
    /// `keep` picks the ones to return, and reading stops once `want` are kept (one more is
    /// looked for, to tell whether there are more). Returns the kept leases, whether more
    /// remain, and the store's clock of the first read.
    async fn scan_cell(
        &self,
        cell_id: &CellId,
        mut after: Option<LeaseId>,
        want: usize,
        keep: impl Fn(&Lease, Timestamp) -> bool,
    ) -> Result<(Vec<Lease>, bool, Option<Timestamp>), ClaimsError> {
        let mut kept = Vec::new();
        let mut server_time = None;
        loop {
            let page = self
                .store
                .list_outstanding_leases(&LeasesQuery {
                    cell_id: cell_id.clone(),
                    after,
                    limit: LEASES_READ_CHUNK,
                    max_bytes: usize::MAX,
                })
                .await?;
            let now = *server_time.get_or_insert(page.server_time);
            for lease in page.leases {
                if keep(&lease, now) {
                    if kept.len() == want {
                        return Ok((kept, true, server_time));
                    }
                    kept.push(lease);
                }
            }
            match page.next_cursor {
                Some(cursor) => after = Some(cursor),
                None => return Ok((kept, false, server_time)),
            }
        }
    }

    async fn list_leases(
        &self,
        request: &apb::ListLeasesRequest,
    ) -> Result<apb::ListLeasesResponse, ClaimsError> {
        let older_than = duration_from_pb(request.older_than.as_ref(), "older_than")?;
        let limit = domain::page_limit(
            request.limit,
            LEASES_DEFAULT_LIMIT,
            LEASES_MAX_LIMIT,
            "limit",
        )?;
        let (cursor_cell, cursor_lease) = parse_cursor(&request.cursor)?;
        let summary = self.store.lease_summary().await?;
        let mut server_time = summary.server_time;
        let cells: Vec<CellId> = if request.cell_id.is_empty() {
            summary.cells.into_iter().map(|c| c.cell_id).collect()
        } else {
            vec![CellId::parse(&request.cell_id)?]
        };
        let mut response = apb::ListLeasesResponse::default();
        let mut used = 0usize;
        for cell_id in cells {
            let after = match &cursor_cell {
                Some(cell) if &cell_id < cell => continue,
                Some(cell) if &cell_id == cell => cursor_lease,
                _ => None,
            };
            let want = limit - response.leases.len();
            let (leases, more, time) = self
                .scan_cell(&cell_id, after, want, |lease, now| {
                    domain::lease_unrenewed_for(lease, now, older_than)
                })
                .await?;
            server_time = time.unwrap_or(server_time);
            for lease in &leases {
                let entry = apb::AdminLease {
                    lease: Some(pb::OutstandingLease {
                        lease_payload: Some(convert::lease_payload_to_pb(lease)),
                        last_renewed_at: Some(timestamp_to_pb(lease.last_renewed_at)),
                    }),
                    age: Some(duration_to_pb(
                        server_time.saturating_since(lease.created_at),
                    )),
                    unrenewed_for: Some(duration_to_pb(
                        server_time.saturating_since(lease.last_renewed_at),
                    )),
                };
                let size = entry.encoded_len() + 8;
                if !response.leases.is_empty() && used + size > self.max_response_bytes {
                    response.next_cursor = cursor_of(&response.leases);
                    response.server_time = Some(timestamp_to_pb(server_time));
                    return Ok(response);
                }
                used += size;
                response.leases.push(entry);
            }
            if more || response.leases.len() >= limit {
                response.next_cursor = cursor_of(&response.leases);
                break;
            }
        }
        response.server_time = Some(timestamp_to_pb(server_time));
        Ok(response)
    }

    async fn force_rollback(
        &self,
        request: &apb::ForceRollbackRequest,
    ) -> Result<apb::ForceRollbackResponse, ClaimsError> {
        let cell_id = CellId::parse(&request.cell_id)?;
        let older_than = duration_from_pb(request.older_than.as_ref(), "older_than")?;
        check_reason(&request.reason, request.dry_run)?;
        let limit = domain::page_limit(
            request.limit,
            FORCE_ROLLBACK_MAX_LIMIT,
            FORCE_ROLLBACK_MAX_LIMIT,
            "limit",
        )?;
        let (leases, more, server_time) = self
            .scan_cell(&cell_id, None, limit, |lease, now| {
                domain::lease_unrenewed_for(lease, now, older_than)
            })
            .await?;
        let server_time = server_time.unwrap_or(Timestamp::from_unix_micros(0));
        let chosen = domain::force_rollback_selection(&cell_id, &leases, server_time, older_than);
        let mut response = apb::ForceRollbackResponse {
            dry_run: request.dry_run,
            more,
            ..Default::default()
        };
        for lease in leases.iter().filter(|l| chosen.contains(&l.lease_id)) {
            if !request.dry_run {
                // Conditional: the store judges the window again in the rollback's transaction,
                // so a cell that renewed since the scan keeps its lease.
                match self
                    .store
                    .rollback_update(&cell_id, lease.lease_id, Some(older_than))
                    .await
                {
                    Ok(()) => {}
                    Err(ClaimsError::LeaseRenewed { .. }) => {
                        response.renewed_lease_ids.push(lease.lease_id.to_string());
                        continue;
                    }
                    // The cell came back and committed it while this ran: nothing to undo.
                    Err(ClaimsError::LeaseCommitted { .. }) => {
                        response
                            .already_ended_lease_ids
                            .push(lease.lease_id.to_string());
                        continue;
                    }
                    Err(error) => return Err(error),
                }
                tracing::warn!(cell_id = %cell_id, lease_id = %lease.lease_id,
                    claims = lease.request.len(), reason = %request.reason,
                    "force rollback: lease rolled back");
            }
            response.lease_ids.push(lease.lease_id.to_string());
            response.claims += lease.request.len() as u64;
        }
        Ok(response)
    }

    async fn decommission_cell(
        &self,
        request: &apb::DecommissionCellRequest,
    ) -> Result<apb::DecommissionCellResponse, ClaimsError> {
        let cell_id = CellId::parse(&request.cell_id)?;
        check_reason(&request.reason, request.dry_run)?;
        let batch = domain::decommission_batch(request.batch_size as usize)?;
        let step = self
            .store
            .decommission_step(&cell_id, batch, request.dry_run)
            .await?;
        if !step.dry_run {
            tracing::info!(cell_id = %cell_id, deleted = step.claims, complete = step.complete,
                reason = %request.reason, "decommission: step done");
        }
        Ok(apb::DecommissionCellResponse {
            claims: step.claims,
            complete: step.complete,
            already_decommissioned: step.already_decommissioned,
            dry_run: step.dry_run,
        })
    }
}

/// The one exit of every handler: domain errors become statuses through `to_status`.
fn respond<T>(result: Result<T, ClaimsError>) -> Result<Response<T>, Status> {
    result.map(Response::new).map_err(|error| to_status(&error))
}

#[tonic::async_trait]
impl AdminService for AdminServiceImpl {
    async fn list_leases(
        &self,
        request: Request<apb::ListLeasesRequest>,
    ) -> Result<Response<apb::ListLeasesResponse>, Status> {
        respond(AdminServiceImpl::list_leases(self, request.get_ref()).await)
    }

    async fn force_rollback(
        &self,
        request: Request<apb::ForceRollbackRequest>,
    ) -> Result<Response<apb::ForceRollbackResponse>, Status> {
        respond(AdminServiceImpl::force_rollback(self, request.get_ref()).await)
    }

    async fn decommission_cell(
        &self,
        request: Request<apb::DecommissionCellRequest>,
    ) -> Result<Response<apb::DecommissionCellResponse>, Status> {
        respond(AdminServiceImpl::decommission_cell(self, request.get_ref()).await)
    }

    async fn mark_restored(
        &self,
        request: Request<apb::MarkRestoredRequest>,
    ) -> Result<Response<apb::RestoreStatus>, Status> {
        respond(
            async {
                let mark = convert::mark_restored_from_pb(request.get_ref())?;
                let state = self.store.mark_restored(&mark).await?;
                tracing::warn!(
                    epoch = state.epoch,
                    expected_cells = state.expected_cells.len(),
                    quarantine_enforced =
                        domain::quarantine_active(Some(&state), self.restore.enforce()),
                    "store marked restored from a backup"
                );
                Ok(self.restore_status(state))
            }
            .await,
        )
    }

    async fn lift_quarantine(
        &self,
        request: Request<apb::LiftQuarantineRequest>,
    ) -> Result<Response<apb::RestoreStatus>, Status> {
        respond(
            async {
                let request = request.get_ref();
                let state = self
                    .store
                    .lift_quarantine(request.epoch, &request.reason)
                    .await?;
                tracing::warn!(
                    epoch = state.epoch,
                    pending_cells = state.pending_cells().count(),
                    "restore quarantine lifted by an operator"
                );
                Ok(self.restore_status(state))
            }
            .await,
        )
    }

    async fn list_namespaces(
        &self,
        _request: Request<apb::ListNamespacesRequest>,
    ) -> Result<Response<apb::ListNamespacesResponse>, Status> {
        respond(
            async {
                let namespaces = self.store.namespaces().await?;
                Ok(apb::ListNamespacesResponse {
                    namespaces: namespaces.iter().map(namespace_to_pb).collect(),
                })
            }
            .await,
        )
    }

    async fn count_claims(
        &self,
        _request: Request<apb::CountClaimsRequest>,
    ) -> Result<Response<apb::CountClaimsResponse>, Status> {
        respond(
            async {
                let counts = self.store.count_claims().await?;
                Ok(apb::CountClaimsResponse {
                    namespaces: counts
                        .into_iter()
                        .map(|(id, claims)| apb::count_claims_response::NamespaceClaims {
                            namespace: id.to_string(),
                            claims,
                        })
                        .collect(),
                })
            }
            .await,
        )
    }

    async fn get_namespace(
        &self,
        request: Request<apb::GetNamespaceRequest>,
    ) -> Result<Response<apb::Namespace>, Status> {
        respond(
            async {
                let namespaces = self.store.namespaces().await?;
                let id = &request.get_ref().id;
                let found = namespaces
                    .iter()
                    .find(|s| s.namespace.id.as_str() == id)
                    .ok_or_else(|| ClaimsError::NamespaceNotFound {
                        namespace: id.clone(),
                    })?;
                Ok(namespace_to_pb(found))
            }
            .await,
        )
    }

    async fn create_namespace(
        &self,
        request: Request<apb::CreateNamespaceRequest>,
    ) -> Result<Response<apb::Namespace>, Status> {
        respond(
            async {
                let request = request.get_ref();
                check_reason(&request.reason, false)?;
                let spec = namespace_spec_from_pb(request.namespace.as_ref())?;
                let created = self
                    .store
                    .create_namespace(spec, self.max_namespaces)
                    .await?;
                tracing::warn!(
                    namespace = %created.namespace.id,
                    number = created.number,
                    normalization = %created.namespace.rules.normalization,
                    "namespace created by an operator"
                );
                Ok(namespace_to_pb(&created))
            }
            .await,
        )
    }

    async fn delete_namespace(
        &self,
        request: Request<apb::DeleteNamespaceRequest>,
    ) -> Result<Response<apb::DeleteNamespaceResponse>, Status> {
        respond(
            async {
                let request = request.get_ref();
                check_reason(&request.reason, false)?;
                self.store.delete_namespace(&request.id).await?;
                tracing::warn!(namespace = %request.id, "namespace deleted by an operator");
                Ok(apb::DeleteNamespaceResponse {})
            }
            .await,
        )
    }

    async fn update_namespace(
        &self,
        request: Request<apb::UpdateNamespaceRequest>,
    ) -> Result<Response<apb::Namespace>, Status> {
        respond(
            async {
                let request = request.get_ref();
                check_reason(&request.reason, false)?;
                let (id, update) = namespace_update_from_pb(request)?;
                let changed = self.store.update_namespace(&id, update).await?;
                tracing::warn!(
                    namespace = %changed.namespace.id,
                    version = changed.namespace.version,
                    normalization = %changed.namespace.rules.normalization,
                    deprecated = changed.namespace.deprecated,
                    "namespace rules changed by an operator"
                );
                Ok(namespace_to_pb(&changed))
            }
            .await,
        )
    }

    async fn get_restore_status(
        &self,
        _request: Request<apb::GetRestoreStatusRequest>,
    ) -> Result<Response<apb::RestoreStatus>, Status> {
        respond(
            async {
                Ok(match self.store.restore_state().await? {
                    Some(state) => self.restore_status(state),
                    None => convert::restore_status_to_pb(None, self.restore.enforce()),
                })
            }
            .await,
        )
    }
}

/// An acting admin call must say why: the reason goes to the audit log.
fn check_reason(reason: &str, dry_run: bool) -> Result<(), ClaimsError> {
    if !dry_run && reason.trim().is_empty() {
        return Err(ClaimsError::invalid(
            "reason",
            "must say why (it is written to the audit log)",
        ));
    }
    if reason.len() > 1024 {
        return Err(ClaimsError::invalid(
            "reason",
            format!("must be at most 1024 bytes, got {}", reason.len()),
        ));
    }
    Ok(())
}

/// A ListLeases cursor: the lease id (36 characters) followed by its cell id.
fn cursor_of(leases: &[apb::AdminLease]) -> String {
    leases
        .last()
        .and_then(|l| l.lease.as_ref())
        .and_then(|l| l.lease_payload.as_ref())
        .map(|p| format!("{}{}", p.lease_id, p.cell_id))
        .unwrap_or_default()
}

fn parse_cursor(cursor: &str) -> Result<(Option<CellId>, Option<LeaseId>), ClaimsError> {
    if cursor.is_empty() {
        return Ok((None, None));
    }
    let malformed = || ClaimsError::invalid("cursor", "not a cursor this server returned");
    if cursor.len() <= 36 || !cursor.is_char_boundary(36) {
        return Err(malformed());
    }
    let (lease, cell) = cursor.split_at(36);
    let lease = LeaseId::parse(lease).map_err(|_| malformed())?;
    let cell = CellId::parse(cell).map_err(|_| malformed())?;
    Ok((Some(cell), Some(lease)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_names_the_lease_and_its_cell() {
        let lease = LeaseId::generate();
        let entry = apb::AdminLease {
            lease: Some(pb::OutstandingLease {
                lease_payload: Some(pb::LeasePayload {
                    lease_id: lease.to_string(),
                    cell_id: "cell-a".into(),
                    ..Default::default()
                }),
                last_renewed_at: None,
            }),
            age: None,
            unrenewed_for: None,
        };
        let cursor = cursor_of(&[entry]);
        assert_eq!(
            parse_cursor(&cursor).unwrap(),
            (Some(CellId::parse("cell-a").unwrap()), Some(lease))
        );
        assert!(parse_cursor("garbage").is_err());
        assert_eq!(parse_cursor("").unwrap(), (None, None));
    }

    #[test]
    fn an_acting_call_needs_a_reason() {
        assert!(check_reason("", false).is_err());
        assert!(check_reason("  ", false).is_err());
        assert!(check_reason("", true).is_ok());
        assert!(check_reason("cell-a is gone", false).is_ok());
    }
}

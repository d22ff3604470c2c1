//! [`GrpcClaimStore`]: a [`ClaimStore`] that answers every call through the real gRPC server
//! ([`TestServer`], `grpc::server::serve`) and a tonic client, so the conformance suite and the
//! model test run once more over the wire (as quickwit runs its metastore suite through its gRPC
//! adapter). A case that passes on the inner store but fails here is a bug of the front end: a
//! conversion that loses a field, a status that maps back to another error.
//!
//! Requests are encoded and responses decoded by the same functions the server and the cell's
//! client use (`topology_claims_proto::convert`, `topology_claims_client::decode`); statuses
//! become errors through `topology_claims_proto::status::from_status`. Two things have no RPC of their own:
//!
//! - `collect_outcomes` is the server's background job, not an API call: it goes to the inner
//!   store directly.
//! - The API shows a claim's state but not the lease holding it (`ClaimView`: lease ids are not
//!   revealed to other cells), while the port returns that lease (`Claim::lease`). The adapter
//!   finds it as a client could: the one outstanding lease of the claim's cell whose request
//!   creates (CREATING) or destroys (DESTROYING) the claim, read with ListOutstandingLeases. None
//!   or several such leases is an `Internal` error, so an inconsistent store still fails the suite.
//!
//! The byte budget of list pages is the server's, not a request field: the test server serves
//! with the default, and a query with another `max_bytes` is refused (`Internal`).
//!
//! Test scaffolding only (feature `grpc`): no retries, no deadlines, no reconnects.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tonic::transport::Channel;

use crate::conformance::{SUITE_SLOTS, SUITE_SLOTS_PER_CELL};
use crate::server::TestServer;
use topology_claims::domain::DEFAULT_VERIFICATION_SLOT_TTL;
use topology_claims::domain::{
    BeginUpdate, CellId, Claim, ClaimKey, ClaimLease, ClaimState, ClaimView, ClaimsPage,
    ClaimsQuery, DecommissionStep, EventsPage, EventsQuery, Lease, LeaseId, LeaseOp, LeaseSummary,
    LeasesPage, LeasesQuery, MarkRestored, RestoreEpoch, SlotGrant, SlotHolder, SlotLimit,
    Timestamp, DEFAULT_MAX_RESPONSE_BYTES, LEASES_MAX_LIMIT,
};
use topology_claims::domain::{NamespaceId, NamespaceSpec, NamespaceUpdate, StoredNamespace};
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;
use topology_claims_client::decode;
use topology_claims_proto::convert::begin_update_to_pb;
use topology_claims_proto::namespaces::{namespace_from_pb, normalization_to_pb};
use topology_claims_proto::pb::admin as apb;
use topology_claims_proto::pb::admin::admin_service_client::AdminServiceClient;
use topology_claims_proto::pb::claims_service_client::ClaimsServiceClient;
use topology_claims_proto::{pb, status};
use topology_claims_server::grpc::server::ServerConfig;

/// The response budget is the server's (`--max-response-bytes`), not part of a request: the
/// test server runs with the default, so a query asking for another budget could not be
/// answered truthfully and is refused rather than answered with other pages.
fn served_budget(max_bytes: usize) -> Result<(), ClaimsError> {
    if max_bytes == DEFAULT_MAX_RESPONSE_BYTES {
        Ok(())
    } else {
        Err(ClaimsError::internal(format!(
            "GrpcClaimStore serves with the default response budget \
             ({DEFAULT_MAX_RESPONSE_BYTES} bytes); the query asks for {max_bytes}"
        )))
    }
}

/// The slot limit is the server's (`--max-concurrent-verifications`, `--verification-slot-ttl`),
/// not part of a request (whose ttl may only shorten the server's): the test server serves
/// [`SUITE_SLOTS`] with the default ttl, and a query with another limit is refused.
fn served_slot_limit(limit: SlotLimit) -> Result<(), ClaimsError> {
    if limit.max == SUITE_SLOTS
        && limit.per_cell == SUITE_SLOTS_PER_CELL
        && limit.ttl <= DEFAULT_VERIFICATION_SLOT_TTL
    {
        Ok(())
    } else {
        Err(ClaimsError::internal(format!(
            "GrpcClaimStore serves {SUITE_SLOTS} verification slots ({SUITE_SLOTS_PER_CELL} per \
             cell) of at most {DEFAULT_VERIFICATION_SLOT_TTL:?}; the query asks for {limit:?}"
        )))
    }
}

/// A [`ClaimStore`] over a gRPC connection to a [`TestServer`] that serves an inner store.
pub struct GrpcClaimStore {
    client: ClaimsServiceClient<Channel>,
    admin: AdminServiceClient<Channel>,
    inner: Arc<dyn ClaimStore>,
}

/// Keeps a [`GrpcClaimStore`]'s server running, and then the inner store's own guard alive.
/// Fields drop in order: the server is stopped before the inner guard goes.
pub struct GrpcStoreGuard<G> {
    _server: TestServer,
    _inner: G,
}

impl GrpcClaimStore {
    /// Serves `inner` on a fresh [`TestServer`] (default `ServerConfig`, [`SUITE_SLOTS`]
    /// verification slots) and connects to it.
    /// Takes and returns the `(store, guard)` pair of the conformance factory contract, so any
    /// factory's store can be run through the wire:
    /// `GrpcClaimStore::serve(other_factory().await).await`.
    pub async fn serve<S: ClaimStore, G>(
        (inner, guard): (S, G),
    ) -> (GrpcClaimStore, GrpcStoreGuard<G>) {
        let inner: Arc<dyn ClaimStore> = Arc::new(inner);
        let config = ServerConfig {
            max_concurrent_verifications: SUITE_SLOTS,
            max_verifications_per_cell: SUITE_SLOTS_PER_CELL,
            // The suite is the store's contract, in which a restore epoch refuses nothing; the
            // front end's quarantine is tested on its own (cli/tests/admin.rs, restore_drill).
            restore_quarantine: false,
            ..ServerConfig::default()
        };
        let server = TestServer::start_with(Arc::clone(&inner), config).await;
        let client = server.client().await;
        let admin = server.admin_client().await;
        let store = GrpcClaimStore {
            client,
            admin,
            inner,
        };
        let guard = GrpcStoreGuard {
            _server: server,
            _inner: guard,
        };
        (store, guard)
    }

    /// A handle for one call (tonic's calls take `&mut self`; clones share the channel).
    fn client(&self) -> ClaimsServiceClient<Channel> {
        self.client.clone()
    }

    /// Every outstanding lease of `cell_id`, all pages.
    async fn all_outstanding(&self, cell_id: &CellId) -> Result<Vec<Lease>, ClaimsError> {
        let mut leases = Vec::new();
        let mut query = LeasesQuery::new(cell_id.clone(), None, LEASES_MAX_LIMIT);
        loop {
            let page = self.list_outstanding_leases(&query).await?;
            leases.extend(page.leases);
            match page.next_cursor {
                Some(after) => query.after = Some(after),
                None => return Ok(leases),
            }
        }
    }

    /// The claims as the port returns them, each with the lease that holds it (see the module
    /// doc). `views` all belong to `cell_id`; its leases are read once, and only if needed.
    async fn with_leases(
        &self,
        cell_id: &CellId,
        views: Vec<ClaimView>,
    ) -> Result<Vec<Claim>, ClaimsError> {
        let mut holders: BTreeMap<(LeaseOp, ClaimKey), Vec<LeaseId>> = BTreeMap::new();
        if views.iter().any(|v| v.state != ClaimState::Active) {
            for lease in self.all_outstanding(cell_id).await? {
                for (op, record) in lease.request.operations() {
                    holders
                        .entry((op, record.key.clone()))
                        .or_default()
                        .push(lease.lease_id);
                }
            }
        }
        views
            .into_iter()
            .map(|view| {
                let op = match view.state {
                    ClaimState::Active => None,
                    ClaimState::Creating => Some(LeaseOp::Create),
                    ClaimState::Destroying => Some(LeaseOp::Destroy),
                    ClaimState::Updating => Some(LeaseOp::Update),
                };
                let lease = match op {
                    None => None,
                    Some(op) => {
                        let found = holders.get(&(op, view.record.key.clone()));
                        match found.map(Vec::as_slice) {
                            Some(&[lease_id]) => Some(ClaimLease { lease_id, op }),
                            other => {
                                return Err(ClaimsError::internal(format!(
                                    "claim {} of {} is {:?}, but the outstanding leases of its \
                                     cell holding it for {op:?} are {other:?}",
                                    view.record.key, view.cell_id, view.state
                                )))
                            }
                        }
                    }
                };
                Ok(Claim {
                    record: view.record,
                    cell_id: view.cell_id,
                    lease,
                    created_at: view.created_at,
                    updated_at: view.updated_at,
                    revision: view.revision,
                })
            })
            .collect()
    }
}

/// The wait line is the server's own (its waiting room); a client cannot reach it.
impl topology_claims::ports::WaitLine for GrpcClaimStore {}

#[async_trait]
impl ClaimStore for GrpcClaimStore {
    /// A WatchClaims from the query's revision, read until the first progress response (the
    /// stream has caught up) or one event past the limit.
    async fn read_events(&self, query: &EventsQuery) -> Result<EventsPage, ClaimsError> {
        let request = pb::WatchClaimsRequest {
            start_revision: query.from.revision.max(1),
            namespaces: Vec::new(),
            progress_interval: Some(topology_claims_proto::convert::duration_to_pb(
                Duration::from_millis(1),
            )),
        };
        let mut stream = self
            .client()
            .watch_claims(request)
            .await
            .map_err(|s| status::from_status(&s))?
            .into_inner();
        let mut events = Vec::new();
        let mut seq = (0, 0);
        let current = loop {
            let response = stream
                .message()
                .await
                .map_err(|s| status::from_status(&s))?
                .ok_or_else(|| ClaimsError::internal("WatchClaims ended"))?;
            if response.events.is_empty() {
                break response.revision;
            }
            for event in &response.events {
                seq = if seq.0 == event.revision {
                    (seq.0, seq.1 + 1)
                } else {
                    (event.revision, 0)
                };
                let event = decode::claim_event_from_pb(event, seq.1)?;
                if event.position >= query.from {
                    events.push(event);
                }
            }
            if events.len() > query.limit {
                break 0;
            }
        };
        Ok(EventsPage::cut(events, query, current))
    }

    async fn compact_events(&self, _: Duration, _: u64) -> Result<u64, ClaimsError> {
        Err(ClaimsError::Unsupported {
            what: "compaction is the server's own (serve --watch-retention)".to_owned(),
        })
    }

    async fn begin_update(&self, request: BeginUpdate) -> Result<Lease, ClaimsError> {
        // No lease id is chosen here (unlike the cell's client): an id-less request must reach
        // the server as it is, which then picks one.
        let response = self
            .client()
            .begin_update(begin_update_to_pb(&request))
            .await
            .map_err(|s| status::from_status(&s))?;
        decode::lease_from_pb(response.get_ref().lease_payload.as_ref(), None)
    }

    async fn commit_update(&self, cell_id: &CellId, lease_id: LeaseId) -> Result<(), ClaimsError> {
        let message = pb::CommitUpdateRequest {
            cell_id: cell_id.to_string(),
            lease_id: lease_id.to_string(),
        };
        self.client()
            .commit_update(message)
            .await
            .map(drop)
            .map_err(|s| status::from_status(&s))
    }

    async fn rollback_update(
        &self,
        cell_id: &CellId,
        lease_id: LeaseId,
        unrenewed_for: Option<std::time::Duration>,
    ) -> Result<(), ClaimsError> {
        let message = pb::RollbackUpdateRequest {
            cell_id: cell_id.to_string(),
            lease_id: lease_id.to_string(),
            unrenewed_for: unrenewed_for.map(topology_claims_proto::convert::duration_to_pb),
        };
        self.client()
            .rollback_update(message)
            .await
            .map(drop)
            .map_err(|s| status::from_status(&s))
    }

    async fn renew_lease(&self, cell_id: &CellId, lease_id: LeaseId) -> Result<Lease, ClaimsError> {
        let message = pb::RenewLeaseRequest {
            cell_id: cell_id.to_string(),
            lease_id: lease_id.to_string(),
        };
        let response = self
            .client()
            .renew_lease(message)
            .await
            .map_err(|s| status::from_status(&s))?;
        let response = response.get_ref();
        decode::lease_from_pb(
            response.lease_payload.as_ref(),
            response.last_renewed_at.as_ref(),
        )
    }

    async fn list_outstanding_leases(
        &self,
        query: &LeasesQuery,
    ) -> Result<LeasesPage, ClaimsError> {
        served_budget(query.max_bytes)?;
        let response = self
            .client()
            .list_outstanding_leases(decode::leases_query_to_pb(query))
            .await
            .map_err(|s| status::from_status(&s))?;
        decode::leases_page_from_pb(response.get_ref())
    }

    async fn list_claims(&self, query: &ClaimsQuery) -> Result<ClaimsPage, ClaimsError> {
        served_budget(query.max_bytes)?;
        let response = self
            .client()
            .list_claims(decode::claims_query_to_pb(query, None))
            .await
            .map_err(|s| status::from_status(&s))?;
        let page = decode::claims_page_from_pb(response.get_ref(), &query.cell_id)?;
        Ok(ClaimsPage {
            claims: self.with_leases(&query.cell_id, page.claims).await?,
            start_range: page.start_range,
            end_range: page.end_range,
            next_cursor: page.next_cursor,
        })
    }

    async fn lookup_claim(&self, key: &ClaimKey) -> Result<Claim, ClaimsError> {
        let message = pb::LookupClaimRequest {
            namespace: key.namespace.to_string(),
            claim_value: key.value.clone(),
            ..Default::default()
        };
        let response = self
            .client()
            .lookup_claim(message)
            .await
            .map_err(|s| status::from_status(&s))?;
        let view = decode::lookup_from_pb(response.get_ref())?;
        let cell_id = view.cell_id.clone();
        let mut claims = self.with_leases(&cell_id, vec![view]).await?;
        Ok(claims.remove(0))
    }

    /// The server collects outcomes in the background; there is no RPC to call.
    async fn collect_outcomes(&self, retention: Duration) -> Result<u64, ClaimsError> {
        self.inner.collect_outcomes(retention).await
    }

    /// Through the admin ListLeases of every cell, all pages.
    async fn lease_summary(&self) -> Result<LeaseSummary, ClaimsError> {
        let mut cursor = String::new();
        let mut server_time = None;
        let mut rows: Vec<(CellId, Timestamp)> = Vec::new();
        loop {
            let response = self
                .admin
                .clone()
                .list_leases(topology_claims_proto::pb::admin::ListLeasesRequest {
                    cursor: cursor.clone(),
                    limit: LEASES_MAX_LIMIT as i32,
                    ..Default::default()
                })
                .await
                .map_err(|s| status::from_status(&s))?
                .into_inner();
            let time = response
                .server_time
                .as_ref()
                .map(topology_claims::codec::timestamp_from_pb)
                .ok_or_else(|| ClaimsError::internal("ListLeases without server_time"))?;
            server_time.get_or_insert(time);
            for entry in &response.leases {
                let lease = entry
                    .lease
                    .as_ref()
                    .ok_or_else(|| ClaimsError::internal("ListLeases entry without its lease"))?;
                let lease = decode::lease_from_pb(
                    lease.lease_payload.as_ref(),
                    lease.last_renewed_at.as_ref(),
                )?;
                rows.push((lease.cell_id, lease.created_at));
            }
            if response.next_cursor.is_empty() {
                break;
            }
            cursor = response.next_cursor;
        }
        Ok(LeaseSummary::from_leases(
            server_time.unwrap_or(Timestamp::from_unix_micros(0)),
            rows.iter().map(|(cell, at)| (cell, *at)),
        ))
    }

    /// Through the admin ListNamespaces.
    async fn namespaces(&self) -> Result<Vec<StoredNamespace>, ClaimsError> {
        let response = self
            .admin
            .clone()
            .list_namespaces(apb::ListNamespacesRequest {})
            .await
            .map_err(|s| status::from_status(&s))?
            .into_inner();
        response.namespaces.iter().map(namespace_from_pb).collect()
    }

    /// Through the admin CreateNamespace; `max` is the server's `--max-namespaces`, not this
    /// argument.
    async fn create_namespace(
        &self,
        spec: NamespaceSpec,
        _max: usize,
    ) -> Result<StoredNamespace, ClaimsError> {
        let message = apb::Namespace {
            id: spec.id,
            normalization: normalization_to_pb(spec.normalization) as i32,
            max_chars: u32::from(spec.max_chars),
            pattern: spec.pattern.unwrap_or_default(),
            reserved: spec.reserved,
            description: spec.description,
            deprecated: spec.deprecated,
            version: 0,
        };
        let response = self
            .admin
            .clone()
            .create_namespace(apb::CreateNamespaceRequest {
                namespace: Some(message),
                reason: "conformance suite".to_owned(),
            })
            .await
            .map_err(|s| status::from_status(&s))?
            .into_inner();
        namespace_from_pb(&response)
    }

    /// Through the admin CountClaims.
    async fn count_claims(&self) -> Result<Vec<(NamespaceId, u64)>, ClaimsError> {
        let response = self
            .admin
            .clone()
            .count_claims(apb::CountClaimsRequest {})
            .await
            .map_err(|s| status::from_status(&s))?
            .into_inner();
        response
            .namespaces
            .into_iter()
            .map(|n| {
                Ok((
                    NamespaceId::parse_field(&n.namespace, "namespace")?,
                    n.claims,
                ))
            })
            .collect()
    }

    /// Through the admin DeleteNamespace.
    async fn delete_namespace(&self, id: &str) -> Result<(), ClaimsError> {
        self.admin
            .clone()
            .delete_namespace(apb::DeleteNamespaceRequest {
                id: id.to_owned(),
                reason: "conformance suite".to_owned(),
            })
            .await
            .map_err(|s| status::from_status(&s))?;
        Ok(())
    }

    /// Through the admin UpdateNamespace.
    async fn update_namespace(
        &self,
        id: &str,
        update: NamespaceUpdate,
    ) -> Result<StoredNamespace, ClaimsError> {
        let request = apb::UpdateNamespaceRequest {
            id: id.to_owned(),
            normalization: update
                .normalization
                .map_or(0, |n| normalization_to_pb(n) as i32),
            max_chars: update.max_chars.map(u32::from),
            pattern: update.pattern.map(Option::unwrap_or_default),
            set_reserved: update.reserved.is_some(),
            reserved: update.reserved.unwrap_or_default(),
            description: update.description,
            deprecated: update.deprecated,
            reason: "conformance suite".to_owned(),
        };
        let response = self
            .admin
            .clone()
            .update_namespace(request)
            .await
            .map_err(|s| status::from_status(&s))?
            .into_inner();
        namespace_from_pb(&response)
    }

    /// Through the admin DecommissionCell.
    async fn decommission_step(
        &self,
        cell_id: &CellId,
        batch: usize,
        dry_run: bool,
    ) -> Result<DecommissionStep, ClaimsError> {
        let response = self
            .admin
            .clone()
            .decommission_cell(topology_claims_proto::pb::admin::DecommissionCellRequest {
                cell_id: cell_id.to_string(),
                dry_run,
                reason: "conformance suite".to_owned(),
                batch_size: u32::try_from(batch).unwrap_or(u32::MAX),
            })
            .await
            .map_err(|s| status::from_status(&s))?
            .into_inner();
        Ok(DecommissionStep {
            cell_id: cell_id.clone(),
            dry_run: response.dry_run,
            already_decommissioned: response.already_decommissioned,
            claims: response.claims,
            complete: response.complete,
        })
    }

    /// Through the admin GetRestoreStatus.
    async fn restore_state(&self) -> Result<Option<RestoreEpoch>, ClaimsError> {
        let status = self
            .admin
            .clone()
            .get_restore_status(topology_claims_proto::pb::admin::GetRestoreStatusRequest {})
            .await
            .map_err(|s| status::from_status(&s))?
            .into_inner();
        topology_claims_proto::convert::restore_status_from_pb(&status)
    }

    /// Through the admin MarkRestored.
    async fn mark_restored(&self, request: &MarkRestored) -> Result<RestoreEpoch, ClaimsError> {
        let status = self
            .admin
            .clone()
            .mark_restored(topology_claims_proto::pb::admin::MarkRestoredRequest {
                backup_time: Some(topology_claims::codec::timestamp_to_pb(request.backup_time)),
                reason: request.reason.clone(),
                expect_cells: request.expect_cells.iter().map(|c| c.to_string()).collect(),
            })
            .await
            .map_err(|s| status::from_status(&s))?
            .into_inner();
        topology_claims_proto::convert::restore_status_from_pb(&status)?
            .ok_or_else(|| ClaimsError::internal("MarkRestored answered no epoch"))
    }

    /// Through ReportVerificationPass, then GetRestoreStatus for the whole epoch.
    async fn report_verification_pass(
        &self,
        cell_id: &CellId,
        epoch: u64,
    ) -> Result<RestoreEpoch, ClaimsError> {
        self.client()
            .report_verification_pass(pb::ReportVerificationPassRequest {
                cell_id: cell_id.to_string(),
                epoch,
            })
            .await
            .map_err(|s| status::from_status(&s))?;
        self.restore_state()
            .await?
            .ok_or_else(|| ClaimsError::internal("a reported epoch vanished"))
    }

    /// Through the admin LiftQuarantine.
    async fn lift_quarantine(&self, epoch: u64, reason: &str) -> Result<RestoreEpoch, ClaimsError> {
        let status = self
            .admin
            .clone()
            .lift_quarantine(topology_claims_proto::pb::admin::LiftQuarantineRequest {
                epoch,
                reason: reason.to_owned(),
            })
            .await
            .map_err(|s| status::from_status(&s))?
            .into_inner();
        topology_claims_proto::convert::restore_status_from_pb(&status)?
            .ok_or_else(|| ClaimsError::internal("LiftQuarantine answered no epoch"))
    }

    /// Through AcquireVerificationSlot. The limit is the server's (`SUITE_SLOTS`, the default
    /// ttl); the request's ttl may only shorten it, so a query's own ttl is sent as the request's.
    async fn acquire_verification_slot(
        &self,
        holder: &SlotHolder,
        limit: SlotLimit,
    ) -> Result<SlotGrant, ClaimsError> {
        served_slot_limit(limit)?;
        let message = pb::AcquireVerificationSlotRequest {
            cell_id: holder.cell_id.to_string(),
            holder: holder.holder.clone(),
            ttl: Some(topology_claims_proto::convert::duration_to_pb(limit.ttl)),
        };
        let response = self
            .client()
            .acquire_verification_slot(message)
            .await
            .map_err(|s| status::from_status(&s))?;
        decode::slot_grant_from_pb(holder, response.get_ref())
    }

    async fn release_verification_slot(&self, holder: &SlotHolder) -> Result<bool, ClaimsError> {
        let message = pb::ReleaseVerificationSlotRequest {
            cell_id: holder.cell_id.to_string(),
            holder: holder.holder.clone(),
        };
        let response = self
            .client()
            .release_verification_slot(message)
            .await
            .map_err(|s| status::from_status(&s))?;
        Ok(response.get_ref().released)
    }

    fn retries(&self) -> u64 {
        self.inner.retries()
    }
}

//! The tonic `ClaimsService`: each handler decodes (validating every field), applies the
//! front end's batch policy, calls the [`ClaimStore`], and encodes the answer.
//!
//! Must stay thin: no protocol rules (they are `crate::domain`'s), no storage code (the
//! store's), no status-code choices (`super::status` is the one mapping). Malformed input is
//! refused here, before any store access.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::domain::{self, DEFAULT_MAX_BATCH};
use crate::error::ClaimsError;
use crate::grpc::convert;
use crate::grpc::pb;
use crate::grpc::pb::claims_service_server::ClaimsService;
use crate::grpc::status::to_status;
use crate::ports::ClaimStore;

/// The front end's policy knobs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceConfig {
    /// Most claims (creates + destroys) one BeginUpdate may carry (`--max-batch`).
    pub max_batch: usize,
    /// Budget of one ListOutstandingLeases / ListClaims response, in encoded bytes
    /// (`--max-response-bytes`): a page stops before it, as well as at its `limit`, so every
    /// page fits the 4 MiB gRPC clients accept by default (the rule: `domain::pages`). A
    /// leases page holds at least one lease even when that lease alone is larger.
    pub max_response_bytes: usize,
}

/// Default of [`ServiceConfig::max_response_bytes`]: well under the 4 MiB clients accept.
pub use crate::domain::DEFAULT_MAX_RESPONSE_BYTES;

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            max_batch: DEFAULT_MAX_BATCH,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }
}

/// `topology.claims.v1.ClaimsService` over any [`ClaimStore`].
#[derive(Clone)]
pub struct ClaimsServiceImpl {
    pub store: Arc<dyn ClaimStore>,
    pub config: ServiceConfig,
}

impl ClaimsServiceImpl {
    pub fn new(store: Arc<dyn ClaimStore>, config: ServiceConfig) -> Self {
        Self { store, config }
    }
}

/// The one exit of every handler: domain errors become statuses through `to_status`.
fn respond<T>(result: Result<T, ClaimsError>) -> Result<Response<T>, Status> {
    result.map(Response::new).map_err(|error| to_status(&error))
}

#[tonic::async_trait]
impl ClaimsService for ClaimsServiceImpl {
    async fn begin_update(
        &self,
        request: Request<pb::BeginUpdateRequest>,
    ) -> Result<Response<pb::BeginUpdateResponse>, Status> {
        respond(
            async {
                let request = convert::begin_update_from_pb(request.get_ref())?;
                domain::check_batch(&request, self.config.max_batch)?;
                let lease = self.store.begin_update(request).await?;
                Ok(pb::BeginUpdateResponse {
                    lease_payload: Some(convert::lease_payload_to_pb(&lease)),
                })
            }
            .await,
        )
    }

    async fn commit_update(
        &self,
        request: Request<pb::CommitUpdateRequest>,
    ) -> Result<Response<pb::CommitUpdateResponse>, Status> {
        respond(
            async {
                let request = request.get_ref();
                let (cell_id, lease_id) =
                    convert::lease_ref_from_pb(&request.cell_id, &request.lease_id)?;
                self.store.commit_update(&cell_id, lease_id).await?;
                Ok(pb::CommitUpdateResponse {})
            }
            .await,
        )
    }

    async fn rollback_update(
        &self,
        request: Request<pb::RollbackUpdateRequest>,
    ) -> Result<Response<pb::RollbackUpdateResponse>, Status> {
        respond(
            async {
                let request = request.get_ref();
                let (cell_id, lease_id) =
                    convert::lease_ref_from_pb(&request.cell_id, &request.lease_id)?;
                self.store.rollback_update(&cell_id, lease_id).await?;
                Ok(pb::RollbackUpdateResponse {})
            }
            .await,
        )
    }

    async fn renew_lease(
        &self,
        request: Request<pb::RenewLeaseRequest>,
    ) -> Result<Response<pb::RenewLeaseResponse>, Status> {
        respond(
            async {
                let request = request.get_ref();
                let (cell_id, lease_id) =
                    convert::lease_ref_from_pb(&request.cell_id, &request.lease_id)?;
                let lease = self.store.renew_lease(&cell_id, lease_id).await?;
                Ok(convert::renew_response_to_pb(&lease))
            }
            .await,
        )
    }

    async fn list_outstanding_leases(
        &self,
        request: Request<pb::ListOutstandingLeasesRequest>,
    ) -> Result<Response<pb::ListOutstandingLeasesResponse>, Status> {
        respond(
            async {
                let query = convert::leases_query_from_pb(
                    request.get_ref(),
                    self.config.max_response_bytes,
                )?;
                // Read in chunks: the store never hands over more than the page and a chunk.
                let mut builder = domain::LeasesPageBuilder::new(&query);
                let page = loop {
                    let read = self
                        .store
                        .list_outstanding_leases(&builder.next_read())
                        .await?;
                    if let Some(page) = builder.take(read) {
                        break page;
                    }
                };
                Ok(convert::leases_page_to_pb(&page))
            }
            .await,
        )
    }

    async fn list_claims(
        &self,
        request: Request<pb::ListClaimsRequest>,
    ) -> Result<Response<pb::ListClaimsResponse>, Status> {
        respond(
            async {
                let query = convert::claims_query_from_pb(
                    request.get_ref(),
                    self.config.max_response_bytes,
                )?;
                let page = self.store.list_claims(&query).await?;
                Ok(convert::claims_page_to_pb(&page))
            }
            .await,
        )
    }

    async fn lookup_claim(
        &self,
        request: Request<pb::LookupClaimRequest>,
    ) -> Result<Response<pb::LookupClaimResponse>, Status> {
        respond(
            async {
                let key = convert::claim_key_from_pb(request.get_ref())?;
                let claim = self.store.lookup_claim(&key).await?;
                Ok(convert::lookup_response_to_pb(&claim))
            }
            .await,
        )
    }
}

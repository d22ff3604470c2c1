//! The tonic `ClaimsService`: each handler decodes (validating every field), applies the
//! front end's batch policy, calls the [`ClaimStore`], and encodes the answer.
//!
//! StreamClaims sends the ListClaims pages from a cursor to the end, one per message, and reads
//! the next page from the store only when the previous one has been taken (see
//! [`claim_ranges`]): flow control is gRPC's, and a stream whose client went away stops reading.
//!
//! Must stay thin: no protocol rules (they are `topology_claims::domain`'s), no storage code (the
//! store's), no status-code choices (`super::status` is the one mapping). Malformed input is
//! refused here, before any store access.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tonic::{Request, Response, Status};

use crate::grpc::convert;
use crate::grpc::lease_wait::{self, WaitConfig, WaitingRoom};
use crate::grpc::pb;
use crate::grpc::pb::claims_service_server::ClaimsService;
use crate::grpc::status::{self, to_status};
use crate::grpc::watch::{WatchConfig, WatchHub, WatchStream};
use crate::restore::RestoreGate;
use topology_claims::domain::{self, ClaimsPage, ClaimsQuery, DEFAULT_MAX_BATCH};
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;

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
    /// Verification slots of the fleet, shared through the store
    /// (`--max-concurrent-verifications`; 0: unlimited).
    pub max_concurrent_verifications: u32,
    /// Slots one cell may hold at once (`--max-verifications-per-cell`; 0: no cap beyond the
    /// fleet's).
    pub max_verifications_per_cell: u32,
    /// A slot's time-to-live (`--verification-slot-ttl`); a request may only shorten it.
    pub verification_slot_ttl: std::time::Duration,
}

/// Default of [`ServiceConfig::max_response_bytes`]: well under the 4 MiB clients accept.
pub use topology_claims::domain::DEFAULT_MAX_RESPONSE_BYTES;

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            max_batch: DEFAULT_MAX_BATCH,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            max_concurrent_verifications: domain::DEFAULT_MAX_CONCURRENT_VERIFICATIONS,
            max_verifications_per_cell: domain::DEFAULT_MAX_VERIFICATIONS_PER_CELL,
            verification_slot_ttl: domain::DEFAULT_VERIFICATION_SLOT_TTL,
        }
    }
}

/// `topology.claims.v1.ClaimsService` over any [`ClaimStore`].
#[derive(Clone)]
pub struct ClaimsServiceImpl {
    pub store: Arc<dyn ClaimStore>,
    pub config: ServiceConfig,
    /// The store's latest restore epoch and the quarantine (`crate::restore`).
    pub restore: Arc<RestoreGate>,
    /// The change feed's follower (`grpc::watch`), poked after this server's writes.
    pub watch: Arc<WatchHub>,
    /// BeginUpdates waiting for a leased claim (`grpc::lease_wait`).
    pub waits: Arc<WaitingRoom>,
}

impl ClaimsServiceImpl {
    /// A service whose restore gate is read by the caller (`with_restore`), or never: a gate
    /// never loaded knows no restore and refuses nothing.
    pub fn new(store: Arc<dyn ClaimStore>, config: ServiceConfig) -> Self {
        let restore = Arc::new(RestoreGate::new(Arc::clone(&store), true));
        let watch = WatchHub::new(Arc::clone(&store), WatchConfig::default());
        Self {
            store,
            config,
            restore,
            watch,
            waits: WaitingRoom::new(WaitConfig::default(), None),
        }
    }

    /// Shares `room` (the server's one, which follows the change feed for its waiters).
    pub fn with_waits(mut self, room: Arc<WaitingRoom>) -> Self {
        self.waits = room;
        self
    }

    /// Shares `hub` (the server's one, which follows the log and compacts it).
    pub fn with_watch(mut self, hub: Arc<WatchHub>) -> Self {
        self.watch = hub;
        self
    }

    /// Shares `gate` (the server's one, which the AdminService also updates).
    pub fn with_restore(mut self, gate: Arc<RestoreGate>) -> Self {
        self.restore = gate;
        self
    }

    /// This server wrote: the change feed's follower reads the head at once if anyone follows
    /// it here (a watcher, a waiter); else at its next poll (`--watch-poll-interval`), which
    /// saves a lone caller two store reads per write.
    fn wrote(&self) {
        if self.watch.has_watchers() || !self.waits.is_empty() {
            self.watch.poke();
        }
    }

    /// When the claim of a `ClaimLeased` refusal was leased (its row's `updated_at`), read once
    /// more from the store; `None` when it is no longer leased or the read fails.
    async fn leased_since(&self, error: &ClaimsError) -> Option<domain::Timestamp> {
        let claim = error.claim()?;
        let row = self.store.lookup_claim(claim).await.ok()?;
        row.lease.is_some().then_some(row.updated_at)
    }
}

/// The one exit of every handler: domain errors become statuses through `to_status`.
fn respond<T>(result: Result<T, ClaimsError>) -> Result<Response<T>, Status> {
    result.map(Response::new).map_err(|error| to_status(&error))
}

/// The stream of StreamClaims: ranges until the last, or one error that ends it.
pub type ClaimRangeStream = Pin<Box<dyn Stream<Item = Result<pb::ClaimsRange, Status>> + Send>>;

/// The ranges of a StreamClaims stream from `first` (already read) on: each is the ListClaims
/// page that starts at the previous one's cursor, read from the store only when the stream is
/// polled for it. tonic polls for the next message only once the HTTP/2 stream has room for
/// more, so a client that stops reading stops the reads, and the server holds at most the range
/// being sent and the one being encoded. Dropping the stream (the client went away) ends them.
pub fn claim_ranges(
    store: Arc<dyn ClaimStore>,
    query: ClaimsQuery,
    first: ClaimsPage,
) -> ClaimRangeStream {
    // The state: the query of the next range, and that range when it is already read.
    let start = Some((Some(first), query));
    Box::pin(futures::stream::unfold(start, move |state| {
        let store = Arc::clone(&store);
        async move {
            let (read, query) = state?;
            let page = match read {
                Some(page) => page,
                None => match store.list_claims(&query).await {
                    Ok(page) => page,
                    Err(error) => return Some((Err(to_status(&error)), None)),
                },
            };
            let next = page.next_cursor.clone().map(|cursor| {
                let query = ClaimsQuery {
                    cursor,
                    ..query.clone()
                };
                (None, query)
            });
            let range = pb::ClaimsRange::from(convert::claims_page_to_pb(&page, &query));
            Some((Ok(range), next))
        }
    }))
}

#[tonic::async_trait]
impl ClaimsService for ClaimsServiceImpl {
    type StreamClaimsStream = ClaimRangeStream;

    async fn begin_update(
        &self,
        request: Request<pb::BeginUpdateRequest>,
    ) -> Result<Response<pb::BeginUpdateResponse>, Status> {
        let result: Result<pb::BeginUpdateResponse, ClaimsError> = async {
            let deadline_left = lease_wait::deadline_left(request.metadata());
            let request = request.into_inner();
            let correction = request.restore_correction;
            let wait =
                convert::duration_from_pb(request.wait_for_leased.as_ref(), "wait_for_leased")?;
            let request = convert::begin_update_from_pb(request)?;
            domain::check_batch(&request, self.config.max_batch)?;
            // The restore gate before and after the store (`RestoreGate::check_granted`).
            let begin = || async {
                self.restore.check_begin(&request, correction).await?;
                let lease = self.store.begin_update(request.clone()).await?;
                self.restore
                    .check_granted(&request, correction, lease)
                    .await
            };
            let lease = match begin().await {
                Err(refusal) => match self.waits.wait_for(Some(wait), deadline_left) {
                    Some(wait) => {
                        // Each ask is a BeginUpdate of its own: the restore gate too (a restore
                        // may have been marked while it waited).
                        let ask = begin;
                        self.waits
                            .wait(&self.store, &request, refusal, wait, ask)
                            .await
                    }
                    None => Err(refusal),
                },
                begun => begun,
            }?;
            self.wrote();
            Ok(pb::BeginUpdateResponse {
                lease_payload: Some(convert::lease_payload_to_pb(&lease)),
            })
        }
        .await;
        match result {
            Err(error) if matches!(error.refusal(), ClaimsError::ClaimLeased { .. }) => Err(
                status::claim_leased_status(&error, self.leased_since(error.refusal()).await),
            ),
            result => respond(result),
        }
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
                self.wrote();
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
                let (cell_id, lease_id, unrenewed_for) =
                    convert::rollback_from_pb(request.get_ref())?;
                self.store
                    .rollback_update(&cell_id, lease_id, unrenewed_for)
                    .await?;
                self.wrote();
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
                let page = domain::LeasesPage {
                    restore: self.restore.view_for(&query.cell_id),
                    ..page
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
                let request = request.get_ref();
                let query = convert::claims_query_from_pb(request, self.config.max_response_bytes)?;
                let page = self.store.list_claims(&query).await?;
                domain::check_claims_page_followable(
                    &query,
                    &page,
                    convert::resumes_inside_records(request),
                )?;
                Ok(convert::claims_page_to_pb(&page, &query))
            }
            .await,
        )
    }

    /// Validated and first range read before the stream is answered: a bad request is a status,
    /// not an empty stream, and `--request-timeout` bounds the time to the first range
    /// (docs/decisions/066-streamclaims.md). Unlike a ListClaims page, a range may end inside a
    /// record whatever the request sets: the stream follows its own positions, so no client
    /// loops on it (docs/decisions/079-one-page-token.md).
    async fn stream_claims(
        &self,
        request: Request<pb::StreamClaimsRequest>,
    ) -> Result<Response<Self::StreamClaimsStream>, Status> {
        let request = pb::ListClaimsRequest::from(request.into_inner());
        let query = convert::claims_query_from_pb(&request, self.config.max_response_bytes)
            .map_err(|error| to_status(&error))?;
        let first = self
            .store
            .list_claims(&query)
            .await
            .map_err(|error| to_status(&error))?;
        Ok(Response::new(claim_ranges(
            Arc::clone(&self.store),
            query,
            first,
        )))
    }

    type WatchClaimsStream = WatchStream;

    async fn watch_claims(
        &self,
        request: Request<pb::WatchClaimsRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        self.watch
            .start(request.into_inner())
            .await
            .map(Response::new)
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

    async fn acquire_verification_slot(
        &self,
        request: Request<pb::AcquireVerificationSlotRequest>,
    ) -> Result<Response<pb::AcquireVerificationSlotResponse>, Status> {
        respond(
            async {
                let (holder, requested_ttl) = convert::slot_request_from_pb(request.get_ref())?;
                let limit = domain::SlotLimit {
                    max: self.config.max_concurrent_verifications,
                    per_cell: self.config.max_verifications_per_cell,
                    ttl: domain::slot_ttl(self.config.verification_slot_ttl, requested_ttl),
                };
                let grant = self.store.acquire_verification_slot(&holder, limit).await?;
                Ok(convert::slot_grant_to_pb(&grant, limit))
            }
            .await,
        )
    }

    async fn release_verification_slot(
        &self,
        request: Request<pb::ReleaseVerificationSlotRequest>,
    ) -> Result<Response<pb::ReleaseVerificationSlotResponse>, Status> {
        respond(
            async {
                let request = request.get_ref();
                let holder = convert::slot_holder_from_pb(&request.cell_id, &request.holder)?;
                let released = self.store.release_verification_slot(&holder).await?;
                Ok(pb::ReleaseVerificationSlotResponse { released })
            }
            .await,
        )
    }

    async fn report_verification_pass(
        &self,
        request: Request<pb::ReportVerificationPassRequest>,
    ) -> Result<Response<pb::ReportVerificationPassResponse>, Status> {
        respond(
            async {
                let request = request.get_ref();
                let cell_id = domain::CellId::parse(&request.cell_id)?;
                let state = self
                    .store
                    .report_verification_pass(&cell_id, request.epoch)
                    .await?;
                let pending = state.pending_cells().count();
                let view = state.view_for(&cell_id);
                self.restore.set(Some(state));
                Ok(pb::ReportVerificationPassResponse {
                    restore: Some(convert::restore_view_to_pb(&view)),
                    cells_pending: u32::try_from(pending).unwrap_or(u32::MAX),
                })
            }
            .await,
        )
    }
}

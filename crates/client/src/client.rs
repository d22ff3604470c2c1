//! `ClaimsClient`: the cell's gRPC client of the service, with per-call deadlines, connection
//! reuse (one HTTP/2 channel, cheap to clone) and retries with jittered backoff on UNAVAILABLE and
//! DEADLINE_EXCEEDED, and on a per-cell limit's RESOURCE_EXHAUSTED `RATE_LIMITED` after at least
//! the delay its RetryInfo asks for. BeginUpdate is retried too: the lease id is chosen on the client before the
//! first attempt, so a retry after a lost response returns the same lease instead of a second one.
//!
//! CLAIM_LEASED (a claim under another update in progress) is retried only when the caller asks
//! for it ([`ClientConfig::retry_claim_leased`], for background jobs), a bounded number of times,
//! each after the delay its RetryInfo asks for: a user-facing save hears it at once.
//!
//! Errors are the domain's [`ClaimsError`] decoded from the status details, so an app can say
//! "email has already been taken" from `ClaimsError::ClaimTaken { claim }`. A BeginUpdate that
//! refused several claims is `ClaimsError::ClaimConflicts` (decision 114): every refused record
//! with its own refusal, for a form that shows them all at once; `error.refusal()` is the first
//! (what a single-refusal match needs) and `error.claim_refusals()` every one. CLAIM_LEASED is
//! retried only when every refused claim is leased.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tonic::transport::Channel;

use crate::backoff::Backoff;
use crate::decode;
use crate::tls::{server_endpoint, ClientTls};
use topology_claims::domain::{
    BeginUpdate, CellId, ClaimKey, ClaimView, ClaimViewsPage, ClaimsQuery, Lease, LeaseId,
    LeasesPage, LeasesQuery, RestoreView, SlotGrant, SlotHolder,
};
use topology_claims::error::{error_chain, ClaimsError};
use topology_claims_proto::convert::begin_update_to_pb;
use topology_claims_proto::pb::claims_service_client::ClaimsServiceClient;
use topology_claims_proto::{pb, status};

/// Client knobs. The defaults suit a cell talking to a nearby service.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Deadline of one attempt of one call.
    pub call_timeout: Duration,
    /// Attempts per call (1 = no retry) for retryable failures.
    pub max_attempts: u32,
    /// Backoff between attempts.
    pub backoff: Backoff,
    /// Deadline for establishing a connection.
    pub connect_timeout: Duration,
    /// TLS for an `https://` server (required for one, refused with an `http://` URL). Default:
    /// none, plain-text `http://`.
    pub tls: Option<ClientTls>,
    /// Retry CLAIM_LEASED, boundedly, after the delay its RetryInfo asks for. Default: `None`,
    /// the caller gets CLAIM_LEASED at once (a user-facing save says "try again"); a background
    /// job, which has nobody to ask, sets `Some(LeasedRetry::default())`.
    pub retry_claim_leased: Option<LeasedRetry>,
}

/// How a background job's client retries CLAIM_LEASED (see docs/cell-integration.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeasedRetry {
    /// Retries after the first CLAIM_LEASED; then the caller gets it (the lease is probably
    /// stuck, and only its cell's reconciler ends it, minutes later).
    pub retries: u32,
    /// Longest one wait: a server asking for longer is not waited for, the caller hears it.
    pub longest_wait: Duration,
}

impl Default for LeasedRetry {
    /// Five retries of about a second each: a lease of a cell transaction has ended by then.
    fn default() -> Self {
        Self {
            retries: 5,
            longest_wait: Duration::from_secs(10),
        }
    }
}

/// The wait before CLAIM_LEASED retry number `retried + 1`: the server's RetryInfo `hint` (the
/// domain's [`CLAIM_LEASED_RETRY_AFTER`](topology_claims::domain::CLAIM_LEASED_RETRY_AFTER) from a server
/// that sent none) plus up to half of it again, so jobs refused together do not return
/// together. `None`: no retry (not asked for, retries used up, or a longer wait than allowed).
fn leased_retry_delay(
    policy: Option<&LeasedRetry>,
    retried: u32,
    hint: Option<Duration>,
) -> Option<Duration> {
    let policy = policy?;
    let hint = hint.unwrap_or(topology_claims::domain::CLAIM_LEASED_RETRY_AFTER);
    if retried >= policy.retries || hint > policy.longest_wait {
        return None;
    }
    let spread = u64::try_from(hint.as_micros() / 2).unwrap_or(u64::MAX);
    let jitter = crate::backoff::random_u64() % spread.saturating_add(1);
    Some(hint + Duration::from_micros(jitter))
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            call_timeout: Duration::from_secs(5),
            max_attempts: 5,
            backoff: Backoff {
                initial: Duration::from_millis(50),
                max: Duration::from_secs(2),
            },
            connect_timeout: Duration::from_secs(5),
            tls: None,
            retry_claim_leased: None,
        }
    }
}

/// A connection to the claims service. Clone it freely: clones share the channel.
#[derive(Clone, Debug)]
pub struct ClaimsClient {
    inner: ClaimsServiceClient<Channel>,
    config: ClientConfig,
    /// Who the errors of an unreachable service name: `the claims server at URL`.
    server: Arc<str>,
}

/// The ranges of [`ClaimsClient::stream_claims`], in order; it ends after the last one.
pub type ClaimsPageStream = Pin<Box<dyn Stream<Item = Result<ClaimViewsPage, ClaimsError>> + Send>>;

/// Whether a failure may be retried: the service or the network was unavailable, or the attempt
/// ran out of time (the request may or may not have been applied; every call we retry is
/// idempotent), or a per-cell limit refused it (not applied at all).
fn retryable(error: &ClaimsError) -> bool {
    matches!(
        error,
        ClaimsError::Unavailable { .. }
            | ClaimsError::ServerUnavailable { .. }
            | ClaimsError::RateLimited { .. }
    )
}

/// How long to wait before attempt `attempt + 1` after `error`: the jittered backoff, but at
/// least the delay a per-cell limit asked for (its RetryInfo), since an earlier retry would only
/// be refused again. `None`: that delay is longer than `longest_wait`, so waiting is pointless
/// and the error is returned instead.
fn retry_delay(
    backoff: &Backoff,
    attempt: u32,
    error: &ClaimsError,
    longest_wait: Duration,
) -> Option<Duration> {
    let backoff = backoff.delay(attempt);
    match error {
        ClaimsError::RateLimited { retry_after, .. } if *retry_after > longest_wait => None,
        ClaimsError::RateLimited { retry_after, .. } => Some(backoff.max(*retry_after)),
        _ => Some(backoff),
    }
}

impl ClaimsClient {
    /// A client for `endpoint`: `http://HOST:PORT`, or `https://HOST:PORT` with
    /// [`ClientConfig::tls`] set. Connects lazily: a service that is down now is retried on the
    /// first call, not refused here; a bad URL or bad TLS settings are refused here.
    pub fn connect_lazy(endpoint: &str, config: ClientConfig) -> Result<Self, ClaimsError> {
        let url = endpoint;
        let endpoint = server_endpoint(url, config.tls.as_ref())?
            .connect_timeout(config.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_while_idle(true);
        let mut client = Self::from_channel(endpoint.connect_lazy(), config);
        client.server = format!("the claims server at {url}").into();
        Ok(client)
    }

    /// A client on `channel`. It accepts responses up to
    /// [`decode::MAX_RESPONSE_MESSAGE_BYTES`] (8 MiB): a page of outstanding leases always holds
    /// at least one lease, which may be as large as a whole BeginUpdate request.
    pub fn from_channel(channel: Channel, config: ClientConfig) -> Self {
        Self {
            inner: decode::claims_client(channel),
            config,
            server: "the claims server".into(),
        }
    }

    /// A clone (same channel) for calls made while a local transaction is open: each attempt
    /// lasts at most `deadline`, and CLAIM_LEASED is returned at once, never waited out (its
    /// retry delay is longer than any such deadline, and the wait would hold the local locks).
    pub(crate) fn for_open_transaction(&self, deadline: Duration) -> Self {
        let mut client = self.clone();
        client.config.call_timeout = client.config.call_timeout.min(deadline);
        client.config.retry_claim_leased = None;
        client
    }

    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The error a failed call's status means. A transport failure (connect, DNS, TLS, a cut
    /// connection) carries its cause as the status's source; the status's own message only
    /// names its kind.
    fn status_error(&self, status: &tonic::Status) -> ClaimsError {
        match std::error::Error::source(status) {
            Some(cause) => ClaimsError::server_unavailable(format!(
                "cannot reach {}: {}",
                self.server,
                error_chain(cause)
            )),
            None => status::from_status(status),
        }
    }

    /// Runs `call` with the per-attempt deadline, retrying retryable failures with backoff.
    pub(crate) async fn with_retries<T, F, Fut>(&self, call: F) -> Result<T, ClaimsError>
    where
        F: FnMut(ClaimsServiceClient<Channel>) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        self.retrying(call, &mut false).await
    }

    /// [`with_retries`](Self::with_retries), setting `lost` when an attempt's fate is unknown
    /// (no answer, a broken connection, an unavailable store): that attempt may still be applied
    /// later, by a server that queued it or is retrying its store transaction.
    async fn retrying<T, F, Fut>(&self, call: F, lost: &mut bool) -> Result<T, ClaimsError>
    where
        F: FnMut(ClaimsServiceClient<Channel>) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        self.retrying_within(self.config.call_timeout, call, lost)
            .await
    }

    /// [`Self::retrying`] with each attempt bounded by `call_timeout` instead of the config's.
    async fn retrying_within<T, F, Fut>(
        &self,
        call_timeout: Duration,
        mut call: F,
        lost: &mut bool,
    ) -> Result<T, ClaimsError>
    where
        F: FnMut(ClaimsServiceClient<Channel>) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let mut attempt = 0;
        let mut leased_retries = 0;
        loop {
            let (outcome, hint) =
                match tokio::time::timeout(call_timeout, call(self.inner.clone())).await {
                    Ok(Ok(value)) => return Ok(value),
                    Ok(Err(status)) => (self.status_error(&status), status::retry_delay(&status)),
                    Err(_) => (
                        ClaimsError::server_unavailable(format!(
                            "no answer from {} within {call_timeout:?} (deadline exceeded)",
                            self.server
                        )),
                        None,
                    ),
                };
            if outcome.is_unavailable() {
                *lost = true;
            }
            // Nothing was written (the refusal is decided before any write), so the same
            // request, BeginUpdate's client-chosen lease id included, is simply sent again.
            // Only when every refused claim is leased: a taken one stays taken.
            let refusals = outcome.claim_refusals();
            if !refusals.is_empty()
                && refusals
                    .iter()
                    .all(|r| matches!(r, ClaimsError::ClaimLeased { .. }))
            {
                let policy = self.config.retry_claim_leased.as_ref();
                let Some(delay) = leased_retry_delay(policy, leased_retries, hint) else {
                    return Err(outcome);
                };
                leased_retries += 1;
                tracing::debug!(leased_retries, error = %outcome, ?delay, "retrying a leased claim");
                tokio::time::sleep(delay).await;
                continue;
            }
            attempt += 1;
            if !retryable(&outcome) || attempt >= self.config.max_attempts {
                return Err(outcome);
            }
            // A server asking for a longer pause than the longest an attempt may take (or a
            // backoff wait) is told apart from a brief refusal: the caller hears about it.
            let longest_wait = self.config.call_timeout.max(self.config.backoff.max);
            let Some(delay) =
                retry_delay(&self.config.backoff, attempt - 1, &outcome, longest_wait)
            else {
                return Err(outcome);
            };
            tracing::debug!(attempt, error = %outcome, ?delay, "retrying claims call");
            tokio::time::sleep(delay).await;
        }
    }

    /// BeginUpdate. A request without a lease id gets one here, before the first attempt.
    pub async fn begin_update(&self, request: BeginUpdate) -> Result<Lease, ClaimsError> {
        self.begin(request, false, None).await
    }

    /// BeginUpdate that waits up to `wait` for the leases holding its claims to end
    /// (`wait_for_leased`; the server clamps it to its `--max-lease-wait`), in first-come order
    /// with the other waiters, then decides again: a lease, CLAIM_TAKEN once a holder committed,
    /// or CLAIM_LEASED when the wait is over. For background jobs (renames, migrations): never
    /// inside a local transaction, whose locks would be held for the whole wait
    /// (docs/cell-integration.md). Each attempt may take `wait` beyond the call timeout.
    pub async fn begin_update_waiting(
        &self,
        request: BeginUpdate,
        wait: Duration,
    ) -> Result<Lease, ClaimsError> {
        self.begin(request, false, Some(wait)).await
    }

    /// BeginUpdate of a verifier's correction (`restore_correction`): served during a restore
    /// quarantine, since it brings back a claim the cell's records hold (`domain::restore`).
    pub async fn begin_correction(&self, request: BeginUpdate) -> Result<Lease, ClaimsError> {
        self.begin(request, true, None).await
    }

    async fn begin(
        &self,
        mut request: BeginUpdate,
        restore_correction: bool,
        wait: Option<Duration>,
    ) -> Result<Lease, ClaimsError> {
        let lease_id = *request.lease_id.get_or_insert_with(LeaseId::generate);
        let message = pb::BeginUpdateRequest {
            restore_correction,
            wait_for_leased: wait.map(topology_claims_proto::convert::duration_to_pb),
            ..begin_update_to_pb(&request)
        };
        // A waiting call tells the server its deadline (grpc-timeout), which bounds the wait.
        let call_timeout = self.config.call_timeout + wait.unwrap_or_default();
        let mut lost = false;
        let call = |mut c: ClaimsServiceClient<Channel>| {
            let mut message = tonic::Request::new(message.clone());
            if wait.is_some() {
                message.set_timeout(call_timeout);
            }
            async move { c.begin_update(message).await }
        };
        match self.retrying_within(call_timeout, call, &mut lost).await {
            Ok(response) => decode::lease_from_pb(response.get_ref().lease_payload.as_ref(), None),
            Err(refusal) => {
                if lost && !refusal.is_unavailable() {
                    self.fence(&request.cell_id, lease_id, &refusal).await;
                }
                Err(refusal)
            }
        }
    }

    /// An attempt of a BeginUpdate was lost and a later one refused: the lost one may still be
    /// applied (queued in a server's group-commit combiner, or in a store transaction that is
    /// being retried), and lease a claim this caller believes it never got. Ending the lease id
    /// now fences it: a RollbackUpdate of an unknown lease is remembered as rolled back, so the
    /// late attempt is refused (LEASE_ROLLED_BACK), and one that already landed is rolled back
    /// (decision 106). Unfenced (the rollback failed too), the lease is the reconciler's: it has
    /// no local record.
    async fn fence(&self, cell_id: &CellId, lease_id: LeaseId, refusal: &ClaimsError) {
        match self.rollback_update(cell_id, lease_id).await {
            Ok(()) => {
                tracing::debug!(%lease_id, %refusal, "fenced the lease id of a refused BeginUpdate whose earlier attempt was lost")
            }
            Err(error) => {
                tracing::warn!(%lease_id, %refusal, %error, "could not fence the lease id of a refused BeginUpdate whose earlier attempt was lost; if that attempt lands, the reconciler rolls it back")
            }
        }
    }

    pub async fn commit_update(
        &self,
        cell_id: &CellId,
        lease_id: LeaseId,
    ) -> Result<(), ClaimsError> {
        let message = pb::CommitUpdateRequest {
            cell_id: cell_id.to_string(),
            lease_id: lease_id.to_string(),
        };
        self.with_retries(|mut c| {
            let message = message.clone();
            async move { c.commit_update(message).await }
        })
        .await
        .map(drop)
    }

    /// An unconditional RollbackUpdate (the cell ending its own lease).
    pub async fn rollback_update(
        &self,
        cell_id: &CellId,
        lease_id: LeaseId,
    ) -> Result<(), ClaimsError> {
        self.rollback(cell_id, lease_id, None).await
    }

    /// A conditional RollbackUpdate: the store rolls the lease back only if it has gone
    /// unrenewed for at least `unrenewed_for` by its own clock, else `LeaseRenewed` (the
    /// reconciler's rollback of a stale lease, which must not undo a lease renewed since).
    pub async fn rollback_if_unrenewed_for(
        &self,
        cell_id: &CellId,
        lease_id: LeaseId,
        unrenewed_for: Duration,
    ) -> Result<(), ClaimsError> {
        self.rollback(cell_id, lease_id, Some(unrenewed_for)).await
    }

    async fn rollback(
        &self,
        cell_id: &CellId,
        lease_id: LeaseId,
        unrenewed_for: Option<Duration>,
    ) -> Result<(), ClaimsError> {
        let message = pb::RollbackUpdateRequest {
            cell_id: cell_id.to_string(),
            lease_id: lease_id.to_string(),
            unrenewed_for: unrenewed_for.map(topology_claims_proto::convert::duration_to_pb),
        };
        self.with_retries(|mut c| {
            let message = message.clone();
            async move { c.rollback_update(message).await }
        })
        .await
        .map(drop)
    }

    /// One RollbackUpdate attempt, no retry (used for best-effort clean-up).
    pub(crate) async fn rollback_once(
        &self,
        cell_id: &CellId,
        lease_id: LeaseId,
    ) -> Result<(), ClaimsError> {
        let message = pb::RollbackUpdateRequest {
            cell_id: cell_id.to_string(),
            lease_id: lease_id.to_string(),
            unrenewed_for: None,
        };
        let mut client = self.inner.clone();
        match tokio::time::timeout(self.config.call_timeout, client.rollback_update(message)).await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(status)) => Err(status::from_status(&status)),
            Err(_) => Err(ClaimsError::server_unavailable("rollback timed out")),
        }
    }

    pub async fn renew_lease(
        &self,
        cell_id: &CellId,
        lease_id: LeaseId,
    ) -> Result<Lease, ClaimsError> {
        let message = pb::RenewLeaseRequest {
            cell_id: cell_id.to_string(),
            lease_id: lease_id.to_string(),
        };
        let response = self
            .with_retries(|mut c| {
                let message = message.clone();
                async move { c.renew_lease(message).await }
            })
            .await?;
        let response = response.get_ref();
        decode::lease_from_pb(
            response.lease_payload.as_ref(),
            response.last_renewed_at.as_ref(),
        )
    }

    pub async fn list_outstanding_leases(
        &self,
        query: &LeasesQuery,
    ) -> Result<LeasesPage, ClaimsError> {
        let message = decode::leases_query_to_pb(query);
        let response = self
            .with_retries(|mut c| {
                let message = message.clone();
                async move { c.list_outstanding_leases(message).await }
            })
            .await?;
        decode::leases_page_from_pb(response.get_ref())
    }

    /// One ListClaims page: the one after `page_token` (the previous page's `next_page_token`),
    /// or, without one, the one at `query.cursor`. Keep `page.next_cursor` as the next query's
    /// cursor and send `page.next_page_token` with it: the token when the server gave one, the
    /// cursor (which may point inside a record; see `domain::claims_page`) from an older server.
    pub async fn list_claims(
        &self,
        query: &ClaimsQuery,
        page_token: Option<&str>,
    ) -> Result<ClaimViewsPage, ClaimsError> {
        let message = decode::claims_query_to_pb(query, page_token);
        let response = self
            .with_retries(|mut c| {
                let message = message.clone();
                async move { c.list_claims(message).await }
            })
            .await?;
        decode::claims_page_from_pb(response.get_ref(), &query.cell_id)
    }

    /// AcquireVerificationSlot for `holder`, asking for `ttl` (the server's when `None` or
    /// longer). `Ok(None)`: the server has no verification slots (UNIMPLEMENTED, an older
    /// server). All taken: `VerificationSlotsBusy`, not retried here (the caller waits).
    pub async fn acquire_verification_slot(
        &self,
        holder: &SlotHolder,
        ttl: Option<Duration>,
    ) -> Result<Option<(SlotGrant, Duration)>, ClaimsError> {
        let message = pb::AcquireVerificationSlotRequest {
            cell_id: holder.cell_id.to_string(),
            holder: holder.holder.clone(),
            ttl: ttl.map(topology_claims_proto::convert::duration_to_pb),
        };
        let response = self
            .with_retries(|mut c| {
                let message = message.clone();
                async move {
                    match c.acquire_verification_slot(message).await {
                        Err(status) if status.code() == tonic::Code::Unimplemented => Ok(None),
                        other => other.map(|response| Some(response.into_inner())),
                    }
                }
            })
            .await?;
        let Some(response) = response else {
            return Ok(None);
        };
        let grant = decode::slot_grant_from_pb(holder, &response)?;
        let granted_ttl = response
            .ttl
            .as_ref()
            .and_then(|d| {
                Some(Duration::new(
                    d.seconds.try_into().ok()?,
                    d.nanos.try_into().ok()?,
                ))
            })
            .unwrap_or(topology_claims::domain::DEFAULT_VERIFICATION_SLOT_TTL);
        Ok(Some((grant, granted_ttl)))
    }

    /// ReleaseVerificationSlot; `false` when the holder had none (or the server has no slots).
    pub async fn release_verification_slot(
        &self,
        holder: &SlotHolder,
    ) -> Result<bool, ClaimsError> {
        let message = pb::ReleaseVerificationSlotRequest {
            cell_id: holder.cell_id.to_string(),
            holder: holder.holder.clone(),
        };
        self.with_retries(|mut c| {
            let message = message.clone();
            async move {
                match c.release_verification_slot(message).await {
                    Err(status) if status.code() == tonic::Code::Unimplemented => Ok(false),
                    other => other.map(|response| response.into_inner().released),
                }
            }
        })
        .await
    }

    /// ReportVerificationPass: this cell verified every table in a whole pass begun in restore
    /// `epoch`. Returns the restore as the cell now sees it and the expected cells still pending.
    pub async fn report_verification_pass(
        &self,
        cell_id: &CellId,
        epoch: u64,
    ) -> Result<(RestoreView, u32), ClaimsError> {
        let message = pb::ReportVerificationPassRequest {
            cell_id: cell_id.to_string(),
            epoch,
        };
        let response = self
            .with_retries(|mut c| {
                let message = message.clone();
                async move { c.report_verification_pass(message).await }
            })
            .await?
            .into_inner();
        let view = response
            .restore
            .as_ref()
            .ok_or_else(|| ClaimsError::internal("ReportVerificationPass answered no restore"))
            .and_then(decode::restore_view_from_pb)?;
        Ok((view, response.cells_pending))
    }

    /// StreamClaims from `page_token` (a page's or range's `next_page_token`), or without one
    /// from `query.cursor`, to the end: the ListClaims pages of `query.limit`, one per item,
    /// decoded as [`Self::list_claims`] decodes a page. `Ok(None)`: the server has no
    /// StreamClaims (UNIMPLEMENTED, an older server); page with [`Self::list_claims`] instead.
    ///
    /// Opening the stream is retried like any call. Each range must arrive within the
    /// per-attempt deadline of being asked for; a failure ends the stream with that error, and
    /// the caller resumes from the last cursor it got. The server reads the next range only
    /// when this stream is polled for it, so a slow caller slows the stream.
    pub async fn stream_claims(
        &self,
        query: &ClaimsQuery,
        page_token: Option<&str>,
    ) -> Result<Option<ClaimsPageStream>, ClaimsError> {
        let message = pb::StreamClaimsRequest::from(decode::claims_query_to_pb(query, page_token));
        let opened = self
            .with_retries(|mut c| {
                let message = message.clone();
                async move {
                    match c.stream_claims(message).await {
                        Err(status) if status.code() == tonic::Code::Unimplemented => Ok(None),
                        other => other.map(|response| Some(response.into_inner())),
                    }
                }
            })
            .await?;
        let Some(ranges) = opened else {
            return Ok(None);
        };
        let (cell_id, this) = (query.cell_id.clone(), self.clone());
        let pages = futures::stream::unfold(Some(ranges), move |ranges| {
            let (cell_id, this) = (cell_id.clone(), this.clone());
            async move {
                let mut ranges = ranges?;
                let deadline = this.config.call_timeout;
                let page = match tokio::time::timeout(deadline, ranges.message()).await {
                    Ok(Ok(Some(range))) => decode::claims_page_from_pb(&range.into(), &cell_id),
                    Ok(Ok(None)) => return None,
                    Ok(Err(status)) => Err(this.status_error(&status)),
                    Err(_) => Err(ClaimsError::server_unavailable(format!(
                        "no range from {} within {deadline:?} (deadline exceeded)",
                        this.server
                    ))),
                };
                let more = page.is_ok().then_some(ranges);
                Some((page, more))
            }
        });
        Ok(Some(Box::pin(pages)))
    }

    pub async fn lookup_claim(&self, key: &ClaimKey) -> Result<ClaimView, ClaimsError> {
        let message = pb::LookupClaimRequest {
            // Old servers read the claim type of a built-in namespace only.
            claim_type: key.namespace.claim_type_number(),
            claim_value: key.value.clone(),
            namespace: key.namespace.to_string(),
        };
        let response = self
            .with_retries(|mut c| {
                let message = message.clone();
                async move { c.lookup_claim(message).await }
            })
            .await?;
        decode::lookup_from_pb(response.get_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limited(retry_after: Duration) -> ClaimsError {
        ClaimsError::RateLimited {
            limit: "cell-rate",
            cell_id: "cell-a".into(),
            retry_after,
        }
    }

    const BACKOFF: Backoff = Backoff {
        initial: Duration::from_millis(10),
        max: Duration::from_millis(40),
    };

    #[test]
    fn a_rate_limited_call_is_retried_no_sooner_than_its_retry_info_says() {
        assert!(retryable(&limited(Duration::from_millis(1))));
        for attempt in 0..6 {
            let delay = retry_delay(
                &BACKOFF,
                attempt,
                &limited(Duration::from_millis(300)),
                Duration::from_secs(1),
            );
            assert_eq!(delay, Some(Duration::from_millis(300)), "above any backoff");
            let short = retry_delay(
                &BACKOFF,
                attempt,
                &limited(Duration::from_micros(1)),
                Duration::from_secs(1),
            )
            .unwrap();
            assert!(short >= Duration::from_micros(1) && short <= BACKOFF.max);
        }
    }

    #[test]
    fn a_retry_info_longer_than_the_longest_wait_is_not_waited_for() {
        let error = limited(Duration::from_secs(10));
        assert_eq!(
            retry_delay(&BACKOFF, 0, &error, Duration::from_secs(5)),
            None
        );
    }

    #[test]
    fn claim_leased_is_not_retried_unless_asked_for() {
        let hint = Some(Duration::from_secs(1));
        assert_eq!(leased_retry_delay(None, 0, hint), None);
    }

    #[test]
    fn claim_leased_is_retried_after_its_retry_info_a_bounded_number_of_times() {
        let policy = LeasedRetry {
            retries: 3,
            longest_wait: Duration::from_secs(5),
        };
        for retried in 0..3 {
            let delay = leased_retry_delay(Some(&policy), retried, Some(Duration::from_secs(1)))
                .expect("a retry");
            assert!(
                delay >= Duration::from_secs(1) && delay <= Duration::from_millis(1_500),
                "{delay:?}"
            );
        }
        assert_eq!(
            leased_retry_delay(Some(&policy), 3, Some(Duration::from_secs(1))),
            None,
            "retries used up"
        );
        assert_eq!(
            leased_retry_delay(Some(&policy), 0, Some(Duration::from_secs(6))),
            None,
            "a longer wait than allowed is the caller's to decide"
        );
        // A server that sent no RetryInfo: the protocol's own delay.
        let delay = leased_retry_delay(Some(&policy), 0, None).unwrap();
        assert!(delay >= topology_claims::domain::CLAIM_LEASED_RETRY_AFTER);
    }

    #[test]
    fn other_failures_wait_the_backoff_alone() {
        let error = ClaimsError::unavailable("down");
        for attempt in 0..6 {
            let delay = retry_delay(&BACKOFF, attempt, &error, Duration::from_secs(1)).unwrap();
            assert!(delay <= BACKOFF.max);
        }
    }
}

//! Following the change feed (WatchClaims) from Rust: a router's cache, a mirror, a test.
//!
//! [`ClaimsClient::watch_claims`] opens the stream (retried like any call until it opens); each
//! [`ClaimsWatch::next`] is one response, decoded: the events of one or more revisions, or a
//! progress mark. After an error or the end of the stream, watch again from the last revision
//! seen + 1; after `WATCH_COMPACTED`, look up again and watch from the answers' revisions.

use std::time::Duration;

use tonic::Streaming;
use topology_claims::domain::ClaimEvent;
use topology_claims::error::ClaimsError;
use topology_claims_proto::convert::duration_to_pb;
use topology_claims_proto::pb;
use topology_claims_proto::status::from_status;

use crate::client::ClaimsClient;
use crate::decode::claim_event_from_pb;

/// What to watch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchRequest {
    /// Every event from this revision on; 0: from now.
    pub start_revision: u64,
    /// Only these namespaces' events; empty: all.
    pub namespaces: Vec<String>,
    /// A progress mark at least this often when nothing changes; `None`: never.
    pub progress_interval: Option<Duration>,
}

/// One response of the stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchBatch {
    /// In revision order; empty for a progress mark.
    pub events: Vec<ClaimEvent>,
    /// With events: the last one's revision. Without: every event up to it has been sent.
    pub revision: u64,
}

/// An open WatchClaims stream.
pub struct ClaimsWatch {
    stream: Streaming<pb::WatchClaimsResponse>,
    /// The revision of the last event and its place in it, to number events within a revision.
    last: (u64, u64),
}

impl ClaimsWatch {
    /// The next response; `None` when the server ended the stream (it is draining).
    pub async fn next(&mut self) -> Result<Option<WatchBatch>, ClaimsError> {
        let Some(response) = self.stream.message().await.map_err(|s| from_status(&s))? else {
            return Ok(None);
        };
        let mut events = Vec::with_capacity(response.events.len());
        for event in &response.events {
            self.last = if self.last.0 == event.revision {
                (event.revision, self.last.1 + 1)
            } else {
                (event.revision, 0)
            };
            events.push(claim_event_from_pb(event, self.last.1)?);
        }
        Ok(Some(WatchBatch {
            events,
            revision: response.revision,
        }))
    }
}

impl ClaimsClient {
    /// Opens a WatchClaims stream. Refusals: `WatchCompacted` (the start is below the history
    /// kept), `RateLimited` (`--max-watchers`), `Unsupported` (a store without a change feed).
    pub async fn watch_claims(&self, request: &WatchRequest) -> Result<ClaimsWatch, ClaimsError> {
        let message = pb::WatchClaimsRequest {
            start_revision: request.start_revision,
            namespaces: request.namespaces.clone(),
            progress_interval: request.progress_interval.map(duration_to_pb),
        };
        let response = self
            .with_retries(|mut c| {
                let message = message.clone();
                async move { c.watch_claims(message).await }
            })
            .await?;
        Ok(ClaimsWatch {
            stream: response.into_inner(),
            last: (0, 0),
        })
    }
}

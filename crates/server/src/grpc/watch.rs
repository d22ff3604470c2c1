//! WatchClaims: the change feed as a gRPC stream (docs/api.md, "WatchClaims").
//!
//! One [`WatchHub`] per server follows the store's log: a task reads where the log is complete
//! (`ClaimStore::read_events`) every `--watch-poll-interval`, and at once after this server's
//! own writes while a stream or a lease waiter follows it, and publishes that revision. Each
//! stream waits for it to pass its position, then reads its own pages of the log from the
//! store and sends them; it reads only when the previous response was taken, so a watcher that
//! stops reading holds one page at most (gRPC flow control backs up into its channel of one
//! response). The hub also compacts the log (`--watch-retention`, `--watch-max-events`) and
//! caps the watchers (`--max-watchers`).
//!
//! Owns streaming, batching and pacing; the rules of reading the log are `domain::events`'.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use prometheus::{Histogram, IntGauge};
use prost::Message;
use tokio::sync::{mpsc, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tonic::Status;

use crate::grpc::convert;
use crate::grpc::pb;
use crate::grpc::status::to_status;
use topology_claims::domain::{
    self, ClaimEvent, EventPosition, EventsQuery, NamespaceId, EVENTS_READ_LIMIT,
};
use topology_claims::error::ClaimsError;
use topology_claims::ports::ClaimStore;

/// `serve --max-watchers`.
pub const DEFAULT_MAX_WATCHERS: usize = 1_000;
/// `serve --watch-poll-interval`: how often the hub reads the log's head when this server wrote
/// nothing (writes through other servers on the same store show within it).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(50);
/// How often the log is compacted: every 10 s, or every half retention when that is shorter.
fn compact_interval(retention: Duration) -> Duration {
    Duration::from_secs(10).min(retention / 2)
}

/// The knobs of the change feed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchConfig {
    pub max_watchers: usize,
    pub poll_interval: Duration,
    pub retention: Duration,
    pub max_events: u64,
    /// Budget of one response's encoded events (`--max-response-bytes`).
    pub max_response_bytes: usize,
}

impl Default for WatchConfig {
    fn default() -> Self {
        Self {
            max_watchers: DEFAULT_MAX_WATCHERS,
            poll_interval: DEFAULT_POLL_INTERVAL,
            retention: domain::DEFAULT_WATCH_RETENTION,
            max_events: domain::DEFAULT_WATCH_MAX_EVENTS,
            max_response_bytes: domain::DEFAULT_MAX_RESPONSE_BYTES,
        }
    }
}

/// The server's follower of the log, shared by its streams.
pub struct WatchHub {
    store: Arc<dyn ClaimStore>,
    config: WatchConfig,
    /// The revision through which the log is complete, as last read.
    head: watch::Sender<u64>,
    poke: Notify,
    watchers: Arc<Semaphore>,
    /// Set when the server drains: every stream ends.
    closing: watch::Sender<bool>,
    /// `topology_claims_watchers`, `topology_claims_watch_revision` and
    /// `topology_claims_watch_lag_seconds`, with `--metrics-listen`.
    metrics: Option<WatchMetrics>,
}

struct WatchMetrics {
    watchers: IntGauge,
    revision: IntGauge,
    lag: Histogram,
}

/// A stream's place under `--max-watchers`, counted in the gauge while it lives.
struct Place {
    _permit: OwnedSemaphorePermit,
    gauge: Option<IntGauge>,
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Some(gauge) = &self.gauge {
            gauge.dec();
        }
    }
}

impl WatchHub {
    pub fn new(store: Arc<dyn ClaimStore>, config: WatchConfig) -> Arc<Self> {
        Self::with_metrics(store, config, None)
    }

    /// [`WatchHub::new`], keeping the watch gauges of `metrics`.
    pub fn with_metrics(
        store: Arc<dyn ClaimStore>,
        config: WatchConfig,
        metrics: Option<&crate::metrics::ServerMetrics>,
    ) -> Arc<Self> {
        Arc::new(Self {
            metrics: metrics.map(|m| WatchMetrics {
                watchers: m.watchers.clone(),
                revision: m.watch_revision.clone(),
                lag: m.watch_lag.clone(),
            }),
            store,
            config,
            head: watch::Sender::new(0),
            poke: Notify::new(),
            watchers: Arc::new(Semaphore::new(config.max_watchers)),
            closing: watch::Sender::new(false),
        })
    }

    /// The revision through which the log is complete, as this hub last read it; changes as
    /// the hub reads further (the waiting room follows it).
    pub fn head(&self) -> watch::Receiver<u64> {
        self.head.subscribe()
    }

    /// A stream follows the log through this hub now.
    pub fn has_watchers(&self) -> bool {
        self.watchers.available_permits() < self.config.max_watchers
    }

    /// This server wrote: read the head now rather than at the next poll.
    pub fn poke(&self) {
        self.poke.notify_one();
    }

    /// Follows the head and compacts the log until `stop` changes or closes.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<()>) {
        let mut compacted = tokio::time::Instant::now();
        loop {
            match current(self.store.as_ref()).await {
                Ok(head) => {
                    if let Some(metrics) = &self.metrics {
                        metrics
                            .revision
                            .set(i64::try_from(head).unwrap_or(i64::MAX));
                    }
                    self.head.send_if_modified(|seen| {
                        let newer = head > *seen;
                        *seen = (*seen).max(head);
                        newer
                    });
                }
                Err(ClaimsError::Unsupported { .. }) => {
                    // A store without a change feed: nothing to follow, ever.
                    let _ = stop.changed().await;
                    self.closing.send_replace(true);
                    return;
                }
                Err(error) => tracing::debug!(%error, "reading the change feed's head"),
            }
            let interval = compact_interval(self.config.retention);
            if compacted.elapsed() >= interval {
                compacted = tokio::time::Instant::now();
                match (self.store)
                    .compact_events(self.config.retention, self.config.max_events)
                    .await
                {
                    Ok(0) | Err(ClaimsError::Unsupported { .. }) => {}
                    Ok(removed) => {
                        tracing::debug!(removed, "compacted the change feed");
                        // A store may remove a backlog in bounded passes (SQLite, Spanner):
                        // the next one at the next turn of this loop, requests in between.
                        compacted = compacted.checked_sub(interval).unwrap_or(compacted);
                    }
                    Err(error) => tracing::warn!(%error, "compacting the change feed"),
                }
            }
            tokio::select! {
                () = self.poke.notified() => {}
                () = tokio::time::sleep(self.config.poll_interval) => {}
                _ = stop.changed() => {
                    self.closing.send_replace(true);
                    return;
                }
            }
        }
    }

    /// Starts a stream for `request`, or refuses it (a bad request, `--max-watchers` reached,
    /// a compacted start).
    pub async fn start(
        self: &Arc<Self>,
        request: pb::WatchClaimsRequest,
    ) -> Result<WatchStream, Status> {
        let permit = Arc::clone(&self.watchers)
            .try_acquire_owned()
            .map_err(|_| {
                to_status(&ClaimsError::RateLimited {
                    limit: "--max-watchers",
                    cell_id: String::new(),
                    retry_after: Duration::from_secs(1),
                })
            })?;
        let gauge = self.metrics.as_ref().map(|m| m.watchers.clone());
        if let Some(gauge) = &gauge {
            gauge.inc();
        }
        let place = Place {
            _permit: permit,
            gauge,
        };
        let namespaces = request
            .namespaces
            .iter()
            .enumerate()
            .map(|(i, id)| NamespaceId::parse_field(id, &format!("namespaces[{i}]")))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| to_status(&e))?;
        let progress =
            convert::duration_from_pb(request.progress_interval.as_ref(), "progress_interval")
                .map_err(|e| to_status(&e))?;
        let progress = Some(progress).filter(|d| !d.is_zero());
        // Refused here, before the stream opens, when the start is compacted.
        let (first, from) = match request.start_revision {
            0 => {
                let head = current(self.store.as_ref())
                    .await
                    .map_err(|e| to_status(&e))?;
                (
                    Some(progress_response(head)),
                    EventPosition::start_of(head + 1),
                )
            }
            start => {
                let probe = EventsQuery {
                    from: EventPosition::start_of(start),
                    limit: 0,
                };
                self.store
                    .read_events(&probe)
                    .await
                    .map_err(|e| to_status(&e))?;
                (None, EventPosition::start_of(start))
            }
        };
        let (sender, receiver) = mpsc::channel(1);
        let stream = Watcher {
            hub: Arc::clone(self),
            namespaces,
            progress,
            from,
            sender,
            _place: place,
        };
        tokio::spawn(stream.run(first));
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(
            receiver,
        )))
    }
}

pub type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchClaimsResponse, Status>> + Send>>;

/// The revision through which the log is complete now.
async fn current(store: &dyn ClaimStore) -> Result<u64, ClaimsError> {
    let probe = EventsQuery {
        from: EventPosition::start_of(u64::MAX),
        limit: 0,
    };
    Ok(store.read_events(&probe).await?.through)
}

fn progress_response(revision: u64) -> pb::WatchClaimsResponse {
    pb::WatchClaimsResponse {
        events: Vec::new(),
        revision,
    }
}

/// One stream: its position in the log and its place among the watchers.
struct Watcher {
    hub: Arc<WatchHub>,
    namespaces: Vec<NamespaceId>,
    progress: Option<Duration>,
    from: EventPosition,
    sender: mpsc::Sender<Result<pb::WatchClaimsResponse, Status>>,
    _place: Place,
}

impl Watcher {
    async fn run(mut self, first: Option<pb::WatchClaimsResponse>) {
        if let Some(first) = first {
            if self.sender.send(Ok(first)).await.is_err() {
                return;
            }
        }
        let mut head = self.hub.head.subscribe();
        let mut closing = self.hub.closing.subscribe();
        let mut last_sent = tokio::time::Instant::now();
        loop {
            let query = EventsQuery {
                from: self.from,
                limit: EVENTS_READ_LIMIT,
            };
            let page = match self.hub.store.read_events(&query).await {
                Ok(page) => page,
                Err(error) => {
                    let _ = self.sender.send(Err(to_status(&error))).await;
                    return;
                }
            };
            let mut events = page.events;
            // A page cut inside a revision: that revision waits for the next read, so it comes
            // in one response — unless it alone fills the page.
            if page.more {
                let last = events.last().map(|e| e.position.revision);
                let first = events.first().map(|e| e.position.revision);
                if last != first {
                    events.retain(|e| Some(e.position.revision) != last);
                }
            }
            if let Some(last) = events.last() {
                self.from = last.position.next();
            }
            let wanted: Vec<ClaimEvent> = events
                .into_iter()
                .filter(|e| domain::events::watched(&self.namespaces, e))
                .collect();
            for response in responses(&wanted, self.hub.config.max_response_bytes) {
                if self.sender.send(Ok(response)).await.is_err() {
                    return;
                }
                last_sent = tokio::time::Instant::now();
            }
            if let (Some(metrics), Some(lag)) = (&self.hub.metrics, lag(&wanted)) {
                metrics.lag.observe(lag);
            }
            if page.more {
                continue;
            }
            // Every event through `page.through` has been sent.
            self.from = self.from.max(EventPosition::start_of(page.through + 1));
            if let Some(interval) = self.progress {
                if last_sent.elapsed() >= interval {
                    if self
                        .sender
                        .send(Ok(progress_response(page.through)))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    last_sent = tokio::time::Instant::now();
                }
            }
            let until_progress = self.progress.map_or(Duration::from_secs(3600), |i| {
                i.saturating_sub(last_sent.elapsed())
            });
            tokio::select! {
                changed = head.wait_for(|h| *h >= self.from.revision) => {
                    if changed.is_err() {
                        return;
                    }
                }
                () = tokio::time::sleep(until_progress) => {}
                () = self.sender.closed() => return,
                _ = closing.wait_for(|c| *c) => return,
            }
        }
    }
}

/// How long ago the newest change of `events` was made (its claim's `updated_at`, the store's
/// clock), now that they were sent: the watch lag. A deleted claim's row keeps its previous
/// change's time, so deletes are left out.
fn lag(events: &[ClaimEvent]) -> Option<f64> {
    let newest = events
        .iter()
        .filter(|e| !e.deleted)
        .map(|e| e.claim.updated_at.as_unix_micros())
        .max()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    let now = i64::try_from(now.as_micros()).ok()?;
    Some((now - newest).max(0) as f64 / 1e6)
}

/// The events as responses within `budget` encoded bytes each: a revision's events together
/// when they fit, split only when one revision alone is larger.
fn responses(events: &[ClaimEvent], budget: usize) -> Vec<pb::WatchClaimsResponse> {
    let mut out = Vec::new();
    let mut current: Vec<pb::ClaimEvent> = Vec::new();
    let mut size = 0;
    let mut start = 0;
    while start < events.len() {
        let revision = events[start].position.revision;
        let end = events[start..]
            .iter()
            .position(|e| e.position.revision != revision)
            .map_or(events.len(), |n| start + n);
        let group: Vec<pb::ClaimEvent> = events[start..end]
            .iter()
            .map(convert::claim_event_to_pb)
            .collect();
        let group_size: usize = group.iter().map(|e| e.encoded_len() + 3).sum();
        if !current.is_empty() && size + group_size > budget {
            out.push(flush(&mut current));
            size = 0;
        }
        for event in group {
            let len = event.encoded_len() + 3;
            if !current.is_empty() && size + len > budget {
                out.push(flush(&mut current));
                size = 0;
            }
            size += len;
            current.push(event);
        }
        start = end;
    }
    if !current.is_empty() {
        out.push(flush(&mut current));
    }
    out
}

fn flush(events: &mut Vec<pb::ClaimEvent>) -> pb::WatchClaimsResponse {
    let events = std::mem::take(events);
    pb::WatchClaimsResponse {
        revision: events.last().map_or(0, |e| e.revision),
        events,
    }
}

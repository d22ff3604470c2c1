//! A router's cache of who owns each claim, the way docs/operations.md ("Routers") says to
//! build one: look a claim up over REST on a miss, keep the answer with its revision, and let
//! the change feed (WatchClaims) correct or drop what is cached. On `WATCH_COMPACTED` (the
//! router was away longer than the retention, or the store was restored) flush everything and
//! start again from now.
//!
//! The rules that keep it right:
//! - the feed is opened before the first lookup, so every change after a lookup's answer is in
//!   the feed (a change not yet readable when the feed started has a higher revision);
//! - an event replaces an entry only if it is newer than it (a lookup may have answered a later
//!   state than an event still in flight);
//! - the feed's latest state of each key it changed is remembered (up to [`RECENT_CAP`] keys,
//!   then the cache flushes): a lookup whose answer is older keeps the feed's state instead;
//! - the cache is keyed by the server's key: values are mapped to keys as lookups answer them
//!   (the server decides what "the same name" is; the cache never normalizes).
//!
//! Plaintext HTTP/1.1 here; under mutual TLS a router's HTTP stack presents its `router`
//! certificate (docs/security.md).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use topology_claims_client::{ClaimsClient, ClaimsError, WatchRequest};

/// Who owns a claim, as far as the cache knows.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Owner {
    pub cell_id: String,
    /// `active`, `creating`, `destroying` or `updating`: all are routable to `cell_id`.
    pub state: String,
    /// The revision this was true at.
    pub revision: u64,
}

/// Keys whose latest state from the feed is remembered for lookups in flight; past it the cache
/// flushes and forgets them.
pub const RECENT_CAP: usize = 100_000;

#[derive(Default)]
struct Entries {
    /// (namespace, key) → the latest state the feed gave (`None`: deleted).
    recent: HashMap<(String, String), (u64, Option<Owner>)>,
    /// (namespace, key) → owner.
    owners: HashMap<(String, String), Owner>,
    /// (namespace, value as asked) → key, as lookups answered.
    keys: HashMap<(String, String), String>,
    /// Lookups and feed restarts since the last flush (how often it went to the server).
    misses: u64,
    flushes: u64,
    /// The last revision the feed confirmed (progress or events); 0 after a flush, until the
    /// next stream opens.
    confirmed: u64,
    /// Flushes so far, and the flush after which the feed's stream was last opened: a lookup
    /// is cached only when both are the same when it starts and ends, so no answer older than
    /// the stream's start is kept.
    generation: u64,
    open_generation: u64,
    /// Streams re-opened after an error or the server's end of stream.
    reconnects: u64,
}

/// The cache. Clone it freely: clones share the entries.
#[derive(Clone)]
pub struct RouterCache {
    http: Client<HttpConnector, Empty<Bytes>>,
    /// `http://HOST:PORT` of the serve port.
    base: String,
    entries: Arc<Mutex<Entries>>,
}

impl RouterCache {
    pub fn new(base: &str) -> Self {
        Self {
            http: Client::builder(TokioExecutor::new()).build_http(),
            base: base.trim_end_matches('/').to_owned(),
            // No stream open yet: nothing is cached until the first one is.
            entries: Arc::new(Mutex::new(Entries {
                generation: 1,
                ..Entries::default()
            })),
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where to route `value` of `namespace`: the cached owner, or a REST lookup's. `None`: no
    /// cell holds it (not cached: a claim leased a moment later must route at once).
    pub async fn route(&self, namespace: &str, value: &str) -> Result<Option<Owner>, String> {
        {
            let entries = self.entries();
            let cached = entries
                .keys
                .get(&(namespace.to_owned(), value.to_owned()))
                .and_then(|key| entries.owners.get(&(namespace.to_owned(), key.clone())));
            if let Some(owner) = cached {
                return Ok(Some(owner.clone()));
            }
        }
        self.lookup(namespace, value).await
    }

    /// `GET /v1/claims/{namespace}/{value}`, kept unless the cache already knows a newer state.
    pub async fn lookup(&self, namespace: &str, value: &str) -> Result<Option<Owner>, String> {
        let generation = {
            let entries = self.entries();
            (entries.open_generation == entries.generation).then_some(entries.generation)
        };
        let url = format!(
            "{}/v1/claims/{}/{}",
            self.base,
            encode(namespace),
            encode(value)
        );
        let uri: http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
        let answer = self
            .http
            .get(uri)
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        let status = answer.status();
        let body = answer
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?
            .to_bytes();
        let json: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| format!("GET {url}: {e}"))?;
        self.entries().misses += 1;
        match status.as_u16() {
            200 => {}
            404 => return Ok(None),
            code => return Err(format!("GET {url}: {code} {json}")),
        }
        let text = |field: &str| json[field].as_str().unwrap_or_default().to_owned();
        let owner = Owner {
            cell_id: text("cell_id"),
            state: text("state"),
            revision: json["revision"].as_u64().unwrap_or_default(),
        };
        let mut entries = self.entries();
        if generation != Some(entries.generation) {
            // Flushed since (or no stream open): the feed may not cover this answer's age.
            return Ok(Some(owner));
        }
        let key = (namespace.to_owned(), text("key"));
        // The feed may already have passed a later change of this key.
        let owner = match entries.recent.get(&key) {
            Some((revision, later)) if *revision > owner.revision => match later {
                Some(later) => later.clone(),
                None => return Ok(None),
            },
            _ => owner,
        };
        entries
            .keys
            .insert((namespace.to_owned(), value.to_owned()), key.1.clone());
        let kept = entries.owners.entry(key).or_insert_with(|| owner.clone());
        if kept.revision < owner.revision {
            *kept = owner;
        }
        Ok(Some(kept.clone()))
    }

    /// What the cache holds: ((namespace, key), owner) of every entry.
    pub fn snapshot(&self) -> Vec<((String, String), Owner)> {
        let entries = self.entries();
        let mut all: Vec<_> = entries
            .owners
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        all.sort();
        all
    }

    /// The last revision the feed confirmed: every change up to it is applied.
    pub fn confirmed(&self) -> u64 {
        self.entries().confirmed
    }

    /// The entry of (namespace, key) and the revision the feed confirmed, read together.
    pub fn entry(&self, namespace: &str, key: &str) -> (Option<Owner>, u64) {
        let entries = self.entries();
        let owner = entries
            .owners
            .get(&(namespace.to_owned(), key.to_owned()))
            .cloned();
        (owner, entries.confirmed)
    }

    /// How many lookups went to the server, how many times the cache was flushed, and how many
    /// times the feed's stream was re-opened.
    pub fn stats(&self) -> (u64, u64, u64) {
        let entries = self.entries();
        (entries.misses, entries.flushes, entries.reconnects)
    }

    /// Follows the change feed for as long as the task runs. A stream that ends or fails is
    /// re-opened after [`RECONNECT_PAUSE`] from the last confirmed revision + 1; on
    /// `WATCH_COMPACTED` the cache flushes and starts again from now. Only an error that no
    /// retry can cure (no permission, a bad request) ends it. `ready` is told once the first
    /// stream is open (look nothing up before it).
    pub async fn follow(
        &self,
        client: ClaimsClient,
        ready: tokio::sync::oneshot::Sender<()>,
    ) -> Result<(), ClaimsError> {
        let mut ready = Some(ready);
        loop {
            let (from, generation) = {
                let entries = self.entries();
                let confirmed = entries.confirmed;
                (confirmed + u64::from(confirmed > 0), entries.generation)
            };
            let request = WatchRequest {
                start_revision: from,
                progress_interval: Some(std::time::Duration::from_millis(100)),
                ..WatchRequest::default()
            };
            let mut watch = match client.watch_claims(&request).await {
                Ok(watch) => watch,
                Err(ClaimsError::WatchCompacted { .. }) => {
                    self.flush();
                    continue;
                }
                Err(error) => {
                    self.pause_after(error).await?;
                    continue;
                }
            };
            if let Some(ready) = ready.take() {
                let _ = ready.send(());
            }
            loop {
                // Progress comes every 100 ms: a stream silent for longer than this is dead
                // (a dropped connection that never said so).
                let Ok(next) = tokio::time::timeout(SILENCE_LIMIT, watch.next()).await else {
                    break;
                };
                match next {
                    Ok(Some(batch)) => {
                        let mut entries = self.entries();
                        for event in &batch.events {
                            let key = (
                                event.claim.record.key.namespace.to_string(),
                                event.claim.record.key.value.clone(),
                            );
                            let revision = event.position.revision;
                            let state = (!event.deleted).then(|| Owner {
                                cell_id: event.claim.cell_id.to_string(),
                                state: state_name(event.claim.state()).to_owned(),
                                revision,
                            });
                            match entries.owners.get(&key).map(|owner| owner.revision) {
                                Some(cached) if cached >= revision => {}
                                Some(_) => match &state {
                                    Some(owner) => {
                                        entries.owners.insert(key.clone(), owner.clone());
                                    }
                                    None => {
                                        entries.owners.remove(&key);
                                    }
                                },
                                None => {}
                            }
                            // For lookups in flight, whose answers may be older.
                            entries.recent.insert(key, (revision, state));
                        }
                        if entries.recent.len() > RECENT_CAP {
                            drop(entries);
                            self.flush();
                            entries = self.entries();
                        }
                        entries.confirmed = entries.confirmed.max(batch.revision);
                        // From here on, lookups are covered by this stream.
                        if entries.generation == generation {
                            entries.open_generation = generation;
                        }
                    }
                    Ok(None) => break,
                    Err(ClaimsError::WatchCompacted { .. }) => {
                        self.flush();
                        break;
                    }
                    Err(error) => {
                        self.pause_after(error).await?;
                        break;
                    }
                }
            }
            self.entries().reconnects += 1;
        }
    }

    /// Waits before a stream is re-opened after `error`; hands back an error no retry cures.
    async fn pause_after(&self, error: ClaimsError) -> Result<(), ClaimsError> {
        if matches!(
            error,
            ClaimsError::PermissionDenied { .. } | ClaimsError::InvalidRequest { .. }
        ) {
            return Err(error);
        }
        tokio::time::sleep(RECONNECT_PAUSE).await;
        Ok(())
    }

    fn flush(&self) {
        let mut entries = self.entries();
        entries.owners.clear();
        entries.keys.clear();
        entries.recent.clear();
        entries.flushes += 1;
        entries.generation += 1;
        entries.confirmed = 0;
    }
}

/// A stream that sends nothing, not even progress, for this long is re-opened.
pub const SILENCE_LIMIT: std::time::Duration = std::time::Duration::from_secs(3);

/// How long the cache waits before re-opening a stream that ended or failed.
pub const RECONNECT_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// A claim state as the REST answer names it (`active`, `creating`, …).
pub fn state_name(state: topology_claims_client::ClaimState) -> &'static str {
    use topology_claims_client::ClaimState::*;
    match state {
        Active => "active",
        Creating => "creating",
        Destroying => "destroying",
        Updating => "updating",
    }
}

/// Percent-encodes a path segment (everything but unreserved characters).
fn encode(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

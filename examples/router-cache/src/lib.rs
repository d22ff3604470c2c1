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
    /// The last revision the feed confirmed (progress or events).
    confirmed: u64,
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
            entries: Arc::default(),
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

    /// How many lookups went to the server, and how many times the cache was flushed.
    pub fn stats(&self) -> (u64, u64) {
        let entries = self.entries();
        (entries.misses, entries.flushes)
    }

    /// Follows the change feed until `client` fails for good; flushes and starts again from
    /// now on `WATCH_COMPACTED`, resumes after the last confirmed revision when a stream ends.
    /// `ready` is told once the first stream is open (look nothing up before it).
    pub async fn follow(
        &self,
        client: ClaimsClient,
        ready: tokio::sync::oneshot::Sender<()>,
    ) -> Result<(), ClaimsError> {
        let mut ready = Some(ready);
        let mut from = 0;
        loop {
            let request = WatchRequest {
                start_revision: from,
                progress_interval: Some(std::time::Duration::from_millis(100)),
                ..WatchRequest::default()
            };
            let mut watch = match client.watch_claims(&request).await {
                Ok(watch) => watch,
                Err(ClaimsError::WatchCompacted { .. }) => {
                    self.flush();
                    from = 0;
                    continue;
                }
                Err(error) => return Err(error),
            };
            if let Some(ready) = ready.take() {
                let _ = ready.send(());
            }
            loop {
                match watch.next().await {
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
                        from = entries.confirmed + 1;
                    }
                    Ok(None) => break,
                    Err(error) => return Err(error),
                }
            }
        }
    }

    fn flush(&self) {
        let mut entries = self.entries();
        entries.owners.clear();
        entries.keys.clear();
        entries.recent.clear();
        entries.flushes += 1;
    }
}

fn state_name(state: topology_claims_client::ClaimState) -> &'static str {
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

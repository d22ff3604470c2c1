//! Configuration: the `spanner://` store URL, [`SpannerOptions`], and the gcloud-spanner client
//! settings derived from them (channels, session pool, per-RPC retry, deadlines).
//!
//! Owns every knob of the adapter and its documented default. Must not open connections itself
//! beyond building the clients it is asked for.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use gcloud_gax::conn::Environment;
use gcloud_gax::grpc::{Code, Status};
use gcloud_gax::retry::RetrySetting;
use gcloud_spanner::admin::AdminClientConfig;
use gcloud_spanner::client::{ChannelConfig, ClientConfig};
use gcloud_spanner::session::SessionConfig;
use gcloud_spanner::transaction::CallOptions;
use topology_claims::ClaimsError;

/// The environment variable gcloud-spanner (and every other Spanner client) reads to talk to the
/// emulator instead of Google Cloud.
pub const EMULATOR_HOST_ENV: &str = "SPANNER_EMULATOR_HOST";

/// Default [`SpannerOptions::session_pool_size`].
pub const DEFAULT_SESSION_POOL_SIZE: usize = 100;
/// Default [`SpannerOptions::rpc_timeout`].
pub const DEFAULT_RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`SpannerOptions::transaction_deadline`].
pub const DEFAULT_TRANSACTION_DEADLINE: Duration = Duration::from_secs(30);
/// Default [`SpannerOptions::commit_time_per_row`]: a group of 3,000 rows (the most one group
/// transaction writes) gets 10 s + 15 s; a lone BeginUpdate of 1,000 claims 10 s + 5 s.
pub const DEFAULT_COMMIT_TIME_PER_ROW: Duration = Duration::from_millis(5);

/// Sessions one gRPC channel may carry (a limit enforced by gcloud-spanner's `Client::new`).
const SESSIONS_PER_CHANNEL: usize = 100;
/// Channels opened to Google Cloud at least: spreads sessions over several HTTP/2 connections.
const MIN_CLOUD_CHANNELS: usize = 4;
/// Sessions kept open even when idle (capped by the pool size).
const MIN_OPENED_SESSIONS: usize = 4;

/// How the store talks to Spanner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpannerOptions {
    /// Most sessions open at once = most concurrent Spanner transactions and reads of this
    /// process. A request waits up to `rpc_timeout` for a free session, then fails `Unavailable`.
    pub session_pool_size: usize,
    /// Bound on one RPC (connect included, gcloud-spanner's quick retries included), and on
    /// waiting for a session. A Spanner that does not answer within it makes the request fail
    /// `Unavailable` instead of hanging. A commit gets more, by its size
    /// ([`commit_time_per_row`](Self::commit_time_per_row)).
    pub rpc_timeout: Duration,
    /// Bound on one write, all of its attempts included: a transaction aborted by Spanner (lock
    /// contention, the emulator's one-transaction-at-a-time rule) is retried with jittered
    /// backoff until it commits or this much time has passed (then `Unavailable`).
    pub transaction_deadline: Duration,
    /// What a commit gets per row it writes, on top of `rpc_timeout` (decision 074): Spanner's
    /// work on a commit grows with its mutations, so a large one must not share a point read's
    /// deadline. Capped at `transaction_deadline` (at least `rpc_timeout`). Zero: every commit
    /// gets `rpc_timeout`.
    pub commit_time_per_row: Duration,
    /// `HOST:PORT` of a Spanner emulator. `None`: the `SPANNER_EMULATOR_HOST` environment
    /// variable if set, else Google Cloud with Application Default Credentials.
    pub emulator_host: Option<String>,
}

impl Default for SpannerOptions {
    fn default() -> Self {
        Self {
            session_pool_size: DEFAULT_SESSION_POOL_SIZE,
            rpc_timeout: DEFAULT_RPC_TIMEOUT,
            transaction_deadline: DEFAULT_TRANSACTION_DEADLINE,
            commit_time_per_row: DEFAULT_COMMIT_TIME_PER_ROW,
            emulator_host: None,
        }
    }
}

impl SpannerOptions {
    pub(crate) fn check(&self) -> Result<(), ClaimsError> {
        let bad = |message: &str| {
            Err(ClaimsError::Configuration {
                message: message.to_owned(),
            })
        };
        if self.session_pool_size == 0 {
            return bad("the Spanner session pool size must be at least 1");
        }
        if self.rpc_timeout.is_zero() {
            return bad("the Spanner RPC timeout must be positive");
        }
        if self.transaction_deadline.is_zero() {
            return bad("the Spanner transaction deadline must be positive");
        }
        Ok(())
    }

    /// The emulator to use, if any: the explicit option first, then `SPANNER_EMULATOR_HOST`.
    pub(crate) fn emulator(&self) -> Option<String> {
        let from_env = || std::env::var(EMULATOR_HOST_ENV).ok();
        self.emulator_host
            .clone()
            .or_else(from_env)
            .map(|host| {
                host.trim()
                    .trim_start_matches("http://")
                    .trim_end_matches('/')
                    .to_owned()
            })
            .filter(|host| !host.is_empty())
    }

    /// The retry policy of every RPC the adapter issues itself: a couple of quick retries of a
    /// transient `Unavailable`, so a dead endpoint surfaces within about `rpc_timeout` instead of
    /// the crate default of 20 attempts over minutes.
    pub(crate) fn rpc_retry(&self) -> RetrySetting {
        RetrySetting {
            from_millis: 50,
            max_delay: Some(Duration::from_millis(250).min(self.rpc_timeout)),
            factor: 1,
            take: 2,
            codes: vec![Code::Unavailable],
        }
    }

    /// The deadline of a commit that writes `rows` rows: `rpc_timeout` plus
    /// `commit_time_per_row` per row, at most [`longest_call`](Self::longest_call).
    pub(crate) fn commit_deadline(&self, rows: usize) -> Duration {
        let rows = u32::try_from(rows).unwrap_or(u32::MAX);
        self.rpc_timeout
            .saturating_add(self.commit_time_per_row.saturating_mul(rows))
            .min(self.longest_call())
    }

    /// The longest any one call may take: the channels' own timeout. Every call but a commit is
    /// held to `rpc_timeout` by [`within_rpc_timeout`](Self::within_rpc_timeout) instead
    /// (tonic's channel timeout is a ceiling that a single call can shorten, never extend).
    pub(crate) fn longest_call(&self) -> Duration {
        self.rpc_timeout.max(self.transaction_deadline)
    }

    /// `call` (an RPC with gcloud-spanner's quick retries, or a read with its rows), or
    /// `DEADLINE_EXCEEDED` (classified `Unavailable`) after `rpc_timeout`. Dropping the call
    /// cancels its RPC, as the channel timeout did.
    pub(crate) async fn within_rpc_timeout<T, E: From<Status>>(
        &self,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let limit = self.rpc_timeout;
        match tokio::time::timeout(limit, call).await {
            Ok(result) => result,
            Err(_elapsed) => Err(Status::deadline_exceeded(format!(
                "Spanner did not answer within {limit:?}"
            ))
            .into()),
        }
    }

    pub(crate) fn call_options(&self) -> CallOptions {
        CallOptions {
            priority: None,
            retry: Some(self.rpc_retry()),
        }
    }

    /// The data client's configuration (authenticated unless talking to the emulator).
    pub(crate) async fn client_config(&self) -> Result<ClientConfig, ClaimsError> {
        let emulator = self.emulator();
        let pool = self.session_pool_size;
        let min_channels = if emulator.is_some() {
            1
        } else {
            MIN_CLOUD_CHANNELS
        };
        // SessionConfig has a private field: start from its default and set what we own.
        let mut sessions = SessionConfig::default();
        sessions.max_opened = pool;
        sessions.min_opened = pool.min(MIN_OPENED_SESSIONS);
        sessions.max_idle = pool;
        sessions.session_get_timeout = self.rpc_timeout;
        let mut config = ClientConfig {
            session_config: sessions,
            channel_config: ChannelConfig {
                num_channels: pool.div_ceil(SESSIONS_PER_CHANNEL).max(min_channels),
                connect_timeout: self.rpc_timeout,
                // Room for the largest commit; every other call is bounded by rpc_timeout.
                timeout: self.longest_call(),
                ..ChannelConfig::default()
            },
            ..ClientConfig::default()
        };
        if let Some(host) = emulator {
            config.environment = Environment::Emulator(host);
            return Ok(config);
        }
        config
            .with_auth()
            .await
            .map_err(|e| ClaimsError::Configuration {
                message: format!("Google Cloud credentials for Spanner: {e}"),
            })
    }

    /// The admin (instance / database / DDL) client's configuration.
    pub(crate) async fn admin_config(&self) -> Result<AdminClientConfig, ClaimsError> {
        let mut config = AdminClientConfig {
            timeout: self.rpc_timeout,
            connect_timeout: self.rpc_timeout,
            ..AdminClientConfig::default()
        };
        if let Some(host) = self.emulator() {
            config.environment = Environment::Emulator(host);
            return Ok(config);
        }
        config
            .with_auth()
            .await
            .map_err(|e| ClaimsError::Configuration {
                message: format!("Google Cloud credentials for Spanner administration: {e}"),
            })
    }
}

/// A parsed `spanner://projects/P/instances/I/databases/D` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatabaseName {
    pub project: String,
    pub instance: String,
    pub database: String,
}

/// The URL scheme of the Spanner store.
pub const URL_SCHEME: &str = "spanner://";

impl DatabaseName {
    /// Parses `spanner://projects/P/instances/I/databases/D`.
    pub fn parse(url: &str) -> Result<Self, ClaimsError> {
        let invalid = |why: &str| {
            ClaimsError::Configuration {
            message: format!(
                "invalid Spanner store URL {url:?}: {why} (expected {URL_SCHEME}projects/P/instances/I/databases/D)"
            ),
        }
        };
        let path = url
            .strip_prefix(URL_SCHEME)
            .ok_or_else(|| invalid("wrong scheme"))?;
        let parts: Vec<&str> = path.split('/').collect();
        let ["projects", project, "instances", instance, "databases", database] = parts[..] else {
            return Err(invalid("wrong path"));
        };
        check_id(project, "project", 1, 94).map_err(|why| invalid(&why))?;
        check_id(instance, "instance", 1, 64).map_err(|why| invalid(&why))?;
        check_id(database, "database", 1, 30).map_err(|why| invalid(&why))?;
        Ok(Self {
            project: project.to_owned(),
            instance: instance.to_owned(),
            database: database.to_owned(),
        })
    }

    pub fn project_path(&self) -> String {
        format!("projects/{}", self.project)
    }

    pub fn instance_path(&self) -> String {
        format!("projects/{}/instances/{}", self.project, self.instance)
    }

    /// `projects/P/instances/I/databases/D`, the name the Spanner API uses.
    pub fn database_path(&self) -> String {
        format!("{}/databases/{}", self.instance_path(), self.database)
    }
}

impl fmt::Display for DatabaseName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{URL_SCHEME}{}", self.database_path())
    }
}

/// Spanner's id rules, loosely (enough to catch a malformed URL; Google Cloud checks the rest):
/// lowercase letters, digits, `-` and `_` (and `.`/`:` in domain-scoped project ids), starting
/// with a letter.
fn check_id(id: &str, what: &str, min: usize, max: usize) -> Result<(), String> {
    let valid_chars = id.chars().all(|c| {
        c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.' | ':')
    });
    let starts_with_letter = id.chars().next().is_some_and(|c| c.is_ascii_lowercase());
    if (min..=max).contains(&id.len()) && valid_chars && starts_with_letter {
        Ok(())
    } else {
        Err(format!(
            "{what} id {id:?} must be {min}..={max} characters of [a-z0-9_-], starting with a letter"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_names_project_instance_and_database() {
        let name =
            DatabaseName::parse("spanner://projects/my-project/instances/main/databases/claims")
                .unwrap();
        assert_eq!(
            name.database_path(),
            "projects/my-project/instances/main/databases/claims"
        );
        assert_eq!(
            name.to_string(),
            "spanner://projects/my-project/instances/main/databases/claims"
        );
    }

    #[test]
    fn malformed_urls_are_configuration_errors() {
        for url in [
            "postgres://projects/p/instances/i/databases/d",
            "spanner://projects/my-project/instances/main",
            "spanner://projects/my-project/instances/main/databases/claims/extra",
            "spanner://projects/my-project/instances/Main/databases/claims",
            "spanner://projects//instances/main/databases/claims",
            "spanner://projects/my-project/instances/main/databases/1db",
        ] {
            let err = DatabaseName::parse(url).unwrap_err();
            assert!(
                matches!(err, ClaimsError::Configuration { .. }),
                "{url}: {err:?}"
            );
        }
    }

    #[test]
    fn options_refuse_zero_sizes_and_timeouts() {
        let zero_pool = SpannerOptions {
            session_pool_size: 0,
            ..SpannerOptions::default()
        };
        let zero_rpc = SpannerOptions {
            rpc_timeout: Duration::ZERO,
            ..SpannerOptions::default()
        };
        let zero_deadline = SpannerOptions {
            transaction_deadline: Duration::ZERO,
            ..SpannerOptions::default()
        };
        for options in [zero_pool, zero_rpc, zero_deadline] {
            assert!(matches!(
                options.check(),
                Err(ClaimsError::Configuration { .. })
            ));
        }
        assert_eq!(SpannerOptions::default().check(), Ok(()));
    }

    #[test]
    fn a_commit_gets_the_rpc_timeout_plus_time_per_row_up_to_the_transaction_deadline() {
        let options = SpannerOptions::default();
        assert_eq!(options.commit_deadline(0), Duration::from_secs(10));
        assert_eq!(options.commit_deadline(2), Duration::from_millis(10_010));
        assert_eq!(options.commit_deadline(3000), Duration::from_secs(25));
        assert_eq!(options.commit_deadline(1_000_000), Duration::from_secs(30));
        assert_eq!(options.longest_call(), Duration::from_secs(30));
        let flat = SpannerOptions {
            commit_time_per_row: Duration::ZERO,
            ..SpannerOptions::default()
        };
        assert_eq!(flat.commit_deadline(3000), Duration::from_secs(10));
        let slow_rpcs = SpannerOptions {
            rpc_timeout: Duration::from_secs(60),
            ..SpannerOptions::default()
        };
        assert_eq!(slow_rpcs.commit_deadline(3000), Duration::from_secs(60));
        assert_eq!(slow_rpcs.longest_call(), Duration::from_secs(60));
    }

    #[test]
    fn explicit_emulator_host_wins_and_is_normalised() {
        let options = SpannerOptions {
            emulator_host: Some("http://127.0.0.1:9010/".into()),
            ..SpannerOptions::default()
        };
        assert_eq!(options.emulator().as_deref(), Some("127.0.0.1:9010"));
    }
}

//! Connection settings: the libpq-style URL, [`PostgresOptions`], and the deadpool pool built
//! from them. Every session setting (search_path, statement timeout) travels in the startup
//! packet's `options`, so a pooled connection is ready without an extra round trip.
//!
//! Owns configuration only; no statements run here.

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::config::Host;
use tokio_postgres::{Config, NoTls};
use topology_claims::ClaimsError;

use crate::sql;

/// `application_name` when neither the options nor the URL set one.
pub const DEFAULT_APPLICATION_NAME: &str = "topology-claims";

/// How to connect, beyond the URL.
///
/// ```
/// use std::time::Duration;
/// use topology_claims_postgres::PostgresOptions;
/// let options = PostgresOptions { pool_size: 32, statement_timeout: Duration::from_secs(2), ..Default::default() };
/// # assert_eq!(options.connect_timeout, Duration::from_secs(5));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PostgresOptions {
    /// Most connections the pool opens (default 16). See `docs/backends/postgres.md`, "Pool sizing".
    pub pool_size: usize,
    /// PostgreSQL `statement_timeout` of every pooled connection (default 5 s; zero disables it).
    /// A statement cancelled by it fails the request with `Unavailable`.
    pub statement_timeout: Duration,
    /// Longest wait to open a connection or to get a free pooled one (default 5 s).
    pub connect_timeout: Duration,
    /// Keep the tables in this schema (created if missing) instead of the URL's search_path:
    /// one database can then hold several isolated stores (each test uses its own). A plain
    /// lowercase identifier.
    pub schema: Option<String>,
    /// `application_name` shown in `pg_stat_activity`; default: the URL's, else `topology-claims`.
    pub application_name: Option<String>,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            pool_size: 16,
            statement_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            schema: None,
            application_name: None,
        }
    }
}

/// A parsed URL with the options applied, plus a password-free description for messages.
pub(crate) struct Settings {
    pub config: Config,
    /// `postgres://user@host:port/db`, never the password: used in every error message.
    pub target: String,
    /// `sslmode`, `sslrootcert`, `sslcert`, `sslkey` (`crate::tls`).
    pub tls: crate::tls::TlsParams,
}

impl Settings {
    pub fn new(url: &str, options: &PostgresOptions) -> Result<Self, ClaimsError> {
        let (url, tls) = crate::tls::split_url(url)?;
        let mut config = Config::from_str(&url).map_err(|e| ClaimsError::Configuration {
            // The driver's message never echoes the password.
            message: format!("invalid PostgreSQL URL: {}", crate::error::describe(&e)),
        })?;
        if options.pool_size == 0 {
            return Err(ClaimsError::Configuration {
                message: "PostgreSQL pool size must be at least 1".into(),
            });
        }
        let mut session = config.get_options().unwrap_or_default().to_owned();
        session.push_str(&format!(
            " -c statement_timeout={}",
            options.statement_timeout.as_millis()
        ));
        // A transaction left open by a bug or a stuck client must not hold claim locks forever.
        session.push_str(" -c idle_in_transaction_session_timeout=60000");
        // Every time is UTC in the session: the store's columns are timestamptz, but a cell's
        // local tables recreated from Rails' schema.rb are `timestamp without time zone`, whose
        // values (UTC wall times: the Ruby gem writes them so) compare right, and whose lock
        // expiries are written right, only in a UTC session, whatever the database's own
        // TimeZone (decision 113).
        if !session.contains("TimeZone") {
            session.push_str(" -c TimeZone=UTC");
        }
        // NOTICEs ("relation … already exists, skipping" at every start) are not news: the
        // driver would log each at INFO. Warnings and errors still come through.
        if !session.contains("client_min_messages") {
            session.push_str(" -c client_min_messages=warning");
        }
        if let Some(schema) = &options.schema {
            sql::quote_schema(schema)?;
            session.push_str(&format!(" -c search_path={schema}"));
        }
        config.options(session.trim_start());
        match (&options.application_name, config.get_application_name()) {
            (Some(name), _) => {
                config.application_name(name);
            }
            (None, None) => {
                config.application_name(DEFAULT_APPLICATION_NAME);
            }
            (None, Some(_)) => {}
        }
        config.connect_timeout(options.connect_timeout);
        // Notice a vanished server (no FIN, e.g. a network partition) within about a minute.
        config.keepalives_idle(Duration::from_secs(30));
        config.ssl_mode(tls.mode.driver_mode());
        let target = describe_target(&config);
        Ok(Self {
            config,
            target,
            tls,
        })
    }

    /// The connection pool. Connections are opened lazily, recycled with a cheap `is_closed`
    /// check, and a broken one is replaced on the next checkout: the store heals by itself once
    /// PostgreSQL is back.
    pub fn pool(&self, options: &PostgresOptions) -> Result<Pool, ClaimsError> {
        let manager_config = || ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match crate::tls::connector(&self.tls)? {
            Some(tls) => Manager::from_config(self.config.clone(), tls, manager_config()),
            None => Manager::from_config(self.config.clone(), NoTls, manager_config()),
        };
        Pool::builder(manager)
            .max_size(options.pool_size)
            .wait_timeout(Some(options.connect_timeout))
            .create_timeout(Some(options.connect_timeout))
            .recycle_timeout(Some(options.connect_timeout))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| ClaimsError::Configuration {
                message: format!("PostgreSQL connection pool for {}: {e}", self.target),
            })
    }
}

/// A store URL as it may be logged: `postgres://USER@HOST:PORT/DB`, without password or options;
/// `postgres://(invalid URL)` when it does not parse.
pub fn redacted_url(url: &str) -> String {
    let url = crate::tls::split_url(url).map_or_else(|_| url.to_owned(), |(url, _)| url);
    Config::from_str(&url)
        .map(|config| describe_target(&config))
        .unwrap_or_else(|_| "postgres://(invalid URL)".to_owned())
}

fn describe_target(config: &Config) -> String {
    let user = config.get_user().unwrap_or("");
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        Some(Host::Unix(path)) => path.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config.get_dbname().unwrap_or(user);
    let at = if user.is_empty() {
        String::new()
    } else {
        format!("{user}@")
    };
    format!("postgres://{at}{host}:{port}/{db}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_and_socket_forms_parse_and_hide_the_password() {
        let s = Settings::new(
            "postgres://app:secret@db.example:6543/claims",
            &Default::default(),
        )
        .unwrap();
        assert_eq!(s.target, "postgres://app@db.example:6543/claims");
        let s = Settings::new(
            "postgres://postgres@/test?host=/var/run/postgresql",
            &Default::default(),
        )
        .unwrap();
        assert_eq!(
            s.target,
            "postgres://postgres@/var/run/postgresql:5432/test"
        );
    }

    #[test]
    fn redacted_urls_never_show_the_password() {
        assert_eq!(
            redacted_url("postgresql://a:pw@h:1/d?sslmode=disable"),
            "postgres://a@h:1/d"
        );
        assert_eq!(
            redacted_url("postgres://a:pw@h:notaport/d"),
            "postgres://(invalid URL)"
        );
    }

    #[test]
    fn options_travel_in_the_startup_packet() {
        let options = PostgresOptions {
            schema: Some("tc_x".into()),
            statement_timeout: Duration::from_millis(1500),
            application_name: Some("mine".into()),
            ..Default::default()
        };
        let s = Settings::new("postgres://u@h/d?options=-c%20work_mem%3D8MB", &options).unwrap();
        let session = s.config.get_options().unwrap();
        assert!(session.starts_with("-c work_mem=8MB"), "{session}");
        assert!(session.contains("-c statement_timeout=1500"), "{session}");
        assert!(session.contains("-c search_path=tc_x"), "{session}");
        assert_eq!(s.config.get_application_name(), Some("mine"));
    }

    #[test]
    fn bad_settings_are_configuration_errors() {
        let bad_schema = PostgresOptions {
            schema: Some("x; drop".into()),
            ..Default::default()
        };
        for (url, options) in [
            ("postgres://u@h/d?bogus=1", PostgresOptions::default()),
            (
                "postgres://u@h/d",
                PostgresOptions {
                    pool_size: 0,
                    ..Default::default()
                },
            ),
            ("postgres://u@h/d", bad_schema),
        ] {
            assert!(matches!(
                Settings::new(url, &options).err(),
                Some(ClaimsError::Configuration { .. })
            ));
        }
    }
}

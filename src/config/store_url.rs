//! Store URLs (`--store`, `--local-db`): which scheme, and where. Parsed after clap, so a
//! rejected value is not echoed (a database URL may hold a password), and [`StoreUrl`]'s
//! `Display` never prints one.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// What `--store` accepts, for messages.
pub const SUPPORTED_STORES: &str = "memory: (in-process, lost on exit), sqlite://PATH (a file; \
     sqlite://relative/path.db or sqlite:///absolute/path.db), postgres://USER@HOST:PORT/DB \
     (also postgresql://, ?host=/var/run/postgresql for a socket) and \
     spanner://projects/P/instances/I/databases/D";

/// A parsed store URL: the scheme decides the adapter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreUrl {
    /// `memory:`: the in-memory reference store.
    Memory,
    /// `sqlite://PATH`: a SQLite database file.
    Sqlite(PathBuf),
    /// `postgres://…` or `postgresql://…`, verbatim for the driver; may hold a password.
    Postgres(String),
    /// `spanner://projects/P/instances/I/databases/D` (the path is checked by the Spanner
    /// backend when it opens).
    Spanner(String),
}

impl FromStr for StoreUrl {
    type Err = String;

    fn from_str(url: &str) -> Result<Self, String> {
        if url == "memory:" || url == "memory://" {
            return Ok(Self::Memory);
        }
        if let Some(path) = url.strip_prefix("sqlite://") {
            if path.is_empty() {
                return Err(format!(
                    "store URL {url:?} has no file path; use sqlite://PATH, e.g. sqlite://topology-claims.db"
                ));
            }
            return Ok(Self::Sqlite(PathBuf::from(path)));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Self::Postgres(url.to_owned()));
        }
        if url.starts_with("spanner://") {
            return Ok(Self::Spanner(url.to_owned()));
        }
        // Only the scheme is echoed: the rest of a database URL may hold a password.
        match url.split_once(':') {
            Some((scheme @ ("memory" | "sqlite"), _)) => Err(format!(
                "malformed {scheme} store URL; supported: {SUPPORTED_STORES}"
            )),
            Some((scheme, _)) if !scheme.is_empty() && !scheme.contains('/') => Err(format!(
                "unknown store scheme {scheme:?}; supported: {SUPPORTED_STORES}"
            )),
            _ => Err(format!(
                "store URL without a scheme; supported: {SUPPORTED_STORES}"
            )),
        }
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Memory => f.write_str("memory:"),
            Self::Sqlite(path) => write!(f, "sqlite://{}", path.display()),
            Self::Postgres(url) => f.write_str(&redact_url(url)),
            Self::Spanner(url) => f.write_str(url),
        }
    }
}

/// `url` as it may be printed: no password, no query string (which may carry one too).
pub fn redact_url(url: &str) -> String {
    let url = url.split_once('?').map_or(url, |(before, _)| before);
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.rsplit_once('@') {
        Some((user, host)) => {
            let user = user.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}@{host}")
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_and_sqlite_urls_are_understood() {
        assert_eq!("memory:".parse(), Ok(StoreUrl::Memory));
        assert_eq!(
            "sqlite://claims.db".parse(),
            Ok(StoreUrl::Sqlite("claims.db".into()))
        );
        assert_eq!(
            "sqlite://data/claims.db".parse(),
            Ok(StoreUrl::Sqlite("data/claims.db".into()))
        );
        assert_eq!(
            "sqlite:///var/lib/claims.db".parse(),
            Ok(StoreUrl::Sqlite("/var/lib/claims.db".into()))
        );
    }

    #[test]
    fn sqlite_url_without_a_path_is_refused() {
        let error = "sqlite://".parse::<StoreUrl>().unwrap_err();
        assert!(error.contains("no file path"), "{error}");
    }

    #[test]
    fn postgres_urls_are_understood_and_displayed_without_the_password() {
        let url: StoreUrl = "postgres://admin:hunter2@db/claims?sslmode=require"
            .parse()
            .unwrap();
        assert_eq!(
            url,
            StoreUrl::Postgres("postgres://admin:hunter2@db/claims?sslmode=require".into())
        );
        assert_eq!(url.to_string(), "postgres://admin@db/claims");
        assert!(matches!(
            "postgresql://u@h/d".parse(),
            Ok(StoreUrl::Postgres(_))
        ));
    }

    #[test]
    fn spanner_urls_are_understood() {
        let url = "spanner://projects/p/instances/i/databases/d";
        assert_eq!(url.parse(), Ok(StoreUrl::Spanner(url.to_owned())));
    }

    #[test]
    fn unknown_schemes_and_bare_paths_list_the_supported_ones() {
        for bad in [
            "mysql://x",
            "claims.db",
            "/tmp/claims.db",
            "",
            "sqlite:claims.db",
            "memory:x",
        ] {
            let error = bad.parse::<StoreUrl>().unwrap_err();
            assert!(error.contains("supported: memory:"), "{bad}: {error}");
        }
    }

    #[test]
    fn display_round_trips() {
        for url in ["memory:", "sqlite://claims.db", "sqlite:///abs/claims.db"] {
            assert_eq!(url.parse::<StoreUrl>().unwrap().to_string(), url);
        }
    }

    #[test]
    fn redaction_drops_passwords_and_options() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/d"),
            "postgres://u@h:5432/d"
        );
        assert_eq!(redact_url("postgres://h/d?password=x"), "postgres://h/d");
        assert_eq!(redact_url("http://127.0.0.1:1"), "http://127.0.0.1:1");
    }
}

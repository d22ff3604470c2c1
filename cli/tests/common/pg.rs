//! A fresh PostgreSQL database per test, for the tests that need a real PostgreSQL (a store or a
//! cell's local database): `TOPOLOGY_CLAIMS_TEST_POSTGRES_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test` (scripts/ensure-services.sh starts it).

use topology_claims_client::{ClaimsClient, ClientConfig};
use topology_claims_postgres::tokio_postgres::{self, NoTls};

use super::Server;

pub fn base_url() -> String {
    std::env::var("TOPOLOGY_CLAIMS_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// `url` with its database replaced by `db` (query string kept).
pub fn with_database(url: &str, db: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let (server, _) = base.rsplit_once('/').expect("a database in the URL");
    match query {
        Some(q) => format!("{server}/{db}?{q}"),
        None => format!("{server}/{db}"),
    }
}

/// A fresh database, dropped on Drop; `None` (with a skip line) when PostgreSQL is unreachable
/// outside CI.
pub struct FreshDb {
    pub admin: tokio_postgres::Client,
    pub name: String,
    pub url: String,
}

impl FreshDb {
    pub async fn create() -> Option<FreshDb> {
        let admin_url = base_url();
        let admin = match tokio_postgres::connect(&admin_url, NoTls).await {
            Ok((client, connection)) => {
                tokio::spawn(connection);
                client
            }
            Err(e) if std::env::var("CI").as_deref() == Ok("true") => {
                panic!("PostgreSQL unreachable at {admin_url} with CI=true: {e}")
            }
            Err(e) => {
                println!("postgres tests skipped: {admin_url} unreachable: {e}");
                return None;
            }
        };
        let name = format!("tc_cli_{}_{}", std::process::id(), fastrand_suffix());
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create a test database");
        let url = with_database(&admin_url, &name);
        Some(FreshDb { admin, name, url })
    }

    pub async fn drop_database(self) {
        let _ = self
            .admin
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .await;
    }
}

fn fastrand_suffix() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
            % 0xffff_ffff
    )
}

/// A cell whose local database is a fresh PostgreSQL database (with `leases_outstanding`), and a
/// `serve` on memory with a client of it. The tests add their own methods.
pub struct PgCell {
    pub db: FreshDb,
    /// A connection to the cell's database.
    pub local: tokio_postgres::Client,
    pub dir: tempfile::TempDir,
    pub server: Server,
    pub client: ClaimsClient,
}

impl PgCell {
    /// `None` (with a skip line) when PostgreSQL is unreachable outside CI.
    pub async fn start() -> Option<PgCell> {
        let db = FreshDb::create().await?;
        let (local, connection) = tokio_postgres::connect(&db.url, NoTls).await.unwrap();
        tokio::spawn(connection);
        topology_claims_postgres::ensure_local_schema(&local)
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let server = tokio::task::spawn_blocking({
            let dir = dir.path().to_owned();
            move || Server::start(&dir, &["--listen", "127.0.0.1:0", "--store", "memory:"])
        })
        .await
        .unwrap();
        let client =
            ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
        Some(PgCell {
            db,
            local,
            dir,
            server,
            client,
        })
    }
}

//! Registers users in a cell whose local database is SQLite, claiming each username and email
//! through the claims service with the three-phase transaction.
//!
//! cargo run --example signup -- http://127.0.0.1:50051 cell-1 cell.db alice alice@example.com
//!
//! Over mutual TLS (docs/security.md): an `https://` URL, and the CA bundle and this cell's
//! certificate in TOPOLOGY_CLAIMS_TLS_CA, TOPOLOGY_CLAIMS_TLS_CERT, TOPOLOGY_CLAIMS_TLS_KEY.

use topology_claims::cell::{
    ClaimsClient, ClientConfig, ClientTls, TransactionError, UpdateConfig,
};
use topology_claims::{
    BeginUpdate, CellId, ClaimKey, ClaimRecord, ClaimType, ClaimsError, OwnerType, TableName,
};
use topology_claims_sqlite::{cell::transact, ensure_local_schema, SqliteLocalLeaseStore};

/// Creates user `name` with `email`; on a conflict, says which attribute is taken.
pub async fn signup(
    client: &ClaimsClient,
    cell: &CellId,
    db_path: &str,
    name: &str,
    email: &str,
) -> Result<i64, String> {
    let mut db = rusqlite::Connection::open(db_path).map_err(|e| e.to_string())?;
    db.execute_batch("CREATE TABLE IF NOT EXISTS users (id INTEGER PRIMARY KEY, name TEXT UNIQUE, email TEXT UNIQUE)")
        .map_err(|e| e.to_string())?;
    ensure_local_schema(&db).map_err(|e| e.to_string())?;
    let leases = SqliteLocalLeaseStore::open(db_path)
        .await
        .map_err(|e| e.to_string())?;
    // The id the record will get, so the claims can point at it (for the verifier).
    let id: i64 = db
        .query_row("SELECT COALESCE(MAX(id), 0) + 1 FROM users", [], |r| {
            r.get(0)
        })
        .map_err(|e| e.to_string())?;
    let claim = |claim_type, value: &str, table| ClaimRecord {
        key: ClaimKey::new(claim_type, value),
        owner_type: OwnerType::User,
        owner_value: id.to_string(),
        table_name: table,
        table_record_id: id,
    };
    let request = BeginUpdate {
        local_transaction: None,
        cell_id: cell.clone(),
        lease_id: None,
        creates: vec![
            claim(ClaimType::Username, name, TableName::Users),
            claim(ClaimType::Email, email, TableName::Emails),
        ],
        destroys: vec![],
        updates: Vec::new(),
    };
    let result = transact(
        client,
        &mut db,
        &leases,
        request,
        UpdateConfig::default(),
        |tx| {
            tx.execute(
                "INSERT INTO users (id, name, email) VALUES (?1, ?2, ?3)",
                (id, name, email),
            )?;
            Ok::<_, rusqlite::Error>(id)
        },
    )
    .await;
    match result {
        Ok((id, _)) => Ok(id),
        Err(TransactionError::Claims(ClaimsError::ClaimTaken { claim })) => {
            Err(format!("{} has already been taken", claim.claim_type))
        }
        Err(TransactionError::Claims(ClaimsError::ClaimLeased { claim })) => Err(format!(
            "{} is being changed right now; try again",
            claim.claim_type
        )),
        Err(other) => Err(other.to_string()),
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [server, cell, db, name, email] = args.as_slice() else {
        eprintln!("usage: signup SERVER_URL CELL_ID DB_PATH NAME EMAIL");
        return std::process::ExitCode::from(2);
    };
    let run = async {
        // Over mutual TLS (an https:// SERVER_URL): the CA bundle and this cell's certificate.
        let tls = match (
            std::env::var_os("TOPOLOGY_CLAIMS_TLS_CA"),
            std::env::var_os("TOPOLOGY_CLAIMS_TLS_CERT"),
            std::env::var_os("TOPOLOGY_CLAIMS_TLS_KEY"),
        ) {
            (Some(ca), Some(cert), Some(key)) => Some(
                ClientTls::from_files(ca.as_ref(), Some((cert.as_ref(), key.as_ref())))
                    .map_err(|e| e.to_string())?,
            ),
            _ => None,
        };
        let config = ClientConfig {
            tls,
            ..ClientConfig::default()
        };
        let client = ClaimsClient::connect_lazy(server, config).map_err(|e| e.to_string())?;
        let cell = CellId::parse(cell).map_err(|e| e.to_string())?;
        signup(&client, &cell, db, name, email).await
    };
    match run.await {
        Ok(id) => {
            println!("registered {name} as user {id}");
            std::process::ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("signup failed: {message}");
            std::process::ExitCode::FAILURE
        }
    }
}

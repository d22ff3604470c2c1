//! A Rust cell on the client crate alone: registers users in a cell whose local database is
//! SQLite, claiming each username and email through the claims service with the three-phase
//! transaction. It depends on `topology-claims-client` and `topology-claims-sqlite`, never on
//! the server (`cargo tree -p topology-claims-example-rust-cell` shows it).
//!
//! ```text
//! topology-claims serve --store memory: --listen 127.0.0.1:50051 --allow-plaintext
//! cargo run -p topology-claims-example-rust-cell -- http://127.0.0.1:50051 cell-1 cell.db alice alice@example.com
//! ```
//!
//! Over mutual TLS (docs/security.md): an `https://` URL, and the CA bundle and this cell's
//! certificate in TOPOLOGY_CLAIMS_CLIENT_TLS_CA, TOPOLOGY_CLAIMS_CLIENT_TLS_CERT, TOPOLOGY_CLAIMS_CLIENT_TLS_KEY.

use topology_claims_client::{
    BeginUpdate, CellId, ClaimKey, ClaimRecord, ClaimType, ClaimsClient, ClaimsError, OwnerType,
    TableName, TransactionError, UpdateConfig,
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
        display: None,
        key: ClaimKey::new(claim_type, value),
        owner_type: OwnerType::USER,
        owner_value: id.to_string(),
        table_name: table,
        table_record_id: id,
    };
    let request = BeginUpdate {
        local_transaction: None,
        cell_id: cell.clone(),
        lease_id: None,
        creates: vec![
            claim(ClaimType::Username, name, TableName::USERS),
            claim(ClaimType::Email, email, TableName::EMAILS),
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
            Err(format!("{} has already been taken", kind(&claim)))
        }
        Err(TransactionError::Claims(ClaimsError::ClaimLeased { claim })) => Err(format!(
            "{} is being changed right now; try again",
            kind(&claim)
        )),
        Err(other) => Err(other.to_string()),
    }
}

/// What the user calls a claim: "username" for the built-in `usernames`, else the namespace.
fn kind(claim: &topology_claims_client::ClaimKey) -> String {
    claim
        .namespace
        .claim_type()
        .map_or_else(|| claim.namespace.to_string(), |t| t.name().to_owned())
}

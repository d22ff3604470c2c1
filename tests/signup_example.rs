//! Runs the Rust cell example (`examples/rust-cell`) against the real gRPC server: two cells register users; a taken
//! username or email is reported by name and leaves the cell's database untouched.

use std::sync::Arc;

use topology_claims::memory::MemoryClaimStore;
use topology_claims::{ClaimKey, ClaimState, ClaimType};
use topology_claims_client::{ClaimsClient, ClientConfig};
use topology_claims_testkit::fixtures::cell;
use topology_claims_testkit::TestServer;

use rust_cell as example;

#[tokio::test]
async fn signup_example_registers_users_and_names_the_taken_attribute() {
    let server = TestServer::start(Arc::new(MemoryClaimStore::new())).await;
    let client = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (db1, db2) = (dir.path().join("cell1.db"), dir.path().join("cell2.db"));
    let (db1, db2) = (db1.to_str().unwrap(), db2.to_str().unwrap());
    let (cell1, cell2) = (cell("cell-1"), cell("cell-2"));

    let id = example::signup(&client, &cell1, db1, "alice", "alice@example.com")
        .await
        .unwrap();
    assert_eq!(id, 1);
    let claim = client
        .lookup_claim(&ClaimKey::new(ClaimType::Email, "alice@example.com"))
        .await
        .unwrap();
    assert_eq!(
        (claim.cell_id, claim.state),
        (cell1.clone(), ClaimState::Active)
    );

    let err = example::signup(&client, &cell2, db2, "alice", "other@example.com")
        .await
        .unwrap_err();
    assert_eq!(err, "username has already been taken");
    let err = example::signup(&client, &cell2, db2, "alicia", "alice@example.com")
        .await
        .unwrap_err();
    assert_eq!(err, "email has already been taken");
    let users: i64 = rusqlite::Connection::open(db2)
        .unwrap()
        .query_row("SELECT COUNT(*) FROM users", [], |r| r.get(0))
        .unwrap();
    assert_eq!(users, 0, "a refused signup leaves no local row");
    assert_eq!(
        example::signup(&client, &cell2, db2, "bob", "bob@example.com")
            .await
            .unwrap(),
        1
    );
    server.shutdown().await;
}

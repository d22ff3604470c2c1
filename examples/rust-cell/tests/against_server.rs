//! The Rust cell example as a user runs it: the `rust-cell` binary against the real
//! `topology-claims serve --store memory:` process (README, "A Rust cell").

use std::path::Path;
use std::process::{Command, Output};

use topology_claims_harness::serve::{clean_command, product_binary, ServeChild};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).trim().to_owned()
}

#[test]
fn the_example_signs_users_up_and_names_the_taken_username() {
    let binary = product_binary().expect("the topology-claims binary");
    let args = ["serve", "--store", "memory:", "--listen", "127.0.0.1:0"];
    let server = ServeChild::start(clean_command(&binary, &args)).expect("serve starts");
    let url = server.endpoint();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let run = |cell: &str, db: &str, name: &str, email: &str| -> Output {
        let db = dir.path().join(db);
        let db = db.to_str().expect("a UTF-8 path");
        Command::new(env!("CARGO_BIN_EXE_rust-cell"))
            .args([url.as_str(), cell, db, name, email])
            .env_remove("TOPOLOGY_CLAIMS_CLIENT_TLS_CA")
            .output()
            .expect("rust-cell runs")
    };

    let alice = run("cell-1", "cell1.db", "alice", "alice@example.com");
    assert!(alice.status.success(), "{}", text(&alice.stderr));
    assert_eq!(text(&alice.stdout), "registered alice as user 1");

    let taken = run("cell-2", "cell2.db", "alice", "alice@cell2.example");
    assert_eq!(taken.status.code(), Some(1), "{}", text(&taken.stdout));
    assert_eq!(
        text(&taken.stderr),
        "signup failed: username has already been taken"
    );
    assert!(Path::new(&dir.path().join("cell2.db")).exists());

    let bob = run("cell-2", "cell2.db", "bob", "bob@example.com");
    assert!(bob.status.success(), "{}", text(&bob.stderr));
    assert_eq!(text(&bob.stdout), "registered bob as user 1");
}

//! The real binary with Cloud Spanner (the emulator, started here on a free port and stopped by
//! PID): `migrate --create-database` creates instance, database and schema; `serve --store
//! spanner://…` serves claims from it. Missing emulator: fails when CI=true, else a skip line.
#![cfg(all(unix, feature = "spanner"))]

mod common;
#[path = "../../backends/spanner/tests/common/mod.rs"]
mod emulator;

use std::process::Command;

use common::{command, text, Server};
use emulator::{Emulator, Mode};
use topology_claims::ClaimState;
use topology_claims_client::{ClaimsClient, ClientConfig};
use topology_claims_testkit::fixtures::{cell, creates, username};

fn with_emulator(mut command: Command, emulator: &Emulator) -> Command {
    command.env("SPANNER_EMULATOR_HOST", &emulator.host);
    command
}

#[tokio::test]
async fn migrate_creates_the_database_and_serve_answers_from_spanner() {
    let emulator = emulator::start(Mode::Plain);
    let dir = tempfile::tempdir().unwrap();
    let url = "spanner://projects/cli-project/instances/cli-instance/databases/claims";

    let migrate = with_emulator(
        command(
            dir.path(),
            &["migrate", "--create-database", "--store", url],
        ),
        &emulator,
    )
    .output()
    .unwrap();
    assert!(migrate.status.success(), "{}", text(&migrate.stderr));
    assert!(
        text(&migrate.stdout).contains("applied migration"),
        "{}",
        text(&migrate.stdout)
    );
    let again = with_emulator(command(dir.path(), &["migrate", "--store", url]), &emulator)
        .output()
        .unwrap();
    assert!(
        text(&again.stdout).contains("schema is up to date"),
        "{}",
        text(&again.stdout)
    );

    // Server::start builds its own command; the emulator host reaches it through the environment.
    std::env::set_var("SPANNER_EMULATOR_HOST", &emulator.host);
    let server = {
        let dir = dir.path().to_owned();
        tokio::task::spawn_blocking(move || {
            Server::start(
                &dir,
                &["--listen", "127.0.0.1:0", "--store", url, "--no-migrate"],
            )
        })
        .await
        .unwrap()
    };
    let client = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    let a = cell("cell-a");
    let lease = client
        .begin_update(creates(&a, &[username("spanner-alice")]))
        .await
        .unwrap();
    client.commit_update(&a, lease.lease_id).await.unwrap();
    let claim = client
        .lookup_claim(&username("spanner-alice").key)
        .await
        .unwrap();
    assert_eq!(
        (claim.cell_id.as_str(), claim.state),
        ("cell-a", ClaimState::Active)
    );
    let status = tokio::task::spawn_blocking(move || server.stop_with("TERM"))
        .await
        .unwrap();
    assert!(status.success());
}

#[test]
fn create_database_is_refused_for_other_stores() {
    let dir = tempfile::tempdir().unwrap();
    let out = command(
        dir.path(),
        &["migrate", "--create-database", "--store", "memory:"],
    )
    .output()
    .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--create-database is for spanner:// stores"),
        "{}",
        text(&out.stderr)
    );
}

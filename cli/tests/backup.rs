//! `topology-claims backup` and `restore` against the real binary: a consistent online backup of
//! a SQLite store while `serve` keeps committing, a restore that `serve` opens with every claim
//! committed before the backup, and the refusals that keep an operator from losing data.

mod common;

use common::traffic::{claim, Traffic};
use common::{run, text, Server};
use topology_claims::ClaimState;
use topology_claims_client::{ClaimsClient, ClientConfig};
use topology_claims_testkit::fixtures::{cell, username};

/// `serve` on `store`, from async code.
async fn serve(dir: &std::path::Path, store: &str) -> Server {
    let (dir, store) = (dir.to_owned(), store.to_owned());
    tokio::task::spawn_blocking(move || {
        Server::start(&dir, &["--listen", "127.0.0.1:0", "--store", &store])
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_online_backup_restores_every_claim_committed_before_it_and_nothing_is_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let store = format!("sqlite://{}", d.join("claims.db").display());
    let server = serve(&d, &store).await;
    let client = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    for i in 0..20 {
        claim(&client, &format!("before-{i}")).await;
    }

    // Traffic goes on while the backup is taken.
    let traffic = Traffic::start(&client);
    let backup = d.join("backup-1.db");
    let args = [
        "backup",
        "--store",
        &store,
        "--to",
        backup.to_str().unwrap(),
    ];
    let output = tokio::task::spawn_blocking({
        let (d, args) = (d.clone(), args.map(String::from));
        move || run(&d, &args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .unwrap();
    let during = traffic.stop().await;
    assert!(output.status.success(), "{}", text(&output.stderr));
    let said = text(&output.stdout);
    assert!(said.starts_with("backup written: "), "{said}");
    assert!(said.contains("schema 0010_watch_event_count"), "{said}");

    // Never overwritten.
    let again = run(&d, &args);
    assert!(!again.status.success());
    let err = text(&again.stderr);
    assert!(
        err.contains("exists") && err.contains("backup-1.db"),
        "{err}"
    );
    drop(server);

    // A restore into a new file, served: every claim committed before the backup is there.
    let restored = d.join("restored.db");
    let restored_store = format!("sqlite://{}", restored.display());
    let restore = [
        "restore",
        "--from",
        backup.to_str().unwrap(),
        "--store",
        &restored_store,
    ];
    let output = run(&d, &restore);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let said = text(&output.stdout);
    assert!(
        said.contains("restored: ") && said.contains("After a restore"),
        "{said}"
    );
    // Restoring over an existing store needs --replace.
    let over = run(&d, &restore);
    assert!(!over.status.success());
    assert!(
        text(&over.stderr).contains("--replace"),
        "{}",
        text(&over.stderr)
    );
    let replaced = run(&d, &[&restore[..], &["--replace"]].concat());
    assert!(replaced.status.success(), "{}", text(&replaced.stderr));

    let server = serve(&d, &restored_store).await;
    let client = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    for i in 0..20 {
        let name = format!("before-{i}");
        let view = client.lookup_claim(&username(&name).key).await.unwrap();
        assert_eq!(
            (view.cell_id, view.state),
            (cell("cell-a"), ClaimState::Active),
            "{name}"
        );
    }
    println!("{during} claims were committed while the backup ran");
    drop(server);

    // What is not a store is refused, naming the file; so are the other backends' URLs.
    let junk = d.join("junk.db");
    std::fs::write(&junk, b"not a database").unwrap();
    let output = run(
        &d,
        &[
            "restore",
            "--from",
            junk.to_str().unwrap(),
            "--store",
            &format!("sqlite://{}", d.join("other.db").display()),
        ],
    );
    assert!(!output.status.success());
    let err = text(&output.stderr);
    assert!(err.contains("junk.db"), "{err}");
    assert!(!d.join("other.db").exists(), "nothing written");
    let output = run(
        &d,
        &[
            "backup",
            "--store",
            "spanner://projects/p/instances/i/databases/d",
            "--to",
            "x.db",
        ],
    );
    assert!(!output.status.success());
    assert!(text(&output.stderr).contains("Spanner's backups"));
}

/// `restore --replace` refuses a store that a live `serve` uses (it deleted the live server's
/// `-wal` before, and the server then acknowledged writes that were gone after a restart), and
/// `backup` never follows a symlink at its target nor touches a `TO.partial` it did not create.
/// None of the refusals changes anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_refuses_a_live_store_and_backup_never_clobbers() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let db = d.join("claims.db");
    let store = format!("sqlite://{}", db.display());
    let server = serve(&d, &store).await;
    let client = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    claim(&client, "before").await;
    let backup_to = |to: &std::path::Path| {
        run(
            &d,
            &["backup", "--store", &store, "--to", to.to_str().unwrap()],
        )
    };
    let backup = d.join("b1.db");
    let output = backup_to(&backup);
    assert!(output.status.success(), "{}", text(&output.stderr));

    // Under the live server: refused, and its files are untouched.
    let wal = d.join("claims.db-wal");
    assert!(wal.exists());
    let restore = [
        "restore",
        "--from",
        backup.to_str().unwrap(),
        "--store",
        &store,
        "--replace",
    ];
    let refused = run(&d, &restore);
    assert!(!refused.status.success());
    let err = text(&refused.stderr);
    println!("restore under a live serve: {err}");
    assert!(
        err.contains("in use") && err.contains("claims.db.lock"),
        "{err}"
    );
    assert!(wal.exists(), "the live server's -wal was removed");
    claim(&client, "after-the-refusal").await;

    // A dangling symlink at the target is a name that exists: never followed.
    let link = d.join("link.db");
    std::os::unix::fs::symlink(d.join("elsewhere.db"), &link).unwrap();
    let output = backup_to(&link);
    assert!(!output.status.success());
    assert!(
        text(&output.stderr).contains("exists"),
        "{}",
        text(&output.stderr)
    );
    assert!(!d.join("elsewhere.db").exists(), "the symlink was followed");
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());

    // A TO.partial the backup did not create is left as it was.
    let partial = d.join("b2.db.partial");
    std::fs::write(&partial, b"another backup's").unwrap();
    let output = backup_to(&d.join("b2.db"));
    assert!(!output.status.success());
    let err = text(&output.stderr);
    assert!(err.contains("b2.db.partial exists"), "{err}");
    assert_eq!(std::fs::read(&partial).unwrap(), b"another backup's");
    assert!(!d.join("b2.db").exists());

    // Once the server is stopped, the restore goes ahead; and a server cannot start meanwhile
    // (the lock is held through the replacement, proven by the unit test of `lock`).
    drop(client);
    tokio::task::spawn_blocking(move || server.stop_with("TERM"))
        .await
        .unwrap();
    let output = run(&d, &restore);
    assert!(output.status.success(), "{}", text(&output.stderr));
}

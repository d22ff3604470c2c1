//! `topology-claims status` through the real binary: under mutual TLS with an admin certificate
//! (version, serving, store reachable, never restored, the certificate's expiry), with a cell
//! certificate (the restore epoch needs the admin role; the rest is shown), in plaintext, and
//! against nothing (exit 2).
#![cfg(unix)]

mod common;

use common::{command, text, Server};
use topology_claims_harness::pki::DevPki;

fn status(dir: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    let out = command(dir, &[&["status"], args].concat())
        .output()
        .unwrap();
    (out.status.code(), text(&out.stdout) + &text(&out.stderr))
}

#[tokio::test]
async fn status_shows_version_serving_store_restore_and_certificate_expiry() {
    std::env::set_var("TOPOLOGY_CLAIMS_BIN", common::BIN);
    let dir = tempfile::tempdir().unwrap();
    let pki = DevPki::create(&dir.path().join("pki")).unwrap();
    let mut args: Vec<String> = ["--listen", "127.0.0.1:0", "--store", "memory:"]
        .map(str::to_owned)
        .to_vec();
    args.extend(pki.serve_args());
    let server = Server::start_async(dir.path(), args).await;
    let endpoint = format!("https://localhost:{}", server.child.addr.port());
    let as_role = |role: &str, name: &str| {
        let mut flags = vec!["--server".to_owned(), endpoint.clone()];
        flags.extend(common::client_tls_flags(&pki, (role, name)));
        // The server is a process of its own: blocking this test's thread stalls nothing.
        status(
            dir.path(),
            &flags.iter().map(String::as_str).collect::<Vec<_>>(),
        )
    };

    let (code, said) = as_role("admin", "ops");
    assert_eq!(code, Some(0), "{said}");
    for line in [
        format!("version:      {}", env!("CARGO_PKG_VERSION")),
        "serving:      yes (SERVING)".to_owned(),
        "store:        reachable".to_owned(),
        "restore:      never restored (epoch 0)".to_owned(),
    ] {
        assert!(said.contains(&line), "{line:?} in:\n{said}");
    }
    let certificate = said
        .lines()
        .find(|l| l.starts_with("certificate:"))
        .unwrap_or_else(|| panic!("no certificate line:\n{said}"));
    assert!(
        certificate.contains(" expires ") && certificate.contains(" days)"),
        "{certificate}"
    );

    let (code, said) = as_role("cell", "cell-a");
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("GetRestoreStatus needs the admin role"),
        "{said}"
    );
    assert!(said.contains("store:        reachable"), "{said}");
    server.stop_with("TERM");

    let plain = Server::start_async(
        dir.path(),
        ["--listen", "127.0.0.1:0", "--store", "memory:"]
            .map(str::to_owned)
            .to_vec(),
    )
    .await;
    let (code, said) = status(dir.path(), &["--server", &plain.endpoint()]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("certificate:  none (plaintext http://)"),
        "{said}"
    );
    plain.stop_with("TERM");

    let (code, said) = status(dir.path(), &["--server", "http://127.0.0.1:1"]);
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("nothing listens"), "{said}");
}

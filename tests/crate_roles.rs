//! The dependency rules of the crates by role (decision 105), read from `cargo tree` of this
//! workspace's lockfile:
//!
//! - a cell links `topology-claims-client` and nothing of the server: its normal dependencies
//!   hold no server, metrics, test or store-driver crate, and at most [`CLIENT_MAX_CRATES`]
//!   distinct crate names (docs/architecture.md gives the number);
//! - the core carries no transport;
//! - the Rust cell example depends on the client, never on the server;
//! - the server does not link the client.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// The most distinct crate names a client-only cell may link (85 at the split, 124 before it).
const CLIENT_MAX_CRATES: usize = 100;

/// What `cargo tree -p package -e normal` lists, as distinct crate names.
fn normal_dependencies(package: &str, features: &[&str]) -> BTreeSet<String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let mut command = Command::new(env!("CARGO"));
    command
        .args([
            "tree",
            "--locked",
            "--offline",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .arg("--manifest-path")
        .arg(&manifest)
        .args(["-p", package]);
    if !features.is_empty() {
        command.args(["--features", &features.join(",")]);
    }
    let output = command.output().expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo tree -p {package} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("cargo tree prints UTF-8")
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

fn present<'a>(tree: &BTreeSet<String>, forbidden: &[&'a str]) -> Vec<&'a str> {
    let found = forbidden.iter().filter(|name| tree.contains(**name));
    found.copied().collect()
}

#[test]
fn a_client_only_cell_links_nothing_of_the_server() {
    let tree = normal_dependencies("topology-claims-client", &[]);
    let forbidden = [
        "topology-claims-server",
        "topology-claims-testkit",
        "governor",
        "prometheus",
        "tonic-health",
        "tonic-reflection",
        "x509-parser",
        "proptest",
        "rusqlite",
        "tokio-postgres",
        "gcloud-spanner",
    ];
    assert_eq!(present(&tree, &forbidden), Vec::<&str>::new());
    assert!(
        tree.len() <= CLIENT_MAX_CRATES,
        "topology-claims-client links {} distinct crates (at most {CLIENT_MAX_CRATES}): {tree:?}",
        tree.len()
    );
}

#[test]
fn the_client_links_prometheus_only_with_its_metrics_feature() {
    let tree = normal_dependencies("topology-claims-client", &["metrics"]);
    assert!(tree.contains("prometheus"), "{tree:?}");
    assert_eq!(
        present(&tree, &["topology-claims-server"]),
        Vec::<&str>::new()
    );
}

#[test]
fn the_core_carries_no_transport() {
    let tree = normal_dependencies("topology-claims", &[]);
    let forbidden = [
        "tonic",
        "hyper",
        "h2",
        "rustls",
        "prometheus",
        "governor",
        "x509-parser",
    ];
    assert_eq!(present(&tree, &forbidden), Vec::<&str>::new());
}

#[test]
fn the_rust_cell_example_depends_on_the_client_and_not_the_server() {
    let tree = normal_dependencies("topology-claims-example-rust-cell", &[]);
    assert!(tree.contains("topology-claims-client"), "{tree:?}");
    let forbidden = ["topology-claims-server", "prometheus", "governor"];
    assert_eq!(present(&tree, &forbidden), Vec::<&str>::new());
}

#[test]
fn the_server_does_not_link_the_client() {
    let tree = normal_dependencies("topology-claims-server", &[]);
    assert!(tree.contains("topology-claims-proto"), "{tree:?}");
    assert_eq!(
        present(&tree, &["topology-claims-client"]),
        Vec::<&str>::new()
    );
}

//! REST lookups through the real binary, called with curl: `GET /v1/claims/{namespace}/{value}`
//! over HTTP/1.1 and HTTP/2 on the serve port, 200 / 404 / 400 with their JSON and cache
//! headers, `--rest off`, and under mutual TLS the router identity (REST and LookupClaim served,
//! BeginUpdate PERMISSION_DENIED), ALPN offering both protocols, and a caller without a
//! certificate answered 401 in JSON. The answers are checked against `docs/openapi.json`.
#![cfg(unix)]

mod common;

use std::path::Path;
use std::process::Command;

use common::{text, Server};
use topology_claims::domain::ClaimType;
use topology_claims::ClaimsError;
use topology_claims_client::{ClaimsClient, ClientConfig};
use topology_claims_harness::pki::DevPki;
use topology_claims_testkit::fixtures::{cell, creates, key, username};

/// An answer as curl saw it.
struct Answer {
    status: u16,
    http_version: String,
    headers: Vec<(String, String)>,
    body: serde_json::Value,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// `curl` with `args`, then the URL; the head goes to a file so the body stays JSON.
fn curl(dir: &Path, args: &[&str], url: &str) -> Result<Answer, String> {
    let head = dir.join("head.txt");
    let output = Command::new("curl")
        .args(["-sS", "--max-time", "20", "-D"])
        .arg(&head)
        .args(["-w", "\n%{http_code} %{http_version}"])
        .args(args)
        .arg(url)
        .output()
        .map_err(|e| format!("running curl (scripts/ensure-services.sh installs it): {e}"))?;
    let out = text(&output.stdout);
    if !output.status.success() {
        return Err(format!("curl {url}: {}{out}", text(&output.stderr)));
    }
    let (body, last) = out.rsplit_once('\n').unwrap();
    let (status, http_version) = last.split_once(' ').unwrap();
    let headers = std::fs::read_to_string(&head)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Ok(Answer {
        status: status.parse().unwrap(),
        http_version: http_version.to_owned(),
        headers,
        body: serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
    })
}

/// Stops the server on a blocking thread, so this runtime keeps serving the clients' side of
/// the drain (their connections close when they read the GOAWAY).
async fn stop(server: Server) {
    let status = tokio::task::spawn_blocking(move || server.stop_with("TERM"))
        .await
        .unwrap();
    assert!(status.success(), "{status}");
}

fn openapi() -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The answer's body has exactly the properties `docs/openapi.json` gives `schema`, each of the
/// JSON type it says.
fn conforms(answer: &Answer, schema: &str) {
    let doc = openapi();
    let properties = doc["components"]["schemas"][schema]["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("docs/openapi.json has no schema {schema}"));
    let body = answer.body.as_object().expect("a JSON object");
    let mut documented: Vec<&String> = properties.keys().collect();
    let mut sent: Vec<&String> = body.keys().collect();
    documented.sort();
    sent.sort();
    assert_eq!(sent, documented, "{schema}: {}", answer.body);
    for (name, value) in body {
        let kind = properties[name]["type"].as_str().unwrap();
        let matches = match kind {
            "string" => value.is_string(),
            "integer" => value.is_i64() || value.is_u64(),
            "object" => value.is_object(),
            other => panic!("{schema}.{name}: type {other} not checked here"),
        };
        assert!(matches, "{schema}.{name} should be {kind}: {value}");
        if let Some(allowed) = properties[name]["enum"].as_array() {
            assert!(allowed.contains(value), "{schema}.{name}: {value}");
        }
    }
    let path = &doc["paths"]["/v1/claims/{namespace}/{value}"]["get"]["responses"];
    assert!(
        path[answer.status.to_string()].is_object(),
        "docs/openapi.json does not document status {}",
        answer.status
    );
}

#[tokio::test]
async fn rest_lookups_answer_200_404_and_400_with_cache_headers_over_http1_and_http2() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--store",
        "memory:",
        "--rest-max-age",
        "30s",
    ]
    .map(String::from)
    .to_vec();
    let server = Server::start_async(dir.path(), args).await;
    let claims = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    let a = cell("cell-a");
    let lease = claims
        .begin_update(creates(&a, &[username("John")]))
        .await
        .unwrap();
    let base = format!("http://{}/v1/claims", server.addr);

    // Leased for create: routable at once, as CREATING.
    let leased = curl(
        dir.path(),
        &["--http1.1"],
        &format!("{base}/usernames/john"),
    )
    .unwrap();
    assert_eq!(leased.status, 200, "{}", leased.body);
    assert_eq!(leased.body["state"], "creating");
    claims.commit_update(&a, lease.lease_id).await.unwrap();

    for (flag, version) in [("--http1.1", "1.1"), ("--http2-prior-knowledge", "2")] {
        // Another form of the name finds the claim; the display form is what was sent.
        let found = curl(dir.path(), &[flag], &format!("{base}/usernames/JOHN")).unwrap();
        assert_eq!((found.status, found.http_version.as_str()), (200, version));
        assert_eq!(found.header("content-type"), Some("application/json"));
        assert_eq!(found.header("cache-control"), Some("max-age=30"));
        let body = &found.body;
        assert_eq!(body["namespace"], "usernames");
        assert_eq!(body["value"], "John");
        assert_eq!(body["key"], "john");
        assert_eq!(body["cell_id"], "cell-a");
        assert_eq!(body["state"], "active");
        assert_eq!(body["owner_type"], "user");
        let revision = body["revision"].as_u64().unwrap();
        assert!(revision > 0, "{body}");
        assert_eq!(
            found.header("etag"),
            Some(format!("\"{revision}\"").as_str())
        );
        conforms(&found, "Claim");

        let missing = curl(dir.path(), &[flag], &format!("{base}/usernames/nobody")).unwrap();
        assert_eq!(missing.status, 404, "{}", missing.body);
        assert_eq!(missing.body["error"], "CLAIM_NOT_FOUND");
        assert_eq!(missing.header("cache-control"), Some("max-age=1"));
        conforms(&missing, "Error");

        let namespace = curl(dir.path(), &[flag], &format!("{base}/no-such-ns/john")).unwrap();
        assert_eq!(namespace.status, 400, "{}", namespace.body);
        assert_eq!(namespace.body["error"], "UNKNOWN_NAMESPACE");
        assert_eq!(namespace.header("cache-control"), Some("no-store"));
        conforms(&namespace, "Error");

        // Not UTF-8 once percent-decoded.
        let malformed = curl(dir.path(), &[flag], &format!("{base}/usernames/%FF")).unwrap();
        assert_eq!(malformed.status, 400, "{}", malformed.body);
        assert_eq!(malformed.body["code"], "INVALID_ARGUMENT");
        conforms(&malformed, "Error");
    }
    // A value with a slash and a space, percent-encoded: a route namespace's value is looked up
    // as sent (404 here, but as a lookup, not as another path).
    let encoded = curl(dir.path(), &[], &format!("{base}/usernames/a%2Fb%20c")).unwrap();
    assert_ne!(encoded.status, 200);
    assert_ne!(encoded.body["error"], "NOT_FOUND", "{}", encoded.body);
    stop(server).await;
}

#[tokio::test]
async fn with_rest_off_a_connection_must_open_with_http2() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--store",
        "memory:",
        "--rest",
        "off",
    ]
    .map(String::from)
    .to_vec();
    let server = Server::start_async(dir.path(), args).await;
    let url = format!("http://{}/v1/claims/usernames/john", server.addr);
    let refused = curl(dir.path(), &["--http1.1"], &url);
    assert!(refused.is_err(), "an HTTP/1.1 request was answered");
    stop(server).await;
}

#[tokio::test]
async fn under_mutual_tls_a_router_looks_up_over_rest_and_grpc_and_may_not_lease() {
    std::env::set_var("TOPOLOGY_CLAIMS_BIN", common::BIN);
    let dir = tempfile::tempdir().unwrap();
    let pki = DevPki::create(&dir.path().join("pki")).unwrap();
    let mut args = ["--listen", "127.0.0.1:0", "--store", "memory:"]
        .map(String::from)
        .to_vec();
    args.extend(pki.serve_args());
    let server = Server::start_async(dir.path(), args).await;
    let endpoint = format!("https://localhost:{}", server.child.addr.port());
    let as_role = |role: &str, name: &str| {
        let config = ClientConfig {
            tls: Some(pki.client_tls(role, name).unwrap()),
            ..ClientConfig::default()
        };
        ClaimsClient::connect_lazy(&endpoint, config).unwrap()
    };
    let a = cell("cell-a");
    let cell_a = as_role("cell", "cell-a");
    let lease = cell_a
        .begin_update(creates(&a, &[username("carol")]))
        .await
        .unwrap();
    cell_a.commit_update(&a, lease.lease_id).await.unwrap();

    let router = as_role("router", "edge");
    let refused = router
        .begin_update(creates(&a, &[username("mallory")]))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, ClaimsError::PermissionDenied { .. }),
        "{refused:?}"
    );
    let view = router
        .lookup_claim(&key(ClaimType::Username, "carol"))
        .await
        .unwrap();
    assert_eq!(view.cell_id.as_str(), "cell-a");
    // The router follows the change feed too.
    let request = topology_claims_client::WatchRequest {
        start_revision: view.revision,
        ..Default::default()
    };
    let mut watch = router.watch_claims(&request).await.unwrap();
    let batch = watch.next().await.unwrap().unwrap();
    assert_eq!(batch.events[0].claim.record.key.value, "carol");
    assert_eq!(
        batch.events[0].claim.state(),
        topology_claims::ClaimState::Active
    );

    let pair = pki.issue_client("router", "edge").unwrap();
    let ca = pki.ca();
    let tls = [
        "--cacert",
        ca.to_str().unwrap(),
        "--cert",
        pair.cert.to_str().unwrap(),
        "--key",
        pair.key.to_str().unwrap(),
    ];
    let url = format!("{endpoint}/v1/claims/usernames/carol");
    // ALPN: curl offers h2 first, and http/1.1 alone with --http1.1.
    for (flag, version) in [("--http2", "2"), ("--http1.1", "1.1")] {
        let found = curl(dir.path(), &[&tls[..], &[flag]].concat(), &url).unwrap();
        assert_eq!((found.status, found.http_version.as_str()), (200, version));
        assert_eq!(found.body["cell_id"], "cell-a");
    }
    let anonymous = curl(
        dir.path(),
        &["--cacert", ca.to_str().unwrap(), "--http1.1"],
        &url,
    )
    .unwrap();
    assert_eq!(anonymous.status, 401, "{}", anonymous.body);
    assert_eq!(anonymous.body["code"], "UNAUTHENTICATED");
    conforms(&anonymous, "Error");
    stop(server).await;
}

//! `serve --log-format json` against the real binary: every line on stderr is one JSON object,
//! and the lines logged while handling a request carry its request id, method and identity; a
//! client's `x-request-id` is echoed back and is the id in the logs.

mod common;

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tonic::metadata::MetadataValue;
use tonic::transport::Endpoint;
use topology_claims_harness::serve::ServeChild;
use topology_claims_proto::pb;
use topology_claims_proto::pb::claims_service_client::ClaimsServiceClient;

fn list(cell: &str, request_id: Option<&str>) -> tonic::Request<pb::ListOutstandingLeasesRequest> {
    let mut request = tonic::Request::new(pb::ListOutstandingLeasesRequest {
        cell_id: cell.to_owned(),
        cursor: String::new(),
        limit: 1,
    });
    if let Some(id) = request_id {
        request
            .metadata_mut()
            .insert("x-request-id", MetadataValue::try_from(id).unwrap());
    }
    request
}

fn echoed(metadata: &tonic::metadata::MetadataMap) -> String {
    metadata
        .get("x-request-id")
        .expect("an x-request-id response header")
        .to_str()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line_and_request_lines_carry_id_method_identity() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let mut command = common::command(
        dir.path(),
        &[
            "--log-format",
            "json",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            "memory:",
            // The second request of a cell within a second is refused: a refusal to log.
            "--cell-rate",
            "1/s",
            "--cell-burst",
            "1",
        ],
    );
    command
        .env("RUST_LOG", "topology_claims=debug")
        .stdin(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()));
    let server = ServeChild::start(command).unwrap_or_else(|e| panic!("serve: {e}"));
    let channel = Endpoint::from_shared(server.endpoint())
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let mut client = ClaimsServiceClient::new(channel);

    let ok = client
        .list_outstanding_leases(list("cell-a", Some("client-chosen-42")))
        .await
        .expect("the first request is served");
    assert_eq!(echoed(ok.metadata()), "client-chosen-42");
    let refused = client
        .list_outstanding_leases(list("cell-a", None))
        .await
        .expect_err("the second is over --cell-rate");
    let generated = echoed(refused.metadata());
    assert!(
        !generated.is_empty() && generated.len() <= 64,
        "{generated:?}"
    );
    // An id that is not sane (too long) is replaced, not logged.
    let long = "x".repeat(65);
    let replaced = client
        .list_outstanding_leases(list("cell-b", Some(&long)))
        .await
        .expect("cell-b is served");
    assert_ne!(echoed(replaced.metadata()), long);
    server
        .stop_with("TERM", common::PATIENCE)
        .expect("serve stops");

    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|line| {
            serde_json::from_str::<Value>(line)
                .ok()
                .filter(Value::is_object)
                .unwrap_or_else(|| panic!("not one JSON object: {line:?}"))
        })
        .collect();
    assert!(lines.iter().any(|l| l["message"] == "serving"), "{text}");
    let request_lines: Vec<&Value> = lines
        .iter()
        .filter(|l| l["span"]["name"] == "request")
        .collect();
    for line in &request_lines {
        let span = &line["span"];
        for field in ["request_id", "method", "identity", "peer"] {
            assert!(span[field].is_string(), "{field} missing from {line}");
        }
        assert_eq!(span["method"], "ListOutstandingLeases");
        assert_eq!(span["identity"], "anonymous");
    }
    let done = |id: &str| {
        request_lines
            .iter()
            .find(|l| l["message"] == "request done" && l["span"]["request_id"] == id)
            .unwrap_or_else(|| panic!("no `request done` line for {id}:\n{text}"))
    };
    assert_eq!(done("client-chosen-42")["code"], "OK");
    let raw = text
        .lines()
        .find(|l| l.contains("request done") && l.contains(&generated));
    eprintln!("a request's last line: {}", raw.unwrap_or_default());
    assert_eq!(done(&generated)["code"], "RESOURCE_EXHAUSTED");
    assert!(done(&generated)["duration_ms"].is_number());
    assert!(
        request_lines
            .iter()
            .any(|l| l["message"] == "request refused"
                && l["span"]["request_id"] == generated.as_str()),
        "the refusal is logged inside its request:\n{text}"
    );
    assert!(!text.contains(&long), "an insane request id is not logged");
}

//! Malformed input against the real server process (`topology-claims serve --store memory:`):
//! every field of every request at and past its limits, protobuf that is not what the method
//! expects, broken gRPC framing over raw HTTP/2, and oversize messages. Each is refused with
//! INVALID_ARGUMENT naming the field, or with the transport's own error (tonic's INTERNAL for
//! undecodable protobuf, OUT_OF_RANGE above 4 MiB); never a panic: the process is still there
//! afterwards and answers a normal BeginUpdate + CommitUpdate.
#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::{Code, Request, Status};
use topology_claims::grpc::pb;
use topology_claims::grpc::pb::claims_service_client::ClaimsServiceClient;
use topology_claims::grpc::status::from_status;
use topology_claims::ClaimsError;

const BIN: &str = env!("CARGO_BIN_EXE_topology-claims");
const SERVICE: &str = "/topology.claims.v1.ClaimsService/";
const METHODS: [&str; 7] = [
    "BeginUpdate",
    "CommitUpdate",
    "RollbackUpdate",
    "RenewLease",
    "ListOutstandingLeases",
    "ListClaims",
    "LookupClaim",
];
const SOME_LEASE: &str = "0b6a4cf6-3f5e-4a47-9c1e-2b8c2d9a7e10";
/// The server's request size limit (`MAX_REQUEST_BYTES`).
const LIMIT: usize = 4 * 1024 * 1024;

/// A `serve` child on an ephemeral port; killed when dropped.
struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start() -> Server {
        let mut command = Command::new(BIN);
        for (name, _) in std::env::vars() {
            if name.starts_with("TOPOLOGY_CLAIMS_") {
                command.env_remove(name);
            }
        }
        let mut child = command
            .args(["serve", "--listen", "127.0.0.1:0", "--store", "memory:"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn serve");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let line = lines.next().expect("a line").expect("readable");
        std::thread::spawn(move || for _ in lines {});
        let addr = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        Server { child, addr }
    }

    async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .expect("connect")
    }

    async fn client(&self) -> ClaimsServiceClient<Channel> {
        ClaimsServiceClient::new(self.channel().await)
    }

    /// The process did not die, and it still does its job.
    async fn assert_still_serving(&mut self) {
        assert!(
            self.child.try_wait().expect("try_wait").is_none(),
            "the server process exited"
        );
        let mut c = self.client().await;
        let lease = c
            .begin_update(begin("cell-after", vec![claim(2, "still-serving")]))
            .await
            .expect("BeginUpdate after the malformed input")
            .into_inner()
            .lease_payload
            .expect("a lease");
        c.commit_update(pb::CommitUpdateRequest {
            cell_id: "cell-after".into(),
            lease_id: lease.lease_id,
        })
        .await
        .expect("CommitUpdate after the malformed input");
    }
}

fn claim(claim_type: i32, value: &str) -> pb::ClaimRecord {
    pb::ClaimRecord {
        claim_type,
        claim_value: value.to_owned(),
        owner: 3,
        owner_value: "42".to_owned(),
        table_name: 1,
        table_record_id: 42,
    }
}

fn begin(cell: &str, creates: Vec<pb::ClaimRecord>) -> pb::BeginUpdateRequest {
    pb::BeginUpdateRequest {
        cell_id: cell.to_owned(),
        creates_claims: creates,
        destroys_claims: vec![],
        lease_id: String::new(),
    }
}

/// What a case expects: refused naming this field, refused as a batch conflict, or accepted by
/// validation (any answer but INVALID_ARGUMENT: success or a protocol error of the store).
#[derive(Clone, Copy, Debug)]
enum Expect {
    Invalid(&'static str),
    BatchConflict,
    Valid,
}

#[track_caller]
fn check<T: std::fmt::Debug>(
    case: &str,
    result: Result<tonic::Response<T>, Status>,
    expect: Expect,
) {
    match (expect, result) {
        (Expect::Valid, Ok(_)) => {}
        (Expect::Valid, Err(status)) => assert_ne!(
            status.code(),
            Code::InvalidArgument,
            "{case}: valid input refused: {status:?}"
        ),
        (Expect::Invalid(field), Err(status)) => {
            assert_eq!(status.code(), Code::InvalidArgument, "{case}: {status:?}");
            match from_status(&status) {
                ClaimsError::InvalidRequest { field: named, .. } => {
                    assert_eq!(named, field, "{case}: the violation names the field")
                }
                other => panic!("{case}: expected an invalid {field}, got {other:?}"),
            }
        }
        (Expect::BatchConflict, Err(status)) => {
            assert_eq!(status.code(), Code::InvalidArgument, "{case}: {status:?}");
            assert!(
                matches!(from_status(&status), ClaimsError::BatchConflict { .. }),
                "{case}: {status:?}"
            );
        }
        (expect, Ok(response)) => panic!("{case}: expected {expect:?}, got {response:?}"),
    }
}

/// Values of a claim or owner value field: (description, value, valid?).
fn value_cases() -> Vec<(&'static str, String, bool)> {
    let euro_255 = "€".repeat(85); // 3 bytes each: 255 bytes
    vec![
        ("1 byte", "v".to_owned(), true),
        ("255 ASCII bytes", "v".repeat(255), true),
        ("255 UTF-8 bytes", euro_255.clone(), true),
        ("256 bytes", "v".repeat(256), false),
        ("256 UTF-8 bytes", format!("{euro_255}v"), false),
        ("empty", String::new(), false),
        ("a control character", "bell\u{7}".to_owned(), false),
        ("a newline", "two\nlines".to_owned(), false),
        ("a NUL", "nul\0".to_owned(), false),
        ("64 KiB", "v".repeat(64 * 1024), false),
    ]
}

/// Cell ids: (description, value, valid?).
fn cell_cases() -> Vec<(&'static str, String, bool)> {
    vec![
        (
            "100 bytes",
            "Az09._-".chars().cycle().take(100).collect(),
            true,
        ),
        ("101 bytes", "c".repeat(101), false),
        ("empty", String::new(), false),
        ("a space", "cell a".to_owned(), false),
        ("a slash", "cell/a".to_owned(), false),
        ("non-ASCII", "céll".to_owned(), false),
        ("64 KiB", "c".repeat(64 * 1024), false),
    ]
}

/// Lease ids where one is required: (description, value, valid?).
fn lease_cases() -> Vec<(&'static str, String, bool)> {
    vec![
        ("a UUID", SOME_LEASE.to_owned(), true),
        ("an upper-case UUID", SOME_LEASE.to_uppercase(), true),
        ("empty", String::new(), false),
        ("35 characters", SOME_LEASE[..35].to_owned(), false),
        ("37 characters", format!("{SOME_LEASE}0"), false),
        ("36 non-hex characters", "z".repeat(36), false),
        (
            "32 hex digits without hyphens and 4 more",
            format!("{}0000", SOME_LEASE.replace('-', "")),
            false,
        ),
        ("64 KiB", "0".repeat(64 * 1024), false),
    ]
}

fn enum_cases(valid: std::ops::RangeInclusive<i32>) -> Vec<(String, i32, bool)> {
    let mut cases: Vec<(String, i32, bool)> =
        valid.clone().map(|n| (format!("{n}"), n, true)).collect();
    for n in [0, *valid.end() + 1, -1, i32::MIN, i32::MAX] {
        cases.push((format!("{n}"), n, false));
    }
    cases
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_field_of_every_request_is_checked_at_and_past_its_limits() {
    let mut server = Server::start();
    let mut c = server.client().await;
    let mut unique = 0u32;
    let mut fresh = |prefix: &str| {
        unique += 1;
        format!("{prefix}{unique}")
    };

    // BeginUpdate: cell_id and lease_id.
    for (what, cell, valid) in cell_cases() {
        let expect = if valid {
            Expect::Valid
        } else {
            Expect::Invalid("cell_id")
        };
        let req = begin(&cell, vec![claim(2, &fresh("u"))]);
        check(
            &format!("BeginUpdate cell_id {what}"),
            c.begin_update(req).await,
            expect,
        );
    }
    let mut optional_lease = lease_cases();
    optional_lease.retain(|(what, _, _)| *what != "empty");
    optional_lease.push(("empty (the server picks one)", String::new(), true));
    for (what, lease, valid) in optional_lease {
        let expect = if valid {
            Expect::Valid
        } else {
            Expect::Invalid("lease_id")
        };
        let mut req = begin("cell-a", vec![claim(2, &fresh("u"))]);
        req.lease_id = lease;
        check(
            &format!("BeginUpdate lease_id {what}"),
            c.begin_update(req).await,
            expect,
        );
    }

    // Every field of a claim record, as a create and as a destroy, at index 2 of 3.
    type Mutation = Box<dyn Fn(&mut pb::ClaimRecord)>;
    let mut record_cases: Vec<(String, &'static str, Mutation, bool)> = Vec::new();
    for (what, value, valid) in value_cases() {
        let v = value.clone();
        record_cases.push((
            format!("claim_value {what}"),
            "claim_value",
            Box::new(move |r| r.claim_value = v.clone()),
            valid,
        ));
        record_cases.push((
            format!("owner_value {what}"),
            "owner_value",
            Box::new(move |r| r.owner_value = value.clone()),
            valid,
        ));
    }
    for (what, n, valid) in enum_cases(1..=3) {
        record_cases.push((
            format!("claim_type {what}"),
            "claim_type",
            Box::new(move |r| r.claim_type = n),
            valid,
        ));
        record_cases.push((
            format!("owner {what}"),
            "owner",
            Box::new(move |r| r.owner = n),
            valid,
        ));
    }
    for (what, n, valid) in enum_cases(1..=5) {
        record_cases.push((
            format!("table_name {what}"),
            "table_name",
            Box::new(move |r| r.table_name = n),
            valid,
        ));
    }
    for (n, valid) in [
        (0, true),
        (i64::MAX - 1, true),
        (i64::MAX, false),
        (-1, false),
        (i64::MIN, false),
    ] {
        record_cases.push((
            format!("table_record_id {n}"),
            "table_record_id",
            Box::new(move |r| r.table_record_id = n),
            valid,
        ));
    }
    for (what, field, mutate, valid) in &record_cases {
        for list in ["creates_claims", "destroys_claims"] {
            let mut records: Vec<pb::ClaimRecord> = (0..3).map(|_| claim(3, &fresh("e"))).collect();
            mutate(&mut records[2]);
            // Keep the three keys distinct whatever the mutation did to the value.
            records[0].claim_value = fresh("first");
            records[1].claim_value = fresh("second");
            let mut req = begin("cell-a", vec![]);
            if list == "creates_claims" {
                req.creates_claims = records;
            } else {
                req.destroys_claims = records;
            }
            let expect = if *valid {
                Expect::Valid
            } else {
                Expect::Invalid(Box::leak(format!("{list}[2].{field}").into_boxed_str()))
            };
            check(
                &format!("BeginUpdate {list}[2] {what}"),
                c.begin_update(req).await,
                expect,
            );
        }
    }

    // The batch as a whole: size limits (default --max-batch 1000) and repeats.
    let batch = |n: usize, tag: &str| -> Vec<pb::ClaimRecord> {
        (0..n).map(|i| claim(2, &format!("{tag}-{i}"))).collect()
    };
    check(
        "empty batch",
        c.begin_update(begin("cell-a", vec![])).await,
        Expect::Invalid("creates_claims"),
    );
    check(
        "1000 claims",
        c.begin_update(begin("cell-a", batch(1000, "max"))).await,
        Expect::Valid,
    );
    check(
        "1001 claims",
        c.begin_update(begin("cell-a", batch(1001, "over"))).await,
        Expect::Invalid("creates_claims"),
    );
    let mut split = begin("cell-a", batch(600, "split-c"));
    split.destroys_claims = batch(401, "split-d");
    check(
        "600 creates + 401 destroys",
        c.begin_update(split).await,
        Expect::Invalid("creates_claims"),
    );
    let twice = begin("cell-a", vec![claim(2, "twice"), claim(2, "twice")]);
    check(
        "a claim twice",
        c.begin_update(twice).await,
        Expect::BatchConflict,
    );
    let mut both = begin("cell-a", vec![claim(2, "both-ways")]);
    both.destroys_claims = vec![claim(2, "both-ways")];
    check(
        "create and destroy of one claim",
        c.begin_update(both).await,
        Expect::BatchConflict,
    );

    // CommitUpdate, RollbackUpdate, RenewLease: cell_id and lease_id, both required.
    let lease_ref_rpcs: [(&str, MakeLeaseRef); 3] = [
        ("CommitUpdate", LeaseRef::Commit),
        ("RollbackUpdate", LeaseRef::Rollback),
        ("RenewLease", LeaseRef::Renew),
    ];
    for (rpc, make) in lease_ref_rpcs {
        for (what, cell, valid) in cell_cases() {
            let expect = if valid {
                Expect::Valid
            } else {
                Expect::Invalid("cell_id")
            };
            let result = make(cell, SOME_LEASE.to_owned()).call(&mut c).await;
            check(&format!("{rpc} cell_id {what}"), result, expect);
        }
        for (what, lease, valid) in lease_cases() {
            let expect = if valid {
                Expect::Valid
            } else {
                Expect::Invalid("lease_id")
            };
            let result = make("cell-a".to_owned(), lease).call(&mut c).await;
            check(&format!("{rpc} lease_id {what}"), result, expect);
        }
    }

    // ListOutstandingLeases: cell_id, cursor (empty or a lease id), limit 0..=1000.
    let leases = |cell: String, cursor: String, limit: i32| pb::ListOutstandingLeasesRequest {
        cell_id: cell,
        cursor,
        limit,
    };
    for (what, cell, valid) in cell_cases() {
        let expect = if valid {
            Expect::Valid
        } else {
            Expect::Invalid("cell_id")
        };
        let result = c
            .list_outstanding_leases(leases(cell, String::new(), 0))
            .await;
        check(
            &format!("ListOutstandingLeases cell_id {what}"),
            result,
            expect,
        );
    }
    let mut cursors = lease_cases();
    cursors.retain(|(what, _, _)| *what != "empty");
    cursors.push(("empty (from the start)", String::new(), true));
    for (what, cursor, valid) in cursors {
        let expect = if valid {
            Expect::Valid
        } else {
            Expect::Invalid("cursor")
        };
        let result = c
            .list_outstanding_leases(leases("cell-a".into(), cursor, 0))
            .await;
        check(
            &format!("ListOutstandingLeases cursor {what}"),
            result,
            expect,
        );
    }
    for (limit, valid) in [
        (0, true),
        (1, true),
        (1000, true),
        (1001, false),
        (-1, false),
        (i32::MIN, false),
        (i32::MAX, false),
    ] {
        let expect = if valid {
            Expect::Valid
        } else {
            Expect::Invalid("limit")
        };
        let result = c
            .list_outstanding_leases(leases("cell-a".into(), String::new(), limit))
            .await;
        check(
            &format!("ListOutstandingLeases limit {limit}"),
            result,
            expect,
        );
    }

    // ListClaims: cell_id, table_name, cursor 0..i64::MAX, limit 0..=10000.
    let claims = |cell: String, table_name: i32, cursor: i64, limit: i32| pb::ListClaimsRequest {
        cell_id: cell,
        table_name,
        cursor,
        limit,
    };
    for (what, cell, valid) in cell_cases() {
        let expect = if valid {
            Expect::Valid
        } else {
            Expect::Invalid("cell_id")
        };
        let result = c.list_claims(claims(cell, 1, 0, 0)).await;
        check(&format!("ListClaims cell_id {what}"), result, expect);
    }
    for (what, n, valid) in enum_cases(1..=5) {
        let expect = if valid {
            Expect::Valid
        } else {
            Expect::Invalid("table_name")
        };
        let result = c.list_claims(claims("cell-a".into(), n, 0, 0)).await;
        check(&format!("ListClaims table_name {what}"), result, expect);
    }
    for (cursor, valid) in [
        (0, true),
        (i64::MAX - 1, true),
        (i64::MAX, false),
        (-1, false),
        (i64::MIN, false),
    ] {
        let expect = if valid {
            Expect::Valid
        } else {
            Expect::Invalid("cursor")
        };
        let result = c.list_claims(claims("cell-a".into(), 1, cursor, 0)).await;
        check(&format!("ListClaims cursor {cursor}"), result, expect);
    }
    for (limit, valid) in [
        (0, true),
        (10_000, true),
        (10_001, false),
        (-1, false),
        (i32::MAX, false),
    ] {
        let expect = if valid {
            Expect::Valid
        } else {
            Expect::Invalid("limit")
        };
        let result = c.list_claims(claims("cell-a".into(), 1, 0, limit)).await;
        check(&format!("ListClaims limit {limit}"), result, expect);
    }

    // LookupClaim: claim_type and claim_value.
    for (what, n, valid) in enum_cases(1..=3) {
        let expect = if valid {
            Expect::Valid
        } else {
            Expect::Invalid("claim_type")
        };
        let req = pb::LookupClaimRequest {
            claim_type: n,
            claim_value: "someone".into(),
        };
        check(
            &format!("LookupClaim claim_type {what}"),
            c.lookup_claim(req).await,
            expect,
        );
    }
    for (what, value, valid) in value_cases() {
        let expect = if valid {
            Expect::Valid
        } else {
            Expect::Invalid("claim_value")
        };
        let req = pb::LookupClaimRequest {
            claim_type: 2,
            claim_value: value,
        };
        check(
            &format!("LookupClaim claim_value {what}"),
            c.lookup_claim(req).await,
            expect,
        );
    }

    server.assert_still_serving().await;
}

type MakeLeaseRef = fn(String, String) -> LeaseRef;

/// The three requests that name a lease the same way.
enum LeaseRef {
    Commit(String, String),
    Rollback(String, String),
    Renew(String, String),
}

impl LeaseRef {
    async fn call(
        self,
        c: &mut ClaimsServiceClient<Channel>,
    ) -> Result<tonic::Response<()>, Status> {
        match self {
            LeaseRef::Commit(cell_id, lease_id) => c
                .commit_update(pb::CommitUpdateRequest { cell_id, lease_id })
                .await
                .map(|r| r.map(drop)),
            LeaseRef::Rollback(cell_id, lease_id) => c
                .rollback_update(pb::RollbackUpdateRequest { cell_id, lease_id })
                .await
                .map(|r| r.map(drop)),
            LeaseRef::Renew(cell_id, lease_id) => c
                .renew_lease(pb::RenewLeaseRequest { cell_id, lease_id })
                .await
                .map(|r| r.map(drop)),
        }
    }
}

/// A codec that sends and receives raw bytes, so any payload can be put on the wire.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        Ok(Some(bytes.to_vec()))
    }
}

async fn raw_call(channel: &Channel, method: &str, payload: Vec<u8>) -> Result<Vec<u8>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let path = format!("{SERVICE}{method}").parse().expect("a path");
    grpc.unary(Request::new(payload), path, RawCodec)
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_that_are_not_the_request_message_are_refused_on_every_method() {
    let mut server = Server::start();
    let channel = server.channel().await;
    let valid_begin = begin("cell-a", vec![claim(2, "raw")]).encode_to_vec();

    // (description, payload, codes accepted): tonic answers INTERNAL for protobuf it cannot
    // decode (its own error); decodable nonsense is INVALID_ARGUMENT from validation.
    let undecodable = [Code::Internal];
    let cases: Vec<(&str, Vec<u8>, &[Code])> = vec![
        (
            "0xFF bytes (a tag with no end)",
            vec![0xFF; 16],
            &undecodable,
        ),
        (
            "a truncated BeginUpdateRequest",
            valid_begin[..valid_begin.len() - 1].to_vec(),
            &undecodable,
        ),
        (
            "a string field with invalid UTF-8",
            vec![0x0A, 0x02, 0xC3, 0x28],
            &undecodable,
        ),
        (
            "a string field sent as a varint",
            vec![0x08, 0x01],
            &undecodable,
        ),
        (
            "a length running past the end",
            vec![0x0A, 0x7F, b'a'],
            &undecodable,
        ),
        ("field number 0", vec![0x00, 0x01], &undecodable),
        // Decodes (all fields default): validation refuses it.
        ("an empty message", vec![], &[Code::InvalidArgument]),
        (
            "only an unknown field",
            vec![0xF8, 0x07, 0x01],
            &[Code::InvalidArgument],
        ),
    ];
    for method in METHODS {
        for (what, payload, codes) in &cases {
            let mut payload = payload.clone();
            if method == "LookupClaim" && what.starts_with("a string field") {
                // Its field 1 is the claim type (a varint); its string is field 2.
                payload[0] += 8;
            }
            let status = raw_call(&channel, method, payload).await.expect_err(what);
            assert!(
                codes.contains(&status.code()),
                "{method} with {what}: {status:?}"
            );
        }
    }
    // Unknown fields beside valid ones are ignored (forward compatibility).
    let mut with_unknown = valid_begin.clone();
    with_unknown.extend([0xF8, 0x07, 0x01]);
    let answer = raw_call(&channel, "BeginUpdate", with_unknown).await;
    let lease = pb::BeginUpdateResponse::decode(answer.expect("accepted").as_slice())
        .expect("a BeginUpdateResponse");
    assert!(lease.lease_payload.is_some());
    // A message of one method sent to another decodes as nonsense and is refused by validation.
    let lookup = pb::LookupClaimRequest {
        claim_type: 2,
        claim_value: "x".into(),
    }
    .encode_to_vec();
    let status = raw_call(&channel, "CommitUpdate", lookup)
        .await
        .expect_err("refused");
    assert!(
        matches!(status.code(), Code::InvalidArgument | Code::Internal),
        "{status:?}"
    );
    // Seeded random garbage: any refusal, no harm.
    let mut rng = fastrand::Rng::with_seed(7);
    for round in 0..200 {
        let len = rng.usize(1..512);
        let payload: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
        let method = METHODS[round % METHODS.len()];
        if let Err(status) = raw_call(&channel, method, payload).await {
            assert_ne!(status.code(), Code::Unavailable, "{method}: {status:?}");
        }
    }
    // An unknown method.
    let status = raw_call(&channel, "DropAllClaims", vec![])
        .await
        .expect_err("unknown");
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");

    server.assert_still_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_messages_are_refused_by_the_transport_and_full_batches_are_not() {
    let mut server = Server::start();
    let channel = server.channel().await;
    for method in ["BeginUpdate", "LookupClaim"] {
        let status = raw_call(&channel, method, vec![0x0A; LIMIT + 1])
            .await
            .expect_err("above the limit");
        assert_eq!(status.code(), Code::OutOfRange, "{method}: {status:?}");
    }
    // A real request above the limit: 20,000 claims with 255-byte values (about 5.5 MB).
    let huge: Vec<pb::ClaimRecord> = (0..20_000)
        .map(|i| claim(3, &format!("{i:0>255}")))
        .collect();
    let request = begin("cell-a", huge);
    assert!(request.encoded_len() > LIMIT);
    let status = ClaimsServiceClient::new(channel.clone())
        .begin_update(request)
        .await
        .expect_err("above the limit");
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    // The largest valid request (1000 claims, every value 255 bytes) is well under it.
    let full: Vec<pb::ClaimRecord> = (0..1000)
        .map(|i| {
            let mut r = claim(3, &format!("{i:0>255}"));
            r.owner_value = "o".repeat(255);
            r
        })
        .collect();
    let request = begin(&"c".repeat(100), full);
    assert!(request.encoded_len() < LIMIT);
    ClaimsServiceClient::new(channel)
        .begin_update(request)
        .await
        .expect("the largest valid BeginUpdate is accepted");

    server.assert_still_serving().await;
}

/// What came back for a raw HTTP/2 request: the HTTP status and the grpc-status, if any.
#[derive(Debug)]
struct RawAnswer {
    http: u16,
    grpc_status: Option<i32>,
}

/// Sends one HTTP/2 request with `headers` and the raw `body` frames, then optionally resets
/// the stream instead of ending it.
async fn raw_http2(
    addr: &str,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[&[u8]],
    reset: bool,
) -> Result<RawAnswer, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (client, connection) = h2::client::handshake(tcp)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut client = client.ready().await.map_err(|e| e.to_string())?;
    let request = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("content-type", content_type)
        .header("te", "trailers")
        .body(())
        .map_err(|e| e.to_string())?;
    let (response, mut stream) = client
        .send_request(request, body.is_empty() && !reset)
        .map_err(|e| e.to_string())?;
    for (i, chunk) in body.iter().enumerate() {
        let last = i + 1 == body.len() && !reset;
        stream
            .send_data(Bytes::copy_from_slice(chunk), last)
            .map_err(|e| e.to_string())?;
    }
    if reset {
        stream.send_reset(h2::Reason::CANCEL);
        return Ok(RawAnswer {
            http: 0,
            grpc_status: None,
        });
    }
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .map_err(|_| "no response within 10s".to_owned())?
        .map_err(|e| e.to_string())?;
    let http = response.status().as_u16();
    let grpc = |headers: &http::HeaderMap| {
        headers
            .get("grpc-status")
            .and_then(|v| v.to_str().ok()?.parse().ok())
    };
    let mut grpc_status = grpc(response.headers());
    let mut body = response.into_body();
    while let Some(data) = body.data().await {
        let data = data.map_err(|e| e.to_string())?;
        let _ = body.flow_control().release_capacity(data.len());
    }
    if let Ok(Some(trailers)) = body.trailers().await {
        grpc_status = grpc_status.or(grpc(&trailers));
    }
    Ok(RawAnswer { http, grpc_status })
}

/// A gRPC message frame: compressed flag, big-endian length, bytes.
fn frame(compressed: u8, length: u32, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![compressed];
    out.put_u32(length);
    out.extend_from_slice(bytes);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_grpc_framing_over_raw_http2_is_refused_without_harm() {
    let mut server = Server::start();
    let addr = server.addr.clone();
    let path = format!("{SERVICE}BeginUpdate");
    let valid = begin("cell-a", vec![claim(2, "framed")]).encode_to_vec();
    let length = valid.len() as u32;
    let grpc = "application/grpc";

    // The control case: a well-formed frame through the same raw client succeeds.
    let answer = raw_http2(
        &addr,
        "POST",
        &path,
        grpc,
        &[&frame(0, length, &valid)],
        false,
    )
    .await
    .unwrap();
    assert_eq!(
        (answer.http, answer.grpc_status),
        (200, Some(0)),
        "{answer:?}"
    );

    // tonic refuses each with its own status (INTERNAL; OUT_OF_RANGE for a length above the
    // limit), before any handler runs.
    let half = valid.len() / 2;
    let internal = Code::Internal as i32;
    let refused: Vec<(&str, &str, Vec<Vec<u8>>, i32)> = vec![
        (
            "compressed flag without grpc-encoding",
            grpc,
            vec![frame(1, length, &valid)],
            internal,
        ),
        (
            "an unknown flag value",
            grpc,
            vec![frame(7, length, &valid)],
            internal,
        ),
        (
            "a length longer than the body",
            grpc,
            vec![frame(0, length + 100, &valid)],
            internal,
        ),
        (
            "a frame header cut short",
            grpc,
            vec![vec![0, 0, 0]],
            internal,
        ),
        (
            "a length of 4 GiB",
            grpc,
            vec![frame(0, u32::MAX, &valid)],
            Code::OutOfRange as i32,
        ),
        ("no message at all", grpc, vec![], internal),
        (
            "a message cut in half",
            grpc,
            vec![frame(0, length, &valid[..half])],
            internal,
        ),
        (
            "JSON instead of a gRPC frame",
            "application/json",
            vec![b"{\"cell_id\":\"a\"}".to_vec()],
            internal,
        ),
    ];
    for (what, content_type, body, expected) in &refused {
        let chunks: Vec<&[u8]> = body.iter().map(Vec::as_slice).collect();
        let answer = raw_http2(&addr, "POST", &path, content_type, &chunks, false)
            .await
            .unwrap_or_else(|e| panic!("{what}: the server did not answer: {e}"));
        assert_eq!(
            (answer.http, answer.grpc_status),
            (200, Some(*expected)),
            "{what}: {answer:?}"
        );
    }

    // Streams that the server must simply survive: two messages on a unary call, a GET, a
    // stream reset mid-message, and a connection that is not HTTP/2 at all.
    let two = [frame(0, length, &valid), frame(0, length, &valid)];
    let _ = raw_http2(&addr, "POST", &path, grpc, &[&two[0], &two[1]], false).await;
    let _ = raw_http2(&addr, "GET", &path, grpc, &[], false).await;
    let _ = raw_http2(
        &addr,
        "POST",
        &path,
        grpc,
        &[&frame(0, length, &valid[..half])],
        true,
    )
    .await;
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
        tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\x00\x01garbage")
            .await
            .unwrap();
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut sink)).await;
    }

    server.assert_still_serving().await;
}

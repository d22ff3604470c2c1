//! Every field of every request at and past its limits: refused with INVALID_ARGUMENT naming
//! the field, or accepted by validation.

use tonic::{Code, Status};
use topology_claims::ClaimsError;
use topology_claims_proto::status::from_status;

use super::*;

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
    let utf8_255 = "ア".repeat(85); // 3 bytes each: 255 bytes (a letter: every namespace rule takes it)
    vec![
        ("1 byte", "v".to_owned(), true),
        ("255 ASCII bytes", "v".repeat(255), true),
        ("255 UTF-8 bytes", utf8_255.clone(), true),
        ("256 bytes", "v".repeat(256), false),
        ("256 UTF-8 bytes", format!("{utf8_255}v"), false),
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
            // Neither namespace nor claim_type: the namespace is missing.
            if n == 0 { "namespace" } else { "claim_type" },
            Box::new(move |r| r.claim_type = n),
            valid,
        ));
        record_cases.push((
            format!("owner {what}"),
            // Neither owner_type nor owner: the owner type is missing.
            if n == 0 { "owner_type" } else { "owner" },
            Box::new(move |r| r.owner = n),
            valid,
        ));
    }
    for (what, n, valid) in enum_cases(1..=5) {
        record_cases.push((
            format!("table_name {what}"),
            if n == 0 { "source_table" } else { "table_name" },
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

    // ListClaims: cell_id, table_name, cursor 0..i64::MAX, limit 0..=10000, cursor_key absent or
    // a claim key.
    let claims = |cell: String, table_name: i32, cursor: i64, limit: i32| pb::ListClaimsRequest {
        cell_id: cell,
        table_name,
        cursor,
        limit,
        cursor_key: None,
        ..Default::default()
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
            Expect::Invalid(if n == 0 { "source_table" } else { "table_name" })
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
    let after = |claim_type: i32, claim_value: String| pb::ListClaimsRequest {
        cursor_key: Some(pb::ClaimKeyCursor {
            claim_type,
            claim_value,
            ..Default::default()
        }),
        ..claims("cell-a".into(), 1, 5, 0)
    };
    for (what, n, valid) in enum_cases(1..=3) {
        let expect = match (valid, n) {
            (true, _) => Expect::Valid,
            (false, 0) => Expect::Invalid("cursor_key.namespace"),
            (false, _) => Expect::Invalid("cursor_key.claim_type"),
        };
        let result = c.list_claims(after(n, "someone".into())).await;
        check(
            &format!("ListClaims cursor_key.claim_type {what}"),
            result,
            expect,
        );
    }
    for (what, value, valid) in value_cases() {
        let expect = if valid {
            Expect::Valid
        } else {
            Expect::Invalid("cursor_key.claim_value")
        };
        let result = c.list_claims(after(2, value)).await;
        check(
            &format!("ListClaims cursor_key.claim_value {what}"),
            result,
            expect,
        );
    }

    // LookupClaim: claim_type and claim_value.
    for (what, n, valid) in enum_cases(1..=3) {
        let expect = match (valid, n) {
            (true, _) => Expect::Valid,
            (false, 0) => Expect::Invalid("namespace"),
            (false, _) => Expect::Invalid("claim_type"),
        };
        let req = pb::LookupClaimRequest {
            claim_type: n,
            claim_value: "someone".into(),
            ..Default::default()
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
            ..Default::default()
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
                .rollback_update(pb::RollbackUpdateRequest {
                    cell_id,
                    lease_id,
                    unrenewed_for: None,
                })
                .await
                .map(|r| r.map(drop)),
            LeaseRef::Renew(cell_id, lease_id) => c
                .renew_lease(pb::RenewLeaseRequest { cell_id, lease_id })
                .await
                .map(|r| r.map(drop)),
        }
    }
}

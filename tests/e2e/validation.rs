//! Input validation: every rule at and past its limit, refused as INVALID_ARGUMENT with a
//! BadRequest violation naming the field, before any store access (cell ids, claim records,
//! lease ids and their case, batch sizes, list limits and cursors).

use std::sync::Arc;

use tonic::Code;
use topology_claims::{ClaimStore, ClaimType, OwnerType, TableName};
use topology_claims_proto::pb;
use topology_claims_server::grpc::server::ServerConfig;
use topology_claims_testkit::TestServer;

use crate::support::*;

const SOME_LEASE: &str = "0b8a1f1e-3c2d-4f5a-9b6c-7d8e9fa0b1c2";

against_every_store!(
    cell_id_rules_are_enforced_at_and_past_their_limits_on_every_rpc,
    claim_record_rules_are_enforced_at_and_past_their_limits,
    lease_id_rules_are_enforced_on_every_rpc,
    lease_ids_are_case_insensitive_on_input_and_lowercase_on_output,
    batch_size_rules_are_enforced_before_any_store_access,
    list_limits_and_cursors_are_validated_not_clamped,
);

async fn cell_id_rules_are_enforced_at_and_past_their_limits_on_every_rpc(
    store: Arc<dyn ClaimStore>,
) {
    let server = TestServer::start(store).await;
    let mut c = server.client().await;
    let longest: String = "Az09._-".chars().cycle().take(100).collect();
    let too_long = "c".repeat(101);

    let lease = begin(&mut c, request(&longest, &[username("longest-cell")], &[])).await;
    assert_eq!(lease.cell_id, longest);
    ok(
        c.renew_lease(renew_req(&longest, &lease.lease_id)).await,
        "renew",
    );
    ok(
        c.list_outstanding_leases(leases_req(&longest, "", 0)).await,
        "list leases",
    );
    ok(
        c.list_claims(claims_req(&longest, TableName::USERS, 0, 0))
            .await,
        "list claims",
    );
    commit(&mut c, &longest, &lease.lease_id).await;
    assert_eq!(
        lookup(&mut c, &username("longest-cell")).await,
        held(pb::ClaimState::Active, &longest)
    );

    for bad in [
        "",
        too_long.as_str(),
        "cell a",
        "cell/a",
        "cell:a",
        "céll",
        "cell\n",
        "cell@1",
    ] {
        expect_invalid(
            c.begin_update(request(bad, &[username("x")], &[])).await,
            "cell_id",
        );
        expect_invalid(
            c.commit_update(commit_req(bad, SOME_LEASE)).await,
            "cell_id",
        );
        expect_invalid(
            c.rollback_update(rollback_req(bad, SOME_LEASE)).await,
            "cell_id",
        );
        expect_invalid(c.renew_lease(renew_req(bad, SOME_LEASE)).await, "cell_id");
        expect_invalid(
            c.list_outstanding_leases(leases_req(bad, "", 0)).await,
            "cell_id",
        );
        expect_invalid(
            c.list_claims(claims_req(bad, TableName::USERS, 0, 0)).await,
            "cell_id",
        );
    }
    // The rollback of an unknown id with a bad cell id did not record anything for it.
    let mut req = request("cell-a", &[username("after-bad-rollback")], &[]);
    req.lease_id = SOME_LEASE.to_owned();
    begin(&mut c, req).await;
    server.shutdown().await;
}

async fn claim_record_rules_are_enforced_at_and_past_their_limits(store: Arc<dyn ClaimStore>) {
    let server = TestServer::start(store).await;
    let mut c = server.client().await;
    let ascii_255 = "a".repeat(255);
    let utf8_255 = "ア".repeat(85); // 3 bytes each (a letter: every namespace rule takes it)
    let utf8_256 = format!("{utf8_255}a");

    // At the limits: accepted.
    let mut at_limits = vec![
        claim(ClaimType::Username, &ascii_255, TableName::USERS, 0),
        claim(ClaimType::Email, &utf8_255, TableName::EMAILS, i64::MAX - 1),
        claim(ClaimType::Routes, "x", TableName::GROUPS, 1),
    ];
    at_limits[0].owner_value = "o".repeat(255);
    at_limits[1].owner_value = utf8_255.clone();
    at_limits[2].owner = OwnerType::GROUP.number();
    // Owner types and tables outside the legacy enums, as names: the longest accepted.
    let mut free_form = claim(ClaimType::Routes, "free-form", TableName::USERS, 3);
    (free_form.owner, free_form.owner_type) = (0, "o".repeat(63));
    (free_form.table_name, free_form.source_table) = (0, "ssh_keys_2".to_owned());
    at_limits.push(free_form);
    for owner in OwnerType::ALL {
        let mut record = claim(
            ClaimType::Routes,
            &format!("owner-{owner}"),
            TableName::PROJECTS,
            2,
        );
        record.owner = owner.number();
        at_limits.push(record);
    }
    let lease = begin(&mut c, request("cell-a", &at_limits, &[])).await;
    commit(&mut c, "cell-a", &lease.lease_id).await;
    for record in &at_limits {
        assert_eq!(
            lookup(&mut c, record).await,
            held(pb::ClaimState::Active, "cell-a")
        );
    }
    ok(
        c.lookup_claim(lookup_req(ClaimType::Email, &utf8_255))
            .await,
        "lookup at limit",
    );

    // Past the limits: refused, naming the field's path (creates and destroys, any position).
    type Breaker = fn(&mut pb::ClaimRecord);
    let cases: Vec<(&str, Breaker)> = vec![
        ("claim_value", |r| r.claim_value = String::new()),
        ("claim_value", |r| r.claim_value = "a".repeat(256)),
        ("claim_value", |r| {
            r.claim_value = format!("{}a", "ア".repeat(85))
        }),
        ("claim_value", |r| r.claim_value = "new\nline".to_owned()),
        ("claim_value", |r| r.claim_value = "nul\0".to_owned()),
        ("claim_value", |r| r.claim_value = "del\u{7f}".to_owned()),
        ("claim_value", |r| r.claim_value = "c1\u{85}".to_owned()),
        ("owner_value", |r| r.owner_value = String::new()),
        ("owner_value", |r| r.owner_value = "o".repeat(256)),
        ("owner_value", |r| r.owner_value = "tab\t".to_owned()),
        ("namespace", |r| r.claim_type = 0),
        ("namespace", |r| r.namespace = "Usernames".to_owned()),
        ("namespace", |r| r.namespace = "a b".to_owned()),
        ("namespace", |r| r.namespace = "emails".to_owned()),
        ("claim_type", |r| r.claim_type = 4),
        ("claim_type", |r| r.claim_type = -1),
        ("owner_type", |r| r.owner = 0),
        ("owner", |r| r.owner = 4),
        ("owner_type", |r| r.owner_type = "Organization".to_owned()),
        ("owner_type", |r| r.owner_type = "o".repeat(64)),
        ("owner_type", |r| r.owner_type = "group".to_owned()),
        ("source_table", |r| r.table_name = 0),
        ("table_name", |r| r.table_name = 6),
        ("source_table", |r| r.source_table = "ssh keys".to_owned()),
        ("source_table", |r| r.source_table = "emails".to_owned()),
        ("table_record_id", |r| r.table_record_id = -1),
        ("table_record_id", |r| r.table_record_id = i64::MAX),
        ("table_record_id", |r| r.table_record_id = i64::MIN),
    ];
    let taken = at_limits[2].clone();
    for (field, breaker) in cases {
        let mut bad = username("valid-otherwise");
        breaker(&mut bad);
        let good = [email("a@example.com"), email("b@example.com")];
        let creates = [good[0].clone(), good[1].clone(), bad.clone()];
        let result = c.begin_update(request("cell-a", &creates, &[])).await;
        expect_invalid(result, &format!("creates_claims[2].{field}"));
        // Validation comes before the store: a taken claim earlier in the batch is not reported.
        let result = c
            .begin_update(request("cell-a", [taken.clone()], &[good[0].clone(), bad]))
            .await;
        expect_invalid(result, &format!("destroys_claims[1].{field}"));
    }
    assert_eq!(utf8_256.len(), 256);
    expect_invalid(
        c.lookup_claim(lookup_req(ClaimType::Email, &utf8_256))
            .await,
        "claim_value",
    );
    expect_invalid(
        c.lookup_claim(lookup_req(ClaimType::Email, "")).await,
        "claim_value",
    );
    expect_invalid(
        c.lookup_claim(lookup_req(ClaimType::Email, "a\rb")).await,
        "claim_value",
    );
    let unspecified = pb::LookupClaimRequest {
        claim_type: 0,
        claim_value: "x".into(),
        ..Default::default()
    };
    expect_invalid(c.lookup_claim(unspecified).await, "namespace");
    let unknown = pb::LookupClaimRequest {
        claim_type: 42,
        claim_value: "x".into(),
        ..Default::default()
    };
    expect_invalid(c.lookup_claim(unknown).await, "claim_type");
    server.shutdown().await;
}

async fn lease_id_rules_are_enforced_on_every_rpc(store: Arc<dyn ClaimStore>) {
    let server = TestServer::start(store).await;
    let mut c = server.client().await;
    let malformed = [
        "0b8a1f1e-3c2d-4f5a-9b6c-7d8e9fa0b1c",    // 35 characters
        "0b8a1f1e-3c2d-4f5a-9b6c-7d8e9fa0b1c2a",  // 37 characters
        "0b8a1f1e3c2d4f5a9b6c7d8e9fa0b1c2",       // simple form, no hyphens
        "{0b8a1f1e-3c2d-4f5a-9b6c-7d8e9fa0b1c2}", // braced
        "0b8a1f1e3-c2d-4f5a-9b6c-7d8e9fa0b1c2",   // 36 characters, hyphens misplaced
        "zb8a1f1e-3c2d-4f5a-9b6c-7d8e9fa0b1c2",   // not hex
        " b8a1f1e-3c2d-4f5a-9b6c-7d8e9fa0b1c2",   // whitespace
    ];
    for bad in malformed.iter().chain([&""]) {
        expect_invalid(c.commit_update(commit_req("cell-a", bad)).await, "lease_id");
        expect_invalid(
            c.rollback_update(rollback_req("cell-a", bad)).await,
            "lease_id",
        );
        expect_invalid(c.renew_lease(renew_req("cell-a", bad)).await, "lease_id");
    }
    for bad in malformed {
        let mut req = request("cell-a", &[username("x")], &[]);
        req.lease_id = bad.to_owned();
        expect_invalid(c.begin_update(req).await, "lease_id");
        expect_invalid(
            c.list_outstanding_leases(leases_req("cell-a", bad, 0))
                .await,
            "cursor",
        );
    }
    assert_eq!(lookup(&mut c, &username("x")).await, None);
    // Optional on BeginUpdate: empty means the server picks a (lowercase v4) id.
    let lease = begin(&mut c, request("cell-a", &[username("x")], &[])).await;
    assert_eq!(lease.lease_id.len(), 36);
    assert_eq!(lease.lease_id, lease.lease_id.to_ascii_lowercase());
    server.shutdown().await;
}

async fn lease_ids_are_case_insensitive_on_input_and_lowercase_on_output(
    store: Arc<dyn ClaimStore>,
) {
    let server = TestServer::start(store).await;
    let mut c = server.client().await;
    let upper = "5D0C8F7E-1A2B-4C3D-8E9F-0A1B2C3D4E5F";
    let lower = upper.to_ascii_lowercase();
    let mixed = "5d0C8f7E-1a2B-4c3D-8e9F-0a1B2c3D4e5F";
    let mut req = request("cell-a", &[username("cases")], &[]);
    req.lease_id = upper.to_owned();
    let lease = begin(&mut c, req.clone()).await;
    assert_eq!(lease.lease_id, lower);
    // A retry in another case is the same lease.
    req.lease_id = mixed.to_owned();
    assert_eq!(begin(&mut c, req).await.lease_id, lower);

    let listed = ok(
        c.list_outstanding_leases(leases_req("cell-a", "", 0)).await,
        "list",
    );
    assert_eq!(
        listed.leases[0].lease_payload.as_ref().unwrap().lease_id,
        lower
    );
    let renewed = ok(c.renew_lease(renew_req("cell-a", mixed)).await, "renew");
    assert_eq!(renewed.lease_payload.unwrap().lease_id, lower);
    // A cursor in upper case works like its lowercase form.
    let after = ok(
        c.list_outstanding_leases(leases_req("cell-a", upper, 0))
            .await,
        "list",
    );
    assert!(after.leases.is_empty());

    commit(&mut c, "cell-a", upper).await;
    commit(&mut c, "cell-a", &lower).await;
    let result = c.rollback_update(rollback_req("cell-a", mixed)).await;
    expect_status(
        result,
        Code::FailedPrecondition,
        "LEASE_COMMITTED",
        &[("lease_id", &lower)],
    );
    server.shutdown().await;
}

async fn batch_size_rules_are_enforced_before_any_store_access(store: Arc<dyn ClaimStore>) {
    let server = TestServer::start(Arc::clone(&store)).await;
    let mut c = server.client().await;
    // At least one create or destroy.
    expect_invalid(
        c.begin_update(request("cell-a", &[], &[])).await,
        "creates_claims",
    );

    // At most --max-batch (default 1000) claims, creates and destroys together.
    let many = |n: usize, prefix: &str| -> Vec<pb::ClaimRecord> {
        (0..n)
            .map(|i| {
                claim(
                    ClaimType::Username,
                    &format!("{prefix}-{i}"),
                    TableName::USERS,
                    i as i64,
                )
            })
            .collect()
    };
    let result = c
        .begin_update(request("cell-a", many(1001, "over"), &[]))
        .await;
    expect_invalid(result, "creates_claims");
    // 601 destroys of absent claims would be CLAIM_NOT_FOUND if they reached the store.
    let result = c
        .begin_update(request("cell-a", many(400, "c"), many(601, "d")))
        .await;
    expect_invalid(result, "creates_claims");
    let lease = begin(&mut c, request("cell-a", many(1000, "at"), &[])).await;
    commit(&mut c, "cell-a", &lease.lease_id).await;
    assert_eq!(
        lookup(&mut c, &many(1000, "at")[999]).await,
        held(pb::ClaimState::Active, "cell-a")
    );
    server.shutdown().await;

    // A configured --max-batch is honoured.
    let config = ServerConfig {
        max_batch: 2,
        ..ServerConfig::default()
    };
    let server = TestServer::start_with(store, config).await;
    let mut c = server.client().await;
    let result = c
        .begin_update(request("cell-a", many(2, "small"), many(1, "at")))
        .await;
    expect_invalid(result, "creates_claims");
    let lease = begin(&mut c, request("cell-a", many(1, "small"), many(1, "at"))).await;
    commit(&mut c, "cell-a", &lease.lease_id).await;
    server.shutdown().await;
}

async fn list_limits_and_cursors_are_validated_not_clamped(store: Arc<dyn ClaimStore>) {
    let server = TestServer::start(store).await;
    let mut c = server.client().await;
    for bad in [-1, i32::MIN, 1001, i32::MAX] {
        expect_invalid(
            c.list_outstanding_leases(leases_req("cell-a", "", bad))
                .await,
            "limit",
        );
    }
    for bad in [-1, i32::MIN, 10_001, i32::MAX] {
        expect_invalid(
            c.list_claims(claims_req("cell-a", TableName::USERS, 0, bad))
                .await,
            "limit",
        );
    }
    for bad in [-1, i64::MIN, i64::MAX] {
        expect_invalid(
            c.list_claims(claims_req("cell-a", TableName::USERS, bad, 0))
                .await,
            "cursor",
        );
    }
    for bad in [0, 6, -3] {
        let req = pb::ListClaimsRequest {
            cell_id: "cell-a".into(),
            table_name: bad,
            cursor: 0,
            limit: 0,
            cursor_key: None,
            ..Default::default()
        };
        let field = if bad == 0 {
            "source_table"
        } else {
            "table_name"
        };
        expect_invalid(c.list_claims(req).await, field);
    }
    for (claim_type, value, field) in [
        (0, "a", "cursor_key.namespace"),
        (9, "a", "cursor_key.claim_type"),
        (1, "", "cursor_key.claim_value"),
        (1, "a\u{7}", "cursor_key.claim_value"),
    ] {
        let req = pb::ListClaimsRequest {
            cursor_key: Some(pb::ClaimKeyCursor {
                claim_type,
                claim_value: value.into(),
                ..Default::default()
            }),
            ..claims_req("cell-a", TableName::USERS, 0, 0)
        };
        expect_invalid(c.list_claims(req).await, field);
    }
    expect_invalid(
        c.list_outstanding_leases(leases_req("cell-a", "page-2", 0))
            .await,
        "cursor",
    );

    // At the limits: accepted.
    ok(
        c.list_outstanding_leases(leases_req("cell-a", "", 1000))
            .await,
        "leases limit 1000",
    );
    ok(
        c.list_outstanding_leases(leases_req("cell-a", "", 1)).await,
        "leases limit 1",
    );
    ok(
        c.list_outstanding_leases(leases_req("cell-a", SOME_LEASE, 0))
            .await,
        "leases cursor",
    );
    ok(
        c.list_claims(claims_req("cell-a", TableName::USERS, 0, 10_000))
            .await,
        "claims limit 10000",
    );
    let last = ok(
        c.list_claims(claims_req("cell-a", TableName::USERS, i64::MAX - 1, 1))
            .await,
        "cursor",
    );
    assert_eq!(
        (last.start_range, last.end_range, last.next_cursor),
        (i64::MAX - 1, i64::MAX, None)
    );
    let after_key = pb::ListClaimsRequest {
        cursor_key: Some(pb::ClaimKeyCursor {
            claim_type: ClaimType::Email.number(),
            claim_value: "someone@example.com".into(),
            ..Default::default()
        }),
        ..claims_req("cell-a", TableName::USERS, 7, 1)
    };
    ok(c.list_claims(after_key).await, "cursor_key");
    server.shutdown().await;
}

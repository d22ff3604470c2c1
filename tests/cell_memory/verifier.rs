//! The verifier against the real gRPC server: each kind of drift, resuming, pages, fallbacks
//! and withdrawn corrections.

use super::*;

/// Local records as a verifier sees them: (table record, created_at).
struct Records(Mutex<Vec<LocalClaim>>);

impl ClaimSource for Records {
    async fn claims_in_range(
        &self,
        table: TableName,
        start: i64,
        end: i64,
    ) -> Result<Vec<LocalClaim>, ClaimsError> {
        let all = self.0.lock().unwrap();
        Ok(all
            .iter()
            .filter(|c| {
                c.record.table_name == table && (start..end).contains(&c.record.table_record_id)
            })
            .cloned()
            .collect())
    }
}

fn user_record(id: i64, name: &str) -> topology_claims::ClaimRecord {
    record_in(TableName::USERS, id, ClaimType::Username, name)
}

/// A store clock two hours behind, so the claims written through it are not "recent".
struct TwoHoursAgo;

impl topology_claims::Clock for TwoHoursAgo {
    fn now(&self) -> Timestamp {
        topology_claims::Clock::now(&topology_claims::SystemClock)
            .saturating_sub(Duration::from_secs(7200))
    }
}

/// A server whose claims are two hours old when written: none of them is "recent".
async fn old_claims_server() -> TestServer {
    TestServer::start(Arc::new(MemoryClaimStore::with_clock(Arc::new(
        TwoHoursAgo,
    ))))
    .await
}

#[tokio::test]
async fn verifier_repairs_each_kind_of_drift_and_leaves_recent_records_alone() {
    let server = old_claims_server().await;
    let client = client(&server);
    let a = cell("cell-a");
    let old = Timestamp::from_unix_micros(1_000_000);
    let now = topology_claims::Clock::now(&topology_claims::SystemClock);
    // The service holds: ok(1), different(2: other owner value), extra(3).
    let mut different = user_record(2, "bob");
    different.owner_value = "someone-else".into();
    for record in [user_record(1, "alice"), different, user_record(3, "carol")] {
        let lease = client.begin_update(creates(&a, &[record])).await.unwrap();
        client.commit_update(&a, lease.lease_id).await.unwrap();
    }
    // Locally: alice(1) ok, bob(2) different, dave(4) missing, erin(5) missing but recent.
    let records = Records(Mutex::new(vec![
        LocalClaim {
            record: user_record(1, "alice"),
            created_at: old,
        },
        LocalClaim {
            record: user_record(2, "bob"),
            created_at: old,
        },
        LocalClaim {
            record: user_record(4, "dave"),
            created_at: old,
        },
        LocalClaim {
            record: user_record(5, "erin"),
            created_at: now,
        },
    ]));
    let config = VerifierConfig {
        page_size: 2,
        ..VerifierConfig::new(a.clone(), vec![TableName::USERS])
    };

    let dry = Verifier::new(
        client.clone(),
        &records,
        VerifierConfig {
            dry_run: true,
            ..config.clone()
        },
    );
    let report = dry.run(|_| {}).await.unwrap();
    assert_eq!(
        (report.missing, report.different, report.extra),
        (1, 1, 1),
        "{report}"
    );
    assert_eq!(report.corrections_applied, 0, "dry run changes nothing");
    assert!(client.lookup_claim(&username("carol").key).await.is_ok());

    let mut pages = 0;
    let report = Verifier::new(client.clone(), &records, config.clone())
        .run(|_| pages += 1)
        .await
        .unwrap();
    assert!(pages >= 2, "progress is reported per page");
    assert_eq!(
        (report.missing, report.different, report.extra),
        (1, 1, 1),
        "{report}"
    );
    assert_eq!(
        report.corrections_applied, 3,
        "one create, one update for the difference, one destroy: {report}"
    );
    assert_eq!(report.corrections_failed, 0);
    assert!(report.skipped_recent >= 1, "erin is recent");
    let bob = client.lookup_claim(&username("bob").key).await.unwrap();
    assert_eq!(bob.record, user_record(2, "bob"));
    assert!(matches!(
        client.lookup_claim(&username("carol").key).await,
        Err(ClaimsError::ClaimNotFound { .. })
    ));
    assert_eq!(
        client
            .lookup_claim(&username("dave").key)
            .await
            .unwrap()
            .cell_id,
        a
    );
    assert!(matches!(
        client.lookup_claim(&username("erin").key).await,
        Err(ClaimsError::ClaimNotFound { .. })
    ));

    let again = Verifier::new(client.clone(), &records, config)
        .run(|_| {})
        .await
        .unwrap();
    assert_eq!(
        (
            again.missing,
            again.different,
            again.extra,
            again.corrections_applied
        ),
        (0, 0, 0, 0),
        "{again}"
    );
    server.shutdown().await;
}

/// A "different" claim is corrected with one in-place update: the claim is never free, so a
/// create by another cell racing the correction meets CLAIM_LEASED (and CLAIM_TAKEN after it),
/// a lookup meanwhile shows it UPDATING for this cell, never CLAIM_NOT_FOUND.
#[tokio::test]
async fn verifier_corrects_a_different_claim_with_one_update_that_never_frees_it() {
    let (a, b) = (cell("cell-a"), cell("cell-b"));
    let store = Arc::new(MeddlingStore::new(
        MemoryClaimStore::with_clock(Arc::new(TwoHoursAgo)),
        false,
        Some(b.clone()),
    ));
    let server = TestServer::start(store.clone()).await;
    let client = client(&server);
    // The route moved from a project to its group locally; the service still has the project.
    let local = ClaimRecord {
        display: None,
        owner_type: OwnerType::GROUP,
        owner_value: "acme".into(),
        ..record_in(TableName::ROUTES, 7, ClaimType::Routes, "acme/app")
    };
    let stale = ClaimRecord {
        display: None,
        owner_type: OwnerType::PROJECT,
        owner_value: "acme/app".into(),
        ..local.clone()
    };
    let lease = client.begin_update(creates(&a, &[stale])).await.unwrap();
    client.commit_update(&a, lease.lease_id).await.unwrap();
    store.seen.lock().unwrap().clear();

    let records = Records(Mutex::new(vec![LocalClaim {
        record: local.clone(),
        created_at: Timestamp::from_unix_micros(1_000_000),
    }]));
    let config = VerifierConfig::new(a.clone(), vec![TableName::ROUTES]);
    let report = Verifier::new(client.clone(), &records, config.clone())
        .run(|_| {})
        .await
        .unwrap();
    assert_eq!(
        (report.different, report.corrections_applied),
        (1, 1),
        "{report}"
    );

    let seen = std::mem::take(&mut *store.seen.lock().unwrap());
    let corrections: Vec<&SeenBegin> = seen.iter().filter(|s| s.request.cell_id == a).collect();
    assert_eq!(
        corrections.len(),
        1,
        "one BeginUpdate corrects the difference"
    );
    let correction = corrections[0];
    assert_eq!(
        (
            &correction.request.creates,
            &correction.request.destroys,
            &correction.request.updates
        ),
        (&vec![], &vec![], &vec![local.clone()]),
        "an update, never destroy + create"
    );
    assert_eq!(correction.raced.len(), 1);
    let (create, lookup) = &correction.raced[0];
    assert_eq!(
        create.as_ref().unwrap_err(),
        &ClaimsError::ClaimLeased {
            claim: local.key.clone()
        },
        "another cell's create during the correction is refused"
    );
    let during = lookup
        .as_ref()
        .expect("never CLAIM_NOT_FOUND during the update");
    assert_eq!(
        (&during.cell_id, during.state()),
        (&a, ClaimState::Updating)
    );

    let after = client.lookup_claim(&local.key).await.unwrap();
    assert_eq!((after.record, after.cell_id), (local.clone(), a.clone()));
    assert_eq!(
        client
            .begin_update(creates(&b, std::slice::from_ref(&local)))
            .await
            .unwrap_err(),
        ClaimsError::ClaimTaken { claim: local.key }
    );
    let again = Verifier::new(client.clone(), &records, config)
        .run(|_| {})
        .await
        .unwrap();
    assert_eq!(
        (again.different, again.corrections_applied),
        (0, 0),
        "{again}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn verifier_resumes_from_its_saved_cursor_within_a_time_budget() {
    let server = server().await;
    let client = client(&server);
    let a = cell("cell-a");
    let records: Vec<LocalClaim> = (0..10)
        .map(|i| LocalClaim {
            record: user_record(i, &format!("u{i}")),
            created_at: Timestamp::from_unix_micros(1),
        })
        .collect();
    let records = Records(Mutex::new(records));
    let dir = tempfile::tempdir().unwrap();
    let cursor_file = dir.path().join("verify.cursor");
    let config = VerifierConfig {
        page_size: 1,
        time_budget: Some(Duration::ZERO),
        cursor_file: Some(cursor_file.clone()),
        ..VerifierConfig::new(a.clone(), vec![TableName::USERS])
    };
    let report = Verifier::new(client.clone(), &records, config.clone())
        .run(|_| {})
        .await
        .unwrap();
    assert!(!report.finished, "a zero budget stops at once");
    let config = VerifierConfig {
        time_budget: None,
        ..config
    };
    let report = Verifier::new(client.clone(), &records, config)
        .run(|_| {})
        .await
        .unwrap();
    assert!(report.finished);
    assert_eq!(report.missing, 10, "{report}");
    assert!(
        !cursor_file.exists()
            || std::fs::read_to_string(&cursor_file)
                .unwrap()
                .trim()
                .is_empty(),
        "a finished table clears its cursor"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn verifier_compares_a_record_split_over_pages_as_a_whole() {
    let server = old_claims_server().await;
    let client = client(&server);
    let a = cell("cell-a");
    let old = Timestamp::from_unix_micros(1_000_000);
    // Record 7 has six claims on the service (five shared with the cell, one extra), so at page
    // size 2 it fills three pages; the cell's record 7 implies one more (missing).
    let shared = ["u7-a", "u7-b", "u7-c", "u7-d", "u7-e"];
    let mut service: Vec<_> = shared.iter().map(|name| user_record(7, name)).collect();
    service.extend([
        user_record(7, "u7-extra"),
        user_record(3, "u3"),
        user_record(9, "u9"),
    ]);
    let lease = client.begin_update(creates(&a, &service)).await.unwrap();
    client.commit_update(&a, lease.lease_id).await.unwrap();
    let mut local: Vec<LocalClaim> = shared
        .iter()
        .chain(&["u7-f"])
        .map(|name| user_record(7, name))
        .chain([user_record(3, "u3"), user_record(9, "u9")])
        .map(|record| LocalClaim {
            record,
            created_at: old,
        })
        .collect();
    local.sort_by_key(|c| c.record.table_record_id);
    let records = Records(Mutex::new(local));
    let config = VerifierConfig {
        page_size: 2,
        ..VerifierConfig::new(a.clone(), vec![TableName::USERS])
    };
    let page = client
        .list_claims(
            &ClaimsQuery::new(
                a.clone(),
                TableName::USERS,
                topology_claims::ClaimsCursor::at(4),
                2,
            ),
            None,
        )
        .await
        .unwrap();
    assert_eq!(page.split_record(), Some(7), "record 7 is split over pages");

    let report = Verifier::new(client.clone(), &records, config.clone())
        .run(|_| {})
        .await
        .unwrap();
    assert_eq!(
        (report.missing, report.different, report.extra),
        (1, 0, 1),
        "only u7-f is missing and u7-extra extra: {:?}",
        report.discrepancies
    );
    assert_eq!(report.records_checked, 3, "{report}");
    assert_eq!(report.corrections_applied, 2, "{report}");
    assert!(client.lookup_claim(&username("u7-f").key).await.is_ok());
    assert!(matches!(
        client.lookup_claim(&username("u7-extra").key).await,
        Err(ClaimsError::ClaimNotFound { .. })
    ));

    let again = Verifier::new(client.clone(), &records, config)
        .run(|_| {})
        .await
        .unwrap();
    assert_eq!(
        (again.missing, again.different, again.extra),
        (0, 0, 0),
        "{again}"
    );
    server.shutdown().await;
}

fn old_users(ids: std::ops::Range<i64>) -> Records {
    Records(Mutex::new(
        ids.map(|i| LocalClaim {
            record: user_record(i, &format!("u{i}")),
            created_at: Timestamp::from_unix_micros(1),
        })
        .collect(),
    ))
}

#[tokio::test]
async fn verifier_falls_back_to_list_claims_against_a_server_without_stream_claims() {
    let store: Arc<dyn ClaimStore> = Arc::new(MemoryClaimStore::new());
    let server = TestServer::start_without(Arc::clone(&store), &["StreamClaims"]).await;
    let client = ClaimsClient::connect_lazy(&server.endpoint(), ClientConfig::default()).unwrap();
    let a = cell("cell-a");
    let query = ClaimsQuery::new(
        a.clone(),
        TableName::USERS,
        topology_claims::ClaimsCursor::at(0),
        2,
    );
    assert!(
        client.stream_claims(&query, None).await.unwrap().is_none(),
        "the server answers UNIMPLEMENTED"
    );
    let records = old_users(0..7);
    let config = VerifierConfig {
        page_size: 2,
        ..VerifierConfig::new(a.clone(), vec![TableName::USERS])
    };
    let report = Verifier::new(client.clone(), &records, config.clone())
        .run(|_| {})
        .await
        .unwrap();
    assert!(report.finished, "{report}");
    assert_eq!(
        (report.missing, report.corrections_applied),
        (7, 7),
        "{report}"
    );
    let again = Verifier::new(client.clone(), &records, config)
        .run(|_| {})
        .await
        .unwrap();
    assert_eq!((again.records_checked, again.missing), (7, 0), "{again}");
}

/// Local records that never answer for a range starting at or after `.1`: a run that reaches it
/// hangs there, mid-table, until it is killed.
struct HangsAt<'r>(&'r Records, i64);

impl ClaimSource for HangsAt<'_> {
    async fn claims_in_range(
        &self,
        table: TableName,
        start: i64,
        end: i64,
    ) -> Result<Vec<LocalClaim>, ClaimsError> {
        if start >= self.1 {
            std::future::pending::<()>().await;
        }
        self.0.claims_in_range(table, start, end).await
    }
}

#[tokio::test]
async fn verifier_over_the_stream_resumes_from_its_saved_cursor_after_a_kill() {
    let server = server().await;
    let client = client(&server);
    let a = cell("cell-a");
    let query = ClaimsQuery::new(
        a.clone(),
        TableName::USERS,
        topology_claims::ClaimsCursor::at(0),
        1,
    );
    assert!(
        client.stream_claims(&query, None).await.unwrap().is_some(),
        "this server streams"
    );
    // The service holds the even records' claims (so each range at page size 1 is two ids); the
    // odd ones are missing.
    let even: Vec<_> = (0..40)
        .step_by(2)
        .map(|i| user_record(i, &format!("u{i}")))
        .collect();
    let lease = client.begin_update(creates(&a, &even)).await.unwrap();
    client.commit_update(&a, lease.lease_id).await.unwrap();
    let records = old_users(0..40);
    let dir = tempfile::tempdir().unwrap();
    let cursor_file = dir.path().join("verify.cursor");
    let config = VerifierConfig {
        page_size: 1,
        cursor_file: Some(cursor_file.clone()),
        ..VerifierConfig::new(a.clone(), vec![TableName::USERS])
    };
    let saved = || -> i64 {
        std::fs::read_to_string(&cursor_file)
            .ok()
            .and_then(|text| text.trim().strip_prefix("users=")?.parse().ok())
            .unwrap_or(0)
    };
    // Kill the run (drop it, and its open stream) where it hangs, at range [16, 18) mid-table.
    let first = Verifier::new(client.clone(), HangsAt(&records, 15), config.clone());
    let killed = tokio::time::timeout(Duration::from_secs(2), first.run(|_| {})).await;
    assert!(killed.is_err(), "the run hangs at record 15: {killed:?}");
    let killed_at = saved();
    assert_eq!(killed_at, 16, "the cursor saved after the last range done");
    let resumed = Verifier::new(client.clone(), &records, config.clone())
        .run(|_| {})
        .await
        .unwrap();
    assert!(resumed.finished, "{resumed}");
    assert_eq!(
        resumed.records_checked,
        (40 - killed_at) as u64,
        "the resumed run starts at the saved cursor: {resumed}"
    );
    assert_eq!(resumed.missing, 12, "odd records 17..=39: {resumed}");
    let full = Verifier::new(client.clone(), &records, config)
        .run(|_| {})
        .await
        .unwrap();
    assert_eq!(
        (full.records_checked, full.missing, full.extra),
        (40, 0, 0),
        "everything before and after the kill was corrected: {full}"
    );
    server.shutdown().await;
}

/// Local records that the cell changes right after the verifier's first read of them (its
/// comparison): later reads see `after`.
struct ChangesAfterFirstRead {
    before: Records,
    after: Records,
    reads: std::sync::atomic::AtomicUsize,
}

impl ClaimSource for ChangesAfterFirstRead {
    async fn claims_in_range(
        &self,
        table: TableName,
        start: i64,
        end: i64,
    ) -> Result<Vec<LocalClaim>, ClaimsError> {
        let reads = self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let records = if reads == 0 {
            &self.before
        } else {
            &self.after
        };
        records.claims_in_range(table, start, end).await
    }
}

/// The race a verifier must lose gracefully: it compared, then the cell's own transactions
/// changed the records (created "alice" again, whose claim looked extra; destroyed "dave", whose
/// claim looked missing). Each correcting lease reads the records again while it holds the
/// claim and rolls back instead of committing: the claim the cell's records hold is never freed,
/// and no claim is created for a record that is gone.
#[tokio::test]
async fn a_correction_the_records_no_longer_call_for_is_withdrawn_not_committed() {
    let server = old_claims_server().await;
    let client = client(&server);
    let a = cell("cell-a");
    let lease = client
        .begin_update(creates(&a, &[user_record(1, "alice")]))
        .await
        .unwrap();
    client.commit_update(&a, lease.lease_id).await.unwrap();
    let old = |record| LocalClaim {
        record,
        created_at: Timestamp::from_unix_micros(1_000_000),
    };
    let source = ChangesAfterFirstRead {
        before: Records(Mutex::new(vec![old(user_record(4, "dave"))])),
        after: Records(Mutex::new(vec![old(user_record(1, "alice"))])),
        reads: Default::default(),
    };
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&calls);
    let config = VerifierConfig {
        chunk: 1,
        slot: None,
        ..VerifierConfig::new(a.clone(), vec![TableName::USERS])
    };
    let report = Verifier::new(client.clone(), &source, config)
        .on_correction(move |e| {
            if let Some(answer) = e.answer {
                let key = e.records[0].key.value.clone();
                seen.lock()
                    .unwrap()
                    .push((key, e.op, e.call, answer.is_ok()));
            }
        })
        .run(|_| {})
        .await
        .unwrap();
    assert_eq!((report.missing, report.extra), (1, 1), "{report}");
    assert_eq!(
        (
            report.corrections_applied,
            report.corrections_withdrawn,
            report.corrections_failed
        ),
        (0, 2, 0),
        "{report}"
    );
    use topology_claims::LeaseOp::{Create, Destroy};
    use topology_claims_client::verifier::CorrectionCall::{Begin, Rollback};
    assert_eq!(
        *calls.lock().unwrap(),
        [
            ("dave".to_owned(), Create, Begin, true),
            ("dave".to_owned(), Create, Rollback, true),
            ("alice".to_owned(), Destroy, Begin, true),
            ("alice".to_owned(), Destroy, Rollback, true),
        ]
    );
    let alice = client.lookup_claim(&username("alice").key).await.unwrap();
    assert_eq!((alice.cell_id, alice.state), (a, ClaimState::Active));
    assert!(matches!(
        client.lookup_claim(&username("dave").key).await,
        Err(ClaimsError::ClaimNotFound { .. })
    ));
    server.shutdown().await;
}

/// A record that moved to another table (a route of a project that now lives in its group's
/// table, say) looks extra in the old table and missing in the new one. Whichever table the
/// verifier walks first, it corrects the claim with one update to the new values: never a
/// destroy and a create, so the claim is never free. A second run finds nothing.
#[tokio::test]
async fn a_record_moved_to_another_table_is_corrected_by_one_update_in_either_order() {
    for tables in [
        vec![TableName::EMAILS, TableName::USERS],
        vec![TableName::USERS, TableName::EMAILS],
    ] {
        let server = old_claims_server().await;
        let client = client(&server);
        let a = cell("cell-a");
        let old = record_in(TableName::EMAILS, 3, ClaimType::Username, "alice");
        let moved = user_record(7, "alice");
        let lease = client
            .begin_update(creates(&a, std::slice::from_ref(&old)))
            .await
            .unwrap();
        client.commit_update(&a, lease.lease_id).await.unwrap();
        let records = Records(Mutex::new(vec![LocalClaim {
            record: moved.clone(),
            created_at: Timestamp::from_unix_micros(1_000_000),
        }]));
        let committed = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&committed);
        let config = VerifierConfig {
            chunk: 1,
            slot: None,
            ..VerifierConfig::new(a.clone(), tables.clone())
        };
        let report = Verifier::new(client.clone(), &records, config.clone())
            .on_correction(move |e| {
                if e.answer.is_some_and(Result::is_ok) {
                    seen.lock().unwrap().push((e.op, e.call));
                }
            })
            .run(|_| {})
            .await
            .unwrap();
        use topology_claims::LeaseOp::Update;
        use topology_claims_client::verifier::CorrectionCall::{Begin, Commit};
        assert_eq!(
            *committed.lock().unwrap(),
            [(Update, Begin), (Update, Commit)],
            "tables {tables:?}: one update, nothing destroyed or created: {report}"
        );
        assert_eq!(
            (report.corrections_applied, report.corrections_failed),
            (1, 0),
            "{report}"
        );
        let claim = client.lookup_claim(&moved.key).await.unwrap();
        assert_eq!((claim.record, claim.state), (moved, ClaimState::Active));
        let again = Verifier::new(client.clone(), &records, config)
            .run(|_| {})
            .await
            .unwrap();
        assert!(again.discrepancies.is_empty(), "{again}");
        server.shutdown().await;
    }
}

//! The status mapping's tests: every error's code, reason and metadata, both ways.
use super::*;

fn every_error() -> Vec<ClaimsError> {
    let claim = ClaimKey::new(ClaimType::Email, "a@example.com");
    let lease_id = LeaseId::generate();
    vec![
        ClaimsError::invalid("creates_claims[0].claim_value", "must not be empty"),
        ClaimsError::BatchConflict {
            claim: claim.clone(),
        },
        ClaimsError::ClaimTaken {
            claim: claim.clone(),
        },
        ClaimsError::ClaimLeased {
            claim: claim.clone(),
        },
        ClaimsError::ClaimNotFound {
            claim: claim.clone(),
        },
        ClaimsError::NotClaimOwner { claim },
        ClaimsError::NotLeaseOwner { lease_id },
        ClaimsError::LeaseRolledBack { lease_id },
        ClaimsError::LeaseCommitted { lease_id },
        ClaimsError::LeaseRenewed { lease_id },
        ClaimsError::LeaseNotFound { lease_id },
        ClaimsError::LeaseIdConflict { lease_id },
        ClaimsError::MigrationsPending {
            pending: vec!["0001_init".into(), "0002_x".into()],
        },
        ClaimsError::CellDecommissioned {
            cell_id: CellId::parse("cell-a").unwrap(),
        },
        ClaimsError::CellHasOutstandingLeases {
            cell_id: CellId::parse("cell-a").unwrap(),
            outstanding: 3,
        },
        ClaimsError::AuditUnavailable {
            message: "disk full".into(),
        },
        ClaimsError::RestoreQuarantine {
            claim: ClaimKey::new(ClaimType::Username, "lost"),
            epoch: 2,
            retry_after: std::time::Duration::from_secs(30),
        },
        ClaimsError::RestoreEpochMismatch {
            sent: 1,
            current: 2,
        },
        ClaimsError::RecordExceedsPage {
            table_name: TableName::EMAILS,
            record_id: 65,
        },
        ClaimsError::RateLimited {
            limit: "cell-max-in-flight",
            cell_id: "cell-a".into(),
            retry_after: std::time::Duration::from_millis(250),
        },
        ClaimsError::VerificationSlotsBusy {
            in_use: 3,
            max: 3,
            limit: SlotCap::Fleet,
            retry_after: std::time::Duration::from_millis(1_500),
        },
        ClaimsError::VerificationSlotsBusy {
            in_use: 1,
            max: 1,
            limit: SlotCap::PerCell,
            retry_after: std::time::Duration::from_millis(700),
        },
        ClaimsError::UnknownNamespace {
            namespace: "ssh-keys".into(),
        },
        ClaimsError::InvalidClaimValue {
            field: "creates_claims[1].claim_value".into(),
            namespace: NamespaceId::parse("usernames").unwrap(),
            rule: ValueRule::Pattern,
            detail: "its key \"a b\" does not match \"^[a-z]+$\"".into(),
        },
        ClaimsError::NamespaceDeprecated {
            namespace: NamespaceId::parse("old").unwrap(),
        },
        ClaimsError::NamespaceNotEmpty {
            namespace: NamespaceId::parse("old").unwrap(),
            claims: 12,
        },
        ClaimsError::NamespaceRulesConflict {
            namespace: NamespaceId::parse("usernames").unwrap(),
            problems: vec![
                "\"John\" and \"john\" would both have the key \"john\"".into(),
                "\"a; b\" breaks the normalization rule: no; really".into(),
            ],
            more: 3,
        },
        ClaimsError::NamespaceExists {
            namespace: NamespaceId::parse("x").unwrap(),
        },
        ClaimsError::NamespaceNotFound {
            namespace: "nope".into(),
        },
        ClaimsError::TooManyNamespaces { max: 1000 },
        ClaimsError::WatchCompacted {
            requested: 5,
            compact_revision: 9,
        },
        ClaimsError::Unsupported {
            what: "WatchClaims on this store".into(),
        },
    ]
}

#[test]
fn every_protocol_error_survives_the_round_trip_through_a_status() {
    for error in every_error() {
        assert_eq!(
            from_status(&to_status(&error)),
            error,
            "round trip of {error:?}"
        );
    }
}

#[test]
fn every_status_carries_error_info_of_the_service_domain() {
    for error in every_error() {
        let details = to_status(&error).get_error_details();
        let info = details.error_info().expect("ErrorInfo attached");
        assert_eq!(info.domain, ERROR_DOMAIN);
        assert_eq!(info.reason, error.reason());
    }
}

#[test]
fn the_temporary_refusals_say_when_to_retry() {
    let claim = ClaimKey::new(ClaimType::Email, "a@example.com");
    let status = to_status(&ClaimsError::ClaimLeased { claim });
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(
        retry_delay(&status),
        Some(topology_claims::domain::CLAIM_LEASED_RETRY_AFTER)
    );
    for error in every_error() {
        let retried = matches!(
            error,
            ClaimsError::ClaimLeased { .. }
                | ClaimsError::RateLimited { .. }
                | ClaimsError::VerificationSlotsBusy { .. }
                | ClaimsError::RestoreQuarantine { .. }
        );
        assert_eq!(
            retry_delay(&to_status(&error)).is_some(),
            retried,
            "{error:?}"
        );
    }
}

#[test]
fn internal_details_are_not_sent_to_the_client() {
    let status = to_status(&ClaimsError::internal("SELECT secret FROM db at 10.0.0.5"));
    assert_eq!(status.code(), Code::Internal);
    assert!(!status.message().contains("secret"), "{}", status.message());
    let status = to_status(&ClaimsError::unavailable("connect 10.0.0.5:5432 refused"));
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        !status.message().contains("10.0.0.5"),
        "{}",
        status.message()
    );
    assert!(matches!(
        from_status(&status),
        ClaimsError::Unavailable { .. }
    ));
}

#[test]
fn malformed_request_carries_a_bad_request_field_violation() {
    let status = to_status(&ClaimsError::invalid("cell_id", "must not be empty"));
    assert_eq!(status.code(), Code::InvalidArgument);
    let details = status.get_error_details();
    let violation = &details.bad_request().expect("BadRequest").field_violations[0];
    assert_eq!(violation.field, "cell_id");
    assert_eq!(violation.description, "must not be empty");
}

#[test]
fn status_without_error_info_is_server_unavailable_only_when_retryable() {
    // The claims server's trouble, not its store's: ServerUnavailable (retryable).
    let transport = Status::unavailable("connection refused");
    assert!(matches!(
        from_status(&transport),
        ClaimsError::ServerUnavailable { .. }
    ));
    for cut in [
        Status::unknown("transport error"),
        Status::cancelled("operation was canceled"),
        // The server's transport bounds: nothing was applied, retry with backoff.
        Status::resource_exhausted("request bytes in flight are over --max-request-bytes"),
        Status::deadline_exceeded("took longer than the server's --request-timeout 30s"),
    ] {
        assert!(
            matches!(from_status(&cut), ClaimsError::ServerUnavailable { .. }),
            "{cut:?}"
        );
    }
    let other = Status::unimplemented("no such method");
    assert!(matches!(from_status(&other), ClaimsError::Internal { .. }));
}

#[test]
fn a_claim_conflicts_detail_that_lists_nothing_readable_is_the_first_refusal_alone() {
    let claim = ClaimKey::new(ClaimType::Email, "a@example.com");
    let taken = ClaimsError::ClaimTaken { claim };
    // A detail that claims 5 omitted and lists nothing readable: never a list without a
    // first.
    let bad = pb::ClaimConflicts {
        conflicts: vec![pb::ClaimConflict {
            claim: None,
            reason: "CLAIM_TAKEN".into(),
        }],
        omitted: 5,
    };
    let status = with_detail(
        one_status(&taken, None),
        CLAIM_CONFLICTS_TYPE_URL,
        bad.encode_to_vec(),
    );
    assert_eq!(from_status(&status), taken);
    // The status of a single refusal lists it alone, and reads back as that refusal.
    let status = to_status(&taken);
    let listed = claim_conflicts(&status).expect("the detail");
    assert_eq!(listed.conflicts.len(), 1);
    assert_eq!(listed.conflicts[0].reason, "CLAIM_TAKEN");
    assert_eq!(from_status(&status), taken);
}

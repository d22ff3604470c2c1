//! Arbitrary command sequences against the pure domain state machine (`domain::Tables`, the
//! reference semantics every store mirrors), with the protocol's invariants checked after every
//! step: each leased claim is held by an outstanding lease of its own cell that names it with
//! that operation, and every outstanding lease holds exactly its claims; leases and outcomes are
//! disjoint; a retried BeginUpdate and a repeated end are idempotent; pages of ListClaims and
//! ListOutstandingLeases tile what is there, without gap or repeat. Must never panic.
#![no_main]

use std::collections::BTreeSet;
use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use topology_claims::domain::Tables;
use topology_claims::{
    BeginUpdate, CellId, ClaimKey, ClaimLease, ClaimRecord, ClaimType, ClaimsCursor, ClaimsQuery,
    LeaseId, LeaseOp, LeasesQuery, OwnerType, TableName, Timestamp,
};

const CELLS: u8 = 3;
const KEYS: u8 = 12;
const LEASES: u8 = 16;

#[derive(Arbitrary, Debug)]
enum Command {
    Begin {
        cell: u8,
        lease: Option<u8>,
        creates: Vec<u8>,
        destroys: Vec<u8>,
        updates: Vec<u8>,
    },
    Commit {
        cell: u8,
        lease: u8,
    },
    Rollback {
        cell: u8,
        lease: u8,
    },
    Renew {
        cell: u8,
        lease: u8,
    },
    Collect {
        retention_ms: u16,
    },
    ListLeases {
        cell: u8,
        limit: u8,
    },
    ListClaims {
        cell: u8,
        table: bool,
        limit: u8,
    },
    Tick {
        ms: u16,
    },
}

fn cell(n: u8) -> CellId {
    CellId::parse(&format!("cell-{}", n % CELLS)).expect("valid")
}

fn lease(n: u8) -> LeaseId {
    LeaseId::from_uuid(uuid_from(n % LEASES))
}

fn uuid_from(n: u8) -> uuid::Uuid {
    uuid::Uuid::from_u128(0x1000 + u128::from(n))
}

/// Keys share record ids two by two, so ListClaims pages end inside a record now and then.
fn record(cell_n: u8, key: u8) -> ClaimRecord {
    let key = key % KEYS;
    ClaimRecord {
        display: None,
        key: ClaimKey::new(
            if key % 3 == 0 {
                ClaimType::Email
            } else {
                ClaimType::Username
            },
            format!("k{key}"),
        ),
        owner_type: OwnerType::USER,
        owner_value: format!("owner-{}", cell_n % CELLS),
        table_name: if key % 4 == 0 {
            TableName::EMAILS
        } else {
            TableName::USERS
        },
        table_record_id: i64::from(key / 2),
    }
}

fn check_invariants(tables: &Tables) {
    for (key, claim) in &tables.claims {
        assert_eq!(key, claim.key());
        if let Some(ClaimLease { lease_id, op }) = claim.lease {
            let lease = tables.leases.get(&lease_id).unwrap_or_else(|| {
                panic!("{key} is leased by {lease_id}, which is not outstanding")
            });
            assert_eq!(
                lease.cell_id, claim.cell_id,
                "{key}: a lease of another cell"
            );
            let named = match op {
                LeaseOp::Create => &lease.request.creates,
                LeaseOp::Destroy => &lease.request.destroys,
                LeaseOp::Update => &lease.request.updates,
            };
            assert!(
                named.iter().any(|r| &r.key == key),
                "{key}: not in its lease's request"
            );
        }
    }
    for (id, lease) in &tables.leases {
        assert_eq!(*id, lease.lease_id);
        assert!(
            !tables.outcomes.contains_key(id),
            "{id} is outstanding and ended"
        );
        for (op, record) in lease.request.operations() {
            let claim = tables
                .claims
                .get(&record.key)
                .expect("a leased claim exists");
            assert_eq!(
                claim.lease,
                Some(ClaimLease { lease_id: *id, op }),
                "{}",
                record.key
            );
        }
    }
}

fn check_pages(tables: &Tables, cell_id: &CellId, table_name: TableName, limit: usize) {
    let mut seen = Vec::new();
    let mut cursor = ClaimsCursor::at(0);
    for _ in 0..=KEYS as usize + 1 {
        let page = tables.list_claims(&ClaimsQuery::new(
            cell_id.clone(),
            table_name.clone(),
            cursor.clone(),
            limit,
        ));
        assert_eq!(page.start_range, cursor.record_id);
        assert!(page.claims.len() <= limit.max(1));
        for claim in &page.claims {
            let id = claim.record.table_record_id;
            assert!(
                (page.start_range <= id && id < page.end_range) || page.split_record() == Some(id)
            );
        }
        seen.extend(page.claims.iter().map(|c| c.key().clone()));
        match page.next_cursor {
            Some(next) => {
                assert_eq!(next.record_id, page.end_range);
                assert!(next > cursor, "pagination advances");
                cursor = next;
            }
            None => {
                assert_eq!(page.end_range, i64::MAX);
                break;
            }
        }
    }
    let unique: BTreeSet<_> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "no claim on two pages");
    let expected: BTreeSet<_> = tables
        .claims
        .values()
        .filter(|c| &c.cell_id == cell_id && c.record.table_name == table_name)
        .map(|c| c.key().clone())
        .collect();
    assert_eq!(unique, expected, "the pages hold every claim");
}

fuzz_target!(|commands: Vec<Command>| {
    let mut tables = Tables::default();
    let mut now = Timestamp::from_unix_micros(1_000_000);
    for command in commands.into_iter().take(200) {
        now = now.saturating_add(Duration::from_micros(1));
        match command {
            Command::Begin {
                cell: c,
                lease: l,
                creates,
                destroys,
                updates,
            } => {
                let request = BeginUpdate {
                    local_transaction: None,
                    cell_id: cell(c),
                    lease_id: l.map(lease),
                    creates: creates.iter().take(4).map(|&k| record(c, k)).collect(),
                    destroys: destroys.iter().take(4).map(|&k| record(c, k)).collect(),
                    // An update moves the claim to another owner value of the same cell.
                    updates: updates
                        .iter()
                        .take(4)
                        .map(|&k| ClaimRecord {
                            owner_value: format!("moved-{k}"),
                            ..record(c, k)
                        })
                        .collect(),
                };
                let fresh = lease(LEASES - 1);
                if let Ok(granted) = tables.begin_update(request.clone(), fresh, now) {
                    assert!(granted.request.same_content(&request));
                    // A retry with the same id and content gets the same lease and changes nothing.
                    let before = tables.clone();
                    let retry = BeginUpdate {
                        lease_id: Some(granted.lease_id),
                        ..request
                    };
                    let again = tables
                        .begin_update(retry, fresh, now)
                        .expect("a retry is replayed");
                    assert_eq!(again, granted);
                    assert_eq!(tables, before);
                }
            }
            Command::Commit { cell: c, lease: l } => {
                if tables.commit_update(&cell(c), lease(l), now).is_ok() {
                    let before = tables.clone();
                    tables
                        .commit_update(&cell(c), lease(l), now)
                        .expect("commit is idempotent");
                    assert_eq!(tables, before);
                }
            }
            Command::Rollback { cell: c, lease: l } => {
                if tables
                    .rollback_update(&cell(c), lease(l), None, now)
                    .is_ok()
                {
                    let before = tables.clone();
                    tables
                        .rollback_update(&cell(c), lease(l), None, now)
                        .expect("rollback is idempotent");
                    assert_eq!(tables, before);
                }
            }
            Command::Renew { cell: c, lease: l } => {
                if let Ok(renewed) = tables.renew_lease(&cell(c), lease(l), now) {
                    assert_eq!(renewed.last_renewed_at, now);
                }
            }
            Command::Collect { retention_ms } => {
                let retention = Duration::from_millis(u64::from(retention_ms));
                let before = tables.outcomes.len() as u64;
                let collected = tables.collect_outcomes(now, retention);
                assert_eq!(before - collected, tables.outcomes.len() as u64);
            }
            Command::ListLeases { cell: c, limit } => {
                let limit = usize::from(limit % 5) + 1;
                let mut after = None;
                let mut listed = Vec::new();
                loop {
                    let page = tables
                        .list_outstanding_leases(&LeasesQuery::new(cell(c), after, limit), now);
                    assert!(page.leases.len() <= limit);
                    listed.extend(page.leases.iter().map(|l| l.lease_id));
                    match page.next_cursor {
                        Some(next) => after = Some(next),
                        None => break,
                    }
                }
                let expected: Vec<LeaseId> = tables
                    .leases
                    .values()
                    .filter(|l| l.cell_id == cell(c))
                    .map(|l| l.lease_id)
                    .collect();
                assert_eq!(listed, expected, "pages in lease id order, each lease once");
            }
            Command::ListClaims {
                cell: c,
                table,
                limit,
            } => {
                let table_name = if table {
                    TableName::EMAILS
                } else {
                    TableName::USERS
                };
                check_pages(&tables, &cell(c), table_name, usize::from(limit % 6));
            }
            Command::Tick { ms } => {
                now = now.saturating_add(Duration::from_millis(u64::from(ms)));
            }
        }
        check_invariants(&tables);
    }
});

//! The campaign's names for cells, keys and requests, and one step of the pure domain model
//! (`topology_claims::domain::Tables`) for a recorded call: what the specification answers.
//!
//! Owns the mapping from the history's small numbers to domain values. Must not hold protocol
//! rules: every answer comes from `Tables`.

use topology_claims::domain::Tables;
use topology_claims::{
    BeginUpdate, CellId, ClaimKey, ClaimRecord, ClaimType, LeaseId, OwnerType, TableName, Timestamp,
};

use crate::history::{Answer, Call, ErrorKind, TxOp};

const CELL_PREFIX: &str = "chaos-c";

/// The id of cell `index`: `chaos-c00`, `chaos-c01`, …
pub fn cell_id(index: u16) -> CellId {
    // Always 9–13 bytes of [a-z0-9-]: valid by construction.
    CellId::parse(&format!("{CELL_PREFIX}{index:02}"))
        .unwrap_or_else(|e| unreachable!("generated cell id is invalid: {e}"))
}

/// The index of a campaign cell id; `None` for any other id.
pub fn cell_index(id: &CellId) -> Option<u16> {
    id.as_str().strip_prefix(CELL_PREFIX)?.parse().ok()
}

/// The claim of key `key`: a username, so one lease holds exactly one row.
pub fn claim_key(key: u32) -> ClaimKey {
    ClaimKey::new(ClaimType::Username, format!("chaos-k{key:04}"))
}

/// The key number of a campaign claim; `None` for any other claim.
pub fn key_index(key: &ClaimKey) -> Option<u32> {
    key.value.strip_prefix("chaos-k")?.parse().ok()
}

/// The claim record a cell sends for `key` (the local record id is the key number).
pub fn record(cell: u16, key: u32) -> ClaimRecord {
    ClaimRecord {
        display: None,
        key: claim_key(key),
        owner_type: OwnerType::USER,
        owner_value: cell_id(cell).to_string(),
        table_name: TableName::USERS,
        table_record_id: i64::from(key),
    }
}

/// The BeginUpdate a cell sends: one create or one destroy of `key` under `lease`.
pub fn request(cell: u16, lease: LeaseId, op: TxOp, key: u32) -> BeginUpdate {
    let claim = record(cell, key);
    let (mut creates, mut destroys, mut updates) = (vec![], vec![], vec![]);
    match op {
        TxOp::Create => creates.push(claim),
        TxOp::Destroy => destroys.push(claim),
        TxOp::Update => updates.push(claim),
    }
    BeginUpdate {
        local_transaction: None,
        cell_id: cell_id(cell),
        lease_id: Some(lease),
        creates,
        destroys,
        updates,
    }
}

/// The model's clock never moves: no decision of a single key's history depends on time
/// (staleness is the reconcilers' business, and their actions enter as ghost calls).
const NOW: Timestamp = Timestamp::from_unix_micros(0);

/// Applies `call` (made by `cell`) to the model and returns the specification's answer.
pub fn apply(tables: &mut Tables, cell: u16, call: &Call) -> Answer {
    let caller = cell_id(cell);
    let answer = |result: Result<(), topology_claims::ClaimsError>| match result {
        Ok(()) => Answer::Ok,
        Err(e) => Answer::Err(ErrorKind::of(&e).unwrap_or(ErrorKind::Other)),
    };
    match *call {
        Call::Begin { lease, op, key } => answer(
            tables
                .begin_update(request(cell, lease, op, key), lease, NOW)
                .map(drop),
        ),
        Call::Commit { lease, .. }
        | Call::Ghost {
            lease,
            committed: true,
            ..
        } => answer(tables.commit_update(&caller, lease, NOW)),
        Call::Rollback { lease, .. }
        | Call::Ghost {
            lease,
            committed: false,
            ..
        } => answer(tables.rollback_update(&caller, lease, None, NOW)),
        Call::Probe { lease, .. } => answer(tables.renew_lease(&caller, lease, NOW).map(drop)),
        Call::Lookup { key } => match tables.lookup_claim(&claim_key(key)) {
            Ok(claim) => Answer::Found {
                cell: cell_index(&claim.cell_id).unwrap_or(u16::MAX),
                state: claim.state(),
            },
            Err(e) => answer(Err(e)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(cell_index(&cell_id(7)), Some(7));
        assert_eq!(cell_index(&CellId::parse("other").unwrap()), None);
        assert_eq!(key_index(&claim_key(12)), Some(12));
        assert_eq!(key_index(&claim_key(12_345)), Some(12_345));
    }

    #[test]
    fn the_model_answers_like_the_specification() {
        let mut tables = Tables::default();
        let (a, b) = (LeaseId::generate(), LeaseId::generate());
        let begin = |lease, op| Call::Begin { lease, op, key: 1 };
        assert_eq!(apply(&mut tables, 0, &begin(a, TxOp::Create)), Answer::Ok);
        assert_eq!(
            apply(&mut tables, 1, &begin(b, TxOp::Create)),
            Answer::Err(ErrorKind::ClaimLeased)
        );
        assert_eq!(
            apply(&mut tables, 0, &Call::Commit { lease: a, key: 1 }),
            Answer::Ok
        );
        assert_eq!(
            apply(&mut tables, 1, &Call::Lookup { key: 1 }),
            Answer::Found {
                cell: 0,
                state: topology_claims::ClaimState::Active
            }
        );
        assert_eq!(
            apply(&mut tables, 0, &Call::Probe { lease: a, key: 1 }),
            Answer::Err(ErrorKind::LeaseCommitted)
        );
    }
}

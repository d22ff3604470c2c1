//! Small builders shared by the suites: cells, claim records and requests with readable names.

use crate::domain::{
    BeginUpdate, CellId, ClaimKey, ClaimRecord, ClaimType, LeaseId, NamespaceId, OwnerType,
    TableName,
};

pub fn cell(name: &str) -> CellId {
    CellId::parse(name).expect("a valid cell id in a test")
}

pub fn key(namespace: impl Into<NamespaceId>, value: &str) -> ClaimKey {
    ClaimKey::new(namespace, value)
}

/// A record of `table` with id `record_id` claiming `value` in `namespace`.
pub fn record_in(
    table: TableName,
    record_id: i64,
    namespace: impl Into<NamespaceId>,
    value: &str,
) -> ClaimRecord {
    ClaimRecord {
        display: None,
        key: key(namespace, value),
        owner_type: OwnerType::USER,
        owner_value: format!("owner-of-{value}"),
        table_name: table,
        table_record_id: record_id,
    }
}

pub fn username(value: &str) -> ClaimRecord {
    record_in(TableName::USERS, 1, ClaimType::Username, value)
}

pub fn email(value: &str) -> ClaimRecord {
    record_in(TableName::EMAILS, 1, ClaimType::Email, value)
}

pub fn route(value: &str) -> ClaimRecord {
    record_in(TableName::ROUTES, 1, ClaimType::Routes, value)
}

pub fn creates(cell_id: &CellId, records: &[ClaimRecord]) -> BeginUpdate {
    BeginUpdate {
        local_transaction: None,
        cell_id: cell_id.clone(),
        lease_id: None,
        creates: records.to_vec(),
        destroys: Vec::new(),
        updates: Vec::new(),
    }
}

pub fn destroys(cell_id: &CellId, records: &[ClaimRecord]) -> BeginUpdate {
    BeginUpdate {
        local_transaction: None,
        cell_id: cell_id.clone(),
        lease_id: None,
        creates: Vec::new(),
        destroys: records.to_vec(),
        updates: Vec::new(),
    }
}

/// A BeginUpdate of `cell_id` updating its claims in place to `records` (the new values).
pub fn updates(cell_id: &CellId, records: &[ClaimRecord]) -> BeginUpdate {
    BeginUpdate {
        local_transaction: None,
        cell_id: cell_id.clone(),
        lease_id: None,
        creates: Vec::new(),
        destroys: Vec::new(),
        updates: records.to_vec(),
    }
}

/// `record` moved in place: owned by the project `owner`, implied by record `record_id` of
/// `table` (the new values of an update; the key stays).
pub fn moved(record: &ClaimRecord, owner: &str, table: TableName, record_id: i64) -> ClaimRecord {
    ClaimRecord {
        display: None,
        owner_type: OwnerType::PROJECT,
        owner_value: owner.to_owned(),
        table_name: table,
        table_record_id: record_id,
        ..record.clone()
    }
}

/// A fixed lease id, the same on every run, distinct per `n`.
pub fn lease_id(n: u128) -> LeaseId {
    LeaseId::from_uuid(uuid::Uuid::from_u128(
        0x7c1a_0000_0000_4000_8000_0000_0000_0000 | n,
    ))
}

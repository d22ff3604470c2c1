//! Reading the service's rows: SQL columns to domain values and back.
//!
//! Owns the column encodings (INTEGER unix micros, lowercase TEXT lease ids, INTEGER enum wire
//! numbers, protobuf BLOB requests). Must not decide anything: a row that does not decode is
//! corrupt data (`Internal`), never a protocol answer.

use rusqlite::{params_from_iter, Connection, OptionalExtension, Row, ToSql};
use topology_claims::codec::decode_request;
use topology_claims::domain::{ClaimEvent, EventPosition, LeaseRecord, NamespaceId, Outcome};
use topology_claims::{
    CellId, Claim, ClaimKey, ClaimLease, ClaimRecord, ClaimsError, Lease, LeaseId, LeaseOp,
    LeaseOutcome, OwnerType, TableName, Timestamp,
};

use crate::error::StoreError;

/// The `claims` columns in the order [`ClaimRow::read`] expects.
pub(crate) const CLAIM_COLUMNS: &str = "claim_type, claim_value, cell_id, owner_type, \
     owner_value, table_name, table_record_id, lease_id, lease_op, created_at, updated_at, \
     display_value, namespace, owner_type_name, source_table, revision";

pub(crate) fn corrupt(table: &str, detail: impl std::fmt::Display) -> ClaimsError {
    ClaimsError::internal(format!("corrupt row in SQLite table {table}: {detail}"))
}

fn enum_value<T>(
    table: &str,
    column: &str,
    number: i64,
    from_number: impl Fn(i64) -> Option<T>,
) -> Result<T, ClaimsError> {
    from_number(number).ok_or_else(|| corrupt(table, format!("{column} = {number}")))
}

pub(crate) fn cell_id(table: &str, value: &str) -> Result<CellId, ClaimsError> {
    CellId::parse(value).map_err(|e| corrupt(table, e))
}

pub(crate) fn lease_id(table: &str, value: &str) -> Result<LeaseId, ClaimsError> {
    LeaseId::parse(value).map_err(|e| corrupt(table, e))
}

/// The text a lease id is stored as: lowercase hyphenated, so TEXT order is UUID order.
pub(crate) fn lease_id_text(lease_id: LeaseId) -> String {
    lease_id.to_string()
}

/// A `claims` row as SQLite returns it, before validation.
struct ClaimRow {
    claim_type: i64,
    claim_value: String,
    cell_id: String,
    owner_type: i64,
    owner_value: String,
    table_name: i64,
    table_record_id: i64,
    lease_id: Option<String>,
    lease_op: i64,
    created_at: i64,
    updated_at: i64,
    display_value: Option<String>,
    namespace: Option<String>,
    owner_type_name: Option<String>,
    source_table: Option<String>,
    revision: i64,
}

impl ClaimRow {
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            claim_type: row.get(0)?,
            claim_value: row.get(1)?,
            cell_id: row.get(2)?,
            owner_type: row.get(3)?,
            owner_value: row.get(4)?,
            table_name: row.get(5)?,
            table_record_id: row.get(6)?,
            lease_id: row.get(7)?,
            lease_op: row.get(8)?,
            created_at: row.get(9)?,
            updated_at: row.get(10)?,
            display_value: row.get(11)?,
            namespace: row.get(12)?,
            owner_type_name: row.get(13)?,
            source_table: row.get(14)?,
            revision: row.get(15)?,
        })
    }

    fn into_claim(self) -> Result<Claim, ClaimsError> {
        const T: &str = "claims";
        let lease = match self.lease_id {
            None if self.lease_op == 0 => None,
            Some(id) => Some(ClaimLease {
                lease_id: lease_id(T, &id)?,
                op: enum_value(T, "lease_op", self.lease_op, LeaseOp::from_number)?,
            }),
            None => {
                return Err(corrupt(
                    T,
                    format!("lease_op = {} without lease_id", self.lease_op),
                ))
            }
        };
        Ok(Claim {
            record: ClaimRecord {
                display: self.display_value,
                key: ClaimKey::new(
                    NamespaceId::of_row(self.claim_type, self.namespace.as_deref()).ok_or_else(
                        || {
                            corrupt(
                                T,
                                format!(
                                    "claim_type = {}, namespace = {:?}",
                                    self.claim_type, self.namespace
                                ),
                            )
                        },
                    )?,
                    self.claim_value,
                ),
                owner_type: OwnerType::from_stored(
                    self.owner_type,
                    self.owner_type_name.as_deref(),
                )
                .ok_or_else(|| {
                    let (number, name) = (self.owner_type, &self.owner_type_name);
                    corrupt(
                        T,
                        format!("owner_type = {number}, owner_type_name = {name:?}"),
                    )
                })?,
                owner_value: self.owner_value,
                table_name: TableName::from_stored(self.table_name, self.source_table.as_deref())
                    .ok_or_else(|| {
                    let (number, name) = (self.table_name, &self.source_table);
                    corrupt(T, format!("table_name = {number}, source_table = {name:?}"))
                })?,
                table_record_id: self.table_record_id,
            },
            cell_id: cell_id(T, &self.cell_id)?,
            lease,
            created_at: Timestamp::from_unix_micros(self.created_at),
            updated_at: Timestamp::from_unix_micros(self.updated_at),
            revision: u64::try_from(self.revision)
                .map_err(|_| corrupt(T, format!("revision = {}", self.revision)))?,
        })
    }
}

/// The events at or after `from`, at most `limit`, in log order (`claim_events`, whose columns
/// are the claim's, `revision` being the event's).
pub(crate) fn select_events(
    conn: &Connection,
    from: EventPosition,
    limit: usize,
) -> Result<Vec<ClaimEvent>, StoreError> {
    let mut statement = conn.prepare_cached(&format!(
        "SELECT {CLAIM_COLUMNS}, seq, deleted FROM claim_events \
         WHERE (revision, seq) >= (?1, ?2) ORDER BY revision, seq LIMIT ?3"
    ))?;
    let revision = i64::try_from(from.revision).unwrap_or(i64::MAX);
    let seq = i64::try_from(from.seq).unwrap_or(i64::MAX);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = statement
        .query_map(rusqlite::params![revision, seq, limit], |row| {
            Ok((
                ClaimRow::read(row)?,
                row.get::<_, i64>(16)?,
                row.get::<_, i64>(17)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    rows.into_iter()
        .map(|(row, seq, deleted)| {
            let claim = row.into_claim()?;
            Ok(ClaimEvent {
                position: EventPosition {
                    revision: claim.revision,
                    seq: u64::try_from(seq).unwrap_or_default(),
                },
                claim,
                deleted: deleted != 0,
            })
        })
        .collect::<Result<Vec<_>, ClaimsError>>()
        .map_err(StoreError::from)
}

/// `SELECT <claim columns> FROM claims <rest>`, decoded. `rest` is a constant of this crate.
pub(crate) fn select_claims(
    conn: &Connection,
    rest: &str,
    params: &[&dyn ToSql],
) -> Result<Vec<Claim>, StoreError> {
    let mut statement =
        conn.prepare_cached(&format!("SELECT {CLAIM_COLUMNS} FROM claims {rest}"))?;
    let rows = statement
        .query_map(params_from_iter(params.iter()), ClaimRow::read)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows
        .into_iter()
        .map(ClaimRow::into_claim)
        .collect::<Result<_, _>>()?)
}

/// The row of one claim key, if it exists.
pub(crate) fn claim_by_key(conn: &Connection, key: &ClaimKey) -> Result<Option<Claim>, StoreError> {
    let mut claims = select_claims(
        conn,
        "WHERE claim_type = ?1 AND claim_value = ?2",
        &[&key.namespace_number(), &key.value],
    )?;
    Ok(claims.pop())
}

/// The `leases_outstanding` columns in the order [`lease_from_row`] expects.
pub(crate) const LEASE_COLUMNS: &str = "lease_id, cell_id, request, created_at, last_renewed_at";

/// A `leases_outstanding` row as SQLite returns it, before validation.
pub(crate) struct LeaseRow {
    lease_id: String,
    cell_id: String,
    request: Vec<u8>,
    created_at: i64,
    last_renewed_at: i64,
}

impl LeaseRow {
    pub(crate) fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            lease_id: row.get(0)?,
            cell_id: row.get(1)?,
            request: row.get(2)?,
            created_at: row.get(3)?,
            last_renewed_at: row.get(4)?,
        })
    }

    pub(crate) fn into_lease(self) -> Result<Lease, ClaimsError> {
        const T: &str = "leases_outstanding";
        Ok(Lease {
            lease_id: lease_id(T, &self.lease_id)?,
            cell_id: cell_id(T, &self.cell_id)?,
            created_at: Timestamp::from_unix_micros(self.created_at),
            last_renewed_at: Timestamp::from_unix_micros(self.last_renewed_at),
            request: decode_request(&self.request)?,
        })
    }
}

/// What the store knows of a lease id: its outstanding row, else its remembered outcome.
pub(crate) fn lease_record(
    conn: &Connection,
    lease_id: LeaseId,
) -> Result<Option<LeaseRecord>, StoreError> {
    let id = lease_id_text(lease_id);
    let outstanding = conn
        .prepare_cached(&format!(
            "SELECT {LEASE_COLUMNS} FROM leases_outstanding WHERE lease_id = ?1"
        ))?
        .query_row([&id], LeaseRow::read)
        .optional()?;
    if let Some(row) = outstanding {
        return Ok(Some(LeaseRecord::Outstanding(row.into_lease()?)));
    }
    let ended = conn
        .prepare_cached(
            "SELECT cell_id, outcome, decided_at FROM lease_outcomes WHERE lease_id = ?1",
        )?
        .query_row([&id], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, i64>(2)?,
            ))
        })
        .optional()?;
    let Some((cell, outcome, decided_at)) = ended else {
        return Ok(None);
    };
    const T: &str = "lease_outcomes";
    Ok(Some(LeaseRecord::Ended(Outcome {
        lease_id,
        cell_id: cell_id(T, &cell)?,
        outcome: enum_value(T, "outcome", outcome, LeaseOutcome::from_number)?,
        decided_at: Timestamp::from_unix_micros(decided_at),
    })))
}

/// A ListClaims page: one range of claims_by_cell_table_record.
pub(crate) fn claims_page(
    conn: &Connection,
    query: &topology_claims::ClaimsQuery,
) -> Result<topology_claims::ClaimsPage, StoreError> {
    // One range of claims_by_cell_table_record: the row value starts the page after the cursor
    // (inside a record when it has a key), in exactly the index's order.
    let (record_id, claim_type, claim_value) = query.cursor.start_after();
    let rows = select_claims(
        conn,
        "WHERE cell_id = ?1 AND table_name = ?2 AND source_table IS ?7 \
         AND (table_record_id, claim_type, claim_value) > (?3, ?4, ?5) \
         ORDER BY table_record_id, claim_type, claim_value LIMIT ?6",
        &[
            &query.cell_id.as_str(),
            &query.table_name.store_number(),
            &record_id,
            &claim_type,
            &claim_value,
            &sql_limit(query.fetch_limit()),
            &query.table_name.stored_name(),
        ],
    )?;
    Ok(topology_claims::domain::claims_page(query, rows))
}

/// An SQL bound for a count of rows (`LIMIT`), saturating: a larger limit than SQLite can hold
/// means "all rows" anyway.
pub(crate) fn sql_limit(rows: usize) -> i64 {
    i64::try_from(rows).unwrap_or(i64::MAX)
}

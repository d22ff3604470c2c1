//! Rows ↔ domain values: decoding the column lists of `sql.rs` into claims, leases and outcomes,
//! and the parallel arrays that statements take for a batch of keys or records.
//!
//! A row that does not decode is corrupt data, reported as `Internal`; nothing here decides.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_postgres::types::ToSql;
use tokio_postgres::Row;
use topology_claims::codec::{decode_request, encode_request};
use topology_claims::domain::{
    CellLeases, LeaseRecord, LeaseSummary, NamespaceId, Outcome, RestoreEpoch, SlotHolder, SlotRow,
};
use topology_claims::{
    CellId, Claim, ClaimKey, ClaimLease, ClaimRecord, ClaimsError, Lease, LeaseId, LeaseOp,
    LeaseOutcome, OwnerType, TableName, Timestamp,
};

fn corrupt(what: &str, detail: impl std::fmt::Display) -> ClaimsError {
    ClaimsError::internal(format!("stored {what} row is invalid: {detail}"))
}

fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    index: usize,
    what: &str,
) -> Result<T, ClaimsError> {
    row.try_get(index).map_err(|e| corrupt(what, e))
}

fn number<T>(
    value: i16,
    from: fn(i64) -> Option<T>,
    what: &str,
    column: &str,
) -> Result<T, ClaimsError> {
    from(value.into()).ok_or_else(|| corrupt(what, format!("unknown {column} {value}")))
}

/// A database time as a domain timestamp (microseconds since the Unix epoch).
pub(crate) fn timestamp(time: SystemTime) -> Timestamp {
    let micros = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => Timestamp::from_unix_micros(micros(after)),
        Err(before) => Timestamp::from_unix_micros(-micros(before.duration())),
    }
}

/// A domain timestamp as a bindable time.
pub(crate) fn system_time(ts: Timestamp) -> SystemTime {
    let micros = ts.as_unix_micros();
    let magnitude = Duration::from_micros(micros.unsigned_abs());
    if micros >= 0 {
        UNIX_EPOCH + magnitude
    } else {
        UNIX_EPOCH - magnitude
    }
}

/// A row of `claim_columns!()`.
pub(crate) fn claim(row: &Row) -> Result<Claim, ClaimsError> {
    const W: &str = "claim";
    let record = ClaimRecord {
        display: get(row, 11, W)?,
        key: ClaimKey::new(
            {
                let number: i16 = get(row, 0, W)?;
                let column: Option<&str> = get(row, 12, W)?;
                NamespaceId::of_row(i64::from(number), column).ok_or_else(|| {
                    corrupt(W, format!("claim_type {number}, namespace {column:?}"))
                })?
            },
            get::<String>(row, 1, W)?,
        ),
        owner_type: {
            let (number, name): (i16, Option<&str>) = (get(row, 2, W)?, get(row, 13, W)?);
            OwnerType::from_stored(number.into(), name).ok_or_else(|| {
                corrupt(W, format!("owner_type {number}, owner_type_name {name:?}"))
            })?
        },
        owner_value: get(row, 3, W)?,
        table_name: {
            let (number, name): (i16, Option<&str>) = (get(row, 4, W)?, get(row, 14, W)?);
            TableName::from_stored(number.into(), name)
                .ok_or_else(|| corrupt(W, format!("table_name {number}, source_table {name:?}")))?
        },
        table_record_id: get(row, 5, W)?,
    };
    let cell_id = CellId::parse(get(row, 6, W)?).map_err(|e| corrupt(W, e))?;
    let lease = match (
        get::<Option<uuid::Uuid>>(row, 7, W)?,
        get::<Option<i16>>(row, 8, W)?,
    ) {
        (None, None) => None,
        (Some(id), Some(op)) => Some(ClaimLease {
            lease_id: LeaseId::from_uuid(id),
            op: number(op, LeaseOp::from_number, W, "lease_op")?,
        }),
        _ => {
            return Err(corrupt(
                W,
                "lease_id and lease_op must be both set or both null",
            ))
        }
    };
    Ok(Claim {
        record,
        cell_id,
        lease,
        created_at: timestamp(get(row, 9, W)?),
        updated_at: timestamp(get(row, 10, W)?),
        revision: {
            let revision: i64 = get(row, 15, W)?;
            u64::try_from(revision).map_err(|_| corrupt(W, format!("revision {revision}")))?
        },
    })
}

/// The claims of rows of `claim_columns!()`, by key.
pub(crate) fn claims_by_key(rows: &[Row]) -> Result<BTreeMap<ClaimKey, Claim>, ClaimsError> {
    rows.iter()
        .map(|row| claim(row).map(|c| (c.record.key.clone(), c)))
        .collect()
}

/// A row of `lease_columns!()`.
pub(crate) fn lease(row: &Row) -> Result<Lease, ClaimsError> {
    const W: &str = "lease";
    let request = decode_request(get(row, 2, W)?)?;
    Ok(Lease {
        lease_id: LeaseId::from_uuid(get(row, 0, W)?),
        cell_id: CellId::parse(get(row, 1, W)?).map_err(|e| corrupt(W, e))?,
        request,
        created_at: timestamp(get(row, 3, W)?),
        last_renewed_at: timestamp(get(row, 4, W)?),
    })
}

/// The rows of `sql::LEASE_SUMMARY`.
pub(crate) fn lease_summary(rows: &[Row]) -> Result<LeaseSummary, ClaimsError> {
    const W: &str = "lease summary";
    let Some(first) = rows.first() else {
        return Err(corrupt(W, "no row (the statement always returns one)"));
    };
    let server_time = timestamp(get(first, 0, W)?);
    let mut cells = Vec::with_capacity(rows.len());
    for row in rows {
        let Some(cell) = get::<Option<&str>>(row, 1, W)? else {
            continue; // no leases at all
        };
        let outstanding: i64 = get(row, 2, W)?;
        cells.push(CellLeases {
            cell_id: CellId::parse(cell).map_err(|e| corrupt(W, e))?,
            outstanding: u64::try_from(outstanding).map_err(|e| corrupt(W, e))?,
            oldest_created_at: timestamp(get(row, 3, W)?),
        });
    }
    Ok(LeaseSummary::from_cells(server_time, cells))
}

/// A `count(*)` row.
/// The store's clock and every slot row, from `sql::SELECT_SLOTS` (one row of `(now, NULL, …)`
/// when the table is empty).
pub(crate) fn slots(rows: &[Row]) -> Result<(Timestamp, Vec<SlotRow>), ClaimsError> {
    const W: &str = "verification_slots";
    let first = rows.first().ok_or_else(|| corrupt(W, "no clock row"))?;
    let now = timestamp(get(first, 0, W)?);
    let mut slots = Vec::with_capacity(rows.len());
    for row in rows {
        let Some(cell) = get::<Option<&str>>(row, 1, W)? else {
            continue;
        };
        let name: &str = get(row, 2, W)?;
        let cell_id = CellId::parse(cell).map_err(|e| corrupt(W, e))?;
        slots.push(SlotRow {
            holder: SlotHolder::new(cell_id, name).map_err(|e| corrupt(W, e))?,
            expires_at: timestamp(get(row, 3, W)?),
        });
    }
    Ok((now, slots))
}

/// Separates the cell ids of `restore_epochs.expected_cells` (a cell id never contains it).
const CELL_SEPARATOR: char = '\n';

/// The text of `restore_epochs.expected_cells`: the cell ids joined with `'\n'`.
pub(crate) fn cells_text(cells: &BTreeSet<CellId>) -> String {
    let ids: Vec<&str> = cells.iter().map(CellId::as_str).collect();
    ids.join(&CELL_SEPARATOR.to_string())
}

/// The store's clock and the latest restore epoch with its reports, from
/// `sql::SELECT_RESTORE_STATE` (always at least one row).
pub(crate) fn restore_state(
    rows: &[Row],
) -> Result<(Timestamp, Option<RestoreEpoch>), ClaimsError> {
    const W: &str = "restore_epochs";
    let first = rows.first().ok_or_else(|| corrupt(W, "no clock row"))?;
    let now = timestamp(get(first, 0, W)?);
    let Some(epoch) = get::<Option<i64>>(first, 1, W)? else {
        return Ok((now, None));
    };
    let expected_cells = get::<&str>(first, 5, W)?
        .split(CELL_SEPARATOR)
        .filter(|cell| !cell.is_empty())
        .map(|cell| CellId::parse(cell).map_err(|e| corrupt(W, e)))
        .collect::<Result<BTreeSet<_>, _>>()?;
    let lifted = match (get(first, 6, W)?, get::<Option<String>>(first, 7, W)?) {
        (None, None) => None,
        (Some(at), Some(reason)) => Some((timestamp(at), reason)),
        _ => return Err(corrupt(W, "lifted_at and lift_reason are not both set")),
    };
    let mut reported = BTreeMap::new();
    for row in rows {
        let Some(cell) = get::<Option<&str>>(row, 8, W)? else {
            continue; // no report yet
        };
        let cell_id = CellId::parse(cell).map_err(|e| corrupt("restore_reports", e))?;
        reported.insert(cell_id, timestamp(get(row, 9, W)?));
    }
    let state = RestoreEpoch {
        epoch: u64::try_from(epoch).map_err(|e| corrupt(W, e))?,
        backup_time: timestamp(get(first, 2, W)?),
        marked_at: timestamp(get(first, 3, W)?),
        reason: get(first, 4, W)?,
        expected_cells,
        reported,
        lifted,
    };
    Ok((now, Some(state)))
}

/// Cell ids, one per row (`sql::SELECT_HOLDING_CELLS`).
pub(crate) fn cells(rows: &[Row]) -> Result<BTreeSet<CellId>, ClaimsError> {
    rows.iter()
        .map(|row| CellId::parse(get(row, 0, "cell")?).map_err(|e| corrupt("cell", e)))
        .collect()
}

pub(crate) fn count(row: &Row) -> Result<u64, ClaimsError> {
    let n: i64 = get(row, 0, "count")?;
    u64::try_from(n).map_err(|e| corrupt("count", e))
}

/// A row of `lease_outcomes`.
pub(crate) fn outcome(row: &Row) -> Result<Outcome, ClaimsError> {
    const W: &str = "lease outcome";
    Ok(Outcome {
        lease_id: LeaseId::from_uuid(get(row, 0, W)?),
        cell_id: CellId::parse(get(row, 1, W)?).map_err(|e| corrupt(W, e))?,
        outcome: number(get(row, 2, W)?, LeaseOutcome::from_number, W, "outcome")?,
        decided_at: timestamp(get(row, 3, W)?),
    })
}

/// What the store knows of a lease id, from its (locked) lease and outcome rows. An outstanding
/// lease wins, as in `domain::Tables::lease_record`.
pub(crate) fn lease_record(
    lease_row: Option<Row>,
    outcome_row: Option<Row>,
) -> Result<Option<LeaseRecord>, ClaimsError> {
    if let Some(row) = lease_row {
        return Ok(Some(LeaseRecord::Outstanding(lease(&row)?)));
    }
    outcome_row
        .map(|row| outcome(&row).map(LeaseRecord::Ended))
        .transpose()
}

/// A protocol enum's wire number as the smallint column value.
pub(crate) fn small(number: i32) -> i16 {
    // Every protocol enum is a handful of small numbers (see domain::types); saturate anyway.
    i16::try_from(number).unwrap_or(i16::MAX)
}

/// Keys as the parallel arrays `unnest($types::smallint[], $values::text[])` takes, in key order
/// (the order locks and inserts are taken in).
#[derive(Default)]
pub(crate) struct KeyArrays<'a> {
    pub types: Vec<i16>,
    pub values: Vec<&'a str>,
}

impl<'a> KeyArrays<'a> {
    pub fn sorted(keys: impl IntoIterator<Item = &'a ClaimKey>) -> Self {
        let mut keys: Vec<&ClaimKey> = keys.into_iter().collect();
        keys.sort();
        Self {
            types: keys.iter().map(|k| small(k.namespace_number())).collect(),
            values: keys.iter().map(|k| k.value.as_str()).collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.types.is_empty()
    }
}

/// Claim records as the parallel arrays of `sql::INSERT_CLAIMS`, in key order.
pub struct RecordArrays<'a> {
    pub types: Vec<i16>,
    pub values: Vec<&'a str>,
    pub owner_types: Vec<i16>,
    pub owner_values: Vec<&'a str>,
    pub table_names: Vec<i16>,
    pub record_ids: Vec<i64>,
    pub displays: Vec<Option<&'a str>>,
    pub namespaces: Vec<Option<&'a str>>,
    pub owner_type_names: Vec<Option<&'a str>>,
    pub source_tables: Vec<Option<&'a str>>,
}

impl<'a> RecordArrays<'a> {
    pub fn sorted(records: &'a [ClaimRecord]) -> Self {
        let mut records: Vec<&ClaimRecord> = records.iter().collect();
        records.sort_by(|a, b| a.key.cmp(&b.key));
        Self {
            types: records
                .iter()
                .map(|r| small(r.key.namespace_number()))
                .collect(),
            values: records.iter().map(|r| r.key.value.as_str()).collect(),
            owner_types: records
                .iter()
                .map(|r| small(r.owner_type.store_number()))
                .collect(),
            owner_values: records.iter().map(|r| r.owner_value.as_str()).collect(),
            table_names: records
                .iter()
                .map(|r| small(r.table_name.store_number()))
                .collect(),
            record_ids: records.iter().map(|r| r.table_record_id).collect(),
            displays: records.iter().map(|r| r.display.as_deref()).collect(),
            namespaces: records
                .iter()
                .map(|r| r.key.namespace.row_column())
                .collect(),
            owner_type_names: records.iter().map(|r| r.owner_type.stored_name()).collect(),
            source_tables: records.iter().map(|r| r.table_name.stored_name()).collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.types.is_empty()
    }
}

/// The store's clock and the decommission marks, from `sql::GROUP_CLOCK_AND_DECOMMISSIONED`.
pub(crate) fn clock_and_marks(
    rows: &[Row],
) -> Result<(Timestamp, Vec<(CellId, Timestamp)>), ClaimsError> {
    const W: &str = "decommissioned_cells";
    let first = rows.first().ok_or_else(|| corrupt(W, "no clock row"))?;
    let now = timestamp(get(first, 0, W)?);
    let mut marks = Vec::new();
    for row in rows {
        let Some(cell) = get::<Option<&str>>(row, 1, W)? else {
            continue;
        };
        let cell_id = CellId::parse(cell).map_err(|e| corrupt(W, e))?;
        marks.push((cell_id, timestamp(get(row, 2, W)?)));
    }
    Ok((now, marks))
}

/// Whole claim rows as the fifteen parallel arrays of `sql::GROUP_INSERT_CLAIMS` and
/// `sql::GROUP_UPDATE_CLAIMS`, in key order.
#[derive(Default)]
pub(crate) struct ClaimRows<'a> {
    pub types: Vec<i16>,
    pub values: Vec<&'a str>,
    pub owner_types: Vec<i16>,
    pub owner_values: Vec<&'a str>,
    pub table_names: Vec<i16>,
    pub record_ids: Vec<i64>,
    pub cell_ids: Vec<&'a str>,
    pub lease_ids: Vec<Option<uuid::Uuid>>,
    pub lease_ops: Vec<Option<i16>>,
    pub created_at: Vec<SystemTime>,
    pub updated_at: Vec<SystemTime>,
    pub displays: Vec<Option<&'a str>>,
    pub namespaces: Vec<Option<&'a str>>,
    pub owner_type_names: Vec<Option<&'a str>>,
    pub source_tables: Vec<Option<&'a str>>,
}

impl<'a> ClaimRows<'a> {
    pub fn sorted(claims: &'a [Claim]) -> Self {
        let mut claims: Vec<&Claim> = claims.iter().collect();
        claims.sort_by(|a, b| a.record.key.cmp(&b.record.key));
        let mut rows = Self::default();
        for claim in claims {
            let record = &claim.record;
            rows.types.push(small(record.key.namespace_number()));
            rows.values.push(record.key.value.as_str());
            rows.owner_types
                .push(small(record.owner_type.store_number()));
            rows.owner_values.push(record.owner_value.as_str());
            rows.table_names
                .push(small(record.table_name.store_number()));
            rows.record_ids.push(record.table_record_id);
            rows.cell_ids.push(claim.cell_id.as_str());
            rows.lease_ids
                .push(claim.lease.map(|l| *l.lease_id.as_uuid()));
            rows.lease_ops
                .push(claim.lease.map(|l| small(l.op.number())));
            rows.created_at.push(system_time(claim.created_at));
            rows.updated_at.push(system_time(claim.updated_at));
            rows.displays.push(record.display.as_deref());
            rows.namespaces.push(record.key.namespace.row_column());
            rows.owner_type_names.push(record.owner_type.stored_name());
            rows.source_tables.push(record.table_name.stored_name());
        }
        rows
    }

    pub fn is_empty(&self) -> bool {
        self.types.is_empty()
    }

    /// The statement parameters `$1..$15`.
    pub fn params(&self) -> [&(dyn ToSql + Sync); 15] {
        [
            &self.types,
            &self.values,
            &self.owner_types,
            &self.owner_values,
            &self.table_names,
            &self.record_ids,
            &self.cell_ids,
            &self.lease_ids,
            &self.lease_ops,
            &self.created_at,
            &self.updated_at,
            &self.displays,
            &self.namespaces,
            &self.owner_type_names,
            &self.source_tables,
        ]
    }
}

/// New leases as the parallel arrays of `sql::GROUP_INSERT_LEASES`, in id order; the request is
/// stored as its protobuf bytes (`codec::encode_request`), as BeginUpdate stores it.
#[derive(Default)]
pub(crate) struct LeaseRows<'a> {
    pub ids: Vec<uuid::Uuid>,
    pub cell_ids: Vec<&'a str>,
    pub requests: Vec<Vec<u8>>,
    pub created_at: Vec<SystemTime>,
    pub last_renewed_at: Vec<SystemTime>,
}

impl<'a> LeaseRows<'a> {
    pub fn sorted(leases: &'a [Lease]) -> Self {
        let mut leases: Vec<&Lease> = leases.iter().collect();
        leases.sort_by_key(|l| l.lease_id);
        let mut rows = Self::default();
        for lease in leases {
            rows.ids.push(*lease.lease_id.as_uuid());
            rows.cell_ids.push(lease.cell_id.as_str());
            rows.requests.push(encode_request(&lease.request));
            rows.created_at.push(system_time(lease.created_at));
            rows.last_renewed_at
                .push(system_time(lease.last_renewed_at));
        }
        rows
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The statement parameters `$1..$5`.
    pub fn params(&self) -> [&(dyn ToSql + Sync); 5] {
        [
            &self.ids,
            &self.cell_ids,
            &self.requests,
            &self.created_at,
            &self.last_renewed_at,
        ]
    }
}

/// New outcomes as the parallel arrays of `sql::GROUP_INSERT_OUTCOMES`, in id order.
#[derive(Default)]
pub(crate) struct OutcomeRows<'a> {
    pub ids: Vec<uuid::Uuid>,
    pub cell_ids: Vec<&'a str>,
    pub outcomes: Vec<i16>,
    pub decided_at: Vec<SystemTime>,
}

impl<'a> OutcomeRows<'a> {
    pub fn sorted(outcomes: &'a [Outcome]) -> Self {
        let mut outcomes: Vec<&Outcome> = outcomes.iter().collect();
        outcomes.sort_by_key(|o| o.lease_id);
        let mut rows = Self::default();
        for outcome in outcomes {
            rows.ids.push(*outcome.lease_id.as_uuid());
            rows.cell_ids.push(outcome.cell_id.as_str());
            rows.outcomes.push(small(outcome.outcome.number()));
            rows.decided_at.push(system_time(outcome.decided_at));
        }
        rows
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The statement parameters `$1..$4`.
    pub fn params(&self) -> [&(dyn ToSql + Sync); 4] {
        [&self.ids, &self.cell_ids, &self.outcomes, &self.decided_at]
    }
}

/// Lease ids as a sorted `uuid[]` parameter.
pub(crate) fn lease_ids<'a>(ids: impl IntoIterator<Item = &'a LeaseId>) -> Vec<uuid::Uuid> {
    let mut ids: Vec<uuid::Uuid> = ids.into_iter().map(|id| *id.as_uuid()).collect();
    ids.sort();
    ids.dedup();
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use topology_claims::ClaimType;

    #[test]
    fn timestamps_round_trip_through_system_time() {
        for micros in [0, 1, -1, 1_700_000_000_123_456, -86_400_000_001] {
            let ts = Timestamp::from_unix_micros(micros);
            assert_eq!(timestamp(system_time(ts)), ts);
        }
    }

    #[test]
    fn key_arrays_are_in_key_order() {
        let keys = [
            ClaimKey::new(ClaimType::Email, "b"),
            ClaimKey::new(ClaimType::Routes, "z"),
            ClaimKey::new(ClaimType::Email, "a"),
        ];
        let arrays = KeyArrays::sorted(&keys);
        assert_eq!(arrays.types, vec![1, 3, 3]);
        assert_eq!(arrays.values, vec!["z", "a", "b"]);
    }
}

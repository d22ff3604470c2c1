//! Rows ↔ domain values: the column lists, decoding of `claims` / `leases_outstanding` /
//! `lease_outcomes` rows, keys, and the mutations that write each decision.
//!
//! Owns the mapping between the schema (see `schema.rs`) and the domain types. Must not decide
//! which rows to write: callers pass what `topology_claims::domain` decided.

use std::future::Future;

use gcloud_gax::grpc::Status;
use gcloud_googleapis::spanner::v1::Mutation;
use gcloud_spanner::key::Key;
use gcloud_spanner::mutation::{delete, insert, update};
use gcloud_spanner::reader::{Reader, RowIterator};
use gcloud_spanner::row::Row;
use gcloud_spanner::statement::ToKind;
use gcloud_spanner::value::CommitTimestamp;
use topology_claims::codec::{decode_request, encode_request, timestamp_from_pb, timestamp_to_pb};
use topology_claims::domain::{
    CellLeases, GroupWrites, LeaseOutcome, NamespaceId, Outcome, SlotHolder, SlotRow,
};
use topology_claims::{
    BeginUpdate, CellId, Claim, ClaimKey, ClaimLease, ClaimRecord, ClaimsError, Lease, LeaseId,
    LeaseOp, OwnerType, TableName, Timestamp,
};

pub(crate) const CLAIMS: &str = "claims";
pub(crate) const LEASES: &str = "leases_outstanding";
pub(crate) const OUTCOMES: &str = "lease_outcomes";
pub(crate) const DECOMMISSIONED: &str = "decommissioned_cells";
pub(crate) const SLOTS: &str = "verification_slots";

/// `claims.lease_op` of a claim under no lease (the design's "no-op").
const NO_LEASE_OP: i64 = 0;

/// The columns of a `claims` row as read (a write names the first 15: `revision_at` is
/// stamped by `WriteTx::buffer_write`).
pub(crate) const CLAIM_COLUMNS: [&str; 16] = [
    "claim_type",
    "claim_value",
    "owner_type",
    "owner_value",
    "cell_id",
    "table_name",
    "table_record_id",
    "lease_id",
    "lease_op",
    "display_value",
    "namespace",
    "owner_type_name",
    "source_table",
    "created_at",
    "updated_at",
    "revision_at",
];
pub(crate) const LEASE_COLUMNS: [&str; 5] = [
    "lease_id",
    "cell_id",
    "request",
    "created_at",
    "last_renewed_at",
];
pub(crate) const OUTCOME_COLUMNS: [&str; 4] = ["lease_id", "cell_id", "outcome", "decided_at"];
pub(crate) const DECOMMISSIONED_COLUMNS: [&str; 2] = ["cell_id", "decommissioned_at"];

/// The comma-separated column list for SQL.
pub(crate) fn select_list(columns: &[&str]) -> String {
    columns.join(", ")
}

pub(crate) fn corrupt(what: &str, detail: impl std::fmt::Display) -> ClaimsError {
    ClaimsError::internal(format!("stored {what} is invalid: {detail}"))
}

pub(crate) fn column<T: gcloud_spanner::row::TryFromValue>(
    row: &Row,
    name: &str,
) -> Result<T, ClaimsError> {
    row.column_by_name(name).map_err(|e| corrupt("row", e))
}

pub(crate) fn timestamp(row: &Row, name: &str) -> Result<Timestamp, ClaimsError> {
    let value: prost_types::Timestamp = column(row, name)?;
    Ok(timestamp_from_pb(&value))
}

fn lease_id(text: &str) -> Result<LeaseId, ClaimsError> {
    LeaseId::parse(text).map_err(|e| corrupt("lease id", e))
}

pub(crate) fn cell_id(text: &str) -> Result<CellId, ClaimsError> {
    CellId::parse(text).map_err(|e| corrupt("cell id", e))
}

fn enum_value<T>(number: i64, what: &str, from: fn(i64) -> Option<T>) -> Result<T, ClaimsError> {
    from(number).ok_or_else(|| corrupt(what, format!("unknown value {number}")))
}

/// A `claims` row read with [`CLAIM_COLUMNS`].
pub(crate) fn claim_from_row(row: &Row) -> Result<Claim, ClaimsError> {
    let number: i64 = column(row, "claim_type")?;
    let namespace: Option<String> = column(row, "namespace")?;
    let claim_type = NamespaceId::of_row(number, namespace.as_deref()).ok_or_else(|| {
        corrupt(
            "claim",
            format!("claim_type {number}, namespace {namespace:?}"),
        )
    })?;
    let lease_id: Option<String> = column(row, "lease_id")?;
    let lease_op: i64 = column(row, "lease_op")?;
    let lease = match (lease_id, lease_op) {
        (None, NO_LEASE_OP) => None,
        (Some(id), op) => Some(ClaimLease {
            lease_id: self::lease_id(&id)?,
            op: enum_value(op, "lease_op", LeaseOp::from_number)?,
        }),
        (None, op) => {
            return Err(corrupt(
                "claim",
                format!("lease_op {op} without a lease_id"),
            ))
        }
    };
    Ok(Claim {
        record: ClaimRecord {
            display: column(row, "display_value")?,
            key: ClaimKey::new(claim_type, column::<String>(row, "claim_value")?),
            owner_type: {
                let number: i64 = column(row, "owner_type")?;
                let name: Option<String> = column(row, "owner_type_name")?;
                OwnerType::from_stored(number, name.as_deref()).ok_or_else(|| {
                    corrupt(
                        "claim",
                        format!("owner_type {number}, owner_type_name {name:?}"),
                    )
                })?
            },
            owner_value: column(row, "owner_value")?,
            table_name: {
                let number: i64 = column(row, "table_name")?;
                let name: Option<String> = column(row, "source_table")?;
                TableName::from_stored(number, name.as_deref()).ok_or_else(|| {
                    corrupt(
                        "claim",
                        format!("table_name {number}, source_table {name:?}"),
                    )
                })?
            },
            table_record_id: column(row, "table_record_id")?,
        },
        cell_id: cell_id(&column::<String>(row, "cell_id")?)?,
        lease,
        created_at: timestamp(row, "created_at")?,
        updated_at: timestamp(row, "updated_at")?,
        // NULL for a row last written before the change feed (migration 0008).
        revision: column::<Option<prost_types::Timestamp>>(row, "revision_at")?
            .map_or(0, |t| crate::watch::revision_of(&t)),
    })
}

/// A `leases_outstanding` row read with [`LEASE_COLUMNS`].
pub(crate) fn lease_from_row(row: &Row) -> Result<Lease, ClaimsError> {
    let request: Vec<u8> = column(row, "request")?;
    Ok(Lease {
        lease_id: lease_id(&column::<String>(row, "lease_id")?)?,
        cell_id: cell_id(&column::<String>(row, "cell_id")?)?,
        created_at: timestamp(row, "created_at")?,
        last_renewed_at: timestamp(row, "last_renewed_at")?,
        request: decode_request(&request)?,
    })
}

/// A `lease_outcomes` row read with [`OUTCOME_COLUMNS`].
pub(crate) fn outcome_from_row(row: &Row) -> Result<Outcome, ClaimsError> {
    Ok(Outcome {
        lease_id: lease_id(&column::<String>(row, "lease_id")?)?,
        cell_id: cell_id(&column::<String>(row, "cell_id")?)?,
        outcome: enum_value(
            column(row, "outcome")?,
            "outcome",
            LeaseOutcome::from_number,
        )?,
        decided_at: timestamp(row, "decided_at")?,
    })
}

/// A row of the lease summary query: `cell_id`, `outstanding`, `oldest`.
pub(crate) fn cell_leases_from_row(row: &Row) -> Result<CellLeases, ClaimsError> {
    let outstanding: i64 = column(row, "outstanding")?;
    Ok(CellLeases {
        cell_id: cell_id(&column::<String>(row, "cell_id")?)?,
        outstanding: u64::try_from(outstanding).map_err(|e| corrupt("lease count", e))?,
        oldest_created_at: timestamp(row, "oldest")?,
    })
}

/// The `n` of a `SELECT COUNT(*) AS n` row.
pub(crate) fn count_from_row(row: &Row) -> Result<u64, ClaimsError> {
    let n: i64 = column(row, "n")?;
    u64::try_from(n).map_err(|e| corrupt("count", e))
}

/// The primary key of a claim read as `claim_type`, `claim_value`.
pub(crate) fn claim_key_from_row(row: &Row) -> Result<Key, ClaimsError> {
    let claim_type: i64 = column(row, "claim_type")?;
    let claim_value: String = column(row, "claim_value")?;
    Ok(Key::composite(&[&claim_type, &claim_value]))
}

/// The primary key of a decommission mark.
pub(crate) fn decommissioned_key(cell: &CellId) -> Key {
    Key::new(&cell.as_str())
}

/// A `decommissioned_cells` row read with [`DECOMMISSIONED_COLUMNS`].
pub(crate) fn decommissioned_from_row(row: &Row) -> Result<(CellId, Timestamp), ClaimsError> {
    Ok((
        cell_id(&column::<String>(row, "cell_id")?)?,
        timestamp(row, "decommissioned_at")?,
    ))
}

/// The decommission mark of a cell, stamped with the commit timestamp.
pub(crate) fn insert_decommissioned(cell: &CellId) -> Mutation {
    insert(
        DECOMMISSIONED,
        &DECOMMISSIONED_COLUMNS,
        &[&cell.as_str(), &CommitTimestamp::new()],
    )
}

/// A `verification_slots` row read as `cell_id`, `holder`, `expires_at`.
pub(crate) fn slot_from_row(row: &Row) -> Result<SlotRow, ClaimsError> {
    let holder: String = column(row, "holder")?;
    let cell: String = column(row, "cell_id")?;
    Ok(SlotRow {
        holder: SlotHolder::new(cell_id(&cell)?, &holder).map_err(|e| corrupt("slot holder", e))?,
        expires_at: timestamp(row, "expires_at")?,
    })
}

/// `now` of a `SELECT CURRENT_TIMESTAMP() AS now`.
pub(crate) fn now_from_row(row: &Row) -> Result<Timestamp, ClaimsError> {
    timestamp(row, "now")
}

/// The primary key of a slot row.
pub(crate) fn slot_key(holder: &SlotHolder) -> Key {
    Key::composite(&[&holder.cell_id.as_str(), &holder.holder.as_str()])
}

/// Takes or renews `holder`'s slot until `expires_at`.
pub(crate) fn upsert_slot(holder: &SlotHolder, expires_at: Timestamp) -> Mutation {
    gcloud_spanner::mutation::insert_or_update(
        SLOTS,
        &["cell_id", "holder", "expires_at"],
        &[
            &holder.cell_id.as_str(),
            &holder.holder.as_str(),
            &timestamp_to_pb(expires_at),
        ],
    )
}

pub(crate) fn delete_slots(keys: Vec<Key>) -> Mutation {
    delete(SLOTS, keys)
}

/// The primary key of a claim.
pub(crate) fn claim_key(key: &ClaimKey) -> Key {
    Key::composite(&[&i64::from(key.namespace_number()), &key.value])
}

/// The primary key of a lease (and of its outcome).
pub(crate) fn lease_key(lease_id: LeaseId) -> Key {
    Key::new(&lease_id.to_string())
}

/// A new claim, leased for creation by `lease_id`. `insert` fails at commit if the row exists:
/// the primary key is the second line of defence behind the domain's check.
pub(crate) fn insert_claim(record: &ClaimRecord, owner: &CellId, lease_id: LeaseId) -> Mutation {
    insert(
        CLAIMS,
        &CLAIM_COLUMNS[..15],
        &[
            &i64::from(record.key.namespace_number()),
            &record.key.value,
            &i64::from(record.owner_type.store_number()),
            &record.owner_value,
            &owner.as_str(),
            &i64::from(record.table_name.store_number()),
            &record.table_record_id,
            &lease_id.to_string(),
            &i64::from(LeaseOp::Create.number()),
            &record.display,
            &record.key.namespace.row_column(),
            &record.owner_type.stored_name(),
            &record.table_name.stored_name(),
            &CommitTimestamp::new(),
            &CommitTimestamp::new(),
        ],
    )
}

/// Marks a committed claim as leased by `lease_id` for destruction or update (`update` fails at
/// commit if the row is gone).
pub(crate) fn mark_claim(key: &ClaimKey, lease_id: LeaseId, op: LeaseOp) -> Mutation {
    set_claim_lease(key, Some(lease_id.to_string()), i64::from(op.number()))
}

/// A committed update: the claim takes `record`'s owner type, owner value, table name and record
/// id, and its lease is cleared. Spanner keeps `claims_by_table_record` in step.
pub(crate) fn replace_claim(record: &ClaimRecord) -> Mutation {
    update(
        CLAIMS,
        &[
            "claim_type",
            "claim_value",
            "owner_type",
            "owner_value",
            "table_name",
            "table_record_id",
            "lease_id",
            "lease_op",
            "display_value",
            "owner_type_name",
            "source_table",
            "updated_at",
        ],
        &[
            &i64::from(record.key.namespace_number()),
            &record.key.value,
            &i64::from(record.owner_type.store_number()),
            &record.owner_value,
            &i64::from(record.table_name.store_number()),
            &record.table_record_id,
            &None::<String>,
            &NO_LEASE_OP,
            &record.display,
            &record.owner_type.stored_name(),
            &record.table_name.stored_name(),
            &CommitTimestamp::new(),
        ],
    )
}

/// A whole claim row as a group decided it (`domain::GroupWrites`): `insert` for a claim the
/// group created (fails at commit if the row appeared meanwhile), else `update` of every column
/// (fails if the row is gone). A timestamp equal to `fresh`, the stand-in clock the group was
/// decided at, is written as the commit timestamp; an older one is the row's own and is left
/// out of the update (Spanner keeps nanoseconds that the domain's microseconds would cut).
pub(crate) fn write_claim(claim: &Claim, fresh: Timestamp, existing: bool) -> Mutation {
    let record = &claim.record;
    let claim_type = i64::from(record.key.namespace_number());
    let owner_type = i64::from(record.owner_type.store_number());
    let table_name = i64::from(record.table_name.store_number());
    let lease_id = claim.lease.map(|l| l.lease_id.to_string());
    let lease_op = claim
        .lease
        .map_or(NO_LEASE_OP, |l| i64::from(l.op.number()));
    let stamp = CommitTimestamp::new();
    let created_at = timestamp_to_pb(claim.created_at);
    let updated_at = timestamp_to_pb(claim.updated_at);
    let cell = claim.cell_id.as_str();
    let namespace = record.key.namespace.row_column();
    let (owner_type_name, source_table) = (
        record.owner_type.stored_name(),
        record.table_name.stored_name(),
    );
    let mut columns: Vec<&str> = CLAIM_COLUMNS[..13].to_vec();
    let mut values: Vec<&dyn ToKind> = vec![
        &claim_type,
        &record.key.value,
        &owner_type,
        &record.owner_value,
        &cell,
        &table_name,
        &record.table_record_id,
        &lease_id,
        &lease_op,
        &record.display,
        &namespace,
        &owner_type_name,
        &source_table,
    ];
    for (column, value, pb) in [
        ("created_at", claim.created_at, &created_at),
        ("updated_at", claim.updated_at, &updated_at),
    ] {
        if value == fresh {
            columns.push(column);
            values.push(&stamp);
        } else if !existing {
            columns.push(column);
            values.push(pb);
        }
    }
    if existing {
        update(CLAIMS, &columns, &values)
    } else {
        insert(CLAIMS, &columns, &values)
    }
}

/// Clears the lease from a claim (it becomes, or stays, committed).
pub(crate) fn release_claim(key: &ClaimKey) -> Mutation {
    set_claim_lease(key, None, NO_LEASE_OP)
}

fn set_claim_lease(key: &ClaimKey, lease_id: Option<String>, lease_op: i64) -> Mutation {
    update(
        CLAIMS,
        &[
            "claim_type",
            "claim_value",
            "lease_id",
            "lease_op",
            "updated_at",
        ],
        &[
            &i64::from(key.namespace_number()),
            &key.value,
            &lease_id,
            &lease_op,
            &CommitTimestamp::new(),
        ],
    )
}

pub(crate) fn delete_claims(keys: Vec<Key>) -> Mutation {
    delete(CLAIMS, keys)
}

/// The lease row of a BeginUpdate, holding the original request as sent.
pub(crate) fn insert_lease(lease_id: LeaseId, request: &BeginUpdate) -> Mutation {
    insert(
        LEASES,
        &LEASE_COLUMNS,
        &[
            &lease_id.to_string(),
            &request.cell_id.as_str(),
            &encode_request(request),
            &CommitTimestamp::new(),
            &CommitTimestamp::new(),
        ],
    )
}

pub(crate) fn renew_lease(lease_id: LeaseId) -> Mutation {
    update(
        LEASES,
        &["lease_id", "last_renewed_at"],
        &[&lease_id.to_string(), &CommitTimestamp::new()],
    )
}

pub(crate) fn delete_lease(lease_id: LeaseId) -> Mutation {
    delete(LEASES, lease_key(lease_id))
}

pub(crate) fn delete_leases(keys: Vec<Key>) -> Mutation {
    delete(LEASES, keys)
}

/// The remembered end of a lease, decided now (commit timestamp).
pub(crate) fn insert_outcome(
    lease_id: LeaseId,
    cell_id: &CellId,
    outcome: LeaseOutcome,
) -> Mutation {
    insert(
        OUTCOMES,
        &["lease_id", "cell_id", "outcome", "decided_at"],
        &[
            &lease_id.to_string(),
            &cell_id.as_str(),
            &i64::from(outcome.number()),
            &CommitTimestamp::new(),
        ],
    )
}

pub(crate) fn delete_outcomes(keys: Vec<Key>) -> Mutation {
    delete(OUTCOMES, keys)
}

/// The mutations of a decided group (`domain::GroupWrites`), decided at the stand-in clock
/// `fresh`. Inserts are `insert` and updates `update`, never `insert_or_update`: a row that
/// appeared or vanished since the transaction read it fails the commit, which re-runs the group.
/// Every lease and outcome a group inserts was begun or decided by it, at `fresh`: they are
/// stamped with the commit timestamp.
pub(crate) fn group_mutations(writes: &GroupWrites, fresh: Timestamp) -> Vec<Mutation> {
    let mut mutations = Vec::with_capacity(
        writes.insert_claims.len()
            + writes.update_claims.len()
            + writes.insert_leases.len()
            + writes.insert_outcomes.len()
            + 2,
    );
    if !writes.delete_claims.is_empty() {
        mutations.push(delete_claims(
            writes.delete_claims.iter().map(claim_key).collect(),
        ));
    }
    mutations.extend(
        writes
            .insert_claims
            .iter()
            .map(|c| write_claim(c, fresh, false)),
    );
    mutations.extend(
        writes
            .update_claims
            .iter()
            .map(|c| write_claim(c, fresh, true)),
    );
    mutations.extend(
        writes
            .insert_leases
            .iter()
            .map(|lease| insert_lease(lease.lease_id, &lease.request)),
    );
    if !writes.delete_leases.is_empty() {
        mutations.push(delete_leases(
            writes
                .delete_leases
                .iter()
                .map(|id| lease_key(*id))
                .collect(),
        ));
    }
    mutations.extend(
        writes
            .insert_outcomes
            .iter()
            .map(|o| insert_outcome(o.lease_id, &o.cell_id, o.outcome)),
    );
    mutations
}

/// Every row of a read or query: the call that opens it, then its stream, as one future (so one
/// deadline bounds both).
pub(crate) async fn all_rows<'a, R: Reader>(
    opened: impl Future<Output = Result<RowIterator<'a, R>, Status>>,
) -> Result<Vec<Row>, Status> {
    let mut found = opened.await?;
    let mut rows = Vec::new();
    while let Some(row) = found.next().await? {
        rows.push(row);
    }
    Ok(rows)
}

/// Rows one mutation writes or deletes (a key range counts as one): what a commit's deadline is
/// sized by.
pub(crate) fn mutation_rows(mutation: &Mutation) -> usize {
    use gcloud_googleapis::spanner::v1::mutation::Operation;
    match &mutation.operation {
        Some(
            Operation::Insert(write)
            | Operation::Update(write)
            | Operation::InsertOrUpdate(write)
            | Operation::Replace(write),
        ) => write.values.len(),
        Some(Operation::Delete(delete)) => delete
            .key_set
            .as_ref()
            .map_or(1, |keys| keys.keys.len() + keys.ranges.len()),
        None => 0,
    }
}

/// Rows a group's writes touch (Spanner's mutation limit counts per row and column).
pub(crate) fn rows_written(writes: &GroupWrites) -> usize {
    writes.insert_claims.len()
        + writes.update_claims.len()
        + writes.delete_claims.len()
        + writes.insert_leases.len()
        + writes.delete_leases.len()
        + writes.insert_outcomes.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use topology_claims_testkit::fixtures::username;

    #[test]
    fn a_mutation_counts_the_rows_it_writes_or_deletes() {
        let keys: Vec<ClaimKey> = ["a", "b", "c"].map(|v| username(v).key).into();
        assert_eq!(mutation_rows(&release_claim(&keys[0])), 1);
        assert_eq!(
            mutation_rows(&delete_claims(keys.iter().map(claim_key).collect())),
            3
        );
        assert_eq!(mutation_rows(&Mutation { operation: None }), 0);
    }
}

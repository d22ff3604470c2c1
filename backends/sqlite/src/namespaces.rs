//! The `namespaces` table: reading the rules a decision is made under, and adopting
//! `precis-username` for the built-ins a migration added (`domain::decide_adoption`).
//!
//! Owns the table's SQL. Must not decide anything: the rows go to the domain as a
//! [`NamespaceSet`], and what it decided is written back.

use rusqlite::{Connection, OptionalExtension, Row};
use topology_claims::domain::{
    self, Adoption, NamespaceId, NamespaceRow, NamespaceSet, NamespaceSpec, NamespaceUpdate,
    ProofClaim, Rekey, StoredNamespace, ADOPTION_PENDING_VERSION,
};

use crate::error::StoreError;
use crate::rows::corrupt;

const NAMESPACE_COLUMNS: &str =
    "number, id, normalization, max_chars, pattern, reserved, description, deprecated, version";

fn read_row(row: &Row<'_>) -> rusqlite::Result<NamespaceRow> {
    Ok(NamespaceRow {
        number: row.get(0)?,
        id: row.get(1)?,
        normalization: row.get(2)?,
        max_chars: row.get(3)?,
        pattern: row.get(4)?,
        reserved: row.get(5)?,
        description: row.get(6)?,
        deprecated: row.get::<_, i64>(7)? != 0,
        version: row.get(8)?,
    })
}

/// Every namespace, read in the caller's transaction (administrative calls).
pub(crate) fn read_namespaces(conn: &Connection) -> Result<NamespaceSet, StoreError> {
    let mut statement =
        conn.prepare_cached(&format!("SELECT {NAMESPACE_COLUMNS} FROM namespaces"))?;
    let rows = statement
        .query_map([], read_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let stored = rows
        .iter()
        .map(|row| row.to_stored().map_err(|e| corrupt("namespaces", e)))
        .collect::<Result<Vec<StoredNamespace>, _>>()?;
    Ok(NamespaceSet::new(stored))
}

/// The namespaces `ids`, read in the caller's transaction: a point read each (what a
/// BeginUpdate or a lookup names, a handful), whatever the number the store holds.
pub(crate) fn read_named(
    conn: &Connection,
    ids: impl IntoIterator<Item = NamespaceId>,
) -> Result<NamespaceSet, StoreError> {
    let mut statement = conn.prepare_cached(&format!(
        "SELECT {NAMESPACE_COLUMNS} FROM namespaces WHERE id = ?1"
    ))?;
    let mut stored = Vec::new();
    for id in ids.into_iter().collect::<std::collections::BTreeSet<_>>() {
        if let Some(row) = statement.query_row([id.as_str()], read_row).optional()? {
            stored.push(row.to_stored().map_err(|e| corrupt("namespaces", e))?);
        }
    }
    Ok(NamespaceSet::new(stored))
}

/// Decides and writes the adoption of every pending built-in, in the caller's write transaction;
/// returns what was decided, for the log.
pub(crate) fn adopt_builtins(tx: &Connection) -> Result<Vec<(String, Adoption)>, StoreError> {
    let pending: Vec<StoredNamespace> = read_namespaces(tx)?
        .iter()
        .filter(|s| s.namespace.version == ADOPTION_PENDING_VERSION)
        .cloned()
        .collect();
    let mut decided = Vec::with_capacity(pending.len());
    for stored in pending {
        let claims = proof_claims(tx, stored.number)?;
        let adoption = domain::decide_adoption(&stored.namespace, &claims);
        match &adoption {
            Adoption::Adopt { namespace, rekeys } => {
                rekey(tx, stored.number, rekeys)?;
                write_namespace(tx, stored.number, namespace)?;
            }
            Adoption::KeepExact { namespace, .. } => {
                write_namespace(tx, stored.number, namespace)?;
            }
            Adoption::Wait { .. } => {}
        }
        decided.push((stored.namespace.id.to_string(), adoption));
    }
    Ok(decided)
}

/// Every claim of namespace `number`, as a proof reads it.
fn proof_claims(tx: &Connection, number: i32) -> Result<Vec<ProofClaim>, StoreError> {
    let mut statement = tx.prepare(
        "SELECT claim_value, COALESCE(display_value, claim_value), lease_id IS NOT NULL \
         FROM claims WHERE claim_type = ?1",
    )?;
    let rows = statement.query_map([number], |row| {
        Ok(ProofClaim {
            key: row.get(0)?,
            display_value: row.get(1)?,
            leased: row.get(2)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

/// Rewrites the keys of `rekeys`; each claim keeps its display form (the value as its cell sent
/// it). No two new keys are equal and none equals a key that stays (the proof), but a new key
/// may be another rewritten claim's old one: every row moves to a placeholder key first.
fn rekey(tx: &Connection, number: i32, rekeys: &[Rekey]) -> Result<(), StoreError> {
    let mut park = tx.prepare(
        "UPDATE claims SET claim_value = ?3, display_value = COALESCE(display_value, claim_value) \
         WHERE claim_type = ?1 AND claim_value = ?2",
    )?;
    for (i, change) in rekeys.iter().enumerate() {
        // A control character never appears in a key: the placeholder collides with nothing.
        park.execute((number, &change.old_key, format!("\u{1}{i}")))?;
    }
    let mut place = tx.prepare(
        "UPDATE claims SET claim_value = ?3, display_value = NULLIF(display_value, ?3) \
         WHERE claim_type = ?1 AND claim_value = ?2",
    )?;
    for (i, change) in rekeys.iter().enumerate() {
        place.execute((number, format!("\u{1}{i}"), &change.new_key))?;
    }
    Ok(())
}

/// CreateNamespace (see `ClaimStore::create_namespace`), in the caller's write transaction.
pub(crate) fn create_namespace(
    tx: &Connection,
    spec: NamespaceSpec,
    max: usize,
) -> Result<StoredNamespace, StoreError> {
    let created = domain::decide_create_namespace(&read_namespaces(tx)?, spec, max)?;
    let row = NamespaceRow::of(&created);
    tx.execute(
        &format!(
            "INSERT INTO namespaces ({NAMESPACE_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
        ),
        (
            row.number,
            &row.id,
            row.normalization,
            row.max_chars,
            &row.pattern,
            &row.reserved,
            &row.description,
            row.deprecated,
            row.version,
        ),
    )?;
    Ok(created)
}

/// DeleteNamespace (see `ClaimStore::delete_namespace`), in the caller's write transaction.
pub(crate) fn delete_namespace(tx: &Connection, id: &str) -> Result<(), StoreError> {
    let namespaces = read_namespaces(tx)?;
    let number = namespaces.find(id)?.number;
    let held: i64 = tx.query_row(
        "SELECT count(*) FROM claims WHERE claim_type = ?1",
        [number],
        |row| row.get(0),
    )?;
    let number = domain::decide_delete_namespace(&namespaces, id, held.max(0) as u64)?;
    tx.execute("DELETE FROM namespaces WHERE number = ?1", [number])?;
    Ok(())
}

/// UpdateNamespace (see `ClaimStore::update_namespace`), in the caller's write transaction.
pub(crate) fn update_namespace(
    tx: &Connection,
    id: &str,
    update: NamespaceUpdate,
) -> Result<StoredNamespace, StoreError> {
    let current = read_namespaces(tx)?.find(id)?.clone();
    let change =
        domain::decide_rules_change(&current, update, || proof_claims(tx, current.number))??;
    rekey(tx, current.number, &change.rekeys)?;
    write_namespace(tx, current.number, &change.next.namespace)?;
    Ok(change.next)
}

fn write_namespace(
    tx: &Connection,
    number: i32,
    namespace: &topology_claims::domain::Namespace,
) -> Result<(), StoreError> {
    let row = NamespaceRow::of(&StoredNamespace {
        number,
        namespace: namespace.clone(),
    });
    tx.execute(
        "UPDATE namespaces SET normalization = ?2, max_chars = ?3, pattern = ?4, reserved = ?5, \
         description = ?6, deprecated = ?7, version = ?8 WHERE number = ?1",
        (
            row.number,
            row.normalization,
            row.max_chars,
            row.pattern,
            row.reserved,
            row.description,
            row.deprecated,
            row.version,
        ),
    )?;
    Ok(())
}

/// How many claims each namespace holding any has (`ClaimStore::count_claims`): one scan.
pub(crate) fn count_claims(conn: &Connection) -> Result<Vec<(NamespaceId, u64)>, StoreError> {
    let mut statement = conn.prepare_cached(
        "SELECT claim_type, namespace, count(*) FROM claims GROUP BY claim_type, namespace",
    )?;
    let rows = statement.query_map([], |row| {
        Ok((
            row.get::<_, i64>(0)?,
            row.get::<_, Option<String>>(1)?,
            row.get::<_, i64>(2)?,
        ))
    })?;
    let mut counts = Vec::new();
    for row in rows {
        let (number, namespace, count) = row?;
        let id = NamespaceId::of_row(number, namespace.as_deref()).ok_or_else(|| {
            corrupt(
                "claims",
                format!("claim_type = {number}, namespace = {namespace:?}"),
            )
        })?;
        counts.push((id, u64::try_from(count).unwrap_or(0)));
    }
    counts.sort();
    Ok(counts)
}

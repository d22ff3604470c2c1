//! The `namespaces` table: the rules a decision is made under, a cache of them that every
//! deciding transaction checks against the rows it reads, and the adoption of `precis-username`
//! by the built-ins a migration added (`domain::decide_adoption`).
//!
//! ## Why a checked cache
//! A BeginUpdate needs its keys before its first flight: they are what it locks and reads. So it
//! computes them under the rules this store last saw ([`NamespaceCache`]), and the same flight
//! reads the rows of the namespaces it names ([`sql::SELECT_NAMESPACES`], after the claim rows).
//! If a row differs from the rules used, the cache takes the rows and the attempt is retried, so
//! every decision is made under the rules read in its own transaction (decision 108) at no
//! extra round trip. A refusal under cached rules (an unknown namespace, a value a rule refuses)
//! is confirmed against a fresh read before it is returned.
//!
//! Owns nothing of the protocol: the rows go to the domain, and what it decided is written.

use std::sync::{Arc, RwLock};

use tokio_postgres::{GenericClient, Row};
use topology_claims::domain::{
    self, Adoption, NamespaceId, NamespaceRow, NamespaceSet, NamespaceSpec, NamespaceUpdate,
    ProofClaim, StoredNamespace,
};
use topology_claims::ClaimsError;

use crate::error::{Contended, Failure};
use crate::rows::small;
use crate::session::Session;
use crate::sql;

/// The rules this store last read.
pub(crate) struct NamespaceCache(RwLock<Arc<NamespaceSet>>);

impl NamespaceCache {
    pub fn new(set: NamespaceSet) -> Self {
        Self(RwLock::new(Arc::new(set)))
    }

    pub fn current(&self) -> Arc<NamespaceSet> {
        Arc::clone(&self.0.read().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn replace(&self, set: NamespaceSet) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(set);
    }

    /// Checks the rules a decision used against the rows of `named` read in its transaction;
    /// when they differ the cache takes the rows and the attempt is retried.
    pub fn confirm_read(
        &self,
        used: &NamespaceSet,
        named: impl IntoIterator<Item = NamespaceId>,
        rows: &[Row],
    ) -> Result<(), Failure> {
        if self.confirm(used, named, from_rows(rows)?) {
            return Ok(());
        }
        Err(Failure::Contention {
            text: "a namespace's rules changed while the transaction was deciding".to_owned(),
            cause: Contended::Race,
        })
    }

    /// Whether `read` (the rows of `named`, read in the deciding transaction) are the rules
    /// `used`; when not, the cache takes them (the attempt is then retried).
    pub fn confirm(
        &self,
        used: &NamespaceSet,
        named: impl IntoIterator<Item = NamespaceId>,
        read: NamespaceSet,
    ) -> bool {
        let agree = named
            .into_iter()
            .all(|id| used.get(&id).ok() == read.get(&id).ok());
        if !agree {
            let mut merged: Vec<StoredNamespace> = used
                .iter()
                .filter(|s| read.get(&s.namespace.id).is_err())
                .cloned()
                .collect();
            merged.extend(read.iter().cloned());
            self.replace(NamespaceSet::new(merged));
        }
        agree
    }
}

/// `decide` under the rules last seen, or, when they refuse, under the rules read now (a
/// namespace created or changed since must not be refused on stale rules).
pub(crate) async fn rules_for<T>(
    cache: &NamespaceCache,
    session: &Session<'_>,
    decide: impl Fn(&NamespaceSet) -> Result<T, ClaimsError>,
) -> Result<(Arc<NamespaceSet>, T), Failure> {
    let cached = cache.current();
    if let Ok(value) = decide(&cached) {
        return Ok((cached, value));
    }
    let rows = read_all(session.client()?).await?;
    session.round_trip();
    cache.replace(from_rows(&rows)?);
    let fresh = cache.current();
    let value = decide(&fresh)?;
    Ok((fresh, value))
}

fn row(row: &Row) -> Result<NamespaceRow, tokio_postgres::Error> {
    Ok(NamespaceRow {
        number: i64::from(row.try_get::<_, i16>(0)?),
        id: row.try_get(1)?,
        normalization: i64::from(row.try_get::<_, i16>(2)?),
        max_chars: i64::from(row.try_get::<_, i16>(3)?),
        pattern: row.try_get(4)?,
        reserved: row.try_get(5)?,
        description: row.try_get(6)?,
        deprecated: row.try_get(7)?,
        version: row.try_get(8)?,
    })
}

fn corrupt(detail: impl std::fmt::Display) -> ClaimsError {
    ClaimsError::internal(format!("stored namespace row is invalid: {detail}"))
}

/// The namespaces of rows of `namespace_columns!()`.
pub(crate) fn from_rows(rows: &[Row]) -> Result<NamespaceSet, ClaimsError> {
    let stored = rows
        .iter()
        .map(|r| row(r).map_err(corrupt)?.to_stored().map_err(corrupt))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(NamespaceSet::new(stored))
}

/// Every namespace's row, read now.
pub(crate) async fn read_all(
    client: &impl GenericClient,
) -> Result<Vec<Row>, tokio_postgres::Error> {
    client.query(sql::SELECT_ALL_NAMESPACES, &[]).await
}

/// The ids `names` as the parameter of [`sql::SELECT_NAMESPACES`].
pub(crate) fn id_param(names: impl IntoIterator<Item = NamespaceId>) -> Vec<String> {
    names.into_iter().map(|id| id.to_string()).collect()
}

/// One attempt of ListNamespaces: every row.
pub(crate) async fn list_attempt(shared: &crate::session::Shared) -> Result<NamespaceSet, Failure> {
    let session = shared.session().await?;
    let rows = read_all(session.client()?).await?;
    session.round_trip();
    Ok(from_rows(&rows)?)
}

/// Reads the claims of namespace `number` as a proof reads them.
async fn proof_claims(
    tx: &impl GenericClient,
    number: i16,
) -> Result<Vec<ProofClaim>, tokio_postgres::Error> {
    tx.query(sql::PROOF_CLAIMS, &[&number])
        .await?
        .iter()
        .map(|r| {
            Ok(ProofClaim {
                key: r.try_get(0)?,
                display_value: r.try_get(1)?,
                leased: r.try_get(2)?,
            })
        })
        .collect()
}

/// Rewrites the keys of `rekeys` in namespace `number`; each claim keeps its display form. A
/// key never holds a control character: parking each row on one first lets a new key be
/// another rewritten row's old one.
async fn rekey(
    tx: &impl GenericClient,
    number: i16,
    rekeys: &[domain::Rekey],
    claims: &[ProofClaim],
) -> Result<(), tokio_postgres::Error> {
    for (i, change) in rekeys.iter().enumerate() {
        let parked = format!("\u{1}{i}");
        tx.execute(
            sql::REKEY_CLAIM,
            &[&number, &change.old_key, &parked, &change.old_key],
        )
        .await?;
    }
    for (i, change) in rekeys.iter().enumerate() {
        let shown = claims
            .iter()
            .find(|c| c.key == change.old_key)
            .map_or(change.old_key.as_str(), |c| c.display_value.as_str());
        let parked = format!("\u{1}{i}");
        tx.execute(
            sql::REKEY_CLAIM,
            &[&number, &parked, &change.new_key, &shown],
        )
        .await?;
    }
    Ok(())
}

/// Runs `statement` ([`sql::INSERT_NAMESPACE`] or [`sql::UPDATE_NAMESPACE`]) with `stored`'s
/// columns.
async fn write_namespace(
    tx: &impl GenericClient,
    statement: &str,
    stored: &StoredNamespace,
) -> Result<u64, tokio_postgres::Error> {
    let row = NamespaceRow::of(stored);
    // The row's columns are i64 (shared by every backend); these three are smallint here.
    let smallint = |n: i64| i16::try_from(n).unwrap_or(i16::MAX);
    tx.execute(
        statement,
        &[
            &smallint(row.number),
            &row.id,
            &smallint(row.normalization),
            &smallint(row.max_chars),
            &row.pattern,
            &row.reserved,
            &row.description,
            &row.deprecated,
            &row.version,
        ],
    )
    .await
}

/// One attempt of CreateNamespace (`ClaimStore::create_namespace`): every namespace locked,
/// the new one decided and inserted.
pub(crate) async fn create_attempt(
    session: &mut Session<'_>,
    cache: &NamespaceCache,
    spec: &NamespaceSpec,
    max: usize,
) -> Result<StoredNamespace, Failure> {
    let begin = session.begin_transaction();
    let client = session.client()?;
    client.batch_execute(begin).await?;
    let rows = client
        .query(sql::SELECT_ALL_NAMESPACES_FOR_UPDATE, &[])
        .await?;
    let created = domain::decide_create_namespace(&from_rows(&rows)?, spec.clone(), max)?;
    // A unique violation (a create of the same id or number meanwhile) retries, decided afresh.
    write_namespace(client, sql::INSERT_NAMESPACE, &created).await?;
    client.batch_execute(sql::COMMIT).await?;
    let all = read_all(client).await?;
    session.committed();
    cache.replace(from_rows(&all)?);
    Ok(created)
}

/// One attempt of DeleteNamespace (`ClaimStore::delete_namespace`): the claims table locked
/// against writers, the namespace's claims counted, the row deleted.
pub(crate) async fn delete_attempt(
    session: &mut Session<'_>,
    cache: &NamespaceCache,
    id: &str,
) -> Result<(), Failure> {
    let begin = session.begin_transaction();
    let client = session.client()?;
    client.batch_execute(begin).await?;
    client.batch_execute(sql::LOCK_CLAIMS_FOR_RULES).await?;
    let rows = client
        .query(sql::SELECT_ALL_NAMESPACES_FOR_UPDATE, &[])
        .await?;
    let namespaces = from_rows(&rows)?;
    let number = small(namespaces.find(id)?.number);
    let held: i64 = client
        .query_one(sql::COUNT_CLAIMS_OF_NAMESPACE, &[&number])
        .await?
        .try_get(0)?;
    domain::decide_delete_namespace(&namespaces, id, held.max(0) as u64)?;
    client.execute(sql::DELETE_NAMESPACE, &[&number]).await?;
    client.batch_execute(sql::COMMIT).await?;
    let all = read_all(client).await?;
    session.committed();
    cache.replace(from_rows(&all)?);
    Ok(())
}

/// One attempt of UpdateNamespace (`ClaimStore::update_namespace`): the namespace's row locked,
/// the claims table locked against writers (every BeginUpdate then reads the rules written
/// here, see [`sql::SELECT_NAMESPACES`]), the change decided, proven and written.
pub(crate) async fn update_attempt(
    session: &mut Session<'_>,
    cache: &NamespaceCache,
    id: &str,
    update: &NamespaceUpdate,
) -> Result<StoredNamespace, Failure> {
    let begin = session.begin_transaction();
    let client = session.client()?;
    client.batch_execute(begin).await?;
    client.batch_execute(sql::LOCK_CLAIMS_FOR_RULES).await?;
    let rows = client
        .query(sql::SELECT_NAMESPACE_FOR_UPDATE, &[&id])
        .await?;
    let current = from_rows(&rows)?.find(id)?.clone();
    let number = small(current.number);
    // The claims are read only when the change needs the proof.
    let needs_proof =
        domain::decide_namespace_update(&current.namespace, update.clone())?.needs_proof;
    let claims = if needs_proof {
        proof_claims(client, number).await?
    } else {
        Vec::new()
    };
    let change = domain::decide_rules_change(&current, update.clone(), || {
        Ok::<_, ClaimsError>(claims.clone())
    })??;
    rekey(client, number, &change.rekeys, &claims).await?;
    write_namespace(client, sql::UPDATE_NAMESPACE, &change.next).await?;
    client.batch_execute(sql::COMMIT).await?;
    let all = read_all(client).await?;
    session.committed();
    cache.replace(from_rows(&all)?);
    Ok(change.next)
}

/// Decides and writes the adoption of every pending built-in, inside the migration transaction
/// `tx` (which holds the migration lock); logs each decision.
pub(crate) async fn adopt_builtins(
    tx: &impl GenericClient,
    target: &str,
) -> Result<(), tokio_postgres::Error> {
    let pending = tx.query(sql::SELECT_PENDING_NAMESPACES, &[]).await?;
    if pending.is_empty() {
        return Ok(());
    }
    tx.batch_execute(sql::LOCK_CLAIMS_FOR_ADOPTION).await?;
    for pending in &pending {
        let stored = match row(pending)?.into_stored() {
            Ok(stored) => stored,
            Err(corrupt) => {
                tracing::error!(target_db = target, "PostgreSQL: not adopting: {corrupt}");
                continue;
            }
        };
        let number = small(stored.number);
        let claims = proof_claims(tx, number).await?;
        let adoption = domain::decide_adoption(&stored.namespace, &claims);
        let next = match &adoption {
            Adoption::Adopt { namespace, rekeys } => {
                rekey(tx, number, rekeys, &claims).await?;
                Some(namespace)
            }
            Adoption::KeepExact { namespace, .. } => Some(namespace),
            Adoption::Wait { .. } => None,
        };
        if let Some(namespace) = next {
            let next = StoredNamespace {
                number: stored.number,
                namespace: namespace.clone(),
            };
            write_namespace(tx, sql::UPDATE_NAMESPACE, &next).await?;
        }
        match adoption.describe(stored.namespace.id.as_str()) {
            (true, line) => tracing::warn!(target_db = target, "PostgreSQL: {line}"),
            (false, line) => tracing::info!(target_db = target, "PostgreSQL: {line}"),
        }
    }
    Ok(())
}

/// One attempt of `ClaimStore::count_claims`: one scan of the claims.
pub(crate) async fn count_attempt(
    shared: &crate::session::Shared,
) -> Result<Vec<(NamespaceId, u64)>, Failure> {
    let session = shared.session().await?;
    let rows = session
        .client()?
        .query(sql::COUNT_CLAIMS_BY_NAMESPACE, &[])
        .await?;
    session.round_trip();
    let mut counts = Vec::with_capacity(rows.len());
    for row in &rows {
        let (number, namespace, count): (i16, Option<&str>, i64) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        let id = NamespaceId::of_row(number.into(), namespace)
            .ok_or_else(|| corrupt(format!("claim_type {number}, namespace {namespace:?}")))?;
        counts.push((id, u64::try_from(count).unwrap_or(0)));
    }
    counts.sort();
    Ok(counts)
}

//! The `namespaces` table: the rules every BeginUpdate and lookup reads in its own transaction
//! (decision 108), and the adoption of `precis-username` by the built-ins at open
//! (`domain::decide_adoption`). Spanner migrations are DDL only, so the built-in rows are
//! written by the first open's adoption; until then a missing built-in reads as pending
//! (`NamespaceSet::with_pending_builtins`: exact, byte for byte, as before namespaces).
//!
//! Owns the table's rows and mutations; decides nothing.

use gcloud_googleapis::spanner::v1::Mutation;
use gcloud_spanner::key::Key;
use gcloud_spanner::mutation::{delete, insert_or_update};
use gcloud_spanner::row::Row;
use gcloud_spanner::statement::Statement;
use gcloud_spanner::transaction::Transaction;
use topology_claims::domain::{
    self, Adoption, Claim, ClaimKey, NamespaceId, NamespaceRow, NamespaceSet, NamespaceSpec,
    NamespaceUpdate, ProofClaim, Rekey, StoredNamespace, ADOPTION_PENDING_VERSION,
};
use topology_claims::{ClaimsError, Timestamp};

use crate::error::{status_error, TxError};
use crate::rows::{self, column, corrupt, CLAIMS, CLAIM_COLUMNS};
use crate::store::SpannerClaimStore;

pub(crate) const NAMESPACES: &str = "namespaces";
const COLUMNS: [&str; 9] = [
    "number",
    "id",
    "normalization",
    "max_chars",
    "pattern",
    "reserved",
    "description",
    "deprecated",
    "version",
];

fn from_row(row: &Row) -> Result<StoredNamespace, ClaimsError> {
    NamespaceRow {
        number: column(row, "number")?,
        id: column(row, "id")?,
        normalization: column(row, "normalization")?,
        max_chars: column(row, "max_chars")?,
        pattern: column(row, "pattern")?,
        reserved: column(row, "reserved")?,
        description: column(row, "description")?,
        deprecated: column(row, "deprecated")?,
        version: column(row, "version")?,
    }
    .to_stored()
    .map_err(|e| corrupt("namespace", e))
}

fn write(stored: &StoredNamespace) -> Mutation {
    let row = NamespaceRow::of(stored);
    insert_or_update(
        NAMESPACES,
        &COLUMNS,
        &[
            &row.number,
            &row.id,
            &row.normalization,
            &row.max_chars,
            &row.pattern,
            &row.reserved,
            &row.description,
            &row.deprecated,
            &row.version,
        ],
    )
}

/// Claims as a proof reads them.
fn proof(claims: &[Claim]) -> Vec<ProofClaim> {
    claims
        .iter()
        .map(|c| ProofClaim {
            key: c.record.key.value.clone(),
            display_value: c.record.display_value().to_owned(),
            leased: c.lease.is_some(),
        })
        .collect()
}

/// Each claim of `rekeys` moved to its new key: a primary key cannot change, so the row is
/// deleted and inserted under the new key, every other column as it was (its display form
/// kept).
fn rekey_mutations(number: i32, claims: &[Claim], rekeys: &[Rekey]) -> Vec<Mutation> {
    let never = Timestamp::from_unix_micros(i64::MIN);
    let mut mutations = Vec::with_capacity(rekeys.len() * 2);
    for change in rekeys {
        let Some(claim) = claims.iter().find(|c| c.record.key.value == change.old_key) else {
            continue;
        };
        mutations.push(delete(
            CLAIMS,
            Key::composite(&[&i64::from(number), &change.old_key]),
        ));
        let mut moved = claim.clone();
        let shown = claim.record.display_value().to_owned();
        moved.record.display = (shown != change.new_key).then_some(shown);
        moved.record.key = ClaimKey {
            namespace: claim.record.key.namespace.clone(),
            value: change.new_key.clone(),
        };
        mutations.push(rows::write_claim(&moved, never, false));
    }
    mutations
}

impl SpannerClaimStore {
    /// LookupClaim (`ClaimStore::lookup_claim`): the rules and the claim from one snapshot.
    pub(crate) async fn lookup_in(&self, sent: &ClaimKey) -> Result<Claim, ClaimsError> {
        let context = "LookupClaim";
        // One snapshot: the rules and the claim as of one timestamp.
        let (mut tx, _) = self.snapshot(context).await?;
        let namespaces = self
            .read_named(&mut tx, [sent.namespace.clone()])
            .await
            .map_err(|e| crate::error::tx_error(context, e))?;
        let key = &domain::resolve_key(sent, &namespaces, "claim_value")?;
        let read = tx.read_row_with_option(
            CLAIMS,
            &CLAIM_COLUMNS,
            rows::claim_key(key),
            self.read_options(),
        );
        let row = self
            .options
            .within_rpc_timeout(read)
            .await
            .map_err(|s| status_error(context, &s))?;
        match row {
            Some(row) => rows::claim_from_row(&row),
            None => Err(ClaimsError::ClaimNotFound { claim: key.clone() }),
        }
    }

    /// ListNamespaces (`ClaimStore::namespaces`), from a strong snapshot.
    pub(crate) async fn namespaces_in(&self) -> Result<Vec<StoredNamespace>, ClaimsError> {
        let context = "ListNamespaces";
        let (mut tx, _) = self.snapshot(context).await?;
        let set = self
            .read_namespaces(&mut tx)
            .await
            .map_err(|e| crate::error::tx_error(context, e))?;
        Ok(set.iter().cloned().collect())
    }

    /// `ClaimStore::count_claims` in a read-only transaction: one scan of the claims.
    pub(crate) async fn count_claims_in(&self) -> Result<Vec<(NamespaceId, u64)>, ClaimsError> {
        let context = "CountClaims";
        let (mut tx, _) = self.snapshot(context).await?;
        let stmt = Statement::new(format!(
            "SELECT claim_type, namespace, COUNT(*) AS n FROM {CLAIMS} GROUP BY claim_type, namespace"
        ));
        let mut counts = self
            .query_in(&mut tx, stmt, |row| {
                let number: i64 = column(row, "claim_type")?;
                let namespace: Option<String> = column(row, "namespace")?;
                let count: i64 = column(row, "n")?;
                let id = NamespaceId::of_row(number, namespace.as_deref()).ok_or_else(|| {
                    corrupt(
                        "claim",
                        format!("claim_type {number}, namespace {namespace:?}"),
                    )
                })?;
                Ok((id, u64::try_from(count).unwrap_or(0)))
            })
            .await
            .map_err(|e| crate::error::tx_error(context, e))?;
        counts.sort();
        Ok(counts)
    }

    /// Every claim of namespace `number`, read (and so locked) in `tx`.
    async fn claims_of(&self, tx: &mut Transaction, number: i32) -> Result<Vec<Claim>, TxError> {
        let mut stmt = Statement::new(format!(
            "SELECT {} FROM {CLAIMS} WHERE claim_type = @number",
            CLAIM_COLUMNS.join(", ")
        ));
        stmt.add_param("number", &i64::from(number));
        self.query_in(tx, stmt, rows::claim_from_row).await
    }

    /// CreateNamespace (`ClaimStore::create_namespace`) in one read-write transaction: every
    /// namespace read, the new one decided and inserted.
    pub(crate) async fn create_namespace_in(
        &self,
        spec: NamespaceSpec,
        max: usize,
    ) -> Result<StoredNamespace, ClaimsError> {
        let mut attempts = self.attempts("CreateNamespace");
        let (answer, _) = loop {
            let Some(mut tx) = attempts.begin(&self.client).await? else {
                continue;
            };
            let result = async {
                let set = self.read_namespaces(&mut tx).await?;
                let created = match domain::decide_create_namespace(&set, spec.clone(), max) {
                    Ok(created) => created,
                    Err(refusal) => return Ok(Err(refusal)),
                };
                tx.buffer_write(vec![write(&created)]);
                Ok::<_, TxError>(Ok(created))
            }
            .await;
            if let Some(done) = attempts.end(&mut tx, result).await? {
                break done;
            }
        };
        answer
    }

    /// DeleteNamespace (`ClaimStore::delete_namespace`) in one read-write transaction: its
    /// claims read (locking their range against creates) and counted, the row deleted.
    pub(crate) async fn delete_namespace_in(&self, id: &str) -> Result<(), ClaimsError> {
        let mut attempts = self.attempts("DeleteNamespace");
        let (answer, _) = loop {
            let Some(mut tx) = attempts.begin(&self.client).await? else {
                continue;
            };
            let result = async {
                let set = self.read_namespaces(&mut tx).await?;
                let number = match set.find(id) {
                    Ok(found) => found.number,
                    Err(refusal) => return Ok(Err(refusal)),
                };
                let held = self.claims_of(&mut tx, number).await?.len() as u64;
                match domain::decide_delete_namespace(&set, id, held) {
                    Ok(number) => {
                        tx.buffer_write(vec![delete(NAMESPACES, Key::new(&i64::from(number)))]);
                        Ok::<_, TxError>(Ok(()))
                    }
                    Err(refusal) => Ok(Err(refusal)),
                }
            }
            .await;
            if let Some(done) = attempts.end(&mut tx, result).await? {
                break done;
            }
        };
        answer
    }

    /// UpdateNamespace (`ClaimStore::update_namespace`) in one read-write transaction: every
    /// namespace read (a BeginUpdate reads them too, so the two conflict), the namespace's
    /// claims read when the change needs the proof (locking their range against creates).
    pub(crate) async fn update_namespace_in(
        &self,
        id: &str,
        update: NamespaceUpdate,
    ) -> Result<StoredNamespace, ClaimsError> {
        let mut attempts = self.attempts("UpdateNamespace");
        let (answer, _) = loop {
            let Some(mut tx) = attempts.begin(&self.client).await? else {
                continue;
            };
            let result = self.update_attempt(&mut tx, id, &update).await;
            if let Some(done) = attempts.end(&mut tx, result).await? {
                break done;
            }
        };
        answer
    }

    async fn update_attempt(
        &self,
        tx: &mut crate::transaction::WriteTx,
        id: &str,
        update: &NamespaceUpdate,
    ) -> Result<Result<StoredNamespace, ClaimsError>, TxError> {
        let set = self.read_namespaces(tx).await?;
        let current = match set.find(id) {
            Ok(current) => current.clone(),
            Err(refusal) => return Ok(Err(refusal)),
        };
        // The proof's claims, read only when the change needs them.
        let needs_proof = domain::decide_namespace_update(&current.namespace, update.clone())
            .is_ok_and(|change| change.needs_proof);
        let claims = if needs_proof {
            self.claims_of(tx, current.number).await?
        } else {
            Vec::new()
        };
        let change = match domain::decide_rules_change(&current, update.clone(), || {
            Ok::<_, TxError>(proof(&claims))
        })? {
            Ok(change) => change,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let mut mutations = rekey_mutations(current.number, &claims, &change.rekeys);
        mutations.push(write(&change.next));
        tx.buffer_write(mutations);
        Ok(Ok(change.next))
    }

    /// Every namespace, read in `tx` (in a read-write transaction the read locks them, so a rule
    /// change and a decision under the old rules cannot both commit).
    pub(crate) async fn read_namespaces(
        &self,
        tx: &mut Transaction,
    ) -> Result<NamespaceSet, TxError> {
        let stmt = Statement::new(format!("SELECT {} FROM {NAMESPACES}", COLUMNS.join(", ")));
        let stored = self.query_in(tx, stmt, from_row).await?;
        Ok(NamespaceSet::with_pending_builtins(stored))
    }

    /// The namespaces `ids`, read in `tx` by primary key (a namespace's number is a function of
    /// its id), locking them in a read-write transaction: what a BeginUpdate, a group or a
    /// lookup names, whatever the number the store holds.
    pub(crate) async fn read_named(
        &self,
        tx: &mut Transaction,
        ids: impl IntoIterator<Item = NamespaceId>,
    ) -> Result<NamespaceSet, TxError> {
        let ids: std::collections::BTreeSet<NamespaceId> = ids.into_iter().collect();
        let keys = ids
            .iter()
            .map(|id| Key::new(&i64::from(id.store_number())))
            .collect();
        let stored = self
            .read_keys(tx, NAMESPACES, &COLUMNS, keys, from_row)
            .await?;
        // A built-in whose row the first open has not written yet reads as pending.
        let read = NamespaceSet::with_pending_builtins(
            stored.into_iter().filter(|s| ids.contains(&s.namespace.id)),
        );
        Ok(NamespaceSet::new(
            read.iter()
                .filter(|s| ids.contains(&s.namespace.id))
                .cloned(),
        ))
    }

    /// At open: decides and writes the adoption of every pending built-in, in one read-write
    /// transaction that reads each one's claims; logs each decision.
    pub(crate) async fn adopt_builtins(&self) -> Result<(), ClaimsError> {
        let mut attempts = self.attempts("adopting precis-username for the built-in namespaces");
        let (decided, _) = loop {
            let Some(mut tx) = attempts.begin(&self.client).await? else {
                continue;
            };
            let result = self.adoption_attempt(&mut tx).await;
            if let Some(done) = attempts.end(&mut tx, result).await? {
                break done;
            }
        };
        for (namespace, adoption) in decided {
            match adoption.describe(&namespace) {
                (true, line) => tracing::warn!(database = %self.database(), "Spanner: {line}"),
                (false, line) => tracing::info!(database = %self.database(), "Spanner: {line}"),
            }
        }
        Ok(())
    }

    async fn adoption_attempt(
        &self,
        tx: &mut crate::transaction::WriteTx,
    ) -> Result<Vec<(String, Adoption)>, TxError> {
        let set = self.read_namespaces(tx).await?;
        let pending: Vec<StoredNamespace> = set
            .iter()
            .filter(|s| s.namespace.version == ADOPTION_PENDING_VERSION)
            .cloned()
            .collect();
        let mut mutations = Vec::new();
        let mut decided = Vec::new();
        for stored in pending {
            let claims = self.claims_of(tx, stored.number).await?;
            let adoption = domain::decide_adoption(&stored.namespace, &proof(&claims));
            let next = match &adoption {
                Adoption::Adopt { namespace, rekeys } => {
                    mutations.extend(rekey_mutations(stored.number, &claims, rekeys));
                    Some(namespace.clone())
                }
                Adoption::KeepExact { namespace, .. } => Some(namespace.clone()),
                // Written as pending, so that the table lists every built-in.
                Adoption::Wait { .. } => Some(stored.namespace.clone()),
            };
            if let Some(namespace) = next {
                mutations.push(write(&StoredNamespace {
                    number: stored.number,
                    namespace,
                }));
            }
            decided.push((stored.namespace.id.to_string(), adoption));
        }
        tx.buffer_write(mutations);
        Ok(decided)
    }
}

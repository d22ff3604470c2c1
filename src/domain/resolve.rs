//! A store's namespaces as one decision input ([`NamespaceSet`]), and what is decided with it:
//! the keys of a request's values ([`resolve_begin`], [`resolve_key`]), the create-only rules
//! ([`check_creates`]), and the administrative decisions that add or remove a namespace
//! ([`decide_create_namespace`], [`decide_delete_namespace`]).
//!
//! Every store keys its claims by a namespace *number* (the built-ins keep the numbers 1, 2 and
//! 3 of the legacy `claim_type`; the others get the next free one), so that the claims' primary
//! key and page order stay what they were before namespaces (docs/decisions/107).
//!
//! Must not do I/O: a store reads its namespace rows in the transaction that decides, builds the
//! set, and asks these functions.

use std::collections::BTreeMap;

use crate::error::ClaimsError;

use super::namespaces::{
    decide_namespace_update, prove_rules, KeyRules, Namespace, NamespaceId, NamespaceSpec,
    NamespaceUpdate, Normalization, ProofClaim, Rekey,
};
use super::types::{BeginUpdate, ClaimKey, ClaimRecord, ClaimType};

/// A namespace as a store holds it: its number and its definition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredNamespace {
    pub number: i32,
    pub namespace: Namespace,
}

/// The namespaces of a store (or the part of them a decision reads), by id. The default is
/// what a new store starts with ([`NamespaceSet::builtins`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceSet {
    by_id: BTreeMap<NamespaceId, StoredNamespace>,
}

impl Default for NamespaceSet {
    fn default() -> Self {
        Self::builtins()
    }
}

impl NamespaceSet {
    pub fn new(namespaces: impl IntoIterator<Item = StoredNamespace>) -> Self {
        Self {
            by_id: namespaces
                .into_iter()
                .map(|stored| (stored.namespace.id.clone(), stored))
                .collect(),
        }
    }

    /// What a new store starts with: `routes`, `usernames` and `emails` under their legacy
    /// numbers.
    pub fn builtins() -> Self {
        Self::new(ClaimType::ALL.iter().map(|t| StoredNamespace {
            number: t.number(),
            namespace: Namespace::builtin(*t),
        }))
    }

    /// `namespaces` as read from a store whose built-in rows may not be written yet (a store
    /// without data manipulation in its migrations writes them at its first open): a missing
    /// built-in is pending adoption ([`ADOPTION_PENDING_VERSION`], exact).
    pub fn with_pending_builtins(namespaces: impl IntoIterator<Item = StoredNamespace>) -> Self {
        let mut set = Self::new(namespaces);
        for claim_type in ClaimType::ALL {
            let pending = pending_builtin(*claim_type);
            set.by_id
                .entry(pending.namespace.id.clone())
                .or_insert(pending);
        }
        set
    }

    /// The namespace `id`, or INVALID_ARGUMENT `UNKNOWN_NAMESPACE`.
    pub fn get(&self, id: &NamespaceId) -> Result<&StoredNamespace, ClaimsError> {
        self.by_id
            .get(id)
            .ok_or_else(|| ClaimsError::UnknownNamespace {
                namespace: id.to_string(),
            })
    }

    /// The namespace `id`, or NOT_FOUND `NAMESPACE_NOT_FOUND` (an administrative call naming
    /// it).
    pub fn find(&self, id: &str) -> Result<&StoredNamespace, ClaimsError> {
        NamespaceId::parse(id)
            .ok()
            .and_then(|id| self.by_id.get(&id))
            .ok_or_else(|| ClaimsError::NamespaceNotFound {
                namespace: id.to_owned(),
            })
    }

    /// The set without namespace `id`.
    pub fn without(mut self, id: &NamespaceId) -> Self {
        self.by_id.remove(id);
        self
    }

    /// The set with `stored` in place of the namespace of its id.
    pub fn with(mut self, stored: StoredNamespace) -> Self {
        self.by_id.insert(stored.namespace.id.clone(), stored);
        self
    }

    /// The namespace numbered `number` (reading a claim row back).
    pub fn by_number(&self, number: i32) -> Option<&StoredNamespace> {
        self.by_id.values().find(|stored| stored.number == number)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &StoredNamespace> {
        self.by_id.values()
    }
}

/// `record` (as decoded: its key is the value as sent) with its key under its namespace's rules
/// and its display form kept; `field` names it in refusals (`creates_claims[2]`).
pub fn resolve_record(
    record: ClaimRecord,
    namespaces: &NamespaceSet,
    field: impl std::fmt::Display,
) -> Result<ClaimRecord, ClaimsError> {
    let namespace = &namespaces.get(&record.key.namespace)?.namespace;
    let sent = record.display_value();
    let key = namespace
        .key_of(sent, &format!("{field}.claim_value"))?
        .into_owned();
    let display = (key != sent).then(|| sent.to_owned());
    Ok(ClaimRecord {
        key: ClaimKey {
            namespace: record.key.namespace,
            value: key,
        },
        display,
        ..record
    })
}

/// The key of a value as a lookup or a cursor sends it (`field` names the value).
pub fn resolve_key(
    key: &ClaimKey,
    namespaces: &NamespaceSet,
    field: &str,
) -> Result<ClaimKey, ClaimsError> {
    let namespace = &namespaces.get(&key.namespace)?.namespace;
    Ok(ClaimKey {
        namespace: key.namespace.clone(),
        value: namespace.key_of(&key.value, field)?.into_owned(),
    })
}

/// A BeginUpdate with every record's key computed under its namespace's rules. Two values of one
/// batch with the same key are then one claim twice (`check_batch` refuses it).
pub fn resolve_begin(
    request: BeginUpdate,
    namespaces: &NamespaceSet,
) -> Result<BeginUpdate, ClaimsError> {
    let resolve = |records: Vec<ClaimRecord>, name: &str| {
        records
            .into_iter()
            .enumerate()
            .map(|(i, r)| resolve_record(r, namespaces, format_args!("{name}[{i}]")))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(BeginUpdate {
        creates: resolve(request.creates, "creates_claims")?,
        destroys: resolve(request.destroys, "destroys_claims")?,
        updates: resolve(request.updates, "updates_claims")?,
        ..request
    })
}

/// What every store does with a BeginUpdate before it reads a claim row: the keys of its values
/// under `namespaces` ([`resolve_begin`]), then the batch check on those keys (two forms of one
/// name are one claim twice). The batch-size policy is the front end's, so any size passes.
///
/// The batch is checked as sent first: that is what the front end and the group combiner check
/// before any store is asked, so a value sent twice is named the same way whichever path
/// refuses it; only then are two *forms* of one name found.
pub fn prepare_begin(
    request: BeginUpdate,
    namespaces: &NamespaceSet,
) -> Result<BeginUpdate, ClaimsError> {
    super::decide::check_batch(&request, usize::MAX)?;
    let request = resolve_begin(request, namespaces)?;
    super::decide::check_batch(&request, usize::MAX)?;
    Ok(request)
}

/// The rules only a create must pass (after the replay check: a replay is decided under the
/// rules of its first attempt): its namespace is not deprecated and its key is not reserved.
pub fn check_creates(request: &BeginUpdate, namespaces: &NamespaceSet) -> Result<(), ClaimsError> {
    for (i, record) in request.creates.iter().enumerate() {
        let namespace = &namespaces.get(&record.key.namespace)?.namespace;
        namespace.check_create(
            &record.key.value,
            &format!("creates_claims[{i}].claim_value"),
        )?;
    }
    Ok(())
}

/// A `namespaces` row, column for column, as every SQL store holds it: `normalization` its
/// number ([`Normalization::number`]), `reserved` the values joined by `'\n'` (a value has no
/// control character), `version` [`ADOPTION_PENDING_VERSION`] for a built-in awaiting adoption.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NamespaceRow {
    pub number: i64,
    pub id: String,
    pub normalization: i64,
    pub max_chars: i64,
    pub pattern: Option<String>,
    pub reserved: String,
    pub description: String,
    pub deprecated: bool,
    pub version: i64,
}

impl NamespaceRow {
    pub fn of(stored: &StoredNamespace) -> Self {
        let namespace = &stored.namespace;
        Self {
            number: i64::from(stored.number),
            id: namespace.id.to_string(),
            normalization: i64::from(namespace.rules.normalization.number()),
            max_chars: i64::from(namespace.rules.max_chars),
            pattern: namespace
                .rules
                .pattern
                .as_ref()
                .map(|p| p.as_str().to_owned()),
            reserved: namespace.reserved.join("\n"),
            description: namespace.description.clone(),
            deprecated: namespace.deprecated,
            version: namespace.version as i64,
        }
    }

    /// [`into_stored`](Self::into_stored), remembered: a store reads the rows of the namespaces
    /// a BeginUpdate names in its transaction, and a row it read before (every column equal)
    /// is not validated again (a pattern is compiled once, the reserved keys computed once).
    /// A pure function's memo, bounded: cleared when it holds 4,096 rows.
    pub fn to_stored(&self) -> Result<StoredNamespace, String> {
        use std::collections::HashMap;
        use std::sync::{Mutex, OnceLock};
        static PARSED: OnceLock<Mutex<HashMap<NamespaceRow, StoredNamespace>>> = OnceLock::new();
        let parsed = PARSED.get_or_init(Mutex::default);
        if let Some(stored) = parsed.lock().unwrap_or_else(|p| p.into_inner()).get(self) {
            return Ok(stored.clone());
        }
        let stored = self.clone().into_stored()?;
        let mut parsed = parsed.lock().unwrap_or_else(|p| p.into_inner());
        if parsed.len() >= 4096 {
            parsed.clear();
        }
        parsed.insert(self.clone(), stored.clone());
        Ok(stored)
    }

    /// The namespace, or what makes the row unreadable (the store reports it as corrupt).
    pub fn into_stored(self) -> Result<StoredNamespace, String> {
        let id = self.id.clone();
        let corrupt = |detail: String| format!("namespace {id:?}: {detail}");
        let number =
            i32::try_from(self.number).map_err(|_| corrupt(format!("number = {}", self.number)))?;
        let normalization = Normalization::from_number(self.normalization)
            .ok_or_else(|| corrupt(format!("normalization = {}", self.normalization)))?;
        let max_chars = u16::try_from(self.max_chars)
            .map_err(|_| corrupt(format!("max_chars = {}", self.max_chars)))?;
        let version = u64::try_from(self.version)
            .map_err(|_| corrupt(format!("version = {}", self.version)))?;
        let spec = NamespaceSpec {
            id: self.id,
            normalization,
            max_chars,
            pattern: self.pattern,
            reserved: if self.reserved.is_empty() {
                Vec::new()
            } else {
                self.reserved.split('\n').map(str::to_owned).collect()
            },
            description: self.description,
            deprecated: self.deprecated,
        };
        let namespace = Namespace::from_spec(spec, version).map_err(|e| corrupt(e.to_string()))?;
        Ok(StoredNamespace { number, namespace })
    }
}

/// The version of a built-in namespace a migration added to a store that already held claims:
/// it compares byte for byte (`exact`, as before namespaces) until the store, at its next open,
/// adopts `precis-username` or keeps `exact` for good ([`decide_adoption`]).
pub const ADOPTION_PENDING_VERSION: u64 = 0;

/// A built-in as a migration adds it to a store that may hold claims: exact, pending adoption.
pub fn pending_builtin(claim_type: ClaimType) -> StoredNamespace {
    let mut spec = Namespace::builtin(claim_type).spec();
    spec.normalization = Normalization::Exact;
    StoredNamespace {
        number: claim_type.number(),
        namespace: Namespace::from_spec(spec, ADOPTION_PENDING_VERSION)
            .expect("the built-in definitions are valid"),
    }
}

/// What opening a store does with a built-in namespace that is [`ADOPTION_PENDING_VERSION`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Adoption {
    /// Adopt `precis-username` (version 1), rewriting these keys in the same transaction.
    Adopt {
        namespace: Namespace,
        rekeys: Vec<Rekey>,
    },
    /// Some of its claims would collide or be refused under `precis-username`: keep `exact`
    /// (version 1), and say which (`admin namespaces update` adopts it once they are resolved).
    KeepExact {
        namespace: Namespace,
        conflict: ClaimsError,
    },
    /// A lease holds a claim whose key would change: stay pending (exact), try at the next open.
    Wait { leased: usize },
}

impl Adoption {
    /// The log line of this decision about `namespace`, and whether it is a warning (the
    /// operator has something to resolve).
    pub fn describe(&self, namespace: &str) -> (bool, String) {
        match self {
            Adoption::Adopt { rekeys, .. } => (
                false,
                format!(
                    "namespace {namespace}: adopted precis-username ({} key(s) rewritten; each \
                     claim keeps the value its cell sent as its display form)",
                    rekeys.len()
                ),
            ),
            Adoption::KeepExact { conflict, .. } => (
                true,
                format!(
                    "namespace {namespace}: kept exact (values compared byte for byte), because \
                     its claims would collide or be refused under precis-username: {conflict}. \
                     Resolve them, then run `topology-claims admin namespaces update \
                     {namespace} --normalization precis-username`"
                ),
            ),
            Adoption::Wait { leased } => (
                true,
                format!(
                    "namespace {namespace}: precis-username not adopted yet: {leased} leased \
                     claim(s) would change key; compared byte for byte until the next start"
                ),
            ),
        }
    }
}

/// Decides the adoption of `precis-username` by the pending built-in `current`, over every claim
/// it holds (read in the transaction that writes the decision).
pub fn decide_adoption(current: &Namespace, claims: &[ProofClaim]) -> Adoption {
    let target = KeyRules {
        normalization: Normalization::PrecisUsername,
        ..current.rules.clone()
    };
    // Collisions and refusals decide for good; leases only delay.
    let unleased: Vec<ProofClaim> = claims
        .iter()
        .map(|claim| ProofClaim {
            leased: false,
            ..claim.clone()
        })
        .collect();
    let next = |normalization| {
        let mut spec = current.spec();
        spec.normalization = normalization;
        Namespace::from_spec(spec, ADOPTION_PENDING_VERSION + 1)
    };
    match prove_rules(&current.id, &current.rules, &target, &unleased) {
        Err(conflict) => match next(Normalization::Exact) {
            Ok(namespace) => Adoption::KeepExact {
                namespace,
                conflict,
            },
            Err(invalid) => Adoption::KeepExact {
                namespace: current.clone(),
                conflict: invalid,
            },
        },
        Ok(rekeys) => {
            let leased = claims
                .iter()
                .filter(|c| c.leased && rekeys.iter().any(|r| r.old_key == c.key))
                .count();
            if leased > 0 {
                return Adoption::Wait { leased };
            }
            match next(Normalization::PrecisUsername) {
                Ok(namespace) => Adoption::Adopt { namespace, rekeys },
                Err(conflict) => Adoption::KeepExact {
                    namespace: current.clone(),
                    conflict,
                },
            }
        }
    }
}

/// An UpdateNamespace as decided: the namespace as it will be written, and the claims whose
/// keys it rewrites (each keeps its display form).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RulesChange {
    pub next: StoredNamespace,
    pub rekeys: Vec<Rekey>,
}

/// Decides an UpdateNamespace of `current`. `claims` reads every claim of the namespace, in the
/// transaction that writes the change; it is called only when the change needs the proof
/// (`NamespaceChange::needs_proof`: a new normalization, a lower `max_chars`, a new pattern).
pub fn decide_rules_change<E>(
    current: &StoredNamespace,
    update: NamespaceUpdate,
    claims: impl FnOnce() -> Result<Vec<ProofClaim>, E>,
) -> Result<Result<RulesChange, ClaimsError>, E> {
    let change = match decide_namespace_update(&current.namespace, update) {
        Ok(change) => change,
        Err(refusal) => return Ok(Err(refusal)),
    };
    let rekeys = if change.needs_proof {
        let claims = claims()?;
        match prove_rules(
            &current.namespace.id,
            &current.namespace.rules,
            &change.next.rules,
            &claims,
        ) {
            Ok(rekeys) => rekeys,
            Err(conflict) => return Ok(Err(conflict)),
        }
    } else {
        Vec::new()
    };
    Ok(Ok(RulesChange {
        next: StoredNamespace {
            number: current.number,
            namespace: change.next,
        },
        rekeys,
    }))
}

/// Decides a CreateNamespace in a store holding `namespaces`, at most `max` of them: the new
/// namespace (version 1) and its number.
pub fn decide_create_namespace(
    namespaces: &NamespaceSet,
    spec: NamespaceSpec,
    max: usize,
) -> Result<StoredNamespace, ClaimsError> {
    let namespace = Namespace::from_spec(spec, 1)?;
    if namespaces.by_id.contains_key(&namespace.id) {
        return Err(ClaimsError::NamespaceExists {
            namespace: namespace.id,
        });
    }
    if namespaces.len() >= max {
        return Err(ClaimsError::TooManyNamespaces { max: max as u64 });
    }
    let number = namespace.id.store_number();
    if let Some(holder) = namespaces.by_number(number) {
        return Err(ClaimsError::invalid(
            "namespace.id",
            format!(
                "{:?} has the store number {number}, which namespace {} holds (a fixed function \
                 of the id, decision 108): choose another id",
                namespace.id.as_str(),
                holder.namespace.id
            ),
        ));
    }
    Ok(StoredNamespace { number, namespace })
}

/// Decides a DeleteNamespace of `id`, which holds `claims` claims (leased ones included): its
/// number, to delete the row.
pub fn decide_delete_namespace(
    namespaces: &NamespaceSet,
    id: &str,
    claims: u64,
) -> Result<i32, ClaimsError> {
    let stored = namespaces.find(id)?;
    if stored.namespace.id.claim_type().is_some() {
        return Err(ClaimsError::invalid(
            "id",
            format!(
                "{id} is a built-in namespace (the legacy claim_type {} names it): it cannot be \
                 deleted; deprecate it instead",
                stored.number
            ),
        ));
    }
    if claims > 0 {
        return Err(ClaimsError::NamespaceNotEmpty {
            namespace: stored.namespace.id.clone(),
            claims,
        });
    }
    Ok(stored.number)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::types::{CellId, OwnerType, TableName};

    fn record(namespace: &str, value: &str) -> ClaimRecord {
        ClaimRecord {
            key: ClaimKey::new(NamespaceId::parse(namespace).unwrap(), value),
            display: None,
            owner_type: OwnerType::USER,
            owner_value: "o".into(),
            table_name: TableName::USERS,
            table_record_id: 1,
        }
    }

    fn creates(records: Vec<ClaimRecord>) -> BeginUpdate {
        BeginUpdate {
            cell_id: CellId::parse("cell-a").unwrap(),
            lease_id: None,
            creates: records,
            destroys: vec![],
            updates: vec![],
            local_transaction: None,
        }
    }

    #[test]
    fn a_resolved_record_has_its_key_and_keeps_what_was_sent() {
        let set = NamespaceSet::builtins();
        let resolved = resolve_record(record("usernames", "ＪＯＨＮ"), &set, "c[0]").unwrap();
        assert_eq!(resolved.key.value, "john");
        assert_eq!(resolved.display_value(), "ＪＯＨＮ");
        let same = resolve_record(record("usernames", "john"), &set, "c[0]").unwrap();
        assert_eq!(same.display, None, "no display form when it is the key");
        assert!(resolved.same_as_sent(&record("usernames", "ＪＯＨＮ")));
    }

    #[test]
    fn an_unknown_namespace_is_refused_by_name() {
        let set = NamespaceSet::builtins();
        match resolve_record(record("ssh-keys", "x"), &set, "c[0]") {
            Err(ClaimsError::UnknownNamespace { namespace }) => assert_eq!(namespace, "ssh-keys"),
            other => panic!("expected UNKNOWN_NAMESPACE, got {other:?}"),
        }
    }

    #[test]
    fn a_refused_value_names_its_field_namespace_and_rule() {
        let set = NamespaceSet::builtins();
        let request = creates(vec![record("usernames", "ok"), record("usernames", "a b")]);
        match resolve_begin(request, &set) {
            Err(ClaimsError::InvalidClaimValue {
                field,
                namespace,
                rule,
                ..
            }) => {
                assert_eq!(field, "creates_claims[1].claim_value");
                assert_eq!(namespace.as_str(), "usernames");
                assert_eq!(rule.name(), "normalization");
            }
            other => panic!("expected INVALID_CLAIM_VALUE, got {other:?}"),
        }
    }

    #[test]
    fn two_forms_of_one_name_in_one_batch_are_one_claim_twice() {
        let set = NamespaceSet::builtins();
        let request = creates(vec![
            record("usernames", "John"),
            record("usernames", "john"),
        ]);
        let resolved = resolve_begin(request, &set).unwrap();
        assert!(matches!(
            crate::domain::check_batch(&resolved, 10),
            Err(ClaimsError::BatchConflict { .. })
        ));
    }

    #[test]
    fn namespaces_get_numbers_after_the_builtins_and_are_capped() {
        let mut set = NamespaceSet::builtins();
        let spec = NamespaceSpec::new("ssh-keys", Normalization::Exact);
        let created = decide_create_namespace(&set, spec.clone(), 10).unwrap();
        assert_eq!(created.number, created.namespace.id.store_number());
        assert!(created.number >= crate::domain::namespaces::FIRST_NAMESPACE_NUMBER);
        assert_eq!(created.namespace.version, 1);
        set = NamespaceSet::new(set.iter().cloned().chain([created]));
        assert!(matches!(
            decide_create_namespace(&set, spec, 10),
            Err(ClaimsError::NamespaceExists { .. })
        ));
        let other = NamespaceSpec::new("pages", Normalization::AsciiCaseInsensitive);
        assert!(matches!(
            decide_create_namespace(&set, other, 4),
            Err(ClaimsError::TooManyNamespaces { max: 4 })
        ));
        let number = NamespaceId::parse("ssh-keys").unwrap().store_number();
        assert_eq!(
            set.by_number(number).unwrap().namespace.id.as_str(),
            "ssh-keys"
        );
    }

    #[test]
    fn only_an_empty_namespace_is_deleted() {
        let set = NamespaceSet::builtins();
        let spec = NamespaceSpec::new("pages", Normalization::AsciiCaseInsensitive);
        let pages = decide_create_namespace(&set, spec, 10).unwrap();
        let set = set.with(pages.clone());
        assert_eq!(
            decide_delete_namespace(&set, "pages", 0).unwrap(),
            pages.number
        );
        assert!(matches!(
            decide_delete_namespace(&set, "pages", 2),
            Err(ClaimsError::NamespaceNotEmpty { claims: 2, .. })
        ));
        assert!(matches!(
            decide_delete_namespace(&set, "emails", 0),
            Err(ClaimsError::InvalidRequest { .. })
        ));
        assert!(matches!(
            decide_delete_namespace(&set, "nope", 0),
            Err(ClaimsError::NamespaceNotFound { .. })
        ));
    }

    fn pending(claim_type: ClaimType) -> Namespace {
        pending_builtin(claim_type).namespace
    }

    fn proof(key: &str, leased: bool) -> ProofClaim {
        ProofClaim {
            key: key.into(),
            display_value: key.into(),
            leased,
        }
    }

    #[test]
    fn a_pending_builtin_adopts_precis_and_rewrites_keys_unless_claims_collide() {
        let current = pending(ClaimType::Username);
        match decide_adoption(&current, &[proof("John", false), proof("amy", false)]) {
            Adoption::Adopt { namespace, rekeys } => {
                assert_eq!(namespace.rules.normalization, Normalization::PrecisUsername);
                assert_eq!(namespace.version, 1);
                assert_eq!(
                    rekeys,
                    vec![Rekey {
                        old_key: "John".into(),
                        new_key: "john".into()
                    }]
                );
            }
            other => panic!("expected an adoption, got {other:?}"),
        }
        match decide_adoption(&current, &[proof("John", false), proof("john", false)]) {
            Adoption::KeepExact {
                namespace,
                conflict,
            } => {
                assert_eq!(namespace.rules.normalization, Normalization::Exact);
                assert_eq!(namespace.version, 1);
                assert!(conflict.to_string().contains("\"John\""), "{conflict}");
            }
            other => panic!("expected exact for good, got {other:?}"),
        }
        assert_eq!(
            decide_adoption(&current, &[proof("John", true), proof("amy", true)]),
            Adoption::Wait { leased: 1 },
            "a lease on a key that would change delays; one on a key that stays does not"
        );
    }

    #[test]
    fn a_namespace_row_reads_back_what_was_written() {
        let mut spec = NamespaceSpec::new("pages", Normalization::AsciiCaseInsensitive);
        spec.reserved = vec!["www".into(), "Admin".into()];
        spec.pattern = Some("^[a-z0-9.-]+$".into());
        spec.description = "Pages domains".into();
        let stored = StoredNamespace {
            number: 7,
            namespace: Namespace::from_spec(spec, 3).unwrap(),
        };
        assert_eq!(NamespaceRow::of(&stored).into_stored().unwrap(), stored);
        let mut corrupt = NamespaceRow::of(&stored);
        corrupt.normalization = 9;
        let message = corrupt.into_stored().unwrap_err();
        assert!(message.contains("\"pages\"") && message.contains("normalization = 9"));
    }

    #[test]
    fn creates_in_a_deprecated_namespace_or_of_a_reserved_key_are_refused() {
        let mut spec = NamespaceSpec::new("usernames", Normalization::PrecisUsername);
        spec.reserved = vec!["Admin".into()];
        let reserved = NamespaceSet::new([StoredNamespace {
            number: 2,
            namespace: Namespace::from_spec(spec.clone(), 2).unwrap(),
        }]);
        let request =
            resolve_begin(creates(vec![record("usernames", "ADMIN")]), &reserved).unwrap();
        assert!(matches!(
            check_creates(&request, &reserved),
            Err(ClaimsError::InvalidClaimValue { .. })
        ));
        spec.reserved.clear();
        spec.deprecated = true;
        let deprecated = NamespaceSet::new([StoredNamespace {
            number: 2,
            namespace: Namespace::from_spec(spec, 3).unwrap(),
        }]);
        assert!(matches!(
            check_creates(&request, &deprecated),
            Err(ClaimsError::NamespaceDeprecated { .. })
        ));
    }
}

//! Claim namespaces: the kinds of globally unique names a store holds (`usernames`, `emails`,
//! `routes`, and any a platform team adds at runtime), and the rules that say when two values
//! are *the same name*.
//!
//! A namespace's rules turn the value a cell sends (its *display form*, kept as sent) into the
//! *key* that uniqueness is decided on: `John`, `john` and `ＪＯＨＮ` are one username under
//! `precis-username`. Owns the normalizations, the value rules and their refusals, the
//! validation of a namespace's definition, and the decision whether a rule change needs the
//! store to prove that no existing claim breaks it ([`decide_namespace_update`],
//! [`prove_rules`]). Unicode tables come from `precis-profiles` (RFC 8265), never from here
//! (docs/decisions/107-the-server-normalizes.md).
//!
//! Must not do I/O: a store reads the namespace row and the claims a proof needs, and writes
//! what these functions decide.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use crate::error::ClaimsError;

use super::types::{ClaimType, MAX_VALUE_LEN};

/// Longest namespace id, in bytes (`[a-z0-9][a-z0-9._-]{0,62}`).
pub const MAX_NAMESPACE_ID_LEN: usize = 63;
/// Default of `serve --max-namespaces`: how many namespaces a store may hold.
pub const DEFAULT_MAX_NAMESPACES: usize = 1_000;
/// Longest `pattern`, in bytes.
pub const MAX_PATTERN_LEN: usize = 1_024;
/// Most memory a compiled `pattern` may take (the `regex` crate's size limit): a pattern is
/// compiled on every server for every request of its namespace, so its cost is bounded.
pub const PATTERN_SIZE_LIMIT: usize = 1 << 20;
/// Most `reserved` values of one namespace.
pub const MAX_RESERVED: usize = 1_000;
/// Longest `description`, in bytes.
pub const MAX_DESCRIPTION_LEN: usize = 1_024;
/// Most collisions and violations a refused rule change lists (it says how many more there are).
pub const MAX_LISTED_PROBLEMS: usize = 10;
/// The lowest store number of a namespace that is not built in (1–3 are the built-ins'; the
/// rest below is kept for built-ins to come).
pub const FIRST_NAMESPACE_NUMBER: i32 = super::names::FIRST_HASHED_NUMBER;

/// `max_chars` of the built-in namespaces and the default of a new one.
pub const DEFAULT_MAX_CHARS: u16 = 255;

/// The id of a namespace: 1..=63 bytes of `[a-z0-9._-]`, starting with a letter or digit.
/// Shared, not copied: every claim of the namespace holds one.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamespaceId(Arc<str>);

impl NamespaceId {
    pub fn parse(value: &str) -> Result<Self, ClaimsError> {
        Self::parse_field(value, "namespace")
    }

    pub fn parse_field(value: &str, field: &str) -> Result<Self, ClaimsError> {
        if let Some(problem) = namespace_id_problem(value) {
            return Err(ClaimsError::invalid(field, problem));
        }
        Ok(Self(Arc::from(value)))
    }

    /// The built-in namespace a legacy `claim_type` stands for (1/2/3: `routes`, `usernames`,
    /// `emails`).
    pub fn of_claim_type(claim_type: ClaimType) -> Self {
        Self(Arc::from(builtin_name(claim_type)))
    }

    /// A namespace as a cell's verify query names it: a legacy claim type's name (`username`,
    /// `email`, `routes`) or a namespace id.
    pub fn from_name_or_legacy(text: &str) -> Option<Self> {
        match ClaimType::from_name(text) {
            Some(claim_type) => Some(Self::of_claim_type(claim_type)),
            None => Self::parse(text).ok(),
        }
    }

    /// The built-in namespace of a legacy claim type number (1, 2, 3).
    pub fn from_legacy_number(number: i64) -> Option<Self> {
        ClaimType::from_number(number).map(Self::of_claim_type)
    }

    /// The wire number of [`claim_type`](Self::claim_type) (`ClaimRecord.claim_type`): 1, 2 or
    /// 3 for the built-ins, 0 (unset) for every other namespace.
    pub fn claim_type_number(&self) -> i32 {
        self.claim_type().map_or(0, ClaimType::number)
    }

    /// The number every store keys the namespace's claims by (the `claim_type` column): the
    /// built-ins keep 1, 2 and 3 (their legacy claim types), any other namespace has a fixed
    /// function of its id in [`FIRST_NAMESPACE_NUMBER`]`..=32767` (FNV-1a; PostgreSQL's
    /// `smallint`), so every server computes it without reading the store (decision 108). Two
    /// ids with one number cannot both exist: CreateNamespace refuses the second.
    pub fn store_number(&self) -> i32 {
        if let Some(claim_type) = self.claim_type() {
            return claim_type.number();
        }
        if self.0.is_empty() {
            return 0;
        }
        super::names::hashed_store_number(&self.0)
    }

    /// What a claim row's `namespace` column holds: NULL for a built-in (its number says it, as
    /// in every row written before namespaces), the id for any other namespace.
    pub fn row_column(&self) -> Option<&str> {
        self.claim_type().is_none().then(|| self.as_str())
    }

    /// The namespace of a claim row: its `namespace` column, else the built-in of its
    /// `claim_type`; `None` when neither names one (a corrupt row). A row whose column
    /// disagrees with its number is corrupt too.
    pub fn of_row(number: i64, column: Option<&str>) -> Option<Self> {
        match column {
            None => Self::from_legacy_number(number),
            Some(id) => Self::parse(id)
                .ok()
                .filter(|id| i64::from(id.store_number()) == number),
        }
    }

    /// The legacy `claim_type` of a built-in namespace; `None` for every other namespace.
    pub fn claim_type(&self) -> Option<ClaimType> {
        ClaimType::ALL
            .iter()
            .copied()
            .find(|t| builtin_name(*t) == self.as_str())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The empty id, which no namespace has: it sorts before every id (a range bound).
    pub(crate) fn lowest() -> Self {
        Self(Arc::from(""))
    }
}

impl fmt::Display for NamespaceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The ids of the built-in namespaces, in `claim_type` order.
pub const BUILTIN_NAMESPACES: [&str; 3] = ["routes", "usernames", "emails"];

fn builtin_name(claim_type: ClaimType) -> &'static str {
    match claim_type {
        ClaimType::Routes => BUILTIN_NAMESPACES[0],
        ClaimType::Username => BUILTIN_NAMESPACES[1],
        ClaimType::Email => BUILTIN_NAMESPACES[2],
    }
}

fn namespace_id_problem(value: &str) -> Option<String> {
    if value.is_empty() {
        return Some("must not be empty".to_owned());
    }
    if value.len() > MAX_NAMESPACE_ID_LEN {
        return Some(format!(
            "must be at most {MAX_NAMESPACE_ID_LEN} bytes, got {}",
            value.len()
        ));
    }
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !value.starts_with(allowed) {
        return Some("must start with [a-z0-9]".to_owned());
    }
    value
        .chars()
        .find(|c| !(allowed(*c) || matches!(c, '.' | '_' | '-')))
        .map(|bad| format!("may only contain [a-z0-9._-], found {bad:?}"))
}

/// How a namespace turns a value into its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Normalization {
    /// The key is the value, byte for byte.
    Exact = 1,
    /// ASCII letters lowercased, everything else as sent: `Example.COM` is `example.com`.
    AsciiCaseInsensitive = 2,
    /// RFC 8265 UsernameCaseMapped: fullwidth and halfwidth forms mapped to their
    /// decompositions, lowercased, NFC; a code point outside the PRECIS IdentifierClass (a
    /// space, a symbol, an unassigned code point) is refused.
    PrecisUsername = 3,
}

impl Normalization {
    pub const ALL: [Normalization; 3] = [
        Self::Exact,
        Self::AsciiCaseInsensitive,
        Self::PrecisUsername,
    ];

    /// The wire number (protobuf enum value, database column value).
    pub const fn number(self) -> i32 {
        self as i32
    }

    /// `None` for 0 (unspecified) and unknown numbers.
    pub fn from_number(number: i64) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|n| i64::from(n.number()) == number)
    }

    /// The name the CLI, the docs and the messages use.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Exact => "exact",
            Self::AsciiCaseInsensitive => "ascii-case-insensitive",
            Self::PrecisUsername => "precis-username",
        }
    }

    pub fn from_name(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|n| n.name() == text)
    }

    /// The key of `value`, or why the value has none under this normalization.
    pub fn apply<'a>(self, value: &'a str) -> Result<Cow<'a, str>, String> {
        use precis_core::profile::PrecisFastInvocation;
        match self {
            Self::Exact => Ok(Cow::Borrowed(value)),
            Self::AsciiCaseInsensitive => Ok(if value.bytes().any(|b| b.is_ascii_uppercase()) {
                Cow::Owned(value.to_ascii_lowercase())
            } else {
                Cow::Borrowed(value)
            }),
            // Printable ASCII (U+0021..U+007E) is all PVALID in the IdentifierClass, has no
            // width or Unicode form to map and no right-to-left character, so the profile is
            // its lowercase: 50 times cheaper than the general path, for most names people
            // type (the property test in `namespaces/tests.rs` holds it to the crate).
            Self::PrecisUsername
                if !value.is_empty() && value.bytes().all(|b| b.is_ascii_graphic()) =>
            {
                Ok(if value.bytes().any(|b| b.is_ascii_uppercase()) {
                    Cow::Owned(value.to_ascii_lowercase())
                } else {
                    Cow::Borrowed(value)
                })
            }
            Self::PrecisUsername => {
                precis_profiles::UsernameCaseMapped::enforce(value).map_err(|error| match error {
                    precis_core::Error::BadCodepoint(info) => {
                        let shown = char::from_u32(info.cp)
                            .map(|c| format!(" {c:?}"))
                            .unwrap_or_default();
                        format!(
                            "code point U+{:04X}{shown} at position {} is not allowed in a \
                             PRECIS username (RFC 8265 IdentifierClass)",
                            info.cp, info.position
                        )
                    }
                    other => format!("not a PRECIS username (RFC 8265): {other}"),
                })
            }
        }
    }
}

impl fmt::Display for Normalization {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which of a namespace's rules a value breaks (ErrorInfo metadata `rule` of
/// `INVALID_CLAIM_VALUE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueRule {
    Normalization,
    MaxChars,
    Pattern,
    Reserved,
}

impl ValueRule {
    pub const ALL: [ValueRule; 4] = [
        Self::Normalization,
        Self::MaxChars,
        Self::Pattern,
        Self::Reserved,
    ];

    pub fn from_name(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|rule| rule.name() == text)
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::Normalization => "normalization",
            Self::MaxChars => "max_chars",
            Self::Pattern => "pattern",
            Self::Reserved => "reserved",
        }
    }
}

impl fmt::Display for ValueRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a value has no key under a namespace's rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValueRefusal {
    pub rule: ValueRule,
    pub detail: String,
}

/// A namespace's `pattern`: a regular expression (the `regex` crate's syntax) the key must
/// match. Compared by its source text.
#[derive(Clone)]
pub struct NamePattern {
    regex: regex::Regex,
}

impl NamePattern {
    pub fn parse(source: &str, field: &str) -> Result<Self, ClaimsError> {
        if source.len() > MAX_PATTERN_LEN {
            return Err(ClaimsError::invalid(
                field,
                format!(
                    "must be at most {MAX_PATTERN_LEN} bytes, got {}",
                    source.len()
                ),
            ));
        }
        regex::RegexBuilder::new(source)
            .size_limit(PATTERN_SIZE_LIMIT)
            .build()
            .map(|regex| Self { regex })
            .map_err(|error| ClaimsError::invalid(field, format!("not a valid pattern: {error}")))
    }

    pub fn as_str(&self) -> &str {
        self.regex.as_str()
    }

    pub fn is_match(&self, key: &str) -> bool {
        self.regex.is_match(key)
    }
}

impl PartialEq for NamePattern {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for NamePattern {}

impl fmt::Debug for NamePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NamePattern({:?})", self.as_str())
    }
}

/// The rules that decide uniqueness: what the key of a value is, and which keys may exist.
/// Immutable while the namespace holds claims, unless the store proves the change breaks none
/// ([`prove_rules`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRules {
    pub normalization: Normalization,
    /// Most characters (Unicode scalar values) of the key: 1..=255. The key's 255-byte limit
    /// holds as well.
    pub max_chars: u16,
    pub pattern: Option<NamePattern>,
}

impl KeyRules {
    /// The key of `value` (its display form, as sent), or the rule it breaks.
    pub fn key_of<'a>(&self, value: &'a str) -> Result<Cow<'a, str>, ValueRefusal> {
        let key = self
            .normalization
            .apply(value)
            .map_err(|detail| ValueRefusal {
                rule: ValueRule::Normalization,
                detail,
            })?;
        let too_long = |detail: String| ValueRefusal {
            rule: ValueRule::MaxChars,
            detail,
        };
        if key.is_empty() {
            return Err(ValueRefusal {
                rule: ValueRule::Normalization,
                detail: "normalizes to an empty key".to_owned(),
            });
        }
        if key.len() > MAX_VALUE_LEN {
            return Err(too_long(format!(
                "its key is {} bytes, at most {MAX_VALUE_LEN}",
                key.len()
            )));
        }
        // The byte length bounds the char count: only count when it could exceed the limit.
        if key.len() > usize::from(self.max_chars) {
            let chars = key.chars().count();
            if chars > usize::from(self.max_chars) {
                return Err(too_long(format!(
                    "its key is {chars} characters, at most {}",
                    self.max_chars
                )));
            }
        }
        if let Some(pattern) = &self.pattern {
            if !pattern.is_match(&key) {
                return Err(ValueRefusal {
                    rule: ValueRule::Pattern,
                    detail: format!("its key {key:?} does not match {:?}", pattern.as_str()),
                });
            }
        }
        Ok(key)
    }

    /// Whether keys under `self` may differ from keys under `old` for the same value (a
    /// normalization change: the store must compute every key again).
    pub fn rekeys_from(&self, old: &KeyRules) -> bool {
        self.normalization != old.normalization
    }

    /// Whether a value with a key under `old` may have none under `self`: the store must prove
    /// that no existing claim breaks the new rules.
    pub fn may_refuse_what(&self, old: &KeyRules) -> bool {
        self.rekeys_from(old)
            || self.max_chars < old.max_chars
            || (self.pattern.is_some() && self.pattern != old.pattern)
    }
}

/// A namespace as the store holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespace {
    pub id: NamespaceId,
    pub rules: KeyRules,
    /// Values refused to every cell's creates, as the administrator gave them.
    pub reserved: Vec<String>,
    /// `reserved`'s keys under `rules`.
    reserved_keys: BTreeSet<String>,
    pub description: String,
    /// No new creates; destroys, updates and lookups work.
    pub deprecated: bool,
    /// 1 when created, one more at every change: the version of the rules a lease was decided
    /// under (stored in the lease payload).
    pub version: u64,
}

/// A namespace's definition as an administrator gives it (CreateNamespace), not yet validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceSpec {
    pub id: String,
    pub normalization: Normalization,
    pub max_chars: u16,
    pub pattern: Option<String>,
    pub reserved: Vec<String>,
    pub description: String,
    pub deprecated: bool,
}

impl NamespaceSpec {
    /// A spec with the defaults: `max_chars` 255, no pattern, nothing reserved.
    pub fn new(id: impl Into<String>, normalization: Normalization) -> Self {
        Self {
            id: id.into(),
            normalization,
            max_chars: DEFAULT_MAX_CHARS,
            pattern: None,
            reserved: Vec::new(),
            description: String::new(),
            deprecated: false,
        }
    }
}

/// What an UpdateNamespace changes: `None` keeps a field as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceUpdate {
    pub normalization: Option<Normalization>,
    pub max_chars: Option<u16>,
    /// `Some(None)` removes the pattern.
    pub pattern: Option<Option<String>>,
    pub reserved: Option<Vec<String>>,
    pub description: Option<String>,
    pub deprecated: Option<bool>,
}

impl Namespace {
    /// A built-in namespace as a new store creates it: `precis-username`, 255 characters.
    pub fn builtin(claim_type: ClaimType) -> Self {
        Self::from_spec(
            NamespaceSpec {
                description: format!(
                    "built-in: {} (claim_type {})",
                    builtin_name(claim_type),
                    claim_type.number()
                ),
                ..NamespaceSpec::new(builtin_name(claim_type), Normalization::PrecisUsername)
            },
            1,
        )
        .expect("the built-in definitions are valid")
    }

    /// Validates a definition (every field, each refusal naming it), at `version`.
    pub fn from_spec(spec: NamespaceSpec, version: u64) -> Result<Self, ClaimsError> {
        let id = NamespaceId::parse_field(&spec.id, "namespace.id")?;
        if spec.max_chars == 0 || usize::from(spec.max_chars) > MAX_VALUE_LEN {
            return Err(ClaimsError::invalid(
                "namespace.max_chars",
                format!("must be in 1..={MAX_VALUE_LEN}, got {}", spec.max_chars),
            ));
        }
        let pattern = match spec.pattern.as_deref() {
            None | Some("") => None,
            Some(source) => Some(NamePattern::parse(source, "namespace.pattern")?),
        };
        if spec.description.len() > MAX_DESCRIPTION_LEN {
            return Err(ClaimsError::invalid(
                "namespace.description",
                format!(
                    "must be at most {MAX_DESCRIPTION_LEN} bytes, got {}",
                    spec.description.len()
                ),
            ));
        }
        if spec.reserved.len() > MAX_RESERVED {
            return Err(ClaimsError::invalid(
                "namespace.reserved",
                format!("at most {MAX_RESERVED} values, got {}", spec.reserved.len()),
            ));
        }
        let rules = KeyRules {
            normalization: spec.normalization,
            max_chars: spec.max_chars,
            pattern,
        };
        let reserved_keys = reserved_keys(&rules, &spec.reserved)?;
        Ok(Self {
            id,
            rules,
            reserved: spec.reserved,
            reserved_keys,
            description: spec.description,
            deprecated: spec.deprecated,
            version,
        })
    }

    /// The definition this namespace was built from.
    pub fn spec(&self) -> NamespaceSpec {
        NamespaceSpec {
            id: self.id.to_string(),
            normalization: self.rules.normalization,
            max_chars: self.rules.max_chars,
            pattern: self.rules.pattern.as_ref().map(|p| p.as_str().to_owned()),
            reserved: self.reserved.clone(),
            description: self.description.clone(),
            deprecated: self.deprecated,
        }
    }

    /// The key of `value`, or INVALID_ARGUMENT `INVALID_CLAIM_VALUE` naming `field`, this
    /// namespace and the rule. Every path applies it: create, destroy, update, lookup.
    pub fn key_of<'a>(&self, value: &'a str, field: &str) -> Result<Cow<'a, str>, ClaimsError> {
        self.rules
            .key_of(value)
            .map_err(|refusal| self.refusal(field, refusal))
    }

    /// What a create of `key` must also pass: the namespace is not deprecated, and the key is
    /// not reserved.
    pub fn check_create(&self, key: &str, field: &str) -> Result<(), ClaimsError> {
        if self.deprecated {
            return Err(ClaimsError::NamespaceDeprecated {
                namespace: self.id.clone(),
            });
        }
        if self.reserved_keys.contains(key) {
            return Err(self.refusal(
                field,
                ValueRefusal {
                    rule: ValueRule::Reserved,
                    detail: format!("the key {key:?} is reserved"),
                },
            ));
        }
        Ok(())
    }

    fn refusal(&self, field: &str, refusal: ValueRefusal) -> ClaimsError {
        ClaimsError::InvalidClaimValue {
            field: field.to_owned(),
            namespace: self.id.clone(),
            rule: refusal.rule,
            detail: refusal.detail,
        }
    }
}

fn reserved_keys(rules: &KeyRules, reserved: &[String]) -> Result<BTreeSet<String>, ClaimsError> {
    reserved
        .iter()
        .enumerate()
        .map(|(i, value)| {
            let field = format!("namespace.reserved[{i}]");
            super::types::check_value(value, &field)?;
            rules.key_of(value).map(Cow::into_owned).map_err(|refusal| {
                ClaimsError::invalid(
                    field,
                    format!(
                        "{value:?} breaks the namespace's {} rule: {}",
                        refusal.rule, refusal.detail
                    ),
                )
            })
        })
        .collect()
}

/// What an UpdateNamespace does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceChange {
    /// The namespace after the change, its version one more.
    pub next: Namespace,
    /// Whether the store must prove, in the transaction that writes `next`, that the existing
    /// claims pass the new rules ([`prove_rules`]): a normalization change, a lower
    /// `max_chars`, or a new pattern. Description, deprecation and reserved values change
    /// at any time (a reserved value already claimed stays claimed).
    pub needs_proof: bool,
}

/// Decides an UpdateNamespace of `current` (validation only: the proof is the store's).
pub fn decide_namespace_update(
    current: &Namespace,
    update: NamespaceUpdate,
) -> Result<NamespaceChange, ClaimsError> {
    let mut spec = current.spec();
    if let Some(normalization) = update.normalization {
        spec.normalization = normalization;
    }
    if let Some(max_chars) = update.max_chars {
        spec.max_chars = max_chars;
    }
    if let Some(pattern) = update.pattern {
        spec.pattern = pattern;
    }
    if let Some(reserved) = update.reserved {
        spec.reserved = reserved;
    }
    if let Some(description) = update.description {
        spec.description = description;
    }
    if let Some(deprecated) = update.deprecated {
        spec.deprecated = deprecated;
    }
    let next = Namespace::from_spec(spec, current.version + 1)?;
    let needs_proof = next.rules.may_refuse_what(&current.rules);
    Ok(NamespaceChange { next, needs_proof })
}

/// A claim a proof reads: its key under the current rules, its display form (the value as the
/// creating cell sent it), and whether a lease holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProofClaim {
    pub key: String,
    pub display_value: String,
    pub leased: bool,
}

/// A claim whose key changes under the new rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rekey {
    pub old_key: String,
    pub new_key: String,
}

/// The proof of a rule change over every claim of the namespace: the new key of each claim
/// whose key changes, or FAILED_PRECONDITION `NAMESPACE_RULES_CONFLICT` listing the first
/// collisions (two claims with one new key) and violations (a claim with no key under the new
/// rules). A normalization change is also refused while a lease holds a claim of the namespace:
/// the lease was decided on keys the change would rewrite (retry when it ends).
pub fn prove_rules<'a>(
    namespace: &NamespaceId,
    current: &KeyRules,
    next: &KeyRules,
    claims: impl IntoIterator<Item = &'a ProofClaim>,
) -> Result<Vec<Rekey>, ClaimsError> {
    let rekeys = next.rekeys_from(current);
    let mut problems = Vec::new();
    let mut more = 0_u64;
    let mut note = |problem: String| {
        if problems.len() < MAX_LISTED_PROBLEMS {
            problems.push(problem);
        } else {
            more += 1;
        }
    };
    let mut by_new_key: BTreeMap<String, &str> = BTreeMap::new();
    let mut changes = Vec::new();
    let mut leased = 0_u64;
    for claim in claims {
        if rekeys && claim.leased {
            leased += 1;
        }
        match next.key_of(&claim.display_value) {
            Err(refusal) => note(format!(
                "{:?} breaks the {} rule: {}",
                claim.display_value, refusal.rule, refusal.detail
            )),
            Ok(new_key) => {
                if let Some(first) = by_new_key.get(new_key.as_ref()) {
                    note(format!(
                        "{first:?} and {:?} would both have the key {new_key:?}",
                        claim.display_value
                    ));
                    continue;
                }
                if new_key != claim.key {
                    changes.push(Rekey {
                        old_key: claim.key.clone(),
                        new_key: new_key.to_string(),
                    });
                }
                by_new_key.insert(new_key.into_owned(), &claim.display_value);
            }
        }
    }
    if leased > 0 {
        note(format!(
            "{leased} claim(s) are under a lease decided on the current keys (retry when the \
             leases end)"
        ));
    }
    if problems.is_empty() {
        return Ok(changes);
    }
    Err(ClaimsError::NamespaceRulesConflict {
        namespace: namespace.clone(),
        problems,
        more,
    })
}

#[cfg(test)]
mod tests;

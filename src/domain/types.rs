//! Plain data of the protocol: identifiers, claim records, claims with their lease state,
//! leases and lease outcomes. Constructors validate, so a value of these types is well-formed.

use std::fmt;

use uuid::Uuid;

use crate::error::ClaimsError;

use super::names::bad_number;
pub use super::names::{OwnerType, TableName, MAX_OPEN_NAME_LEN};
use super::namespaces::NamespaceId;

/// Longest cell id, in bytes.
pub const MAX_CELL_ID_LEN: usize = 100;
/// Longest claim or owner value, in bytes.
pub const MAX_VALUE_LEN: usize = 255;

/// A time as microseconds since the Unix epoch (UTC). Microseconds are what every store keeps
/// exactly (PostgreSQL `timestamptz`, SQLite integers, Spanner truncated from nanoseconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(i64);

/// The earliest and latest seconds a protobuf `Timestamp` may hold: 0001-01-01T00:00:00Z and
/// 9999-12-31T23:59:59Z (google/protobuf/timestamp.proto).
pub const TIMESTAMP_SECONDS: std::ops::RangeInclusive<i64> = -62_135_596_800..=253_402_300_799;

impl Timestamp {
    pub const fn from_unix_micros(micros: i64) -> Self {
        Self(micros)
    }

    /// A time given on the wire as seconds and nanoseconds, refused (INVALID_ARGUMENT naming
    /// `field`) unless it lies in protobuf Timestamp's range with nanos in 0..=999,999,999:
    /// never clamped or carried into the seconds.
    pub fn from_wire(seconds: i64, nanos: i32, field: &str) -> Result<Self, ClaimsError> {
        if !TIMESTAMP_SECONDS.contains(&seconds) {
            return Err(ClaimsError::invalid(
                field,
                format!(
                    "seconds {seconds} lie outside 0001-01-01T00:00:00Z..=9999-12-31T23:59:59Z"
                ),
            ));
        }
        if !(0..1_000_000_000).contains(&nanos) {
            return Err(ClaimsError::invalid(
                field,
                format!("nanos {nanos} lie outside 0..=999999999"),
            ));
        }
        Ok(Self(seconds * 1_000_000 + i64::from(nanos / 1000)))
    }

    pub const fn as_unix_micros(self) -> i64 {
        self.0
    }

    /// `self - earlier`, saturating at zero.
    pub fn saturating_since(self, earlier: Timestamp) -> std::time::Duration {
        std::time::Duration::from_micros(self.0.saturating_sub(earlier.0).max(0) as u64)
    }

    /// `self - duration`, saturating at the smallest timestamp.
    pub fn saturating_sub(self, duration: std::time::Duration) -> Timestamp {
        let micros = i64::try_from(duration.as_micros()).unwrap_or(i64::MAX);
        Timestamp(self.0.saturating_sub(micros))
    }

    /// `self + duration`, saturating at the largest timestamp.
    pub fn saturating_add(self, duration: std::time::Duration) -> Timestamp {
        let micros = i64::try_from(duration.as_micros()).unwrap_or(i64::MAX);
        Timestamp(self.0.saturating_add(micros))
    }
}

/// The id of a cell: 1..=100 bytes of `[A-Za-z0-9._-]`. Shared, not copied: every claim row,
/// lease and index entry of a cell holds one, so a clone is a reference count, not an allocation.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CellId(std::sync::Arc<str>);

impl CellId {
    pub fn parse(value: &str) -> Result<Self, ClaimsError> {
        Self::parse_field(value, "cell_id")
    }

    pub fn parse_field(value: &str, field: &str) -> Result<Self, ClaimsError> {
        check_len(value, MAX_CELL_ID_LEN, field)?;
        if let Some(bad) = value
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(ClaimsError::invalid(
                field,
                format!("may only contain [A-Za-z0-9._-], found {bad:?}"),
            ));
        }
        Ok(Self(std::sync::Arc::from(value)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CellId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Longest `local_transaction`, in bytes.
pub const MAX_LOCAL_TRANSACTION_LEN: usize = 256;

/// The cell's local transaction that will record a lease (`BeginUpdateRequest.local_transaction`):
/// 1..=256 bytes of printable ASCII. The service stores and returns it and never interprets it;
/// only the cell's reconciler reads it (for PostgreSQL `pg:<system_identifier>:<xid8>`, see
/// [`PgLocalTransaction`]).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LocalTransaction(String);

impl LocalTransaction {
    /// The field as sent: empty means none.
    pub fn parse_optional(value: &str) -> Result<Option<Self>, ClaimsError> {
        if value.is_empty() {
            return Ok(None);
        }
        Self::parse_field(value, "local_transaction").map(Some)
    }

    pub fn parse_field(value: &str, field: &str) -> Result<Self, ClaimsError> {
        check_len(value, MAX_LOCAL_TRANSACTION_LEN, field)?;
        if let Some(bad) = value.chars().find(|c| !(' '..='~').contains(c)) {
            return Err(ClaimsError::invalid(
                field,
                format!("may only contain printable ASCII, found {bad:?}"),
            ));
        }
        Ok(Self(value.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LocalTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A PostgreSQL local transaction as a cell names it in `local_transaction`:
/// `pg:<system_identifier>:<xid8>` (`SELECT system_identifier FROM pg_control_system()` and
/// `pg_current_xact_id()`, both as decimal integers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PgLocalTransaction {
    pub system_identifier: u64,
    pub xid8: u64,
}

impl PgLocalTransaction {
    /// `None` if `local` is not in this format (another database's, or malformed).
    pub fn parse(local: &LocalTransaction) -> Option<Self> {
        let rest = local.as_str().strip_prefix("pg:")?;
        let (system, xid) = rest.split_once(':')?;
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(system) || !digits(xid) {
            return None;
        }
        Some(Self {
            system_identifier: system.parse().ok()?,
            xid8: xid.parse().ok()?,
        })
    }

    pub fn to_local_transaction(self) -> LocalTransaction {
        LocalTransaction(self.to_string())
    }
}

impl fmt::Display for PgLocalTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pg:{}:{}", self.system_identifier, self.xid8)
    }
}

/// 1..=`max` bytes, or INVALID_ARGUMENT naming `field`.
fn check_len(value: &str, max: usize, field: &str) -> Result<(), ClaimsError> {
    match len_problem(value, max) {
        Some(problem) => Err(ClaimsError::invalid(field, problem)),
        None => Ok(()),
    }
}

/// What is wrong with the length of `value` (1..=`max` bytes), if anything.
fn len_problem(value: &str, max: usize) -> Option<String> {
    if value.is_empty() {
        return Some("must not be empty".to_owned());
    }
    if value.len() > max {
        return Some(format!("must be at most {max} bytes, got {}", value.len()));
    }
    None
}

/// What is wrong with a claim or owner value, if anything (see [`check_value`]).
fn value_problem(value: &str) -> Option<String> {
    if let Some(problem) = len_problem(value, MAX_VALUE_LEN) {
        return Some(problem);
    }
    // Most values are ASCII: a byte scan, not a char decode.
    let control = if value.is_ascii() {
        value.bytes().any(|b| b.is_ascii_control())
    } else {
        value.chars().any(char::is_control)
    };
    control.then(|| "must not contain control characters".to_owned())
}

/// Checks a claim or owner value: 1..=255 bytes of UTF-8 without control characters.
pub fn check_value(value: &str, field: &str) -> Result<(), ClaimsError> {
    match value_problem(value) {
        Some(problem) => Err(ClaimsError::invalid(field, problem)),
        None => Ok(()),
    }
}

macro_rules! protocol_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident = $num:literal => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name { $($variant = $num),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The wire number (protobuf enum value, database column value).
            pub const fn number(self) -> i32 {
                self as i32
            }

            /// The value for a wire number; `None` for 0 (unspecified) and unknown numbers.
            pub fn from_number(number: i64) -> Option<Self> {
                match number {
                    $($num => Some($name::$variant),)+
                    _ => None,
                }
            }

            /// The lowercase name used by the CLI and in messages.
            pub const fn name(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            /// Parses the lowercase name (case-insensitive).
            pub fn from_name(text: &str) -> Option<Self> {
                let text = text.to_ascii_lowercase();
                match text.as_str() {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }

            /// Parses a wire number from a request field, refusing unspecified and unknown values.
            pub fn parse_field(number: i32, field: &str) -> Result<Self, ClaimsError> {
                Self::from_number(number.into()).ok_or_else(|| bad_number(number, field))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

protocol_enum!(
    /// What kind of value is claimed.
    ClaimType { Routes = 1 => "routes", Username = 2 => "username", Email = 3 => "email" }
);
protocol_enum!(
    /// What a lease does to a claim when committed.
    LeaseOp { Create = 1 => "create", Destroy = 2 => "destroy", Update = 3 => "update" }
);

/// The identity of a claim, unique across all cells: its namespace and its key there (the value
/// under the namespace's rules, `domain::namespaces`). Ordered as the stores order claims: by
/// namespace number, then key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClaimKey {
    pub namespace: NamespaceId,
    /// The key: the value normalized under the namespace's rules. In a request as decoded,
    /// before the store resolved it, the value as sent.
    pub value: String,
}

impl ClaimKey {
    pub fn new(namespace: impl Into<NamespaceId>, value: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            value: value.into(),
        }
    }

    /// A key that sorts before every claim's key (a range bound, never a claim).
    pub(crate) fn lowest() -> Self {
        Self {
            namespace: NamespaceId::lowest(),
            value: String::new(),
        }
    }

    /// The namespace's number in the store ([`NamespaceId::store_number`]: 1, 2 and 3 for the
    /// built-ins), the column every store keys claims by. Within a record, claims are ordered
    /// by this number, then by key.
    pub fn namespace_number(&self) -> i32 {
        self.namespace.store_number()
    }
}

impl Ord for ClaimKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.namespace_number(), &self.namespace, &self.value).cmp(&(
            other.namespace_number(),
            &other.namespace,
            &other.value,
        ))
    }
}

impl PartialOrd for ClaimKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl From<ClaimType> for NamespaceId {
    fn from(claim_type: ClaimType) -> Self {
        NamespaceId::of_claim_type(claim_type)
    }
}

impl fmt::Display for ClaimKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.value)
    }
}

/// A claim as a cell asks for it: the key plus who owns it and which local record implies it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClaimRecord {
    pub key: ClaimKey,
    /// The value as the creating cell sent it, when it differs from the key (`None`: the key
    /// is the value as sent).
    pub display: Option<String>,
    pub owner_type: OwnerType,
    pub owner_value: String,
    pub table_name: TableName,
    pub table_record_id: i64,
}

impl ClaimRecord {
    /// The value as the cell sent it (its display form).
    pub fn display_value(&self) -> &str {
        self.display.as_deref().unwrap_or(&self.key.value)
    }

    /// Whether `other` asks for the same thing, comparing values as sent (a replay is
    /// recognised whatever the rules compute for it now).
    pub fn same_as_sent(&self, other: &ClaimRecord) -> bool {
        self.key.namespace == other.key.namespace
            && self.display_value() == other.display_value()
            && self.owner_type == other.owner_type
            && self.owner_value == other.owner_value
            && self.table_name == other.table_name
            && self.table_record_id == other.table_record_id
    }

    /// Validates every field; `field` prefixes error paths (e.g. `creates_claims[3]`). The
    /// path is only written out for an error: a valid record costs no allocation (pass
    /// `format_args!`), which matters as every BeginUpdate checks each of its records.
    pub fn check(&self, field: impl fmt::Display) -> Result<(), ClaimsError> {
        let invalid = |name: &str, problem: String| {
            Err(ClaimsError::invalid(format!("{field}.{name}"), problem))
        };
        if let Some(problem) = value_problem(self.display_value()) {
            return invalid("claim_value", problem);
        }
        if let Some(problem) = value_problem(&self.owner_value) {
            return invalid("owner_value", problem);
        }
        if let Some(problem) = record_id_problem(self.table_record_id) {
            return invalid("table_record_id", problem);
        }
        Ok(())
    }
}

/// Checks a table record id: `0 <= id < i64::MAX` (so `id + 1` is always a valid range end).
pub fn check_record_id(id: i64, field: &str) -> Result<(), ClaimsError> {
    match record_id_problem(id) {
        Some(problem) => Err(ClaimsError::invalid(field, problem)),
        None => Ok(()),
    }
}

fn record_id_problem(id: i64) -> Option<String> {
    (!(0..i64::MAX).contains(&id)).then(|| format!("must be in 0..{}, got {id}", i64::MAX))
}

/// A lease id: a UUID, written lowercase and hyphenated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseId(Uuid);

impl LeaseId {
    /// A fresh random (v4) lease id.
    pub fn generate() -> Self {
        Self(Uuid::new_v4())
    }

    pub const fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    pub const fn as_uuid(&self) -> &Uuid {
        &self.0
    }

    /// Parses a hyphenated 36-character UUID in any case.
    pub fn parse(value: &str) -> Result<Self, ClaimsError> {
        Self::parse_field(value, "lease_id")
    }

    pub fn parse_field(value: &str, field: &str) -> Result<Self, ClaimsError> {
        if value.is_empty() {
            return Err(ClaimsError::invalid(field, "must not be empty"));
        }
        if value.len() != 36 {
            return Err(ClaimsError::invalid(
                field,
                format!(
                    "must be a hyphenated 36-character UUID, got {} bytes",
                    value.len()
                ),
            ));
        }
        Uuid::try_parse(value)
            .map(Self)
            .map_err(|_| ClaimsError::invalid(field, "must be a hyphenated 36-character UUID"))
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.hyphenated())
    }
}

/// A BeginUpdate request, validated field by field (batch-level rules are in `decide`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BeginUpdate {
    pub cell_id: CellId,
    /// The client-chosen lease id, or `None` for the store to pick one.
    pub lease_id: Option<LeaseId>,
    pub creates: Vec<ClaimRecord>,
    pub destroys: Vec<ClaimRecord>,
    /// Claims the caller holds whose owner, table and record id change in place on commit: the
    /// new values (the key names the claim). The claim is never free in between.
    pub updates: Vec<ClaimRecord>,
    /// The cell's local transaction that will record this lease, if the cell names it. Part of
    /// the content (a retry must send the same); never interpreted by the service.
    pub local_transaction: Option<LocalTransaction>,
}

impl BeginUpdate {
    /// Whether `other` asks for the same thing (used to recognise a retried BeginUpdate).
    pub fn same_content(&self, other: &BeginUpdate) -> bool {
        let same = |a: &[ClaimRecord], b: &[ClaimRecord]| {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| a.same_as_sent(b))
        };
        self.cell_id == other.cell_id
            && same(&self.creates, &other.creates)
            && same(&self.destroys, &other.destroys)
            && same(&self.updates, &other.updates)
            && self.local_transaction == other.local_transaction
    }

    /// Every claim of the batch with the operation it asks for: creates, then destroys, then
    /// updates.
    pub fn operations(&self) -> impl Iterator<Item = (LeaseOp, &ClaimRecord)> {
        self.creates
            .iter()
            .map(|r| (LeaseOp::Create, r))
            .chain(self.destroys.iter().map(|r| (LeaseOp::Destroy, r)))
            .chain(self.updates.iter().map(|r| (LeaseOp::Update, r)))
    }

    pub fn len(&self) -> usize {
        self.creates.len() + self.destroys.len() + self.updates.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An outstanding lease: what BeginUpdate returned (the lease payload) plus its last renewal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub lease_id: LeaseId,
    pub cell_id: CellId,
    pub created_at: Timestamp,
    /// `created_at` until the first renewal. Staleness counts from here.
    pub last_renewed_at: Timestamp,
    /// The complete original request, as sent (its `lease_id` is `None` if the store chose it).
    pub request: BeginUpdate,
}

/// A lease's claim marker: which lease holds the claim and what committing it will do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClaimLease {
    pub lease_id: LeaseId,
    pub op: LeaseOp,
}

/// The lifecycle state of a stored claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClaimState {
    /// Committed, under no lease.
    Active,
    /// Leased for creation: routable, but not yet committed.
    Creating,
    /// Committed, leased for destruction.
    Destroying,
    /// Committed, leased for an in-place update: routable with its current (old) values until
    /// the commit replaces them.
    Updating,
}

impl ClaimState {
    pub const fn name(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Creating => "creating",
            Self::Destroying => "destroying",
            Self::Updating => "updating",
        }
    }
}

/// A stored claim: one row per key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub record: ClaimRecord,
    /// The cell that created the claim (and alone may destroy it).
    pub cell_id: CellId,
    pub lease: Option<ClaimLease>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// The revision of the claim's last change (the change feed's, `domain::events`); 0 on a
    /// store without one.
    pub revision: u64,
}

impl Claim {
    pub fn key(&self) -> &ClaimKey {
        &self.record.key
    }

    pub fn state(&self) -> ClaimState {
        match self.lease {
            None => ClaimState::Active,
            Some(ClaimLease {
                op: LeaseOp::Create,
                ..
            }) => ClaimState::Creating,
            Some(ClaimLease {
                op: LeaseOp::Destroy,
                ..
            }) => ClaimState::Destroying,
            Some(ClaimLease {
                op: LeaseOp::Update,
                ..
            }) => ClaimState::Updating,
        }
    }
}

/// How a lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LeaseOutcome {
    Committed,
    RolledBack,
}

impl LeaseOutcome {
    /// The number stored in databases.
    pub const fn number(self) -> i32 {
        match self {
            Self::Committed => 1,
            Self::RolledBack => 2,
        }
    }

    pub fn from_number(number: i64) -> Option<Self> {
        match number {
            1 => Some(Self::Committed),
            2 => Some(Self::RolledBack),
            _ => None,
        }
    }
}

/// The remembered end of a lease (kept for the outcome retention period).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub lease_id: LeaseId,
    pub cell_id: CellId,
    pub outcome: LeaseOutcome,
    pub decided_at: Timestamp,
}

/// What a store knows about a lease id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseRecord {
    Outstanding(Lease),
    Ended(Outcome),
}

/// A page request of ListOutstandingLeases (leases ordered by lease id).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeasesQuery {
    pub cell_id: CellId,
    /// Exclusive lower bound: the `next_cursor` of the previous page.
    pub after: Option<LeaseId>,
    pub limit: usize,
    /// Budget of the encoded response (`--max-response-bytes`, see
    /// [`leases_page`](crate::domain::leases_page)). The server's own: the service fills it in,
    /// a client's value is never sent.
    pub max_bytes: usize,
}

/// A page of ListOutstandingLeases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeasesPage {
    pub leases: Vec<Lease>,
    /// The cursor for the next page; `None` on the last page.
    pub next_cursor: Option<LeaseId>,
    /// The store's clock when the page was read: judge staleness against this, never a local clock.
    pub server_time: Timestamp,
    /// The store's latest restore as the page's cell sees it: set by the front end (stores leave
    /// it `None`), read by the reconciler and the verifier (`domain::restore`).
    pub restore: Option<crate::domain::RestoreView>,
}

/// Where a ListClaims page starts: at record id `record_id`, or, with `after_key`, after that
/// claim of record `record_id` (a page that ended inside a record continues there).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClaimsCursor {
    pub record_id: i64,
    /// Start after this claim (in `(claim_type, claim_value)` order) of record `record_id`.
    pub after_key: Option<ClaimKey>,
}

impl ClaimsCursor {
    /// The start of record `record_id` (`0` for the first page).
    pub const fn at(record_id: i64) -> Self {
        Self {
            record_id,
            after_key: None,
        }
    }

    /// The exclusive lower bound of the page in page order, as stored columns
    /// `(table_record_id, claim_type, claim_value)`: a store reads the claims with
    /// `(table_record_id, claim_type, claim_value) > start_after()`. Without a key it is
    /// `(record_id, 0, "")`, which sorts before every claim of `record_id` (claim types are
    /// numbered from 1).
    pub fn start_after(&self) -> (i64, i32, &str) {
        match &self.after_key {
            Some(key) => (self.record_id, key.namespace_number(), key.value.as_str()),
            None => (self.record_id, 0, ""),
        }
    }
}

/// A page request of ListClaims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimsQuery {
    pub cell_id: CellId,
    pub table_name: TableName,
    pub cursor: ClaimsCursor,
    /// Most claims on the page (0 is taken as 1).
    pub limit: usize,
    /// Budget of the encoded response (`--max-response-bytes`, see
    /// [`claims_page`](crate::domain::claims_page)). The server's own: the service fills it in,
    /// a client's value is never sent.
    pub max_bytes: usize,
}

/// A page of ListClaims: every claim with `start_range <= table_record_id < end_range`, plus,
/// when the page ended inside record `end_range` (`next_cursor` has an `after_key`), the first
/// claims of that record. See [`claims_page`](crate::domain::claims_page).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimsPage {
    pub claims: Vec<Claim>,
    pub start_range: i64,
    pub end_range: i64,
    /// `None` on the last page (whose `end_range` is `i64::MAX`); else its `record_id` is
    /// `end_range`.
    pub next_cursor: Option<ClaimsCursor>,
}

impl ClaimsPage {
    /// The record the page ended inside (`end_range`, when the next cursor has a key): its first
    /// claims are the last of this page, the rest start the next one.
    pub fn split_record(&self) -> Option<i64> {
        split_record(self.next_cursor.as_ref())
    }
}

fn split_record(next_cursor: Option<&ClaimsCursor>) -> Option<i64> {
    next_cursor
        .filter(|next| next.after_key.is_some())
        .map(|next| next.record_id)
}

/// A claim as a client of the API sees it: like [`Claim`], but with its state instead of the
/// lease that holds it (lease ids are not revealed to other cells).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimView {
    pub record: ClaimRecord,
    pub cell_id: CellId,
    pub state: ClaimState,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// The revision of its last change: watch from the next one to follow it.
    pub revision: u64,
}

impl From<Claim> for ClaimView {
    fn from(claim: Claim) -> Self {
        ClaimView {
            state: claim.state(),
            record: claim.record,
            cell_id: claim.cell_id,
            created_at: claim.created_at,
            updated_at: claim.updated_at,
            revision: claim.revision,
        }
    }
}

/// A page of ListClaims as a client sees it (the same ranges and cursor as [`ClaimsPage`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimViewsPage {
    pub claims: Vec<ClaimView>,
    pub start_range: i64,
    pub end_range: i64,
    pub next_cursor: Option<ClaimsCursor>,
    /// The server's opaque token of `next_cursor`: send it back to read the next page (`None`
    /// on the last page, or from a server older than page tokens: then send `next_cursor`).
    pub next_page_token: Option<String>,
}

impl ClaimViewsPage {
    /// As [`ClaimsPage::split_record`].
    pub fn split_record(&self) -> Option<i64> {
        split_record(self.next_cursor.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(error: ClaimsError) -> String {
        match error {
            ClaimsError::InvalidRequest { field, .. } => field,
            other => panic!("expected InvalidRequest, got {other:?}"),
        }
    }

    #[test]
    fn impossible_wire_times_are_refused_never_clamped() {
        for (seconds, nanos) in [
            (-62_135_596_801, 0),
            (i64::MIN, 0),
            (253_402_300_800, 0),
            (0, -1),
            (0, 2_000_000_000),
        ] {
            let error = Timestamp::from_wire(seconds, nanos, "backup_time").unwrap_err();
            assert!(
                matches!(error, ClaimsError::InvalidRequest { .. }),
                "{seconds} {nanos}: {error:?}"
            );
            assert!(error.to_string().contains("backup_time"), "{error}");
        }
        assert_eq!(
            Timestamp::from_wire(1, 999_999_999, "t").unwrap(),
            Timestamp::from_unix_micros(1_999_999)
        );
        assert!(Timestamp::from_wire(-62_135_596_800, 0, "t").is_ok());
        assert!(Timestamp::from_wire(253_402_300_799, 999_999_999, "t").is_ok());
    }

    #[test]
    fn empty_local_transaction_means_none() {
        assert_eq!(LocalTransaction::parse_optional("").unwrap(), None);
    }

    #[test]
    fn local_transaction_of_printable_ascii_up_to_256_bytes_is_kept_as_sent() {
        for text in ["pg:1:2", " ~!x", &"a".repeat(MAX_LOCAL_TRANSACTION_LEN)] {
            let parsed = LocalTransaction::parse_optional(text).unwrap().unwrap();
            assert_eq!(parsed.as_str(), text);
        }
    }

    #[test]
    fn local_transaction_too_long_or_not_printable_ascii_is_invalid_naming_the_field() {
        let too_long = "a".repeat(MAX_LOCAL_TRANSACTION_LEN + 1);
        for text in [too_long.as_str(), "pg:1:\n2", "tab\there", "é", "\u{7f}"] {
            let error = LocalTransaction::parse_optional(text).unwrap_err();
            assert_eq!(field_of(error), "local_transaction", "{text:?}");
        }
    }

    #[test]
    fn postgres_local_transaction_reads_system_identifier_and_xid8() {
        let local =
            LocalTransaction::parse_field("pg:7311234567890123456:4294967298", "f").unwrap();
        let pg = PgLocalTransaction::parse(&local).unwrap();
        assert_eq!(pg.system_identifier, 7_311_234_567_890_123_456);
        assert_eq!(pg.xid8, 4_294_967_298);
        assert_eq!(pg.to_local_transaction(), local, "round-trips");
    }

    #[test]
    fn other_formats_are_not_postgres_local_transactions() {
        for text in [
            "mysql:1:2",
            "pg:1",
            "pg::2",
            "pg:1:",
            "pg:1:2:3",
            "pg:-1:2",
            "pg:+1:2",
            "pg:1:99999999999999999999",
        ] {
            let local = LocalTransaction::parse_field(text, "f").unwrap();
            assert_eq!(PgLocalTransaction::parse(&local), None, "{text}");
        }
    }
}

//! Every SQL text of the crate: the embedded migrations, the statements of the claim store and
//! of the local lease store. Other modules only reference these constants, so the benchmark can
//! run exactly the statements the adapter runs, and a reviewer reads all SQL in one place.
//!
//! Must not contain protocol decisions (those are the domain's) or values: every value is a
//! `$n` parameter of a prepared statement. The only text spliced into SQL is a schema name that
//! [`quote_schema`] has validated as a plain identifier.

use crate::ClaimsError;

/// One embedded, versioned migration.
#[derive(Clone, Copy, Debug)]
pub struct Migration {
    pub version: i32,
    pub name: &'static str,
    pub sql: &'static str,
}

/// All migrations, oldest first. Append only: a released migration never changes.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "0001_initial",
        sql: include_str!("../migrations/0001_initial.sql"),
    },
    Migration {
        version: 2,
        name: "0002_decommissioned_cells",
        sql: include_str!("../migrations/0002_decommissioned_cells.sql"),
    },
    Migration {
        version: 3,
        name: "0003_verification_slots",
        sql: include_str!("../migrations/0003_verification_slots.sql"),
    },
    Migration {
        version: 4,
        name: "0004_restore_epochs",
        sql: include_str!("../migrations/0004_restore_epochs.sql"),
    },
    Migration {
        version: 5,
        name: "0005_namespaces",
        sql: include_str!("../migrations/0005_namespaces.sql"),
    },
    Migration {
        version: 6,
        name: "0006_open_names",
        sql: include_str!("../migrations/0006_open_names.sql"),
    },
    Migration {
        version: 7,
        name: "0007_claim_events",
        sql: include_str!("../migrations/0007_claim_events.sql"),
    },
    Migration {
        version: 8,
        name: "0008_lease_waits",
        sql: include_str!("../migrations/0008_lease_waits.sql"),
    },
];

/// Advisory lock class (first key of the two-key form) of schema migrations; the second key is
/// `hashtext(schema)`, so parallel servers on one schema serialise and different schemas don't.
pub const MIGRATION_LOCK_CLASS: i32 = 0x7C1A_0000;
/// Advisory lock class of lease ids, second key the id folded to 32 bits: every transaction
/// that reads or writes a lease takes its lock first (see `store.rs`, "why an advisory lock"),
/// or, in a group of more than `locks::LEASE_EXACT_LIMIT` ids, its stripe exclusively.
pub const LEASE_LOCK_CLASS: i32 = 0x7C1A_0001;
/// Advisory lock class of lease stripes, second key `lease lock key mod locks::LEASE_STRIPES`:
/// held shared beside the exact lease locks, exclusive instead of them (`locks.rs`).
pub const LEASE_STRIPE_LOCK_CLASS: i32 = 0x7C1A_0005;
/// Advisory lock class of cells, second key the cell's stripe (`locks::CELL_STRIPES`):
/// BeginUpdate holds it shared, a decommission step exclusive, so a step's lease count and mark
/// cannot interleave with a BeginUpdate of the cell (see `store.rs`, "why a cell lock").
pub const CELL_LOCK_CLASS: i32 = 0x7C1A_0002;

/// Advisory lock class of claim keys, second key a 32-bit hash of (claim type, value): every
/// BeginUpdate (lone or in a group) takes the locks of the keys it names, after its lease locks,
/// or, above `locks::KEY_EXACT_LIMIT` keys, their stripes exclusively. A claim that does not
/// exist yet has no row to lock; without this, two transactions inserting one hot key would
/// race to the primary key and the loser retry, and a group of many keys would keep losing (see
/// `store.rs`, "why key locks").
pub const KEY_LOCK_CLASS: i32 = 0x7C1A_0004;
/// Advisory lock class of claim key stripes, second key `key lock key mod locks::KEY_STRIPES`.
pub const KEY_STRIPE_LOCK_CLASS: i32 = 0x7C1A_0006;

/// Advisory lock class of the verification slots, second key `hashtext(current_schema())` (one
/// lock per store, as the table is one per schema): every acquire takes it before
/// it reads `verification_slots` (see `store.rs`, "why a slot lock").
pub const SLOT_LOCK_CLASS: i32 = 0x7C1A_0003;

/// Advisory lock class of the restore epochs, second key `hashtext(current_schema())`: every
/// mark, report and lift takes it before it reads `restore_epochs` (see `restore.rs`, "why a
/// restore lock").
pub const RESTORE_LOCK_CLASS: i32 = 0x7C1A_0007;

/// Advisory lock class of serving, second key `hashtext(current_schema())`: every `serve` holds
/// it shared on a connection of its own for its life, and a restore takes it exclusively
/// (`transfer.rs`), so a restore is refused while a server uses the store.
pub const SERVING_LOCK_CLASS: i32 = 0x7C1A_0008;
/// Waits for any restore of the schema to end, then holds the serving lock (class `$1`) shared.
pub const LOCK_SERVING_SHARED: &str =
    "SELECT pg_advisory_lock_shared($1::int4, hashtext(current_schema()))";
/// The serving lock (class `$1`), exclusively, if no server holds it: true when taken.
pub const TRY_LOCK_SERVING: &str =
    "SELECT pg_try_advisory_lock($1::int4, hashtext(current_schema()))";
pub const UNLOCK_SERVING: &str = "SELECT pg_advisory_unlock($1::int4, hashtext(current_schema()))";
/// Rows a restore would replace: claims, leases, outcomes, restore epochs, decommissions.
pub const COUNT_RESTORABLE_ROWS: &str = "SELECT (SELECT count(*) FROM claims) \
     + (SELECT count(*) FROM leases) + (SELECT count(*) FROM lease_outcomes) \
     + (SELECT count(*) FROM restore_epochs) + (SELECT count(*) FROM decommissioned_cells)";
/// Empties every table a restore fills (the namespaces too: the backup brings its own), and the
/// verification slots, which a restored store starts without.
pub const CLEAR_FOR_RESTORE: &str = "TRUNCATE claims, leases, lease_outcomes, \
     decommissioned_cells, restore_reports, restore_epochs, verification_slots, namespaces";

/// The last statement of a restore: the change feed's history is not the restored claims', so
/// every watch from before it is refused (WATCH_COMPACTED, decision 117): no events, compacted
/// through the restore's own transaction.
pub const FENCE_WATCHERS: &str = "DELETE FROM claim_events; \
     UPDATE watch_state SET compacted_through = \
     greatest(compacted_through, pg_current_xact_id()::text::bigint)";

/// The bookkeeping table of applied migrations (named so it cannot clash with an application's
/// own `schema_migrations`).
pub const CREATE_MIGRATIONS_TABLE: &str = "\
CREATE TABLE IF NOT EXISTS topology_claims_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)";

/// Migrations may legitimately run (or wait for another server's migration) longer than the
/// request statement timeout; this lifts it for the migration transaction only.
pub const MIGRATION_NO_STATEMENT_TIMEOUT: &str = "SET LOCAL statement_timeout = 0";

/// `$1` class, `$2` the schema name, or NULL for the connection's current schema.
pub const LOCK_MIGRATIONS: &str =
    "SELECT pg_advisory_xact_lock($1::int4, hashtext(coalesce($2::text, current_schema(), '')))";
pub const MIGRATIONS_TABLE_EXISTS: &str =
    "SELECT to_regclass('topology_claims_migrations') IS NOT NULL";
pub const SELECT_APPLIED_MIGRATIONS: &str =
    "SELECT version, name FROM topology_claims_migrations ORDER BY version";
pub const INSERT_APPLIED_MIGRATION: &str =
    "INSERT INTO topology_claims_migrations (version, name) VALUES ($1::int4, $2::text)";

/// `CREATE SCHEMA IF NOT EXISTS "name"` for a validated schema name.
pub fn create_schema(schema: &str) -> Result<String, ClaimsError> {
    Ok(format!(
        "CREATE SCHEMA IF NOT EXISTS {}",
        quote_schema(schema)?
    ))
}

/// Quotes a schema name after checking it is a plain lowercase identifier
/// (`[a-z_][a-z0-9_]*`, at most 63 bytes): identifiers cannot be bound as parameters, so only
/// names that need no escaping at all are accepted.
pub fn quote_schema(schema: &str) -> Result<String, ClaimsError> {
    let mut chars = schema.chars();
    let plain = matches!(chars.next(), Some('a'..='z' | '_'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
        && schema.len() <= 63;
    if plain {
        Ok(format!("\"{schema}\""))
    } else {
        Err(ClaimsError::Configuration {
            message: format!(
                "PostgreSQL schema name {schema:?} must match [a-z_][a-z0-9_]* and be at most 63 bytes"
            ),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Claim store: transactions.

pub const BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";
/// The lease transactions' `BEGIN` (BeginUpdate, CommitUpdate, RollbackUpdate, groups, RenewLease):
/// their statements are point lookups and writes by key, whose generic plans are as good as any
/// custom one, so they are planned once per connection instead of at every execution (without
/// it PostgreSQL kept choosing custom plans: 0.1–0.2 ms of planning per statement, about 14 % of
/// a lone BeginUpdate + CommitUpdate pair; docs/benchmarks.md, "What a lone pair costs").
/// `SET LOCAL` ends with the transaction; listings and scans keep the server's own choice.
pub const BEGIN_LEASE: &str =
    "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL plan_cache_mode = force_generic_plan";
/// [`BEGIN_LEASE`] that first drops the connection's cached plans (`DISCARD PLANS`), sent every
/// [`REPLAN_EVERY`] uses of a connection: a plan is made from the table sizes of its time, and a
/// server started on an empty store would otherwise keep, for the life of its connections,
/// plans made for empty tables (a scan of the whole `claims` table per BeginUpdate where an
/// index lookup is right; PostgreSQL replans by itself only after an `ANALYZE`, and autovacuum
/// may be off). The statements stay prepared; the next execution of each plans it again.
pub const BEGIN_LEASE_REPLANNED: &str = "BEGIN ISOLATION LEVEL READ COMMITTED; DISCARD PLANS; \
     SET LOCAL plan_cache_mode = force_generic_plan";
/// How many uses of a pooled connection between two [`BEGIN_LEASE_REPLANNED`].
pub const REPLAN_EVERY: usize = 500;
pub const COMMIT: &str = "COMMIT";
pub const ROLLBACK: &str = "ROLLBACK";

/// Every advisory lock of a transaction, in the order of the arrays (`locks::AdvisoryLocks`):
/// `$1` the classes, `$2` the second keys, `$3` whether each is taken shared. The ordinality
/// keeps the arrays' order (the lock calls, volatile, are evaluated row by row in it), which is
/// the one total order of `store.rs`, "lock order". Advisory locks are database-wide; the second
/// key is XORed with `hashtext(current_schema())` so that stores in different schemas of one
/// database do not share stripes (a bijection within a schema: equal keys stay equal, distinct
/// ones distinct).
pub const LOCK_ADVISORY: &str = "\
SELECT CASE WHEN l.shared
            THEN pg_advisory_xact_lock_shared(l.lock_class, l.lock_key # hashtext(current_schema()))
            ELSE pg_advisory_xact_lock(l.lock_class, l.lock_key # hashtext(current_schema())) END
FROM unnest($1::int4[], $2::int4[], $3::bool[]) WITH ORDINALITY AS l(lock_class, lock_key, shared, n)
ORDER BY l.n";

/// Whether cell `$1` is recorded as decommissioned.
pub const CELL_DECOMMISSIONED: &str =
    "SELECT EXISTS (SELECT 1 FROM decommissioned_cells WHERE cell_id = $1::text)";

/// The columns of a claim row, in the order `rows::claim` reads them.
macro_rules! claim_columns {
    () => {
        "claim_type, claim_value, owner_type, owner_value, table_name, table_record_id, \
         cell_id, lease_id, lease_op, created_at, updated_at, display_value, namespace, \
         owner_type_name, source_table, revision"
    };
}

/// The claim rows of the keys `$keys` yields (a `FROM` item of columns `t`, `v`: claim type,
/// value), each once, locked in key order: the sorted, distinct keys drive a primary-key probe
/// each in a `LATERAL` subquery that locks, which PostgreSQL cannot flatten into a join of its
/// choice, so the plan does not depend on the table's statistics (decision 122).
macro_rules! lock_claims_of_keys {
    ($keys:literal) => {
        concat!(
            "SELECT ",
            claim_columns!(),
            " FROM (
    SELECT DISTINCT k.t, k.v COLLATE \"C\" AS v
    FROM ",
            $keys,
            "
    ORDER BY 1, 2) AS k
CROSS JOIN LATERAL (
    SELECT ",
            claim_columns!(),
            " FROM claims AS c WHERE c.claim_type = k.t AND c.claim_value = k.v FOR UPDATE) AS c
ORDER BY claim_type, claim_value"
        )
    };
}

/// The change feed's bounds in one snapshot: the revision below which every transaction has
/// ended (the snapshot's xmin), and the compacted history.
pub const WATCH_BOUNDS: &str = "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint, \
     compacted_through FROM watch_state";

/// The events at or after (`$1`, `$2`) of the transactions that have ended before `$3` (an
/// earlier snapshot's xmin), in log order, at most `$4`.
pub const SELECT_EVENTS: &str = concat!(
    "SELECT ",
    claim_columns!(),
    ", seq, deleted FROM claim_events
WHERE (revision, seq) >= ($1::bigint, $2::bigint) AND revision < $3::bigint
ORDER BY revision, seq LIMIT $4::bigint"
);

/// The change feed's length for compaction, read from the event sequence and the oldest event
/// (two index probes), not by counting the log (decision 124): the sequence's last value minus
/// the oldest event's number, plus one. Numbers taken by transactions that rolled back count as
/// events, so the estimate errs towards keeping fewer events than `--watch-max-events`; writers
/// that interleave their numbers can make it a few events short of the real length.
pub const ESTIMATE_EVENTS: &str = "SELECT greatest(coalesce(\
     (SELECT last_value FROM claim_events_seq) \
     - (SELECT seq FROM claim_events ORDER BY revision, seq LIMIT 1) + 1, 0), 0)";

/// The oldest events after position (`$2`, `$3`), at most `$4`, in log order, each with whether
/// it was recorded more than `$1` µs ago (store clock). A compaction pass walks the log's start
/// page by page and stops as soon as it knows what to remove.
pub const OLDEST_EVENTS: &str = "SELECT revision, seq, \
     recorded_at < now() - $1::bigint * interval '1 microsecond' FROM claim_events \
     WHERE (revision, seq) > ($2::bigint, $3::bigint) ORDER BY revision, seq LIMIT $4::bigint";

/// Compacts through revision `$1`: its events and every older one go.
pub const COMPACT_EVENTS: &str =
    "WITH gone AS (DELETE FROM claim_events WHERE revision <= $1::bigint RETURNING 1), \
     head AS (UPDATE watch_state SET compacted_through = greatest(compacted_through, $1::bigint)) \
     SELECT count(*) FROM gone";
/// The columns of a lease row, in the order `rows::lease` reads them.
macro_rules! lease_columns {
    () => {
        "lease_id, cell_id, request, created_at, last_renewed_at"
    };
}

pub const SELECT_LEASE_FOR_UPDATE: &str = concat!(
    "SELECT ",
    lease_columns!(),
    " FROM leases WHERE lease_id = $1::uuid FOR UPDATE"
);
pub const SELECT_OUTCOME_FOR_UPDATE: &str = "\
SELECT lease_id, cell_id, outcome, decided_at FROM lease_outcomes
WHERE lease_id = $1::uuid FOR UPDATE";

/// The existing rows of a batch's keys (`$1` claim types, `$2` values), locked in key order so
/// two batches over overlapping claims always lock in the same order and cannot deadlock.
/// One primary-key probe per key (`lock_claims_of_keys!`): written as `claims … IN (unnest …)`,
/// a store that was never analysed planned a hash join over a scan of the whole table (0.37 ms
/// at 1,840 claims, growing with the table, against 0.03 ms; decision 122).
pub const SELECT_CLAIMS_FOR_UPDATE: &str =
    lock_claims_of_keys!("unnest($1::smallint[], $2::text[]) AS k(t, v)");

/// Locks the claims carried by a lease (`$1`) in key order before Commit/Rollback rewrites them.
pub const LOCK_CLAIMS_OF_LEASE: &str = "\
SELECT claim_type FROM claims WHERE lease_id = $1::uuid
ORDER BY claim_type, claim_value
FOR UPDATE";

/// BeginUpdate's creates: one multi-row insert from parallel arrays (`$1..$6`, the display
/// forms `$10`, the namespace columns `$11` and the owner type and table name columns `$12`,
/// `$13`, in key order), leased by `$8` with op `$9` for cell `$7`. A key inserted meanwhile by a concurrent batch raises a unique violation, which retries the whole
/// transaction.
pub const INSERT_CLAIMS: &str = "\
INSERT INTO claims (claim_type, claim_value, owner_type, owner_value, table_name, table_record_id,
                    cell_id, lease_id, lease_op, created_at, updated_at, display_value, namespace,
                    owner_type_name, source_table)
SELECT r.claim_type, r.claim_value, r.owner_type, r.owner_value, r.table_name, r.table_record_id,
       $7::text, $8::uuid, $9::smallint, now(), now(), r.display_value, r.namespace,
       r.owner_type_name, r.source_table
FROM unnest($1::smallint[], $2::text[], $3::smallint[], $4::text[], $5::smallint[], $6::bigint[],
            $10::text[], $11::text[], $12::text[], $13::text[])
     WITH ORDINALITY AS r(claim_type, claim_value, owner_type, owner_value, table_name, table_record_id,
                          display_value, namespace, owner_type_name, source_table, ord)
ORDER BY r.ord";

/// BeginUpdate's destroys and updates (one execution per op): lease (`$1`, op `$2`) the caller's
/// (`$5`) unleased claims among the keys (`$3`, `$4`). The design's conditional update; it must
/// touch every key, or the statement fails (SQLSTATE TC001) and the pipelined COMMIT becomes a
/// rollback.
pub const MARK_CLAIMS: &str = "\
WITH marked AS (
    UPDATE claims SET lease_id = $1::uuid, lease_op = $2::smallint, updated_at = now()
    WHERE (claim_type, claim_value) IN (
        SELECT k.claim_type, k.claim_value FROM unnest($3::smallint[], $4::text[]) AS k(claim_type, claim_value))
      AND lease_id IS NULL
      AND cell_id = $5::text
    RETURNING 1)
SELECT topology_claims_expect_rows((SELECT count(*) FROM marked), cardinality($3::smallint[])::bigint,
                                   'marking destroys or updates')";

pub const INSERT_LEASE: &str = "\
INSERT INTO leases (lease_id, cell_id, request, created_at, last_renewed_at)
VALUES ($1::uuid, $2::text, $3::bytea, now(), now())
RETURNING created_at, last_renewed_at";

/// Commit's destroys / Rollback's creates: delete the keys (`$1`, `$2`) still held by lease `$3`.
pub const DELETE_CLAIMS_OF_LEASE: &str = "\
DELETE FROM claims
WHERE (claim_type, claim_value) IN (
    SELECT k.claim_type, k.claim_value FROM unnest($1::smallint[], $2::text[]) AS k(claim_type, claim_value))
  AND lease_id = $3::uuid";

/// Commit's creates / Rollback's destroys: clear lease `$3` from the keys (`$1`, `$2`).
pub const RELEASE_CLAIMS_OF_LEASE: &str = "\
UPDATE claims SET lease_id = NULL, lease_op = NULL, updated_at = now()
WHERE (claim_type, claim_value) IN (
    SELECT k.claim_type, k.claim_value FROM unnest($1::smallint[], $2::text[]) AS k(claim_type, claim_value))
  AND lease_id = $3::uuid";

/// Commit's updates: write the new owner type, owner value, table name, record id (`$3..$6`)
/// display form (`$8`) and owner type and table name columns (`$9`, `$10`) of the keys (`$1`, `$2`) still held by lease `$7`, and clear the
/// lease. The rows were locked in key order by [`LOCK_CLAIMS_OF_LEASE`]; the record index
/// entries move with the update.
pub const REPLACE_CLAIMS_OF_LEASE: &str = "\
UPDATE claims AS c
SET owner_type = r.owner_type, owner_value = r.owner_value, table_name = r.table_name,
    table_record_id = r.table_record_id, lease_id = NULL, lease_op = NULL, updated_at = now(),
    display_value = r.display_value, owner_type_name = r.owner_type_name,
    source_table = r.source_table
FROM unnest($1::smallint[], $2::text[], $3::smallint[], $4::text[], $5::smallint[], $6::bigint[],
            $8::text[], $9::text[], $10::text[])
     AS r(claim_type, claim_value, owner_type, owner_value, table_name, table_record_id,
          display_value, owner_type_name, source_table)
WHERE c.claim_type = r.claim_type AND c.claim_value = r.claim_value
  AND c.lease_id = $7::uuid";

// ---------------------------------------------------------------------------------------------
// Namespaces (`namespaces.rs`).

/// The columns of a namespace row, in the order `namespaces::row` reads them.
macro_rules! namespace_columns {
    () => {
        "number, id, normalization, max_chars, pattern, reserved, description, deprecated, version"
    };
}

/// The rows of the namespaces `$1`. Read after the claim rows, in the same flight: READ
/// COMMITTED gives the statement a snapshot taken once the claims' locks are held, so a rule
/// change (which locks the claims table) is either seen here or waits for this transaction.
pub const SELECT_NAMESPACES: &str = concat!(
    "SELECT ",
    namespace_columns!(),
    " FROM namespaces WHERE id = ANY($1::text[])"
);
/// Every namespace (the store's cache of rules, refreshed when a read disagrees with it).
pub const SELECT_ALL_NAMESPACES: &str =
    concat!("SELECT ", namespace_columns!(), " FROM namespaces");
/// The built-ins a migration added and no open has adopted yet, locked.
pub const SELECT_PENDING_NAMESPACES: &str = concat!(
    "SELECT ",
    namespace_columns!(),
    " FROM namespaces WHERE version = 0 ORDER BY number FOR UPDATE"
);
/// The row of namespace `$1`, locked: rule changes of one namespace serialize.
pub const SELECT_NAMESPACE_FOR_UPDATE: &str = concat!(
    "SELECT ",
    namespace_columns!(),
    " FROM namespaces WHERE id = $1::text FOR UPDATE"
);
/// While an adoption reads and rewrites a namespace's claims, no claim is written: every
/// BeginUpdate then reads the rules it writes under (see [`SELECT_NAMESPACES`]).
pub const LOCK_CLAIMS_FOR_ADOPTION: &str = "LOCK TABLE claims IN EXCLUSIVE MODE";
/// Every claim of namespace `$1`, as a proof reads it: key, display form, leased.
pub const PROOF_CLAIMS: &str = "\
SELECT claim_value, coalesce(display_value, claim_value), lease_id IS NOT NULL
FROM claims WHERE claim_type = $1::smallint";
/// Moves the claim `$2` of namespace `$1` to key `$3`, with display form `$4` (NULL when it is
/// the key).
pub const REKEY_CLAIM: &str = "\
UPDATE claims SET claim_value = $3::text, display_value = nullif($4::text, $3::text)
WHERE claim_type = $1::smallint AND claim_value = $2::text";
/// Every namespace, locked: creates serialize (the unique keys are the second line).
pub const SELECT_ALL_NAMESPACES_FOR_UPDATE: &str = concat!(
    "SELECT ",
    namespace_columns!(),
    " FROM namespaces FOR UPDATE"
);
/// A new namespace's row (`$1..$9` in `namespace_columns!()` order).
pub const INSERT_NAMESPACE: &str = concat!(
    "INSERT INTO namespaces (",
    namespace_columns!(),
    ") VALUES ($1::smallint, $2::text, $3::smallint, $4::smallint, $5::text, $6::text, $7::text, \
     $8::boolean, $9::bigint)"
);
/// How many claims each namespace holding any has (`ClaimStore::count_claims`).
pub const COUNT_CLAIMS_BY_NAMESPACE: &str =
    "SELECT claim_type, namespace, count(*) FROM claims GROUP BY claim_type, namespace";
/// How many claims namespace `$1` holds, leased ones included.
pub const COUNT_CLAIMS_OF_NAMESPACE: &str =
    "SELECT count(*) FROM claims WHERE claim_type = $1::smallint";
/// Deletes namespace `$1`'s row.
pub const DELETE_NAMESPACE: &str = "DELETE FROM namespaces WHERE number = $1::smallint";
/// While a rule change is decided and written, no claim is written (see [`SELECT_NAMESPACES`]).
pub const LOCK_CLAIMS_FOR_RULES: &str = "LOCK TABLE claims IN EXCLUSIVE MODE";
/// Writes namespace `$1` (`$2`)'s definition: the parameters of [`INSERT_NAMESPACE`].
pub const UPDATE_NAMESPACE: &str = "\
UPDATE namespaces SET normalization = $3::smallint, max_chars = $4::smallint, pattern = $5::text,
    reserved = $6::text, description = $7::text, deprecated = $8::boolean, version = $9::bigint
WHERE number = $1::smallint AND id = $2::text";

pub const DELETE_LEASE: &str = "DELETE FROM leases WHERE lease_id = $1::uuid";

pub const INSERT_OUTCOME: &str = "\
INSERT INTO lease_outcomes (lease_id, cell_id, outcome, decided_at)
VALUES ($1::uuid, $2::text, $3::smallint, now())";

// ---------------------------------------------------------------------------------------------
// Claim store: group commit (one transaction for a batch of BeginUpdate / CommitUpdate /
// RollbackUpdate, `store.rs` "group commit"). Every statement takes arrays, so a batch of any
// size costs the same statements.

/// The store's clock (`now()`, the transaction's time, the one every write of the store is
/// stamped with), then the decommission marks among cells `$1`: one row of `(now, NULL, NULL)`
/// when none is marked.
pub const GROUP_CLOCK_AND_DECOMMISSIONED: &str = "\
SELECT now(), d.cell_id, d.decommissioned_at
FROM (SELECT 1) AS t
LEFT JOIN decommissioned_cells AS d ON d.cell_id = ANY($1::text[])";

/// The outstanding leases among ids `$1`, locked in id order.
pub const GROUP_SELECT_LEASES_FOR_UPDATE: &str = concat!(
    "SELECT ",
    lease_columns!(),
    " FROM leases WHERE lease_id = ANY($1::uuid[]) ORDER BY lease_id FOR UPDATE"
);

/// The remembered outcomes among ids `$1`, locked in id order.
pub const GROUP_SELECT_OUTCOMES_FOR_UPDATE: &str = "\
SELECT lease_id, cell_id, outcome, decided_at FROM lease_outcomes
WHERE lease_id = ANY($1::uuid[]) ORDER BY lease_id FOR UPDATE";

/// The claim rows of keys (`$1` types, `$2` values) and those carrying one of lease ids `$3`,
/// each once, locked in key order. The keys of both sets are gathered first (a `claims_by_lease`
/// probe per lease id), sorted and made distinct, and each drives a primary-key probe that locks
/// its row, as in [`SELECT_CLAIMS_FOR_UPDATE`]: the `LATERAL` subqueries fix the plan whatever
/// the statistics (decision 122); an `OR` of the two conditions would scan the table.
pub const GROUP_SELECT_CLAIMS_FOR_UPDATE: &str = lock_claims_of_keys!(
    "(
        SELECT u.t, u.v FROM unnest($1::smallint[], $2::text[]) AS u(t, v)
        UNION ALL
        SELECT l.claim_type, l.claim_value FROM unnest($3::uuid[]) AS i(id)
        CROSS JOIN LATERAL (
            SELECT claim_type, claim_value FROM claims WHERE lease_id = i.id OFFSET 0) AS l) AS k"
);

/// New leases from parallel arrays: id, cell, request payload, created, last renewed.
pub const GROUP_INSERT_LEASES: &str = "\
INSERT INTO leases (lease_id, cell_id, request, created_at, last_renewed_at)
SELECT * FROM unnest($1::uuid[], $2::text[], $3::bytea[], $4::timestamptz[], $5::timestamptz[])";

/// Deletes the claims of keys (`$1`, `$2`). They were locked by
/// [`GROUP_SELECT_CLAIMS_FOR_UPDATE`], so each must still be there (else TC001, retried).
pub const GROUP_DELETE_CLAIMS: &str = "\
WITH deleted AS (
    DELETE FROM claims
    WHERE (claim_type, claim_value) IN (
        SELECT k.claim_type, k.claim_value FROM unnest($1::smallint[], $2::text[]) AS k(claim_type, claim_value))
    RETURNING 1)
SELECT topology_claims_expect_rows((SELECT count(*) FROM deleted), cardinality($1::smallint[])::bigint,
                                   'group commit: deleting claims')";

/// Rewrites every column of the claims of keys (`$1`, `$2`) from the parallel arrays `$3..$15`
/// (owner type, owner value, table, record id, cell, lease id, lease op, created, updated,
/// display form, namespace, owner type name, table name); each row was locked by [`GROUP_SELECT_CLAIMS_FOR_UPDATE`] and must still be
/// there (else TC001).
pub const GROUP_UPDATE_CLAIMS: &str = "\
WITH updated AS (
    UPDATE claims AS c
    SET owner_type = r.owner_type, owner_value = r.owner_value, table_name = r.table_name,
        table_record_id = r.table_record_id, cell_id = r.cell_id, lease_id = r.lease_id,
        lease_op = r.lease_op, created_at = r.created_at, updated_at = r.updated_at,
        display_value = r.display_value, namespace = r.namespace,
        owner_type_name = r.owner_type_name, source_table = r.source_table
    FROM unnest($1::smallint[], $2::text[], $3::smallint[], $4::text[], $5::smallint[], $6::bigint[],
                $7::text[], $8::uuid[], $9::smallint[], $10::timestamptz[], $11::timestamptz[],
                $12::text[], $13::text[], $14::text[], $15::text[])
         AS r(claim_type, claim_value, owner_type, owner_value, table_name, table_record_id,
              cell_id, lease_id, lease_op, created_at, updated_at, display_value, namespace,
              owner_type_name, source_table)
    WHERE c.claim_type = r.claim_type AND c.claim_value = r.claim_value
    RETURNING 1)
SELECT topology_claims_expect_rows((SELECT count(*) FROM updated), cardinality($1::smallint[])::bigint,
                                   'group commit: updating claims')";

/// New claims from the parallel arrays of [`GROUP_UPDATE_CLAIMS`], inserted in key order. A key
/// inserted meanwhile by a concurrent transaction raises a unique violation, which retries the
/// whole group.
pub const GROUP_INSERT_CLAIMS: &str = "\
INSERT INTO claims (claim_type, claim_value, owner_type, owner_value, table_name, table_record_id,
                    cell_id, lease_id, lease_op, created_at, updated_at, display_value, namespace,
                    owner_type_name, source_table)
SELECT r.claim_type, r.claim_value, r.owner_type, r.owner_value, r.table_name, r.table_record_id,
       r.cell_id, r.lease_id, r.lease_op, r.created_at, r.updated_at, r.display_value, r.namespace,
       r.owner_type_name, r.source_table
FROM unnest($1::smallint[], $2::text[], $3::smallint[], $4::text[], $5::smallint[], $6::bigint[],
            $7::text[], $8::uuid[], $9::smallint[], $10::timestamptz[], $11::timestamptz[],
            $12::text[], $13::text[], $14::text[], $15::text[])
     WITH ORDINALITY AS r(claim_type, claim_value, owner_type, owner_value, table_name, table_record_id,
                          cell_id, lease_id, lease_op, created_at, updated_at, display_value,
                          namespace, owner_type_name, source_table, ord)
ORDER BY r.ord";

/// Deletes the leases `$1`, each locked in the first flight and so still there (else TC001).
pub const GROUP_DELETE_LEASES: &str = "\
WITH deleted AS (DELETE FROM leases WHERE lease_id = ANY($1::uuid[]) RETURNING 1)
SELECT topology_claims_expect_rows((SELECT count(*) FROM deleted), cardinality($1::uuid[])::bigint,
                                   'group commit: deleting leases')";

/// New outcomes from parallel arrays: lease id, cell, outcome, decided.
pub const GROUP_INSERT_OUTCOMES: &str = "\
INSERT INTO lease_outcomes (lease_id, cell_id, outcome, decided_at)
SELECT * FROM unnest($1::uuid[], $2::text[], $3::smallint[], $4::timestamptz[])";

/// Outstanding leases of cell `$1` (a range of `leases_by_cell_lease`).
pub const COUNT_LEASES_OF_CELL: &str = "SELECT count(*) FROM leases WHERE cell_id = $1::text";

/// Claims of cell `$1`: a range of `claims_by_cell_table_record`, whose leading column is the cell.
pub const COUNT_CLAIMS_OF_CELL: &str = "SELECT count(*) FROM claims WHERE cell_id = $1::text";

/// A decommission step's first write: the mark, stamped with the store's clock.
pub const MARK_DECOMMISSIONED: &str = "\
INSERT INTO decommissioned_cells (cell_id, decommissioned_at) VALUES ($1::text, now())";

/// Deletes the first `$2` claims of cell `$1` in `claims_by_cell_table_record` order (one range
/// of the index, never a scan of other cells' claims).
pub const DELETE_CLAIMS_OF_CELL: &str = "\
DELETE FROM claims WHERE (claim_type, claim_value) IN (
    SELECT claim_type, claim_value FROM claims WHERE cell_id = $1::text
    ORDER BY table_name, table_record_id, claim_type, claim_value
    LIMIT $2::bigint)";

/// `$1` [`SLOT_LOCK_CLASS`]: the one lock every slot acquire holds.
pub const LOCK_SLOTS: &str = "SELECT pg_advisory_xact_lock($1::int4, hashtext(current_schema()))";

/// The store's clock after the slot lock was granted (`now()` is the transaction's start, which
/// may be a lock wait earlier), and every slot row.
pub const SELECT_SLOTS: &str = "\
SELECT statement_timestamp(), s.cell_id, s.holder, s.expires_at
FROM (SELECT 1) AS t LEFT JOIN verification_slots AS s ON true";

/// Deletes the slot rows of holders `($1[i], $2[i])` (the expired ones an acquire found).
pub const DELETE_SLOTS: &str = "\
DELETE FROM verification_slots
WHERE (cell_id, holder) IN (SELECT * FROM unnest($1::text[], $2::text[]))";

/// Takes or renews the slot of holder `($1, $2)` until `$3`.
pub const UPSERT_SLOT: &str = "\
INSERT INTO verification_slots (cell_id, holder, expires_at)
VALUES ($1::text, $2::text, $3::timestamptz)
ON CONFLICT (cell_id, holder) DO UPDATE SET expires_at = EXCLUDED.expires_at";

/// Releases the slot of holder `($1, $2)`; the deleted row's expiry, if there was one.
pub const RELEASE_SLOT: &str = "\
DELETE FROM verification_slots WHERE cell_id = $1::text AND holder = $2::text
RETURNING expires_at";

/// `$1` [`RESTORE_LOCK_CLASS`]: the one lock every mark, report and lift holds (the text of
/// [`LOCK_SLOTS`], a store-wide lock of another class).
pub const LOCK_RESTORE: &str = LOCK_SLOTS;

/// The store's clock and the latest restore epoch with its reports, in one statement (one
/// snapshot): one row per report of the epoch, or one row with a NULL report when it has none,
/// or one row of `(clock, NULL, …)` when the store was never marked restored. The clock is
/// `statement_timestamp()`: in a mark, report or lift it is read after the restore lock was
/// granted (`now()` is the transaction's start, which may be a lock wait earlier), so epochs,
/// reports and lifts are stamped in the order they commit.
pub const SELECT_RESTORE_STATE: &str = "\
SELECT statement_timestamp(), e.epoch, e.backup_time, e.marked_at, e.reason, e.expected_cells,
       e.lifted_at, e.lift_reason, r.cell_id, r.reported_at
FROM (SELECT 1) AS t
LEFT JOIN (SELECT epoch, backup_time, marked_at, reason, expected_cells, lifted_at, lift_reason
           FROM restore_epochs ORDER BY epoch DESC LIMIT 1) AS e ON true
LEFT JOIN restore_reports AS r ON r.epoch = e.epoch";

/// Every cell with claims or outstanding leases. The claims' cells are a skip scan of
/// `claims_by_cell_table_record` (one index probe per distinct cell, not a scan of every
/// claim); outstanding leases are few, and `UNION` removes the duplicates.
pub const SELECT_HOLDING_CELLS: &str = "\
WITH RECURSIVE claim_cells(cell_id) AS (
    (SELECT cell_id FROM claims ORDER BY cell_id LIMIT 1)
    UNION ALL
    SELECT (SELECT c.cell_id FROM claims AS c WHERE c.cell_id > claim_cells.cell_id
            ORDER BY c.cell_id LIMIT 1)
    FROM claim_cells WHERE claim_cells.cell_id IS NOT NULL)
SELECT cell_id FROM claim_cells WHERE cell_id IS NOT NULL
UNION
SELECT cell_id FROM leases";

/// A mark's new epoch: number, backup time, marked at, reason, expected cells (joined with
/// `'\n'`), lifted at and lift reason (NULL unless no cell is expected).
pub const INSERT_RESTORE_EPOCH: &str = "\
INSERT INTO restore_epochs (epoch, backup_time, marked_at, reason, expected_cells, lifted_at,
                            lift_reason)
VALUES ($1::bigint, $2::timestamptz, $3::timestamptz, $4::text, $5::text, $6::timestamptz,
        $7::text)";

/// Cell `$2`'s verification pass report in epoch `$1`, at `$3`.
pub const INSERT_RESTORE_REPORT: &str = "\
INSERT INTO restore_reports (epoch, cell_id, reported_at)
VALUES ($1::bigint, $2::text, $3::timestamptz)";

/// Lifts the quarantine of epoch `$1` at `$2` for reason `$3`. The epoch was read quarantined
/// under the restore lock, so it must still be (else TC001, retried).
pub const LIFT_RESTORE_QUARANTINE: &str = "\
WITH lifted AS (
    UPDATE restore_epochs SET lifted_at = $2::timestamptz, lift_reason = $3::text
    WHERE epoch = $1::bigint AND lifted_at IS NULL
    RETURNING 1)
SELECT topology_claims_expect_rows((SELECT count(*) FROM lifted), 1, 'lifting a restore quarantine')";

pub const RENEW_LEASE: &str =
    "UPDATE leases SET last_renewed_at = now() WHERE lease_id = $1::uuid RETURNING last_renewed_at";

// ---------------------------------------------------------------------------------------------
// Claim store: reads (autocommit, no explicit transaction).

pub const LIST_LEASES_FIRST: &str = concat!(
    "SELECT ",
    lease_columns!(),
    " FROM leases WHERE cell_id = $1::text ORDER BY lease_id LIMIT $2::bigint"
);
pub const LIST_LEASES_AFTER: &str = concat!(
    "SELECT ",
    lease_columns!(),
    " FROM leases WHERE cell_id = $1::text AND lease_id > $3::uuid ORDER BY lease_id LIMIT $2::bigint"
);
/// Every cell with outstanding leases: `(now(), cell_id, count, oldest created_at)`, one row
/// per cell, or one row of `(now(), NULL, NULL, NULL)` when there are none, so the store's
/// clock comes with the same statement.
pub const LEASE_SUMMARY: &str = "\
SELECT t.now, l.cell_id, l.outstanding, l.oldest
FROM (SELECT now() AS now) AS t
LEFT JOIN (SELECT cell_id, count(*) AS outstanding, min(created_at) AS oldest
           FROM leases GROUP BY cell_id) AS l ON true";

/// The store's clock, read after a page so no lease on it is newer than the answer.
pub const SERVER_TIME: &str = "SELECT now()";

pub const LOOKUP_CLAIM: &str = concat!(
    "SELECT ",
    claim_columns!(),
    " FROM claims WHERE claim_type = $1::smallint AND claim_value = $2::text"
);

/// The first `$6` claims of cell `$1`, table `$2` after `($3, $4, $5)` in ListClaims order
/// (`ClaimsCursor::start_after`: record id, claim type, claim value). The row comparison is one
/// range of `claims_by_cell_table_record`, whose key continues with exactly these columns.
pub const LIST_CLAIMS_AFTER: &str = concat!(
    "SELECT ",
    claim_columns!(),
    " FROM claims
WHERE cell_id = $1::text AND table_name = $2::smallint
  AND source_table IS NOT DISTINCT FROM $7::text
  AND (table_record_id, claim_type, claim_value) > ($3::bigint, $4::smallint, $5::text)
ORDER BY table_record_id, claim_type, claim_value
LIMIT $6::bigint"
);

/// Deletes up to `$2` outcomes decided more than `$1` microseconds ago: the SQL form of
/// `domain::outcome_expired` (`decided_at < now - retention`), batched so one call never holds
/// a huge delete.
pub const COLLECT_OUTCOMES: &str = "\
DELETE FROM lease_outcomes WHERE lease_id IN (
    SELECT lease_id FROM lease_outcomes
    WHERE decided_at < now() - $1::bigint * interval '1 microsecond'
    LIMIT $2::bigint)";

// ---------------------------------------------------------------------------------------------
// Local lease store (the cell's own database).

/// The cell's `leases_outstanding` table (the design's Rails schema, with a native uuid), and
/// `topology_claims_locks`, the expiring named locks that keep one reconciler per cell.
/// Idempotent: safe to run at every start or to copy into the application's own migrations.
pub const LOCAL_LEASES_DDL: &str = "\
CREATE TABLE IF NOT EXISTS leases_outstanding (
    lease_id   uuid        PRIMARY KEY,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_leases_outstanding_created ON leases_outstanding (created_at);
CREATE TABLE IF NOT EXISTS topology_claims_locks (
    name       text        PRIMARY KEY,
    holder     text        NOT NULL,
    expires_at timestamptz NOT NULL
);";

/// True when every object of [`LOCAL_LEASES_DDL`] exists on the search_path.
pub const LOCAL_SCHEMA_PRESENT: &str = "\
SELECT to_regclass('leases_outstanding') IS NOT NULL
   AND to_regclass('idx_leases_outstanding_created') IS NOT NULL
   AND to_regclass('topology_claims_locks') IS NOT NULL";

/// Records a lease in the caller's transaction; recording the same id again is a no-op.
pub const LOCAL_RECORD: &str = "\
INSERT INTO leases_outstanding (lease_id, created_at, updated_at)
VALUES ($1::uuid, clock_timestamp(), clock_timestamp())
ON CONFLICT (lease_id) DO NOTHING";
pub const LOCAL_DELETE: &str = "DELETE FROM leases_outstanding WHERE lease_id = $1::uuid";
pub const LOCAL_FIND: &str =
    "SELECT lease_id, created_at FROM leases_outstanding WHERE lease_id = ANY($1::uuid[])";
pub const LOCAL_LIST_OLDER_THAN: &str = "\
SELECT lease_id, created_at FROM leases_outstanding
WHERE created_at < $1::timestamptz
ORDER BY created_at, lease_id
LIMIT $2::bigint";

/// What the local cluster says of transaction `$2` (an xid8, as text) for a lease naming system
/// identifier `$1`: whether this server is a standby, its own system identifier, and
/// `pg_xact_status` only when it is the primary of that cluster (CASE evaluates the volatile
/// call lazily; an xid from the future still raises 22023, which the caller falls back on).
pub const LOCAL_TRANSACTION_STATUS: &str = "\
SELECT pg_is_in_recovery(), s.system_identifier,
       CASE WHEN NOT pg_is_in_recovery() AND s.system_identifier = $1::bigint
            THEN pg_xact_status($2::text::xid8) END
FROM pg_control_system() s";

/// The open transaction's `local_transaction` parts: this cluster's system identifier and the
/// transaction's own 64-bit id (assigning one now if it has none yet), both as decimal text.
pub const LOCAL_TRANSACTION_NAME: &str = "\
SELECT (SELECT system_identifier FROM pg_control_system())::text, pg_current_xact_id()::text";

/// Takes or extends lock `$1` for holder `$2` until the database's now + `$3` microseconds, if it
/// is free, already `$2`'s, or expired. A changed row means the lock is held.
pub const LOCAL_TRY_LOCK: &str = "\
INSERT INTO topology_claims_locks (name, holder, expires_at)
VALUES ($1::text, $2::text, clock_timestamp() + $3::bigint * interval '1 microsecond')
ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
WHERE topology_claims_locks.holder = EXCLUDED.holder
   OR topology_claims_locks.expires_at < clock_timestamp()";
pub const LOCAL_UNLOCK: &str =
    "DELETE FROM topology_claims_locks WHERE name = $1::text AND holder = $2::text";

/// `WaitLine::join_wait_line`, one statement: ticket `$1` (NULL: the next of
/// `lease_wait_tickets`) waits for the claims `($2[i], $3[i])` until the store's clock plus `$4`
/// µs. Its rows for other claims, and other tickets' expired rows, are deleted (the two deletes
/// and the upsert touch disjoint rows, as one statement's parts must). Returns the ticket.
pub const JOIN_WAIT_LINE: &str = "\
WITH t AS (SELECT coalesce($1::bigint, nextval('lease_wait_tickets')) AS ticket),
gone AS (
    DELETE FROM lease_waits AS w USING t
    WHERE (w.ticket <> t.ticket AND w.expires_at <= statement_timestamp())
       OR (w.ticket = t.ticket AND (w.namespace, w.claim_key) NOT IN
           (SELECT * FROM unnest($2::text[], $3::text[])))),
kept AS (
    INSERT INTO lease_waits (namespace, claim_key, ticket, expires_at)
    SELECT u.namespace, u.claim_key, t.ticket,
           statement_timestamp() + $4::bigint * interval '1 microsecond'
    FROM unnest($2::text[], $3::text[]) AS u(namespace, claim_key), t
    ON CONFLICT (namespace, claim_key, ticket) DO UPDATE SET expires_at = EXCLUDED.expires_at)
SELECT ticket FROM t";

/// `WaitLine::line_ahead`: the store's clock, and the latest expiry of the tickets before `$1`
/// that wait for any of the claims `($2[i], $3[i])` (NULL: none).
pub const LINE_AHEAD: &str = "\
SELECT statement_timestamp(), max(w.expires_at) FROM lease_waits AS w
WHERE w.ticket < $1::bigint
  AND (w.namespace, w.claim_key) IN (SELECT * FROM unnest($2::text[], $3::text[]))";

/// `WaitLine::leave_wait_line`: ticket `$1`'s rows.
pub const LEAVE_WAIT_LINE: &str = "DELETE FROM lease_waits WHERE ticket = $1::bigint";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_schema_names_are_spliced_into_sql() {
        assert_eq!(quote_schema("tc_test_1").unwrap(), "\"tc_test_1\"");
        for bad in [
            "",
            "Upper",
            "1abc",
            "a-b",
            "a\"b",
            "a b",
            "x;drop",
            &"a".repeat(64),
        ] {
            assert!(quote_schema(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn migrations_are_numbered_in_order_without_gaps() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i32 + 1);
            assert!(m.name.starts_with(&format!("{:04}_", m.version)));
        }
    }
}
